"""A run that is crashed once and preempted once before a tiny Lightning training (CPU) with a
TensorBoard and a CSV logger completes it, for tests/test_metrics_runs.py.

The first two attempts fail before Lightning is even imported (they only have to fail; what is
tested is what the third attempt's loggers receive), so the test pays for one Lightning start:
  attempt 1  prints steps 1-2, then os.abort(): a native crash (SIGABRT), restarted in place
  attempt 2  prints steps 1-3, sends SIGTERM to the supervisor (a preemption notice) and waits until
             the supervisor's stop has reached it, then leaves: the run exits 75 to be requeued
  attempt 3+ trains STEPS steps with the supervisor's Lightning callback and the two loggers
"""

from __future__ import annotations

import os
import signal
import sys
import time

from supervisor import client


def fail_first() -> None:
    attempt = os.environ.get("SUPERVISOR_ATTEMPT")
    if attempt == "1":
        for step in (1, 2):
            print(f"step {step}", flush=True)
        os.abort()
    if attempt == "2":
        client.install()
        for step in (1, 2, 3):
            print(f"step {step}", flush=True)
        os.kill(os.getppid(), signal.SIGTERM)
        deadline = time.monotonic() + 60
        while not client.should_stop() and time.monotonic() < deadline:
            time.sleep(0.01)
        sys.exit(0)


def train(steps: int, logs: str) -> None:
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    from supervisor.integrations.lightning import SupervisorCallback, resume_ckpt_path

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            print(f"step {self.global_step + 1}", flush=True)
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    ckpt = os.environ["SUPERVISOR_CHECKPOINT_DIR"]
    x = torch.randn(8 * steps, 4, generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
    trainer = pl.Trainer(
        max_steps=steps, accelerator="cpu", devices=1, log_every_n_steps=1, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=ckpt,
        logger=[TensorBoardLogger(logs, name="tb"), CSVLogger(logs, name="csv")],
        callbacks=[SupervisorCallback(), ModelCheckpoint(dirpath=ckpt, every_n_train_steps=2, filename="{step}")])
    trainer.fit(Tiny(), data, ckpt_path=resume_ckpt_path())


if __name__ == "__main__":
    fail_first()
    train(int(sys.argv[1]), sys.argv[2])
