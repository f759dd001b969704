"""Fault 4: the supervisor itself is SIGKILLed mid-run: its child must not outlive it, and the
next start takes the lock over and resumes from the newest valid checkpoint."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from faults.trials import supervisor_killed_trial

pytestmark = pytest.mark.slow


def test_sigkilled_supervisor_leaves_no_orphan_and_the_next_start_resumes(
        tmp_path: Path, fault_seed: int, fault_outcomes: list) -> None:
    pytest.importorskip("torch")
    outcome = supervisor_killed_trial(tmp_path, 0, random.Random(fault_seed))
    fault_outcomes.append(outcome)
    assert outcome.ok, f"FAULT_SEED={fault_seed}: {outcome.explain()}"
