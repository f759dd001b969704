"""A save in flight as the kernel sees it: checkpoint files the child's process tree holds open for
writing (/proc/PID/fd + fdinfo). Real processes, placed deterministically: each opens its files,
says "ready" and waits on stdin, so the test looks exactly while the files are open."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.openfiles import tree_pids, writers_in_tree
from supervisor.run.writers import looks_like_a_save

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fdinfo"), reason="needs Linux /proc")

HOLDER = r"""
import os, sys
specs = sys.argv[1:]
held = []
for spec in specs:
    mode, path = spec.split(":", 1)
    flags = {"w": os.O_WRONLY | os.O_CREAT, "rw": os.O_RDWR | os.O_CREAT, "r": os.O_RDONLY}[mode]
    held.append(os.open(path, flags, 0o600))
print("ready", flush=True)
sys.stdin.readline()
"""


def hold(*specs: str, setsid: bool = False, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """Start a process (in a session of its own, like the training child) holding ``specs`` open."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, *specs], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, start_new_session=True, env=env)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def release(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(10)


def test_a_file_held_open_for_writing_under_the_dir_is_a_writer_read_only_and_outside_are_not(tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoints"
    ckpt.mkdir()
    (ckpt / "step=10.ckpt").write_bytes(b"old")
    proc = hold(f"w:{ckpt}/step=20.ckpt", f"r:{ckpt}/step=10.ckpt", f"w:{tmp_path}/train.log",
                f"rw:{ckpt}/last.ckpt")
    try:
        found = sorted(w.path for w in writers_in_tree(proc.pid, "", str(ckpt)))
    finally:
        release(proc)
    assert found == [os.path.realpath(ckpt / "last.ckpt"), os.path.realpath(ckpt / "step=20.ckpt")]
    assert writers_in_tree(proc.pid, "", str(ckpt)) == []  # closed: nothing in flight any more


def test_a_grandchild_and_a_process_that_left_the_session_are_part_of_the_tree(tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoints"
    ckpt.mkdir()
    marker = "f00d" * 8
    env = {**os.environ, "SUPERVISOR_PROCESS_TREE": marker}
    # A shell (the "training") whose background worker writes the checkpoint: same group and session.
    shell = subprocess.Popen(["sh", "-c", f'{sys.executable} -c \'{HOLDER}\' w:{ckpt}/step=3.ckpt; exit 0'],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
    # A process in a session of its own (it called setsid), found only by the tree's marker.
    loner = hold(f"w:{ckpt}/step=4.ckpt", env=env)
    try:
        assert shell.stdout is not None and shell.stdout.readline().strip() == "ready"
        in_tree = tree_pids(shell.pid, marker)
        assert shell.pid in in_tree and loner.pid in in_tree and len(in_tree) >= 3
        found = sorted(os.path.basename(w.path) for w in writers_in_tree(shell.pid, marker, str(ckpt)))
        assert found == ["step=3.ckpt", "step=4.ckpt"]
        assert [os.path.basename(w.path) for w in writers_in_tree(shell.pid, "", str(ckpt))] == ["step=3.ckpt"]
    finally:
        release(shell)
        release(loner)


def test_only_checkpoint_looking_files_count_as_a_save() -> None:
    assert looks_like_a_save("step=20.ckpt")
    assert looks_like_a_save("last.ckpt")
    assert looks_like_a_save(".step=20.ckpt.tmp-123-abcdef01")
    assert looks_like_a_save("checkpoint-500/model.safetensors")
    assert looks_like_a_save("step-20/__0_0.distcp")
    assert not looks_like_a_save("events.out.tfevents.1700000000.node1")  # a log kept open: not a save
    assert not looks_like_a_save("metrics.csv")
    assert not looks_like_a_save("../elsewhere/step=1.ckpt")
