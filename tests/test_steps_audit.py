"""The resume audit never stops a run on one line (issue 21): it judges the first step of the
training's own progress line, proven by a second reading, on fakes (tests/fakes.py, fake time)."""

from __future__ import annotations

import signal
from pathlib import Path

from supervisor.progress import StepConfirmer
from supervisor.states import RunOutcome

from ckpt_factory import save_zip
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
    single = StepConfirmer()
    single.feed("x", 7)
    assert single.unconfirmed() == (7,)
