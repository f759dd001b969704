"""The ledger: the event log folded into one record per attempt. It is the only fold of the log
into attempts: ``supervise audit``, the budgets, the restart policy, the resubmission loop and the
report all read these records, so they cannot disagree about a step. Pure: events in, frozen
records out. Unknown numbers stay ``None``; no step is ever guessed.

Definitions (``docs/policy.md`` has them in one table):

* **start step** of an attempt: the step of its resume point; 0 when it started with nothing to
  resume from; unknown when the resume point's step is unknown.
* **durable step at the end** of an attempt: the step the *next* attempt really resumed from (the
  resume point is the truth: a save the directory watch saw late still counts, a save torn and
  quarantined does not); for the newest attempt, its newest good save (``last_durable_step``).
* **durable progress** = durable step at the end − start step. An attempt *made progress* when this
  is at least ``budget.min_durable_progress`` steps (default 1: any new checkpoint it resumed from).
* **steps lost** = last step reached − durable step at the end (never below 0; 0 for a completed
  attempt; unknown while the attempt runs). When the last step came from the output (zero-code:
  "step 35" was printed, the child may have gone further before it died), the loss is a lower
  bound and the record says so (``steps_lost_at_least``).
* **wall lost** = seconds from the last durable save (or the attempt's start) to the attempt's end.
* **allocation**: attempts that share a Slurm job id *and* restart count (a requeue keeps the job id
  and bumps ``SLURM_RESTART_COUNT``, so each requeue is a new allocation).
* **failure**: an attempt that ended in a class the run is answerable for: any class except
  ``completed``, ``preempted``, ``time_limit`` and ``cancelled`` (the scheduler's or a person's
  doing). ``preempted`` and ``time_limit`` are **scheduler ends**: the run comes back by a requeue.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .failures.classes import classes_where
from .event_records import (
    AttemptEnded,
    AttemptStarted,
    Decided,
    FailureSeen,
    FoldedRecord,
    ProgressSeen,
    ResumedAt,
    ResumePointTold,
    SaveEnded,
    SavedElsewhere,
    record_of,
)
from .events import Ev, Event
from .fields import as_float, as_int, as_str
from .states import Action, FailureClass

__all__ = [
    "NOT_FAILURES",
    "RESULTS_CHECK_CLASSES",
    "SCHEDULER_ENDS",
    "AttemptRecord",
    "Ledger",
    "LossAnomaly",
    "ResultsCheck",
    "SuspectEvent",
    "durable_end",
    "durable_progress",
    "final_run_end",
    "is_crash",
    "ledger_from_events",
    "loss_anomalies",
    "made_progress",
    "newest_save",
    "progress_by_attempt",
    "records_to_json",
    "restarts_from_scratch",
    "results_check",
    "start_step",
    "steps_lost",
]

FC = FailureClass

# From the one table of class traits (supervisor/failures/classes.py).
NOT_FAILURES = classes_where(answerable=False)
SCHEDULER_ENDS = classes_where(scheduler_end=True)
# Failures after which the numbers the training produced are suspect: a memory error or a faulty
# GPU can corrupt weights or gradients silently, before (or without) the crash that shows it.
RESULTS_CHECK_CLASSES = classes_where(results_check=True)


@dataclass(frozen=True)
class AttemptRecord:
    """One launch of the child, as the event log tells it. ``cls`` None = it has no recorded end
    (still running, or the supervisor was killed)."""

    attempt: int
    job_id: str | None = None
    restart_count: int | None = None
    nodes: tuple[str, ...] = ()
    resume_path: str | None = None
    resume_step: int | None = None
    first_step: int | None = None
    last_step: int | None = None
    last_durable_step: int | None = None  # the newest good save of this attempt (else its resume step)
    cls: FailureClass | None = None
    action: Action | None = None
    evidence: tuple[str, ...] = ()
    exit_code: int | None = None
    signal: int | None = None
    start: float | None = None
    end: float | None = None
    steps_lost: int | None = None
    wall_lost: float | None = None
    failure_step: int | None = None  # the step the classifier saw the failure at (``failure`` event)
    fresh: bool = False  # launched with nothing to resume from: it started at step 0
    steps_lost_at_least: bool = False  # the last step is the last one *printed*: the loss may be larger
    step_source: str | None = None  # where the steps came from: "client" (exact) or "regex" (the output)
    failure_node: str | None = None
    failure_reason: str | None = None
    # The newest save the output named outside the watched checkpoint directory (``save_elsewhere``):
    # progress the supervisor cannot see on disk, but that a restart from scratch throws away.
    saved_elsewhere: str | None = None
    saved_elsewhere_step: int | None = None

    @property
    def status(self) -> str:
        """The end class, or ``incomplete`` when the log has no end for this attempt."""
        return self.cls.value if self.cls is not None else "incomplete"

    @property
    def allocation(self) -> tuple[str | None, int]:
        return (self.job_id, self.restart_count or 0)


# ---------------------------------------------------------------------------------------------
# Progress, on records


def is_crash(cls: FailureClass | None) -> bool:
    """A failure the run is answerable for (not completion, not the scheduler, not a person)."""
    return cls is not None and cls not in NOT_FAILURES


def steps_lost(last_step: int | None, durable_step: int | None) -> int | None:
    """Last step reached minus the durable step it falls back to; None when either is unknown."""
    if last_step is None or durable_step is None:
        return None
    return max(last_step - durable_step, 0)


def start_step(record: AttemptRecord) -> int | None:
    """The step the attempt started from: its resume step; 0 for a fresh start; None when unknown."""
    if record.resume_step is not None:
        return record.resume_step
    if record.fresh and record.resume_path is None:
        return 0
    return None


def durable_end(record: AttemptRecord, next_record: AttemptRecord | None) -> int | None:
    """The durable step when ``record`` ended: where ``next_record`` really resumed from when that is
    known (the truth), else the attempt's newest good save, else where it started."""
    if next_record is not None:
        resumed = start_step(next_record)
        if resumed is not None:
            return resumed
    if record.last_durable_step is not None:
        return record.last_durable_step
    return start_step(record)


def durable_progress(record: AttemptRecord, next_record: AttemptRecord | None) -> int | None:
    """Steps the durable frontier moved during ``record`` (negative: the run fell back, e.g. its
    newest checkpoint was torn); None when either end is unknown."""
    end, start = durable_end(record, next_record), start_step(record)
    return None if end is None or start is None else end - start


def progress_by_attempt(records: Sequence[AttemptRecord]) -> list[int | None]:
    """:func:`durable_progress` of each record, the next record taken from the list."""
    return [durable_progress(r, records[i + 1] if i + 1 < len(records) else None) for i, r in enumerate(records)]


def made_progress(progress: int | None, min_progress: int = 1) -> bool:
    """Did an attempt with this durable progress move the run forward? Unknown is no."""
    return progress is not None and progress >= max(min_progress, 1)


def restarts_from_scratch(records: Sequence[AttemptRecord]) -> list[tuple[AttemptRecord, int, int]]:
    """Attempts that started from step 0 although an earlier attempt had saved a checkpoint: the only
    copy was torn, quarantined or removed, and every step up to it is done again. Each item is
    (the attempt, the newest step saved before it, the attempt that saved it). A child that reported
    a first step at or past that save resumed by itself and is not listed."""
    out: list[tuple[AttemptRecord, int, int]] = []
    best: tuple[int, int] | None = None  # (step, attempt) of the newest save so far
    for r in records:
        redone = best is not None and best[0] > 0 and start_step(r) == 0
        if best is not None and redone and (r.first_step is None or r.first_step < best[0]):
            out.append((r, best[0], best[1]))
        for saved in (r.last_durable_step, r.saved_elsewhere_step):  # a save outside the directory counts too
            if saved is not None and (best is None or saved > best[0]):
                best = (saved, r.attempt)
    return out


# ---------------------------------------------------------------------------------------------
# Tolerant field readers: the log may come from another version or be hand-edited








# ---------------------------------------------------------------------------------------------
# The fold


@dataclass
class _Fold:
    """Mutable accumulator for one attempt while the events are folded."""

    attempt: int
    started: bool = False
    job_id: str | None = None
    restart_count: int | None = None
    nodes: tuple[str, ...] = ()
    resume_path: str | None = None
    resume_step: int | None = None
    resume_told: bool = False  # an attempt_start or resume_point said where it resumes from
    start: float | None = None
    last_ts: float | None = None
    reported_first: int | None = None  # ``resumed`` event
    first_seen: int | None = None
    max_seen: int | None = None
    sources: set[str] = field(default_factory=set)
    durable_step: int | None = None
    durable_ts: float | None = None
    end: float | None = None
    end_fields: dict[str, Any] = field(default_factory=dict)
    cls: FailureClass | None = None
    action: Action | None = None
    decided: Action | None = None
    failure_seen: bool = False
    evidence: tuple[str, ...] = ()
    exit_code: int | None = None
    signal: int | None = None
    failure_step: int | None = None
    failure_node: str | None = None
    failure_reason: str | None = None
    elsewhere: tuple[str | None, int] | None = None  # (path, step) of the newest save named outside the dir

    def see(self, step: int | None, ts: float | None = None) -> None:
        if ts is not None:
            self.last_ts = ts if self.last_ts is None else max(self.last_ts, ts)
        if step is None:
            return
        if self.first_seen is None:
            self.first_seen = step
        self.max_seen = step if self.max_seen is None else max(self.max_seen, step)

    def resume(self, fields: Mapping[str, Any], path_key: str, step_key: str) -> None:
        if path_key in fields or step_key in fields:
            self.resume_told = True
            self.resume_path = as_str(fields.get(path_key))
            self.resume_step = as_int(fields.get(step_key))

    def record(self) -> AttemptRecord:
        """The record without the numbers that need the next attempt (see :func:`_settle`)."""
        e = self.end_fields
        first = as_int(e.get("first_step"))
        if first is None:
            first = self.reported_first if self.reported_first is not None else self.first_seen
        reached = [s for s in (as_int(e.get("last_step")), self.max_seen) if s is not None]
        last = max(reached) if reached else None
        resume_step = self.resume_step if self.resume_step is not None else as_int(e.get("resume_step"))
        resume_path = self.resume_path or as_str(e.get("resume_path"))
        saved = [s for s in (as_int(e.get("last_durable_step")), self.durable_step) if s is not None]
        durable = max(saved) if saved else resume_step
        source = as_str(e.get("step_source"))
        if source is None and self.sources:
            source = "client" if "client" in self.sources else min(self.sources)
        wall = as_float(e.get("wall_lost"))
        if self.cls == FC.COMPLETED:
            wall = 0.0
        return AttemptRecord(
            attempt=self.attempt, job_id=self.job_id, restart_count=self.restart_count, nodes=self.nodes,
            resume_path=resume_path, resume_step=resume_step, first_step=first, last_step=last,
            last_durable_step=durable, cls=self.cls, action=self.decided or self.action,
            evidence=self.evidence, exit_code=self.exit_code, signal=self.signal, start=self.start,
            end=self.end, steps_lost=as_int(e.get("steps_lost")), wall_lost=wall, failure_step=self.failure_step,
            fresh=self.started and resume_path is None and resume_step is None,
            step_source=source, failure_node=self.failure_node, failure_reason=self.failure_reason,
            saved_elsewhere=self.elsewhere[0] if self.elsewhere else None,
            saved_elsewhere_step=self.elsewhere[1] if self.elsewhere else None)

    def wall_since_durable(self, stop: float | None) -> float | None:
        since = self.durable_ts if self.durable_ts is not None else self.start
        return max(stop - since, 0.0) if stop is not None and since is not None else None


def _settle(record: AttemptRecord, fold: _Fold, next_record: AttemptRecord | None) -> AttemptRecord:
    """Steps and wall time lost, now that the next attempt's resume point is known."""
    if record.cls == FC.COMPLETED:
        return replace(record, steps_lost=0, steps_lost_at_least=False, wall_lost=0.0)
    if next_record is None and record.cls is None:
        return record  # still running (or its supervisor was killed): nothing is lost yet
    lost = steps_lost(record.last_step, durable_end(record, next_record))
    if lost is None:
        lost = record.steps_lost  # the run loop's own number, when the ledger cannot tell
    wall = record.wall_lost
    if wall is None:
        # Without an attempt_end (a killed supervisor) the last event seen bounds the attempt.
        wall = fold.wall_since_durable(fold.end if fold.end is not None else fold.last_ts)
    at_least = lost is not None and record.step_source == "regex"
    return replace(record, steps_lost=lost, steps_lost_at_least=at_least, wall_lost=wall)


class Ledger:
    """The log as a projection: :meth:`apply` each event as it is written (or read back), and
    :meth:`records` gives the ledger at once, the log never read again. The run loop keeps one in
    memory (``RunContext.emit``); :func:`ledger_from_events` folds a whole log through one.

    Besides the attempts it keeps the events about saves (``save_end``, ``save_elsewhere``): the
    resume-point chooser, the single-copy warning and the durable-history audit read those, and a
    long run's log is mostly ``progress``.
    """

    def __init__(self) -> None:
        self._folds: dict[int, _Fold] = {}
        self._told: dict[int, Mapping[str, Any]] = {}  # resume_point fields of attempts not started yet
        self._current: _Fold | None = None
        self.saves: list[Event] = []  # save_end and save_elsewhere events, in log order
        self.events = 0  # how many events were applied

    @classmethod
    def of(cls, events: Iterable[Event]) -> "Ledger":
        ledger = cls()
        for ev in events:
            ledger.apply(ev)
        return ledger

    @property
    def last_attempt(self) -> int:
        """The highest attempt number the log has started (0: none)."""
        return max((n for n, f in self._folds.items() if f.started), default=0)

    def _fold_for(self, attempt: int | None) -> _Fold | None:
        if attempt is None:
            return self._current
        if attempt not in self._folds:
            self._folds[attempt] = _Fold(attempt)
            if attempt in self._told:
                self._folds[attempt].resume(self._told[attempt], "path", "step")
        if self._current is None or attempt >= self._current.attempt:
            self._current = self._folds[attempt]
        return self._folds[attempt]

    def apply(self, ev: Event) -> None:
        """Fold one event (file order) into the attempts it concerns, through its typed record
        (supervisor/event_records.py)."""
        self.events += 1
        rec = record_of(ev)
        if rec is None:
            return
        if isinstance(rec, (SaveEnded, SavedElsewhere)):
            self.saves.append(ev)
        if isinstance(rec, ResumePointTold):
            self._told_resume(rec)
        elif isinstance(rec, AttemptStarted):
            self._start(rec)
        else:
            f = self._fold_for(rec.attempt)
            if f is not None:
                self._fold(f, rec)

    def _told_resume(self, rec: ResumePointTold) -> None:
        number = rec.attempt
        if number is not None and number in self._folds:
            if not self._folds[number].resume_told:
                self._folds[number].resume(rec.fields, "path", "step")
        elif number is not None:
            self._told[number] = rec.fields

    def _start(self, rec: AttemptStarted) -> None:
        number = rec.attempt if rec.attempt is not None else max(self._folds, default=0) + 1
        f = self._folds.setdefault(number, _Fold(number))
        self._current = f
        f.started, f.start = True, rec.ts
        f.see(None, rec.ts)
        f.job_id, f.restart_count, f.nodes = rec.job_id, rec.restart_count, rec.nodes
        if rec.resume is not None:
            f.resume(rec.resume, "resume_path", "resume_step")
        elif number in self._told and not f.resume_told:
            f.resume(self._told[number], "path", "step")

    @staticmethod
    def _fold(f: _Fold, rec: FoldedRecord) -> None:
        if isinstance(rec, ProgressSeen):
            f.see(rec.step, rec.ts)
            if rec.source:
                f.sources.add(rec.source)
        elif isinstance(rec, ResumedAt):
            if f.reported_first is None and rec.step is not None:
                f.reported_first = rec.step
            f.see(rec.step, rec.ts)
        elif isinstance(rec, SaveEnded):
            if rec.ok and rec.step is not None:
                if f.durable_step is None or rec.step >= f.durable_step:
                    f.durable_step, f.durable_ts = rec.step, rec.ts
                f.see(rec.step, rec.ts)
        elif isinstance(rec, AttemptEnded):
            f.end = rec.ts
            f.end_fields = dict(rec.fields)
            f.cls = rec.cls or f.cls
            f.action = rec.action or f.action
            if rec.exit_code is not None:
                f.exit_code = rec.exit_code
            if rec.signal is not None:
                f.signal = rec.signal
            f.see(rec.last_step, rec.ts)
        elif isinstance(rec, FailureSeen):
            f.cls = f.cls or rec.cls
            f.action = f.action or rec.action
            if not f.failure_seen:  # the first failure: later ones are its consequences
                f.failure_seen = True
                f.evidence = rec.evidence
                f.failure_step = rec.step
                f.failure_node = rec.node
                f.failure_reason = rec.reason
            if f.exit_code is None:
                f.exit_code = rec.exit_code
            if f.signal is None:
                f.signal = rec.signal
            if rec.node and not f.nodes:
                f.nodes = (rec.node,)
        elif isinstance(rec, Decided):
            f.decided = rec.action or f.decided
        elif isinstance(rec, SavedElsewhere):
            if rec.step is not None and (f.elsewhere is None or rec.step >= f.elsewhere[1]):
                f.elsewhere = (rec.path, rec.step)

    def records(self) -> list[AttemptRecord]:
        """One record per attempt, in attempt order (see :func:`ledger_from_events`)."""
        ordered = [self._folds[n] for n in sorted(self._folds)]
        base = [f.record() for f in ordered]
        return [_settle(r, f, base[i + 1] if i + 1 < len(base) else None)
                for i, (r, f) in enumerate(zip(base, ordered))]


def ledger_from_events(events: Iterable[Event]) -> list[AttemptRecord]:
    """Fold the event log (file order) into one record per attempt, in attempt order.

    Tolerant of gaps: an event naming an attempt that never started creates it; an event without an
    ``attempt`` field belongs to the attempt in progress (a save found by the final rescan after
    ``attempt_end`` still counts for that attempt); an attempt with no ``attempt_end`` is reported
    with ``cls`` None (``status`` "incomplete"). A ``resume_point`` alone creates no attempt.
    """
    return Ledger.of(events).records()


def newest_save(events: Iterable[Event]) -> tuple[str | None, int, int | None] | None:
    """(path, step, attempt) of the newest save with a known step the log records: a ``save_end``
    that ended ok, or a ``save_elsewhere`` the output named."""
    best: tuple[str | None, int, int | None] | None = None
    for ev in events:
        if ev.event == Ev.SAVE_END.value and ev.get("ok") is False:
            continue
        if ev.event not in (Ev.SAVE_END.value, Ev.SAVE_ELSEWHERE.value):
            continue
        step = as_int(ev.get("step"))
        if step is not None and (best is None or step >= best[1]):
            best = (as_str(ev.get("path")), step, as_int(ev.get("attempt")))
    return best


def final_run_end(events: Sequence[Event]) -> Event | None:
    """The ``run_end`` that ended the run: the last one, unless a run or an attempt started after it
    (a requeue's ``run_end`` does not end a run that went on)."""
    for ev in reversed(events):
        if ev.event == Ev.RUN_END.value:
            return ev
        if ev.event in (Ev.RUN_START.value, Ev.ATTEMPT_START.value):
            return None
    return None


def records_to_json(records: Iterable[AttemptRecord]) -> list[dict[str, Any]]:
    """Plain data for ``--json`` output (``class`` for the class, enums as strings)."""
    out = []
    for r in records:
        out.append({
            "attempt": r.attempt, "job_id": r.job_id, "restart_count": r.restart_count, "nodes": list(r.nodes),
            "resume_path": r.resume_path, "resume_step": r.resume_step, "first_step": r.first_step,
            "last_step": r.last_step, "last_durable_step": r.last_durable_step, "steps_lost": r.steps_lost,
            "steps_lost_at_least": r.steps_lost_at_least, "wall_lost": r.wall_lost,
            "class": r.cls.value if r.cls else None, "status": r.status,
            "action": r.action.value if r.action else None, "evidence": list(r.evidence),
            "exit_code": r.exit_code, "signal": r.signal, "start": r.start, "end": r.end,
            "failure_step": r.failure_step, "step_source": r.step_source,
            "saved_elsewhere": r.saved_elsewhere, "saved_elsewhere_step": r.saved_elsewhere_step,
        })
    return out


# ---------------------------------------------------------------------------------------------
# Results that need a check


@dataclass(frozen=True)
class LossAnomaly:
    """A ``loss_anomaly`` event: a non-finite loss or a spike."""

    attempt: int | None
    step: int | None
    kind: str  # nan | inf | spike
    loss: float | None = None


def loss_anomalies(events: Iterable[Event]) -> list[LossAnomaly]:
    """The ``loss_anomaly`` events of the log, in order."""
    return [LossAnomaly(as_int(ev.get("attempt")), as_int(ev.get("step")), as_str(ev.get("kind")) or "anomaly",
                        as_float(ev.get("loss")))
            for ev in events if ev.event == Ev.LOSS_ANOMALY.value]


@dataclass(frozen=True)
class SuspectEvent:
    """One failure or loss anomaly that puts the training's numbers in doubt."""

    attempt: int | None
    what: str  # a failure class value, or "loss_anomaly (nan)"
    step: int | None
    evidence: str | None = None


@dataclass(frozen=True)
class ResultsCheck:
    """The run had failures that can corrupt results silently: a person should check them.

    ``crash_free_steps``: steps reached since the newest of them (None when its step is unknown);
    ``settled``: at least ``crash_free_needed`` of them, the stretch after which a fix is believed.
    """

    events: tuple[SuspectEvent, ...]
    crash_free_steps: int | None
    crash_free_needed: int
    settled: bool
    reason: str


def results_check(records: Sequence[AttemptRecord], anomalies: Sequence[LossAnomaly],
                  crash_free_needed: int) -> ResultsCheck | None:
    """None when no attempt ended in an illegal memory access, a device-side error (device assert,
    launch failure), a hardware fault (ECC, Xid) and no loss anomaly was logged; else the list,
    with the crash-free steps since the newest one."""
    found: list[tuple[int, SuspectEvent]] = []
    for i, r in enumerate(records):
        if r.cls is not None and r.cls in RESULTS_CHECK_CLASSES:
            step = r.failure_step if r.failure_step is not None else r.last_step
            found.append((i, SuspectEvent(r.attempt, r.cls.value, step, r.evidence[0] if r.evidence else None)))
    index = {r.attempt: i for i, r in enumerate(records)}
    for a in anomalies:
        position = index.get(a.attempt, len(records)) if a.attempt is not None else len(records)
        loss = f", loss {a.loss:g}" if a.loss is not None else ""
        found.append((position, SuspectEvent(a.attempt, f"loss_anomaly ({a.kind}{loss})", a.step)))
    if not found:
        return None
    found.sort(key=lambda item: (item[0], item[1].step if item[1].step is not None else -1))
    suspects = tuple(s for _, s in found)
    newest = suspects[-1]
    reached = max((r.last_step for r in records if r.last_step is not None), default=None)
    free = max(reached - newest.step, 0) if reached is not None and newest.step is not None else None
    settled = free is not None and free >= crash_free_needed
    listed = "; ".join(_grouped(suspects))
    since = "an unknown number of" if free is None else str(free)
    verdict = ("a fix is believed after that long" if settled else
               "a memory error can corrupt weights or gradients silently before it crashes")
    reason = (f"results need a check: {listed}; {since} crash-free steps since the last one "
              f"({crash_free_needed} needed: {verdict})")
    return ResultsCheck(suspects, free, crash_free_needed, settled, reason)


def _grouped(suspects: Sequence[SuspectEvent], shown: int = 6) -> list[str]:
    """``illegal_memory_access at steps 120, 240 (attempts 1, 2)``: one phrase per kind, in order."""
    kinds: dict[str, list[SuspectEvent]] = {}
    for s in suspects:
        kinds.setdefault(s.what, []).append(s)
    out = []
    for what, items in kinds.items():
        steps = [str(s.step) if s.step is not None else "?" for s in items]
        attempts = list(dict.fromkeys(str(s.attempt) for s in items if s.attempt is not None))
        more = f" and {len(steps) - shown} more" if len(steps) > shown else ""
        where = f"step{'s' if len(steps) > 1 else ''} {', '.join(steps[:shown])}{more}"
        who = f" (attempt{'s' if len(attempts) > 1 else ''} {', '.join(attempts[:shown])}" \
              f"{'…' if len(attempts) > shown else ''})" if attempts else ""
        out.append(f"{what} at {where}{who}")
    return out
