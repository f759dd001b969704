"""Fault 7: hostile inputs. A checkpoint pickle that would run code, symlinks out of the
checkpoint dir, forged control datagrams during a run, and a 256 MB single-line child output
(10 GB in the long version)."""

from __future__ import annotations

from pathlib import Path

import pytest

from faults.trials import big_line_trial, forged_control_trial, hostile_pickle_trial, symlink_escape_trial

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def hostile_pickle(tmp_path_factory: pytest.TempPathFactory, fault_outcomes: list):
    pytest.importorskip("torch")
    outcome = hostile_pickle_trial(tmp_path_factory.mktemp("hostile"))
    fault_outcomes.append(outcome)
    return outcome


def test_a_hostile_checkpoint_pickle_is_never_executed(hostile_pickle) -> None:
    assert hostile_pickle.ok, hostile_pickle.explain()


def test_a_hostile_checkpoint_is_not_valid_and_not_resumed_from(hostile_pickle) -> None:
    assert not hostile_pickle.concerns, hostile_pickle.explain()


def test_symlinks_out_of_the_checkpoint_dir_are_never_moved_followed_or_written_through(
        tmp_path: Path, fault_outcomes: list) -> None:
    pytest.importorskip("torch")
    outcome = symlink_escape_trial(tmp_path)
    fault_outcomes.append(outcome)
    assert outcome.ok, outcome.explain()


def test_forged_control_datagrams_are_dropped_counted_and_the_run_completes(
        tmp_path: Path, fault_outcomes: list) -> None:
    pytest.importorskip("torch")
    outcome = forged_control_trial(tmp_path)
    fault_outcomes.append(outcome)
    assert outcome.ok, outcome.explain()


def test_a_256_mb_single_line_keeps_supervisor_memory_bounded_and_the_log_whole(
        tmp_path: Path, fault_outcomes: list) -> None:
    outcome = big_line_trial(tmp_path, megabytes=256)
    fault_outcomes.append(outcome)
    assert outcome.ok, outcome.explain()
