"""Atomic saves survive SIGKILL at any moment; last.ckpt is never a symlink; retention never
leaves fewer than two valid checkpoints."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import ckpt_factory as cf
from supervisor.checkpoints.atomic import atomic_torch_save, atomic_write_bytes, atomic_writer, update_last
from supervisor.checkpoints.retention import prune
from supervisor.checkpoints.scan import list_candidates
from supervisor.checkpoints.validate import validate
from supervisor.states import Verdict

_WRITER = """
import sys, torch
from supervisor.checkpoints.atomic import atomic_torch_save
state = {"w": torch.randn(3_000_000), "global_step": 0}
step = 0
while True:
    step += 1
    state["global_step"] = step
    atomic_torch_save(state, sys.argv[1])
    print(step, flush=True)
"""


def test_sigkill_during_atomic_saves_never_leaves_a_torn_file(tmp_path: Path) -> None:
    target = tmp_path / "last.ckpt"
    rng = random.Random(7)
    for _ in range(2):
        child = subprocess.Popen([sys.executable, "-c", _WRITER, str(target)], stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout is not None and child.stdout.readline().strip()  # one save done
            time.sleep(rng.uniform(0.0, 0.25))
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
        report = validate(target)
        assert report.verdict is Verdict.VALID, report.reason
        assert list_candidates(tmp_path) == [str(target)]  # leftover temps are hidden and ignored


def test_writer_error_leaves_the_old_file_and_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "state.bin"
    atomic_write_bytes(target, b"old")
    with pytest.raises(RuntimeError):
        with atomic_writer(target) as handle:
            handle.write(b"new partial")
            raise RuntimeError("disk full")
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["state.bin"]


def test_atomic_torch_save_replaces_a_symlink_instead_of_writing_through_it(tmp_path: Path) -> None:
    step = cf.save_zip(tmp_path / "step=100.ckpt", 100)
    before = step.read_bytes()
    os.symlink(step.name, tmp_path / "last.ckpt")
    atomic_torch_save(cf.lightning_checkpoint(200), tmp_path / "last.ckpt")
    assert step.read_bytes() == before  # torch.save would have overwritten the step checkpoint
    assert not os.path.islink(tmp_path / "last.ckpt") and validate(tmp_path / "last.ckpt").embedded_step == 200


def test_update_last_is_a_hard_link_never_a_symlink(tmp_path: Path) -> None:
    step = cf.save_zip(tmp_path / "step=100.ckpt", 100)
    assert update_last(step, tmp_path / "last.ckpt") == "link"
    last = tmp_path / "last.ckpt"
    assert not last.is_symlink() and os.path.samefile(step, last)
    newer = cf.save_zip(tmp_path / "step=200.ckpt", 200)
    update_last(newer, last)
    assert os.path.samefile(newer, last) and validate(step).embedded_step == 100
    atomic_torch_save(cf.lightning_checkpoint(300), last)  # the client's next save replaces the link
    assert validate(newer).embedded_step == 200 and validate(last).embedded_step == 300


def test_update_last_copies_across_filesystems(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs a second filesystem (/dev/shm) to make a hard link impossible")
    step = cf.save_zip(tmp_path / "step=100.ckpt", 100)
    last = shm / f"last-{os.getpid()}.ckpt"
    try:
        assert update_last(step, last) == "copy"
        assert last.read_bytes() == step.read_bytes()
    finally:
        last.unlink(missing_ok=True)


def test_update_last_refuses_a_directory(tmp_path: Path) -> None:
    step = cf.save_zip(tmp_path / "step=100.ckpt", 100)
    cf.make_lightning_deepspeed(tmp_path / "last.ckpt", 100)
    with pytest.raises(IsADirectoryError):
        update_last(step, tmp_path / "last.ckpt")
    assert (tmp_path / "last.ckpt" / "checkpoint").is_dir()


def test_prune_keeps_two_valid_and_the_protected_ones(tmp_path: Path) -> None:
    for step in (100, 200, 300, 400, 500):
        cf.save_zip(tmp_path / f"step={step}.ckpt", step)
    torn = cf.save_zip(tmp_path / "step=600.ckpt", 600)
    cf.truncate(torn, 100)
    os.symlink("step=100.ckpt", tmp_path / "last.ckpt")
    plan = prune(tmp_path, keep=0, protect=[tmp_path / "step=200.ckpt"])
    left = sorted(os.listdir(tmp_path))
    assert left == ["last.ckpt", "step=100.ckpt", "step=200.ckpt", "step=400.ckpt", "step=500.ckpt", "step=600.ckpt"]
    assert plan.delete == (str(tmp_path / "step=300.ckpt"),) and plan.failed == ()


def test_atomic_module_imports_without_torch() -> None:
    code = "import sys, supervisor.checkpoints.atomic; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o644])
@pytest.mark.parametrize("durable", [True, False])
def test_the_one_writer_gives_the_mode_asked_for_whatever_the_umask(tmp_path: Path, mode: int, durable: bool) -> None:
    # The supervisor's files (supervisor/private.py) and the sharded commit markers go through this
    # writer: a file that can hold a command line gets its documented bits, even over a wider file.
    target = tmp_path / "owner.json"
    target.write_bytes(b"old")
    os.chmod(target, 0o666)
    old_umask = os.umask(0)
    try:
        atomic_write_bytes(target, b"new", mode, durable=durable)
    finally:
        os.umask(old_umask)
    assert target.read_bytes() == b"new" and (target.stat().st_mode & 0o777) == mode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["owner.json"]  # no temp file left
