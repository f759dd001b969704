"""The result of one format check, before the name-level rules of :mod:`.validate` apply."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping

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

    def but(self, **changes: Any) -> "Outcome":
        return replace(self, **changes)


def valid(fmt: str, level: int, reason: str, **kw: Any) -> Outcome:
    return Outcome(fmt, Verdict.VALID, level, reason, **kw)


def corrupt(fmt: str, level: int, reason: str, **kw: Any) -> Outcome:
    return Outcome(fmt, Verdict.CORRUPT, level, reason, **kw)


def unverifiable(fmt: str, level: int, reason: str, **kw: Any) -> Outcome:
    return Outcome(fmt, Verdict.UNVERIFIABLE, level, reason, **kw)


def worst(outcomes: list[Outcome]) -> Outcome | None:
    """The outcome that decides a group: the first CORRUPT, else the first UNVERIFIABLE."""
    for verdict in (Verdict.CORRUPT, Verdict.IN_PROGRESS, Verdict.UNVERIFIABLE):
        for outcome in outcomes:
            if outcome.verdict is verdict:
                return outcome
    return None
