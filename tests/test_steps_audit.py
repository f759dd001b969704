"""The resume audit never stops a run on one line (issue 21): it judges the first step of the
training's own progress line, proven by a second reading, on fakes (tests/fakes.py, fake time)."""

from __future__ import annotations

import io
import signal
from pathlib import Path

import torch

from supervisor.progress import StepConfirmer
from supervisor.states import RunOutcome

from ckpt_factory import lightning_checkpoint, save_zip
from fakes import ChildScript
from helpers import events_named
from test_run_loop import make


def lines(*texts: str, start: float = 0.1, every: float = 0.1) -> list[tuple]:
    return [(start + i * every, "line", text) for i, text in enumerate(texts)]


def resumed_run(tmp_path: Path, script: ChildScript) -> tuple:
    runner, w = make(tmp_path, [script])
    save_zip(w["ckpt"] / "step=100.ckpt", 100)
    return runner.run(), w


def test_an_eval_counter_after_a_resume_does_not_stop_a_healthy_run(tmp_path: Path) -> None:
    script = ChildScript([*lines("eval step 0/50", "eval step 1/50", "step 101 loss 2.1", "step 102 loss 2.0"),
                          (0.6, "exit", 0)])
    result, w = resumed_run(tmp_path, script)
    assert result.outcome is RunOutcome.COMPLETE
    assert events_named(w["run_dir"], "resume_mismatch") == []
    assert events_named(w["run_dir"], "resumed")[0]["step"] == 101
    assert events_named(w["run_dir"], "attempt_end")[0]["first_step"] == 101


def test_one_stray_line_of_another_kind_never_sets_the_first_step(tmp_path: Path) -> None:
    script = ChildScript([*lines("data loader ready, shard step 0", "step 101 loss 2.1", "step 102 loss 2.0"),
                          (0.6, "exit", 0)])
    result, w = resumed_run(tmp_path, script)
    assert result.outcome is RunOutcome.COMPLETE
    assert events_named(w["run_dir"], "resume_mismatch") == []
    end = events_named(w["run_dir"], "attempt_end")[0]
    assert (end["first_step"], end["last_step"]) == (101, 102)


def test_a_real_restart_from_scratch_is_still_stopped(tmp_path: Path) -> None:
    script = ChildScript([*lines("step 0 loss 9.1", "step 1 loss 9.0", "step 2 loss 8.9"), (5.0, "exit", 0)])
    result, w = resumed_run(tmp_path, script)
    assert result.outcome is RunOutcome.STOPPED
    mismatch = events_named(w["run_dir"], "resume_mismatch")[0]
    assert (mismatch["expected_step"], mismatch["got_step"]) == (100, 0)


def test_a_single_line_before_a_crash_is_recorded_but_decides_nothing(tmp_path: Path) -> None:
    crash = ChildScript([*lines("step 0 loss 9.1"), (0.3, "die", signal.SIGSEGV)])
    healthy = ChildScript([*lines("step 101 loss 2.1", "step 102 loss 2.0"), (0.5, "exit", 0)])
    runner, w = make(tmp_path, [crash, healthy])
    save_zip(w["ckpt"] / "step=100.ckpt", 100)
    result = runner.run()
    assert result.outcome is RunOutcome.COMPLETE
    first = events_named(w["run_dir"], "resume_mismatch")[0]
    assert first["attempt"] == 1 and first["confirmed"] is False
    assert [e["class"] for e in events_named(w["run_dir"], "attempt_end")] == ["native_crash", "completed"]


def test_confirmer_counts_a_line_once_a_second_reading_proves_it() -> None:
    c = StepConfirmer()
    assert c.feed("a", 0) == ()  # one stray reading: nothing counts yet
    assert c.feed("b", 101) == ()
    assert c.feed("b", 102) == (101, 102)  # the progress line proved itself
    assert c.feed("b", 103) == (103,)
    assert c.unconfirmed() == ()  # once a line is trusted, strays seen once are never flushed


def test_confirmer_drops_a_first_reading_that_the_next_one_contradicts() -> None:
    c = StepConfirmer()
    assert c.feed("a", 500000) == ()
    assert c.feed("a", 3) == ()  # went back: the first one was the stray
    assert c.feed("a", 4) == (3, 4)
    assert c.feed("z", 500000) == ()  # far past the established progress: a stray until proven
    assert c.feed("y", 5) == (5,)  # continues the established progress (4): counts, shape not trusted
    resumed = StepConfirmer()
    assert resumed.feed("resumed", 10) == () and resumed.feed("s", 11) == ()
    assert resumed.feed("s", 12) == (10, 11, 12)  # the line just before the proven start agrees with it
    single = StepConfirmer()
    single.feed("x", 7)
    assert single.unconfirmed() == (7,)


HF_BAR = " {pct}%|###       | {n}/100 [00:10<00:20,  3.20it/s]"


def bar(n: int) -> str:
    return HF_BAR.format(pct=n, n=n)


def test_a_bare_bar_counts_steps_once_a_save_agrees_with_it_and_the_crash_step_is_known(tmp_path: Path) -> None:
    """HF Trainer: its log dicts carry no step, its bar counts optimizer steps. The save of step 30
    lands while the bar reads 30: from then on the bar is the step, a crash at 35 has lost 5 steps,
    and the next attempt's bar, starting right after the resume point, passes the audit."""
    buf = io.BytesIO()
    torch.save(lightning_checkpoint(30), buf)
    first = [(0.1 + 0.05 * i, "line", bar(n)) for i, n in enumerate(range(1, 31))]
    first += [(1.6, "write", "step=30.ckpt", buf.getvalue()),
              (1.7, "line", "{'loss': 0.5, 'grad_norm': 1.2, 'learning_rate': 4.8e-05, 'epoch': 0.3}")]
    first += [(3.0 + 0.05 * i, "line", bar(n)) for i, n in enumerate(range(31, 36))]
    first += [(4.0, "die", signal.SIGSEGV)]
    second = [(0.1 + 0.05 * i, "line", bar(n)) for i, n in enumerate(range(31, 41))] + [(1.0, "exit", 0)]
    runner, w = make(tmp_path, [ChildScript(first), ChildScript(second)])
    result = runner.run()
    assert result.outcome is RunOutcome.COMPLETE
    ends = events_named(w["run_dir"], "attempt_end")
    assert (ends[0]["last_step"], ends[1]["first_step"], ends[1]["last_step"]) == (35, 31, 40)
    assert events_named(w["run_dir"], "resume_point")[1]["step"] == 30
    assert events_named(w["run_dir"], "resume_mismatch") == []


def test_a_bare_bar_that_no_other_source_confirms_stays_progress_only(tmp_path: Path) -> None:
    script = ChildScript([*[(0.1 + 0.05 * i, "line", bar(n)) for i, n in enumerate(range(1, 11))],
                          (1.0, "exit", 0)])
    runner, w = make(tmp_path, [script])
    runner.run()
    assert events_named(w["run_dir"], "attempt_end")[0]["last_step"] is None


def test_a_save_with_no_step_anywhere_takes_the_log_step_and_resuming_past_it_is_fine(tmp_path: Path) -> None:
    """Zero-code, a checkpoint that holds no step (model.pt with weights only): the watch records
    the step the output showed when the save began, with step_source log; the next attempt resumes
    from it, and a child that resumes a little past that step is not a failed audit."""
    buf = io.BytesIO()
    torch.save({"weights": torch.zeros(4)}, buf)
    first = [(0.1 * n, "line", f"step {n} loss 0.5") for n in range(1, 21)]
    first += [(2.05, "write", "model.pt", buf.getvalue())]
    first += [(2.5 + 0.1 * i, "line", f"step {n} loss 0.5") for i, n in enumerate(range(21, 26))]
    first += [(3.5, "die", signal.SIGSEGV)]
    second = ChildScript([*lines("step 24 loss 0.4", "step 25 loss 0.4", "step 26 loss 0.4"), (0.6, "exit", 0)])
    runner, w = make(tmp_path, [ChildScript(first), second])
    result = runner.run()
    assert result.outcome is RunOutcome.COMPLETE
    save = [e for e in events_named(w["run_dir"], "save_end") if e["attempt"] == 1][0]
    assert (save["step"], save["step_source"]) == (20, "log")
    point = events_named(w["run_dir"], "resume_point")[1]
    assert (point["step"], point["step_source"]) == (20, "log")
    assert events_named(w["run_dir"], "resume_mismatch") == []
