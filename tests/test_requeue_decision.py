"""The one requeue decision (supervisor/slurm/requeue_policy.py), as tables: every row a case the code
tells apart, with the outcome a user sees (does the job come back, how, and what the log says why)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from supervisor.slurm.requeue_policy import (
    RequeueFacts,
    RequeueFallback,
    RequeueHow,
    already_requeued,
    call_fallback,
    node_failure_requeue,
    preempted_exit,
    requeue_decision,
    slurm_requeues_on_exit,
)
from supervisor.slurm.version import SlurmVersion
from supervisor.states import FailureClass as FC

V22, V24, V26 = SlurmVersion(22, 5, 8), SlurmVersion(24, 11, 5), SlurmVersion(26, 5, 5)
NONE, SCONTROL, SLURM, RESUBMIT = RequeueHow.NONE, RequeueHow.SCONTROL, RequeueHow.SLURM_WILL, RequeueHow.RESUBMIT


def facts(**kw) -> RequeueFacts:
    base = dict(child_outcome=FC.PREEMPTED, in_slurm=True, job_requeueable=True, slurm_version=V22,
                notice_class=FC.PREEMPTED, already_requeued=False, policy="auto", requeue_on_time_limit=True)
    base.update(kw)
    return RequeueFacts(**base)


DECISIONS = [
    # (facts, do, how, words in the reason)
    (dict(child_outcome=FC.COMPLETED), False, NONE, "training is complete"),
    (dict(child_outcome="completed", notice_class=None), False, NONE, "training is complete"),
    (dict(child_outcome=FC.CANCELLED, notice_class=None), False, NONE, "cancelled by a person"),
    (dict(notice_class=FC.CANCELLED), False, NONE, "cancelled by a person"),
    (dict(already_requeued=True), False, NONE, "never twice"),
    (dict(job_state="PENDING"), False, NONE, "already requeued (state PENDING)"),
    (dict(job_state="requeue_hold"), False, NONE, "already requeued"),
    (dict(job_state="SUSPENDED"), True, SCONTROL, "finishes a job that exits during its grace"),  # not requeued
    (dict(in_slurm=False), False, NONE, "not a Slurm job"),
    (dict(policy="never"), False, NONE, "preemption.requeue=never"),
    # the time limit: Slurm never requeues it, whatever the version
    (dict(child_outcome=FC.TIME_LIMIT, notice_class=None, slurm_version=V24), True, SCONTROL, "never requeues"),
    (dict(child_outcome=FC.NATIVE_CRASH, notice_class=FC.TIME_LIMIT), True, SCONTROL, "time limit"),
    (dict(child_outcome=FC.TIME_LIMIT, requeue_on_time_limit=False), False, NONE, "requeue_on_time_limit=false"),
    (dict(child_outcome=FC.TIME_LIMIT, job_requeueable=False), False, NONE, "--no-requeue"),
    # a preemption: by version and requeueability
    (dict(slurm_version=V22), True, SCONTROL, "(< 24.05) finishes a job that exits during its grace"),
    (dict(slurm_version=V24), True, SLURM, "requeues a preempted job that exits during its grace"),
    (dict(slurm_version=V26), True, SLURM, "counts toward MaxBatchRequeue"),
    (dict(slurm_version=None), True, SCONTROL, "version unknown"),
    (dict(slurm_version=V24, job_requeueable=None), True, SCONTROL, "requeueability unknown: requeueing explicitly"),
    (dict(slurm_version=V24, policy="always"), True, SCONTROL, "preemption.requeue=always"),
    (dict(slurm_version=V22, policy="always"), True, SCONTROL, "finishes a job"),
    (dict(job_requeueable=False), False, NONE, "run it under `supervise submit`"),
    (dict(job_requeueable=False, policy="always"), True, RESUBMIT, "resubmit the batch script as a new job"),
    (dict(child_outcome=FC.NATIVE_CRASH), True, SCONTROL, "preempted"),  # the notice names the cause
    # a failure the policy requeues: never Slurm's own doing
    (dict(child_outcome=FC.HARDWARE_FAULT, notice_class=None, exclude_nodes=("n2",), slurm_version=V24),
     True, SCONTROL, "hardware_fault on n2: scontrol requeue; excluding n2"),
    (dict(child_outcome=FC.NODE_FAILURE, notice_class=None), True, SCONTROL, "node_failure on this node"),
    (dict(child_outcome=FC.NATIVE_CRASH, notice_class=None), True, SCONTROL, "the failure policy says requeue"),
    (dict(child_outcome=FC.NATIVE_CRASH, notice_class=None, job_requeueable=None), True, SCONTROL,
     "requeueability unknown: trying scontrol requeue"),
    (dict(child_outcome="no such class", notice_class=None), True, SCONTROL, "unknown: the failure policy"),
]


@pytest.mark.parametrize("kw, do, how, words", DECISIONS)
def test_requeue_decision_table(kw, do, how, words) -> None:
    decision = requeue_decision(facts(**kw))
    assert (decision.do, decision.how) == (do, how), decision.reason
    assert words in decision.reason
    assert decision.to_event()["how"] == how.value and decision.to_event()["planned"] is do
    if not do:
        assert decision.exclude == ()


@pytest.mark.parametrize("version, restarts, how_kw, held", [
    (V24, 4, {}, True),  # the 5th requeue of a grace exit: Slurm holds the job after it
    (V26, 9, {}, True),
    (V24, 3, {}, False),
    (V24, None, {}, False),  # no job record: nothing to say
    (V22, 9, {}, False),  # 22.05 requeues explicitly: no batch-requeue count, no hold
    (V24, 9, {"policy": "always"}, False),  # scontrol requeue does not count toward MaxBatchRequeue
])
def test_a_hold_after_max_batch_requeue_is_said_with_the_command(version, restarts, how_kw, held) -> None:
    decision = requeue_decision(facts(slurm_version=version, restarts=restarts, job_id=7, **how_kw))
    assert decision.do
    assert (decision.held is not None) is held
    if held:
        assert "`scontrol release 7`" in (decision.held or "") and decision.how is SLURM


def test_an_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="allowed: auto, always, never"):
        requeue_decision(facts(policy="sometimes"))


@pytest.mark.parametrize("version, cause, requeues", [
    (V22, FC.PREEMPTED, False), (V24, FC.PREEMPTED, True), (V26, "preempted", True), (None, FC.PREEMPTED, None),
    ((23, 11, 10), FC.PREEMPTED, False), ("slurm 24.05.0", FC.PREEMPTED, True),
    (V24, FC.TIME_LIMIT, False), (V24, FC.HARDWARE_FAULT, False), (V24, "node_failure", False),
])
def test_what_slurm_does_when_the_job_exits_now(version, cause, requeues) -> None:
    assert slurm_requeues_on_exit(version, cause).requeues is requeues


@pytest.mark.parametrize("version, requeueable, requeues, words", [
    (V22, True, False, "22.05 finishes a preempted job"),
    (V24, True, True, "counts toward MaxBatchRequeue"),
    (V24, False, False, "not requeueable"),
    (None, True, None, "depends on the version"),
])
def test_a_preempted_exit_as_the_stop_cause_reads_it(version, requeueable, requeues, words) -> None:
    will = preempted_exit(version, requeueable)
    assert will.requeues is requeues and words in will.reason


@pytest.mark.parametrize("requeueable, batch, pending, requeues", [
    (True, 1, False, True), (False, 1, False, None), (True, 0, False, None), (False, 0, True, True),
])
def test_a_node_failure_is_requeued_by_slurm_for_a_requeueable_batch_job(requeueable, batch, pending,
                                                                         requeues) -> None:
    assert node_failure_requeue(requeueable, batch, pending) is requeues


@pytest.mark.parametrize("pending, restarts, expected, already", [
    (True, 0, 0, True), (False, 1, 0, True), (False, 1, 1, False), (False, 3, None, False),
])
def test_a_requeue_is_asked_for_once(pending, restarts, expected, already) -> None:
    assert already_requeued(pending, restarts, expected) is already


@pytest.mark.parametrize("cause, version, requeueable, fallback", [
    (FC.PREEMPTED, V22, True, RequeueFallback.STAY_FOR_SLURM),
    (None, None, True, RequeueFallback.STAY_FOR_SLURM),
    (FC.PREEMPTED, V24, True, RequeueFallback.SLURM_REQUEUES_EXIT),
    (FC.PREEMPTED, V24, None, RequeueFallback.SLURM_REQUEUES_EXIT),
    (FC.PREEMPTED, V24, False, RequeueFallback.NOTHING),
    (FC.TIME_LIMIT, V24, True, RequeueFallback.NOTHING),
])
def test_what_brings_the_job_back_when_the_call_cannot_be_made(cause, version, requeueable, fallback) -> None:
    assert call_fallback(cause, version, requeueable)[0] is fallback


def test_slurms_requeue_behaviour_is_read_in_one_module() -> None:
    # A second place that reads these capabilities would be a second requeue decision to keep in step.
    pkg = Path(__file__).resolve().parents[1] / "supervisor"
    wanted = {"requeues_on_exit_during_grace", "holds_after_max_batch_requeue", "grace_exit_counts_toward_max_batch_requeue"}
    texts = {p: p.read_text() for p in pkg.rglob("*.py")}
    mentions = [p for p, text in texts.items() if any(word in text for word in wanted)]  # parse only these
    readers = sorted(str(p.relative_to(pkg)) for p in mentions
                     if any(isinstance(node, ast.Attribute) and node.attr in wanted
                            for node in ast.walk(ast.parse(texts[p]))))
    assert readers == ["slurm/requeue_policy.py", "slurm/version.py"]
