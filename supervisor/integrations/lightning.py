"""Lightning integration: one callback.

    from supervisor.integrations.lightning import SupervisorCallback, resume_ckpt_path
    trainer = Trainer(callbacks=[SupervisorCallback(), ModelCheckpoint(...)],
                      plugins=[SLURMEnvironment(auto_requeue=False)])   # the supervisor requeues
    trainer.fit(model, ckpt_path=resume_ckpt_path())

What the callback does:
  * heartbeats with ``trainer.global_step`` and the loss at every train batch end (the client
    throttles the datagrams; a loss tensor is read only when one goes out);
  * reports each checkpoint write (begin, end, bytes, duration) by wrapping the strategy's
    ``CheckpointIO``, and makes local ``torch.save`` writes atomic (temp file, fsync, rename):
    Lightning's own write truncates the file in place, so a kill mid-write tears ``last.ckpt``;
  * owns the notice signals (SIGTERM by default): Lightning's handler would leave at the next
    batch without saving (exit status 0), the callback instead stops at a batch boundary, saves an
    emergency checkpoint first when the supervisor asks for one, and agrees on the stop across
    ranks so that every rank stops at the same step;
  * tells the supervisor the step training resumed at (the resume audit checks it);
  * logs the run's restart metrics (restarts, requeues, preemptions, steps and time lost, saves) to
    the trainer's loggers at the step each attempt starts from (``docs/metrics.md``);
  * with Lightning's ``DeepSpeedStrategy`` (which bypasses ``CheckpointIO``: every rank writes its
    shards into the ``<name>.ckpt/`` *directory*, in place, so a kill mid-save leaves shards of two
    saves in ``last.ckpt/``), makes each directory save atomic across ranks: DeepSpeed writes into a
    staging directory, :mod:`supervisor.sharded` commits it under the final name once every rank is
    done (the old ``last.ckpt/`` is replaced only then), and rank 0 reports the save.

Works with ``lightning`` (``SupervisorCallback``) and ``pytorch_lightning``
(``PLSupervisorCallback``); use the one whose ``Trainer`` you import.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import threading
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import client, sharded
from . import emergency_save_wanted, resume_ckpt_path

# Also SupervisorCallback and PLSupervisorCallback, built on first access (module __getattr__).
__all__ = ["resume_ckpt_path"]


class _CheckpointIOLogic:
    """Wraps a ``CheckpointIO``: reports every write to the supervisor; atomic for local torch files."""

    def __init__(self, inner: Any, owner: _CallbackLogic, atomic: bool) -> None:
        super().__init__()
        self.inner = inner
        self.owner = owner
        self.atomic = atomic

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        step = checkpoint.get("global_step")
        local = "://" not in str(path)
        with client.saving(step, path):
            if self.atomic and local and storage_options is None:
                from ..checkpoints.atomic import atomic_torch_save

                Path(path).parent.mkdir(parents=True, exist_ok=True)
                atomic_torch_save(checkpoint, path)
            else:
                self.inner.save_checkpoint(checkpoint, path, storage_options=storage_options)
        if isinstance(step, int):
            self.owner.last_saved_step = step

    def load_checkpoint(self, path: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return self.inner.load_checkpoint(path, *args, **kwargs)

    def remove_checkpoint(self, path: Any) -> None:
        self.inner.remove_checkpoint(path)

    def teardown(self) -> None:
        self.inner.teardown()


class _CallbackLogic:
    """The callback's behaviour, independent of which Lightning package provides the base class."""

    _io_class: type
    _torch_io_class: type

    def __init__(self, dirpath: str | os.PathLike[str] | None = None, *, atomic_saves: bool = True,
                 own_signals: bool = True, stop_check_every: int = 1, log_restarts: bool = True) -> None:
        """``dirpath``: where an emergency checkpoint goes [the ModelCheckpoint's dirpath, else
        ``$SUPERVISOR_CHECKPOINT_DIR``, else ``<default_root_dir>/checkpoints``].
        ``stop_check_every``: batches between stop checks; with several ranks each check is one
        tiny all-reduce (Lightning already does one per batch for its own SIGTERM flag).
        ``log_restarts``: at the start of each supervised attempt, log the run's restart metrics
        (``supervisor/restarts``, ``supervisor/preemptions``, ...) to the trainer's loggers."""
        super().__init__()
        self.log_restarts = log_restarts
        self.dirpath = os.fspath(dirpath) if dirpath is not None else None
        self.atomic_saves = atomic_saves
        self.own_signals = own_signals
        self.stop_check_every = max(1, int(stop_check_every))
        self.last_saved_step: int | None = None
        self.stopped_on_notice = False
        self.emergency_path: str | None = None
        self._max_steps: dict[str, int] = {}  # {"max_steps": N} once known: `supervise status` shows the ETA

    # set-up ----------------------------------------------------------------------------------

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        strategy = trainer.strategy
        if self.atomic_saves and is_deepspeed_strategy(strategy):
            make_deepspeed_saves_atomic(strategy, self)
        inner = strategy.checkpoint_io
        if isinstance(inner, _CheckpointIOLogic) or "Async" in type(inner).__name__:
            return  # already wrapped; async writes end later than the call: left to the dir watcher
        atomic = self.atomic_saves and type(inner) is self._torch_io_class
        strategy.checkpoint_io = self._io_class(inner, self, atomic)
        env = getattr(strategy, "cluster_environment", None)
        if getattr(env, "auto_requeue", False) and client.enabled():
            warnings.warn("Lightning's SLURM auto-requeue is on: it requeues the job by itself on "
                          "SIGUSR1, racing the supervisor. Pass plugins=[SLURMEnvironment(auto_requeue=False)].",
                          RuntimeWarning, stacklevel=2)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self.own_signals:
            self._own_notice_signals()
        step = int(trainer.global_step)
        if trainer.ckpt_path and trainer.is_global_zero:
            print(f"resumed from {trainer.ckpt_path} at step {step}", flush=True)
        client.resumed(step)
        self._max_steps = _max_steps_of(trainer)
        if self.log_restarts:
            self._log_restart_metrics(trainer, step)

    def _log_restart_metrics(self, trainer: Any, step: int) -> None:
        """The run's restarts, requeues, preemptions and losses so far, at the step this attempt
        starts from, to every logger the trainer has (TensorBoard, CSV, W&B...: docs/metrics.md)."""
        if not trainer.is_global_zero:
            return
        for logger in getattr(trainer, "loggers", None) or []:
            try:
                client.log_restart_metrics(logger, step)
            except Exception as exc:  # noqa: BLE001 - a logger's trouble must not stop the training
                warnings.warn(f"could not log the restart metrics to {type(logger).__name__}: {exc}",
                              RuntimeWarning, stacklevel=2)

    def _own_notice_signals(self) -> None:
        """Replace Lightning's SIGTERM handler (registered just before fit) by the client's, without
        chaining: Lightning's would end training at the next batch without a checkpoint."""
        if threading.current_thread() is not threading.main_thread():
            return
        names = os.environ.get("SUPERVISOR_NOTICE_SIGNALS", "").replace(",", " ").split() or ["TERM"]
        for name in names:
            with contextlib.suppress(KeyError, ValueError, OSError):
                text = name.strip().upper()
                signum = signal.Signals[text if text.startswith("SIG") else "SIG" + text]
                signal.signal(signum, signal.SIG_IGN)  # not SIG_DFL: no window where TERM kills us
        client.install(names)

    # every batch -----------------------------------------------------------------------------

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = int(trainer.global_step)
        loss = _loss_of(outputs)
        if loss is None:
            client.heartbeat(step, **self._max_steps)
        else:
            client.heartbeat(step, loss=loss, **self._max_steps)
        if batch_idx % self.stop_check_every:
            return
        if not trainer.strategy.reduce_boolean_decision(client.should_stop(), all=False):
            return
        # Every rank is here, at the same batch: a checkpoint now is consistent on all of them.
        wanted = emergency_save_wanted() if trainer.is_global_zero else False
        wanted = trainer.strategy.reduce_boolean_decision(wanted, all=False)
        if wanted and self.last_saved_step != step:
            path = os.path.join(self._emergency_dir(trainer), f"epoch={trainer.current_epoch}-step={step}.ckpt")
            trainer.save_checkpoint(path, weights_only=False)  # collective; rank 0 writes (wrapped IO)
            self.emergency_path = path
            if trainer.is_global_zero:
                print(f"saved step {step} to {path}", flush=True)
        trainer.should_stop = True
        self.stopped_on_notice = True
        if trainer.is_global_zero:
            print(f"stopping at step {step} ({client.stop_reason() or 'another rank was told to stop'})",
                  flush=True)

    def on_validation_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        client.heartbeat(int(trainer.global_step))  # alive during a long validation

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if not self.stopped_on_notice:
            client.done(int(trainer.global_step))  # finished, not stopped: the exit now is completion

    def _emergency_dir(self, trainer: Any) -> str:
        if self.dirpath:
            return self.dirpath
        ckpt_cb = getattr(trainer, "checkpoint_callback", None)
        if ckpt_cb is not None and getattr(ckpt_cb, "dirpath", None):
            return os.fspath(ckpt_cb.dirpath)
        return client.checkpoint_dir() or os.path.join(trainer.default_root_dir, "checkpoints")


def is_deepspeed_strategy(strategy: Any) -> bool:
    """Lightning's ``DeepSpeedStrategy`` (or a subclass), without importing deepspeed."""
    return any(cls.__name__ == "DeepSpeedStrategy" for cls in type(strategy).__mro__)


def make_deepspeed_saves_atomic(strategy: Any, owner: _CallbackLogic | None = None) -> None:
    """Wrap ``strategy.save_checkpoint`` (a ``DeepSpeedStrategy``) so that each ``<name>.ckpt/``
    directory save is committed atomically by all ranks (:func:`supervisor.sharded.saving_dir`)
    and reported by rank 0. Idempotent. Remote paths (``s3://``) are saved as before."""
    if getattr(strategy, "_supervisor_atomic_saves", False):
        return
    original = strategy.save_checkpoint

    def save_checkpoint(checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        filepath = strategy.broadcast(filepath)  # rank 0's path, as the strategy itself does
        if storage_options is not None or "://" in str(filepath):
            original(checkpoint, filepath, storage_options)
            return
        step = checkpoint.get("global_step")
        world = int(strategy.world_size)
        several = world > 1
        with sharded.saving_dir(step if isinstance(step, int) else None, filepath, rank=int(strategy.global_rank),
                                world_size=world, barrier=strategy.barrier if several else None,
                                broadcast=(lambda value: str(strategy.broadcast(value, src=0))) if several else None,
                                writer="lightning_deepspeed") as staging:
            original(checkpoint, str(staging), storage_options)
        if owner is not None and isinstance(step, int):
            owner.last_saved_step = step

    strategy.save_checkpoint = save_checkpoint
    strategy._supervisor_atomic_saves = True


def _max_steps_of(trainer: Any) -> dict[str, int]:
    """The optimizer step the fit ends at: ``max_steps`` when set, else Lightning's estimate from the
    epochs and batches (unknown for an endless loader: then nothing is sent)."""
    for source in ("max_steps", "estimated_stepping_batches"):
        try:
            value = getattr(trainer, source)
        except Exception:  # noqa: BLE001 - an estimate Lightning cannot make must not break training
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 2**53:
            return {"max_steps": int(value)}
    return {}


def _loss_of(outputs: Any) -> Any:
    """The loss from ``training_step``'s return value (a tensor or a dict with "loss"), unconverted."""
    if isinstance(outputs, Mapping):
        outputs = outputs.get("loss")
    if outputs is None or isinstance(outputs, (str, bytes, list, tuple)):
        return None
    detach = getattr(outputs, "detach", None)
    return detach() if callable(detach) else outputs


@functools.cache
def _classes(flavor: str) -> tuple[type, type]:
    """(callback class, CheckpointIO class) built on ``lightning`` or ``pytorch_lightning``."""
    if flavor == "lightning":
        from lightning.fabric.plugins import CheckpointIO, TorchCheckpointIO
        from lightning.pytorch import Callback
    else:
        # The standalone packages ship the same classes under other module paths; mypy sees two types.
        from lightning_fabric.plugins import CheckpointIO, TorchCheckpointIO  # type: ignore[assignment]
        from pytorch_lightning import Callback  # type: ignore[assignment]
    io_class = type("SupervisedCheckpointIO", (_CheckpointIOLogic, CheckpointIO),
                    {"__module__": __name__, "__doc__": _CheckpointIOLogic.__doc__})
    callback = type("SupervisorCallback", (_CallbackLogic, Callback),
                    {"__module__": __name__, "__doc__": _CallbackLogic.__doc__,
                     "_io_class": io_class, "_torch_io_class": TorchCheckpointIO})
    return callback, io_class


def _missing(flavor: str, exc: ImportError) -> ImportError:
    return ImportError(f"supervisor.integrations.lightning needs the '{flavor}' package "
                       f"(pip install {flavor.replace('_', '-')}): {exc}")


def __getattr__(name: str) -> Any:
    """``SupervisorCallback`` (package ``lightning``, else ``pytorch_lightning`` when only that one
    is installed) and ``PLSupervisorCallback`` (``pytorch_lightning``), built on first use."""
    if name == "SupervisorCallback":
        try:
            return _classes("lightning")[0]
        except ImportError as exc:
            try:
                return _classes("pytorch_lightning")[0]
            except ImportError:
                raise _missing("lightning", exc) from None
    if name == "PLSupervisorCallback":
        try:
            return _classes("pytorch_lightning")[0]
        except ImportError as exc:
            raise _missing("pytorch_lightning", exc) from None
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
