"""One live supervisor per run directory: an ``flock`` on ``<run>/supervisor/lock`` plus a note
naming the holder (``lock.owner.json``).

Why flock: the kernel drops it when the holder dies, so a SIGKILLed supervisor never blocks the next
start (the stale owner note is simply overwritten). It is the lock ``filelock`` takes on Unix, so
supervisors of earlier versions and this one exclude each other.

The trap: an flock belongs to a file, not to a path. Delete the run directory (or the lock file)
mid-run and the holder still holds a lock, on a file nobody can open any more; a second supervisor
creates a new file at the path, locks it and starts on the same run. So the lock is checked where it
matters: right after it is taken (the file may have been replaced between open and flock) and, by
the run loop, every few seconds with :meth:`RunLock.check` (two ``stat`` calls) — which says
whether the path still names the file we hold. :meth:`RunLock.reacquire` then re-creates it, or
names the supervisor that took it.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from .errors import RunLockedError
from .private import GROUP_READ, write_atomic

LOCK_MODE = 0o644  # as filelock creates it: the file holds nothing
_ACQUIRE_TRIES = 5  # the path may be replaced between open and flock; retry a few times


class LockState(str, Enum):
    """Whether the run directory's lock is still ours."""

    HELD = "held"  # the path names the file we hold the flock on
    PATH_GONE = "path_gone"  # the lock file (or the run directory) was deleted
    REPLACED = "replaced"  # the path names another file now: re-created, or another run moved in
    NOT_HELD = "not_held"  # not acquired yet, or released


@dataclass(frozen=True)
class LockCheck:
    state: LockState
    reason: str

    @property
    def held(self) -> bool:
        return self.state is LockState.HELD


FileId = tuple[int, int]  # (st_dev, st_ino)


def judge_lock(held: FileId | None, held_links: int, at_path: FileId | None, path: str) -> LockCheck:
    """Pure: the file we hold (its id and link count) against the file the path names now."""
    if held is None:
        return LockCheck(LockState.NOT_HELD, "the lock is not held")
    if at_path is None:
        return LockCheck(LockState.PATH_GONE, f"{path} was deleted (the run directory removed?): "
                                              "the lock held is on a file no other supervisor can see")
    if at_path != held or held_links == 0:
        return LockCheck(LockState.REPLACED, f"{path} is another file now: a second supervisor may have "
                                             "taken the run directory")
    return LockCheck(LockState.HELD, "held")


class RunLock:
    """Held for the whole life of ``supervise run``."""

    def __init__(self, lock_path: Path, owner_path: Path) -> None:
        self.lock_path = Path(lock_path)
        self._owner_path = Path(owner_path)
        self._fd = -1
        self._held: FileId | None = None

    # taking it -------------------------------------------------------------------------------

    def acquire(self, environ: Mapping[str, str]) -> None:
        """Take the lock or raise :class:`RunLockedError` naming the holder."""
        for _ in range(_ACQUIRE_TRIES):
            fd = self._open_and_lock()
            check = self._check_fd(fd)
            if check.held:
                self._fd = fd
                self._held = _file_id(os.fstat(fd))
                self._write_owner(environ)
                return
            os.close(fd)  # the path changed between open and flock: lock what it names now
        raise RunLockedError(f"run directory {self._run_dir()}: its lock file {self.lock_path} keeps being "
                             "replaced; is another tool deleting it? Use another --run-dir")

    def _open_and_lock(self) -> int:
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, LOCK_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunLockedError(
                f"run directory {self._run_dir()} is held by another supervisor "
                f"({describe_owner(self._owner_path)}); wait for it to end, or use another --run-dir"
            ) from None
        except OSError:
            os.close(fd)
            raise
        return fd

    def _write_owner(self, environ: Mapping[str, str]) -> None:
        owner = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "job_id": environ.get("SLURM_JOB_ID"),
            "step_id": environ.get("SLURM_STEP_ID"),
            "started": time.time(),
        }
        try:
            write_atomic(self._owner_path, json.dumps(owner).encode(), GROUP_READ, durable=False)
        except OSError:
            pass  # the note is a courtesy to the next supervisor; the flock is the lock

    def _run_dir(self) -> Path:
        return self._owner_path.parent.parent

    # keeping it ------------------------------------------------------------------------------

    def _check_fd(self, fd: int) -> LockCheck:
        st = os.fstat(fd)
        try:
            at_path: FileId | None = _file_id(os.stat(self.lock_path))
        except OSError:
            at_path = None
        return judge_lock(_file_id(st), st.st_nlink, at_path, str(self.lock_path))

    def check(self) -> LockCheck:
        """Whether the path still names the file we hold the lock on (two stat calls: cheap enough
        for the run loop to ask every few seconds)."""
        if self._fd < 0:
            return judge_lock(None, 0, None, str(self.lock_path))
        try:
            return self._check_fd(self._fd)
        except OSError as exc:
            return LockCheck(LockState.PATH_GONE, f"cannot check the lock ({exc.strerror or exc})")

    def still_held(self) -> bool:
        return self.check().held

    def reacquire(self, environ: Mapping[str, str]) -> LockCheck:
        """After :meth:`check` found the lock lost: re-create the lock file (and the run directory)
        and lock it. Raises :class:`RunLockedError` when another supervisor took it meanwhile (the
        run loop must then stop its child and exit with that error). Returns the new check."""
        current = self.check()
        if current.held:
            return current
        old = self._fd
        self._fd, self._held = -1, None
        try:
            self.acquire(environ)
        finally:
            if old >= 0:
                os.close(old)
        return self.check()

    def release(self) -> None:
        if self._fd < 0:
            return
        if self.check().held:
            try:
                self._owner_path.unlink()
            except OSError:
                pass
        try:
            os.close(self._fd)  # drops the flock
        finally:
            self._fd, self._held = -1, None

    @property
    def held_file(self) -> FileId | None:
        return self._held


def _file_id(st: os.stat_result) -> FileId:
    return st.st_dev, st.st_ino


def read_owner(owner_path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(owner_path.read_text())
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def describe_owner(owner_path: Path) -> str:
    owner = read_owner(owner_path)
    if not owner:
        return "holder unknown"
    job = f", Slurm job {owner['job_id']}" if owner.get("job_id") else ""
    return f"host {owner.get('host')}, pid {owner.get('pid')}{job}"
