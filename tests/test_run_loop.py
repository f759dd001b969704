"""The run loop on fakes (tests/fakes.py): deterministic, fake time, milliseconds per test.

Each test scripts a child (output lines, control messages, saves, its exit, how it reacts to
signals), the signals the supervisor receives and what Slurm answers, then checks what a user
cares about: when the child was signalled, what was decided, and how the run ended. The outer
tiers (real processes: test_run_local.py, test_run_restarts.py; a real Slurm cluster:
test_*_cluster.py) cover the same behaviours end to end.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from supervisor.config import load_config
from supervisor.run.loop import Runner
from supervisor.addons.gpu_preflight import GpuPreflight
from supervisor.run.hooks import AddOn
from supervisor.addons.node_health import NodeHealth
from supervisor.run.stop import UNCHANGED_EXIT_WAIT
from supervisor.states import RunOutcome

from fakes import ChildScript, FakeChannel, Msg, FakeClock, FakeSlurm, FakeStarter, FakeWaker, Job
from helpers import events_named

TERM, KILL = signal.SIGTERM, signal.SIGKILL


def make(tmp_path: Path, scripts: list[ChildScript], *, signals: list[tuple[float, int]] | None = None,
         slurm_record: Any = None, slurm_answers: bool = True, job_id: str | None = None,
         sets: tuple[str, ...] = (), add_ons: list[AddOn] | None = None) -> tuple[Runner, dict[str, Any]]:
    """The loop on fakes, with the add-ons of a full run but the manifest (its probes start real
    interpreters) unless ``add_ons`` says otherwise."""
    clock = FakeClock()
    waker = FakeWaker(clock, signals)
    channel = FakeChannel()
    channel.clock = clock
    run_dir = tmp_path / "run"
    ckpt = run_dir / "checkpoints"
    ckpt.mkdir(parents=True)
    starter = FakeStarter(scripts, clock, channel, ckpt)
    slurm = FakeSlurm(clock, slurm_record, answers=slurm_answers)
    env = {"PATH": "/usr/bin:/bin"}
    if job_id:
        env.update({"SLURM_JOB_ID": job_id, "SLURM_RESTART_COUNT": "0", "SLURMD_NODENAME": "n1"})
    cfg = load_config(None, environ={}, cli={"run_dir": str(run_dir)},
                      sets=("policy.native_crash.backoff=2", "preemption.margin=3",
                            f"nodes.ledger={tmp_path / 'nodes.jsonl'}", *sets))
    if add_ons is None:
        nodes = NodeHealth()
        add_ons = [GpuPreflight(record=nodes.note), nodes]
    runner = Runner(cfg, ["python3", "train.py"], environ=env, cwd=tmp_path, echo=False, clock=clock,
                    waker=waker, start_child=starter, slurm=slurm, channel=channel, add_ons=add_ons)
    return runner, {"clock": clock, "waker": waker, "channel": channel, "starter": starter, "slurm": slurm,
                    "run_dir": run_dir, "ckpt": ckpt}


def t(ev: dict[str, Any], w: dict[str, Any]) -> float:
    return round(ev["ts"] - w["clock"].start, 3)


def heartbeats(first: int, last: int, every: float = 0.1, start: float = 0.1) -> list[tuple]:
    return [(start + i * every, "msg", "heartbeat", {"step": s}) for i, s in enumerate(range(first, last + 1))]


def test_notice_blocks_on_a_save_then_aborts_it_at_deadline_minus_margin(tmp_path: Path) -> None:
    # A client begins a save that never ends; the notice (SIGTERM, no Slurm record: 30 s default
    # grace) blocks on it, since nothing says it cannot finish, and aborts at deadline - margin.
    script = ChildScript([*heartbeats(1, 5), (0.9, "msg", "save_begin", {"step": 5, "path": "/x/step=5.ckpt"})],
                         on_signal={TERM: "ignore"})
    runner, w = make(tmp_path, [script], signals=[(2.0, TERM)])
    result = runner.run()
    arb = events_named(w["run_dir"], "arbitration")
    assert arb[0]["decision"] == "block"
    aborted = events_named(w["run_dir"], "save_aborted")[0]
    assert t(aborted, w) == 2.0 + 30 - 3  # exactly deadline - margin
    assert w["starter"].children[0].signals[-1] == (29.0, KILL)
    assert "abort_save" in w["channel"].kinds()
    assert result.outcome is RunOutcome.REQUEUE and result.exit_code == 75


def test_notice_with_no_save_in_flight_stops_a_cooperative_child_gracefully(tmp_path: Path) -> None:
    script = ChildScript([*heartbeats(1, 5)], on_signal={TERM: ("exit", 0, 1.5)})
    runner, w = make(tmp_path, [script], signals=[(1.0, TERM)], sets=("preemption.emergency_save=false",))
    result = runner.run()
    child = w["starter"].children[0]
    assert child.signals[0] == (1.0, TERM) and KILL not in [s for _, s in child.signals]
    assert result.outcome is RunOutcome.REQUEUE
    assert events_named(w["run_dir"], "attempt_end")[0]["class"] == "preempted"


def test_unchanged_child_is_shielded_and_killed_by_the_supervisor_not_the_first_sigterm(tmp_path: Path) -> None:
    # Zero-code: no client. The notice signals start ignored (ChildSpec.shield_signals, where
    # supervisor.child offers it); the supervisor sends TERM and then KILL after a short wait.
    script = ChildScript([(0.1 * i, "line", f"step {i}") for i in range(1, 20)])
    runner, w = make(tmp_path, [script], signals=[(1.0, TERM)])
    runner.run()
    child = w["starter"].children[0]
    kills = [at for at, s in child.signals if s == KILL]
    if "shield_signals" in getattr(type(child.spec), "__dataclass_fields__", {}):
        assert TERM in child.spec.shield_signals
        assert kills and kills[0] == 1.0 + UNCHANGED_EXIT_WAIT
    assert child.signals[0] == (1.0, TERM)


def test_a_notice_during_restart_backoff_requeues_instead_of_restarting(tmp_path: Path) -> None:
    crash = ChildScript([*heartbeats(1, 3), (0.5, "die", signal.SIGSEGV)])
    runner, w = make(tmp_path, [crash], signals=[(1.5, TERM)])
    result = runner.run()
    assert len(w["starter"].children) == 1  # never restarted
    assert result.outcome is RunOutcome.REQUEUE
    assert "notice during restart backoff" in result.reason
    decision = events_named(w["run_dir"], "decision")[0]
    assert decision["action"] == "restart" and decision["delay"] == 2.0


def test_stall_dumps_stacks_kills_and_restarts(tmp_path: Path) -> None:
    stuck = ChildScript([*heartbeats(1, 3)], on_signal={TERM: "ignore"})
    done = ChildScript([*heartbeats(1, 5), (1.0, "msg", "done", {}), (1.1, "exit", 0)])
    runner, w = make(tmp_path, [stuck, done], sets=("stall_timeout=5",))
    result = runner.run()
    first = w["starter"].children[0]
    assert first.dumped
    stall = events_named(w["run_dir"], "stall")[0]
    assert stall["last_step"] == 3 and 5.0 < stall["idle_s"] < 5.2
    assert [s for _, s in first.signals] == [TERM, KILL]  # TERM ignored, KILL after the grace
    assert [e["class"] for e in events_named(w["run_dir"], "attempt_end")] == ["hang", "completed"]
    assert result.outcome is RunOutcome.COMPLETE and result.exit_code == 0


def test_same_crash_at_the_same_step_is_stopped_and_the_verdict_names_why(tmp_path: Path) -> None:
    crash = ChildScript([(0.1, "line", "step 7"), (0.2, "die", signal.SIGSEGV)])
    runner, w = make(tmp_path, [crash])
    result = runner.run()
    assert result.outcome is RunOutcome.STOPPED
    assert 2 <= len(w["starter"].children) <= 10
    end = events_named(w["run_dir"], "run_end")[-1]
    assert end["stopped_by"] and end["reason"] == result.reason
    assert result.exit_code == 4  # supervise's own code for a stop by policy, never the child's 139


def test_a_finished_run_is_not_requeued_after_a_late_notice(tmp_path: Path) -> None:
    script = ChildScript([*heartbeats(1, 5), (0.7, "msg", "done", {}), (0.9, "exit", 0)])
    runner, w = make(tmp_path, [script], signals=[(0.8, TERM)], job_id="77",
                     slurm_record=lambda now: Job(preempt_time=1_000_000.8, end_time=1_000_030.0))
    result = runner.run()
    assert result.outcome is RunOutcome.COMPLETE
    assert w["slurm"].requeues == []


def test_scancel_is_final_never_requeued(tmp_path: Path) -> None:
    # scancel: Slurm marks the job CANCELLED and sends SIGTERM. EndTime = now looks like a time
    # limit to a naive reading; the job state says a person cancelled it.
    script = ChildScript([*heartbeats(1, 20)], on_signal={TERM: ("exit", 0, 0.2)})
    record = lambda now: Job(state="CANCELLED" if now >= 1.0 else "RUNNING", end_time=1_000_001.0)  # noqa: E731
    runner, w = make(tmp_path, [script], signals=[(1.0, TERM)], job_id="78", slurm_record=record)
    result = runner.run()
    assert w["slurm"].requeues == []
    assert result.outcome is RunOutcome.INTERRUPTED
    end = events_named(w["run_dir"], "run_end")[-1]
    assert "cancelled by a person" in end["reason"] and end["stopped_by"] == "person"
    assert events_named(w["run_dir"], "requeue") == []


def test_scancel_signal_term_on_a_running_job_is_a_person_not_a_preemption(tmp_path: Path) -> None:
    script = ChildScript([*heartbeats(1, 20)], on_signal={TERM: ("exit", 0, 0.2)})
    runner, w = make(tmp_path, [script], signals=[(1.0, TERM)], job_id="79",
                     slurm_record=lambda now: Job(state="RUNNING", end_time=1_003_600.0))
    result = runner.run()
    assert w["slurm"].requeues == [] and result.outcome is RunOutcome.INTERRUPTED


def test_preemption_is_requeued_once_explicitly(tmp_path: Path) -> None:
    script = ChildScript([*heartbeats(1, 20)], on_signal={TERM: ("exit", 0, 0.2)})
    runner, w = make(tmp_path, [script], signals=[(1.0, TERM)], job_id="80",
                     slurm_record=lambda now: Job(preempt_time=1_000_001.0, end_time=1_000_031.0),
                     sets=("preemption.emergency_save=false",))
    result = runner.run()
    assert result.outcome is RunOutcome.REQUEUE and len(w["slurm"].requeues) == 1


def test_a_slurmctld_that_never_answers_does_not_delay_the_notice(tmp_path: Path) -> None:
    # Measured before: the notice was recorded 31.5 s after SIGTERM, past a 30 s grace.
    script = ChildScript([*heartbeats(1, 40)], on_signal={TERM: ("exit", 0, 0.3)})
    runner, w = make(tmp_path, [script], signals=[(1.0, TERM)], job_id="81", slurm_answers=False,
                     sets=("preemption.emergency_save=false",))
    runner.run()
    notice = events_named(w["run_dir"], "notice")[0]
    assert t(notice, w) == 1.0 and notice["deadline"] - notice["ts"] == 30.0
    assert w["starter"].children[0].signals[0] == (1.0, TERM)


def test_a_notice_that_outruns_the_job_record_is_planned_with_the_configured_grace(tmp_path: Path) -> None:
    # Measured in CI under load: the job record still showed no PreemptTime when SIGTERM arrived, the
    # plan used the 30 s default grace, blocked on a 10 s save, and Slurm's 4 s grace ran out first.
    # The partition's GraceTime (read from the Slurm configuration at start) plans it right at once.
    from supervisor.slurm.grace import ClusterGrace
    from supervisor.slurm.parse import JobInfo

    script = ChildScript([*heartbeats(1, 100),  # an 8 s save of step 5 first: the history says saves take 8 s
                          (0.6, "msg", "save_begin", {"step": 5, "path": "/x/step=5.ckpt"}),
                          (8.6, "msg", "save_end", {"step": 5, "path": "/x/step=5.ckpt", "ok": True, "duration": 8.0}),
                          (9.0, "msg", "save_begin", {"step": 10, "path": "/x/step=10.ckpt"})],
                         on_signal={TERM: "ignore"})
    clock_start = 1_000_000.0

    def record(at: float) -> JobInfo:  # the preemption shows in the record only 1 s after SIGTERM
        if at < 10.5:
            return JobInfo(job_id=81, state="RUNNING", partition="extra", end_time=clock_start + 365 * 86400.0)
        return JobInfo(job_id=81, state="RUNNING", partition="extra", preempt_time=clock_start + 9.5,
                       end_time=clock_start + 13.5)

    runner, w = make(tmp_path, [script], signals=[(9.5, TERM)], job_id="81", slurm_record=record,
                     sets=("preemption.margin=1",))
    w["slurm"].cluster_grace = ClusterGrace(4.0, "partition extra GraceTime")
    result = runner.run()
    notice = events_named(w["run_dir"], "notice")[0]
    assert notice["deadline_source"] == "cluster_grace" and notice["deadline"] - notice["ts"] == 4.0
    assert "partition extra GraceTime" in notice["reason"]
    arbitration = events_named(w["run_dir"], "arbitration")[0]
    assert arbitration["decision"] == "abort", arbitration["reason"]
    assert t(events_named(w["run_dir"], "save_aborted")[0], w) == 9.5  # at the notice, not 26 s later
    assert result.outcome is RunOutcome.REQUEUE


def test_emergency_save_then_stop(tmp_path: Path) -> None:
    # A connected client, a save that fits (assumed 5 s): "save_now"; it saves; then TERM.
    script = ChildScript([*heartbeats(1, 10)], on_signal={TERM: ("exit", 0, 0.1)})
    runner, w = make(tmp_path, [script], signals=[(1.05, TERM)], sets=("preemption.unknown_save_s=5",))
    child_box: dict[str, Any] = {}
    original = w["channel"].broadcast

    def broadcast(kind: Any, **fields: Any) -> int:
        if str(kind) == "save_now" and "done" not in child_box:
            child_box["done"] = True
            w["channel"].inbox.append(Msg("save_end", {"step": 10, "path": "/x/step=10.ckpt", "ok": True},
                                          attempt=1))
        return original(kind, **fields)

    w["channel"].broadcast = broadcast  # type: ignore[method-assign]
    runner.run()
    arb = events_named(w["run_dir"], "arbitration")[0]
    assert arb["decision"] == "emergency_save"
    saves = events_named(w["run_dir"], "save_end")
    assert saves and saves[0]["step"] == 10
    assert w["starter"].children[0].signals[0][1] == TERM


def test_the_failure_step_is_not_moved_back_by_how_stdout_and_stderr_interleave(tmp_path: Path) -> None:
    # The child prints "step 12" on stdout, then its traceback on stderr; read by two threads, the
    # traceback can reach the tail first and the classifier alone would say step 11 (seen in
    # tests/test_diagnose.py under load). A crash that recurs at step 12 must read 12 every time.
    from supervisor.run.judge import failure_step

    assert failure_step(11, 12) == 12 and failure_step(12, 12) == 12
    assert failure_step(None, 12) == 12 and failure_step(7, None) == 7 and failure_step(None, None) is None
    error = "RuntimeError: CUDA error: an illegal memory access was encountered"
    script = ChildScript([*[(0.1 * i, "line", f"step {i}") for i in range(1, 12)],  # the tail as it was read
                          (1.15, "line", error), (1.2, "line", "step 12"), (1.3, "exit", 1)])
    runner, w = make(tmp_path, [script], sets=("policy.illegal_memory_access.action=stop",))
    runner.run()
    failure = events_named(w["run_dir"], "failure")[0]
    assert failure["class"] == "illegal_memory_access" and failure["step"] == 12 and failure["last_step"] == 12


def test_a_save_begun_after_the_notice_is_seen_open_right_before_the_kill_and_let_land(
        tmp_path: Path, monkeypatch: Any) -> None:
    # Zero-code: at the notice nothing is written yet (the directory poll and the open files agree:
    # stop now). The child then opens step=20.ckpt for writing, between the arbitration and the
    # kill; the last look before the kill finds it open, the supervisor blocks until the file is
    # closed (at 2.5 s), and only then kills. The fault is placed by the fake /proc, not by timing.
    import supervisor.run.writers as writers
    from supervisor.openfiles import OpenWriter

    looks: list[float] = []

    def fake_writers(pid: int, marker: str, under: str) -> list[OpenWriter]:
        now = w["clock"].now() - w["clock"].start
        looks.append(now)
        if len(looks) == 1 or now >= 2.5:
            return []  # the notice's look: not yet; from 2.5 s: closed
        return [OpenWriter(pid, f"{under}/step=20.ckpt")]

    monkeypatch.setattr(writers, "writers_in_tree", fake_writers)
    script = ChildScript([(0.1 * i, "line", f"step {i}") for i in range(1, 20)] + [(20.0, "exit", 0)])
    runner, w = make(tmp_path, [script], signals=[(1.0, TERM)])
    runner.run()
    decisions = [a["decision"] for a in events_named(w["run_dir"], "arbitration")]
    assert decisions[:2] == ["stop_now", "block"], decisions
    kills = [at for at, s in w["starter"].children[0].signals if s == KILL]
    assert kills and kills[0] >= 2.5, kills  # not killed while the file was open
    assert looks[0] == 1.0  # the notice looked at the open files before arbitrating


def test_a_save_open_for_writing_at_the_notice_is_blocked_on(tmp_path: Path, monkeypatch: Any) -> None:
    # The directory poll has not seen the write yet; the open file descriptor has.
    import supervisor.run.writers as writers
    from supervisor.openfiles import OpenWriter

    def fake_writers(pid: int, marker: str, under: str) -> list[OpenWriter]:
        now = w["clock"].now() - w["clock"].start
        return [OpenWriter(pid, f"{under}/last.ckpt")] if 0.9 <= now < 2.0 else []

    monkeypatch.setattr(writers, "writers_in_tree", fake_writers)
    script = ChildScript([(0.1 * i, "line", f"step {i}") for i in range(1, 20)] + [(20.0, "exit", 0)])
    runner, w = make(tmp_path, [script], signals=[(1.0, TERM)])
    runner.run()
    first = events_named(w["run_dir"], "arbitration")[0]
    assert first["decision"] == "block", first["reason"]
    kills = [at for at, s in w["starter"].children[0].signals if s == KILL]
    assert kills and kills[0] >= 2.0, kills


def test_the_ledger_the_loop_keeps_in_memory_is_the_one_a_reader_of_the_log_folds(tmp_path: Path) -> None:
    # The loop never re-reads the log after run start: its ledger is folded as each event is written.
    # What it decides from must be what `supervise audit` and the report fold from the file, after a
    # hang, a crash with a save, a restart and completion.
    from supervisor.events import read_events
    from supervisor.ledger import ledger_from_events

    crash = ChildScript([*heartbeats(1, 4), (0.5, "msg", "save_begin", {"step": 4, "path": "/x/step=4.ckpt"}),
                         (0.6, "msg", "save_end", {"step": 4, "path": "/x/step=4.ckpt", "bytes": 10, "duration": 0.1}),
                         (0.8, "line", "step 6"), (0.9, "die", signal.SIGSEGV)])
    stuck = ChildScript([*heartbeats(5, 7)], on_signal={TERM: "ignore"})
    done = ChildScript([*heartbeats(5, 9), (1.0, "msg", "done", {}), (1.1, "exit", 0)])
    runner, w = make(tmp_path, [crash, stuck, done], sets=("stall_timeout=5",))
    assert runner.run().outcome is RunOutcome.COMPLETE
    in_memory = runner.ctx.history
    assert in_memory is not None
    from_file = read_events(w["run_dir"] / "supervisor" / "events.jsonl").events
    assert in_memory.records() == ledger_from_events(from_file)
    assert [r.status for r in in_memory.records()] == ["native_crash", "hang", "completed"]
