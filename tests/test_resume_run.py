"""Resuming every way people checkpoint, through the run loop (issue 21): the statement made at the
first save, a save outside the watched directory, a restart from scratch that would throw saved
progress away. The loop runs on fakes in milliseconds (tests/fakes.py); two real ``supervise run``
tests at the end use small children from tests/children/."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest

from fakes import ChildScript
from helpers import events_named, run_supervise
from supervisor.events import read_events
from supervisor.addons.notify import NotifyEvent, notification_for
from supervisor.addons.report.model import fold
from supervisor.states import RunOutcome
from test_run_loop import make

SEGV = signal.SIGSEGV


def _steps(first: int, last: int, start: float = 0.1, every: float = 0.05) -> list[tuple]:
    return [(start + i * every, "line", f"step {s} loss 1.0") for i, s in enumerate(range(first, last + 1))]


def _client_save(at: float, step: int, path: str) -> tuple:
    return (at, "msg", "save_end", {"step": step, "path": path, "ok": True, "bytes": 10, "duration": 0.01})


def _report_warnings(run_dir: Path) -> list[str]:
    return list(fold(read_events(run_dir / "supervisor" / "events.jsonl").events, {}).warnings)


def test_a_run_that_cannot_resume_is_told_at_its_first_save_not_at_its_first_crash(tmp_path: Path) -> None:
    own = tmp_path / "own"  # the client reports saves wherever the script writes them
    crash = ChildScript([*_steps(1, 12), _client_save(0.4, 5, str(own / "model_5.pt")), (2.0, "die", SEGV)])
    done = ChildScript([*_steps(1, 12), (1.0, "msg", "done", {}), (1.1, "exit", 0)])
    runner, w = make(tmp_path, [crash, done])
    runner.run()
    said = events_named(w["run_dir"], "resumability")
    assert len(said) == 1 and said[0]["attempt"] == 1 and said[0]["ok"] is False
    assert said[0]["missing"] == ["resume"] and said[0]["fix"].startswith("--resume-arg '--resume {path}'")
    failure = events_named(w["run_dir"], "failure")[0]
    assert said[0]["ts"] < failure["ts"]  # at the save, before the crash
    n = notification_for("resumability", said[0])
    assert n is not None and n.event is NotifyEvent.RESUMABILITY and "--resume-arg" in n.reason
    assert any("this run cannot resume (resume missing)" in line for line in _report_warnings(w["run_dir"])), \
        _report_warnings(w["run_dir"])


@pytest.mark.parametrize("sets", [("resume_arg=--init_from=resume",), ("resume_arg=--ckpt {path}",),
                                  ("resume_env=RESUME_FROM={path}",)])
def test_a_run_told_how_to_resume_says_it_can_and_warns_nobody(tmp_path: Path, sets: tuple[str, ...]) -> None:
    ckpt = tmp_path / "run" / "checkpoints"
    child = ChildScript([*_steps(1, 12), _client_save(0.4, 5, str(ckpt / "step=5.ckpt")),
                         (1.0, "msg", "done", {}), (1.1, "exit", 0)])
    runner, w = make(tmp_path, [child], sets=sets)
    assert runner.run().outcome is RunOutcome.COMPLETE
    said = events_named(w["run_dir"], "resumability")
    assert [(s["ok"], s["level"], s["step_read"]) for s in said] == [(True, "info", "5 (from client)")]
    assert not any("cannot resume" in line for line in _report_warnings(w["run_dir"]))


def test_a_script_that_resumes_by_itself_is_recognised_from_its_output(tmp_path: Path) -> None:
    ckpt = tmp_path / "run" / "checkpoints"
    child = ChildScript([(0.05, "line", "resumed from /data/own/ckpt.pt at step 40"), *_steps(41, 52),
                         _client_save(0.4, 45, str(ckpt / "step=45.ckpt")), (1.0, "msg", "done", {}),
                         (1.1, "exit", 0)])
    runner, w = make(tmp_path, [child])
    runner.run()
    said = events_named(w["run_dir"], "resumability")
    assert said[0]["ok"] is True and "resumes by itself" in said[0]["resume"]


def test_checkpoints_saved_outside_the_watched_directory_are_warned_and_a_restart_from_scratch_is_stopped(
        tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    first = ChildScript([*_steps(1, 12), (0.56, "line", f"saving checkpoint to {elsewhere}/ckpt.pt"),
                         (1.0, "die", SEGV)])
    again = ChildScript([*_steps(1, 30)])  # starts over from step 1: the save at step 10 is thrown away
    runner, w = make(tmp_path, [first, again])
    result = runner.run()
    said = events_named(w["run_dir"], "resumability")[0]
    assert said["attempt"] == 1 and said["ok"] is False and said["trigger"] == "save_elsewhere"
    assert said["fix"].startswith(f"--checkpoint-dir {elsewhere};")
    assert events_named(w["run_dir"], "save_elsewhere")[0]["step"] == 10
    assert result.outcome is RunOutcome.STOPPED and result.exit_code == 4
    mismatch = events_named(w["run_dir"], "resume_mismatch")[0]
    assert mismatch["attempt"] == 2 and mismatch["expected_step"] == 10
    assert f"pass --checkpoint-dir {elsewhere}" in mismatch["reason"]
    end = events_named(w["run_dir"], "run_end")[-1]
    assert end["stopped_by"] == "resume_audit" and "outside the watched checkpoint directory" in end["reason"]


def test_hf_trainer_lines_naming_files_inside_its_checkpoint_are_no_save_elsewhere(tmp_path: Path) -> None:
    save = "run/checkpoints/checkpoint-10"  # relative to the child's directory, as HF Trainer prints it
    child = ChildScript([*_steps(1, 12), (0.55, "line", f"Saving model checkpoint to {save}"),
                         (0.56, "line", f"Configuration saved in {save}/config.json"),
                         (0.57, "line", f"tokenizer config file saved in {save}/tokenizer_config.json"),
                         _client_save(0.6, 10, str(tmp_path / save)), (1.0, "msg", "done", {}), (1.1, "exit", 0)])
    runner, w = make(tmp_path, [child], sets=("resume_arg=--resume_from_checkpoint {path}",))
    assert runner.run().outcome is RunOutcome.COMPLETE
    assert events_named(w["run_dir"], "save_elsewhere") == []
    assert [s["ok"] for s in events_named(w["run_dir"], "resumability")] == [True]


def test_a_script_that_saves_elsewhere_and_resumes_from_there_by_itself_goes_on(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    first = ChildScript([*_steps(1, 12), (0.56, "line", f"saving checkpoint to {elsewhere}/ckpt.pt"),
                         (1.0, "die", SEGV)])
    again = ChildScript([(0.05, "line", f"resumed from {elsewhere}/ckpt.pt"), *_steps(11, 20),
                         (1.0, "msg", "done", {}), (1.1, "exit", 0)])
    runner, w = make(tmp_path, [first, again])
    assert runner.run().outcome is RunOutcome.COMPLETE
    assert not events_named(w["run_dir"], "resume_mismatch")


def test_steps_for_an_hour_with_no_checkpoint_seen_are_warned(tmp_path: Path) -> None:
    child = ChildScript([*_steps(1, 40, start=1.0, every=100.0), (4100.0, "msg", "done", {}), (4100.1, "exit", 0)])
    runner, w = make(tmp_path, [child], sets=("stall_timeout=100000",))
    runner.run()
    said = events_named(w["run_dir"], "resumability")
    assert len(said) == 1 and said[0]["trigger"] == "no_save" and said[0]["missing"] == ["checkpoint", "resume"]
    assert said[0]["fix"].startswith("--checkpoint-dir DIR")
    assert 3600 <= said[0]["ts"] - w["clock"].start < 3800


# --------------------------------------------------------------------------------------------- real runs

CHILDREN = Path(__file__).parent / "children"
FAST = ["--set", "policy.native_crash.backoff=0.1", "--quiet"]


def test_an_in_place_checkpoint_with_a_flag_and_no_path_is_resumed_after_each_of_two_crashes(tmp_path: Path) -> None:
    """nanoGPT-style: ``out/ckpt.pt`` rewritten in place, the step under ``iter_num``, resumed with
    ``--init_from=resume`` (the script knows where its checkpoint is). Two real SIGSEGVs."""
    pytest.importorskip("torch")
    run_dir, out = tmp_path / "run", tmp_path / "out"
    res = run_supervise(["run", "--run-dir", str(run_dir), "--checkpoint-dir", str(out), "--resume-arg",
                         "--init_from=resume", *FAST, "--", sys.executable, str(CHILDREN / "inplace_ckpt.py"),
                         f"--out_dir={out}", "--max_iters=30", "--eval_interval=10"],
                        env={"CRASH_AT": "1:15,2:25"}, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    starts = events_named(run_dir, "attempt_start")
    assert len(starts) == 3 and "--init_from=resume" not in starts[0]["argv"]
    assert all(s["argv"][-1] == "--init_from=resume" and s["resume_path"] == str(out / "ckpt.pt")
               for s in starts[1:])
    logs = [(run_dir / "supervisor" / f"attempt-{n}.log").read_text() for n in (2, 3)]
    assert "resuming from iter 10" in logs[0] and "resuming from iter 20" in logs[1]
    assert [e["class"] for e in events_named(run_dir, "attempt_end")] == ["native_crash", "native_crash", "completed"]
    assert not events_named(run_dir, "resume_mismatch")


def test_zero_code_with_checkpoints_outside_the_run_dir_is_warned_and_never_ok(tmp_path: Path) -> None:
    run_dir, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    res = run_supervise(["run", "--run-dir", str(run_dir), *FAST, "--", sys.executable,
                         str(CHILDREN / "saves_elsewhere.py"), str(elsewhere)], env={"CRASH_AT": "1:25"},
                        cwd=tmp_path)
    said = events_named(run_dir, "resumability")[0]
    assert said["attempt"] == 1 and said["ok"] is False and f"--checkpoint-dir {elsewhere}" in said["fix"]
    assert f"--checkpoint-dir {elsewhere}" in res.stderr and "CANNOT RESUME" in res.stderr
    assert res.returncode == 4, res.stderr[-3000:]  # the restart from scratch was caught
    status = run_supervise(["status", str(run_dir)])
    assert "this run cannot resume" in status.stdout
    report = run_supervise(["report", "--json", str(run_dir)])
    assert report.returncode == 1
    verdict = json.loads(report.stdout)["verdict"]
    assert verdict["ok"] is False and verdict["budget"] == "resume_audit"


def test_the_first_save_says_its_step_came_from_the_log_when_it_did(tmp_path: Path) -> None:
    """MACE: "Epoch N: head: ..." (read through --step-regex) and then tiny_run-1_epoch-N.pt, with no step
    inside. The statement at the first save names where its step came from, the log, not "inside the
    file" (what it said of any step that was not in the name)."""
    import io

    import torch

    buf = io.BytesIO()
    torch.save({"model": {"w": torch.zeros(2)}, "optimizer": {"state": {}, "param_groups": []}}, buf)
    lines = [(0.1 + 0.3 * e, "line", f"2026-12-02 15:11:18.437 INFO: Epoch {e}: head: Default, loss=1.0") for e in
             range(4)]
    writes = [(0.15 + 0.3 * e, "write", f"tiny_run-1_epoch-{e}.pt", buf.getvalue()) for e in range(4)]
    child = ChildScript([*lines, *writes, (1.5, "exit", 0)])
    runner, w = make(tmp_path, [child], sets=("resume_arg=--restart_latest", r"step_regex=Epoch (\d+): head:"))
    assert runner.run().outcome is RunOutcome.COMPLETE
    said = events_named(w["run_dir"], "resumability")
    saved = [e for e in events_named(w["run_dir"], "save_end") if e["step"] is not None]
    assert saved and said and said[0]["ok"] is True, said
    assert said[0]["step_read"] == f"{saved[0]['step']} (from {saved[0]['step_source']})", (said, saved)
    assert "inside the file" not in said[0]["step_read"]
