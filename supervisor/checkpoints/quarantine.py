"""Quarantine: move a torn checkpoint aside by an atomic rename in its own directory, with a
JSON sidecar saying why. Nothing is ever deleted, a symlink is renamed itself (never followed),
a symlink leaving the checkpoint dir is left alone, and every failure (read-only filesystem,
permission) becomes a record, never an exception.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from .atomic import atomic_write_bytes
from .naming import QUARANTINE_PREFIX
from .validate import CheckpointReport


@dataclass(frozen=True)
class QuarantineRecord:
    """What happened to one torn checkpoint; the fields of a ``quarantine`` event."""

    path: str
    dest: str | None  # where it went; None when it was not moved
    ok: bool  # renamed aside
    error: str | None  # why not (or why the sidecar is missing)
    level: int
    reason: str
    format: str
    step: int | None = None
    sidecar: str | None = None

    def to_event(self) -> dict[str, Any]:
        return asdict(self)


def quarantine_tag(env: Mapping[str, str] | None = None, now: float | None = None) -> str:
    """``$SLURM_JOB_ID`` (ties the quarantine to the job for the post-mortem), else
    ``local-<UTC timestamp>``."""
    env = os.environ if env is None else env
    job = (env.get("SLURM_JOB_ID") or "").strip()
    if job:
        return _safe(job)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    return f"local-{stamp}"


def quarantine_name(name: str, tag: str, taken: set[str] | frozenset[str] = frozenset()) -> str:
    """``CORRUPT_<name>.<tag>``, with ``-2``, ``-3``... when that name (or its sidecar) is taken."""
    base = f"{QUARANTINE_PREFIX}{name}.{_safe(tag)}"
    candidate, n = base, 1
    while candidate in taken or f"{candidate}.json" in taken:
        n += 1
        candidate = f"{base}-{n}"
    return candidate


def quarantine(
    report: CheckpointReport,
    ckpt_dir: str | os.PathLike[str],
    tag: str,
    *,
    now: float | None = None,
    host: str | None = None,
) -> QuarantineRecord:
    """Rename ``report.path`` to ``CORRUPT_<name>.<tag>`` in ``ckpt_dir`` and write the sidecar."""
    src = report.path
    name = os.path.basename(src.rstrip("/"))

    def record(ok: bool, dest: str | None, error: str | None, sidecar: str | None = None) -> QuarantineRecord:
        return QuarantineRecord(src, dest, ok, error, report.level, report.reason, report.format,
                                report.step, sidecar)

    root = os.path.realpath(ckpt_dir)
    if os.path.realpath(os.path.dirname(os.path.abspath(src.rstrip("/")))) != root:
        return record(False, None, "not directly inside the checkpoint dir: left alone")
    if report.link_outside:
        return record(False, None, "symlink leaving the checkpoint dir: left alone")
    try:
        st_link = os.lstat(src)
    except FileNotFoundError:
        return record(False, None, "vanished before it could be moved")
    except OSError as exc:
        return record(False, None, f"cannot stat: {exc.strerror}")
    if os.path.islink(src):
        target = os.path.realpath(src)
        if target != root and not target.startswith(root.rstrip(os.sep) + os.sep):
            return record(False, None, "symlink leaving the checkpoint dir: left alone")
    try:
        taken = set(os.listdir(root))
    except OSError as exc:
        return record(False, None, f"cannot list the checkpoint dir: {exc.strerror}")
    dest_name = quarantine_name(name, tag, taken)
    dest = os.path.join(os.path.dirname(os.path.abspath(src.rstrip("/"))), dest_name)
    try:
        os.rename(src, dest)  # atomic within the directory; renames a symlink itself
    except OSError as exc:
        return record(False, None, f"rename failed ({exc.strerror or exc}): left in place, nothing lost")
    when = time.time() if now is None else now
    sidecar = dest + ".json"
    payload = {
        "original_path": os.path.abspath(src),
        "quarantined_as": dest,
        "verdict": report.verdict.value,
        "level": report.level,
        "reason": report.reason,
        "format": report.format,
        "step": report.step,
        "size": report.size,
        "is_symlink": report.link_target is not None,
        "link_target": report.link_target,
        "size_at_move": st_link.st_size,
        "time": when,
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when)),
        "host": host or socket.gethostname(),
        "tag": tag,
    }
    try:
        atomic_write_bytes(sidecar, (json.dumps(payload, indent=2) + "\n").encode())
    except OSError as exc:
        return record(True, dest, f"moved, but the sidecar could not be written ({exc.strerror or exc})")
    return record(True, dest, None, sidecar)


def _safe(tag: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_.+" else "_" for ch in tag) or "untagged"
