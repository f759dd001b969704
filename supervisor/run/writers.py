"""The edge that reads which checkpoint files the child's tree is writing (zero-code mode).

Asked at a notice, before the arbitration, and right before an unchanged child is killed
(:func:`supervisor.run.stop.kill_due`), and while the loop blocks on a save found that way. A
file counts when it looks like a checkpoint (a checkpoint suffix, a temp name, a step or ``last``
name, or any file inside such a directory): a log the training keeps open under the checkpoint
directory is not a save.
"""

from __future__ import annotations

import os
from typing import Any

from ..checkpoints.naming import has_checkpoint_suffix, is_temp_name, parse_name
from ..openfiles import OpenWriter, writers_in_tree
from ..preemption import InFlightSave
from .context import RunContext

WRITER = "writer"  # InFlightSave.source of a save seen as an open file descriptor


def open_save(ctx: RunContext, child: Any) -> OpenWriter | None:
    """The oldest-named checkpoint file the child's tree holds open for writing, or None."""
    pid = getattr(child, "pid", None)
    if not isinstance(pid, int):
        return None
    ckpt_dir = os.fspath(ctx.layout.ckpt_dir)
    try:
        writers = writers_in_tree(pid, str(getattr(child, "tree_marker", "") or ""), ckpt_dir)
    except OSError:
        return None
    saves = sorted((w for w in writers if looks_like_a_save(os.path.relpath(w.path, os.path.realpath(ckpt_dir)))),
                   key=lambda w: w.path)
    return saves[0] if saves else None


def looks_like_a_save(relpath: str) -> bool:
    """Whether a file at ``relpath`` (relative to the checkpoint dir) belongs to a checkpoint."""
    parts = [p for p in relpath.split(os.sep) if p not in ("", ".")]
    if not parts or parts[0] == "..":
        return False
    for part in parts:
        info = parse_name(part)
        if has_checkpoint_suffix(part) or is_temp_name(part) or part == ".metadata.tmp" \
                or info.step is not None or info.is_last:
            return True
    return False


def save_of(writer: OpenWriter, now: float) -> InFlightSave:
    return InFlightSave(path=writer.path, step=None, started_at=now, source=WRITER)
