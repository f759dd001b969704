"""The budgets: may the run go on? ``judge`` weighs the ledger (:mod:`supervisor.ledger`) against
``BudgetConfig``; ``run_verdict`` is the one verdict that ``supervise audit``, ``supervise report``
and the run's own exit share; the resume audits check where an attempt started. Pure: records and
numbers in, frozen verdicts with a ``reason`` out. Every budget that stops a run names itself (its
``BudgetConfig`` field) in the verdict; ``docs/policy.md`` lists them all.

The ledger's names are re-exported here: ``from supervisor.budget import AttemptRecord,
ledger_from_events`` keeps working.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .config import BudgetConfig
from .events import Event
from .ledger import (
    NOT_FAILURES,
    SCHEDULER_ENDS,
    AttemptRecord,
    durable_end,
    final_run_end,
    is_crash,
    ledger_from_events,
    made_progress,
    progress_by_attempt,
    records_to_json,
    restarts_from_scratch,
    start_step,
    steps_lost,
)
from .resumability import suggested_checkpoint_dir
from .states import RunOutcome

__all__ = [
    "AttemptRecord",
    "BudgetVerdict",
    "DurableHistoryAudit",
    "ResumeAudit",
    "RunVerdict",
    "audit_durable_history",
    "audit_resume",
    "audit_fresh_start",
    "is_crash",
    "judge",
    "ledger_from_events",
    "records_to_json",
    "run_verdict",
    "steps_lost",
    "stopped_by",
]

NOT_CRASHES = NOT_FAILURES  # the older name
# Fewer losses than this are no pattern: the per-class retry limits judge them, not the fraction.
MIN_LOSSES_FOR_FRACTION = 3


@dataclass(frozen=True)
class BudgetVerdict:
    """May the run go on? ``budget`` names the exhausted budget (a ``BudgetConfig`` field)."""

    ok: bool
    budget: str | None
    reason: str
    numbers: dict[str, Any] = field(default_factory=dict)

    @property
    def stop_reason(self) -> str:
        """The ``run_end`` reason of a run this verdict stops (``run_verdict`` reads it back)."""
        return f"budget {self.budget} exhausted: {self.reason}"


@dataclass(frozen=True)
class ResumeAudit:
    """Did the child start where it was told to resume?"""

    ok: bool
    reason: str


# ---------------------------------------------------------------------------------------------
# The budgets


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


def _requeues_without_progress(records: Sequence[AttemptRecord], progress: Sequence[int | None],
                               min_progress: int) -> int:
    """Scheduler ends (preemption, time limit) since the last attempt that made durable progress."""
    count = 0
    for r, p in zip(reversed(records), reversed(progress)):
        if made_progress(p, min_progress):
            break
        if r.cls in SCHEDULER_ENDS:
            count += 1
    return count


@dataclass(frozen=True)
class FailureRate:
    """The newest ``failures`` failures, the durable progress made from the first of them on (steps
    *kept*), and the steps those attempts *lost* (None when no attempt of them knows its loss)."""

    failures: int
    progress: int
    first_attempt: int
    last_attempt: int
    from_step: int
    to_step: int
    lost: int | None = None
    lost_at_least: bool = False

    @property
    def per_failure(self) -> float:
        return self.progress / self.failures


def _failure_rate(records: Sequence[AttemptRecord], window: int) -> FailureRate | None:
    """None until ``window`` failures happened, or when the steps around them are unknown."""
    if window < 1:
        return None
    crashes = [i for i, r in enumerate(records) if is_crash(r.cls)]
    if len(crashes) < window:
        return None
    first = records[crashes[-window]]
    start, end = start_step(first), durable_end(records[-1], None)
    if start is None or end is None:
        return None
    known = [r for r in records[crashes[-window]:] if r.steps_lost is not None]
    lost = sum(r.steps_lost or 0 for r in known) if known else None
    return FailureRate(window, end - start, first.attempt, records[-1].attempt, start, end, lost,
                       any(r.steps_lost_at_least for r in known))


def judge(records: Sequence[AttemptRecord], budget: BudgetConfig, allocation_job_id: str | None, *,
          final: bool = False) -> BudgetVerdict:
    """Is the run still within its budgets? ``records``: the whole ledger, the attempt that just
    ended included. The first exhausted budget is named, the most specific diagnosis first: restarts
    per allocation, total restarts, the same failure at the same step, too little progress between
    two crashes, a restart from scratch after a save, requeues without progress, the failure rate
    (absolute, then steps kept per step lost), total steps lost, steps lost as a fraction of
    progress (judged only once ``MIN_LOSSES_FOR_FRACTION`` crashes lost steps: one crash before the
    first checkpoint loses all progress so far, which is the class retry limit's business, not a
    pattern; requeues that lose everything are the requeue budget's).

    ``final``: the run has completed; judge what it cost as a whole. The fraction is then judged
    however few crashes lost it: the run is over, and one crash that cost most of it is the story.
    """
    records = list(records)
    if not records:
        return BudgetVerdict(True, None, "no attempts yet", {"attempts": 0})
    b = budget
    alloc = _current_allocation(records, allocation_job_id)
    in_alloc = _restarts(alloc, records)
    total = _restarts(records, records)
    lost_values = [r.steps_lost for r in records if r.steps_lost is not None]
    total_lost = sum(lost_values)
    at_least = any(r.steps_lost_at_least for r in records)
    # Crashes that lost steps: requeues without progress are their own budget's business.
    losses = sum(1 for r in records if is_crash(r.cls) and (r.steps_lost or 0) > 0)
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
    durable = progress_by_attempt(records)
    requeues = _requeues_without_progress(records, durable, b.min_durable_progress)
    rate = _failure_rate(records, b.failure_rate_window)
    scratch = restarts_from_scratch(records)
    numbers: dict[str, Any] = {
        "attempts": len(records), "allocation": allocation_job_id if allocation_job_id is not None else last.job_id,
        "restarts_in_allocation": in_alloc, "total_restarts": total, "total_steps_lost": total_lost,
        "steps_lost_at_least": at_least, "progress": progress, "steps_lost_fraction": fraction,
        "last_attempt_progress": last_progress, "same_failure_count": same,
        "same_failure_step": step_key if same else None, "durable_step": durable_end(last, None),
        "requeues_without_progress": requeues, "restarts_from_scratch": len(scratch),
        "failure_rate": None if rate is None else {
            "failures": rate.failures, "durable_progress": rate.progress, "from_attempt": rate.first_attempt,
            "steps_per_failure": round(rate.per_failure, 1), "steps_lost": rate.lost},
    }
    lost_text = f"{'≥' if at_least else ''}{total_lost}"

    def stop(name: str, reason: str) -> BudgetVerdict:
        return BudgetVerdict(False, name, reason, numbers)

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
    if b.max_restarts_from_scratch is not None and len(scratch) > b.max_restarts_from_scratch:
        record, saved, saved_by = scratch[-1]
        before = next((r for r in reversed(records) if r.attempt < record.attempt), None)
        lost = (f": {'≥' if before.steps_lost_at_least else ''}{before.steps_lost} steps of attempt "
                f"{before.attempt} lost" if before is not None and before.steps_lost is not None else "")
        saver = next((r for r in records if r.attempt == saved_by), None)
        why = "its only checkpoint was torn, quarantined or removed"
        if saver is not None and saver.saved_elsewhere_step == saved and (saver.last_durable_step or -1) < saved:
            why = (f"its checkpoint was saved to {saver.saved_elsewhere}, outside the watched checkpoint "
                   "directory (pass --checkpoint-dir)")
        return stop("max_restarts_from_scratch",
                    f"attempt {record.attempt} started from step 0 although attempt {saved_by} had saved step "
                    f"{saved}: {why}{lost}; at most {b.max_restarts_from_scratch} restart(s) from scratch")
    if b.max_requeues_without_progress is not None and requeues > b.max_requeues_without_progress:
        return stop("max_requeues_without_progress",
                    f"{requeues} preemptions or time limits in a row without durable progress (no checkpoint "
                    f"past the step each attempt resumed from); at most {b.max_requeues_without_progress}")
    if b.min_steps_per_failure is not None and rate is not None and \
            rate.progress < rate.failures * b.min_steps_per_failure:
        return stop("min_steps_per_failure",
                    f"failure rate: the last {rate.failures} failures (attempts {rate.first_attempt}-"
                    f"{rate.last_attempt}) came with {rate.progress} steps of durable progress (step "
                    f"{rate.from_step} to {rate.to_step}), {rate.per_failure:.0f} per failure; at least "
                    f"{b.min_steps_per_failure} per failure")
    if (b.min_kept_per_lost is not None and rate is not None and rate.lost is not None
            and rate.progress < b.min_kept_per_lost * rate.lost):
        return stop("min_kept_per_lost",
                    f"failure rate: the last {rate.failures} failures (attempts {rate.first_attempt}-"
                    f"{rate.last_attempt}) kept {rate.progress} steps (durable progress, step {rate.from_step} "
                    f"to {rate.to_step}) and lost {'≥' if rate.lost_at_least else ''}{rate.lost}; at least "
                    f"{b.min_kept_per_lost:g} step(s) kept per step lost")
    if b.max_steps_lost is not None and total_lost > b.max_steps_lost:
        return stop("max_steps_lost", f"{lost_text} steps lost across the run; at most {b.max_steps_lost}")
    fraction_judged = final or losses >= MIN_LOSSES_FOR_FRACTION
    if (b.max_steps_lost_fraction is not None and fraction is not None and fraction_judged
            and fraction > b.max_steps_lost_fraction):
        return stop("max_steps_lost_fraction",
                    f"{lost_text} steps lost for {progress} steps of progress ({fraction:.0%}); at most "
                    f"{b.max_steps_lost_fraction:.0%}")
    parts = [f"{in_alloc} restarts in this allocation" + _of(b.max_restarts_per_allocation),
             f"{total} in total" + _of(b.max_total_restarts),
             f"{lost_text} steps lost" + _of(b.max_steps_lost)]
    if fraction is not None:
        over = b.max_steps_lost_fraction is not None and fraction > b.max_steps_lost_fraction
        parts.append(f"{fraction:.0%} of progress" + (
            f" (over the max {b.max_steps_lost_fraction:.0%}: judged once {MIN_LOSSES_FOR_FRACTION} crashes lost "
            f"steps, or when the run completes; {losses} so far)" if over
            else _of(b.max_steps_lost_fraction, percent=True)))
    if rate is not None:
        parts.append(f"{rate.per_failure:.0f} steps of durable progress per failure over the last "
                     f"{rate.failures}" + (f" (min {b.min_steps_per_failure})" if b.min_steps_per_failure else ""))
        if rate.lost is not None:
            parts.append(f"{rate.progress} steps kept for {'≥' if rate.lost_at_least else ''}{rate.lost} lost over "
                         f"the last {rate.failures} failures"
                         + (f" (min {b.min_kept_per_lost:g} per step lost)" if b.min_kept_per_lost else ""))
    if requeues:
        parts.append(f"{requeues} requeue(s) without progress" + _of(b.max_requeues_without_progress))
    return BudgetVerdict(True, None, "within budget: " + ", ".join(parts), numbers)


def _of(limit: float | None, percent: bool = False) -> str:
    if limit is None:
        return ""
    return f" (max {limit:.0%})" if percent else f" (max {limit})"


# ---------------------------------------------------------------------------------------------
# The one verdict


@dataclass(frozen=True)
class RunVerdict:
    """The verdict ``supervise audit`` and ``supervise report`` print and exit by.

    ``budget``: the budget (a ``BudgetConfig`` field) or the policy key (``policy.<class>.retries``)
    that stopped the run, or would stop it now. ``source``: ``run_end`` when the run stopped and its
    ``run_end`` says why; ``judge`` when it was judged from the ledger (running, handed back, complete).
    """

    ok: bool
    budget: str | None
    reason: str
    numbers: dict[str, Any] = field(default_factory=dict)
    source: str = "judge"
    outcome: str | None = None  # of the run_end that ended the run; None while it goes on


_BUDGET_TEXT = re.compile(r"^budget (?P<name>[A-Za-z_][\w.]*) exhausted: (?P<reason>.*)$", re.DOTALL)
_RETRIES_TEXT = re.compile(r"^(?P<cls>[a-z_]+) (?:once|\d+ times in a row); policy allows")
_POLICY_STOP_TEXT = re.compile(r"^(?P<cls>[a-z_]+): policy says stop")


def stopped_by(run_end: Mapping[str, Any]) -> tuple[str | None, str]:
    """(the budget or policy that stopped the run, why) from a ``run_end``'s fields: ``stopped_by``
    when the loop wrote it, else read from the reason text the loop has always written."""
    reason = str(run_end.get("reason") or "no reason logged")
    named = run_end.get("stopped_by")
    name = str(named) if named else None
    budget = _BUDGET_TEXT.match(reason)
    if budget:
        return name or budget["name"], budget["reason"]
    if name is None:
        retries = _RETRIES_TEXT.match(reason)
        stop = _POLICY_STOP_TEXT.match(reason)
        if retries:
            name = f"policy.{retries['cls']}.retries"
        elif stop:
            name = f"policy.{stop['cls']}.action"
    return name, reason


def run_verdict(events: Sequence[Event], budget: BudgetConfig, *, records: Sequence[AttemptRecord] | None = None,
                allocation_job_id: str | None = None) -> RunVerdict:
    """The run's verdict from its event log. A run whose ``run_end`` says it stopped (or failed) is
    not ok, whatever the budgets say now, and the verdict names what stopped it; a completed run is
    ok; a run still going, handed back for a requeue or interrupted by a person is judged by
    :func:`judge`. ``records``: the ledger when the caller has it already."""
    events = list(events)
    ledger = list(records) if records is not None else ledger_from_events(events)
    allocation = allocation_job_id if allocation_job_id is not None else (ledger[-1].job_id if ledger else None)
    judged = judge(ledger, budget, allocation)
    end = final_run_end(events)
    outcome = str(end.get("outcome")) if end is not None and end.get("outcome") is not None else None
    if outcome == RunOutcome.COMPLETE.value:
        # What the run cost is judged as a whole: a run that finished after losing more than its
        # budget allows is not ok, and the verdict says so beside the numbers.
        cost = judge(ledger, budget, allocation, final=True)
        if cost.ok:
            return RunVerdict(True, None, f"training complete; {cost.reason}", cost.numbers, "judge", outcome)
        return RunVerdict(False, cost.budget, f"training complete, but budget {cost.budget} exceeded: {cost.reason}",
                          cost.numbers, "judge", outcome)
    if outcome in (RunOutcome.STOPPED.value, RunOutcome.FAILED.value):
        assert end is not None
        name, why = stopped_by(end.fields)
        return RunVerdict(False, name, why, judged.numbers, "run_end", outcome)
    reason = judged.reason
    if outcome == RunOutcome.INTERRUPTED.value:
        reason = f"interrupted by a person; {reason}"
    return RunVerdict(judged.ok, judged.budget, reason, judged.numbers, "judge", outcome)


# ---------------------------------------------------------------------------------------------
# Resume audit


def audit_resume(expected_step: int | None, reported_first_step: int | None, resume_path: Any) -> ResumeAudit:
    """Does the first step the child reports match the resume point?

    A resumed loop reports either the step it resumed at or the next one to run (``expected`` or
    ``expected + 1``), so both pass. A start below the resume point is flagged: a child that starts
    at 0 silently threw the checkpoint away. A start past it redoes nothing and passes with a note.
    Without a resume point any start is fine;
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
    # Past the resume point: nothing saved is redone. A training that prints its step only now and
    # then (at each save, at each evaluation) shows its first step late, and one that found a newer
    # save of its own resumed from it; neither lost progress, so this is a note, never a stop.
    return ResumeAudit(True, f"child's first reported step {reported_first_step} is past the resume point step "
                             f"{expected_step}{where}: nothing redone (its step lines are sparse, or it resumed "
                             "from a newer save of its own)")


def audit_fresh_start(saved_step: int | None, saved_path: str | None, saved_by: int | None,
                      checkpoint_dir: str, reported_first_step: int | None, *, outside: bool) -> ResumeAudit:
    """An attempt with no resume point, after an earlier attempt saved ``saved_step`` to
    ``saved_path``: outside the watched directory (the output named it), or inside it but not
    usable as a resume point (its step cannot be read from the file). A child that starts from
    scratch throws that progress away: flagged, with what to add. One that starts later resumed by
    itself (it knows its own path): fine. Only a start from scratch is flagged: the save may have
    been torn since."""
    if saved_step is None or saved_step <= 1 or reported_first_step is None:
        return ResumeAudit(True, "unknown: no step saved before, or none reported yet")
    if reported_first_step > 1:
        return ResumeAudit(True, f"started at step {reported_first_step}: resumed by itself (attempt {saved_by} "
                                 f"saved step {saved_step} to {saved_path})")
    where = str(saved_path) if saved_path else "a path the supervisor does not know"
    redo = f"{saved_step - reported_first_step} steps would be redone"
    if outside:
        fix = f"--checkpoint-dir {suggested_checkpoint_dir(saved_path)}" if saved_path else "--checkpoint-dir DIR"
        return ResumeAudit(False, f"child started from scratch but attempt {saved_by} saved step {saved_step} to "
                                  f"{where}, outside the watched checkpoint directory {checkpoint_dir}: the "
                                  f"supervisor cannot hand it over, {redo}; pass {fix} (and a resume command: "
                                  "docs/resume.md)")
    return ResumeAudit(False, f"child started from scratch but attempt {saved_by} saved step {saved_step} to "
                              f"{where}, which is not a usable resume point (its step cannot be read from the file): "
                              f"{redo}; set checkpoint.step_from (e.g. key:iter_num or log) and a resume command "
                              "(docs/resume.md)")


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
