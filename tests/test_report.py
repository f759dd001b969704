"""The post-mortem report and the status view, on run directories written the way the run loop
writes them: real EventLog records, real manifests from collect_manifest, real torch.save files."""

from __future__ import annotations

import copy
import json
import os
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.config import load_config
from supervisor.events import Ev, EventLog
from supervisor.addons.manifest import collect_manifest, write_manifest
from supervisor.addons.report import (
    build_report,
    check_alive,
    fold,
    resolve_run_dir,
    summarize_status,
)
from supervisor.addons.report.render import render_markdown, render_status, render_text
from tests.helpers import run_supervise

T0 = 1_750_000_000.0
SEGV = "Fatal Python error: Segmentation fault"


def _budget_available() -> bool:
    try:
        from supervisor.budget import judge, ledger_from_events  # noqa: F401
    except ImportError:
        return False
    return True


class Clock:
    """The event log's clock, stepped by the test so timestamps (and durations) are known."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now

    def at(self, offset: float) -> Clock:
        self.now = T0 + offset
        return self


@pytest.fixture(scope="module")
def base_manifest(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One real manifest (git, the child's torch, no nvidia-smi here); variants are edited copies."""
    repo = tmp_path_factory.mktemp("code")
    (repo / "train.py").write_text("print('train')\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "train.py"], check=True)
    subprocess.run(git + ["commit", "-q", "-m", "train"], check=True)
    return collect_manifest(attempt=1, argv=[sys.executable, "train.py"], config=load_config(environ={}),
                            environ=dict(os.environ), cwd=repo, child_python=None, run_dir=repo / "run")


def _torch_ckpt(path: Path, step: int) -> int:
    import torch

    torch.save({"step": step, "weight": torch.arange(64, dtype=torch.float32) + step}, path)
    return path.stat().st_size


def write_scenario(run_dir: Path, manifests: dict[int, dict], *, finished: bool = True) -> dict:
    """Three attempts over two jobs, as the run loop logs them:

    job 1001 (n1): attempt 1 segfaults at step 250 (saved 200) -> restart in place;
                   attempt 2 resumes from 200, is preempted at 320 after an emergency save -> requeue;
    job 1001 requeued (n2): step=320 turns out torn -> quarantined; attempt 3 resumes from 200 and
                   completes at step 500.
    """
    ckpt = run_dir / "checkpoints"
    ckpt.mkdir(parents=True)
    sizes = {s: _torch_ckpt(ckpt / f"step={s}.ckpt", s) for s in (100, 200, 400)}
    torn = ckpt / "step=320.ckpt"
    _torch_ckpt(torn, 320)
    with open(torn, "r+b") as fh:  # torn by a preemption: the zip's central directory is gone
        fh.truncate(torn.stat().st_size // 2)
    # The requeued job's resume-point scan finds it torn and renames it aside, as the run loop does.
    from supervisor.checkpoints import quarantine_checkpoint, validate_checkpoint

    record = quarantine_checkpoint(validate_checkpoint(torn), ckpt, "1001")
    assert record.ok, record
    corrupt = Path(record.dest)

    clock = Clock()
    log = EventLog(run_dir / "supervisor" / "events.jsonl", clock=clock)
    sv = {"run_dir": str(run_dir), "checkpoint_dir": str(ckpt), "argv": ["python", "train.py"], "pid": 4242}
    e = log.emit
    clock.at(0)
    e(Ev.RUN_START, name="exp1", host="n1", job_id="1001", restart_count=0, config_hash="h1", **sv)
    e(Ev.RESUME_POINT, attempt=1, path=None, step=None, candidates=[], quarantined=[])
    e(Ev.ATTEMPT_START, attempt=1, argv=["python", "train.py"], pid=5001, host="n1", job_id="1001",
      restart_count=0, nodes=["n1"], resume_path=None, resume_step=None)
    clock.at(100); e(Ev.PROGRESS, attempt=1, step=100, rate=1.0, source="client")
    clock.at(105); e(Ev.SAVE_END, attempt=1, step=100, path=str(ckpt / "step=100.ckpt"), bytes=sizes[100],
                     duration=0.5, ok=True, source="client")
    clock.at(200); e(Ev.PROGRESS, attempt=1, step=200, rate=1.0, source="client")
    clock.at(205); e(Ev.SAVE_END, attempt=1, step=200, path=str(ckpt / "step=200.ckpt"), bytes=sizes[200],
                     duration=0.5, ok=True, source="client")
    clock.at(250); e(Ev.PROGRESS, attempt=1, step=250, rate=1.0, source="client")
    clock.at(252)
    e(Ev.ATTEMPT_END, attempt=1, exit_code=None, signal="SIGSEGV", duration=252.0, first_step=1,
      last_step=252, last_durable_step=200, steps_lost=52, wall_lost=47.0, resume_step=None,
      resume_path=None, **{"class": "native_crash", "action": "restart"})
    e(Ev.FAILURE, attempt=1, action="restart", evidence=[SEGV, "Current thread 0x00007f (most recent call first):"],
      context=[], step=250, last_step=252, last_durable_step=200, node="n1", rank=0, exit_code=None,
      signal="SIGSEGV", reason="SIGSEGV", **{"class": "native_crash", "classified_as": "native_crash"})
    e(Ev.BUDGET, attempt=1, ok=True, budget=None, reason="within every budget", numbers={"restarts": 1})
    e(Ev.DECISION, attempt=1, action="restart", reason="native_crash 1/3 in a row", delay=2.0)
    clock.at(260)
    e(Ev.RESUME_POINT, attempt=2, path=str(ckpt / "step=200.ckpt"), step=200, candidates=[], quarantined=[])
    e(Ev.ATTEMPT_START, attempt=2, argv=["python", "train.py"], pid=5002, host="n1", job_id="1001",
      restart_count=0, nodes=["n1"], resume_path=str(ckpt / "step=200.ckpt"), resume_step=200)
    clock.at(265); e(Ev.RESUMED, attempt=2, step=200, expected_step=200, ok=True, reason="ok")
    clock.at(300); e(Ev.PROGRESS, attempt=2, step=300, rate=1.0, source="client")
    clock.at(318)
    e(Ev.NOTICE, attempt=2, source="signal", signal="TERM", deadline=T0 + 338, preempt_time=None, grace=20)
    e(Ev.ARBITRATION, attempt=2, decision="emergency_save", reason="no save in flight; one fits",
      now=T0 + 318, deadline=T0 + 338, margin=3.0, expected_save_s=0.5, save_in_flight=None)
    clock.at(320); e(Ev.SAVE_END, attempt=2, step=320, path=str(ckpt / "step=320.ckpt"), bytes=1000,
                     duration=0.6, ok=True, source="client")
    clock.at(322)
    e(Ev.ATTEMPT_END, attempt=2, exit_code=143, signal=None, duration=62.0, first_step=200, last_step=320,
      last_durable_step=320, steps_lost=0, wall_lost=2.0, **{"class": "preempted", "action": "requeue"})
    e(Ev.FAILURE, attempt=2, action="requeue", evidence=[], step=320, node="n1",
      **{"class": "preempted", "classified_as": "python_exception"})
    e(Ev.DECISION, attempt=2, action="requeue", reason="preempted: come back through Slurm", delay=0)
    e(Ev.REQUEUE, attempt=2, job_id="1001", how="scontrol", planned=True, reason="Slurm 22.05 does not "
      "requeue a job that exits during grace", exclude=[])
    e(Ev.RUN_END, outcome="requeue", exit_code=75, reason="preempted", attempts=2, last_step=320)
    # Job 1001 again, after the requeue, on n2.
    clock.at(500)
    e(Ev.RUN_START, name="exp1", host="n2", job_id="1001", restart_count=1, config_hash="h2", **sv)
    e(Ev.QUARANTINE, attempt=3, **record.to_event())
    e(Ev.RESUME_POINT, attempt=3, path=str(ckpt / "step=200.ckpt"), step=200, candidates=[],
      quarantined=[str(torn)])
    e(Ev.ATTEMPT_START, attempt=3, argv=["python", "train.py"], pid=6001, host="n2", job_id="1001",
      restart_count=1, nodes=["n2"], resume_path=str(ckpt / "step=200.ckpt"), resume_step=200)
    clock.at(600); e(Ev.PROGRESS, attempt=3, step=300, rate=2.0, source="client")
    clock.at(650); e(Ev.SAVE_END, attempt=3, step=400, path=str(ckpt / "step=400.ckpt"), bytes=sizes[400],
                     duration=0.5, ok=True, source="client")
    clock.at(660); e(Ev.DETERMINISM, attempt=3, settings={"deterministic_algorithms": False,
                                                         "cudnn_benchmark": True, "seed": 7})
    clock.at(700); e(Ev.PROGRESS, attempt=3, step=500, rate=2.0, source="client")
    if finished:
        e(Ev.CONTROL_DROPPED, count=3, by_reason={"bad_token": 3})
        clock.at(710)
        e(Ev.ATTEMPT_END, attempt=3, exit_code=0, signal=None, duration=210.0, first_step=200, last_step=500,
          last_durable_step=400, steps_lost=0, wall_lost=0.0, **{"class": "completed", "action": None})
        e(Ev.RUN_END, outcome="complete", exit_code=0, reason="training complete", attempts=3, last_step=500)
    log.close()
    for n, m in manifests.items():
        write_manifest(run_dir / "supervisor" / f"manifest-{n}.json", m)
    return {"ckpt": ckpt, "corrupt": corrupt, "sizes": sizes, "quarantine": record}


def _drifted(base: dict) -> dict[int, dict]:
    """Attempts 1 and 2 identical; attempt 3 (after the requeue) on other code, torch and config."""
    m1 = copy.deepcopy(base)
    m2 = copy.deepcopy(base)
    m2["attempt"] = 2
    m3 = copy.deepcopy(base)
    m3["attempt"] = 3
    m3["git"]["commit"] = "f" * 40
    m3["software"]["torch"] = "2.14.0+cpu"
    m3["config_hash"] = "0" * 64
    m3["hosts"]["hostname"] = "n2"
    return {1: m1, 2: m2, 3: m3}


@pytest.fixture()
def run_dir(tmp_path: Path, base_manifest: dict) -> Path:
    rd = tmp_path / "runs" / "exp1"
    write_scenario(rd, _drifted(base_manifest))
    return rd


# ---------------------------------------------------------------------------------------------
# The fold


def test_timeline_tells_each_attempt_its_end_first_failure_and_losses(run_dir: Path) -> None:
    data = build_report(run_dir).to_json()
    attempts = data["attempts"]
    assert [a["attempt"] for a in attempts] == [1, 2, 3]
    assert [a["class"] for a in attempts] == ["native_crash", "preempted", "completed"]
    assert [a["action"] for a in attempts] == ["restart", "requeue", None]
    assert [a["job_id"] for a in attempts] == ["1001", "1001", "1001"]
    assert [a["restart_count"] for a in attempts] == [0, 0, 1]
    assert [a["nodes"] for a in attempts] == [["n1"], ["n1"], ["n2"]]
    assert [a["resume_step"] for a in attempts] == [None, 200, 200]
    assert attempts[1]["resume_path"].endswith("step=200.ckpt")
    assert [(a["first_step"], a["last_step"]) for a in attempts] == [(1, 252), (200, 320), (200, 500)]
    # Attempt 2 saved step 320 at the notice, but that file was torn and the run resumed from 200:
    # the resume point is the truth, so its 120 steps were lost (the log's attempt_end said 0).
    assert [a["steps_lost"] for a in attempts] == [52, 120, 0]
    assert attempts[1]["last_durable_step"] == 320
    assert attempts[0]["evidence"] == SEGV and attempts[0]["evidence_step"] == 250
    assert attempts[0]["start"] == T0 and attempts[0]["end"] == T0 + 252
    assert attempts[0]["wall_lost"] == 47.0
    assert attempts[1]["notice"] is True

    run = data["run"]
    assert run["outcome"] == "complete" and run["exit_code"] == 0
    assert run["attempts"] == 3 and run["restarts"] == 1 and run["requeues"] == 1
    assert [j["attempts"] for j in run["jobs"]] == [[1, 2], [3]]
    assert [j["ended_by"] for j in run["jobs"]] == ["requeue", "complete"]
    assert run["final_step"] == 500 and run["steps_lost"] == 52 + 120
    assert run["duration"] == 710.0


def test_json_has_the_stable_top_level_keys(run_dir: Path) -> None:
    data = build_report(run_dir).to_json()
    assert list(data) == ["run", "attempts", "verdict", "checkpoints", "quarantined", "drift",
                          "events_summary", "warnings", "accounting"]
    json.dumps(data)  # plain data all the way down


def test_drift_flags_code_torch_and_config_changes_with_attempt_numbers(run_dir: Path, base_manifest: dict) -> None:
    rep = build_report(run_dir)
    breaking = {d.what: d for d in rep.drift if d.breaks_reproducibility}
    assert set(breaking) == {"git commit", "torch", "supervisor config (hash)"}
    torch_drift = breaking["torch"]
    assert (torch_drift.from_attempt, torch_drift.to_attempt) == (2, 3)
    assert torch_drift.old == base_manifest["software"]["torch"] and torch_drift.new == "2.14.0+cpu"
    assert breaking["git commit"].new == "f" * 40
    host = [d for d in rep.drift if d.what == "host"]
    assert host and not host[0].breaks_reproducibility  # moving node is normal; it is shown, not a problem
    assert any("not one reproducible run" in p for p in rep.run.problems)
    text = render_text(rep)
    assert "NOT one reproducible run" in text and "2.14.0+cpu" in text


def test_no_drift_when_attempts_ran_the_same_setup(tmp_path: Path, base_manifest: dict) -> None:
    rd = tmp_path / "run"
    same = {n: dict(copy.deepcopy(base_manifest), attempt=n) for n in (1, 2, 3)}
    write_scenario(rd, same)
    rep = build_report(rd)
    assert [d for d in rep.drift if d.breaks_reproducibility] == []
    assert not any("reproducible" in p for p in rep.run.problems)


def test_client_reported_determinism_change_is_drift(tmp_path: Path, base_manifest: dict) -> None:
    rd = tmp_path / "run"
    write_scenario(rd, {n: dict(copy.deepcopy(base_manifest), attempt=n) for n in (1, 2, 3)})
    with EventLog(rd / "supervisor" / "events.jsonl") as log:  # a fourth attempt, now deterministic
        log.emit(Ev.RUN_START, name="exp1", job_id="1002", restart_count=0)
        log.emit(Ev.ATTEMPT_START, attempt=4, job_id="1002", resume_step=400)
        log.emit(Ev.DETERMINISM, attempt=4, settings={"deterministic_algorithms": True,
                                                      "cudnn_benchmark": True, "seed": 7,
                                                      "applied_after_cuda_init": True})
    rep = build_report(rd)
    changed = [d for d in rep.drift if "deterministic_algorithms" in d.what]
    assert len(changed) == 1 and (changed[0].from_attempt, changed[0].to_attempt) == (3, 4)
    assert (changed[0].old, changed[0].new) == (False, True)
    assert not [d for d in rep.drift if "cudnn_benchmark" in d.what or "seed" in d.what]
    assert any("attempt(s) 4: determinism settings were applied after CUDA" in w for w in rep.warnings)


def test_environment_determinism_and_gpu_changes_are_drift(base_manifest: dict) -> None:
    m1 = copy.deepcopy(base_manifest)
    m2 = copy.deepcopy(base_manifest)
    m1["gpu"] = {"gpus": [{"name": "NVIDIA H100 80GB HBM3", "driver_version": "550.54", "uuid": "GPU-a"}],
                 "driver": "550.54", "reason": None}
    m2["gpu"] = {"gpus": [{"name": "NVIDIA A100-SXM4-80GB", "driver_version": "535.1", "uuid": "GPU-b"}],
                 "driver": "535.1", "reason": None}
    m2["determinism"] = dict(m1["determinism"], CUBLAS_WORKSPACE_CONFIG=":4096:8", NCCL_ALGO="Ring")
    rep = fold([], {1: m1, 2: m2})
    whats = {d.what: (d.old, d.new) for d in rep.drift}
    assert whats["GPU model"] == ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB")
    assert whats["NVIDIA driver"] == ("550.54", "535.1")
    assert whats["env CUBLAS_WORKSPACE_CONFIG"] == (m1["determinism"]["CUBLAS_WORKSPACE_CONFIG"], ":4096:8")
    assert whats["env NCCL_ALGO"] == (None, "Ring")  # set in attempt 2, unset before


def test_unknown_is_not_drift(base_manifest: dict) -> None:
    """A node without git or nvidia-smi does not mean the code or the GPU changed."""
    m1 = copy.deepcopy(base_manifest)
    m2 = copy.deepcopy(base_manifest)
    m3 = copy.deepcopy(base_manifest)
    m2["git"] = {"commit": None, "dirty": None, "reason": "git not found on PATH"}
    m2["software"] = {"reason": "probe timed out after 20 s"}
    m3["git"]["commit"] = "e" * 40
    drift = {d.what: d for d in fold([], {1: m1, 2: m2, 3: m3}).drift}
    assert "torch" not in drift
    assert (drift["git commit"].from_attempt, drift["git commit"].to_attempt) == (1, 3)


def test_verdict_is_reported(run_dir: Path) -> None:
    verdict = build_report(run_dir).to_json()["verdict"]
    assert verdict is not None and verdict["ok"] is True
    # Re-check once supervisor.budget lands: the verdict is then recomputed by budget.judge.
    assert verdict["source"] == ("judge" if _budget_available() else "log")


def test_checkpoint_health_table_and_quarantined_files_with_reasons(tmp_path: Path, base_manifest: dict) -> None:
    rd = tmp_path / "run"
    info = write_scenario(rd, {1: base_manifest})
    data = build_report(rd).to_json()
    files = {c["file"]: c for c in data["checkpoints"]}
    assert set(files) == {"step=100.ckpt", "step=200.ckpt", "step=400.ckpt"}  # CORRUPT_* listed apart
    assert [c["step"] for c in data["checkpoints"]] == [100, 200, 400]
    assert files["step=400.ckpt"]["size"] == (rd / "checkpoints" / "step=400.ckpt").stat().st_size
    assert {c["verdict"] for c in data["checkpoints"]} == {"valid"}
    assert {c["format"] for c in data["checkpoints"]} == {files["step=100.ckpt"]["format"]} != {None}
    (q,) = data["quarantined"]
    assert q["file"] == "CORRUPT_step=320.ckpt.1001" == info["corrupt"].name
    assert q["original"].endswith("step=320.ckpt") and q["attempt"] == 3 and q["step"] == 320
    assert q["reason"] == info["quarantine"].reason and q["reason"]
    assert q["level"] == info["quarantine"].level
    assert q["on_disk"] is True and q["sidecar"] is True
    assert q["size"] == info["corrupt"].stat().st_size
    text = render_text(build_report(rd), width=1000)  # the content; the fit to 100 columns: test_textfit.py
    assert "CORRUPT_step=320.ckpt.1001" in text and info["quarantine"].reason[:40] in text


def test_corrupt_checkpoint_left_in_the_directory_is_a_problem(tmp_path: Path, base_manifest: dict) -> None:
    rd = tmp_path / "run"
    write_scenario(rd, {1: base_manifest})
    bad = rd / "checkpoints" / "step=600.ckpt"
    _torch_ckpt(bad, 600)
    with open(bad, "r+b") as fh:
        fh.truncate(100)
    rep = build_report(rd)
    assert {c.file: c.verdict for c in rep.checkpoints}["step=600.ckpt"] == "corrupt"
    assert any("corrupt checkpoint(s)" in p and "step=600.ckpt" in p for p in rep.run.problems)
    assert build_report(rd, check_checkpoints=False).checkpoints is None


def test_quarantined_file_without_event_is_listed_from_its_sidecar(tmp_path: Path, base_manifest: dict) -> None:
    rd = tmp_path / "run"
    info = write_scenario(rd, {1: base_manifest})
    other = info["ckpt"] / "CORRUPT_last.ckpt.999"
    other.write_bytes(b"PK\x03\x04 torn")
    Path(f"{other}.json").write_text(json.dumps({"original_path": "/c/last.ckpt", "reason": "CRC mismatch in data/0",
                                                 "level": 4, "time": T0 + 5}))
    rows = {q.file: q for q in build_report(rd).quarantined}
    assert rows["CORRUPT_last.ckpt.999"].reason == "CRC mismatch in data/0"
    assert rows["CORRUPT_last.ckpt.999"].original == "/c/last.ckpt"
    assert rows["CORRUPT_last.ckpt.999"].level == 4 and rows["CORRUPT_last.ckpt.999"].attempt is None


def test_events_summary_counts_notices_requeues_arbitrations_and_dropped_messages(run_dir: Path) -> None:
    s = build_report(run_dir).to_json()["events_summary"]
    assert s["counts"]["attempt_start"] == 3 and s["counts"]["run_start"] == 2
    assert [n["attempt"] for n in s["notices"]] == [2]
    assert [a["decision"] for a in s["arbitrations"]] == ["emergency_save"]
    assert [r["how"] for r in s["requeues"]] == ["scontrol"]
    assert [d["action"] for d in s["decisions"]] == ["restart", "requeue"]
    assert s["control_dropped"] == 3 and s["control_dropped_by_reason"] == {"bad_token": 3}
    assert s["last_checkpoint"]["step"] == 400


def test_stall_slowdown_loss_and_resume_mismatch_are_reported(tmp_path: Path) -> None:
    rd = tmp_path / "run"
    with EventLog(rd / "supervisor" / "events.jsonl") as log:
        log.emit(Ev.RUN_START, name="bad", checkpoint_dir=str(rd / "nowhere"))
        log.emit(Ev.ATTEMPT_START, attempt=1, resume_path="/c/step=900.ckpt", resume_step=900)
        log.emit(Ev.RESUMED, attempt=1, step=0, expected_step=900, ok=False, reason="started at 0")
        log.emit(Ev.RESUME_MISMATCH, attempt=1, expected_step=900, got_step=0, resume_path="/c/step=900.ckpt",
                 reason="child started at step 0, expected 900: it ignored the resume point")
        log.emit(Ev.SLOWDOWN, attempt=1, rate=0.4, median_rate=1.0, fraction=0.5, nodes=["n3"])
        log.emit(Ev.LOSS_ANOMALY, attempt=1, step=40, loss=float("nan"), median=2.1, kind="nan")
        log.emit(Ev.STALL, attempt=1, last_step=50, idle_s=600.0, dump="/r/stacks-1.txt")
        log.emit(Ev.ATTEMPT_END, attempt=1, exit_code=None, signal="SIGKILL", last_step=50, steps_lost=50,
                 **{"class": "hang", "action": "restart"})
        log.emit(Ev.RUN_END, outcome="stopped", exit_code=4, reason="resume audit failed")
    rep = build_report(rd)
    text = render_text(rep)
    assert "resume audit failed" in rep.run.problems[0]
    assert any("ignored the resume point" in p for p in rep.run.problems)
    assert any("stall" in p for p in rep.run.problems)
    assert "slowdown in attempt 1: 0.4 steps/s" in text and "loss anomaly in attempt 1 at step 40" in text
    assert any("does not exist here" in w for w in rep.warnings)  # the checkpoint dir is gone


def test_killed_supervisor_attempt_without_end_gets_derived_losses(tmp_path: Path) -> None:
    rd = tmp_path / "run"
    clock = Clock()
    with EventLog(rd / "supervisor" / "events.jsonl", clock=clock) as log:
        log.emit(Ev.RUN_START, name="k", job_id="7")
        log.emit(Ev.ATTEMPT_START, attempt=1, job_id="7")
        clock.at(50); log.emit(Ev.SAVE_END, attempt=1, step=500, path="/c/step=500.ckpt", ok=True)
        clock.at(90); log.emit(Ev.PROGRESS, attempt=1, step=880, rate=9.5)
        # node died: no attempt_end, no run_end; the job was requeued
        clock.at(400); log.emit(Ev.RUN_START, name="k", job_id="7", restart_count=1)
        log.emit(Ev.ATTEMPT_START, attempt=2, job_id="7", restart_count=1, resume_step=500)
        clock.at(420); log.emit(Ev.PROGRESS, attempt=2, step=520, rate=9.0)
    rep = build_report(rd)
    a1, a2 = rep.attempts
    assert a1.ended is False and a1.steps_lost == 380 and a1.wall_lost == 40.0
    assert any("attempt 1 has no attempt_end" in w for w in rep.warnings)
    assert a2.steps_lost is None  # still running: its losses are not final
    assert not any("attempt 2 has no attempt_end" in w for w in rep.warnings)
    assert rep.run.outcome is None and rep.run.requeues == 1


# ---------------------------------------------------------------------------------------------
# Renderers


def test_text_report_is_aligned_and_names_the_first_failure(run_dir: Path) -> None:
    text = render_text(build_report(run_dir), width=1000)  # one line a row: wide enough not to wrap
    lines = text.splitlines()
    header = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("#  job"))
    rows = lines[header + 2: header + 5]
    col = lines[header].index("class")
    assert [r[col:].split()[0] for r in rows] == ["native_crash", "preempted", "completed"]
    assert f"attempt 1 (native_crash) at step 250 on n1: {SEGV}" in text
    assert "CORRUPT_step=320.ckpt.1001" in text


def test_markdown_report_has_tables(run_dir: Path) -> None:
    md = render_markdown(build_report(run_dir))
    assert md.startswith("## Run exp1")
    assert "| # | job | requeue | node |" in md
    assert "| 1 | 1001 | 0 | n1 |" in md


# ---------------------------------------------------------------------------------------------
# Bad inputs


def test_not_a_run_directory_is_a_usage_error(tmp_path: Path) -> None:
    proc = run_supervise(["report", str(tmp_path)])
    assert proc.returncode == 2
    assert "is not a run directory" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_supervise(["status", str(tmp_path / "missing")])
    assert proc.returncode == 2 and "does not exist" in proc.stderr


def test_report_of_a_run_directory_moved_elsewhere(tmp_path: Path, base_manifest: dict) -> None:
    """Copied off the cluster: the checkpoint dir recorded inside the old run dir is found in the new one."""
    import shutil

    old = tmp_path / "scratch" / "exp1"
    write_scenario(old, {1: base_manifest})
    new = tmp_path / "laptop" / "exp1"
    shutil.copytree(old, new)
    shutil.rmtree(old)
    rep = build_report(new)
    assert [c.file for c in rep.checkpoints] == ["step=100.ckpt", "step=200.ckpt", "step=400.ckpt"]
    assert [q.file for q in rep.quarantined] == ["CORRUPT_step=320.ckpt.1001"]


def test_run_dir_may_be_given_as_its_supervisor_folder_or_log(run_dir: Path) -> None:
    assert resolve_run_dir(run_dir / "supervisor").run_dir == run_dir
    assert resolve_run_dir(run_dir / "supervisor" / "events.jsonl").run_dir == run_dir


def test_garbage_and_truncated_last_line_are_counted_not_fatal(run_dir: Path) -> None:
    with open(run_dir / "supervisor" / "events.jsonl", "a") as fh:
        fh.write("this is not json\n")
        fh.write('{"ts": 1750000999.0, "event": "progress", "attempt": 3, "st')  # killed mid-write
    rep = build_report(run_dir)
    assert any(w.startswith("2 line(s) of events.jsonl are not valid records") for w in rep.warnings)
    assert [a.attempt for a in rep.attempts] == [1, 2, 3] and rep.run.outcome == "complete"


def test_other_format_version_warns_and_reports_what_it_can(run_dir: Path) -> None:
    with open(run_dir / "supervisor" / "events.jsonl", "a") as fh:
        fh.write(json.dumps({"ts": T0 + 800, "event": "novel_event", "v": 2, "x": 1}) + "\n")
    rep = build_report(run_dir)
    assert any("format version(s) 2" in w for w in rep.warnings)
    assert rep.run.attempts == 3 and rep.events_summary.counts["novel_event"] == 1


def test_empty_log_is_reported_with_a_warning(tmp_path: Path) -> None:
    (tmp_path / "supervisor").mkdir()
    (tmp_path / "supervisor" / "events.jsonl").write_text("")
    rep = build_report(tmp_path)
    assert rep.attempts == () and any("empty" in w for w in rep.warnings)


# ---------------------------------------------------------------------------------------------
# CLI


def test_cli_report_json_and_exit_code_for_problems(run_dir: Path) -> None:
    proc = run_supervise(["report", str(run_dir), "--json"])
    data = json.loads(proc.stdout)
    assert data["run"]["outcome"] == "complete"
    assert data["run"]["problems"]  # the drift
    assert proc.returncode == 1


def test_cli_report_exits_0_for_a_clean_run(tmp_path: Path, base_manifest: dict) -> None:
    rd = tmp_path / "run"
    write_scenario(rd, {n: dict(copy.deepcopy(base_manifest), attempt=n) for n in (1, 2, 3)})
    proc = run_supervise(["report", str(rd), "--markdown"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("## Run exp1")


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_plot_marks_failures_restarts_preemptions_and_resumes(run_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")  # the 'plot' extra; the test extra installs it
    from supervisor.addons.report.plot import PLOT_DPI, PLOT_SIZE_IN, plot_report

    png = tmp_path / "steps.png"
    counts = plot_report(build_report(run_dir), png)
    assert counts == {"attempts": 3, "failures": 1, "restarts": 2, "requeues": 1, "preemptions": 1,
                      "resumes": 2, "checkpoints": 4}
    assert _png_size(png) == (int(PLOT_SIZE_IN[0] * PLOT_DPI), int(PLOT_SIZE_IN[1] * PLOT_DPI))


def test_cli_plot_writes_png_and_reports_markers(run_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "p.png"
    proc = run_supervise(["report", str(run_dir), "--json", "--plot", str(png)])
    assert json.loads(proc.stdout)["plot"]["markers"]["failures"] == 1
    assert _png_size(png)[0] > 0


def test_cli_plot_without_matplotlib_says_so_and_exits_2(run_dir: Path, tmp_path: Path) -> None:
    # matplotlib is installed here: a package that fails to import stands in for the missing extra.
    fake = tmp_path / "nompl" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named matplotlib')\n")
    proc = run_supervise(["report", str(run_dir), "--plot", str(tmp_path / "p.png")],
                         env={"PYTHONPATH": f"{fake.parent}{os.pathsep}{Path(__file__).resolve().parent.parent}"})
    assert proc.returncode == 2
    err = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and "pip install 'slurm-supervisor[plot]'" in err[0]
    assert "Run exp1" in proc.stdout  # the report itself still came out
    assert not (tmp_path / "p.png").exists()


# ---------------------------------------------------------------------------------------------
# Status


def _owner(run_dir: Path, pid: int, host: str, started: float) -> None:
    (run_dir / "supervisor" / "lock.owner.json").write_text(
        json.dumps({"host": host, "pid": pid, "job_id": "1001", "started": started}))


def test_status_of_a_live_run(tmp_path: Path, base_manifest: dict) -> None:
    import time

    rd = tmp_path / "run"
    write_scenario(rd, {1: base_manifest}, finished=False)
    _owner(rd, os.getpid(), socket.gethostname(), time.time())  # this test process stands in for it
    live = check_alive(resolve_run_dir(rd))
    assert live.alive is True
    rep = build_report(rd, check_checkpoints=False)
    assert rep.run.outcome is None  # the first job's "requeue" is not the outcome of the run going on
    view = summarize_status(rep, live.alive, live.reason, live.owner, now=T0 + 760)
    assert view.state == "running" and view.attempt == 3 and view.last_step == 500 and view.rate == 2.0
    assert view.progress_age == 60.0
    assert view.last_checkpoint["step"] == 400 and view.checkpoint_age == 110.0
    assert view.restarts == 1 and view.requeues == 1 and view.steps_lost == 52 + 120  # the torn save's 120
    assert view.last_failure["class"] == "native_crash" and view.last_failure["step"] == 250
    # A preemption now loses the steps past the newest durable point (step 400), at the rate seen.
    assert view.at_risk_steps == 100 and view.at_risk_time == 50.0
    assert view.loss is None and view.max_step is None and view.eta is None  # nothing reported: nothing guessed
    text = render_status(view)
    assert "state: running" in text and "step 500, 2 steps/s" in text
    assert "a preemption now would lose 100 step(s) (~50s of training)" in text


def test_status_of_a_dead_supervisor_and_of_another_host(tmp_path: Path, base_manifest: dict) -> None:
    rd = tmp_path / "run"
    write_scenario(rd, {1: base_manifest}, finished=False)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    _owner(rd, gone.pid, socket.gethostname(), T0)
    proc = run_supervise(["status", str(rd), "--json"])
    assert proc.returncode == 0, proc.stderr
    view = json.loads(proc.stdout)
    assert view["alive"] is False and view["state"] == "dead" and "is gone" in view["liveness_reason"]
    _owner(rd, 1, "some-other-node", T0)
    view = json.loads(run_supervise(["status", str(rd), "--json"]).stdout)
    assert view["alive"] is None and "some-other-node" in view["liveness_reason"]


def test_status_of_a_finished_run(run_dir: Path) -> None:
    proc = run_supervise(["status", str(run_dir)])
    assert proc.returncode == 0
    assert "state: finished" in proc.stdout and "run ended: complete (supervise exit 0)" in proc.stdout
