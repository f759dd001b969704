"""Hugging Face ``transformers`` integration: one ``TrainerCallback``.

    from supervisor.integrations.hf import SupervisorCallback, resume_ckpt_path
    trainer = Trainer(...)
    trainer.add_callback(SupervisorCallback(trainer))   # or Trainer(callbacks=[SupervisorCallback()])
    trainer.train(resume_from_checkpoint=resume_ckpt_path())

Heartbeats every optimizer step (the loss when the Trainer logs it), reports each ``checkpoint-N``
save (begin when the Trainer decides to save, end at ``on_save``), and on a stop notice stops at a
step boundary: it asks the Trainer for a save first when the supervisor wants one
(``control.should_save``), then ``control.should_training_stop``. The stop is agreed across ranks.
Given its ``Trainer``, it also logs the run's restart metrics through ``Trainer.log`` (so to every
``report_to`` logger) at the start of each supervised attempt (``docs/metrics.md``).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from .. import client
from . import emergency_save_wanted, resume_ckpt_path

try:
    from transformers import TrainerCallback
except ImportError as _exc:  # pragma: no cover - exercised only without transformers
    raise ImportError(f"supervisor.integrations.hf needs transformers (pip install transformers): {_exc}") from None

__all__ = ["SupervisorCallback", "resume_ckpt_path"]


def _any_rank(flag: bool, device: Any) -> bool:
    """True on every rank when True on one (no-op without torch.distributed)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return flag
    value = torch.tensor([1 if flag else 0], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


class SupervisorCallback(TrainerCallback):
    """Connects a ``transformers.Trainer`` to the supervisor (see the module docstring)."""

    def __init__(self, trainer: Any = None, *, own_signals: bool = True, log_restarts: bool = True) -> None:
        """``trainer``: the ``Trainer`` whose loggers (``report_to``) get the run's restart metrics
        at the start of each supervised attempt (``trainer.add_callback(SupervisorCallback(trainer))``);
        a callback does not otherwise see its Trainer. ``log_restarts=False``: never log them."""
        self.trainer = trainer
        self.log_restarts = log_restarts
        self.own_signals = own_signals
        self.stopped_on_notice = False
        self.emergency_step: int | None = None
        self._saving: Any = None  # the open client.saving(...) context between decision and on_save
        self._loss: float | None = None  # the last logged loss, repeated in step heartbeats

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.own_signals and threading.current_thread() is threading.main_thread():
            client.install()
        client.resumed(int(state.global_step))
        if self.log_restarts and self.trainer is not None:
            metrics = client.restart_metrics()
            if metrics:  # through Trainer.log: every report_to logger gets them at the resumed step
                self.trainer.log({f"supervisor/{key}": float(value) for key, value in metrics.items()})

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = int(state.global_step)
        # state.max_steps: the optimizer step the Trainer ends at (`supervise status` shows the ETA)
        total = {"max_steps": int(state.max_steps)} if isinstance(state.max_steps, int) and state.max_steps > 0 \
            else {}
        if self._loss is None:
            client.heartbeat(step, **total)
        else:
            client.heartbeat(step, loss=self._loss, **total)
        if _any_rank(client.should_stop(), args.device):
            wanted = emergency_save_wanted() if state.is_world_process_zero else False
            if _any_rank(wanted, args.device) and not control.should_save:
                control.should_save = True
                self.emergency_step = step
            control.should_training_stop = True
            self.stopped_on_notice = True
            if state.is_world_process_zero:
                print(f"stopping at step {step} ({client.stop_reason() or 'another rank was told to stop'})",
                      flush=True)
        if control.should_save and state.is_world_process_zero and self._saving is None:
            path = os.path.join(args.output_dir, f"checkpoint-{step}")
            self._saving = client.saving(step, path)
            self._saving.__enter__()  # closed in on_save, right after the Trainer wrote it

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._saving is not None:
            saving, self._saving = self._saving, None
            saving.__exit__(None, None, None)
        if self.emergency_step is not None and state.is_world_process_zero:
            path = os.path.join(args.output_dir, f"checkpoint-{self.emergency_step}")
            print(f"saved step {self.emergency_step} to {path}", flush=True)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        if logs and isinstance(logs.get("loss"), (int, float)):
            self._loss = float(logs["loss"])
            client.heartbeat(int(state.global_step), loss=self._loss)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._saving is not None:  # a save was announced but never happened
            saving, self._saving = self._saving, None
            saving.__exit__(RuntimeError, RuntimeError("save did not happen"), None)
        if not self.stopped_on_notice:
            client.done(int(state.global_step))
