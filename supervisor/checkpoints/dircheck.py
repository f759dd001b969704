"""Validation of directory checkpoints: which format a directory is (the registry's detection,
supervisor/checkpoints/formats/registry.py), then that format's check
(supervisor/checkpoints/formats/<format>.py), handed a :class:`~.formats.base.DirContext` with the
checks it may run on what it holds.

Directory formats have no single commit marker that covers every rank, so each format's check
rebuilds the set of files the writer must have produced (from the manifest or the recorded world
size) and runs the file ladder on each. A directory saved through :mod:`supervisor.sharded`
carries one: its ``.supervisor-commit.json`` lists every file of every rank with its size (and
CRC32 when recorded). That list is checked first (a mismatch is CORRUPT), then the format's own
check runs as for any directory. Files a loader may unpickle that the format's check does not read
are scanned here (:func:`loose_pickle_problem`). Reasons say exactly what was checked.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ..commit_marker import MARKER, CommitState, verify_commit
from ..states import Verdict
from . import formats as F
from .allowlist import allowed_for
from .filecheck import check_file
from .formats.base import DirContext
from .formats.common import unsafe_reason
from .fsio import describe_oserror, regular_fd
from .limits import MAX_PICKLE_BYTES, ScanLimitError
from .naming import has_checkpoint_suffix
from .outcome import Outcome, corrupt, unverifiable, valid
from .picklescan import PickleScan, PickleScanError, TruncatedPickle, scan_pickle
from .zipcheck import pread_exact

_MAX_WALK_FILES = 10_000


def _member(path: str, label: str, *, deep: bool, max_level: int = 3) -> Outcome:
    """check_file on a file inside a directory checkpoint; an OSError (a FIFO, a symlink loop, no
    permission) becomes this member's verdict instead of failing the whole directory's check."""
    try:
        outcome = check_file(path, deep=deep, max_level=max_level)
    except OSError as exc:
        outcome = unverifiable(F.UNKNOWN, 0, f"cannot read: {describe_oserror(exc)}", load_safe=False)
    return outcome.but(reason=f"{label}: {outcome.reason}")


def check_dir(path: str, *, deep: bool = False, depth: int = 0) -> Outcome:
    """A committed directory: its commit marker, then its format's check. Otherwise the format's
    check alone."""
    if os.path.lexists(os.path.join(path, MARKER)):
        return check_committed(path, deep=deep, depth=depth)
    return check_content(path, deep=deep, depth=depth)


def check_content(path: str, *, deep: bool = False, depth: int = 0) -> Outcome:
    """The check of the directory's detected format (the registry's fallback: any directory)."""
    return F.dir_format_of(path).validate(path, context(deep=deep, depth=depth))


def context(*, deep: bool, depth: int = 0) -> DirContext:
    """What a directory format may run on the files and directories it holds."""

    def member(path: str, label: str) -> Outcome:
        return _member(path, label, deep=deep)

    def nested(path: str) -> Outcome:
        return check_dir(path, deep=deep, depth=depth + 1)

    def committed(path: str, content: Callable[[], Outcome]) -> Outcome:
        return check_committed(path, deep=deep, content=content)

    def loose(path: str, fmt: str) -> Outcome | None:
        return loose_pickle_problem(path, fmt, deep=deep)

    return DirContext(deep, depth, member, nested, committed, loose)


# ---------------------------------------------------------------------------- our commit marker


def check_committed(path: str, *, deep: bool = False, depth: int = 0,
                    content: Callable[[], Outcome] | None = None) -> Outcome:
    """A directory committed by :mod:`supervisor.sharded`: the marker's manifest against the
    files (names, sizes; CRC32s with ``deep``), then the format's own check (``content``, default
    :func:`check_content`). The marker is written after every rank finished and fsynced, so a
    mismatch means the directory changed after the commit or the commit is torn: CORRUPT."""
    commit = verify_commit(path, deep=deep)
    fmt = F.detect_dir(path)
    if commit.state is CommitState.TORN:
        level = 4 if "CRC32" in commit.reason else 1
        return corrupt(fmt, level, f"commit marker: {commit.reason}", embedded_step=commit.step)
    if commit.state is CommitState.UNCOMMITTED:  # the marker vanished between two looks
        return (content or (lambda: check_content(path, deep=deep, depth=depth)))()
    outcome = (content or (lambda: check_content(path, deep=deep, depth=depth)))()
    step = outcome.embedded_step if outcome.embedded_step is not None else commit.step
    if outcome.verdict is Verdict.CORRUPT:
        return outcome.but(reason=f"{outcome.reason} (although its commit marker matches the file sizes)",
                           embedded_step=step)
    if commit.state is CommitState.CHANGED:
        return unverifiable(outcome.format, min(outcome.level, 2), f"commit marker: {commit.reason}; {outcome.reason}",
                            embedded_step=step, epoch=outcome.epoch, facts=outcome.facts, load_safe=outcome.load_safe)
    summary = f"committed by {commit.world_size or '?'} rank(s): {commit.reason}"
    hostile = loose_pickle_problem(path, outcome.format, deep=deep)
    if hostile is not None:
        return hostile.but(embedded_step=step)
    if outcome.verdict is Verdict.UNVERIFIABLE and outcome.level == 0 and outcome.load_safe:
        # A layout no validator knows (numpy shards, a custom writer): the manifest is the check.
        return valid(outcome.format, 2, f"{summary}; no checkpoint format recognised, every file that holds "
                                        f"a pickle scanned ({outcome.reason})", embedded_step=step)
    level = outcome.level
    if deep and commit.crc_checked and outcome.verdict is Verdict.VALID:
        level = max(level, 4)
    return outcome.but(reason=f"{summary}; {outcome.reason}", embedded_step=step, level=level)



_PROBE_BYTES = 64 << 10


def loose_pickle_problem(path: str, fmt: str, *, deep: bool = False) -> Outcome | None:
    """Files of a directory checkpoint that its format's check does not read, but a loader might
    unpickle: any regular file (dot files too, three levels deep) without a checkpoint suffix at
    the top level. One that holds a zip, a legacy torch file or a pickle is scanned with the same
    inert scanner; the first that is damaged or names globals outside the allowlist decides (a
    directory is never safer than its worst file). Data files (JSON, text, numpy) are not pickles
    and are passed over. None when nothing is wrong."""
    own = F.dir_format(fmt)
    for rel in _all_files(path, max_depth=3):
        name = os.path.basename(rel)
        top = os.sep not in rel
        if name == MARKER or (top and has_checkpoint_suffix(name)):
            continue  # the format's own check (or the commit marker) read it
        if top and own is not None and own.reads_itself(name):
            continue  # the format's own check reads it (DCP's shards and metadata)
        outcome = _loose_file(os.path.join(path, rel), rel, deep=deep)
        if outcome is not None:
            return outcome.but(format=fmt)
    return None


def _loose_file(path: str, rel: str, *, deep: bool) -> Outcome | None:
    try:
        with regular_fd(path) as (fd, st):
            head = pread_exact(fd, _PROBE_BYTES, 0)
            kind = F.sniff_bytes(head[: F.HEAD_BYTES], os.path.basename(path))
            known = F.file_format(kind)
            if known is not None and known.unpickled:
                verdict = _member(path, rel, deep=deep)
                # a zip with no data.pkl is no torch file (logs.zip): nothing a loader unpickles
                return None if verdict.verdict is Verdict.VALID or verdict.format == F.ZIP else verdict
            first = _first_pickle(fd, st.st_size, head)
    except OSError as exc:
        return unverifiable(F.UNKNOWN, 0, f"{rel}: cannot read: {describe_oserror(exc)}", load_safe=False)
    if first is None:
        return None  # not a pickle: a data file no unpickler reads
    if isinstance(first, Outcome):
        return first.but(reason=f"{rel}: {first.reason}")
    if unsafe := unsafe_reason([first], allowed_for(os.path.basename(path))):
        return corrupt(F.PICKLE, 3, f"{rel}: {unsafe}", load_safe=False)
    return None


def _first_pickle(fd: int, size: int, head: bytes) -> PickleScan | Outcome | None:
    """The scan of the pickle a ``pickle.load`` of this file would run, None when the file does
    not start with one (bounded: the probe, then at most MAX_PICKLE_BYTES)."""
    try:
        try:
            return scan_pickle(head)
        except TruncatedPickle:
            if len(head) >= size:
                return None
        if size > MAX_PICKLE_BYTES:
            return unverifiable(F.PICKLE, 2, f"starts like a pickle longer than {MAX_PICKLE_BYTES:,} bytes: "
                                             "too large to scan", load_safe=False)
        return scan_pickle(pread_exact(fd, size, 0))
    except ScanLimitError as exc:
        return unverifiable(F.PICKLE, 2, exc.reason, load_safe=False)
    except PickleScanError:
        return None


def _all_files(path: str, max_depth: int) -> list[str]:
    """Relative paths of the regular files under ``path`` (symlinks never followed), not inside
    nested DCP or DeepSpeed directories (their own checks read those, item by item)."""
    files: list[str] = []
    todo = [("", 0)]
    while todo and len(files) < _MAX_WALK_FILES:
        rel, level = todo.pop()
        try:
            entries = sorted(os.scandir(os.path.join(path, rel)), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            child = os.path.join(rel, entry.name)
            if entry.is_symlink():
                continue
            if entry.is_dir(follow_symlinks=False):
                if level + 1 < max_depth and not _nests(entry.path):
                    todo.append((child, level + 1))
            elif entry.is_file(follow_symlinks=False):
                files.append(child)
    return sorted(files)


def dir_size_and_mtime(path: str) -> tuple[int, float]:
    """Total bytes and newest mtime of the files under ``path`` (symlinks not followed)."""
    total, newest = 0, os.stat(path).st_mtime
    for root, dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            total += st.st_size
            newest = max(newest, st.st_mtime)
    return total, newest



def _nests(path: str) -> bool:
    """A directory format checked as a unit of its own (its check reads its files, item by item)."""
    fmt = F.dir_format(F.detect_dir(path))
    return fmt is not None and fmt.nests
