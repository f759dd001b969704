"""Which files under a directory the child's process tree holds open for writing (Linux ``/proc``).

Why: in zero-code mode the only sign of a save that began a moment ago may be an open file
descriptor. Polling the directory sees a write only once its size or mtime has changed between two
polls (0.25 s apart), and a save that begins just after a preemption notice can start between the
poll at the notice and the kill that follows; the kernel knows at once. A process holds a save open
while ``/proc/PID/fd/N`` points under the checkpoint directory and ``/proc/PID/fdinfo/N`` has
``O_WRONLY`` or ``O_RDWR`` in its ``flags``.

The tree is every process in the child's process group or session (the child is started in a
session of its own, see :mod:`supervisor.child`), plus those that left both with ``setsid`` but
still carry the tree's marker (``SUPERVISOR_PROCESS_TREE``) in their environment. Read-only: the
supervisor never opens the files it finds, it only reads the links. Elsewhere than Linux, or where
``/proc`` cannot be read, nothing is found (the directory poll remains).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

PROC = "/proc"
_ACCMODE = 0o3  # O_ACCMODE
_WRITING = (os.O_WRONLY, os.O_RDWR)
_TREE_ENV = b"SUPERVISOR_PROCESS_TREE="


@dataclass(frozen=True)
class OpenWriter:
    """One file held open for writing: by which process, and where."""

    pid: int
    path: str


def tree_pids(root_pid: int, marker: str = "", proc: str = PROC) -> list[int]:
    """The processes of the child's tree: its process group and session (both the root's pid), and
    any process whose environment carries ``marker`` (those that called ``setsid``)."""
    needle = _TREE_ENV + marker.encode() if marker else b""
    found: list[int] = []
    try:
        names = os.listdir(proc)
    except OSError:
        return found
    for name in names:
        if not name.isdigit():
            continue
        pid = int(name)
        ids = _group_and_session(proc, pid)
        if ids is None:
            continue
        if pid == root_pid or root_pid in ids or (needle and _environ_has(proc, pid, needle)):
            found.append(pid)
    return found


def open_writers(pids: Iterable[int], under: str, proc: str = PROC) -> list[OpenWriter]:
    """Files below directory ``under`` that the processes ``pids`` hold open for writing."""
    root = os.path.realpath(under).rstrip(os.sep) + os.sep
    found: list[OpenWriter] = []
    seen: set[str] = set()
    for pid in pids:
        fd_dir = f"{proc}/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue  # gone, or not ours to read
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if not target.startswith(root) or target.endswith(" (deleted)") or target in seen:
                continue
            if _writing(f"{proc}/{pid}/fdinfo/{fd}"):
                seen.add(target)
                found.append(OpenWriter(pid, target))
    return found


def writers_in_tree(root_pid: int | None, marker: str, under: str, proc: str = PROC) -> list[OpenWriter]:
    """The child's open writers under ``under``; empty when there is no child or no ``/proc``."""
    if not root_pid:
        return []
    return open_writers(tree_pids(root_pid, marker, proc), under, proc)


def _group_and_session(proc: str, pid: int) -> tuple[int, int] | None:
    try:
        with open(f"{proc}/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    # "pid (comm) state ppid pgrp session ...": comm may hold spaces and parentheses, so split after the last ')'
    fields = stat[stat.rfind(b")") + 2:].split()
    try:
        return int(fields[2]), int(fields[3])
    except (IndexError, ValueError):
        return None


def _environ_has(proc: str, pid: int, needle: bytes) -> bool:
    try:
        with open(f"{proc}/{pid}/environ", "rb") as fh:
            return needle in fh.read(1 << 20).split(b"\0")
    except OSError:
        return False


def _writing(fdinfo: str) -> bool:
    try:
        with open(fdinfo, "rb") as fh:
            for line in fh:
                if line.startswith(b"flags:"):
                    return int(line.split()[1], 8) & _ACCMODE in _WRITING
    except (OSError, ValueError, IndexError):
        return False
    return False
