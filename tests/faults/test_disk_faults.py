"""Faults 5-6: a full disk during a save, a read-only checkpoint filesystem, a checkpoint
directory that vanishes mid-run. Real filesystems: a 5 MiB tmpfs, a tmpfs remounted read-only."""

from __future__ import annotations

from pathlib import Path

import pytest

from faults.conftest import needs_mounts
from faults.trials import Unavailable, disk_full_trial, read_only_trial, vanishing_dir_trial

pytestmark = pytest.mark.slow


def _mounted(fn, tmp_path: Path, record: list):
    needs_mounts()
    try:
        outcome = fn(tmp_path)
    except Unavailable as exc:  # root, but this container forbids mounts: say so, do not pass
        pytest.skip(str(exc))
    record.append(outcome)
    return outcome


def test_disk_full_during_a_save_fails_cleanly_and_keeps_the_previous_checkpoint(
        tmp_path: Path, fault_outcomes: list) -> None:
    pytest.importorskip("torch")
    outcome = _mounted(disk_full_trial, tmp_path, fault_outcomes)
    assert outcome.ok, outcome.explain()
    assert outcome.facts["used_bytes"] < 5 << 20  # the failed save's temp file gave its space back


def test_read_only_checkpoint_dir_is_reported_and_nothing_is_lost(tmp_path: Path, fault_outcomes: list) -> None:
    pytest.importorskip("torch")
    outcome = _mounted(read_only_trial, tmp_path, fault_outcomes)
    assert outcome.ok, outcome.explain()


@pytest.fixture(scope="module")
def vanished(tmp_path_factory: pytest.TempPathFactory, fault_outcomes: list):
    pytest.importorskip("torch")
    outcome = vanishing_dir_trial(tmp_path_factory.mktemp("vanish"))
    fault_outcomes.append(outcome)
    return outcome


def test_vanished_checkpoint_dir_fails_the_attempt_cleanly(vanished) -> None:
    assert vanished.ok, vanished.explain()


def test_vanished_checkpoint_dir_is_not_a_silent_fresh_start(vanished) -> None:
    assert not vanished.concerns, vanished.explain()
