"""The step stored inside a single-file checkpoint, read by the inert scan (never by unpickling).

Why: scripts that keep only ``last.ckpt`` and rewrite it in place carry no step in the name. After
such a save the run loop can still record the step it reached, from the ``global_step``/``step``/
``epoch`` the file itself holds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..states import Verdict
from .filecheck import check_file
from .limits import MAX_STEP
from .picklescan import step_keys, user_step_key


@dataclass(frozen=True)
class StepInfo:
    """What a checkpoint says about its own progress. ``step`` is ``global_step`` (Lightning),
    ``global_steps`` (DeepSpeed), ``step``/``iteration``/... (plain loops; the top-level mapping
    first, then mappings directly below it, or a one-element integer tensor under ``step``);
    ``epoch`` the top-level ``epoch``. Either may be None, never both."""

    path: str
    step: int | None
    epoch: int | None
    format: str
    reason: str  # what the validator found (the file is whole and safe to scan)
    key: str | None = None  # the top-level key that held the step ("iter_num"), when one did


def embedded_step(path: str | os.PathLike[str], user_key: str | None = None) -> StepInfo | None:
    """The step/epoch inside the checkpoint file at ``path``, or None when the file is not a whole,
    allowlisted single-file checkpoint (torn, unsafe, over a scanner cap, a directory, unreadable)
    or holds neither. Pure apart from bounded reads (trailer, central directory, ``data.pkl``:
    milliseconds, whatever the file size); never raises. ``user_key``: a key to look at first
    (config ``checkpoint.step_from: key:NAME``)."""
    raw = os.fspath(path)
    try:
        with user_step_key(user_key):
            outcome = check_file(raw, max_level=3)
            keys = step_keys()
    except OSError:
        return None
    if outcome.verdict is not Verdict.VALID or not outcome.load_safe:
        return None
    embedded = outcome.embedded_step
    step = embedded if embedded is not None and 0 <= embedded <= MAX_STEP else None
    epoch = outcome.epoch if outcome.epoch is not None and 0 <= outcome.epoch <= MAX_STEP else None
    if step is None and epoch is None:
        return None
    key = next((k for k in keys if step is not None and type(outcome.facts.get(k)) is int
                and outcome.facts.get(k) == step), None)
    return StepInfo(raw, step, epoch, outcome.format, outcome.reason, key)
