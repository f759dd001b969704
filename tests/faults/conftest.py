"""Fixtures of the fault-injection tests: the saver zygote, a reproducible random seed, and the
skip/fail rule for faults this machine cannot stage."""

from __future__ import annotations

import os
import random
from typing import Iterator

import pytest

from faults.trials import SaverPool


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
