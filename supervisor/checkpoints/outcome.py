"""The result of one format check, before the name-level rules of :mod:`.validate` apply."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..states import Verdict


@dataclass(frozen=True)
class Outcome:
    """What a format validator found. ``level`` is the deepest level passed when the verdict is
    VALID, and the level that failed (or could not be done) otherwise."""

    format: str
    verdict: Verdict
    level: int
    reason: str
    embedded_step: int | None = None
    epoch: int | None = None
    facts: Mapping[str, Any] = field(default_factory=dict)  # scalars read inertly (dp_world_size...)
    # False when a pickle a loader would unpickle was not scanned to the end (over a cap, unknown
    # format) or names a code-execution primitive: such a checkpoint is never a resume point.
    # Naming other globals outside the allowlist is a trust note (trust.py), not a reason here.
    load_safe: bool = True

    def but(self, **changes: Any) -> Outcome:
        return replace(self, **changes)


def valid(fmt: str, level: int, reason: str, **kw: Any) -> Outcome:
    return Outcome(fmt, Verdict.VALID, level, reason, **kw)


def corrupt(fmt: str, level: int, reason: str, **kw: Any) -> Outcome:
    return Outcome(fmt, Verdict.CORRUPT, level, reason, **kw)


def unverifiable(fmt: str, level: int, reason: str, **kw: Any) -> Outcome:
    return Outcome(fmt, Verdict.UNVERIFIABLE, level, reason, **kw)


def worst(outcomes: list[Outcome]) -> Outcome | None:
    """The outcome that decides a group: the first CORRUPT, else IN_PROGRESS, else UNVERIFIABLE
    (one that is not load-safe first, so a group is never safer than its worst member)."""
    for verdict in (Verdict.CORRUPT, Verdict.IN_PROGRESS, Verdict.UNVERIFIABLE):
        matching = [o for o in outcomes if o.verdict is verdict]
        if matching:
            return next((o for o in matching if not o.load_safe), matching[0])
    return None
