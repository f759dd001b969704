"""The run's restart metrics: a pure fold of the event log (docs/metrics.md has the table).

The numbers are the report's (``supervisor/report/model.py``) and come from the same fold of the
log into attempts (:func:`supervisor.ledger.ledger_from_events`): restarts are relaunches inside one
supervisor session, requeues are sessions after the first, steps and time lost are the ledger's.
One rule is the metrics' own: an attempt counts from its resume point, which the supervisor chooses
right before it launches the child, so the training reading the snapshot at its start sees itself
counted (a resume point followed by a ``run_end`` instead of a launch is not counted).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..events import Ev, Event
from ..fields import as_float, as_int, as_str
from ..ledger import SCHEDULER_ENDS, final_run_end, is_crash, ledger_from_events

__all__ = ["RUNNING", "EventWindow", "RunMetrics", "run_metrics"]

RUNNING = "running"  # the outcome while no run_end ended the run


@dataclass(frozen=True)
class RunMetrics:
    """What the metrics files say, for the whole run (every job, every requeue). ``reason`` names
    where the numbers stand (``outcome`` and its reason once the run ended)."""

    attempts: int = 0
    restarts: int = 0  # relaunches in place, inside one supervisor session
    requeues: int = 0  # supervisor sessions after the first (a requeued or resubmitted job)
    preemptions: int = 0  # attempts ended by the scheduler (preempted, time limit) or after a stop notice
    failures: int = 0  # attempts that ended in a failure the run is answerable for (a crash, a hang, ...)
    ends: tuple[tuple[str, int], ...] = ()  # (class, attempts that ended in it), sorted by class
    steps_lost: int = 0
    steps_lost_at_least: bool = False  # some losses are lower bounds (steps read from the output)
    time_lost_s: float = 0.0
    saves: int = 0  # saves that ended well
    saves_failed: int = 0
    save_seconds_total: float = 0.0  # of the saves with a known duration
    save_seconds_count: int = 0
    save_seconds_last: float | None = None
    save_seconds_max: float | None = None
    last_durable_step: int | None = None
    attempt: int | None = None  # the newest attempt (counted from its resume point)
    job_id: str | None = None  # of the newest session
    outcome: str = RUNNING  # RunOutcome of the run_end that ended the run, else "running"
    stopped_by: str | None = None
    exit_code: int | None = None  # supervise's own
    reason: str = "running"
    ts: float | None = None  # of the newest event folded

    def as_numbers(self) -> dict[str, float]:
        """The numeric metrics by their short names (what the training-side loggers get)."""
        numbers: dict[str, float] = {
            "attempt": self.attempt or 0, "attempts": self.attempts, "restarts": self.restarts,
            "requeues": self.requeues, "preemptions": self.preemptions, "failures": self.failures,
            "steps_lost": self.steps_lost, "time_lost_s": round(self.time_lost_s, 3),
            "saves": self.saves, "saves_failed": self.saves_failed,
        }
        if self.save_seconds_last is not None:
            numbers["save_seconds_last"] = round(self.save_seconds_last, 3)
        if self.save_seconds_max is not None:
            numbers["save_seconds_max"] = round(self.save_seconds_max, 3)
        if self.last_durable_step is not None:
            numbers["last_durable_step"] = self.last_durable_step
        return numbers


@dataclass
class EventWindow:
    """The events the fold needs, kept in memory by the sink: everything except the sampled
    ``progress`` events, of which the first and the newest of each attempt are enough (the ledger
    takes the highest step and the last time from them). Bounded by attempts and saves, not by the
    age of the run."""

    events: list[Event] = field(default_factory=list)
    _first_progress: set[int | None] = field(default_factory=set)  # attempts whose first progress is kept
    _newest_progress: dict[int | None, int] = field(default_factory=dict)  # attempt -> index of its newest

    def add(self, event: Event) -> None:
        if event.event != Ev.PROGRESS.value:
            self.events.append(event)
            return
        attempt = as_int(event.get("attempt"))
        if attempt in self._newest_progress:
            self.events[self._newest_progress[attempt]] = event
            return
        self.events.append(event)
        if attempt in self._first_progress:
            self._newest_progress[attempt] = len(self.events) - 1
        else:
            self._first_progress.add(attempt)


def run_metrics(events: Sequence[Event]) -> RunMetrics:
    """Fold the event log (file order) into the run's metrics."""
    records = ledger_from_events(events)
    sessions, current_session, notices, launching, job_id = _sessions(events)
    started = {r.attempt for r in records}
    attempts_by_session = Counter(sessions.values())
    if launching is not None and launching not in started:
        attempts_by_session[current_session] += 1
    restarts = sum(max(n - 1, 0) for n in attempts_by_session.values())
    session_count = sum(1 for e in events if e.event == Ev.RUN_START.value)
    ends = Counter(r.cls.value for r in records if r.cls is not None)
    preempted = sum(1 for r in records if r.cls in SCHEDULER_ENDS or r.attempt in notices)
    saves = [e for e in events if e.event == Ev.SAVE_END.value]
    ok = [e for e in saves if e.get("ok") is not False]
    durations = [d for d in (as_float(e.get("duration")) for e in ok) if d is not None and d >= 0]
    durable = [r.last_durable_step for r in records if r.last_durable_step is not None]
    end = final_run_end(events)
    count = len(started | ({launching} if launching is not None else set()))
    newest = max(started | ({launching} if launching is not None else set()), default=None)
    outcome = as_str(end.get("outcome")) if end is not None else None
    return RunMetrics(
        attempts=count, restarts=restarts, requeues=max(session_count - 1, 0), preemptions=preempted,
        failures=sum(1 for r in records if is_crash(r.cls)), ends=tuple(sorted(ends.items())),
        steps_lost=sum(r.steps_lost or 0 for r in records),
        steps_lost_at_least=any(r.steps_lost_at_least for r in records),
        time_lost_s=round(sum(r.wall_lost or 0.0 for r in records), 3),
        saves=len(ok), saves_failed=len(saves) - len(ok),
        save_seconds_total=round(sum(durations), 6), save_seconds_count=len(durations),
        save_seconds_last=durations[-1] if durations else None,
        save_seconds_max=max(durations) if durations else None,
        last_durable_step=max(durable) if durable else None,
        attempt=newest, job_id=job_id,
        outcome=outcome or RUNNING, stopped_by=as_str(end.get("stopped_by")) if end is not None else None,
        exit_code=as_int(end.get("exit_code")) if end is not None else None,
        reason=(as_str(end.get("reason")) or outcome or RUNNING) if end is not None else RUNNING,
        ts=events[-1].ts if events else None,
    )


def _sessions(events: Sequence[Event]) -> tuple[dict[int, int], int, set[int], int | None, str | None]:
    """(attempt -> session index, the newest session's index, attempts that got a stop notice, the
    attempt being launched (a resume point with no launch and no run_end after it), the newest
    session's job id)."""
    session = -1
    sessions: dict[int, int] = {}
    notices: set[int] = set()
    current: int | None = None
    launching: int | None = None
    job_id: str | None = None
    for ev in events:
        name = ev.event
        if name == Ev.RUN_START.value:
            session += 1
            job_id = as_str(ev.get("job_id"))
        elif name == Ev.RESUME_POINT.value:
            launching = as_int(ev.get("attempt"))
        elif name == Ev.ATTEMPT_START.value:
            number = as_int(ev.get("attempt"))
            if number is not None:
                sessions.setdefault(number, max(session, 0))
                current = number
            if number == launching:
                launching = None
        elif name == Ev.RUN_END.value:
            launching = None
        elif name == Ev.NOTICE.value:
            number = as_int(ev.get("attempt"))
            target = number if number is not None else current
            if target is not None:
                notices.add(target)
    return sessions, max(session, 0), notices, launching, job_id
