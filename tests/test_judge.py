"""After an attempt (``supervisor/run/judge.py``) as a table: what the classifier read x why the
supervisor stopped the child (the stop machine's one cause) x what Slurm said -> the class, what the
run does next, supervise's exit code and who stopped it.

What the table pins, in words:

* the supervisor's own knowledge beats the text: a stall it found is a hang, a person's Ctrl-C is a
  cancel, a notice is a preemption or time limit, a policy stop stops the run with that policy named;
* a training that printed that it finished is complete whatever ended it afterwards, and one the
  client said was done is complete even after a notice;
* supervise's exit code is its own (4 stopped, 75 requeue, 130 a person), never the child's status.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from supervisor.config import BudgetConfig
from supervisor.errors import ExitCode
from supervisor.failures import Failure
from supervisor.policy import DEFAULT_POLICY
from supervisor.run.judge import EXIT_CANCELLED, AttemptFacts, judge_attempt
from supervisor.run.stop import Cause, CauseKind
from supervisor.states import FailureClass as FC, RunOutcome

STALL = Cause(CauseKind.HANG, "no progress for 600 s")
CTRL_C = Cause(CauseKind.INTERRUPT, "interrupted by a person")
AUDIT = Cause(CauseKind.POLICY, "resume audit failed: started at 0, expected 500", by="resume_audit")
LOSS = Cause(CauseKind.POLICY, "loss anomaly: nan", by="loss_policy")
SLOW = Cause(CauseKind.REQUEUE, "slow node: n3 at 40% of its peers")
NOTICE = Cause(CauseKind.NOTICE, "save fits: block")


def failure(cls: FC, exit_code: int | None = 1, signal: int | None = None) -> Failure:
    return Failure(cls=cls, exit_code=exit_code, signal=signal, reason=f"text says {cls.value}")


@dataclass(frozen=True)
class Row:
    name: str
    failure: Failure
    facts: AttemptFacts
    cls: FC
    outcome: RunOutcome | None  # None: restart in place
    exit_code: int
    stopped_by: str | None = None


ROWS = [
    # The text alone decides when the supervisor knows nothing more.
    Row("completed", failure(FC.COMPLETED, 0), AttemptFacts(), FC.COMPLETED, RunOutcome.COMPLETE, ExitCode.OK),
    Row("crash restarts", failure(FC.NATIVE_CRASH, None, 11), AttemptFacts(), FC.NATIVE_CRASH, None, 0),
    Row("oom stops", failure(FC.CUDA_OOM), AttemptFacts(), FC.CUDA_OOM, RunOutcome.STOPPED, ExitCode.STOPPED,
        "policy.cuda_oom.action"),
    Row("hardware requeues", failure(FC.HARDWARE_FAULT), AttemptFacts(), FC.HARDWARE_FAULT, RunOutcome.REQUEUE,
        ExitCode.REQUEUE),
    # A stall the supervisor found is a hang, whatever the text of a killed child says.
    Row("stall", failure(FC.KILLED, None, 9), AttemptFacts(cause=STALL), FC.HANG, None, 0),
    Row("stall after a notice", failure(FC.KILLED, None, 9), AttemptFacts(cause=STALL, notice_class=FC.PREEMPTED),
        FC.HANG, None, 0),
    # A person's Ctrl-C: interrupted, 130, never restarted.
    Row("ctrl-c", failure(FC.PYTHON_EXCEPTION), AttemptFacts(cause=CTRL_C), FC.CANCELLED, RunOutcome.INTERRUPTED,
        EXIT_CANCELLED, "person"),
    Row("ctrl-c during a notice", failure(FC.KILLED, None, 15),
        AttemptFacts(cause=CTRL_C, notice_class=FC.PREEMPTED), FC.CANCELLED, RunOutcome.INTERRUPTED,
        EXIT_CANCELLED, "person"),
    # Slurm's word on a notice: preempted or time limit requeue; scancel is a person's.
    Row("preempted", failure(FC.KILLED, None, 15), AttemptFacts(cause=NOTICE, notice_class=FC.PREEMPTED),
        FC.PREEMPTED, RunOutcome.REQUEUE, ExitCode.REQUEUE),
    Row("time limit", failure(FC.PYTHON_EXCEPTION), AttemptFacts(cause=NOTICE, notice_class=FC.TIME_LIMIT),
        FC.TIME_LIMIT, RunOutcome.REQUEUE, ExitCode.REQUEUE),
    Row("scancel without a notice", failure(FC.KILLED, None, 15),
        AttemptFacts(notice_class=FC.CANCELLED, notice_reason="scancel by alice"), FC.CANCELLED,
        RunOutcome.INTERRUPTED, EXIT_CANCELLED, "person"),
    Row("done before the notice", failure(FC.COMPLETED, 0),
        AttemptFacts(cause=NOTICE, notice_class=FC.PREEMPTED, client_done=True), FC.COMPLETED,
        RunOutcome.COMPLETE, ExitCode.OK),
    Row("not done at the notice", failure(FC.COMPLETED, 0), AttemptFacts(cause=NOTICE, notice_class=FC.PREEMPTED),
        FC.PREEMPTED, RunOutcome.REQUEUE, ExitCode.REQUEUE),
    Row("finished, then killed", failure(FC.COMPLETED, None, 9), AttemptFacts(cause=STALL), FC.COMPLETED,
        RunOutcome.COMPLETE, ExitCode.OK),
    # A policy stop names its policy; its class is the text's (unknown for an exit 0 it forced).
    Row("resume audit", failure(FC.KILLED, None, 15), AttemptFacts(cause=AUDIT), FC.KILLED, RunOutcome.STOPPED,
        ExitCode.STOPPED, "resume_audit"),
    Row("resume audit, exit 0", failure(FC.COMPLETED, 0), AttemptFacts(cause=AUDIT), FC.UNKNOWN,
        RunOutcome.STOPPED, ExitCode.STOPPED, "resume_audit"),
    Row("loss policy during a notice", failure(FC.KILLED, None, 15),
        AttemptFacts(cause=LOSS, notice_class=FC.PREEMPTED), FC.PREEMPTED, RunOutcome.STOPPED, ExitCode.STOPPED,
        "loss_policy"),
    # A slow node: the attempt is requeued away from it, as hardware.
    Row("slow node", failure(FC.KILLED, None, 15), AttemptFacts(cause=SLOW), FC.HARDWARE_FAULT, RunOutcome.REQUEUE,
        ExitCode.REQUEUE),
    Row("slow node during a notice", failure(FC.KILLED, None, 15),
        AttemptFacts(cause=SLOW, notice_class=FC.PREEMPTED), FC.PREEMPTED, RunOutcome.REQUEUE, ExitCode.REQUEUE),
]


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_every_cause_against_the_text_and_slurm(row: Row) -> None:
    verdict = judge_attempt(row.failure, row.facts, [], [], DEFAULT_POLICY, BudgetConfig(), None,
                            row.failure.exit_code or 0)
    assert (verdict.cls, verdict.outcome, verdict.exit_code, verdict.stopped_by) == \
        (row.cls, row.outcome, row.exit_code, row.stopped_by)
    assert verdict.reason  # always a reason a person can read


def test_the_table_covers_every_cause_kind_but_the_lost_lock() -> None:
    # A lost lock never reaches the judge: the loop ends the run with exit 3 before it.
    kinds = {r.facts.cause.kind for r in ROWS if r.facts.cause is not None}
    assert kinds == set(CauseKind) - {CauseKind.LOCK_LOST}


def test_a_policy_stop_says_why_and_the_child_status_never_becomes_supervises_exit_code() -> None:
    verdict = judge_attempt(failure(FC.PYTHON_EXCEPTION, 75), AttemptFacts(), [], [], DEFAULT_POLICY, BudgetConfig(),
                            None, 75)
    assert verdict.exit_code == ExitCode.STOPPED and "the child exited 75" in verdict.reason
    audit = judge_attempt(failure(FC.KILLED, None, 15), AttemptFacts(cause=AUDIT), [], [], DEFAULT_POLICY,
                          BudgetConfig(), None, 143)
    assert audit.reason == AUDIT.why
