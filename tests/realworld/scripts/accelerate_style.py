"""A training written the way Accelerate's checkpointing examples are: ``accelerator.save_state`` every
``--checkpointing_steps`` steps with ``ProjectConfiguration(automatic_checkpoint_naming=True)``, so
the saves are ``<output_dir>/checkpoints/checkpoint_<i>`` (a save INDEX, not a step), the step kept
in a state registered with ``register_for_checkpointing``, and ``--resume_from_checkpoint PATH``.

Our own code (no upstream file is copied into this repository), using Accelerate's real API and
on-disk layout.
"""

import argparse
import os

import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration, set_seed
from torch.utils.data import DataLoader, TensorDataset


class Progress:
    """The training position, saved and restored by Accelerate with the rest of the state."""

    def __init__(self):
        self.step = 0

    def state_dict(self):
        return {"step": self.step}

    def load_state_dict(self, state):
        self.step = state["step"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", default="out")
    parser.add_argument("--checkpointing_steps", type=int, default=20)
    parser.add_argument("--max_train_steps", type=int, default=300)
    parser.add_argument("--resume_from_checkpoint", default=None)
    args = parser.parse_args()

    set_seed(0)
    config = ProjectConfiguration(project_dir=args.output_dir, automatic_checkpoint_naming=True, total_limit=3)
    accelerator = Accelerator(project_config=config, cpu=True)
    data = TensorDataset(torch.randn(512, 16), torch.randint(0, 4, (512,)))
    loader = DataLoader(data, batch_size=8, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)

    if args.resume_from_checkpoint:
        accelerator.load_state(args.resume_from_checkpoint)
        # automatic naming counts saves from 0 in every process: continue after the one loaded
        index = os.path.basename(os.path.normpath(args.resume_from_checkpoint)).rsplit("_", 1)[-1]
        accelerator.project_configuration.iteration = int(index) + 1
        accelerator.print(f"Resumed from checkpoint: {args.resume_from_checkpoint} at step {progress.step}")

    model.train()
    while progress.step < args.max_train_steps:
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            progress.step += 1
            accelerator.print(f"step {progress.step}: loss {loss.item():.4f}", flush=True)
            if progress.step % args.checkpointing_steps == 0:
                accelerator.save_state()
                accelerator.print(f"saved state of step {progress.step}", flush=True)
            if progress.step >= args.max_train_steps:
                break
    accelerator.print("done")
    accelerator.end_training()


if __name__ == "__main__":
    main()
