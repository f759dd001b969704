"""The post-mortem on real runs (issue 7): real ``supervise run`` sessions of the example trainings
(real SIGSEGVs, real torch checkpoints, real signals), then ``supervise report --json`` /
``--plot`` / ``supervise status --json`` read what those runs left behind.

Each scenario runs once per module (the runs are the expensive part) and several tests read it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import EXAMPLES, events_named, run_supervise, start_supervise, wait_for

pytest.importorskip("torch")
PY = sys.executable
PLAIN = str(EXAMPLES / "train_plain.py")
ZERO = str(EXAMPLES / "train_zero_code.py")
FAST = ["--set", "policy.native_crash.backoff=0.1"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def report_json(run_dir: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    res = run_supervise(["report", "--json", *extra, str(run_dir)])
    assert res.stdout.strip(), res.stderr[-3000:]
    return res.returncode, json.loads(res.stdout)


def log_text(run_dir: Path, attempt: int) -> str:
    return (run_dir / "supervisor" / f"attempt-{attempt}.log").read_text()


def wait_for_log(run_dir: Path, attempt: int, pattern: str, timeout: float = 60) -> re.Match[str]:
    found: list[re.Match[str]] = []

    def seen() -> bool:
        path = run_dir / "supervisor" / f"attempt-{attempt}.log"
        match = re.search(pattern, path.read_text()) if path.exists() else None
        if match:
            found.append(match)
        return match is not None

    assert wait_for(seen, timeout), f"{pattern!r} never appeared in attempt-{attempt}.log"
    return found[0]


# ---------------------------------------------------------------------------------------------
# (a) a native crash, a restart in place, a resume


@pytest.fixture(scope="module")
def crash_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("crash") / "run"
    res = run_supervise(["run", "--run-dir", str(run_dir), *FAST, "--", PY, PLAIN, "--steps", "30",
                         "--save-every", "10"], env={"FAULT_SEGFAULT_AT": "15"})
    assert res.returncode == 0, res.stderr[-3000:]
    return run_dir


def test_crash_restart_resume_timeline(crash_run: Path) -> None:
    code, rep = report_json(crash_run)
    first, second = rep["attempts"]
    assert first["class"] == "native_crash" and first["signal"] == "SIGSEGV"
    assert re.search(r"SIGSEGV|Segmentation fault", first["evidence"] or ""), first["evidence"]
    assert first["last_step"] == 15 and first["last_durable_step"] == 10
    assert first["steps_lost"] == first["last_step"] - first["last_durable_step"] == 5
    assert first["action"] == "restart"
    assert second["resume_step"] == 10 and second["resume_path"].endswith("step=10.ckpt")
    assert second["first_step"] == 10 and second["class"] == "completed" and second["last_step"] == 30
    assert rep["run"]["outcome"] == "complete" and rep["run"]["attempts"] == 2 and rep["run"]["restarts"] == 1
    assert rep["run"]["steps_lost"] == 5 and rep["run"]["final_step"] == 30
    assert rep["verdict"]["ok"] is True
    assert rep["run"]["problems"] == [] and code == 0, rep["run"]["problems"]


# ---------------------------------------------------------------------------------------------
# (b) a torn last.ckpt is quarantined on the next start


@pytest.fixture(scope="module")
def quarantine_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("quarantine") / "run"
    ckpt = run_dir / "checkpoints"
    args = ["run", "--run-dir", str(run_dir), "--resume-arg", "--ckpt_path {path}", "--", PY, ZERO,
            "--ckpt-dir", str(ckpt), "--save-every", "10"]
    first = run_supervise(args + ["--steps", "20"])
    assert first.returncode == 0, first.stderr[-3000:]
    # Simulate a kill in the middle of rewriting last.ckpt in place (train_zero_code overwrites it
    # with a plain torch.save): cut the file to a third. The next job starts minutes later, so the
    # torn file is not "still being written": its mtime is set a minute back.
    last = ckpt / "last.ckpt"
    size = last.stat().st_size
    with open(last, "r+b") as fh:
        fh.truncate(size // 3)
    past = time.time() - 60
    os.utime(last, (past, past))
    second = run_supervise(args + ["--steps", "30"])
    assert second.returncode == 0, second.stderr[-3000:]
    return run_dir


def test_quarantined_torn_checkpoint_is_listed_and_the_run_resumed_from_the_newest_valid_one(
        quarantine_run: Path) -> None:
    _code, rep = report_json(quarantine_run)
    rows = rep["quarantined"]
    assert len(rows) == 1, rows
    row = rows[0]
    assert row["original"].endswith("last.ckpt") and row["file"].startswith("CORRUPT_last.ckpt")
    assert row["reason"] and row["on_disk"] is True
    assert (quarantine_run / "checkpoints" / row["file"]).exists()
    last = quarantine_run / "checkpoints" / "last.ckpt"
    rewritten = json.loads(run_supervise(["verify", "--json", str(last)]).stdout)
    assert rewritten[0]["ok"] and rewritten[0]["verdict"] == "valid"  # written anew by the resumed run
    resumed = rep["attempts"][-1]
    assert resumed["resume_step"] == 20 and resumed["resume_path"].endswith("step=20.ckpt")
    assert re.search(r"resumed from \S+step=20\.ckpt at step 20", log_text(quarantine_run, 2))
    assert rep["run"]["outcome"] == "complete" and rep["run"]["final_step"] == 30


# ---------------------------------------------------------------------------------------------
# (c, d, f) one realistic story: a crash and a restart in place; `supervise status` while attempt 2
# trains; a preemption notice (emergency save, exit 75); the job comes back under a changed config
# (someone raised stall_timeout between the two jobs) and resumes exactly at the emergency save.


def latest_step(run_dir: Path, attempt: int) -> int | None:
    steps = re.findall(r"^step (\d+) loss", log_text(run_dir, attempt), re.MULTILINE)
    return int(steps[-1]) if steps else None


def status_json(run_dir: Path) -> dict[str, Any]:
    res = run_supervise(["status", "--json", str(run_dir)])
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)


@pytest.fixture(scope="module")
def preempt_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    run_dir = tmp_path_factory.mktemp("preempt") / "run"
    train = ["--", PY, PLAIN, "--steps", "300", "--save-every", "10"]
    common = ["run", "--run-dir", str(run_dir), *FAST, "--set", "progress_event_interval=0.2"]
    proc = start_supervise(common + ["--set", "stall_timeout=600"] + train + ["--step-time", "0.03"],
                           env={"FAULT_SEGFAULT_AT": "15"})
    live: dict[str, Any] = {}
    try:
        wait_for_log(run_dir, 2, r"step 1[2-9] loss", timeout=90)  # attempt 2 is training

        def progressing() -> bool:
            live.update(status_json(run_dir))
            return live.get("attempt") == 2 and isinstance(live.get("last_step"), int) and live["last_step"] > 10

        wait_for(progressing, 30, interval=0.2)
        # Signal between two saves (step 10k+3..10k+7): a stop right after a save would rightly be
        # "stop now, nothing to save", and this scenario is about the emergency save.
        assert wait_for(lambda: (latest_step(run_dir, 2) or 0) > 10 and 3 <= latest_step(run_dir, 2) % 10 <= 7,
                        60, interval=0.01), log_text(run_dir, 2)[-2000:]
        proc.send_signal(signal.SIGTERM)  # a stop notice, as Slurm sends at the start of a grace
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    first_code = proc.returncode
    stopped = re.search(r"stopping at step (\d+)", log_text(run_dir, 2))
    saved = re.findall(r"saved step (\d+) to", log_text(run_dir, 2))
    again = run_supervise(common + ["--set", "stall_timeout=900"] + train + ["--step-time", "0.005"])
    assert again.returncode == 0, again.stderr[-3000:]
    return {"run_dir": run_dir, "first_code": first_code, "first_err": err, "stopped": stopped, "saved": saved,
            "live": live, "done": status_json(run_dir)}


def test_preemption_emergency_save_and_exact_resume(preempt_run: dict[str, Any]) -> None:
    run_dir = preempt_run["run_dir"]
    assert preempt_run["first_code"] == 75, preempt_run["first_err"][-3000:]
    assert preempt_run["stopped"], log_text(run_dir, 2)
    stop_step = int(preempt_run["stopped"].group(1))
    assert preempt_run["saved"][-1] == str(stop_step)  # saved where it stopped
    child_says = re.search(r"resumed from (\S+) at step (\d+)", log_text(run_dir, 3))
    assert child_says and int(child_says.group(2)) == stop_step
    assert child_says.group(1).endswith(f"step={stop_step}.ckpt")

    assert [e["signal"] for e in events_named(run_dir, "notice")] == ["TERM"]
    assert events_named(run_dir, "arbitration")[0]["decision"] == "emergency_save"
    notice_ts = events_named(run_dir, "notice")[0]["ts"]
    after = [e for e in events_named(run_dir, "save_end") if e["attempt"] == 2 and e["ts"] > notice_ts]
    assert [(e["step"], e["ok"]) for e in after] == [(stop_step, True)]
    starts = events_named(run_dir, "attempt_start")
    assert [s["resume_step"] for s in starts] == [None, 10, stop_step]
    resumed = [e for e in events_named(run_dir, "resumed") if e["attempt"] == 3]
    assert resumed[0]["step"] == stop_step and resumed[0]["ok"] is True

    _code, rep = report_json(run_dir)
    _a1, a2, a3 = rep["attempts"]
    assert [a["class"] for a in rep["attempts"]] == ["native_crash", "preempted", "completed"]
    assert a2["notice"] is True and a2["last_durable_step"] == stop_step and a2["steps_lost"] == 0
    assert a3["resume_step"] == stop_step and a3["last_step"] == 300
    assert [j["ended_by"] for j in rep["run"]["jobs"]] == ["requeue", "complete"]
    assert rep["run"]["restarts"] == 1 and rep["run"]["requeues"] == 1 and rep["run"]["outcome"] == "complete"
    assert rep["verdict"]["ok"] is True


def test_resume_under_a_changed_config_shows_config_drift(preempt_run: dict[str, Any]) -> None:
    run_dir = preempt_run["run_dir"]
    code, rep = report_json(run_dir)
    hashes = [e["config_hash"] for e in events_named(run_dir, "run_start")]
    assert len(set(hashes)) == 2  # stall_timeout 600 in the first job, 900 after the requeue
    drift = [d for d in rep["drift"] if d["what"] == "supervisor config (hash)"]
    assert len(drift) == 1, rep["drift"]
    assert (drift[0]["from_attempt"], drift[0]["to_attempt"]) == (2, 3)  # not between 1 and 2
    assert (drift[0]["old"], drift[0]["new"]) == tuple(hashes)
    assert rep["run"]["config_hashes"] == hashes
    assert any("supervisor config" in p for p in rep["run"]["problems"]) and code == 1


def test_status_of_a_live_run_then_of_the_finished_run(preempt_run: dict[str, Any]) -> None:
    live, done = preempt_run["live"], preempt_run["done"]
    assert live.get("alive") is True and live["state"] == "running", live
    assert live["attempt"] == 2 and isinstance(live["last_step"], int) and live["last_step"] > 10, live
    assert live["last_failure"]["class"] == "native_crash" and live["restarts"] == 1
    assert live["outcome"] is None
    assert done["alive"] is False and done["state"] == "finished"
    assert done["attempt"] == 3 and done["outcome"] == "complete" and done["last_step"] == 300


# ---------------------------------------------------------------------------------------------
# (e) the plot of the crash + preemption run


def test_plot_is_a_png_whose_markers_match_the_scenario(preempt_run: dict[str, Any], tmp_path: Path) -> None:
    png = tmp_path / "timeline.png"
    _code, rep = report_json(preempt_run["run_dir"], "--plot", str(png))
    assert png.read_bytes()[:8] == PNG_SIGNATURE and png.stat().st_size > 5000
    markers = rep["plot"]["markers"]
    assert rep["plot"]["path"] == str(png)
    # attempt 1 crashed; attempt 2 restarted in place, was preempted; attempt 3 came back after the
    # requeue (exit 75) and resumed at the emergency save; attempts 2 and 3 both resumed.
    assert markers["attempts"] == 3
    assert markers["failures"] == 1
    assert markers["restarts"] == 2 and markers["requeues"] == 1
    assert markers["preemptions"] == 1
    assert markers["resumes"] == 2
    assert markers["checkpoints"] == sum(a["saves_ok"] for a in rep["attempts"])
