"""Faults 1-2: kill -9 of a process saving checkpoints in a loop, at random moments of its save
cycles, and (every fourth kill) placed half-way through a write by a pause point in the writer, so
the mid-write case is tested on every run, whatever the machine's load. Dozens of kills here;
hundreds in benchmarks/faults/run_trials.py (docs/reliability.md)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from faults.trials import SaverPool, TrialOutcome, kill_during_save_trial

pytestmark = pytest.mark.slow
KILLS = 24


def _run(pool: SaverPool, tmp_path: Path, seed: int, mode: str, record: list[TrialOutcome]) -> list[TrialOutcome]:
    rng = random.Random(seed)
    outcomes = [kill_during_save_trial(pool, tmp_path, i, rng, mode, placed=i % 4 == 3) for i in range(KILLS)]
    record += outcomes
    failed = [o.explain() for o in outcomes if not o.ok]
    assert not failed, f"FAULT_SEED={seed}:\n" + "\n".join(failed)
    return outcomes


def test_kill9_during_atomic_saves_leaves_nothing_torn_and_loses_no_completed_save(
        saver_pool: SaverPool, tmp_path: Path, fault_seed: int, fault_outcomes: list) -> None:
    outcomes = _run(saver_pool, tmp_path, fault_seed, "atomic", fault_outcomes)
    # Each kill placed mid-write left the writer's temp file behind (and nothing torn, above).
    placed = [o for o in outcomes if o.facts["placed"]]
    assert len(placed) == KILLS // 4 and all(o.facts["mid_write"] for o in placed), [o.label for o in placed]


def test_kill9_during_plain_torch_save_is_quarantined_and_resumed_from_a_valid_step(
        saver_pool: SaverPool, tmp_path: Path, fault_seed: int, fault_outcomes: list) -> None:
    outcomes = _run(saver_pool, tmp_path, fault_seed, "plain", fault_outcomes)
    # Each kill placed mid-write really tore the step file, and it was moved aside.
    placed = [o for o in outcomes if o.facts["placed"]]
    assert len(placed) == KILLS // 4 and all(o.facts["torn_quarantined"] >= 1 for o in placed), \
        [o.label for o in placed]
