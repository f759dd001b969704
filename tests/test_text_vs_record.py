"""Printed text never overrides the Slurm job record (issue 25, item 3).

Any program can print ``slurmstepd: error: *** STEP 12.0 ON n1 CANCELLED AT ... DUE TO PREEMPTION ***``.
A preemption, time limit or node failure comes from Slurm (a notice and the job record) only: a
RUNNING job that prints such a line and crashes is a crash, and is reported as one; a node named in
the output counts against nothing unless it is one of the job's own nodes. Plain data first, then
the run loop on fakes, then real processes with a stand-in ``scontrol`` on PATH.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import sys
from pathlib import Path

from supervisor.budget import judge, ledger_from_events
from supervisor.config import BudgetConfig
from supervisor.failures import SlurmEvidence, classify, confirmed, evidence_node
from supervisor.run.notice import settle_cause, slurm_evidence
from supervisor.slurm.stop_cause import stop_cause
from supervisor.states import FailureClass as FC
from supervisor.states import RunOutcome

from fakes import ChildScript, Job
from helpers import events_named, read_events, run_supervise
from test_run_loop import heartbeats, make

PREEMPT_LINE = "slurmstepd: error: *** STEP 12.0 ON n1 CANCELLED AT 2026-12-02T01:00:00 DUE TO PREEMPTION ***"
LIMIT_LINE = "slurmstepd: error: *** STEP 12.0 ON n1 CANCELLED AT 2026-12-02T01:00:00 DUE TO TIME LIMIT ***"
CRASH = PREEMPT_LINE + "\nFatal Python error: Segmentation fault\nSegmentation fault (core dumped)\n"
RUNNING = SlurmEvidence(confirmed=None, in_slurm=True, record="JobState=RUNNING, no PreemptTime")

# --------------------------------------------------------------------------------------------- plain data


def test_a_crash_after_a_printed_preemption_line_is_the_crash_when_the_record_says_running():
    failure = classify(139, None, CRASH, slurm=RUNNING)
    assert failure.cls is FC.NATIVE_CRASH, failure.reason
    assert failure.text_claim.startswith("preemption, contradicted by the job record (JobState=RUNNING")
    assert "DUE TO PREEMPTION" in failure.text_claim


def test_printed_preemption_or_time_limit_then_exit_1_is_never_a_scheduler_class_without_slurm():
    for line in (PREEMPT_LINE, LIMIT_LINE, "srun: error: Node failure on n7"):
        for evidence in (None, RUNNING, SlurmEvidence(in_slurm=True)):  # local run; RUNNING; record unreadable
            failure = classify(1, None, line + "\n", slurm=evidence)
            assert failure.cls not in (FC.PREEMPTED, FC.TIME_LIMIT, FC.NODE_FAILURE), (line, evidence)
            assert failure.text_claim, (line, evidence)


def test_the_same_lines_count_when_slurm_confirms_the_end():
    assert classify(143, None, PREEMPT_LINE + "\n", slurm=confirmed(FC.PREEMPTED)).cls is FC.PREEMPTED
    assert classify(143, None, LIMIT_LINE + "\n", slurm=confirmed(FC.TIME_LIMIT)).cls is FC.TIME_LIMIT


def test_a_local_run_says_there_is_no_slurm_to_confirm_it():
    failure = classify(1, None, PREEMPT_LINE + "\n")
    assert "no Slurm job record" in failure.text_claim and failure.cls is FC.UNKNOWN


def test_the_evidence_the_loop_builds_from_a_running_record_confirms_nothing():
    info = Job(state="RUNNING", end_time=1_003_600.0)
    verdict = stop_cause(info, 1_000_000.0, None, version=(22, 5, 8))
    cls, _ = settle_cause(None, verdict, 1)
    evidence = slurm_evidence(None, verdict, cls, in_slurm=True)
    assert evidence.confirmed is None and evidence.record == "JobState=RUNNING, no PreemptTime"
    preempted = Job(state="RUNNING", preempt_time=1_000_000.0, end_time=1_000_030.0)
    verdict = stop_cause(preempted, 1_000_001.0, "TERM", version=(22, 5, 8))
    from supervisor.preemption import Notice
    notice = Notice(source="signal", signal="TERM", received_at=1_000_000.5, deadline=1_000_030.0,
                    preempt_time=1_000_000.0, grace=29.5)
    cls, _ = settle_cause(notice, verdict, 143)
    assert slurm_evidence(notice, verdict, cls, in_slurm=True).confirmed is FC.PREEMPTED


def test_node_evidence_only_against_nodes_of_the_allocation():
    assert evidence_node("n7", "n1", ("n1",)).node is None
    assert "not one of this job's nodes (n1)" in evidence_node("n7", "n1", ("n1",)).reason
    assert evidence_node("n3", "n1", ("n1", "n2", "n3", "n7")).node == "n3"
    assert evidence_node(None, "n1", ("n1",)).node == "n1"


# --------------------------------------------------------------------------------------------- the loop, fakes


def _crash_script(line: str = PREEMPT_LINE) -> ChildScript:
    return ChildScript([*heartbeats(1, 5), (0.7, "line", line), (0.75, "line", "Segmentation fault (core dumped)"),
                        (0.8, "die", signal.SIGSEGV)])


def test_a_running_job_that_prints_preemption_and_crashes_is_reported_as_a_crash_never_requeued(tmp_path: Path):
    runner, w = make(tmp_path, [_crash_script()], job_id="90",
                     slurm_record=lambda now: Job(state="RUNNING", end_time=1_003_600.0))
    result = runner.run()
    assert w["slurm"].requeues == [] and result.outcome is RunOutcome.STOPPED
    assert result.exit_code != 75
    ends = events_named(w["run_dir"], "attempt_end")
    assert {e["class"] for e in ends} == {"native_crash"} and len(ends) == 3  # restarted until the crash loop stop
    failure = events_named(w["run_dir"], "failure")[0]
    assert failure["text_claim"].startswith("preemption, contradicted by the job record (JobState=RUNNING")
    run_end = events_named(w["run_dir"], "run_end")[-1]
    assert run_end["stopped_by"] == "same_failure_limit" and "native_crash" in run_end["reason"], run_end
    assert "preempt" not in run_end["reason"]
    # and no "preemptions in a row" verdict from the ledger
    verdict = judge(ledger_from_events(runner.ctx.read_events()), BudgetConfig(max_requeues_without_progress=1), "90")
    assert verdict.ok or verdict.budget != "max_requeues_without_progress", verdict.reason
    assert verdict.numbers["requeues_without_progress"] == 0


def test_a_local_run_that_prints_preemption_then_exits_1_is_not_requeued(tmp_path: Path):
    script = ChildScript([*heartbeats(1, 5), (0.7, "line", PREEMPT_LINE), (0.8, "exit", 1)])
    runner, w = make(tmp_path, [script], sets=("policy.unknown.retries=0",))
    result = runner.run()
    assert result.outcome is RunOutcome.STOPPED and result.exit_code != 75
    failure = events_named(w["run_dir"], "failure")[0]
    assert failure["class"] == "unknown" and "no Slurm job record" in failure["text_claim"]


def test_a_printed_node_failure_on_another_node_adds_no_evidence_and_excludes_nothing(tmp_path: Path):
    script = ChildScript([*heartbeats(1, 5), (0.7, "line", "srun: error: Node failure on n7"), (0.8, "exit", 1)])
    runner, w = make(tmp_path, [script], job_id="91", sets=("policy.unknown.retries=0",),
                     slurm_record=lambda now: Job(state="RUNNING", end_time=1_003_600.0))
    runner.ctx.slurm_env = dataclasses.replace(runner.ctx.slurm_env, nodelist="n1")
    result = runner.run()
    assert result.outcome is not RunOutcome.REQUEUE and w["slurm"].requeues == []
    ledger = tmp_path / "nodes.jsonl"
    records = [json.loads(x) for x in ledger.read_text().splitlines()] if ledger.exists() else []
    assert not [r for r in records if r.get("node") in ("n7", "n1") and r.get("kind") == "failure"], records
    assert "node failure, contradicted by the job record" in events_named(w["run_dir"], "failure")[0]["text_claim"]


def test_a_hardware_fault_named_on_a_node_outside_the_allocation_is_not_held_against_it(tmp_path: Path):
    xid = "srun: error: n7: task 0: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."
    script = ChildScript([*heartbeats(1, 5), (0.7, "line", xid), (0.8, "exit", 1)])
    runner, w = make(tmp_path, [script], job_id="92", sets=("policy.hardware_fault.action=stop",),
                     slurm_record=lambda now: Job(state="RUNNING", end_time=1_003_600.0))
    runner.ctx.slurm_env = dataclasses.replace(runner.ctx.slurm_env, nodelist="n[1-3]")
    runner.run()
    failure = events_named(w["run_dir"], "failure")[0]
    assert failure["class"] == "hardware_fault", failure
    ledger = tmp_path / "nodes.jsonl"
    records = [json.loads(x) for x in ledger.read_text().splitlines()] if ledger.exists() else []
    assert not [r for r in records if r.get("kind") == "failure"], records
    warning = [e for e in events_named(w["run_dir"], "warning") if "no node evidence" in e.get("reason", "")]
    assert warning and warning[0]["node"] == "n7" and "not one of this job's nodes (n1, n2, n3" in warning[0]["reason"]


def test_a_genuine_preemption_still_requeues_and_keeps_the_printed_line_as_evidence(tmp_path: Path):
    script = ChildScript([*heartbeats(1, 20)], on_signal={signal.SIGTERM: ("exit", 1, 0.2)})
    script.steps.append((1.1, "line", PREEMPT_LINE))
    runner, w = make(tmp_path, [script], signals=[(1.0, signal.SIGTERM)], job_id="93",
                     slurm_record=lambda now: Job(preempt_time=1_000_001.0, end_time=1_000_031.0),
                     sets=("preemption.emergency_save=false",))
    result = runner.run()
    assert result.outcome is RunOutcome.REQUEUE and len(w["slurm"].requeues) == 1
    failure = events_named(w["run_dir"], "failure")[0]
    assert failure["class"] == "preempted" and "text_claim" not in failure


# --------------------------------------------------------------------------------------------- real processes

RECORD = Path(__file__).parent / "data" / "slurm" / "22.05" / "signal_term_running.txt"
FAKE_SCONTROL = f"""#!/bin/sh
case "$1" in
  --version|-V) echo "slurm 22.05.8"; exit 0 ;;
  show) [ "$2" = job ] && cat {RECORD} && exit 0; exit 1 ;;
  requeue) echo requeued >> "$(dirname "$0")/requeues"; exit 0 ;;
  *) exit 1 ;;
esac
"""
CHILD = ("import os, sys, time\n"
         "print('step 1', flush=True)\n"
         f"print({PREEMPT_LINE!r}, flush=True)\n"
         "print('Segmentation fault (core dumped)', flush=True)\n"
         "sys.exit(139)\n")


def test_real_child_printing_preemption_with_the_record_running_is_a_crash_not_a_requeue(tmp_path: Path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "scontrol").write_text(FAKE_SCONTROL)
    (bindir / "scontrol").chmod(0o755)
    run_dir = tmp_path / "run"
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "SLURM_JOB_ID": "3", "SLURM_RESTART_COUNT": "0",
           "SLURMD_NODENAME": "n1", "SLURM_JOB_NODELIST": "n1"}
    res = run_supervise(["run", "--run-dir", str(run_dir), "--set", "policy.native_crash.retries=0",
                         "--set", f"nodes.ledger={tmp_path / 'nodes.jsonl'}", "--", sys.executable, "-c", CHILD],
                        env=env, timeout=120)
    assert res.returncode not in (0, 75), res.stderr[-3000:]
    assert not (bindir / "requeues").exists()
    failure = events_named(run_dir, "failure")[0]
    assert failure["class"] == "native_crash", failure
    assert failure["text_claim"].startswith("preemption, contradicted by the job record (JobState=RUNNING")
    assert not events_named(run_dir, "requeue")
    assert read_events(run_dir)[-1]["event"] == "run_end"


def test_supervise_classify_shows_the_claim_and_takes_slurms_word_by_hand():
    from click.testing import CliRunner

    from supervisor.cli import main

    log = str(Path(__file__).parent / "data" / "logs" / "slurm_preempted.log")
    alone = CliRunner().invoke(main, ["classify", log, "--exit-code", "143"])
    assert alone.exit_code == 0 and "class:    preempted" not in alone.output
    assert "text claim: preemption, not confirmed: no Slurm job record" in alone.output
    told = CliRunner().invoke(main, ["classify", log, "--exit-code", "143", "--slurm-says", "preempted"])
    assert told.exit_code == 0 and "class:    preempted" in told.output and "text claim" not in told.output
