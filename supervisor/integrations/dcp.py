"""``torch.distributed.checkpoint`` (DCP) saves that are atomic across ranks: FSDP, FSDP2, DDP,
torchtitan-style state dicts. torch is imported when a function is called, never at import.

    from supervisor.integrations import dcp as sdcp
    sdcp.save(state, ckpt_dir / f"step-{step}", step)          # every rank, like dcp.save
    ...
    pending = sdcp.async_save(state, ckpt_dir / f"step-{step}", step)
    ...                                                        # train on
    pending.commit()                                           # every rank, before the next save

DCP writes every rank's shards straight into the checkpoint directory and publishes ``.metadata``
last; a kill mid-save leaves a directory that a resume may pick up half-written, and a save to a
fixed name (``last``) overwrites the previous one in place. Here DCP writes into a staging
directory and :mod:`supervisor.sharded` commits it (rank notes, barrier, commit marker, rename
into place), so the directory under the final name is always one whole save.

The staging nonce is agreed through ``broadcast_object_list`` (one tiny collective per save), so
every rank uses rank 0's attempt number even with one supervisor per node. Rank 0 reports the save
to the supervisor; its ``save_end`` goes out after the last rank finished.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import sharded

__all__ = ["PendingSave", "async_save", "broadcast_str", "group_barrier", "save"]


def _dist() -> Any:
    import torch.distributed as dist  # lazily: importing this module never imports torch

    return dist


def _world(process_group: Any) -> tuple[int, int]:
    """(rank, world size) in ``process_group``; (0, 1) when torch.distributed is not in use."""
    dist = _dist()
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(process_group), dist.get_world_size(process_group)


def group_barrier(process_group: Any = None) -> Callable[[], None]:
    """``torch.distributed.barrier`` on ``process_group`` (the default group when None)."""
    dist = _dist()

    def barrier() -> None:
        dist.barrier(group=process_group)

    return barrier


def broadcast_str(process_group: Any = None) -> Callable[[str], str]:
    """A collective that returns rank 0's string on every rank of ``process_group``."""
    dist = _dist()

    def broadcast(value: str) -> str:
        box: list[Any] = [value]
        src = 0 if process_group is None else dist.get_global_rank(process_group, 0)
        dist.broadcast_object_list(box, src=src, group=process_group)
        return str(box[0])

    return broadcast


def _commit_for(final_path: str | os.PathLike[str], step: int | None, process_group: Any,
                checksums: bool) -> sharded.DirCommit:
    rank, world = _world(process_group)
    distributed = world > 1
    return sharded.saving_dir(step, final_path, rank=rank, world_size=world,
                              barrier=group_barrier(process_group) if distributed else None,
                              broadcast=broadcast_str(process_group) if distributed else None,
                              checksums=checksums, writer="dcp")


def save(state_dict: dict[str, Any], final_path: str | os.PathLike[str], step: int | None, *,
         process_group: Any = None, checksums: bool = False, **dcp_kwargs: Any) -> Path:
    """``dcp.save(state_dict)`` into ``final_path``, atomically for all ranks of
    ``process_group``. Every rank calls it. ``dcp_kwargs`` go to ``dcp.save`` (``planner``,
    ``storage_writer`` is not accepted: the writer must target the staging directory). Returns
    ``final_path``. Raises :class:`supervisor.sharded.CommitError` when the commit failed; the
    previous checkpoint under ``final_path`` is then untouched."""
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    if "storage_writer" in dcp_kwargs or "checkpoint_id" in dcp_kwargs:
        raise TypeError("save() chooses the checkpoint directory itself (the staging dir): "
                        "pass neither storage_writer nor checkpoint_id")
    with _commit_for(final_path, step, process_group, checksums) as staging:
        dcp_save(state_dict, checkpoint_id=staging, process_group=process_group, **dcp_kwargs)
    return Path(final_path)


class PendingSave:
    """An :func:`async_save` in flight. :meth:`commit` on every rank, from the training thread
    (it runs barriers), before the next save or at the end: it waits for DCP's background write,
    then commits. Until then the final directory is the previous save."""

    def __init__(self, commit: sharded.DirCommit, staging: Path, future: Any) -> None:
        self._commit = commit
        self.staging = staging
        self.final = commit.final
        self._future = future
        self._done = False

    def done(self) -> bool:
        """The background write finished on this rank (the commit may still be due)."""
        future = getattr(self._future, "upload_completion", self._future)
        return bool(future.done())

    def commit(self) -> Path:
        """Wait for the write, then commit (a collective). Idempotent."""
        if self._done:
            return self.final
        self._done = True
        future = getattr(self._future, "upload_completion", self._future)
        try:
            future.result()
        except BaseException as exc:
            self._commit.__exit__(type(exc), exc, exc.__traceback__)
            raise
        self._commit.__exit__(None, None, None)
        return self.final


def async_save(state_dict: dict[str, Any], final_path: str | os.PathLike[str], step: int | None, *,
               process_group: Any = None, checksums: bool = False, **dcp_kwargs: Any) -> PendingSave:
    """``dcp.async_save`` into a staging directory; :meth:`PendingSave.commit` makes it the
    checkpoint under ``final_path``. Rank 0's ``save_begin`` goes out now and its ``save_end`` at
    the commit, so the supervisor knows a save is in flight while training goes on."""
    from torch.distributed.checkpoint.state_dict_saver import (
        async_save as dcp_async_save,
    )

    if "storage_writer" in dcp_kwargs or "checkpoint_id" in dcp_kwargs:
        raise TypeError("async_save() chooses the checkpoint directory itself (the staging dir): "
                        "pass neither storage_writer nor checkpoint_id")
    commit = _commit_for(final_path, step, process_group, checksums)
    staging = commit.__enter__()
    try:
        future = dcp_async_save(state_dict, checkpoint_id=staging, process_group=process_group, **dcp_kwargs)
    except BaseException as exc:
        commit.__exit__(type(exc), exc, exc.__traceback__)
        raise
    return PendingSave(commit, staging, future)
