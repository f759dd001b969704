"""Zero-code runs (no client) with real processes: the ledger agrees with the resume point, saves
of an in-place last.ckpt carry the step stored inside it, the single-copy hazard is loud, and an
output burst never hides the newest step."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from helpers import events_named, run_supervise

pytest.importorskip("torch")

PY = sys.executable
ZERO = str(Path(__file__).resolve().parents[1] / "examples" / "train_zero_code.py")
FAST = ["--set", "policy.native_crash.backoff=0.1", "--resume-arg", "--ckpt_path {path}"]


def test_crash_at_35_with_saves_every_10_loses_5_steps_and_resumes_from_30(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    res = run_supervise(["run", "--run-dir", str(run_dir), *FAST, "--", PY, ZERO, "--steps", "50",
                         "--save-every", "10", "--ckpt-dir", str(run_dir / "checkpoints")],
                        env={"FAULT_SEGFAULT_AT": "35"})
    assert res.returncode == 0, res.stderr[-3000:]
    audit = run_supervise(["audit", "--json", str(run_dir)])
    import json

    attempts = json.loads(audit.stdout)["attempts"]
    assert attempts[0]["class"] == "native_crash" and attempts[0]["last_step"] == 35
    assert attempts[1]["resume_step"] == 30
    assert attempts[0]["steps_lost"] == 5  # 35 - 30: the save of step 30 counts, however late it was seen


def test_in_place_last_ckpt_saves_carry_their_step_and_the_single_copy_hazard_is_loud(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    res = run_supervise(["run", "--run-dir", str(run_dir), *FAST, "--", PY, ZERO, "--steps", "40", "--step-time", "0.05",
                         "--save-every", "10", "--last-only", "--ckpt-dir", str(run_dir / "checkpoints")],
                        env={"FAULT_SEGFAULT_AT": "35"})
    assert res.returncode == 0, res.stderr[-3000:]
    saves = [e for e in events_named(run_dir, "save_end") if e["attempt"] == 1]
    assert [s["step"] for s in saves if Path(s["path"]).name == "last.ckpt"] == [10, 20, 30]
    resume = [e for e in events_named(run_dir, "resume_point") if e["attempt"] == 2][0]
    assert Path(resume["path"]).name == "last.ckpt" and resume["step"] == 30
    warnings = [w for w in events_named(run_dir, "warning") if w.get("reason") == "single checkpoint copy"]
    assert warnings and "keep at least two" in warnings[0]["detail"].lower()
    assert "SINGLE CHECKPOINT COPY" in res.stderr


def test_a_burst_of_60000_step_lines_ends_with_the_last_step(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    script = "import sys\nfor i in range(1, 60001):\n    sys.stdout.write(f'step {i} loss 0.5\\n')\n"
    res = run_supervise(["run", "--quiet", "--run-dir", str(run_dir), "--", PY, "-c", script])
    assert res.returncode == 0, res.stderr[-3000:]
    end = events_named(run_dir, "attempt_end")[0]
    assert end["last_step"] == 60000
