"""Retention carried out: delete old step checkpoints beyond the newest ``keep`` valid ones.

The training side calls it after a save (``examples/train_plain.py``); it validates what it deletes
with the supervisor's own scanner, so it lives here rather than in the stdlib-only atomic writer.
"""

from __future__ import annotations

import os
from typing import Iterable

from .atomic import fsync_dir
from .retention import PrunePlan, plan_prune
from .scan import scan


def prune(
    ckpt_dir: str | os.PathLike[str],
    keep: int,
    protect: Iterable[str | os.PathLike[str]] = (),
    *,
    dry_run: bool = False,
) -> PrunePlan:
    """Delete old step checkpoints beyond the newest ``keep`` VALID ones.

    Never leaves fewer than two VALID checkpoints, never deletes a protected path (the resume
    point) or the target of a ``last`` symlink, never deletes anything that is not VALID or not a
    regular file whose name carries a step. Returns the plan that was carried out; files that
    could not be deleted are listed in ``plan.failed``."""
    plan = plan_prune(scan(ckpt_dir), keep, [os.fspath(p) for p in protect])
    if dry_run:
        return plan
    failed = []
    for path in plan.delete:
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            failed.append(f"{path}: {exc.strerror or exc}")
    if plan.delete:
        fsync_dir(ckpt_dir)
    return plan.with_failures(tuple(failed))
