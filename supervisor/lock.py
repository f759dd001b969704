"""One live supervisor per run directory: a filelock plus a note naming the holder."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Mapping

from filelock import FileLock, Timeout

from .errors import RunLockedError


class RunLock:
    """Held for the whole life of ``supervise run``. The kernel drops it if the process dies, so a
    SIGKILLed supervisor never blocks the next start (the stale owner note is simply overwritten)."""

    def __init__(self, lock_path: Path, owner_path: Path) -> None:
        self._lock = FileLock(str(lock_path), timeout=0)
        self._owner_path = owner_path

    def acquire(self, environ: Mapping[str, str]) -> None:
        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            raise RunLockedError(
                f"run directory {self._owner_path.parent.parent} is held by another supervisor "
                f"({describe_owner(self._owner_path)}); wait for it to end, or use another --run-dir"
            ) from None
        owner = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "job_id": environ.get("SLURM_JOB_ID"),
            "step_id": environ.get("SLURM_STEP_ID"),
            "started": time.time(),
        }
        tmp = self._owner_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(owner))
        os.replace(tmp, self._owner_path)

    def release(self) -> None:
        try:
            self._owner_path.unlink()
        except OSError:
            pass
        self._lock.release()


def read_owner(owner_path: Path) -> dict | None:
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
