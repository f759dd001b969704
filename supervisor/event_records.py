"""Typed records of the events the ledger folds (supervisor/ledger.py): one frozen dataclass per
kind, built from a log line once, its fields coerced once.

The event log is written by the supervisor but read back from a file anyone with write access to
the run directory could have edited, so every field is coerced here and a wrong type becomes
``None`` (or ``()``), never an exception: a hostile or half-written line cannot stop the fold.
:func:`record_of` is the one place that knows which fields each kind carries; the fold matches on
the record types, not on field names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from .events import Ev, Event
from .fields import as_int, as_nodes, as_str
from .states import Action, FailureClass

__all__ = [
    "AttemptEnded",
    "AttemptStarted",
    "Decided",
    "FailureSeen",
    "FoldedRecord",
    "ProgressSeen",
    "ResumePointTold",
    "ResumedAt",
    "SaveEnded",
    "SavedElsewhere",
    "action_of",
    "class_of",
    "record_of",
    "signal_of",
]


# ---------------------------------------------------------------------------------------------
# Coercion of one field


def signal_of(value: Any) -> int | None:
    """``attempt_end`` writes the signal's name (``SIGSEGV``); older or other writers the number."""
    number = as_int(value)
    if number is not None:
        return abs(number)
    if isinstance(value, str) and value:
        from .signals import parse_signal

        try:
            return parse_signal(value)
        except ValueError:
            return None
    return None


def class_of(value: Any) -> FailureClass | None:
    try:
        return FailureClass(value) if value is not None else None
    except (ValueError, TypeError):
        return None


def action_of(value: Any) -> Action | None:
    try:
        return Action(value) if value is not None else None
    except (ValueError, TypeError):
        return None


def lines_of(value: Any) -> tuple[str, ...]:
    if isinstance(value, (list, tuple)):
        return tuple(str(x) for x in value)
    if isinstance(value, str) and value:
        return (value,)
    return ()


# ---------------------------------------------------------------------------------------------
# The records


@dataclass(frozen=True, slots=True)
class AttemptStarted:
    ts: float
    attempt: int | None
    job_id: str | None
    restart_count: int | None
    nodes: tuple[str, ...]
    resume: Mapping[str, Any] | None  # the event's fields when it names a resume path or step


@dataclass(frozen=True, slots=True)
class ResumePointTold:
    """What the supervisor chose to resume from, told before (or after) the attempt starts."""

    ts: float
    attempt: int | None
    fields: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ProgressSeen:
    ts: float
    attempt: int | None
    step: int | None
    source: str | None


@dataclass(frozen=True, slots=True)
class ResumedAt:
    """The child said which step it resumed at."""

    ts: float
    attempt: int | None
    step: int | None


@dataclass(frozen=True, slots=True)
class SaveEnded:
    ts: float
    attempt: int | None
    step: int | None
    ok: bool


@dataclass(frozen=True, slots=True)
class AttemptEnded:
    ts: float
    attempt: int | None
    cls: FailureClass | None
    action: Action | None
    exit_code: int | None
    signal: int | None
    last_step: int | None
    fields: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FailureSeen:
    ts: float
    attempt: int | None
    cls: FailureClass | None
    action: Action | None
    evidence: tuple[str, ...]
    step: int | None
    node: str | None
    reason: str | None
    exit_code: int | None
    signal: int | None


@dataclass(frozen=True, slots=True)
class Decided:
    ts: float
    attempt: int | None
    action: Action | None


@dataclass(frozen=True, slots=True)
class SavedElsewhere:
    """The output named a save outside the watched checkpoint directory."""

    ts: float
    attempt: int | None
    path: str | None
    step: int | None


FoldedRecord: TypeAlias = (AttemptStarted | ResumePointTold | ProgressSeen | ResumedAt | SaveEnded | AttemptEnded
                           | FailureSeen | Decided | SavedElsewhere)


def _attempt_started(ev: Event) -> AttemptStarted:
    named = "resume_path" in ev.fields or "resume_step" in ev.fields
    return AttemptStarted(ev.ts, as_int(ev.get("attempt")), as_str(ev.get("job_id")), as_int(ev.get("restart_count")),
                          as_nodes(ev.get("nodes")) or as_nodes(ev.get("host")), ev.fields if named else None)


def _attempt_ended(ev: Event) -> AttemptEnded:
    return AttemptEnded(ev.ts, as_int(ev.get("attempt")), class_of(ev.get("class")), action_of(ev.get("action")),
                        as_int(ev.get("exit_code")), signal_of(ev.get("signal")), as_int(ev.get("last_step")),
                        dict(ev.fields))


def _failure(ev: Event) -> FailureSeen:
    return FailureSeen(ev.ts, as_int(ev.get("attempt")), class_of(ev.get("class")), action_of(ev.get("action")),
                       lines_of(ev.get("evidence")), as_int(ev.get("step")), as_str(ev.get("node")),
                       as_str(ev.get("reason")), as_int(ev.get("exit_code")), signal_of(ev.get("signal")))


_BUILDERS: dict[str, Callable[[Event], FoldedRecord]] = {
    Ev.ATTEMPT_START.value: _attempt_started,
    Ev.RESUME_POINT.value: lambda ev: ResumePointTold(ev.ts, as_int(ev.get("attempt")), ev.fields),
    Ev.PROGRESS.value: lambda ev: ProgressSeen(ev.ts, as_int(ev.get("attempt")), as_int(ev.get("step")),
                                               as_str(ev.get("source")) or None),
    Ev.RESUMED.value: lambda ev: ResumedAt(ev.ts, as_int(ev.get("attempt")), as_int(ev.get("step"))),
    Ev.SAVE_END.value: lambda ev: SaveEnded(ev.ts, as_int(ev.get("attempt")), as_int(ev.get("step")),
                                            ev.get("ok") is not False),
    Ev.ATTEMPT_END.value: _attempt_ended,
    Ev.FAILURE.value: _failure,
    Ev.DECISION.value: lambda ev: Decided(ev.ts, as_int(ev.get("attempt")), action_of(ev.get("action"))),
    Ev.SAVE_ELSEWHERE.value: lambda ev: SavedElsewhere(ev.ts, as_int(ev.get("attempt")), as_str(ev.get("path")),
                                                       as_int(ev.get("step"))),
}

FOLDED_KINDS = frozenset(_BUILDERS)


def record_of(ev: Event) -> FoldedRecord | None:
    """The typed record of ``ev``, or None for a kind the ledger does not fold."""
    build = _BUILDERS.get(ev.event)
    return build(ev) if build is not None else None
