"""A DeepSpeed training as DeepSpeed's docs show it: ``deepspeed.initialize`` (ZeRO stage 1, CPU,
gloo), ``engine.save_checkpoint(save_dir, tag="global_step<N>", client_state=...)`` every
``--save_interval`` steps (a directory per save plus the ``latest`` file), and
``engine.load_checkpoint(save_dir, tag)`` to resume from ``--load PATH_OF_A_TAG``. Launched with
``torchrun``, as DeepSpeed jobs are.

Our own code (no upstream file is copied into this repository), using DeepSpeed's real API and
on-disk layout.
"""

import argparse
import os

import deepspeed
import torch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--save_dir", default="out/checkpoints")
    parser.add_argument("--save_interval", type=int, default=20)
    parser.add_argument("--train_iters", type=int, default=300)
    parser.add_argument("--load", default=None, help="a checkpoint tag directory to resume from")
    args = parser.parse_args()

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    config = {"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 1},
              "zero_allow_untested_optimizer": True, "steps_per_print": 10 ** 9}
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
                                      config=config)
    step = 0
    if args.load:
        load_dir, tag = os.path.split(os.path.normpath(args.load))
        _, client_state = engine.load_checkpoint(load_dir, tag=tag)
        step = client_state["iteration"]
        print(f"resumed from {args.load} at iteration {step}", flush=True)

    while step < args.train_iters:
        x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
        loss = torch.nn.functional.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()
        step += 1
        print(f"iteration {step}/{args.train_iters} | loss {loss.item():.4f}", flush=True)
        if step % args.save_interval == 0:
            engine.save_checkpoint(args.save_dir, tag=f"global_step{step}", client_state={"iteration": step})
            print(f"saved checkpoint at iteration {step}", flush=True)
    print("done")


if __name__ == "__main__":
    main()
