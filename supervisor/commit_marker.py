"""The commit marker of a sharded (directory) checkpoint: its names, its format and its check.
STDLIB ONLY: both sides import it. The training side (:mod:`supervisor.sharded`) writes the marker as
the last step of an atomic directory save; the supervisor side (the validator in
:mod:`supervisor.checkpoints.dircheck`, the resume-point scan, the save watch and the staging
clean-up in :mod:`supervisor.checkpoints.staging`) reads it and checks a directory against it.

The marker ``.supervisor-commit.json`` lists every file of the save (relative path, size, optional
CRC32) with the step, world size, attempt and nonce of the save. A directory is committed when its
marker is whole and every file it lists is there with its size (and CRC with ``deep``); files the
marker does not list, or a listed file newer than the marker by more than a minute, mean the
directory was written to after its commit. The names: ``<name>.tmp-<attempt>-<nonce>`` is a save
being written (never a resume candidate), ``<name>.old-<nonce>`` an old checkpoint moved aside by a
publish (the protocol is in :mod:`supervisor.sharded`).
"""

from __future__ import annotations

import enum
import json
import os
import re
import stat
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MARKER = ".supervisor-commit.json"
MARKER_KIND = "slurm-supervisor/sharded-commit"
MARKER_VERSION = 1
RANK_NOTE_PREFIX = ".supervisor-rank-"
_OWN_PREFIX = ".supervisor-"  # the marker, its temp file and the rank notes: never manifest entries
MAX_MARKER_BYTES = 64 << 20  # a manifest of ~500k files; anything bigger is not ours
MAX_MANIFEST_FILES = 500_000
NONCE_HEX = 12
VISIBILITY_TIMEOUT_S = 60.0  # how long rank 0 waits for other ranks' notes to show on a shared FS
STALE_STAGING_S = 120.0  # a staging dir of an unknown writer unchanged this long is abandoned
MTIME_AFTER_COMMIT_S = 60.0  # a file this much newer than the marker was written after the commit
_CRC_CHUNK = 8 << 20

_STAGING = re.compile(r"^(?P<name>.+)\.tmp-(?P<attempt>[0-9]{1,9})-(?P<nonce>[0-9a-f]{12})$", re.ASCII)
_ASIDE = re.compile(r"^(?P<name>.+)\.old-(?P<nonce>[0-9a-f]{12})$", re.ASCII)


class CommitError(RuntimeError):
    """A directory save could not be committed (a rank never reported, the marker could not be
    written, the target is in the way). The previous checkpoint is untouched."""


# ------------------------------------------------------------------------------------ names


@dataclass(frozen=True)
class StagingName:
    """``<name>.tmp-<attempt>-<nonce>``: where a directory save is written before its commit."""

    final_name: str
    attempt: int
    nonce: str

    @property
    def name(self) -> str:
        return f"{self.final_name}.tmp-{self.attempt}-{self.nonce}"


def parse_staging_name(name: str) -> StagingName | None:
    """The parts of one of our staging directory names, else None. (The atomic single-file
    writer's ``.<name>.tmp-<pid>-<8 hex>`` never matches: hidden, and 8 hex digits, not 12.)"""
    match = _STAGING.match(name)
    if match is None or name.startswith("."):
        return None
    return StagingName(match.group("name"), int(match.group("attempt")), match.group("nonce"))


def parse_aside_name(name: str) -> tuple[str, str] | None:
    """``<name>.old-<nonce>`` -> (name, nonce): an old checkpoint moved aside by a publish."""
    match = _ASIDE.match(name)
    if match is None or name.startswith("."):
        return None
    return match.group("name"), match.group("nonce")


# ------------------------------------------------------------------------------------ file system


def walk_tree(root: Path, limit: int = MAX_MANIFEST_FILES) -> Iterator[tuple[str, os.stat_result]]:
    """(relative path, lstat) of everything under ``root``; directories are entered, symlinks are
    listed and never followed."""
    todo = [""]
    seen = 0
    while todo:
        rel = todo.pop()
        try:
            entries = list(os.scandir(root / rel if rel else root))
        except FileNotFoundError:
            continue
        for entry in entries:
            child = f"{rel}/{entry.name}" if rel else entry.name
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            seen += 1
            if seen > limit:
                raise CommitError(f"{root} holds more than {limit:,} entries")
            if stat.S_ISDIR(st.st_mode):
                todo.append(child)
            yield child, st


def is_own_file(rel: str) -> bool:
    return rel.rsplit("/", 1)[-1].startswith(_OWN_PREFIX) and "/" not in rel


def read_small(path: Path, limit: int) -> bytes | None:
    """A regular file (never a symlink, FIFO or device), at most ``limit`` bytes; None if absent."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path.name} is not a regular file")
        if st.st_size > limit:
            raise OSError(f"{path.name} is {st.st_size:,} bytes (over {limit:,})")
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def crc32_of(path: Path) -> str:
    """CRC32 of a file's bytes as 8 hex digits (zlib: no dependency, ~1 GB/s)."""
    crc = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(_CRC_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return f"{crc:08x}"


# ------------------------------------------------------------------------------------ the marker


def read_marker(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The commit marker of ``directory`` (a dict), None when there is none. ValueError when one
    exists but is not a marker this module wrote (unreadable, not JSON, wrong kind)."""
    try:
        data = read_small(Path(directory) / MARKER, MAX_MARKER_BYTES)
    except OSError as exc:
        raise ValueError(f"{MARKER}: {exc}") from None
    if data is None:
        return None
    try:
        marker = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise ValueError(f"{MARKER} is not JSON ({len(data)} bytes): torn or not ours") from None
    if not isinstance(marker, dict) or marker.get("kind") != MARKER_KIND:
        raise ValueError(f"{MARKER} is not a slurm-supervisor commit marker")
    if not isinstance(marker.get("files"), dict):
        raise ValueError(f"{MARKER} has no file list")  # noqa: TRY004 - one error type for "not ours"
    return marker


class CommitState(enum.Enum):
    """What a directory's commit marker says about it."""

    COMMITTED = "committed"  # the marker's manifest matches the files
    UNCOMMITTED = "uncommitted"  # no marker: never committed by this protocol
    TORN = "torn"  # a marker whose manifest does not match the files, or a torn marker
    CHANGED = "changed"  # files match in name and size but were modified after the commit


@dataclass(frozen=True)
class CommitCheck:
    """The verdict on a directory's commit marker against its files."""

    state: CommitState
    reason: str
    step: int | None = None
    world_size: int | None = None
    files: int = 0
    bytes: int = 0
    crc_checked: bool = False
    writer: str | None = None
    attempt: int | None = None  # the attempt that committed it

    @property
    def committed(self) -> bool:
        return self.state is CommitState.COMMITTED


def _plain_int(value: Any) -> int | None:
    return value if type(value) is int and 0 <= value < 2**53 else None


def verify_commit(directory: str | os.PathLike[str], *, deep: bool = False) -> CommitCheck:
    """Compare a directory's commit marker with its files: every file named exists, is a regular
    file of the recorded size (and, with ``deep``, the recorded CRC32); no other file exists
    (besides our own marker and rank notes); none was modified well after the marker."""
    root = Path(directory)
    try:
        marker = read_marker(root)
    except ValueError as exc:
        return CommitCheck(CommitState.TORN, str(exc))
    if marker is None:
        return CommitCheck(CommitState.UNCOMMITTED, f"no {MARKER}")
    step, world = _plain_int(marker.get("step")), _plain_int(marker.get("world_size"))
    writer = marker.get("writer") if isinstance(marker.get("writer"), str) else None
    attempt = _plain_int(marker.get("attempt"))
    listed: dict[str, Any] = marker["files"]

    def torn(reason: str) -> CommitCheck:
        return CommitCheck(CommitState.TORN, reason, step, world, len(listed), writer=writer, attempt=attempt)

    if len(listed) > MAX_MANIFEST_FILES:
        return torn(f"{MARKER} lists {len(listed):,} files (over {MAX_MANIFEST_FILES:,})")
    try:
        marker_mtime = os.lstat(root / MARKER).st_mtime
        present = {rel: st for rel, st in walk_tree(root) if not stat.S_ISDIR(st.st_mode) and not is_own_file(rel)}
    except (OSError, CommitError) as exc:
        return torn(f"cannot list: {exc}")
    total = 0
    crc_checked = False
    newer: list[str] = []
    for rel, entry in sorted(listed.items()):
        if not isinstance(rel, str) or rel.startswith("/") or ".." in rel.split("/") or "\0" in rel:
            return torn(f"{MARKER} names a path outside the checkpoint: {str(rel)[:80]!r}")
        size = _plain_int(entry.get("size")) if isinstance(entry, dict) else None
        if size is None:
            return torn(f"{MARKER}: no size recorded for {rel}")
        st = present.get(rel)
        if st is None:
            return torn(f"{rel} is named in {MARKER} but missing")
        if not stat.S_ISREG(st.st_mode):
            return torn(f"{rel} is not a regular file")
        if st.st_size != size:
            return torn(f"{rel} has {st.st_size:,} bytes, the commit recorded {size:,}")
        if st.st_mtime > marker_mtime + MTIME_AFTER_COMMIT_S:
            newer.append(rel)
        total += size
        recorded = entry.get("crc32")
        if deep and isinstance(recorded, str):
            try:
                actual = crc32_of(root / rel)
            except OSError as exc:
                return torn(f"{rel}: cannot read ({exc.strerror or exc})")
            if actual != recorded:
                return torn(f"{rel}: CRC32 {actual} != {recorded} recorded at the commit")
            crc_checked = True
    extra = sorted(set(present) - set(listed))
    if extra:
        shown = ", ".join(extra[:3]) + (f" and {len(extra) - 3} more" if len(extra) > 3 else "")
        return torn(f"{shown} not in {MARKER}: written after the commit (an in-place overwrite?)")
    summary = f"{len(listed)} files, {total:,} bytes match the commit"
    if newer:
        return CommitCheck(CommitState.CHANGED, f"{summary}, but {newer[0]} was modified after the commit",
                           step, world, len(listed), total, crc_checked, writer, attempt)
    crc_note = "; CRC32 match" if crc_checked else ""
    return CommitCheck(CommitState.COMMITTED, summary + crc_note, step, world, len(listed), total, crc_checked,
                       writer, attempt)
