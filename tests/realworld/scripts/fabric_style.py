"""A Lightning Fabric training written the way litgpt's pretraining is: ``fabric.save`` of a state
dict (model, optimizer, ``iter_num``, ``step_count``) into ``<out_dir>/step-<8 digits>/lit_model.pth``
every ``--save_interval`` optimizer steps, log lines that name both the iteration and the step
("Epoch 1 | iter 40 step 20 | loss train: ..."; two micro-batches per step), and ``--resume PATH``
loaded with ``fabric.load``.

Our own code (no upstream file is copied into this repository), using Fabric's real API.
"""

import argparse
import time
from pathlib import Path

import lightning as L
import torch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out_dir", default="out/pretrain")
    parser.add_argument("--save_interval", type=int, default=20)
    parser.add_argument("--max_steps", type=int, default=200)
    parser.add_argument("--gradient_accumulation_iters", type=int, default=2)
    parser.add_argument("--resume", default=None)
    args = parser.parse_args()

    fabric = L.Fabric(accelerator="cpu", devices=1)
    fabric.seed_everything(42)
    model = torch.nn.Sequential(torch.nn.Embedding(64, 32), torch.nn.Flatten(), torch.nn.Linear(32 * 8, 64))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = fabric.setup(model, optimizer)
    state = {"model": model, "optimizer": optimizer, "hparams": vars(args), "iter_num": 0, "step_count": 0}

    if args.resume:
        fabric.print(f"Resuming training from {args.resume}")
        fabric.load(Path(args.resume), state)

    data = torch.randint(0, 64, (4096, 9))
    while state["step_count"] < args.max_steps:
        t0 = time.perf_counter()
        batch = data[torch.randint(0, len(data), (8,))]
        state["iter_num"] += 1
        is_accumulating = state["iter_num"] % args.gradient_accumulation_iters != 0
        with fabric.no_backward_sync(model, enabled=is_accumulating):
            loss = torch.nn.functional.cross_entropy(model(batch[:, :8]), batch[:, 8])
            fabric.backward(loss / args.gradient_accumulation_iters)
        if is_accumulating:
            continue
        optimizer.step()
        optimizer.zero_grad()
        state["step_count"] += 1
        epoch = state["iter_num"] * 8 // len(data) + 1
        fabric.print(f"Epoch {epoch} | iter {state['iter_num']} step {state['step_count']} | loss train: "
                     f"{loss.item():.3f}, val: n/a | iter time: {(time.perf_counter() - t0) * 1000:.2f} ms")
        if state["step_count"] % args.save_interval == 0:
            checkpoint_file = Path(args.out_dir) / f"step-{state['step_count']:08d}" / "lit_model.pth"
            checkpoint_file.parent.mkdir(parents=True, exist_ok=True)
            fabric.print(f"Saving checkpoint to {str(checkpoint_file)!r}")
            fabric.save(checkpoint_file, state)
    fabric.print("Training finished")


if __name__ == "__main__":
    main()
