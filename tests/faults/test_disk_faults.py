"""Faults 5-6: a full disk during a save, a read-only checkpoint filesystem, a checkpoint
directory that vanishes mid-run. Real filesystems: a 5 MiB tmpfs, a tmpfs remounted read-only.
And the run directory's lock when the directory is deleted mid-run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import REPO

from faults.conftest import needs_mounts
from faults.trials import (
    Unavailable,
    disk_full_trial,
    read_only_trial,
    vanishing_dir_trial,
)
from supervisor.errors import RunLockedError
from supervisor.lock import LockState, RunLock, judge_lock


def _mounted(fn, tmp_path: Path, record: list):
    needs_mounts()
    try:
        outcome = fn(tmp_path)
    except Unavailable as exc:  # root, but this container forbids mounts: say so, do not pass
        pytest.skip(str(exc))
    record.append(outcome)
    return outcome


@pytest.mark.slow
def test_disk_full_during_a_save_fails_cleanly_and_keeps_the_previous_checkpoint(
        tmp_path: Path, fault_outcomes: list) -> None:
    pytest.importorskip("torch")
    outcome = _mounted(disk_full_trial, tmp_path, fault_outcomes)
    assert outcome.ok, outcome.explain()
    assert outcome.facts["used_bytes"] < 5 << 20  # the failed save's temp file gave its space back


@pytest.mark.slow
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


@pytest.mark.slow
def test_vanished_checkpoint_dir_fails_the_attempt_cleanly(vanished) -> None:
    assert vanished.ok, vanished.explain()


@pytest.mark.slow
def test_vanished_checkpoint_dir_is_not_a_silent_fresh_start(vanished) -> None:
    assert not vanished.concerns, vanished.explain()


# ---------------------------------------------------------------------------------------------
# The lock on a run directory deleted mid-run (issue #13 item 4). Real files, real processes.


def _lock(run: Path) -> RunLock:
    return RunLock(run / "supervisor" / "lock", run / "supervisor" / "lock.owner.json")


HOLDER = textwrap.dedent("""\
    import sys, time
    from pathlib import Path
    from supervisor.lock import RunLock
    run = Path(sys.argv[1])
    lock = RunLock(run / "supervisor" / "lock", run / "supervisor" / "lock.owner.json")
    lock.acquire({"SLURM_JOB_ID": "4242"})
    print("held", flush=True)
    time.sleep(60)
""")


def test_a_second_supervisor_is_refused_and_told_who_holds_the_run(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], env=env, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(RunLockedError, match=f"pid {holder.pid}, Slurm job 4242"):
            _lock(tmp_path).acquire({})
    finally:
        holder.kill()
        holder.wait()
    lock = _lock(tmp_path)
    lock.acquire({})  # the kernel dropped the dead holder's lock
    assert lock.still_held()
    lock.release()


def test_a_deleted_run_directory_is_detected_and_the_lock_retaken(tmp_path: Path) -> None:
    run = tmp_path / "run"
    first = _lock(run)
    first.acquire({})
    assert first.check().state is LockState.HELD
    shutil.rmtree(run)

    check = first.check()
    assert check.state is LockState.PATH_GONE and not first.still_held()
    assert "deleted" in check.reason
    assert first.reacquire({}).state is LockState.HELD  # re-created, locked again
    with pytest.raises(RunLockedError):
        _lock(run).acquire({})  # and a second supervisor is refused again
    first.release()


def test_a_second_supervisor_that_took_the_path_is_named_when_the_first_looks(tmp_path: Path) -> None:
    run = tmp_path / "run"
    first = _lock(run)
    first.acquire({})
    shutil.rmtree(run)
    second = _lock(run)
    second.acquire({"SLURM_JOB_ID": "77"})  # the old failure: it starts on the same run directory

    assert first.check().state is LockState.REPLACED
    with pytest.raises(RunLockedError, match="Slurm job 77"):
        first.reacquire({})
    assert second.still_held()
    second.release()
    first.release()


def test_the_lock_excludes_the_filelock_of_earlier_versions(tmp_path: Path) -> None:
    from filelock import FileLock, Timeout

    run = tmp_path / "run"
    ours = _lock(run)
    ours.acquire({})
    with pytest.raises(Timeout):
        FileLock(str(run / "supervisor" / "lock"), timeout=0).acquire()
    ours.release()
    theirs = FileLock(str(run / "supervisor" / "lock"), timeout=0)
    theirs.acquire()
    try:
        with pytest.raises(RunLockedError):
            _lock(run).acquire({})
    finally:
        theirs.release()


def test_judge_lock_reads_the_two_file_ids() -> None:
    assert judge_lock((1, 2), 1, (1, 2), "p").state is LockState.HELD
    assert judge_lock((1, 2), 0, None, "p").state is LockState.PATH_GONE
    assert judge_lock((1, 2), 1, (1, 3), "p").state is LockState.REPLACED
    assert judge_lock(None, 0, (1, 2), "p").state is LockState.NOT_HELD
