"""Fault 7: hostile inputs. A checkpoint pickle that would run code, symlinks out of the
checkpoint dir, forged control datagrams during a run, and a 256 MB single-line child output
(10 GB in the long version). Also what issue #13 found in the checkpoint dir of a real run: a
FIFO, a symlink loop, a 200,000-deep pickle, a deflate bomb and globals that slipped past a
denylist must neither hang, crash nor stop ``supervise run`` before the child starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import ckpt_factory as cf
import pytest

from faults.trials import (
    big_line_trial,
    forged_control_trial,
    hostile_pickle_trial,
    symlink_escape_trial,
)

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


def _hostile_dir(ckpt: Path, marker: Path) -> None:
    """A real step=40 checkpoint plus every kind of entry issue #13 found."""
    ckpt.mkdir(parents=True)
    good = cf.save_zip(ckpt / "step=40.ckpt", 40)
    os.mkfifo(ckpt / "model.pt.fifo-target")
    os.symlink("model.pt.fifo-target", ckpt / "step=90.ckpt")  # a FIFO behind a step name
    (ckpt / "step=80").mkdir()
    os.mkfifo(ckpt / "step=80" / "model.pt")  # a FIFO inside a directory checkpoint
    os.symlink("last.ckpt", ckpt / "last.ckpt")  # a symlink to itself
    cf.torch_zip_with_pickle(ckpt / "step=70.ckpt", cf.pickle_nested_tuple_key(200_000))
    cf.deflate_bomb_zip(ckpt / "step=60.ckpt", inflated_mb=200, size_field=1000)
    cf.with_data_pkl(good, ckpt / "step=50.ckpt",
                     cf.pickle_stack_global("torch.serialization", "os.system", f"touch {marker}"))
    cf.with_data_pkl(good, ckpt / "step=45.ckpt", cf.pickle_global_call("cProfile", "run", f"open({str(marker)!r}, 'w')"))


def test_issue_13_entries_never_hang_crash_or_run_code_in_verify_and_resume_point(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    ckpt, marker = tmp_path / "ckpt", tmp_path / "PWNED"
    _hostile_dir(ckpt, marker)
    # (verify's own argument check opens each path it is given: a FIFO given by name is the CLI's to
    # refuse; resume-point below lists the directory and meets it there)
    entries = sorted(str(p) for p in ckpt.iterdir() if p.name.startswith("step=") and p.name != "step=90.ckpt")
    started = time.monotonic()
    verify = subprocess.run([*cf.SUPERVISE, "verify", "--json", "--deep", *entries],
                            capture_output=True, text=True, timeout=120, check=False)
    point = subprocess.run([*cf.SUPERVISE, "resume-point", "--deep", "--quarantine", "--settle", "0", "--json",
                            str(ckpt)], capture_output=True, text=True, timeout=120, check=False)
    assert time.monotonic() - started < 120
    assert verify.returncode == 1 and "Traceback" not in verify.stderr, verify.stderr[-800:]
    rows = {Path(r["path"]).name: r for r in json.loads(verify.stdout)}
    assert [name for name, row in rows.items() if row["ok"]] == ["step=40.ckpt"]
    assert point.returncode == 0, point.stderr[-800:]
    chosen = json.loads(point.stdout)
    assert chosen["step"] == 40 and chosen["path"] == str(ckpt / "step=40.ckpt")
    moved = {Path(q["path"]).name for q in chosen["quarantined"] if q["ok"]}
    assert {"step=50.ckpt", "step=45.ckpt", "last.ckpt"} <= moved  # unsafe pickles and the loop
    assert (ckpt / "step=70.ckpt").exists() and (ckpt / "step=60.ckpt").exists()  # over a cap: left alone
    assert not marker.exists()


def test_issue_13_entries_do_not_stop_supervise_run_before_the_child_starts(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    run_dir, marker = tmp_path / "run", tmp_path / "PWNED"
    _hostile_dir(run_dir / "checkpoints", marker)
    child = "import os; print('resume from', os.environ.get('SUPERVISOR_RESUME_FROM'), flush=True)"
    done = subprocess.run([*cf.SUPERVISE_MAIN, "run", "--run-dir", str(run_dir), "--", sys.executable, "-c", child],
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, (done.returncode, done.stderr[-1500:])
    assert f"resume from {run_dir / 'checkpoints' / 'step=40.ckpt'}" in done.stdout + done.stderr
    assert not marker.exists()
