"""Issue 21, end to end with real processes: a nanoGPT-shaped zero-code child (one ``out/ckpt.pt``
rewritten in place, the step under ``iter_num``, ``--init_from=resume``, evaluation lines with a
step of their own, a config dump naming a step count) crashes by SIGSEGV twice after a save and
resumes from its own checkpoint each time, at the right step, with no false audit failure."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from helpers import events_named, run_supervise

pytest.importorskip("torch")

CHILD = str(Path(__file__).parent / "children" / "nanogpt_like.py")


def test_in_place_ckpt_with_iter_num_resumes_after_each_of_two_crashes(tmp_path: Path) -> None:
    run_dir, out = tmp_path / "run", tmp_path / "run" / "out"
    res = run_supervise(["run", "--run-dir", str(run_dir), "--checkpoint-dir", str(out),
                         "--set", "policy.native_crash.backoff=0.1", "--resume-arg", "--init_from=resume",
                         "--", sys.executable, CHILD, "--out_dir", str(out), "--max_iters", "40"],
                        env={"CRASH_AT": "15,25"})
    assert res.returncode == 0, res.stderr[-3000:]
    points = {e["attempt"]: e for e in events_named(run_dir, "resume_point")}
    assert (points[2]["step"], points[2]["step_source"]) == (10, "key iter_num")
    assert (points[3]["step"], points[3]["step_source"]) == (20, "key iter_num")
    assert events_named(run_dir, "resume_mismatch") == []
    ends = events_named(run_dir, "attempt_end")
    assert [e["class"] for e in ends] == ["native_crash", "native_crash", "completed"]
    assert [(e["first_step"], e["last_step"]) for e in ends] == [(0, 14), (10, 24), (20, 39)]
    assert all(e["step_source"] == "key iter_num" for e in events_named(run_dir, "save_end"))
    verify = run_supervise(["verify", str(out / "ckpt.pt")])
    assert "step 40 (key iter_num)" in verify.stdout


ACCELERATE = str(Path(__file__).parent / "children" / "accelerate_like.py")


def test_accelerate_automatic_naming_resumes_at_the_right_step_from_a_save_index(tmp_path: Path) -> None:
    run_dir, project = tmp_path / "run", tmp_path / "run" / "project"
    res = run_supervise(["run", "--run-dir", str(run_dir), "--checkpoint-dir", str(project / "checkpoints"),
                         "--set", "policy.native_crash.backoff=0.1",
                         "--", sys.executable, ACCELERATE, "--project_dir", str(project), "--max_steps", "40"],
                        env={"CRASH_AT": "25"})
    assert res.returncode == 0, res.stderr[-3000:]
    saves = [(Path(e["path"]).name, e["step"], e["step_source"]) for e in events_named(run_dir, "save_end")
             if e["attempt"] == 1]
    assert saves == [("checkpoint_0", 10, "log"), ("checkpoint_1", 20, "log")]
    point = [e for e in events_named(run_dir, "resume_point") if e["attempt"] == 2][0]
    assert (Path(point["path"]).name, point["step"], point["step_source"]) == ("checkpoint_1", 20, "log")
    assert events_named(run_dir, "resume_mismatch") == []
    ends = events_named(run_dir, "attempt_end")
    assert [(e["class"], e["last_step"]) for e in ends] == [("native_crash", 25), ("completed", 40)]
    assert ends[1]["first_step"] == 21
