"""Retention: which old step checkpoints may be deleted (:func:`plan_prune`, a pure plan over validation
reports) and deleting them (:func:`prune`, which the training side calls after a save, as
``examples/train_plain.py`` does; it validates what it deletes with the supervisor's own scanner, so
it lives here rather than in the stdlib-only atomic writer).

The single-copy failure mode (``save_top_k=0``: a preemption tears the only copy and thousands
of steps are gone) is why the plan never leaves fewer than two VALID step checkpoints, whatever
``keep`` says.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from ..states import Verdict
from .atomic import fsync_dir
from .scan import scan
from .validate import CheckpointReport

MIN_VALID_KEPT = 2


@dataclass(frozen=True)
class PrunePlan:
    delete: tuple[str, ...]
    keep: tuple[str, ...]
    reason: str
    failed: tuple[str, ...] = ()  # filled in by atomic.prune when a delete failed

    def with_failures(self, failed: tuple[str, ...]) -> PrunePlan:
        return replace(self, failed=failed)


def plan_prune(reports: Sequence[CheckpointReport], keep: int, protect: Sequence[str] = ()) -> PrunePlan:
    """Keep the newest ``max(keep, 2)`` VALID step checkpoints (by the step in the name), every
    protected path, every symlink target; delete only older VALID regular files with a step in
    their name. Anything CORRUPT, UNVERIFIABLE or IN_PROGRESS is left for a human/quarantine."""
    keep_n = max(keep, MIN_VALID_KEPT)
    protected = {_norm(p) for p in protect}
    for report in reports:
        if report.link_target is not None:
            base = os.path.dirname(_norm(report.path))
            protected.add(_norm(os.path.join(base, report.link_target)))
    step_valid = sorted(
        (r for r in reports if r.verdict is Verdict.VALID and r.name_step is not None and not r.is_last),
        key=lambda r: (r.name_step, r.version, r.path),
        reverse=True,
    )
    kept = step_valid[:keep_n]
    delete = []
    for report in step_valid[keep_n:]:
        if _norm(report.path) in protected or report.is_dir or report.link_target is not None:
            kept.append(report)
        else:
            delete.append(report)
    reason = (f"keeping the newest {len(step_valid[:keep_n])} valid step checkpoints (keep={keep}, "
              f"never fewer than {MIN_VALID_KEPT}); deleting {len(delete)} older valid file(s)")
    return PrunePlan(tuple(r.path for r in delete), tuple(r.path for r in kept), reason)


def _norm(path: str) -> str:
    return os.path.normpath(os.path.abspath(path))


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
