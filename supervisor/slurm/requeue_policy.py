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


def _cause(reason: FailureClass | str) -> str:
    return reason.value if isinstance(reason, FailureClass) else str(reason).strip().lower()
