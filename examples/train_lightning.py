"""A Lightning training, supervised: add one callback and take the resume path from the supervisor.

    supervise run -- python examples/train_lightning.py --steps 200

The lines that matter are marked ``# <- supervisor``. Everything else is ordinary Lightning.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

try:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.plugins.environments import SLURMEnvironment
    from supervisor.integrations.lightning import SupervisorCallback
except ImportError:  # the older package name
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import ModelCheckpoint
    from pytorch_lightning.plugins.environments import SLURMEnvironment
    from supervisor.integrations.lightning import PLSupervisorCallback as SupervisorCallback

from supervisor.integrations.lightning import resume_ckpt_path


class TinyRegression(pl.LightningModule):
    def __init__(self, dim: int = 16, step_time: float = 0.0) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(dim, 32), torch.nn.GELU(), torch.nn.Linear(32, 1))
        self.step_time = step_time

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        # global_step counts finished optimizer steps: this batch is step global_step + 1.
        print(f"step {self.global_step + 1} loss {loss.item():.6f}", flush=True)
        if self.step_time:
            time.sleep(self.step_time)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def synthetic_data(n: int, dim: int = 16) -> torch.utils.data.DataLoader:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, dim, generator=gen)
    y = torch.tanh(x @ torch.randn(dim, 1, generator=gen))
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--step-time", type=float, default=0.0)
    parser.add_argument("--ckpt-dir", default=None, help="[$SUPERVISOR_CHECKPOINT_DIR or ./checkpoints]")
    args = parser.parse_args(argv)
    ckpt_dir = args.ckpt_dir or os.environ.get("SUPERVISOR_CHECKPOINT_DIR") or "checkpoints"

    supervisor_callback = SupervisorCallback()  # <- supervisor
    trainer = pl.Trainer(
        max_steps=args.steps,
        accelerator="auto",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=ckpt_dir,
        callbacks=[
            supervisor_callback,
            ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=args.save_every, save_top_k=-1,
                            save_last=True, filename="{epoch}-{step}"),
        ],
        # Under Slurm, the supervisor requeues: Lightning's own auto-requeue would race it.
        plugins=[SLURMEnvironment(auto_requeue=False)] if SLURMEnvironment.detect() else [],
    )
    model = TinyRegression(step_time=args.step_time)
    trainer.fit(model, synthetic_data(8 * args.steps), ckpt_path=resume_ckpt_path())  # <- supervisor
    if not supervisor_callback.stopped_on_notice:
        print(f"training complete at step {trainer.global_step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
