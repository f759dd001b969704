"""Fault 6c: the wall clock steps by two hours under a running supervisor (simulated inside the
supervisor process only, see faults/clockjump.py: the real clock of a shared machine must not be
changed). Timeouts must run on the monotonic clock; only Slurm's deadlines are wall-clock."""

from __future__ import annotations

from pathlib import Path

import pytest

from faults.trials import clock_jump_trial

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_a_clock_step_does_not_fake_a_stall_or_stretch_a_backoff(
        tmp_path: Path, direction: str, fault_outcomes: list) -> None:
    pytest.importorskip("torch")
    outcome = clock_jump_trial(tmp_path, 0, direction)
    fault_outcomes.append(outcome)
    assert outcome.ok, outcome.explain()
