"""Quarantine: move a torn checkpoint aside by an atomic rename in its own directory, with a
JSON sidecar saying why. Nothing is ever deleted, a symlink is renamed itself (never followed),
a symlink leaving the checkpoint dir is left alone, and every failure (read-only filesystem,
permission) becomes a record, never an exception.

Cost is linear in the number of torn files: :func:`quarantine_all` lists the directory once and
keeps the set of taken names up to date as it renames; a name is checked against that set and
with one ``lstat`` (a file that appeared since the listing is never overwritten). A batch writes a
sidecar beside each of its first :data:`SIDECARS_PER_BATCH` files and puts the records of the rest
in one manifest, ``CORRUPT_batch.<tag>.jsonl`` (one sidecar's JSON per line), written once: creating
a new file is by far the dearest step (measured in docs/benchmarks.md), so a flood of torn files
costs one rename each, not a rename and a file.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from .atomic import atomic_write_bytes, fsync_dir
from .naming import MANIFEST_PREFIX, MANIFEST_SUFFIX, QUARANTINE_PREFIX
from .validate import CheckpointReport

SIDECARS_PER_BATCH = 256


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
    trust: str = "unscanned"  # "hostile" when it was quarantined for naming a code-execution primitive
    trust_names: tuple[str, ...] = ()

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


def quarantine_name(name: str, tag: str, taken: set[str] | frozenset[str] = frozenset(),
                    exists: Callable[[str], bool] = lambda _name: False) -> str:
    """``CORRUPT_<name>.<tag>``, with ``-2``, ``-3``... when that name or its sidecar is in ``taken``,
    or ``exists`` says the name appeared since ``taken`` was listed (a rename must never replace it;
    the sidecar is created exclusively, so it never replaces one either)."""
    base = f"{QUARANTINE_PREFIX}{name}.{_safe(tag)}"
    candidate, n = base, 1
    while candidate in taken or f"{candidate}.json" in taken or exists(candidate):
        n += 1
        candidate = f"{base}-{n}"
    return candidate


def quarantine_all(
    reports: Iterable[CheckpointReport],
    ckpt_dir: str | os.PathLike[str],
    tag: str,
    *,
    now: float | None = None,
    host: str | None = None,
) -> tuple[QuarantineRecord, ...]:
    """Quarantine each report's path (see :func:`quarantine`), listing ``ckpt_dir`` once."""
    root = os.path.realpath(ckpt_dir)
    try:
        taken = set(os.listdir(root))
    except OSError as exc:
        return tuple(_not_moved(r, f"cannot list the checkpoint dir: {exc.strerror}") for r in reports)
    host = host or socket.gethostname()
    batch = _Batch(root, {os.path.abspath(ckpt_dir), root}, taken)
    records = [quarantine(r, ckpt_dir, tag, now=now, host=host, batch=batch) for r in reports]
    if batch.manifest_lines:
        records = _write_manifest(batch, tag, records)
    if any(r.sidecar for r in records):
        fsync_dir(root)  # once for every sidecar, not once per file
    return tuple(records)


def manifest_name(tag: str, taken: set[str] | frozenset[str] = frozenset(),
                  exists: Callable[[str], bool] = lambda _name: False) -> str:
    """``CORRUPT_batch.<tag>.jsonl`` (``-2``, ``-3``... when taken): the records of a batch's files
    beyond its first :data:`SIDECARS_PER_BATCH`."""
    base = f"{MANIFEST_PREFIX}{_safe(tag)}"
    candidate, n = f"{base}{MANIFEST_SUFFIX}", 1
    while candidate in taken or exists(candidate):
        n += 1
        candidate = f"{base}-{n}{MANIFEST_SUFFIX}"
    return candidate


def _write_manifest(batch: _Batch, tag: str, records: list[QuarantineRecord]) -> list[QuarantineRecord]:
    """Write the batch manifest in one atomic write; the records it holds name it as their sidecar
    (or say it could not be written: the files are moved aside all the same)."""
    name = manifest_name(tag, batch.taken, exists=lambda n: os.path.lexists(os.path.join(batch.root, n)))
    path = os.path.join(batch.root, name)
    pending = {dest for dest, _line in batch.manifest_lines}
    try:
        atomic_write_bytes(path, b"".join(line for _dest, line in batch.manifest_lines))
    except OSError as exc:
        error = f"moved, but the batch manifest could not be written ({exc.strerror or exc})"
        return [replace(r, error=error) if r.dest in pending else r for r in records]
    batch.taken.add(name)
    return [replace(r, sidecar=path) if r.dest in pending else r for r in records]


def quarantine(
    report: CheckpointReport,
    ckpt_dir: str | os.PathLike[str],
    tag: str,
    *,
    now: float | None = None,
    host: str | None = None,
    batch: _Batch | None = None,
) -> QuarantineRecord:
    """Rename ``report.path`` to ``CORRUPT_<name>.<tag>`` in ``ckpt_dir`` and write the sidecar.
    ``batch`` (from :func:`quarantine_all`): the directory as already listed and resolved; without
    it the directory is listed here and the sidecar made durable at once."""
    src = report.path
    name = os.path.basename(src.rstrip("/"))

    def record(ok: bool, dest: str | None, error: str | None, sidecar: str | None = None) -> QuarantineRecord:
        return QuarantineRecord(src, dest, ok, error, report.level, report.reason, report.format,
                                report.step, sidecar, report.trust.value, report.trust_names)

    root = batch.root if batch is not None else os.path.realpath(ckpt_dir)
    parent = os.path.dirname(os.path.abspath(src.rstrip("/")))
    if (batch is None or parent not in batch.spellings) and os.path.realpath(parent) != root:
        return record(False, None, "not directly inside the checkpoint dir: left alone")
    if report.link_outside:
        return record(False, None, "symlink leaving the checkpoint dir: left alone")
    try:
        st_link = os.lstat(src)
    except FileNotFoundError:
        return record(False, None, "vanished before it could be moved")
    except OSError as exc:
        return record(False, None, f"cannot stat: {exc.strerror}")
    if stat.S_ISLNK(st_link.st_mode):
        target = os.path.realpath(src)
        if target != root and not target.startswith(root.rstrip(os.sep) + os.sep):
            return record(False, None, "symlink leaving the checkpoint dir: left alone")
    if batch is not None:
        taken = batch.taken
    else:
        try:
            taken = set(os.listdir(root))
        except OSError as exc:
            return record(False, None, f"cannot list the checkpoint dir: {exc.strerror}")
    dest_name = quarantine_name(name, tag, taken, exists=lambda n: os.path.lexists(os.path.join(parent, n)))
    dest = os.path.join(parent, dest_name)
    try:
        os.rename(src, dest)  # atomic within the directory; renames a symlink itself
    except OSError as exc:
        return record(False, None, f"rename failed ({exc.strerror or exc}): left in place, nothing lost")
    taken.discard(name)
    taken.update((dest_name, f"{dest_name}.json"))
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
        "trust": report.trust.value,  # hostile: names a code-execution primitive (trust_names)
        "trust_names": list(report.trust_names),
        "time": when,
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when)),
        "host": host or socket.gethostname(),
        "tag": tag,
    }
    line = (json.dumps(payload) + "\n").encode()
    if batch is not None and batch.sidecars >= SIDECARS_PER_BATCH:
        batch.manifest_lines.append((dest, line))  # its sidecar is the manifest, written at the end
        return record(True, dest, None)
    try:
        _write_sidecar(sidecar, line, durable=batch is None)
        if batch is not None:
            batch.sidecars += 1
    except OSError as exc:
        return record(True, dest, f"moved, but the sidecar could not be written ({exc.strerror or exc})")
    return record(True, dest, None, sidecar)


def _write_sidecar(path: str, data: bytes, *, durable: bool) -> None:
    """``durable`` (one quarantine on its own): temp file + fsync + rename + fsync of the directory.
    In a batch the sidecar is created exclusively (never replacing a file) and written in one call,
    without a flush per file: that would cost a disk flush and a second directory entry per torn
    file (6 ms each here, 10 minutes for 100,000); the batch fsyncs the directory once at the end.
    A sidecar only explains; the rename aside is what protects the run, and a rename lost in a
    crash is simply done again by the next attempt."""
    if durable:
        atomic_write_bytes(path, data)
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


@dataclass
class _Batch:
    """One listing of the checkpoint dir shared by a batch of quarantines."""

    root: str  # the directory, resolved
    spellings: set[str]  # absolute spellings of it that need no realpath per file
    taken: set[str]  # names in it, kept up to date as files are renamed
    sidecars: int = 0  # sidecars written so far
    manifest_lines: list[tuple[str, bytes]] = field(default_factory=list)  # (dest, JSON line) beyond them


def _not_moved(report: CheckpointReport, error: str) -> QuarantineRecord:
    return QuarantineRecord(report.path, None, False, error, report.level, report.reason, report.format,
                            report.step, None, report.trust.value, report.trust_names)


def _safe(tag: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_.+" else "_" for ch in tag) or "untagged"
