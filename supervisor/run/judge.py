"""After an attempt: what ended it, and what the run does next. One pure function, :func:`judge_attempt`.

The classifier reads the output; the supervisor knows more than the text and its knowledge wins:
why the supervisor stopped the attempt (one :class:`~supervisor.run.stop.Cause`, set by the stop
machine) and what Slurm says ended it. A stall it detected is a hang, a person's Ctrl-C or scancel
is a cancel, a notice is a preemption or a time limit (unless the client said training had
finished), and an exit the supervisor itself forced (resume audit, loss policy) is a stop by that
policy. Then the restart policy
(:func:`supervisor.policy.decide`) and the budgets (:func:`supervisor.budget.judge`) decide, and the
verdict names whichever of them stopped the run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from ..budget import BudgetVerdict, judge
from ..config import BudgetConfig
from ..errors import ExitCode
from ..failures import Failure
from ..policy import ClassPolicy, Decision, decide
from ..states import Action, FailureClass, RunOutcome
from .stop import Cause, CauseKind

EXIT_CANCELLED = 130  # a person's Ctrl-C or scancel, as a shell reports SIGINT


@dataclass(frozen=True)
class AttemptFacts:
    """What the supervisor itself knows about how the attempt ended: why it stopped the child
    (``cause``, from the stop machine; None when nothing did) and what Slurm says ended it."""

    cause: Cause | None = None
    notice_class: FailureClass | None = None  # preempted / time_limit / cancelled, from the notice and Slurm
    notice_reason: str | None = None
    client_done: bool = False

    def caused_by(self, kind: CauseKind) -> str | None:
        """The cause's words when the supervisor stopped the attempt for ``kind``, else None."""
        return self.cause.why if self.cause is not None and self.cause.kind is kind else None


@dataclass(frozen=True)
class AttemptVerdict:
    """The class of the attempt's end and what the run does next.

    ``outcome`` None means: restart in place after ``delay`` seconds. Otherwise the run ends with
    ``outcome`` and ``exit_code``; ``stopped_by`` names the policy or budget that stopped it.
    """

    cls: FailureClass
    failure: Failure
    outcome: RunOutcome | None
    exit_code: int
    reason: str
    decision: Decision | None = None
    budget: BudgetVerdict | None = None
    delay: float = 0.0
    stopped_by: str | None = None

    @property
    def action(self) -> Action | None:
        return None if self.cls is FailureClass.COMPLETED else (self.decision.action if self.decision else Action.STOP)


def effective_class(failure: Failure, facts: AttemptFacts) -> tuple[FailureClass, str]:
    """What the supervisor knows beats the text: a stall, an interrupt, a notice, its own stop."""
    cls = failure.cls
    if cls is FailureClass.COMPLETED and (failure.signal is not None or failure.exit_code not in (0, None)):
        # Killed after the training printed that it finished (a teardown hang, a late notice): done.
        return cls, failure.reason
    kind = facts.cause.kind if facts.cause is not None else None
    if kind is CauseKind.HANG:
        return FailureClass.HANG, facts.caused_by(kind) or "no progress: stalled"
    if kind is CauseKind.INTERRUPT:
        return FailureClass.CANCELLED, "interrupted by a person (Ctrl-C)"
    if facts.notice_class is not None:
        if cls is FailureClass.COMPLETED and facts.client_done:
            return cls, failure.reason
        return facts.notice_class, facts.notice_reason or f"stop notice ({facts.notice_class.value})"
    if kind is CauseKind.REQUEUE:
        return FailureClass.HARDWARE_FAULT, facts.caused_by(kind) or "stopped to requeue elsewhere"
    if kind is CauseKind.POLICY and cls is FailureClass.COMPLETED:
        return FailureClass.UNKNOWN, facts.caused_by(kind) or "stopped by a policy"
    return cls, failure.reason


def judge_attempt(failure: Failure, facts: AttemptFacts, history: Sequence[Any], ledger: Sequence[Any],
                  policy: Mapping[FailureClass, ClassPolicy], budget: BudgetConfig, job_id: str | None,
                  child_status: int) -> AttemptVerdict:
    """``history``: ledger records of the earlier attempts; ``ledger``: all of them, this one
    included. ``child_status``: the child's shell-style status (128+S for a signal), named in the
    reason when policy says stop; supervise itself then exits 4 (``ExitCode.STOPPED``)."""
    cls, reason = effective_class(failure, facts)
    if cls is not failure.cls:
        failure = replace(failure, cls=cls, reason=reason)
    if cls is FailureClass.COMPLETED:
        # The training finished: supervise exits 0. What it cost is judged as a whole, and a run that
        # lost more than its budget allows says so in its last words (the report's verdict is not ok).
        cost = judge(ledger, budget, job_id, final=True) if ledger else None
        if cost is not None and not cost.ok:
            return AttemptVerdict(cls, failure, RunOutcome.COMPLETE, ExitCode.OK,
                                  f"training complete, but budget {cost.budget} exceeded: {cost.reason}",
                                  budget=cost)
        return AttemptVerdict(cls, failure, RunOutcome.COMPLETE, ExitCode.OK, "training complete")
    stopped = facts.caused_by(CauseKind.POLICY)
    if stopped is not None:
        return AttemptVerdict(cls, failure, RunOutcome.STOPPED, ExitCode.STOPPED, stopped,
                              stopped_by=facts.cause.by if facts.cause is not None else None)
    requeue = facts.caused_by(CauseKind.REQUEUE)
    if requeue is not None:
        return AttemptVerdict(cls, failure, RunOutcome.REQUEUE, ExitCode.REQUEUE, requeue)
    if cls is FailureClass.CANCELLED:
        who = "interrupted by a person" if facts.caused_by(CauseKind.INTERRUPT) else f"cancelled by a person: {reason}"
        return AttemptVerdict(cls, failure, RunOutcome.INTERRUPTED, EXIT_CANCELLED, who, stopped_by="person")
    decision = decide(failure, history, policy, job_id, current=ledger[-1] if ledger else None,
                      min_progress=budget.min_durable_progress)
    verdict: BudgetVerdict | None = None
    if decision.action in (Action.RESTART, Action.REQUEUE):
        verdict = judge(ledger, budget, job_id)
        if not verdict.ok:
            return AttemptVerdict(cls, failure, RunOutcome.STOPPED, ExitCode.STOPPED,
                                  f"budget {verdict.budget} exhausted: {verdict.reason}", decision, verdict,
                                  stopped_by=verdict.budget)
    if decision.action is Action.RESTART:
        return AttemptVerdict(cls, failure, None, 0, decision.reason, decision, verdict, delay=decision.delay)
    if decision.action is Action.REQUEUE:
        return AttemptVerdict(cls, failure, RunOutcome.REQUEUE, ExitCode.REQUEUE, decision.reason, decision, verdict)
    # Policy said stop: supervise exits with its own code for that (4), never the child's status,
    # which could read as one of supervise's codes (2 usage, 3 locked, 75 requeue). The child's
    # status is in the reason and in run_end (child_exit_code).
    said = child_exit_text(failure.exit_code, failure.signal)
    return AttemptVerdict(cls, failure, RunOutcome.STOPPED, ExitCode.STOPPED, f"{decision.reason} ({said})",
                          decision, verdict,
                          stopped_by=getattr(decision, "stopped_by", None) or f"policy.{cls.value}")


def child_exit_text(exit_code: int | None, signum: int | None) -> str:
    """How the child ended, in words that cannot be taken for supervise's own exit code:
    ``the child exited 2``, ``the child was killed by SIGSEGV``."""
    if signum is not None:
        from ..signals import signal_name

        return f"the child was killed by {signal_name(signum)}"
    if exit_code is None:
        return "the child's exit status is unknown"
    return f"the child exited {exit_code}"


def failure_step(classified: int | None, last_seen: int | None) -> int | None:
    """The step an attempt failed at: the later of the step the classifier read before the first
    error and the last step the attempt reported. The child's stdout and stderr are two pipes read
    by two threads, so the error's traceback can land in the tail before the last step line that was
    printed first; the classifier then reads one step too early, and a crash that recurs at the same
    step would look like it moved (the budget's "same failure step" check)."""
    if classified is None or last_seen is None:
        return classified if classified is not None else last_seen
    return max(classified, last_seen)
