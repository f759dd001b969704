"""When Slurm requeues a job by itself and when the supervisor must. Pure decisions, no I/O.

Facts (docs/slurm-versions.md; verified on 22.05.8 by tests/test_slurm_cluster.py):
- a job that exits during its preemption grace is, on 22.05-23.11, simply finished: never requeued;
  on 24.05+ Slurm treats it as preempted and requeues it (PreemptMode=REQUEUE, requeueable job);
- a job that stays until the grace expires is requeued by Slurm on every version;
- a time limit is never requeued by Slurm; nor is any other exit (crash, fault, a supervisor's
  decision to come back elsewhere) unless the admin set RequeueExit, which a job cannot see.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ..states import FailureClass
from .parse import JobInfo
from .version import SlurmVersion

# slurmctld's answer to a requeue of a job that is already requeued, including one still completing
# its previous run (seen on 22.05.8: "Job is pending execution for job 14" while JobState=COMPLETING).
ALREADY_PENDING_MESSAGE = "pending execution"

# First release whose slurmctld requeues a job that exits during its grace (commit a689104d15);
# the capability is SlurmVersion.requeues_on_exit_during_grace.
GRACE_EXIT_REQUEUE_SINCE = (24, 5)


@dataclass(frozen=True)
class RequeueNeed:
    """Whether the supervisor must call ``scontrol requeue`` itself after the job ends."""

    explicit: bool
    reason: str


@dataclass(frozen=True)
class RequeueCheck:
    """What to do about a requeue request, judged from the job's current state."""

    call_requeue: bool  # ask Slurm now
    already_requeued: bool  # nothing to do: the job is already waiting to run again
    reason: str


def requeue_need(version: SlurmVersion | tuple[int, ...] | None, reason: FailureClass | str) -> RequeueNeed:
    """Will Slurm requeue this job by itself once the supervisor exits (during grace, if preempted)?"""
    cause = _cause(reason)
    if cause == FailureClass.TIME_LIMIT.value:
        return RequeueNeed(True, "Slurm never requeues a job that reached its time limit")
    if cause != FailureClass.PREEMPTED.value:
        return RequeueNeed(True, f"Slurm does not requeue a job that exits after {cause}")
    if version is None:
        return RequeueNeed(True, "Slurm version unknown: requeue explicitly (it is idempotent)")
    known = SlurmVersion.of(version)
    assert known is not None
    if known.requeues_on_exit_during_grace:
        return RequeueNeed(False, f"Slurm {known} requeues a preempted job that exits during its grace")
    return RequeueNeed(True, f"Slurm {known} (< 24.05) finishes a job that exits during its grace without requeue")


def needs_explicit_requeue(version: SlurmVersion | tuple[int, ...] | None, reason: FailureClass | str) -> bool:
    """True when Slurm will not requeue the job by itself (see :func:`requeue_need`)."""
    return requeue_need(version, reason).explicit


def check_requeue(info: JobInfo | None, expected_restarts: int | None = None) -> RequeueCheck:
    """Make requeue idempotent: skip it when the job is already waiting to run again.

    ``expected_restarts``: the restart count this process started with (``SLURM_RESTART_COUNT``);
    a higher count on the controller means Slurm (or another caller) already requeued this run.
    """
    if info is None:
        return RequeueCheck(False, False, "job no longer known to slurmctld (finished longer than MinJobAge ago?)")
    if info.is_pending:
        return RequeueCheck(False, True, f"already {info.state} (Reason={info.reason}, Restarts={info.restarts})")
    if expected_restarts is not None and info.restarts > expected_restarts:
        return RequeueCheck(
            False, True, f"already requeued: Restarts={info.restarts} > {expected_restarts} at start ({info.state})"
        )
    return RequeueCheck(True, False, f"job is {info.state} (Restarts={info.restarts}): requeue it")


# --- the requeue call against the grace it was planned with (issue 25, item 4) -----------------------

REQUEUE_CALL_TIMEOUT_S = 20.0  # the call's own bound when no grace was planned (a crash-driven requeue)
MIN_CALL_S = 0.5  # less time than this to the call deadline: do not start a call that cannot finish
CALL_MARGIN_S = 1.0  # the call must be answered this long before the grace ends (or preemption.margin, if less)
SETTLE_READ_S = 5.0  # one job-record read after the child ended, when no grace was planned
STAY_AFTER_DEADLINE_S = 120.0  # after the grace: Slurm's kill (KillWait 30 s by default) should have come


class RequeueFallback(str, Enum):
    """What brings the job back when the supervisor's own requeue call cannot be made in time."""

    NONE = "none"  # no grace was planned: the call has its plain timeout; a failure is reported
    SLURM_REQUEUES_EXIT = "slurm_requeues_exit"  # 24.05+: Slurm requeues a preempted job that exits in its grace
    STAY_FOR_SLURM = "stay_for_slurm"  # 22.05-23.11 (or unknown): stay until Slurm's end-of-grace kill requeues it
    NOTHING = "nothing"  # a time limit or a job that is not requeueable: nothing requeues it but the call


@dataclass(frozen=True)
class RequeueCallPlan:
    """When the supervisor's ``scontrol requeue`` must be done by, and what to rely on otherwise.

    ``call``: start the call at all (False: too little time left to make it). ``timeout``: seconds
    the call may take (to ``deadline``). ``deadline``: the planned grace deadline minus the call
    margin (:func:`call_deadline`), on the supervisor's clock; None with no grace planned.
    ``stay_until``: with ``STAY_FOR_SLURM``, how long to keep the job step alive at most, waiting
    for the call or Slurm's kill.
    """

    call: bool
    timeout: float
    deadline: float | None  # the call's deadline: the grace deadline minus the call margin
    fallback: RequeueFallback
    reason: str
    stay_until: float | None = None


def plan_requeue_call(now: float, grace_deadline: float | None, margin: float, cause: FailureClass | str | None,
                      version: SlurmVersion | tuple[int, ...] | None, requeueable: bool | None) -> RequeueCallPlan:
    """A hanging ``scontrol`` must never delay the requeue past the grace it was planned with.

    ``grace_deadline``: the deadline the stop was planned with (the notice's), None when no notice
    came (a crash-driven requeue: no grace, the call keeps its plain bound). ``margin``:
    ``preemption.margin``. ``cause``: what the notice says ended the allocation. Where the call
    cannot finish by :func:`call_deadline`,
    Slurm's own requeue is relied on: on 24.05+ a preempted requeueable job that exits during its
    grace is requeued by Slurm; on 22.05-23.11 only a job still running when the grace ends is
    (docs/slurm-versions.md), so the supervisor keeps its step alive until Slurm's kill comes.
    """
    if grace_deadline is None:
        return RequeueCallPlan(True, REQUEUE_CALL_TIMEOUT_S, None, RequeueFallback.NONE,
                               f"no grace planned: the requeue call is bounded at {REQUEUE_CALL_TIMEOUT_S:g} s")
    deadline = call_deadline(grace_deadline, margin)
    left = deadline - now
    known = SlurmVersion.of(version) if version is not None else None
    kind = _cause(cause) if cause is not None else FailureClass.PREEMPTED.value
    stay_until = None
    if kind != FailureClass.PREEMPTED.value:
        fallback = RequeueFallback.NOTHING
        then = f"Slurm never requeues after {kind}: if the call fails, the job is not requeued"
    elif requeueable is False:
        fallback, then = RequeueFallback.NOTHING, "the job is not requeueable: nothing but the call requeues it"
    elif known is not None and known.requeues_on_exit_during_grace:
        fallback = RequeueFallback.SLURM_REQUEUES_EXIT
        then = f"otherwise Slurm {known.release} requeues the preempted job as it exits during its grace"
    else:
        fallback = RequeueFallback.STAY_FOR_SLURM
        stay_until = grace_deadline + STAY_AFTER_DEADLINE_S
        which = f"Slurm {known.release}" if known is not None else "Slurm (version unknown)"
        then = (f"otherwise the step stays alive until the grace ends: {which} requeues a preempted job still "
                "running then (an exit during the grace is not requeued before 24.05)")
    before = f"{grace_deadline - deadline:g} s before the grace ends"
    if left < MIN_CALL_S:
        return RequeueCallPlan(False, 0.0, deadline, fallback,
                               f"{max(left, 0.0):.1f} s left to the call's deadline ({before}): no requeue call; "
                               + then, stay_until)
    return RequeueCallPlan(True, round(left, 3), deadline, fallback,
                           f"the requeue call must answer within {left:.1f} s (by {before}); " + then, stay_until)


def call_deadline(grace_deadline: float, margin: float) -> float:
    """When the requeue call must have answered: ``CALL_MARGIN_S`` (or ``preemption.margin``, if
    less) before the grace deadline. A call still running then changes nothing: on 22.05-23.11 the
    supervisor is still alive when Slurm's end-of-grace requeue comes."""
    return grace_deadline - min(max(margin, 0.0), CALL_MARGIN_S)


def settle_read_timeout(now: float, call_deadline: float | None) -> float:
    """How long one job-record read after the child ended may wait: its plain bound, or a quarter of
    the time left to the requeue call's deadline, so that reads one after another never eat the
    time the call needs."""
    if call_deadline is None:
        return SETTLE_READ_S
    return round(max(min(SETTLE_READ_S, (call_deadline - now) / 4.0), 0.0), 3)


def _cause(reason: FailureClass | str) -> str:
    return reason.value if isinstance(reason, FailureClass) else str(reason).strip().lower()
