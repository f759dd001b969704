"""Where a requeue is decided: the one module. Pure: plain data in, a frozen decision with a ``reason`` out.

How a run comes back after its allocation ends is decided here and nowhere else
(docs/extending/requeue.md walks through it):

* :func:`requeue_decision` - inside the job, once the loop gives the allocation up without
  finishing: leave it to Slurm (``slurm_will``), ``scontrol requeue`` explicitly (``scontrol``),
  hand the run to ``supervise submit`` for a new job (``resubmit``), or not at all (``none``); with
  the warning when Slurm will *hold* the job after that requeue (:func:`held_after_requeue`).
* :func:`slurm_requeues_on_exit` - what Slurm does by itself when the job exits now, by cause and
  version; :func:`preempted_exit` and :func:`node_failure_requeue` are the same facts as the stop
  cause reads them from a job record (supervisor/slurm/stop_cause.py).
* :func:`already_requeued` / :func:`check_requeue` - a requeue is asked for once, never twice.
* :func:`call_fallback` / :func:`plan_requeue_call` - when the ``scontrol requeue`` call must have
  answered, and what brings the job back when it cannot be made in time.
* :func:`decide_next` - after a job ended for good, for ``supervise submit``: resubmit, done or stop.

Facts (docs/slurm-versions.md; verified on 22.05.8 by tests/test_slurm_cluster.py):
- a job that exits during its preemption grace is, on 22.05-23.11, simply finished: never requeued;
  on 24.05+ Slurm treats it as preempted and requeues it (PreemptMode=REQUEUE, requeueable job);
- a job that stays until the grace expires is requeued by Slurm on every version;
- a time limit is never requeued by Slurm; nor is any other exit (crash, fault, a supervisor's
  decision to come back elsewhere) unless the admin set RequeueExit, which a job cannot see.
Slurm's behaviour by version is asked of :class:`supervisor.slurm.version.SlurmVersion`'s
properties; nothing here compares version numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from ..failures.classes import classes_where
from ..errors import ExitCode
from ..states import FailureClass, SubmitAction
from .parse import JobInfo
from .version import DEFAULT_MAX_BATCH_REQUEUE, SlurmVersion, version_or_none

if TYPE_CHECKING:
    from ..budget import BudgetVerdict

__all__ = [
    "ALREADY_PENDING_MESSAGE", "COME_BACK_STATES", "HARDWARE_CLASSES", "REQUEUE_POLICIES", "NextStep",
    "RequeueCallPlan", "RequeueCheck", "RequeueDecision", "RequeueFacts", "RequeueFallback", "RequeueHow",
    "RequeueNeed", "SlurmWill", "already_requeued", "call_deadline", "call_fallback", "cancelled_by_person",
    "check_requeue", "decide_next", "describe_job", "held_after_requeue", "needs_explicit_requeue",
    "node_failure_requeue", "plan_requeue_call", "preempted_exit", "requeue_decision", "requeue_need",
    "settle_read_timeout", "slurm_requeues_on_exit",
]

REQUEUE_POLICIES = ("auto", "always", "never")  # config preemption.requeue
HARDWARE_CLASSES = classes_where(hardware_requeue=True)  # requeued away from the node (supervisor/failures/classes.py)
# States of a job that is already waiting to run again (a suspended job is not: it was never requeued).
_REQUEUED_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})
# Job states after which the run should come back: the scheduler ended the allocation, not the run.
COME_BACK_STATES = frozenset({"PREEMPTED", "TIMEOUT", "NODE_FAIL", "BOOT_FAIL"})


class RequeueHow(str, Enum):
    """How the job comes back. The values are what the ``requeue`` event records as ``how``."""

    SCONTROL = "scontrol"  # `scontrol requeue $SLURM_JOB_ID` (after update_exclude when nodes are excluded)
    SLURM_WILL = "slurm_will"  # just exit: Slurm requeues it by itself
    RESUBMIT = "resubmit"  # sbatch the script again (`supervise submit`): a new job id
    NONE = "none"  # the run ends, exit 75 for a resubmission loop, or for good


# slurmctld's answer to a requeue of a job that is already requeued, including one still completing
# its previous run (seen on 22.05.8: "Job is pending execution for job 14" while JobState=COMPLETING).
ALREADY_PENDING_MESSAGE = "pending execution"


# ---------------------------------------------------------------------------------------------
# What Slurm does by itself


@dataclass(frozen=True)
class RequeueNeed:
    """Whether the supervisor must call ``scontrol requeue`` itself after the job ends."""

    explicit: bool
    reason: str


@dataclass(frozen=True)
class SlurmWill:
    """Will Slurm requeue the job by itself as it exits now? ``requeues`` None: cannot tell."""

    requeues: bool | None
    reason: str


def _cause(reason: FailureClass | str) -> str:
    return reason.value if isinstance(reason, FailureClass) else str(reason).strip().lower()


def slurm_requeues_on_exit(version: Any, cause: FailureClass | str) -> SlurmWill:
    """What Slurm does with a *requeueable* job that exits after ``cause`` (during its grace, if
    preempted): a time limit and any exit the supervisor chose are never requeued by Slurm; a
    preempted job that exits during its grace is requeued only from 24.05
    (``SlurmVersion.requeues_on_exit_during_grace``)."""
    kind = _cause(cause)
    if kind == FailureClass.TIME_LIMIT.value:
        return SlurmWill(False, "Slurm never requeues a job that reached its time limit")
    if kind != FailureClass.PREEMPTED.value:
        return SlurmWill(False, f"Slurm does not requeue a job that exits after {kind}")
    known = version_or_none(version)
    if known is None:
        return SlurmWill(None, "Slurm version unknown: requeue explicitly (it is idempotent)")
    if known.requeues_on_exit_during_grace:
        return SlurmWill(True, f"Slurm {known} requeues a preempted job that exits during its grace")
    return SlurmWill(False, f"Slurm {known} (< 24.05) finishes a job that exits during its grace without requeue")


def requeue_need(version: Any, reason: FailureClass | str) -> RequeueNeed:
    """Will Slurm requeue this job by itself once the supervisor exits (during grace, if preempted)?
    Explicit unless Slurm surely will."""
    will = slurm_requeues_on_exit(version, reason)
    return RequeueNeed(will.requeues is not True, will.reason)


def needs_explicit_requeue(version: Any, reason: FailureClass | str) -> bool:
    """True when Slurm will not requeue the job by itself (see :func:`requeue_need`)."""
    return requeue_need(version, reason).explicit


def preempted_exit(version: Any, requeueable: bool | None) -> SlurmWill:
    """A preempted job (PreemptTime set) that exits now: requeued by Slurm? The stop cause's words
    for it (supervisor/slurm/stop_cause.py)."""
    known = version_or_none(version)
    if known is None:
        return SlurmWill(None, "whether Slurm requeues an exit during grace depends on the version (unknown)")
    if requeueable is False:
        return SlurmWill(False, "the job is not requeueable: Slurm will not requeue it")
    if slurm_requeues_on_exit(known, FailureClass.PREEMPTED).requeues:
        return SlurmWill(True, f"Slurm {known.release} requeues a preempted job that exits during its grace "
                               "(that requeue counts toward MaxBatchRequeue)")
    return SlurmWill(False, f"Slurm {known.release} finishes a preempted job that exits during its grace "
                            "without requeue (only one that stays to the grace's end is requeued)")


def node_failure_requeue(requeueable: bool, batch_flag: int, pending: bool) -> bool | None:
    """A node of the job failed: Slurm requeues a requeueable batch job by itself; a job already
    pending again was; otherwise it cannot be told from the record."""
    return bool(requeueable and batch_flag) or (True if pending else None)


def already_requeued(pending: bool, restarts: int, expected_restarts: int | None) -> bool:
    """The job is waiting to run again, or its Restarts count grew past the one this run started
    with (Slurm, a person or this supervisor requeued it meanwhile): never requeue twice."""
    return pending or (expected_restarts is not None and restarts > expected_restarts)


@dataclass(frozen=True)
class RequeueCheck:
    """What to do about a requeue request, judged from the job's current state."""

    call_requeue: bool  # ask Slurm now
    already_requeued: bool  # nothing to do: the job is already waiting to run again
    reason: str


def check_requeue(info: JobInfo | None, expected_restarts: int | None = None) -> RequeueCheck:
    """Make requeue idempotent: skip it when the job is already waiting to run again.

    ``expected_restarts``: the restart count this process started with (``SLURM_RESTART_COUNT``);
    a higher count on the controller means Slurm (or another caller) already requeued this run.
    """
    if info is None:
        return RequeueCheck(False, False, "job no longer known to slurmctld (finished longer than MinJobAge ago?)")
    if not already_requeued(info.is_pending, info.restarts, expected_restarts):
        return RequeueCheck(True, False, f"job is {info.state} (Restarts={info.restarts}): requeue it")
    if info.is_pending:
        return RequeueCheck(False, True, f"already {info.state} (Reason={info.reason}, Restarts={info.restarts})")
    return RequeueCheck(
        False, True, f"already requeued: Restarts={info.restarts} > {expected_restarts} at start ({info.state})")


def held_after_requeue(version: Any, how: RequeueHow | str, restarts: int | None, job_id: Any = None) -> str | None:
    """From 24.05 a job that leaves during its grace is requeued by Slurm through the batch-requeue
    path, which counts toward MaxBatchRequeue (5 by default) and then *holds* the job: it would
    stay pending until a person releases it. Nobody of this run is alive then to do it, so this
    says so, with the exact command (docs/slurm-versions.md). ``restarts`` None: no job record."""
    ver = version_or_none(version)
    if ver is None or RequeueHow(how) is not RequeueHow.SLURM_WILL or not ver.holds_after_max_batch_requeue \
            or restarts is None:
        return None
    if restarts + 1 < DEFAULT_MAX_BATCH_REQUEUE:
        return None
    job = job_id if job_id is not None else "JOB"
    return (f"Slurm {ver.release} will hold job {job} after this requeue (MaxBatchRequeue: requeue "
            f"{restarts + 1} of at most {DEFAULT_MAX_BATCH_REQUEUE}): it stays pending until released with "
            f"`scontrol release {job}` (or run it under `supervise submit`, which releases held jobs)")


# ---------------------------------------------------------------------------------------------
# Inside the job: how does the run come back?


@dataclass(frozen=True)
class RequeueFacts:
    """What the loop knows when it gives the allocation up without finishing.

    ``child_outcome``: the attempt's failure class. ``notice_class``: what the stop notice said ended
    the allocation (preempted / time_limit / cancelled), None with no notice. ``job_requeueable``:
    the record's Requeue= (None: no record). ``already_requeued``: the stop cause says so.
    ``job_state``, ``restarts``, ``job_id``: from the job record read after the exit (None: none).
    ``policy``: ``preemption.requeue``. ``exclude_nodes``: nodes the next run must avoid.
    """

    child_outcome: FailureClass | str
    in_slurm: bool
    job_requeueable: bool | None
    slurm_version: SlurmVersion | None
    notice_class: FailureClass | None
    already_requeued: bool
    policy: str
    requeue_on_time_limit: bool
    exclude_nodes: tuple[str, ...] = ()
    job_state: str | None = None
    restarts: int | None = None
    job_id: str | int | None = None


@dataclass(frozen=True)
class RequeueDecision:
    """Whether and how the job comes back after this allocation ends. ``held``: the warning that
    Slurm will hold the job after this requeue (None: it will not)."""

    do: bool
    how: RequeueHow
    reason: str
    exclude: tuple[str, ...] = ()
    held: str | None = None

    def to_event(self) -> dict[str, Any]:
        return {"planned": self.do, "how": RequeueHow(self.how).value, "reason": self.reason,
                "exclude": list(self.exclude)}


def _as_class(outcome: Any) -> FailureClass:
    if isinstance(outcome, FailureClass):
        return outcome
    try:
        return FailureClass(str(outcome))
    except ValueError:
        return FailureClass.UNKNOWN


def requeue_decision(facts: RequeueFacts) -> RequeueDecision:
    """How this job comes back, given how the attempt ended. Called once the loop has decided to give
    the allocation up without finishing (Action.REQUEUE, or a stop notice).

    ``policy``: ``auto`` requeues explicitly where Slurm will not, ``always`` always explicitly
    (resubmitting a job Slurm refuses to requeue), ``never`` leaves it to a resubmission loop.
    """
    decision = _decide(facts)
    held = held_after_requeue(facts.slurm_version, decision.how, facts.restarts, facts.job_id)
    return decision if held is None else RequeueDecision(decision.do, decision.how, decision.reason,
                                                         decision.exclude, held)


def _decide(facts: RequeueFacts) -> RequeueDecision:
    cls = _as_class(facts.child_outcome)
    exclude = tuple(facts.exclude_nodes)
    policy, notice_class, requeueable = facts.policy, facts.notice_class, facts.job_requeueable
    if policy not in REQUEUE_POLICIES:
        raise ValueError(f"requeue policy {policy!r}; allowed: {', '.join(REQUEUE_POLICIES)}")

    def no(reason: str) -> RequeueDecision:
        return RequeueDecision(False, RequeueHow.NONE, reason)

    if cls is FailureClass.COMPLETED:
        return no("training is complete (the child exited 0): never requeue a finished run")
    if cls is FailureClass.CANCELLED or notice_class is FailureClass.CANCELLED:
        return no("cancelled by a person: not coming back")
    if facts.already_requeued or (facts.job_state or "").upper() in _REQUEUED_STATES:
        state = f" (state {facts.job_state})" if facts.job_state else ""
        return no(f"the job is already requeued{state}: a requeue is asked for once, never twice")
    if not facts.in_slurm:
        return no("not a Slurm job: nothing to requeue here; the run exits 75 for a resubmission loop")
    if policy == "never":
        return no("preemption.requeue=never: not requeueing; the run exits 75 for a resubmission loop")

    time_limit = cls is FailureClass.TIME_LIMIT or notice_class is FailureClass.TIME_LIMIT
    preempted = not time_limit and (cls is FailureClass.PREEMPTED or notice_class is not None)
    if time_limit:
        what = "time limit: Slurm never requeues a job that ran out of time"
        if not facts.requeue_on_time_limit:
            return no("time limit and preemption.requeue_on_time_limit=false: not requeueing")
    elif preempted:
        what = "preempted"
    elif cls in HARDWARE_CLASSES:
        what = f"{cls.value} on {', '.join(exclude) or 'this node'}"
    else:
        what = f"{cls.value}: the failure policy says requeue"
    excl = f"; excluding {', '.join(exclude)}" if exclude else ""

    if requeueable is False:
        if policy == "always":
            return RequeueDecision(True, RequeueHow.RESUBMIT, f"{what}; the job is not requeueable (--no-requeue or "
                                   f"JobRequeue=0), so scontrol requeue would be refused: the run exits 75 "
                                   f"for `supervise submit` to resubmit the batch script as a new job{excl}",
                                   exclude)
        return no(f"{what}; the job is not requeueable (--no-requeue or JobRequeue=0): not requeueing; "
                  "the run exits 75 (run it under `supervise submit` to come back as a new job)")

    if preempted:
        need = requeue_need(facts.slurm_version, FailureClass.PREEMPTED)
        if policy == "auto" and not need.explicit and requeueable is True:
            return RequeueDecision(True, RequeueHow.SLURM_WILL, f"{what}; {need.reason} (requeueable job, "
                                   f"PreemptMode=REQUEUE; each such requeue counts toward MaxBatchRequeue){excl}",
                                   exclude)
        if need.explicit:
            why = need.reason
        elif requeueable is None:
            why = "requeueability unknown: requeueing explicitly"
        else:
            why = "preemption.requeue=always"
        return RequeueDecision(True, RequeueHow.SCONTROL, f"{what}; {why}: scontrol requeue{excl}", exclude)
    if requeueable is None:
        return RequeueDecision(True, RequeueHow.SCONTROL,
                               f"{what}; requeueability unknown: trying scontrol requeue{excl}", exclude)
    return RequeueDecision(True, RequeueHow.SCONTROL, f"{what}: scontrol requeue{excl}", exclude)


# ---------------------------------------------------------------------------------------------
# When the requeue call cannot be made in time


class RequeueFallback(str, Enum):
    """What brings the job back when the supervisor's own requeue call cannot be made in time."""

    NONE = "none"  # no grace was planned: the call has its plain timeout; a failure is reported
    SLURM_REQUEUES_EXIT = "slurm_requeues_exit"  # 24.05+: Slurm requeues a preempted job that exits in its grace
    STAY_FOR_SLURM = "stay_for_slurm"  # 22.05-23.11 (or unknown): stay until Slurm's end-of-grace kill requeues it
    NOTHING = "nothing"  # a time limit or a job that is not requeueable: nothing requeues it but the call


def call_fallback(cause: FailureClass | str | None, version: Any,
                  requeueable: bool | None) -> tuple[RequeueFallback, str]:
    """Where the ``scontrol requeue`` call cannot finish before the grace ends, what Slurm does
    instead: on 24.05+ a preempted requeueable job that exits during its grace is requeued by Slurm;
    on 22.05-23.11 (or an unknown version) only a job still running when the grace ends is, so the
    supervisor keeps its step alive until Slurm's kill comes. ``cause`` None: a preemption."""
    known = version_or_none(version)
    kind = _cause(cause) if cause is not None else FailureClass.PREEMPTED.value
    if kind != FailureClass.PREEMPTED.value:
        return RequeueFallback.NOTHING, f"Slurm never requeues after {kind}: if the call fails, the job is not requeued"
    if requeueable is False:
        return RequeueFallback.NOTHING, "the job is not requeueable: nothing but the call requeues it"
    if known is not None and slurm_requeues_on_exit(known, FailureClass.PREEMPTED).requeues:
        return (RequeueFallback.SLURM_REQUEUES_EXIT,
                f"otherwise Slurm {known.release} requeues the preempted job as it exits during its grace")
    which = f"Slurm {known.release}" if known is not None else "Slurm (version unknown)"
    return (RequeueFallback.STAY_FOR_SLURM,
            f"otherwise the step stays alive until the grace ends: {which} requeues a preempted job still "
            "running then (an exit during the grace is not requeued before 24.05)")


# --- the requeue call against the grace it was planned with (issue 25, item 4) -----------------------

REQUEUE_CALL_TIMEOUT_S = 20.0  # the call's own bound when no grace was planned (a crash-driven requeue)
MIN_CALL_S = 0.5  # less time than this to the call deadline: do not start a call that cannot finish
CALL_MARGIN_S = 1.0  # the call must be answered this long before the grace ends (or preemption.margin, if less)
SETTLE_READ_S = 5.0  # one job-record read after the child ended, when no grace was planned
STAY_AFTER_DEADLINE_S = 120.0  # after the grace: Slurm's kill (KillWait 30 s by default) should have come


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
    fallback, then = call_fallback(cause, version, requeueable)
    stay_until = grace_deadline + STAY_AFTER_DEADLINE_S if fallback is RequeueFallback.STAY_FOR_SLURM else None
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


# ---------------------------------------------------------------------------------------------
# After the job ended for good: resubmit? (`supervise submit`, supervisor/addons/resubmit.py)


@dataclass(frozen=True)
class NextStep:
    """What to do after a job ended for good. ``outcome`` and ``exit_code`` are what
    ``supervise submit`` reports and exits with when it ends here (``resubmit``/0 otherwise):
    complete 0, stopped (policy or budget) 4, failed / cancelled / gave_up 1."""

    action: SubmitAction
    reason: str
    outcome: str
    exit_code: int


def _state_of(job: Any) -> str:
    state = str(getattr(job, "state", None) or "UNKNOWN").strip().upper()
    return state.split()[0] if state else "UNKNOWN"  # "CANCELLED by 0" -> CANCELLED


def describe_job(job: Any) -> str:
    """``job 12 ended PREEMPTED (exit 0:15)``: the facts a person checks first."""
    job_id = getattr(job, "job_id", "?")
    state = _state_of(job)
    if state == "UNKNOWN":
        return f"job {job_id} ended (Slurm no longer knows it)"
    code, sig = getattr(job, "exit_code", None), getattr(job, "exit_signal", None)
    exit_text = f" (exit {code}:{sig or 0})" if code is not None else ""
    return f"job {job_id} ended {state}{exit_text}"


def cancelled_by_person(job: Any) -> bool:
    """CANCELLED with no PreemptTime: scancel by a person (a preemption cancel shows PreemptTime)."""
    return _state_of(job).startswith("CANCELLED") and getattr(job, "preempt_time", None) is None


def decide_next(
    job_final: Any,
    run_end: Mapping[str, Any] | None,
    submissions: int,
    max_submissions: int,
    budget_verdict: BudgetVerdict | None,
) -> NextStep:
    """What to do once ``job_final`` (a :class:`JobInfo`-like: state, preempt_time, exit_code) has
    ended for good. ``run_end``: the fields of the ``run_end`` event the run's supervisor wrote in
    that job (None when it wrote none: killed, never started); ``submissions``: jobs submitted so
    far, this one included; ``budget_verdict``: :func:`supervisor.budget.judge` over the run's
    ledger (None = not judged). The event log's word beats the job state: a supervisor that handed
    the run back exits 75, so its job may look FAILED or COMPLETED to Slurm."""
    job = describe_job(job_final)
    outcome = str(run_end.get("outcome")) if run_end and run_end.get("outcome") is not None else None
    why = str(run_end.get("reason") or "no reason recorded") if run_end else ""

    def stop(kind: str, code: int, reason: str) -> NextStep:
        return NextStep(SubmitAction.STOP, reason, kind, code)

    if outcome == "complete":
        said = run_end is not None and bool(run_end.get("reason"))
        return NextStep(SubmitAction.DONE, f"{job}: {why if said else 'training complete'}",
                        "complete", ExitCode.OK)
    if outcome == "stopped":
        return stop("stopped", ExitCode.STOPPED, f"{job}: the supervisor stopped the run: {why}; not resubmitting")
    if outcome == "failed":
        return stop("failed", ExitCode.FAILED, f"{job}: the run failed: {why}; not resubmitting")
    if outcome == "interrupted":
        return stop("cancelled", ExitCode.FAILED, f"{job}: the supervisor was interrupted ({why}); not resubmitting")
    if cancelled_by_person(job_final):
        return stop("cancelled", ExitCode.FAILED, f"{job} without a preemption: cancelled by a person (scancel); "
                                                  "not resubmitting")

    state = _state_of(job_final)
    preempted = getattr(job_final, "preempt_time", None) is not None
    if outcome == "requeue":
        come_back = f"{job}; the supervisor handed the run back: {why}"
    elif outcome is not None:
        return stop("failed", ExitCode.FAILED, f"{job} with an unknown run_end outcome {outcome!r}; not resubmitting")
    elif state in COME_BACK_STATES or (state.startswith("CANCELLED") and preempted):
        come_back = f"{job} before its supervisor recorded an end: the allocation was taken away"
    else:
        return stop("failed", ExitCode.FAILED,
                    f"{job} and its supervisor recorded no run_end in the run directory: it never started or "
                    "was killed (is the run directory the one the script passes to `supervise run --run-dir`?); "
                    "see the job's output; not resubmitting")

    if budget_verdict is not None and not budget_verdict.ok:
        return stop("stopped", ExitCode.STOPPED,
                    f"{come_back}; but budget {budget_verdict.budget} is exhausted: {budget_verdict.reason}; "
                    "not resubmitting")
    if submissions >= max_submissions:
        return stop("gave_up", ExitCode.FAILED,
                    f"{come_back}; {submissions} of at most {max_submissions} submissions used: giving up "
                    "(raise --max-submissions to go on)")
    return NextStep(SubmitAction.RESUBMIT, f"{come_back}: resubmitting", "resubmit", ExitCode.OK)

