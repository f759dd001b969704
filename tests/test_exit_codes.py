"""supervise's exit code keeps its documented meaning whatever the child exits (issue 21): a child
that exits 2, 3, 4 or 75 is reported as "the child exited N", and supervise exits 4 when policy
stops the run, 0 when the training completed. Real ``supervise run`` with a tiny child (no torch)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fakes import ChildScript
from helpers import events_named, run_supervise
from supervisor.states import RunOutcome
from test_run_loop import make

CHILD = str(Path(__file__).parent / "children" / "exits_with.py")
FAST = ["--set", "policy.unknown.backoff=0", "--quiet"]


@pytest.mark.parametrize("code", [2, 3, 4, 75])
def test_a_child_exit_status_that_looks_like_ours_is_never_passed_through(tmp_path: Path, code: int) -> None:
    """On the loop's fakes (milliseconds): the child keeps exiting ``code``; policy stops the run."""
    child = ChildScript([(0.1, "line", "step 3"), (0.2, "exit", code)])
    runner, w = make(tmp_path, [child], sets=("policy.unknown.backoff=0",))
    result = runner.run()
    assert result.outcome is RunOutcome.STOPPED and result.exit_code == 4
    end = events_named(w["run_dir"], "run_end")[-1]
    assert end["exit_code"] == 4 and end["child_exit_code"] == code and end["child_signal"] is None
    assert end["reason"].endswith(f"(the child exited {code})")
    assert [f["exit_code"] for f in events_named(w["run_dir"], "failure")] == [code, code]


def test_a_child_that_exits_75_is_stopped_with_4_and_the_report_says_whose_code_is_whose(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    res = run_supervise(["run", "--run-dir", str(run_dir), *FAST, "--", sys.executable, CHILD, "75"])
    assert res.returncode == 4, res.stderr[-2000:]  # not 75: nothing was handed back to Slurm
    assert "the child exited 75" in res.stderr and "supervise exits 4" in res.stderr
    assert not events_named(run_dir, "requeue")
    report = run_supervise(["report", str(run_dir)])
    assert "outcome: stopped (supervise exit 4): " in report.stdout
    assert "(the child exited 75)" in report.stdout


def test_a_usage_error_in_the_child_is_the_childs_not_ours(tmp_path: Path) -> None:
    child = ChildScript([(0.1, "line", "usage: train.py [-h] [--lr LR]"),
                         (0.1, "line", "train.py: error: unrecognized arguments: --bogus"), (0.2, "exit", 2)])
    runner, w = make(tmp_path, [child], sets=("policy.unknown.backoff=0",))
    result = runner.run()
    assert result.exit_code == 4 and "the child exited 2" in events_named(w["run_dir"], "run_end")[-1]["reason"]


def test_a_completed_run_exits_0(tmp_path: Path) -> None:
    child = ChildScript([(0.1, "line", "step 3"), (0.2, "msg", "done", {}), (0.3, "exit", 0)])
    runner, w = make(tmp_path, [child])
    result = runner.run()
    assert result.outcome is RunOutcome.COMPLETE and result.exit_code == 0
    assert events_named(w["run_dir"], "run_end")[-1]["child_exit_code"] == 0


def test_our_own_usage_error_is_2_and_starts_nothing(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    res = run_supervise(["run", "--run-dir", str(run_dir), "--resume-env", "NOT VALID", "--",
                         sys.executable, CHILD, "0"])
    assert res.returncode == 2 and "resume_env" in res.stderr and "Traceback" not in res.stderr
    assert not (run_dir / "supervisor" / "events.jsonl").exists()
