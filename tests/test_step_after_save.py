"""The step of a save named by its epoch, from the line the output prints after it (issue 21, item 2).

Plain data in (the output's lines as the training prints them, the saves as the watch sees them
begin), step and source out: the whole decision of supervisor/checkpoints/stepsource.py, through
the real line reader of supervisor/progress.py. The first case is Accelerate's public
test_checkpointing.py: it prints nothing while it trains, then saves ``epoch_<e>/``, evaluates and
prints ``epoch <e>: {..., 'epoch': <e>, 'step': <s>}``. The others are the ways a line after a
save is *not* that save's report (epochs counted from 1 on one side and 0 on the other, progress
lines, a line before the save): each keeps the lower bound and says why.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from supervisor.checkpoints.naming import parse_name
from supervisor.checkpoints.stepsource import (
    LOG_AFTER_SAVE,
    SaveStepTimeline,
    StepEvidence,
    choose_step,
)
from supervisor.progress import StepExtractor


def accelerate_line(epoch: int, step: int) -> str:
    """The one step line of Accelerate's test_checkpointing.py, exactly as it prints it."""
    return f"epoch {epoch}: {{'accuracy': 0.5, 'f1': 0.66, 'epoch': {epoch}, 'step': {step}}}"


@dataclass(frozen=True)
class Case:
    """``events``: (time, "save", name) when the watch first saw the save being written, (time,
    "line", text) when the supervisor read the line. The save asked about is ``save``."""

    events: tuple[tuple[float, str, str], ...]
    save: str
    ended: bool
    step: int | None
    source: str | None
    why: str  # a word the reason must contain


def decide(case: Case) -> tuple[int | None, str | None, str, bool]:
    """Replay the events as the run loop records them; the save's step, source, reason, settled."""
    extractor, timeline = StepExtractor(), SaveStepTimeline()
    log_at_start: int | None = None
    last: int | None = None
    for at, kind, text in case.events:
        if kind == "save":
            timeline.saw(text, at, parse_name(text).epoch)
            if text == case.save:
                log_at_start = last  # the step the output had printed when the save began
        else:
            match = extractor.match(text)
            if match is not None and not match.progress_only:
                timeline.line(at, match.value, match.epoch)
                last = match.value
    after = timeline.after(case.save, log_at_start, ended=case.ended)
    choice = choose_step(StepEvidence(case.save, log_step=log_at_start, log_after_step=after.step))
    return choice.step, choice.source, after.reason, after.settled


def epochs(lines: dict[float, str], saves: dict[float, str]) -> tuple[tuple[float, str, str], ...]:
    merged = [(t, "save", n) for t, n in saves.items()] + [(t, "line", x) for t, x in lines.items()]
    return tuple(sorted(merged, key=lambda e: (e[0], e[1] == "line")))  # same moment: the save first


QUIET = epochs({1.5: accelerate_line(0, 10), 3.5: accelerate_line(1, 20), 5.5: accelerate_line(2, 30)},
               {1.0: "epoch_0", 3.0: "epoch_1", 5.0: "epoch_2"})

CASES = {
    # Accelerate's script: its epoch_2 holds step 30; before, the step read when it began (20) was recorded.
    "accelerate: the line after epoch_2 is its step": Case(QUIET, "epoch_2", True, 30, LOG_AFTER_SAVE, "epoch 2"),
    "accelerate: the first save too": Case(QUIET, "epoch_0", False, 10, LOG_AFTER_SAVE, "epoch 0"),
    "the line read at the moment the save is seen": Case(
        epochs({1.0: accelerate_line(0, 10)}, {1.0: "epoch_0"}), "epoch_0", True, 10, LOG_AFTER_SAVE, "epoch 0"),
    "epoch=<e>.ckpt, a global_step line": Case(
        epochs({1.5: "Epoch 0 done, global_step 10", 3.5: "Epoch 1 done, global_step 20"},
               {1.0: "epoch=0.ckpt", 3.0: "epoch=1.ckpt"}), "epoch=1.ckpt", True, 20, LOG_AFTER_SAVE, "epoch 1"),
    # Names count from 0, the output from 1: "epoch 1" after epoch_0 is epoch_0's report, not epoch_1's.
    "names from 0, output from 1": Case(
        epochs({1.5: accelerate_line(1, 10), 3.5: accelerate_line(2, 20)}, {1.0: "epoch_0", 3.0: "epoch_1"}),
        "epoch_1", True, 10, "log", "before a save of epoch 1"),
    # Names count from 1, the output from 0 and prints after the save.
    "names from 1, output from 0, line after": Case(
        epochs({1.5: accelerate_line(0, 10), 3.5: accelerate_line(1, 20)}, {1.0: "epoch_1", 3.0: "epoch_2"}),
        "epoch_2", True, 10, "log", "before a save of epoch 0"),
    # Names count from 1, the output from 0 and prints *before* the save: the line after epoch_2
    # ("epoch 2: 30") is epoch_3's; only its first line (no epoch_0 ever) tells it.
    "names from 1, output from 0, line before": Case(
        epochs({0.9: accelerate_line(0, 10), 2.9: accelerate_line(1, 20), 4.9: accelerate_line(2, 30)},
               {1.0: "epoch_1", 3.0: "epoch_2", 5.0: "epoch_3"}), "epoch_2", False, 20, "log",
        "before a save of epoch 0"),
    # Same numbering, line before the save: the line after epoch_1 is epoch 2's.
    "same numbering, line before the save": Case(
        epochs({0.9: accelerate_line(0, 10), 2.9: accelerate_line(1, 20), 4.9: accelerate_line(2, 30)},
               {1.0: "epoch_0", 3.0: "epoch_1"}), "epoch_1", True, 20, "log", "before a save of epoch 0"),
    # A resumed attempt: the resume point (epoch_3, an earlier attempt's) is no save of this one.
    "resumed, the output names the resume point's epoch": Case(
        epochs({0.5: accelerate_line(3, 40), 2.5: accelerate_line(4, 50)}, {1.0: "epoch_4"}),
        "epoch_4", True, 40, "log", "before a save of epoch 3"),
    # Progress lines name the epoch: they name it before its save.
    "progress lines naming the epoch": Case(
        epochs({0.1 * k: f"{{'loss': 0.3, 'epoch': 0, 'step': {k}}}" for k in range(1, 10)}
               | {1.5: "{'loss': 0.3, 'epoch': 1, 'step': 11}"}, {1.0: "epoch_0"}),
        "epoch_0", True, 9, "log", "before a save of epoch 0"),
    "HF-style fractional epoch after the save": Case(
        epochs({1.5: "{'loss': 0.3, 'epoch': 0.5, 'step': 5}"}, {1.0: "epoch_0"}), "epoch_0", True, None, None,
        "no whole epoch"),
    "a name with no epoch: the line may be further training": Case(
        epochs({0.9: "step 10: loss 0.3", 1.5: "step 20: loss 0.2"}, {1.0: "model.pt"}), "model.pt", True, 10, "log",
        "counts no epoch"),
    "the next save began before any line": Case(
        epochs({3.5: accelerate_line(1, 20)}, {1.0: "epoch_0", 3.0: "epoch_1"}), "epoch_0", False, None, None,
        "no step line between"),
    "a line below what the output had said when the save began": Case(
        epochs({0.5: "global_step 12", 1.5: "epoch 0 done, global_step 10"}, {1.0: "epoch_0"}), "epoch_0", True,
        12, "log", "below"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_step_of_a_save_from_the_output_after_it(name: str) -> None:
    case = CASES[name]
    step, source, reason, settled = decide(case)
    assert settled
    assert (step, source) == (case.step, case.source), reason
    assert case.why in reason


def test_a_save_waits_while_the_output_has_said_nothing_since() -> None:
    """Between the save and its line (Accelerate evaluates there) the step is not settled yet."""
    step, source, reason, settled = decide(Case(QUIET[:5], "epoch_2", False, None, None, ""))
    assert not settled and (step, source) == (20, "log") and "yet" in reason


def test_precedence_name_inside_log_after_log() -> None:
    both = dict(log_step=20, log_after_step=30)
    assert choose_step(StepEvidence("epoch=2-step=31.ckpt", name_step=31, **both)).source == "name"
    assert choose_step(StepEvidence("epoch_2", inside_step=29, inside_key="step", **both)).source == "key step"
    after = choose_step(StepEvidence("epoch_2", **both))
    assert (after.step, after.source) == (30, LOG_AFTER_SAVE) and "20 from log" in after.reason


def test_a_break_of_the_pairing_is_not_forgotten_when_its_line_leaves_the_window() -> None:
    timeline = SaveStepTimeline()
    timeline.line(0.5, 10, 0)  # epoch 0 named before any save of epoch 0
    for k in range(SaveStepTimeline.MAX_LINES):
        timeline.line(1.0 + k, 11 + k, None)
    timeline.saw("epoch_1", 1000.0, 1)
    timeline.line(1001.0, 500, 1)
    after = timeline.after("epoch_1", 400, ended=True)
    assert after.step is None and "before a save of epoch 0" in after.reason


def test_a_save_seen_late_is_not_given_the_steps_printed_after_it(tmp_path) -> None:
    """A fast training (torchtune's recipe on a tiny model: a hundred steps a second) prints several
    steps between writing out/epoch_0/ and the moment the watch sees it. The step the output had
    reported then (12) is past the save's (10): the restart's first step 11 then looked like a
    resume below the resume point and the audit stopped the run. The save's step is the one the
    output had reported before its files were last written (their ctime, on the wall clock)."""
    import os
    from types import SimpleNamespace

    from supervisor.run.saves import reported_before_written, written_at

    save = tmp_path / "epoch_0"
    save.mkdir()
    (save / "model-00001-of-00001.bin").write_bytes(b"w" * 100)
    (save / "tokenizer.model").write_bytes(b"t" * 10)
    os.utime(save / "tokenizer.model", (1.0, 1.0))  # copied in with its old mtime kept (shutil.copy2)
    written = written_at(str(save))
    assert written is not None and written >= os.lstat(save / "model-00001-of-00001.bin").st_ctime
    timeline = SaveStepTimeline()
    # Step 10 read 5 ms after the files' ctime: the kernel's file clock lags by up to a tick.
    for step, offset in ((8, -0.3), (9, -0.2), (10, 0.005), (11, 0.1), (12, 0.2)):
        timeline.line(100.0 + step, step, None, wall=written + offset)
    state = SimpleNamespace(save_steps=timeline)
    assert reported_before_written(state, str(save), 12) == 10
    assert reported_before_written(state, str(save), 9) == 9  # never raised: the lower of the two
    # No line read by then, or none with a wall clock (a replay): the step when it was seen stands.
    assert reported_before_written(SimpleNamespace(save_steps=SaveStepTimeline()), str(save), 12) == 12
    bare = SaveStepTimeline()
    bare.line(100.0, 10, None)
    assert reported_before_written(SimpleNamespace(save_steps=bare), str(save), 12) == 12
    # A file time a minute away from the supervisor's clock (a network filesystem's server, skewed):
    # the two clocks say nothing of each other, so the step when the watch saw it stands.
    assert reported_before_written(state, str(save), 12, now_wall=written + 60) == 12
    assert reported_before_written(state, str(save), 12, now_wall=written - 60) == 12
    assert reported_before_written(state, str(save), 12, now_wall=written + 1) == 10
