"""The step-budget audit (DESIGN.md §8): a per-attempt ledger folded from the event log, the
continue/stop verdict over it, and the resume audit. Pure: events and numbers in, frozen records and
verdicts with a ``reason`` out. Unknown numbers stay ``None``; no step is ever guessed.

Definitions:

* **durable step** of an attempt: the step of its last successful ``save_end``; else its resume
  step; else 0 when the attempt is known to have started fresh (an ``attempt_start`` with no resume
  path), since a restart then starts from nothing; else unknown.
* **steps lost** = last step seen − durable step (never below 0; unknown when the attempt reported
  no step or the durable step is unknown; 0 for a completed attempt).
* **wall lost** = seconds from the last durable save (or the attempt's start) to the attempt's end.
* **allocation**: attempts that share a Slurm job id *and* restart count (a requeue keeps the job id
  and bumps ``SLURM_RESTART_COUNT``, so each requeue is a new allocation).
* **crash**: an attempt that ended in a failure the run is answerable for: any class except
  ``completed``, ``preempted``, ``time_limit`` and ``cancelled`` (the scheduler's or a person's doing).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from .config import BudgetConfig
from .events import Ev, Event
from .states import Action, FailureClass

__all__ = [
    "AttemptRecord", "BudgetVerdict", "ResumeAudit", "audit_resume", "is_crash", "judge",
    "ledger_from_events", "steps_lost",
]

NOT_CRASHES = frozenset({FailureClass.COMPLETED, FailureClass.PREEMPTED, FailureClass.TIME_LIMIT,
                         FailureClass.CANCELLED})
# Fewer losses than this are no pattern: the per-class retry limits judge them, not the fraction.
MIN_LOSSES_FOR_FRACTION = 3


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
    last_durable_step: int | None = None
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

    @property
    def status(self) -> str:
        """The end class, or ``incomplete`` when the log has no end for this attempt."""
        return self.cls.value if self.cls is not None else "incomplete"

    @property
    def allocation(self) -> tuple[str | None, int]:
        return (self.job_id, self.restart_count or 0)


@dataclass(frozen=True)
class BudgetVerdict:
    """May the run go on? ``budget`` names the exhausted budget (a ``BudgetConfig`` field)."""

    ok: bool
    budget: str | None
    reason: str
    numbers: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ResumeAudit:
    """Did the child start where it was told to resume?"""

    ok: bool
    reason: str


# ---------------------------------------------------------------------------------------------
# Ledger


def steps_lost(last_step: int | None, durable_step: int | None) -> int | None:
    """Last step seen minus the last durable step; None when either is unknown."""
    if last_step is None or durable_step is None:
        return None
    return max(last_step - durable_step, 0)


def is_crash(cls: FailureClass | None) -> bool:
    return cls is not None and cls not in NOT_CRASHES


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    return None


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _signal(value: Any) -> int | None:
    """``attempt_end`` writes the signal's name (``SIGSEGV``); older or other writers the number."""
    number = _int(value)
    if number is not None:
        return abs(number)
    if isinstance(value, str) and value:
        from .signals import parse_signal

        try:
            return parse_signal(value)
        except ValueError:
            return None
    return None


def _enum(kind: type, value: Any) -> Any:
    try:
        return kind(value) if value is not None else None
    except ValueError:
        return None


def _nodes(value: Any) -> tuple[str, ...]:
    if isinstance(value, str) and value:
        return (value,)
    if isinstance(value, (list, tuple)):
        return tuple(str(v) for v in value if v)
    return ()


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
    start: float | None = None
    reported_first: int | None = None  # ``resumed`` event
    first_seen: int | None = None
    max_seen: int | None = None
    durable_step: int | None = None
    durable_ts: float | None = None
    end: float | None = None
    end_fields: dict[str, Any] = field(default_factory=dict)
    cls: FailureClass | None = None
    action: Action | None = None
    decided: Action | None = None
    evidence: tuple[str, ...] = ()
    exit_code: int | None = None
    signal: int | None = None
    failure_step: int | None = None

    def see(self, step: int | None) -> None:
        if step is None:
            return
        if self.first_seen is None:
            self.first_seen = step
        self.max_seen = step if self.max_seen is None else max(self.max_seen, step)

    def record(self, is_last: bool) -> AttemptRecord:
        e = self.end_fields
        first = _int(e.get("first_step"))
        if first is None:
            first = self.reported_first if self.reported_first is not None else self.first_seen
        last = _int(e.get("last_step"))
        if last is None:
            last = self.max_seen
        elif self.max_seen is not None:
            last = max(last, self.max_seen)
        resume_step = self.resume_step if self.resume_step is not None else _int(e.get("resume_step"))
        resume_path = self.resume_path or (e.get("resume_path") or None)
        durable = _int(e.get("last_durable_step"))
        if durable is None:
            durable = self.durable_step if self.durable_step is not None else resume_step
        fresh = self.started and not resume_path and resume_step is None
        lost = _int(e.get("steps_lost"))
        if self.cls == FailureClass.COMPLETED:
            lost = 0
        elif lost is None and not (is_last and self.cls is None):  # a live attempt has lost nothing yet
            lost = steps_lost(last, durable if durable is not None else (0 if fresh else None))
        wall = _float(e.get("wall_lost"))
        if self.cls == FailureClass.COMPLETED:
            wall = 0.0
        elif wall is None and self.end is not None:
            since = self.durable_ts if self.durable_ts is not None else self.start
            wall = max(self.end - since, 0.0) if since is not None else None
        return AttemptRecord(
            attempt=self.attempt, job_id=self.job_id, restart_count=self.restart_count, nodes=self.nodes,
            resume_path=resume_path, resume_step=resume_step, first_step=first, last_step=last,
            last_durable_step=durable, cls=self.cls, action=self.decided or self.action,
            evidence=self.evidence, exit_code=self.exit_code, signal=self.signal, start=self.start,
            end=self.end, steps_lost=lost, wall_lost=wall, failure_step=self.failure_step)


def ledger_from_events(events: Sequence[Event]) -> list[AttemptRecord]:
    """Fold the event log into one record per attempt, in attempt order.

    Tolerant of gaps: an event naming an attempt that never started creates it; an event without an
    ``attempt`` field belongs to the attempt in progress; an attempt with no ``attempt_end`` is
    reported with ``cls`` None (``status`` "incomplete").
    """
    folds: dict[int, _Fold] = {}
    current: _Fold | None = None

    def fold_for(ev: Event) -> _Fold | None:
        nonlocal current
        number = _int(ev.get("attempt"))
        if number is None:
            return current
        if number not in folds:
            folds[number] = _Fold(number)
        current = folds[number] if current is None or number >= current.attempt else current
        return folds[number]

    for ev in events:
        name = ev.event
        if name == Ev.ATTEMPT_START.value:
            number = _int(ev.get("attempt"))
            if number is None:
                number = max(folds, default=0) + 1
            f = folds.setdefault(number, _Fold(number))
            current = f
            f.started, f.start = True, ev.ts
            f.job_id = None if ev.get("job_id") in (None, "") else str(ev.get("job_id"))
            f.restart_count = _int(ev.get("restart_count"))
            f.nodes = _nodes(ev.get("nodes")) or _nodes(ev.get("host"))
            f.resume_path = ev.get("resume_path") or None
            f.resume_step = _int(ev.get("resume_step"))
            continue
        if name not in _FOLDED:
            continue
        f = fold_for(ev)
        if f is None:
            continue
        if name == Ev.PROGRESS.value:
            f.see(_int(ev.get("step")))
        elif name == Ev.RESUMED.value:
            step = _int(ev.get("step"))
            if f.reported_first is None and step is not None:
                f.reported_first = step
            f.see(step)
        elif name == Ev.SAVE_END.value:
            step = _int(ev.get("step"))
            if ev.get("ok") is not False and step is not None:
                f.durable_step, f.durable_ts = step, ev.ts
                f.see(step)
        elif name == Ev.ATTEMPT_END.value:
            f.end = ev.ts
            f.end_fields = dict(ev.fields)
            f.cls = _enum(FailureClass, ev.get("class")) or f.cls
            f.action = _enum(Action, ev.get("action")) or f.action
            f.exit_code = _int(ev.get("exit_code")) if ev.get("exit_code") is not None else f.exit_code
            f.signal = _signal(ev.get("signal")) if ev.get("signal") is not None else f.signal
            f.see(_int(ev.get("last_step")))
        elif name == Ev.FAILURE.value:
            f.cls = f.cls or _enum(FailureClass, ev.get("class"))
            f.action = f.action or _enum(Action, ev.get("action"))
            evidence = ev.get("evidence")
            if isinstance(evidence, (list, tuple)):
                f.evidence = tuple(str(x) for x in evidence)
            elif isinstance(evidence, str):
                f.evidence = (evidence,)
            f.failure_step = _int(ev.get("step"))
            if f.exit_code is None:
                f.exit_code = _int(ev.get("exit_code"))
            if f.signal is None:
                f.signal = _signal(ev.get("signal"))
            if ev.get("node") and not f.nodes:
                f.nodes = (str(ev.get("node")),)
        elif name == Ev.DECISION.value:
            f.decided = _enum(Action, ev.get("action")) or f.decided

    ordered = [folds[n] for n in sorted(folds)]
    return [f.record(is_last=(i == len(ordered) - 1)) for i, f in enumerate(ordered)]


_FOLDED = frozenset(e.value for e in (Ev.PROGRESS, Ev.RESUMED, Ev.SAVE_END, Ev.ATTEMPT_END, Ev.FAILURE,
                                      Ev.DECISION))


# ---------------------------------------------------------------------------------------------
# Verdict


def _current_allocation(records: Sequence[AttemptRecord], job_id: str | None) -> list[AttemptRecord]:
    """The attempts of the allocation now running: ``job_id`` at its newest restart count."""
    mine = [r for r in records if r.job_id == job_id] if job_id is not None else []
    if not mine:
        if not records:
            return []
        key = records[-1].allocation
        mine = []
        for r in reversed(records):
            if r.allocation != key:
                break
            mine.append(r)
        return list(reversed(mine))
    newest = mine[-1].restart_count or 0
    return [r for r in mine if (r.restart_count or 0) == newest]


def _restarts(records: Sequence[AttemptRecord], everything: Sequence[AttemptRecord]) -> int:
    """Crashes that led (or lead now) to a restart. A trailing attempt with no end is still running."""
    last = everything[-1] if everything else None
    return sum(1 for r in records if is_crash(r.cls) or (r.cls is None and r is not last))


def _progress_of(record: AttemptRecord, steps_known: bool) -> int | None:
    """Steps one attempt advanced from where it started; 0 for a silent attempt in a run that reports steps."""
    start = record.resume_step if record.resume_step is not None else record.first_step
    if record.last_step is not None and start is not None:
        return max(record.last_step - start, 0)
    if record.last_step is None and steps_known:
        return 0
    return None


def judge(records: Sequence[AttemptRecord], budget: BudgetConfig, allocation_job_id: str | None) -> BudgetVerdict:
    """Is the run still within its budgets? ``records``: the whole ledger, the attempt that just ended
    included. The first exhausted budget is named, the most specific diagnosis first: restarts per
    allocation, total restarts, the same failure at the same step, too little progress between two
    crashes, total steps lost, steps lost as a fraction of progress (judged only once
    ``MIN_LOSSES_FOR_FRACTION`` attempts lost steps: one crash before the first checkpoint loses all
    progress so far, which is the class retry limit's business, not a pattern)."""
    records = list(records)
    if not records:
        return BudgetVerdict(True, None, "no attempts yet", {"attempts": 0})
    alloc = _current_allocation(records, allocation_job_id)
    in_alloc = _restarts(alloc, records)
    total = _restarts(records, records)
    lost_values = [r.steps_lost for r in records if r.steps_lost is not None]
    total_lost = sum(lost_values)
    losses = sum(1 for v in lost_values if v > 0)
    steps_known = any(r.last_step is not None for r in records)
    progress = max((r.last_step for r in records if r.last_step is not None), default=None)
    fraction = round(total_lost / progress, 4) if progress else None
    last = records[-1]
    prev = records[-2] if len(records) > 1 else None
    last_progress = _progress_of(last, steps_known)
    step_key = last.failure_step if last.failure_step is not None else last.last_step
    same = 0
    if is_crash(last.cls) and step_key is not None:
        same = sum(1 for r in records if r.cls == last.cls
                   and (r.failure_step if r.failure_step is not None else r.last_step) == step_key)
    numbers: dict[str, Any] = {
        "attempts": len(records), "allocation": allocation_job_id if allocation_job_id is not None else last.job_id,
        "restarts_in_allocation": in_alloc, "total_restarts": total, "total_steps_lost": total_lost,
        "progress": progress, "steps_lost_fraction": fraction, "last_attempt_progress": last_progress,
        "same_failure_count": same, "same_failure_step": step_key if same else None,
    }

    def stop(name: str, reason: str) -> BudgetVerdict:
        return BudgetVerdict(False, name, reason, numbers)

    b = budget
    if b.max_restarts_per_allocation is not None and in_alloc > b.max_restarts_per_allocation:
        return stop("max_restarts_per_allocation",
                    f"{in_alloc} crashes in allocation {numbers['allocation']}; at most "
                    f"{b.max_restarts_per_allocation} restarts per allocation")
    if b.max_total_restarts is not None and total > b.max_total_restarts:
        return stop("max_total_restarts", f"{total} crashes across the run; at most {b.max_total_restarts} restarts")
    if b.same_failure_limit is not None and same >= b.same_failure_limit:
        return stop("same_failure_limit",
                    f"crash loop: {last.cls.value if last.cls else '?'} at step {step_key} {same} times; limit "
                    f"{b.same_failure_limit}")
    if (b.min_progress_between_crashes is not None and prev is not None and is_crash(last.cls)
            and is_crash(prev.cls) and last_progress is not None and last_progress < b.min_progress_between_crashes):
        return stop("min_progress_between_crashes",
                    f"crash loop: attempt {last.attempt} advanced {last_progress} steps between two crashes "
                    f"({prev.cls.value if prev.cls else '?'} then {last.cls.value if last.cls else '?'}); "
                    f"at least {b.min_progress_between_crashes} required")
    if b.max_steps_lost is not None and total_lost > b.max_steps_lost:
        return stop("max_steps_lost", f"{total_lost} steps lost across the run; at most {b.max_steps_lost}")
    if (b.max_steps_lost_fraction is not None and fraction is not None and losses >= MIN_LOSSES_FOR_FRACTION
            and fraction > b.max_steps_lost_fraction):
        return stop("max_steps_lost_fraction",
                    f"{total_lost} steps lost for {progress} steps of progress ({fraction:.0%}); at most "
                    f"{b.max_steps_lost_fraction:.0%}")
    parts = [f"{in_alloc} restarts in this allocation" + _of(b.max_restarts_per_allocation),
             f"{total} in total" + _of(b.max_total_restarts),
             f"{total_lost} steps lost" + _of(b.max_steps_lost)]
    if fraction is not None:
        parts.append(f"{fraction:.0%} of progress" + _of(b.max_steps_lost_fraction, percent=True))
    return BudgetVerdict(True, None, "within budget: " + ", ".join(parts), numbers)


def _of(limit: float | int | None, percent: bool = False) -> str:
    if limit is None:
        return ""
    return f" (max {limit:.0%})" if percent else f" (max {limit})"


# ---------------------------------------------------------------------------------------------
# Resume audit


def audit_resume(expected_step: int | None, reported_first_step: int | None, resume_path: Any) -> ResumeAudit:
    """Does the first step the child reports match the resume point?

    A resumed loop reports either the step it resumed at or the next one to run (``expected`` or
    ``expected + 1``), so both pass. Anything else while a resume point exists is flagged: a child
    that starts at 0 silently threw the checkpoint away. Without a resume point any start is fine;
    when either step is unknown the audit cannot judge (ok, reason starting with "unknown").
    """
    path = str(resume_path) if resume_path else None
    if path is None and expected_step is None:
        return ResumeAudit(True, "fresh start: no resume point, any first step is fine")
    if reported_first_step is None:
        return ResumeAudit(True, "unknown: the child reported no step yet")
    if expected_step is None:
        return ResumeAudit(True, f"unknown: the step of the resume point {path} is not known")
    if reported_first_step in (expected_step, expected_step + 1):
        return ResumeAudit(True, f"resumed at step {reported_first_step} as expected (resume point step "
                                 f"{expected_step})")
    where = f" ({path})" if path else ""
    if reported_first_step < expected_step:
        what = "from scratch" if reported_first_step <= 1 else f"at step {reported_first_step}"
        return ResumeAudit(False, f"child started {what} but the resume point is step {expected_step}{where}: "
                                  f"the checkpoint was not loaded, {expected_step - reported_first_step} steps "
                                  f"would be redone")
    return ResumeAudit(False, f"child started at step {reported_first_step}, past the resume point step "
                              f"{expected_step}{where}: it resumed from something else")


def records_to_json(records: Iterable[AttemptRecord]) -> list[dict[str, Any]]:
    """Plain data for ``--json`` output and reports (``class`` for the class, enums as strings)."""
    out = []
    for r in records:
        out.append({
            "attempt": r.attempt, "job_id": r.job_id, "restart_count": r.restart_count, "nodes": list(r.nodes),
            "resume_path": r.resume_path, "resume_step": r.resume_step, "first_step": r.first_step,
            "last_step": r.last_step, "last_durable_step": r.last_durable_step, "steps_lost": r.steps_lost,
            "wall_lost": r.wall_lost, "class": r.cls.value if r.cls else None, "status": r.status,
            "action": r.action.value if r.action else None, "evidence": list(r.evidence),
            "exit_code": r.exit_code, "signal": r.signal, "start": r.start, "end": r.end,
            "failure_step": r.failure_step,
        })
    return out


@dataclass(frozen=True)
class DurableHistoryAudit:
    """Does the chosen resume point agree with the saves the event log says landed?"""

    ok: bool
    reason: str
    expected_step: int | None = None


def audit_durable_history(saved: Sequence[tuple[int, str, bool]], resume_step: int | None,
                          resume_path: str | None) -> DurableHistoryAudit:
    """``saved``: (step, path, still on disk) of every save into the checkpoint directory that ended
    ok, from the event log.

    A run that saved step S and now finds none of its recorded checkpoints and nothing to resume
    from would restart from step 0 and look healthy while it silently repeats everything: refused.
    Resuming from an older step than S is allowed (the newest file may have been torn and
    quarantined), and said. Recorded files that are still there but are not checkpoints the scanner
    recognises (a custom format) never trigger the refusal.
    """
    if not saved:
        return DurableHistoryAudit(True, "no save recorded yet")
    newest_step, newest_path, _ = max(saved, key=lambda item: item[0])
    if resume_step is None and resume_path is None:
        if any(present for _, _, present in saved):
            return DurableHistoryAudit(True, "recorded saves are still on disk (not a recognised checkpoint "
                                       "format); starting as the training script decides", newest_step)
        return DurableHistoryAudit(
            False,
            f"the event log records {len(saved)} completed save(s) up to step {newest_step} "
            f"({newest_path}), but none of them is on disk and nothing is left to resume from: the "
            "checkpoint directory vanished, was emptied or now points elsewhere; not restarting from "
            "scratch", newest_step)
    if resume_step is not None and resume_step < newest_step:
        return DurableHistoryAudit(
            True, f"resuming at step {resume_step}, older than the newest recorded save (step "
            f"{newest_step}, {newest_path}): that one is gone or was quarantined", newest_step)
    return DurableHistoryAudit(True, f"resume point at step {resume_step} matches the saves recorded",
                               newest_step)
