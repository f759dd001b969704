"""Any other directory of checkpoint files (Megatron ``iter_N/``, Accelerate's state dirs, custom
layouts): the registry's fallback. No commit marker of its own; every checkpoint file inside passes
its ladder, nested directory formats are checked as such, and the step is the first member's.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..naming import has_checkpoint_suffix
from ..outcome import Outcome, unverifiable, valid, worst
from .base import DirContext, DirFormat
from .kinds import DIRECTORY
from .registry import detect_dir, dir_format

_MAX_WALK_FILES = 10_000


class Directory(DirFormat):
    name = DIRECTORY
    step_where = None
    commit_marker = None
    nests = False

    def detect(self, path: Path, names: frozenset[str]) -> bool:
        return True  # the fallback: whatever no other directory format claims

    def validate(self, path: str, ctx: DirContext) -> Outcome:
        return check_generic_dir(path, ctx)


FORMAT = Directory()


def nests(path: str) -> bool:
    """Whether the directory at ``path`` is a format checked as a unit of its own where it is found."""
    fmt = dir_format(detect_dir(path))
    return fmt is not None and fmt.nests


_ACCELERATE_RNG = re.compile(r"^random_states_[0-9]+\.pkl$", re.ASCII)


def check_generic_dir(path: str, ctx: DirContext) -> Outcome:
    """Any other directory (Megatron ``iter_N/``, custom layouts): every checkpoint file inside
    (three levels deep) passes its ladder; nested DCP/DeepSpeed dirs are checked as such."""
    fmt = DIRECTORY
    files, nested = _walk(path, max_depth=3)
    if not files and not nested:
        return unverifiable(fmt, 0, "directory holds no checkpoint files")
    outcomes = []
    for rel in files:
        outcomes.append(ctx.member(os.path.join(path, rel), rel))
    for rel in nested:
        outcome = ctx.nested(os.path.join(path, rel))
        outcomes.append(outcome.but(reason=f"{rel}/: {outcome.reason}"))
    # Accelerate's random_states_<rank>.pkl holds a "step" that counts gradient-accumulation
    # micro-steps (reset every epoch), not the training step: never the directory's step.
    step = next((o.embedded_step for rel, o in zip(files, outcomes)
                 if o.embedded_step is not None and not _ACCELERATE_RNG.match(os.path.basename(rel))), None)
    if step is None:
        step = next((o.embedded_step for o in outcomes[len(files):] if o.embedded_step is not None), None)
    loose = ctx.loose(path, fmt)
    if loose is not None:
        outcomes.insert(0, loose)
    bad = worst(outcomes)
    if bad:
        return bad.but(format=fmt, embedded_step=step)
    level = min(o.level for o in outcomes)
    return valid(fmt, level, f"{len(outcomes)} checkpoint files/dirs inside intact", embedded_step=step)


def _walk(path: str, max_depth: int) -> tuple[list[str], list[str]]:
    files: list[str] = []
    nested: list[str] = []
    todo = [("", 0)]
    while todo and len(files) < _MAX_WALK_FILES:
        rel, level = todo.pop()
        here = os.path.join(path, rel)
        try:
            entries = sorted(os.scandir(here), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            child = os.path.join(rel, entry.name)
            if entry.name.startswith(".") or entry.is_symlink():
                continue
            if entry.is_dir(follow_symlinks=False):
                if nests(entry.path):
                    nested.append(child)
                elif level + 1 < max_depth:
                    todo.append((child, level + 1))
            elif has_checkpoint_suffix(entry.name):
                files.append(child)  # a FIFO or device too: its check reports it, never opens it
    return sorted(files), sorted(nested)
