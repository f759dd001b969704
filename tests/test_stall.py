"""Stall detection on by default: the timeout learned from the gaps between step reports, the
startup limit for a child that never reports a step, and a fixed ``stall_timeout`` winning. Each
limit is checked through the real ProgressTracker, which gives the run loop's stall verdict."""

from __future__ import annotations

import pytest

from supervisor.config import StallConfig, load_config
from supervisor.errors import ConfigError
from supervisor.progress import ProgressTracker
from supervisor.stall import SURVIVED, StallTimeout, p99

CFG = StallConfig(floor=600.0, multiple=10.0, warmup_reports=20, startup_limit=1800.0)


def feed(stall: StallTimeout, tracker: ProgressTracker, gaps: list[float], start: float = 0.0) -> float:
    """Report steps 1, 2, ... separated by ``gaps``; returns the time of the last report."""
    now, step = start, 0
    stall.observe(step, now)
    tracker.observe(step, now)
    for gap in gaps:
        now += gap
        step += 1
        stall.observe(step, now)
        tracker.observe(step, now)
    return now


def stalled(stall: StallTimeout, tracker: ProgressTracker, now: float) -> bool:
    limit = stall.limit(never_progressed=tracker.last_progress_at is None)
    return tracker.is_stalled(now, limit.tracker_timeout) is not None


def test_stall_detection_is_on_by_default() -> None:
    cfg = load_config(environ={})
    assert cfg.stall_timeout == 0 and cfg.stall.enabled
    limit = StallTimeout(cfg.stall, cfg.stall_timeout).limit(never_progressed=True)
    assert limit.seconds > 0 and limit.phase == "startup"


def test_a_child_that_never_reports_a_step_is_caught_at_the_startup_limit() -> None:
    stall, tracker = StallTimeout(CFG), ProgressTracker(started_at=100.0)
    assert not stalled(stall, tracker, 100.0 + CFG.startup_limit - 1)
    assert stalled(stall, tracker, 100.0 + CFG.startup_limit + 1)
    assert "startup limit 1800 s" in stall.limit(never_progressed=True).reason


def test_during_the_warm_up_the_startup_limit_counts_from_the_last_report() -> None:
    stall, tracker = StallTimeout(CFG), ProgressTracker(started_at=0.0)
    last = feed(stall, tracker, [1.0] * 5)
    assert stall.timeout() is None and stall.limit(False).phase == "warmup"
    assert not stalled(stall, tracker, last + CFG.startup_limit - 1)
    assert stalled(stall, tracker, last + CFG.startup_limit + 1)


def test_after_the_warm_up_fast_steps_get_the_floor() -> None:
    stall, tracker = StallTimeout(CFG), ProgressTracker(started_at=0.0)
    last = feed(stall, tracker, [0.5] * CFG.warmup_reports)
    assert stall.timeout() == CFG.floor
    assert not stalled(stall, tracker, last + CFG.floor - 1)
    assert stalled(stall, tracker, last + CFG.floor + 1)


def test_a_slow_print_interval_raises_the_timeout_to_a_multiple_of_its_p99() -> None:
    """A script that logs every ~100 s must not be called stalled at 600 s."""
    gaps = [90.0 + (i % 7) * 3.0 for i in range(60)]
    stall, tracker = StallTimeout(CFG), ProgressTracker(started_at=0.0)
    last = feed(stall, tracker, gaps)
    expected = max(CFG.floor, CFG.multiple * p99(gaps))
    assert expected > CFG.floor and stall.timeout() == pytest.approx(expected)
    assert not stalled(stall, tracker, last + expected - 1)
    assert stalled(stall, tracker, last + expected + 1)
    assert "p99 gap" in stall.limit(False).reason


def test_a_rare_long_silent_phase_the_run_came_through_is_not_a_stall_next_time() -> None:
    """An evaluation pass of 20 minutes once in 1000 reports is far outside the p99; the run came
    through it, so the next one must not be called a stall."""
    gaps = ([1.0] * 499 + [1200.0]) * 2
    stall, tracker = StallTimeout(CFG), ProgressTracker(started_at=0.0)
    last = feed(stall, tracker, gaps)
    assert p99(gaps) == 1.0
    assert stall.timeout() == pytest.approx(SURVIVED * 1200.0)
    assert not stalled(stall, tracker, last + 1300.0)


def test_what_was_learned_carries_over_a_restart_but_the_restart_is_not_a_gap() -> None:
    stall = StallTimeout(CFG)
    feed(stall, ProgressTracker(started_at=0.0), [100.0] * CFG.warmup_reports)
    learned = stall.timeout()
    stall.start_attempt()
    tracker = ProgressTracker(started_at=10_000.0)
    # the new attempt's start-up gets the startup limit, not the learned one
    assert stall.limit(never_progressed=True).phase == "startup"
    assert not stalled(stall, tracker, 10_000.0 + CFG.startup_limit - 1)
    feed(stall, tracker, [1.0], start=10_500.0)  # first report long after the last of attempt 1
    assert stall.timeout() == learned and stall.gaps == CFG.warmup_reports + 1


def test_the_first_save_ends_the_warm_up() -> None:
    stall, tracker = StallTimeout(CFG), ProgressTracker(started_at=0.0)
    feed(stall, tracker, [2.0, 2.0])
    assert stall.timeout() is None
    stall.saved()
    assert stall.timeout() == CFG.floor and stall.limit(False).phase == "learned"


def test_repeated_reports_of_the_same_step_are_not_progress() -> None:
    stall = StallTimeout(CFG)
    for t in range(10):
        stall.observe(7, float(t))
    assert stall.gaps == 0


def test_an_explicit_stall_timeout_wins() -> None:
    stall, tracker = StallTimeout(CFG, fixed=120.0), ProgressTracker(started_at=0.0)
    last = feed(stall, tracker, [0.5] * 30)
    assert stall.timeout() == 120.0 and stall.limit(False).phase == "fixed"
    assert stalled(stall, tracker, last + 121)


def test_an_explicit_stall_timeout_starts_at_the_first_step_of_each_attempt() -> None:
    """A 4 s stall_timeout is a gap between steps: an attempt whose start-up (imports, the resume
    checkpoint, a compile) takes longer is not a hang; one that never reports a step still is, at
    the startup limit."""
    stall, tracker = StallTimeout(CFG, fixed=4.0), ProgressTracker(started_at=0.0)
    assert stall.limit(never_progressed=True).phase == "startup"
    assert "stall_timeout 4 s applies from the first step" in stall.limit(never_progressed=True).reason
    assert not stalled(stall, tracker, 30.0)
    assert stalled(stall, tracker, CFG.startup_limit + 1)
    short = StallTimeout(StallConfig(startup_limit=2.0), fixed=4.0)  # the longer of the two applies
    assert short.limit(never_progressed=True).phase == "fixed"


def test_stall_detection_can_be_turned_off() -> None:
    stall, tracker = StallTimeout(StallConfig(enabled=False)), ProgressTracker(started_at=0.0)
    assert stall.limit(True).phase == "off"
    assert not stalled(stall, tracker, 10**7)


@pytest.mark.parametrize("key, value", [("floor", "0"), ("multiple", "0.5"), ("warmup_reports", "0"),
                                        ("startup_limit", "0")])
def test_bad_stall_settings_are_refused_with_the_key(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=f"stall.{key}"):
        load_config(environ={f"SUPERVISE_STALL__{key.upper()}": value})


def test_progress_judged_by_the_tracker_feeds_the_same_gaps() -> None:
    """The run loop reports progress as ProgressTracker.observe/observe_counter judge it: counters
    and global steps interleaved still give one gap per progress."""
    stall, tracker = StallTimeout(CFG), ProgressTracker(started_at=0.0)
    now = 0.0
    for i in range(30):
        now += 5.0
        if tracker.observe(i, now):
            stall.progress(now)
        now += 5.0
        if tracker.observe_counter(i % 7, now):  # an epoch-local counter between the steps
            stall.progress(now)
    assert stall.gaps == 59 and stall.timeout() == max(CFG.floor, CFG.multiple * 5.0)
