"""Fixtures of the fault-injection tests: the saver zygote, a reproducible random seed, and the
skip/fail rule for faults this machine cannot stage."""

from __future__ import annotations

import collections
import json
import os
import random
from pathlib import Path
from typing import Iterator

import pytest

from faults.trials import SaverPool, TrialOutcome, summarize


@pytest.fixture(scope="session")
def fault_outcomes() -> Iterator[list[TrialOutcome]]:
    """Every trial outcome of the session. With FAULT_REPORT=path, their counts are written there
    at the end (the CI-sized figures of docs/reliability.md)."""
    outcomes: list[TrialOutcome] = []
    yield outcomes
    target = os.environ.get("FAULT_REPORT", "").strip()
    if target:
        by_kind: dict[str, list[TrialOutcome]] = collections.defaultdict(list)
        for outcome in outcomes:
            by_kind[outcome.kind].append(outcome)
        report = {kind: {"summary": summarize(kind, group), "outcomes": [o.to_dict() for o in group]}
                  for kind, group in by_kind.items()}
        Path(target).write_text(json.dumps(report, indent=1, default=str))


@pytest.fixture(scope="session")
def fault_seed() -> int:
    """FAULT_SEED=N repeats a run's random kill moments; otherwise a fresh seed, named in failures."""
    text = os.environ.get("FAULT_SEED", "").strip()
    return int(text) if text else random.SystemRandom().randrange(1 << 31)


@pytest.fixture(scope="session")
def saver_pool() -> Iterator[SaverPool]:
    pytest.importorskip("torch")
    with SaverPool() as pool:
        yield pool


def needs_mounts() -> None:
    """Mounting a tmpfs needs root (CI runs as root). Elsewhere: skip, saying why."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs (disk-full / read-only faults); CI runs as root")
