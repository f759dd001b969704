"""The run's restart metrics: a pure fold of the event log (docs/metrics.md has the table).

The numbers are the report's (``supervisor/addons/report/model.py``) and come from the same fold of the
log into attempts (:func:`supervisor.ledger.ledger_from_events`): restarts are relaunches inside one
supervisor session, requeues are sessions after the first, steps and time lost are the ledger's.
One rule is the metrics' own: an attempt counts from its resume point, which the supervisor chooses
right before it launches the child, so the training reading the snapshot at its start sees itself
counted (a resume point followed by a ``run_end`` instead of a launch is not counted).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from ...events import Ev, Event
from ...fields import as_float, as_int, as_str
from ...ledger import SCHEDULER_ENDS, final_run_end, is_crash, ledger_from_events

__all__ = ["RUNNING", "EventWindow", "RunMetrics", "SaveStats", "run_metrics"]

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


@dataclass(frozen=True)
class SaveStats:
    """The run's saves, counted as their ``save_end`` events arrive."""

    ok: int = 0
    failed: int = 0
    seconds_total: float = 0.0
    seconds_count: int = 0
    last: float | None = None
    longest: float | None = None

    def with_event(self, event: Event) -> SaveStats:
        if event.event != Ev.SAVE_END.value:
            return self
        if event.get("ok") is False:
            return replace(self, failed=self.failed + 1)
        duration = as_float(event.get("duration"))
        if duration is None or duration < 0:
            return replace(self, ok=self.ok + 1)
        return replace(self, ok=self.ok + 1, seconds_total=self.seconds_total + duration,
                       seconds_count=self.seconds_count + 1, last=duration,
                       longest=duration if self.longest is None else max(self.longest, duration))

    @classmethod
    def of(cls, events: Iterable[Event]) -> SaveStats:
        stats = cls()
        for event in events:
            stats = stats.with_event(event)
        return stats


@dataclass
class EventWindow:
    """The events the fold needs, kept in memory by the sink, bounded by the number of attempts
    rather than the age of the run. Of the sampled ``progress`` events, the first and the newest of
    each attempt are kept (the ledger takes the highest step and the last time from them); of the
    ``save_end`` events of an attempt, the good one with the highest step (the ledger's durable
    step), the others being counted in :attr:`saves`."""

    events: list[Event] = field(default_factory=list)
    saves: SaveStats = field(default_factory=SaveStats)
    _first_progress: set[int | None] = field(default_factory=set)  # attempts whose first progress is kept
    _newest_progress: dict[int | None, int] = field(default_factory=dict)  # attempt -> index of its newest
    _best_save: dict[int, tuple[int, int]] = field(default_factory=dict)  # attempt -> (index, step)

    def add(self, event: Event) -> None:
        if event.event == Ev.SAVE_END.value:
            self.saves = self.saves.with_event(event)
            self._add_save(event)
        elif event.event == Ev.PROGRESS.value:
            self._add_progress(event)
        else:
            self.events.append(event)

    def _add_save(self, event: Event) -> None:
        attempt, step = as_int(event.get("attempt")), as_int(event.get("step"))
        if attempt is None:
            self.events.append(event)  # belongs to the attempt in progress where it stands: kept in place
            return
        if event.get("ok") is False or step is None:
            return  # counted; the ledger has no use for it
        best = self._best_save.get(attempt)
        if best is None:
            self.events.append(event)
            self._best_save[attempt] = (len(self.events) - 1, step)
        elif step >= best[1]:
            self.events[best[0]] = event
            self._best_save[attempt] = (best[0], step)

    def _add_progress(self, event: Event) -> None:
        attempt = as_int(event.get("attempt"))
        if attempt in self._newest_progress:
            self.events[self._newest_progress[attempt]] = event
            return
        self.events.append(event)
        if attempt in self._first_progress:
            self._newest_progress[attempt] = len(self.events) - 1
        else:
            self._first_progress.add(attempt)


def run_metrics(events: Sequence[Event], saves: SaveStats | None = None) -> RunMetrics:
    """Fold the event log (file order) into the run's metrics. ``saves``: the saves already counted
    (an :class:`EventWindow`'s, whose ``events`` keep only some of them); else counted here."""
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
    saved = saves if saves is not None else SaveStats.of(events)
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
        saves=saved.ok, saves_failed=saved.failed,
        save_seconds_total=round(saved.seconds_total, 6), save_seconds_count=saved.seconds_count,
        save_seconds_last=saved.last, save_seconds_max=saved.longest,
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
