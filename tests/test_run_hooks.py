"""The run loop's hook points (supervisor/run/hooks.py), on fakes with a fake clock: the core runs
without any add-on, reaches the add-ons it is given at the moments it names, acts on the faults they
find (a node to keep out of the requeue), and goes on when one of them raises."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from supervisor.failures import Failure
from supervisor.run.attempt import AttemptState
from supervisor.run.context import RunContext
from supervisor.run.hooks import AddOn, Heartbeat, NodeFault
from supervisor.states import FailureClass, RunOutcome

from fakes import ChildScript, Job
from helpers import events_named
from test_run_loop import heartbeats, make

XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."
RUNNING_JOB = {"slurm_record": lambda now: Job(preempt_time=None, end_time=1_003_600.0, requeue=True)}


class Recorder(AddOn):
    """Notes each hook the loop calls; finds what it is told to."""

    def __init__(self, fault: NodeFault | None = None, leave: NodeFault | None = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.fault, self.leave = fault, leave

    def before_attempt(self, ctx: RunContext, state: AttemptState) -> NodeFault | None:
        self.calls.append(("before_attempt", state.attempt))
        return self.fault

    def on_launch(self, ctx: RunContext, state: AttemptState, argv: Sequence[str]) -> None:
        self.calls.append(("on_launch", state.attempt))

    def on_heartbeat(self, ctx: RunContext, state: AttemptState, beat: Heartbeat) -> None:
        self.calls.append(("heartbeat", beat.step))

    def node_to_leave(self, ctx: RunContext, state: AttemptState, now: float) -> NodeFault | None:
        leave, self.leave = self.leave, None
        return leave

    def on_failure_recorded(self, ctx: RunContext, state: AttemptState, failure: Failure, cls: FailureClass,
                            reason: str) -> None:
        self.calls.append(("failure", cls.value))

    def nodes_to_exclude(self, ctx: RunContext, state: AttemptState, exclude: tuple[str, ...]) -> tuple[str, ...]:
        self.calls.append(("nodes_to_exclude", exclude))
        return tuple(sorted({*exclude, "n2"}))

    def at_teardown(self, noticed: bool) -> None:
        self.calls.append(("at_teardown", noticed))


class Broken(AddOn):
    """Raises in every hook."""

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("_"):
            return object.__getattribute__(self, name)

        def boom(*args: Any) -> Any:
            raise RuntimeError(f"{name} is broken")
        return boom


def ledger_kinds(tmp_path: Path) -> list[str]:
    ledger = tmp_path / "nodes.jsonl"
    return [json.loads(x)["kind"] for x in ledger.read_text().splitlines()] if ledger.exists() else []


def test_the_core_runs_without_any_add_on_and_the_node_ledger_is_an_add_on(tmp_path: Path) -> None:
    # The same hardware fault, run bare and with the node-health add-on: the outcome is the loop's,
    # the ledger record is the add-on's; a configured GPU preflight needs its add-on too.
    crash = [ChildScript([*heartbeats(1, 3), (0.5, "line", XID), (0.6, "exit", 1)])]
    bare, w = make(tmp_path / "bare", crash, sets=("preflight=[gpu]",), add_ons=[])
    assert bare.run().outcome is RunOutcome.REQUEUE
    assert events_named(w["run_dir"], "failure")[0]["class"] == "hardware_fault"
    assert not events_named(w["run_dir"], "preflight") and ledger_kinds(tmp_path / "bare") == []
    crash = [ChildScript([*heartbeats(1, 3), (0.5, "line", XID), (0.6, "exit", 1)])]
    full, w = make(tmp_path / "full", crash)
    assert full.run().outcome is RunOutcome.REQUEUE
    assert ledger_kinds(tmp_path / "full") == ["failure"]


def test_a_fault_found_before_the_attempt_requeues_away_from_the_node_without_launching(tmp_path: Path) -> None:
    add_on = Recorder(fault=NodeFault("n1", "GPU preflight failed: GPU 0 differed"))
    runner, w = make(tmp_path, [ChildScript([])], job_id="93", add_ons=[add_on], **RUNNING_JOB)
    result = runner.run()
    assert result.outcome is RunOutcome.REQUEUE and "GPU preflight failed" in result.reason
    assert w["starter"].children == []  # never launched on the faulty node
    assert w["slurm"].requeues and set(w["slurm"].requeues[0][1]) == {"n1", "n2"}  # the loop's n1, the add-on's n2
    assert add_on.calls == [("before_attempt", 1), ("nodes_to_exclude", ("n1",)), ("at_teardown", False)]


def test_the_loop_tells_its_add_ons_of_launches_heartbeats_and_failures_and_leaves_a_node_they_name(
        tmp_path: Path) -> None:
    add_on = Recorder(leave=NodeFault("n2", "n2 steps 2.0x slower than its peers"))
    script = ChildScript([*heartbeats(1, 30)], on_signal={15: ("exit", 0, 0.2)})
    runner, w = make(tmp_path, [script], job_id="94", add_ons=[add_on], sets=("slow_node.action=requeue",),
                     **RUNNING_JOB)
    result = runner.run()
    assert result.outcome is RunOutcome.REQUEUE and "slow node: n2 steps 2.0x slower" in result.reason
    assert w["slurm"].requeues and "n2" in w["slurm"].requeues[0][1]
    names = [c[0] for c in add_on.calls]
    assert names[:3] == ["before_attempt", "on_launch", "heartbeat"] and names[-1] == "at_teardown"
    assert ("heartbeat", 1) in add_on.calls and ("failure", "hardware_fault") in add_on.calls
    assert "nodes_to_exclude" in names


def test_an_add_on_that_raises_never_takes_the_run_down(tmp_path: Path) -> None:
    script = ChildScript([*heartbeats(1, 5), (0.7, "msg", "done", {}), (0.8, "exit", 0)])
    recorder = Recorder()
    runner, w = make(tmp_path, [script], add_ons=[Broken(), recorder])
    result = runner.run()
    assert result.outcome is RunOutcome.COMPLETE and result.exit_code == 0
    assert ("on_launch", 1) in recorder.calls and ("at_teardown", False) in recorder.calls  # the next one still told
