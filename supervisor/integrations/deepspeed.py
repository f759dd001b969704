"""DeepSpeed ``engine.save_checkpoint`` made atomic across ranks, with a ``latest`` file that only
ever names a complete tag. Imports neither deepspeed nor torch at import time.

    from supervisor.integrations import deepspeed as sds
    sds.save_checkpoint(engine, save_dir, client_state={"step": step})   # every rank
    ...
    engine.load_checkpoint(save_dir)          # DeepSpeed's own loader: reads 'latest'

What DeepSpeed does alone: every rank ``torch.save``\\ s its shards straight into
``<save_dir>/<tag>/``, and rank 0 writes ``latest`` with a plain ``open().write()`` after its own
shards but *before* the closing barrier, so a kill in that window leaves ``latest`` naming a tag
whose other ranks' optimizer shards are missing or short.

What this helper does: DeepSpeed writes the tag into a staging directory
(``<save_dir>/<tag>.tmp-<attempt>-<nonce>/``, passed to DeepSpeed as the tag, so its own
cross-rank tag check still runs), :mod:`supervisor.sharded` commits it under ``<tag>`` once every
rank is done, and only then rank 0 replaces ``latest`` atomically (temp file, fsync, rename).
``save_latest`` is never passed on to DeepSpeed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .. import sharded
from ..checkpoints.atomic import atomic_write_bytes

__all__ = ["latest_tag", "save_checkpoint", "write_latest"]

LATEST = "latest"


def write_latest(save_dir: str | os.PathLike[str], tag: str) -> None:
    """``<save_dir>/latest`` names ``tag``, atomically and durably (rank 0 only)."""
    if not tag or "/" in tag or "\0" in tag or tag in (".", ".."):
        raise ValueError(f"{tag!r} is not a DeepSpeed tag name")
    atomic_write_bytes(Path(save_dir) / LATEST, tag.encode())


def latest_tag(save_dir: str | os.PathLike[str]) -> str | None:
    """The tag ``latest`` names, when it names a directory committed by this helper; else None
    (a tag from an uncommitted save, or no ``latest``)."""
    try:
        tag = (Path(save_dir) / LATEST).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not tag or "/" in tag:
        return None
    return tag if sharded.verify_commit(Path(save_dir) / tag).committed else None


def save_checkpoint(engine: Any, save_dir: str | os.PathLike[str], tag: str | None = None,
                    client_state: dict[str, Any] | None = None, *, step: int | None = None,
                    checksums: bool = False, **kwargs: Any) -> Path:
    """``engine.save_checkpoint(save_dir, tag, client_state)`` committed atomically, then
    ``latest``. Every rank calls it (as with DeepSpeed's own). ``tag`` defaults to DeepSpeed's
    ``global_step<N>``; ``step`` (reported to the supervisor and recorded in the commit marker)
    defaults to ``engine.global_steps``. ``kwargs`` go to ``engine.save_checkpoint``
    (``exclude_frozen_parameters``). Returns ``<save_dir>/<tag>``."""
    import torch.distributed as dist  # DeepSpeed's comm layer runs on torch.distributed

    if "save_latest" in kwargs:
        raise TypeError("save_checkpoint() writes 'latest' itself, after the commit: do not pass save_latest")
    global_steps = getattr(engine, "global_steps", None)
    if step is None and isinstance(global_steps, int):
        step = global_steps
    tag = str(tag) if tag is not None else f"global_step{global_steps}"
    save_dir = Path(save_dir)
    distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1

    def broadcast(value: str) -> str:
        box: list[Any] = [value]
        dist.broadcast_object_list(box, src=0)
        return str(box[0])

    commit = sharded.saving_dir(step, save_dir / tag, rank=rank, world_size=world,
                                barrier=dist.barrier if distributed else None,
                                broadcast=broadcast if distributed else None, checksums=checksums,
                                writer="deepspeed", after_publish=lambda final: write_latest(save_dir, final.name))
    with commit as staging:
        engine.save_checkpoint(str(save_dir), tag=staging.name, client_state=dict(client_state or {}),
                               save_latest=False, **kwargs)
    return save_dir / tag
