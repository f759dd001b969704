"""Fault 3: `srun supervise run -- python examples/train_plain.py` preempted on the real test
cluster at chosen moments (before the first save, inside a save, right after one, at random),
with saves shorter and longer than the 3 s grace. Four trials, two at a time (one per node)."""

from __future__ import annotations

import random

import pytest

from faults.trials import default_preempt_choice, run_preemption_batch

pytestmark = pytest.mark.slow
TRIALS = 4
GRACE = 3


def test_preempted_runs_complete_with_every_attempt_accounted_and_nothing_torn(
        slurm_cluster, slurm_job_dir, fault_seed: int, fault_outcomes: list) -> None:
    pytest.importorskip("torch")
    with slurm_cluster.grace(GRACE):
        outcomes = run_preemption_batch(slurm_cluster, slurm_job_dir, 0, TRIALS, random.Random(fault_seed),
                                        default_preempt_choice)
    fault_outcomes += outcomes
    failed = [o.explain() for o in outcomes if not o.ok]
    assert not failed, f"FAULT_SEED={fault_seed}:\n" + "\n".join(failed)
