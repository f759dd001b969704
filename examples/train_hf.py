"""A Hugging Face ``Trainer`` run, supervised (needs ``transformers`` and ``accelerate``).

    supervise run -- python examples/train_hf.py --steps 200

The lines that matter are marked ``# <- supervisor``. The model is a tiny regression module, so the
example runs on a CPU in seconds without downloading anything.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from transformers import Trainer, TrainingArguments

from supervisor.integrations.hf import SupervisorCallback, resume_ckpt_path


class TinyRegression(torch.nn.Module):
    def __init__(self, dim: int = 16, step_time: float = 0.0) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(dim, 32), torch.nn.GELU(), torch.nn.Linear(32, 1))
        self.step_time = step_time

    def forward(self, x, labels=None):
        out = self.net(x)
        if self.step_time:
            time.sleep(self.step_time)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}


class SyntheticData(torch.utils.data.Dataset):
    def __init__(self, n: int, dim: int = 16) -> None:
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, dim, generator=gen)
        self.y = torch.tanh(self.x @ torch.randn(dim, 1, generator=gen))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i], "labels": self.y[i]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--step-time", type=float, default=0.0)
    parser.add_argument("--output-dir", default=None, help="[$SUPERVISOR_CHECKPOINT_DIR or ./checkpoints]")
    args = parser.parse_args(argv)
    output_dir = args.output_dir or os.environ.get("SUPERVISOR_CHECKPOINT_DIR") or "checkpoints"

    torch.manual_seed(0)
    training_args = TrainingArguments(
        output_dir=output_dir, max_steps=args.steps, save_steps=args.save_every, save_strategy="steps",
        logging_steps=1, per_device_train_batch_size=8, report_to=[], use_cpu=not torch.cuda.is_available(),
        disable_tqdm=True, dataloader_num_workers=0,
    )
    trainer = Trainer(model=TinyRegression(step_time=args.step_time), args=training_args,
                      train_dataset=SyntheticData(8 * args.steps))
    supervisor_callback = SupervisorCallback(trainer)  # <- supervisor (given the trainer: it logs restarts too)
    trainer.add_callback(supervisor_callback)
    trainer.train(resume_from_checkpoint=resume_ckpt_path())  # <- supervisor
    if not supervisor_callback.stopped_on_notice:
        print(f"training complete at step {trainer.state.global_step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
