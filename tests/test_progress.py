"""Step extraction from real-world log lines and the stall / slowdown / loss verdicts, with explicit
``now`` values (the trackers never read the clock)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.progress import (
    MAX_STEP,
    LossTracker,
    ProgressTracker,
    StepExtractor,
    clean_line,
    extract_loss,
)

ESC = "\x1b"

# (line, value, progress_only); value None = no counter in the line.
STEP_LINES = [
    # plain keyword forms: global steps
    ("step 123", 123, False),
    ("step: 123", 123, False),
    ("step=123", 123, False),
    ("Step 123/1000", 123, False),
    ("global_step=123", 123, False),
    ("global step 123", 123, False),
    ("iter 123", 123, False),
    ("iteration 123", 123, False),
    ("it 123/1000", 123, False),
    ("iter 100: loss 2.3412, time 50.12ms, mfu 30.12%", 100, False),  # nanoGPT
    ("step: 10  loss:  9.5432  memory: 12.1GiB(15.3%)  tps: 1,234", 10, False),  # torchtitan
    (" iteration      100/  500000 | consumed samples:         3200 | elapsed time", 100, False),  # Megatron
    ("[Rank 0] step=100, skipped=0, lr=[0.001], mom=[(0.9, 0.999)]", 100, False),  # DeepSpeed
    ("Iter(train) [ 450/1000]  lr: 1.0000e-03  eta: 0:10:00", 450, False),  # mmengine, iteration based
    ("epoch 001 | loss 7.5 | ppl 181 | num_updates 1000 | lr 0.0005", 1000, False),  # fairseq
    ("{'loss': 1.2345, 'grad_norm': 0.5, 'learning_rate': 5e-05, 'epoch': 0.5, 'step': 123}", 123, False),
    ('{"event": "train", "step": 123, "loss": 1.5}', 123, False),
    ("trainer/global_step: 4500  epoch: 3", 4500, False),
    # per-epoch counters: progress only
    ("Epoch 3, step 200, loss 0.5", 200, True),
    ("Epoch 0:  45%|████▌     | 450/1000 [00:10<00:12, 43.2it/s, v_num=0, loss=1.23]", 450, True),
    ("Epoch 0: 450it [00:10, 43.2it/s]", 450, True),
    (" 45%|████▌     | 450/1000 [00:10<00:12, 43.2it/s]", 450, True),  # a bare bar: could be per epoch
    ("Training steps:  45%|████▌     | 450/1000 [00:10<00:12, 43.2it/s]", 450, False),  # says steps
    ("[123/1000]", 123, True),
    ("Train: 0 [ 450/1000 ( 45%)]  Loss: 0.5432 (0.6000)  Time: 0.120s", 450, True),  # timm
    ("Train Epoch: 1 [640/60000 (1%)]\tLoss: 0.301200", 640, True),  # PyTorch MNIST example
    ("Epoch: [0]  [ 450/1000]  eta: 0:01:02  lr: 0.100000  loss: 2.1", 450, True),  # torchvision refs
    ("Epoch(train) [1][450/1000]  lr: 1.0000e-03", 450, True),  # mmdet, epoch based
    ("450/1000 [==========>...................] - ETA: 10s - loss: 0.5000", 450, True),  # Keras
    # tqdm redraws and colours: the last \r segment counts
    (f"{ESC}[32mEpoch 1:  10%|█         | 100/1000 [00:02<00:18]{ESC}[0m", 100, True),
    ("Epoch 1:  44%|████▍     | 440/1000 [00:10<00:12]\rEpoch 1:  45%|████▌     | 450/1000 [00:10<00:12]\r",
     450, True),
    (f"{ESC}[2K\rglobal_step=11\rglobal_step=12{ESC}[K", 12, False),
    # not a step
    ("max_steps=1000 warmup_steps=100 step_size=30", None, None),
    ("Running 3 steps per epoch", None, None),
    ("time/step 0.5s", None, None),
    ("step 0.5", None, None),
    ("Detected call of `lr_scheduler.step()` before `optimizer.step()`", None, None),
    ("Retrying it 3 times", None, None),
    ("loading checkpoint shards: done", None, None),
    ("", None, None),
]


@pytest.mark.parametrize("line,value,progress_only", STEP_LINES)
def test_default_patterns(line, value, progress_only):
    found = StepExtractor().match(line)
    if value is None:
        assert found is None
        return
    assert found is not None and (found.value, found.progress_only) == (value, progress_only)
    assert StepExtractor().extract(line) == (None if progress_only else value)


def test_a_user_regex_replaces_the_defaults_and_gives_global_steps():
    extractor = StepExtractor(r"\[it=(\d+)\]")
    assert extractor.extract("Epoch 3 [it=4200] loss 1.0") == 4200
    assert extractor.extract("step 10") is None  # defaults off


def test_clean_line_keeps_the_last_redraw_without_escapes():
    assert clean_line(f"a\rb {ESC}[1mbold{ESC}[0m\r  \r") == "b bold"
    assert clean_line("\r\r") == ""


@pytest.mark.parametrize("line,loss", [
    ("iter 100: loss 2.3412, time 50.12ms", 2.3412),
    ("Epoch 0: 45%|...| 450/1000 [00:10<00:12, v_num=0, loss=1.23]", 1.23),
    ("{'loss': 0.125, 'epoch': 0.5}", 0.125),
    ("train_loss: 5e-3", 0.005),
    ("step 5 | loss: nan", math.nan),
    ("loss=inf", math.inf),
    ("val_loss=0.3 eval_loss: 0.2", None),
    ("loss_scale: 65536.0", None),
])
def test_extract_loss(line, loss):
    found = extract_loss(line)
    if loss is None:
        assert found is None
    elif math.isnan(loss):
        assert found is not None and math.isnan(found)
    else:
        assert found == loss


# ---------------------------------------------------------------------------------------------
# Stall


def test_stall_after_progress_stops_for_the_timeout():
    tracker = ProgressTracker(started_at=1000.0)
    for i, now in enumerate([1010.0, 1011.0, 1012.0]):
        tracker.observe(100 + i, now)
    tracker.observe(102, 1040.0)  # the same step again: alive, but no progress
    assert tracker.is_stalled(1072.0, stall_timeout=60) is None
    verdict = tracker.is_stalled(1072.5, stall_timeout=60)
    assert verdict is not None and verdict.last_step == 102 and verdict.idle_s == pytest.approx(60.5)
    assert not verdict.never_progressed and "60" in verdict.reason
    assert tracker.is_stalled(5000.0, stall_timeout=0) is None  # 0 = disabled
    assert (tracker.first_step, tracker.last_step, tracker.last_progress_at) == (100, 102, 1012.0)


def test_a_child_that_never_progresses_stalls_after_the_startup_grace():
    tracker = ProgressTracker(started_at=0.0)
    assert tracker.is_stalled(119.0, stall_timeout=60) is None  # timeout + grace = 120 s
    verdict = tracker.is_stalled(121.0, stall_timeout=60)
    assert verdict is not None and verdict.never_progressed and verdict.last_step is None


def test_progress_only_counters_and_saves_keep_the_child_alive():
    tracker = ProgressTracker(started_at=0.0)
    tracker.observe_counter(998, 10.0)
    tracker.observe_counter(999, 20.0)
    tracker.observe_counter(1, 30.0)  # new epoch: the batch counter restarts
    assert tracker.last_step is None and tracker.last_progress_at == 30.0
    tracker.touch(80.0)  # a long save began
    assert tracker.is_stalled(130.0, stall_timeout=60) is None
    assert tracker.is_stalled(141.0, stall_timeout=60) is not None


# ---------------------------------------------------------------------------------------------
# Rate and slowdown


def feed(tracker: ProgressTracker, start: float, end: float, steps_per_s: float, step: int) -> int:
    now = start
    while now < end:
        step += 1
        tracker.observe(step, now)
        now += 1.0 / steps_per_s
    return step


def test_rate_over_the_window_and_its_decay_when_steps_stop():
    tracker = ProgressTracker(started_at=0.0, rate_window=60.0)
    assert tracker.rate(0.0) is None
    feed(tracker, 0.0, 120.0, 10.0, 0)
    assert tracker.rate(120.0) == pytest.approx(10.0, rel=0.05)
    assert tracker.rate(240.0) == pytest.approx(0.0, abs=0.01)


def test_counter_resets_count_as_work_for_the_rate():
    tracker = ProgressTracker(started_at=0.0, rate_window=10.0)
    for t in range(30):  # 2 batches/s, epochs of 20 batches
        tracker.observe_counter((2 * t) % 20, float(t))
    assert tracker.rate(29.0) == pytest.approx(2.0, rel=0.15)


def run_slowdown(tracker: ProgressTracker, start: float, end: float, rate: float, step: int,
                 fraction: float = 0.5, window: float = 300.0) -> tuple[int, list]:
    """Feed steps at ``rate`` and call slowdown() every second, as the run loop would."""
    verdicts = []
    now = start
    next_step_at = start
    while now < end:
        while next_step_at <= now:
            step += 1
            tracker.observe(step, next_step_at)
            next_step_at += 1.0 / rate
        verdict = tracker.slowdown(now, fraction, window)
        if verdict:
            verdicts.append((now, verdict))
        now += 1.0
    return step, verdicts


def test_slowdown_is_reported_once_after_the_window_and_not_for_noise():
    tracker = ProgressTracker(started_at=0.0, rate_window=60.0)
    step, verdicts = run_slowdown(tracker, 0.0, 1200.0, 10.0, 0)
    assert verdicts == []  # a steady rate is never a slowdown
    step, verdicts = run_slowdown(tracker, 1200.0, 1500.0, 6.0, step)  # 60 %: above half
    assert verdicts == []
    step, verdicts = run_slowdown(tracker, 1500.0, 2400.0, 3.0, step)  # 30 % for 15 minutes
    assert len(verdicts) == 1
    at, verdict = verdicts[0]
    assert 1500.0 + 300.0 <= at <= 1500.0 + 300.0 + 90.0  # window + the smoothing of the rate
    assert verdict.rate < 0.5 * verdict.median_rate and verdict.fraction == 0.5
    assert "median" in verdict.reason


def test_slowdown_memory_is_bounded():
    tracker = ProgressTracker(started_at=0.0, rate_window=4.0)
    run_slowdown(tracker, 0.0, 20000.0, 5.0, 0, window=30.0)
    assert len(tracker._rate_samples) <= ProgressTracker.RATE_SAMPLES
    assert len(tracker._work_points) <= ProgressTracker.WORK_SAMPLES


# ---------------------------------------------------------------------------------------------
# Loss


def test_nonfinite_loss_is_an_anomaly_reported_once_per_run():
    tracker = LossTracker(spike_factor=10.0)
    assert tracker.observe(1, 2.0) is None
    verdict = tracker.observe(2, float("nan"))
    assert verdict is not None and verdict.kind == "nan" and verdict.step == 2
    assert tracker.observe(3, float("nan")) is None  # same run of NaNs
    assert tracker.observe(4, float("inf")).kind == "inf"
    assert tracker.observe(5, 2.0) is None
    assert tracker.observe(6, float("nan")).kind == "nan"  # a new run


def test_a_spike_over_factor_times_the_running_median():
    tracker = LossTracker(spike_factor=10.0, history=50, min_history=10)
    assert tracker.observe(0, 500.0) is None  # no history yet: the first losses are often large
    for step in range(1, 30):
        assert tracker.observe(step, 2.0 + 0.01 * (step % 5)) is None
    assert tracker.observe(30, 19.0) is None  # under 10x
    verdict = tracker.observe(31, 25.0)
    assert verdict is not None and verdict.kind == "spike" and verdict.median == pytest.approx(2.02)
    assert tracker.observe(32, 2.0) is None
    assert tracker.observe(33, None) is None


def test_negative_losses_never_spike():
    tracker = LossTracker(spike_factor=10.0, min_history=3)
    for step in range(10):
        assert tracker.observe(step, -5.0) is None
    assert tracker.observe(10, 100.0) is None


@pytest.mark.parametrize("line", [
    "FAULT_RESTART_FROM_ZERO: ignoring resume point /tmp/run/checkpoints/step=30.ckpt",
    "Restoring states from the checkpoint path at runs/exp/checkpoints/epoch=3-step=9500.ckpt",
    "saved step=40.ckpt",
    "loading ./ckpt/global_step1200/mp_rank_00_model_states.pt",
])
def test_step_numbers_inside_paths_are_not_progress(line: str) -> None:
    """A checkpoint path names a step but is not a step report: reading it would fool the resume audit."""
    assert StepExtractor().extract(line) is None


# ---------------------------------------------------------------------------------------------
# Steps are bounded integers (issue #13 item 1): a hostile or broken line never kills the loop.

HUGE = "9" * 400


@pytest.mark.parametrize("line", [
    f"global_step={HUGE}",
    f"step {HUGE}",
    f"{{'loss': 1.0, 'step': {HUGE}}}",
    "step 9007199254740992",  # 2**53: the first value out of range
])
def test_out_of_range_counters_are_not_steps_and_are_counted(line: str) -> None:
    extractor = StepExtractor()
    assert extractor.extract(line) is None
    assert extractor.rejected == 1
    assert extractor.extract("global_step=7") == 7  # and the extractor keeps working


@pytest.mark.parametrize("line", ["step ١٢٣", "global_step=٤٥", "iter ١٢/٣٤"])
def test_non_ascii_digits_are_not_steps(line: str) -> None:
    """Arabic-Indic digits: int() reads them, and \\d matches them unless the pattern is ASCII-only."""
    assert StepExtractor().extract(line) is None


def test_the_largest_step_is_accepted() -> None:
    assert StepExtractor().extract(f"step {MAX_STEP - 1}") == MAX_STEP - 1


def test_a_user_regex_with_unicode_digits_is_held_to_ascii_steps() -> None:
    extractor = StepExtractor(r"it=(\d+)")
    assert extractor.extract("it=١٢٣") is None and extractor.rejected == 1
    assert extractor.extract(f"it={HUGE}") is None and extractor.rejected == 2
    assert extractor.extract("it=123") == 123


def test_the_tracker_ignores_and_counts_values_that_are_not_steps() -> None:
    tracker = ProgressTracker(started_at=0.0, rate_window=10.0)
    assert tracker.observe(10, 1.0)
    for bad in (10**400, -1, MAX_STEP, True):
        assert not tracker.observe(bad, 2.0)  # type: ignore[arg-type]
        assert not tracker.observe_counter(bad, 2.0)  # type: ignore[arg-type]
    assert tracker.observe(20, 3.0)
    assert tracker.rejected == 8 and tracker.last_step == 20
    assert tracker.rate(3.0) == pytest.approx(5.0)


def test_a_loss_too_large_for_a_float_is_ignored() -> None:
    assert LossTracker().observe(1, 10**400) is None  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.integers(), st.text(alphabet="0123456789١٢٣ step=/[]%|it", max_size=60)),
                max_size=40))
def test_nothing_the_output_says_makes_the_trackers_raise(items: list[object]) -> None:
    extractor = StepExtractor()
    tracker = ProgressTracker(started_at=0.0, rate_window=4.0)
    for now, item in enumerate(items, start=1):
        if isinstance(item, str):
            found = extractor.match(item)
            if found is not None:
                assert 0 <= found.value < MAX_STEP
                (tracker.observe_counter if found.progress_only else tracker.observe)(found.value, float(now))
        else:
            tracker.observe(item, float(now))
        tracker.rate(float(now))
        tracker.is_stalled(float(now), 1.0)
        tracker.slowdown(float(now), 0.5, 2.0)
