"""Atomic directory checkpoints written by several ranks: DCP (FSDP, torchtitan), DeepSpeed, any
writer. STDLIB ONLY at import time: it runs inside the training process, beside the client.

Why: a sharded checkpoint is a directory every rank writes into. Written in place, a kill at the
wrong moment leaves shards of two different saves side by side (the torn DeepSpeed ``last.ckpt/``
this project grew from), and no single file tells a reader the save finished on every rank.

The protocol (:func:`saving_dir`), for a save of ``<dir>/<name>``:

1. Every rank agrees on a staging name ``<name>.tmp-<attempt>-<nonce>`` without talking: the
   nonce is a hash of what every rank already shares (the final name, the step, the supervisor's
   attempt, the Slurm job and restart count, the torchrun run id and restart count, and how many
   directory saves this process has made), or a value rank 0 broadcasts through the caller's
   ``broadcast`` (the framework's collective), or the caller's own ``nonce``. The integrations
   broadcast (``torch.distributed.broadcast_object_list``), which also gives every rank rank 0's
   attempt number where per-node supervisors number attempts differently.
2. Every rank writes its files into the staging directory, fsyncs every file it sees there and
   the directories, and leaves a small rank note (``.supervisor-rank-<r>.json``).
3. The caller's barrier (``torch.distributed.barrier``, passed in: this module stays stdlib-only).
4. Rank 0 waits until every rank's note is visible (a shared filesystem may lag), lists the
   files, writes the commit marker ``.supervisor-commit.json`` (files, sizes, optional CRC32s,
   step, world size, attempt, nonce) through a temp file + fsync + rename, and publishes: when
   ``<name>`` exists (a fixed name such as ``last``) it is renamed aside to ``<name>.old-<nonce>``,
   the staging directory is renamed to ``<name>``, and the old one is removed (its marker first).
   Every rename is followed by an fsync of the parent directory.
5. A second barrier: every rank leaves with the checkpoint in place. Rank 0 reports
   ``save_begin`` when the save starts and ``save_end`` after the publish, so the supervisor's
   save arbitration covers the slowest rank too: ``save_end`` is only sent once every rank has
   passed the barrier, i.e. once all of them are done.

What a crash leaves, in each window (the old ``<name>`` exists; for a new name there is no old):

=====================================================  ====================  ======================
crash ...                                              resume-point scan     after the supervisor's
                                                       alone picks           :func:`remove_stale_staging`
=====================================================  ====================  ======================
while ranks write (no marker)                          the old ``<name>``    old; staging removed
after the marker, before the rename aside              the old ``<name>``    the new one (rolled
                                                                             forward)
after the rename aside, before the rename into place   ``<name>.old-<n>``    the new one (rolled
                                                       (the old one)         forward), aside removed
after the rename into place, before the old is gone    the new ``<name>``    new; aside removed
=====================================================  ====================  ======================

A staging directory is never a resume candidate (its name is a temp name). ``<name>.old-<nonce>``
is one: it is the old checkpoint under another name, ranked below ``<name>`` on equal steps.

The supervisor side uses the same module: :func:`verify_commit` (the validator's marker check) and
:func:`stale_staging` / :func:`remove_stale_staging`, called by the run loop at attempt start, when
no writer of the run is alive. They only ever touch directories whose names match this module's
own patterns (:func:`parse_staging_name`, :func:`parse_aside_name`), never follow a symlink, and
never remove a committed checkpoint that is the only copy of its step.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import json
import os
import re
import secrets
import shutil
import stat
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .checkpoints.atomic import fsync_dir

if TYPE_CHECKING:  # annotations only
    from types import TracebackType

__all__ = [
    "MARKER",
    "CommitCheck",
    "CommitError",
    "CommitState",
    "DirCommit",
    "StagingAction",
    "StagingStep",
    "discard",
    "parse_aside_name",
    "parse_staging_name",
    "read_marker",
    "remove_stale_staging",
    "saving_dir",
    "stale_staging",
    "verify_commit",
]

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


def _attempt_from_env(environ: Mapping[str, str]) -> int:
    text = (environ.get("SUPERVISOR_ATTEMPT") or "").strip()
    return int(text) if text.isdigit() and len(text) <= 9 else 0


_SEQ: dict[str, int] = {}
_SEQ_LOCK = threading.Lock()


def _next_seq(final: str) -> int:
    """How many directory saves to ``final`` this process has started: the same on every rank,
    since a sharded save is a collective that every rank makes in the same order."""
    with _SEQ_LOCK:
        _SEQ[final] = _SEQ.get(final, 0) + 1
        return _SEQ[final]


def derive_nonce(final_name: str, step: int | None, attempt: int, seq: int, token: str = "",
                 environ: Mapping[str, str] | None = None) -> str:
    """A nonce every rank computes alike without communication: a hash of facts all ranks share.
    Pure (the environment is passed in)."""
    env = os.environ if environ is None else environ
    shared = [final_name, str(step), str(attempt), str(seq), token,
              env.get("SLURM_JOB_ID", ""), env.get("SLURM_RESTART_COUNT", ""),
              env.get("TORCHELASTIC_RUN_ID", ""), env.get("TORCHELASTIC_RESTART_COUNT", "")]
    return hashlib.sha256("\0".join(shared).encode()).hexdigest()[:NONCE_HEX]


def agree_staging(final_name: str, step: int | None, *, rank: int, nonce: str | None = None,
                  broadcast: Callable[[str], str] | None = None,
                  environ: Mapping[str, str] | None = None) -> StagingName:
    """The staging name every rank agrees on. ``broadcast(value) -> rank 0's value`` is a
    collective (every rank calls it); with it, rank 0's attempt and a random token win."""
    env = os.environ if environ is None else environ
    attempt = _attempt_from_env(env)
    token = nonce or ""
    if broadcast is None:
        return StagingName(final_name, attempt, derive_nonce(final_name, step, attempt, _next_seq(final_name),
                                                             token, env))
    # Rank 0's attempt and random token: nothing of this rank's own environment or history counts.
    mine = f"{attempt}:{secrets.token_hex(8)}" if rank == 0 else ""
    agreed = str(broadcast(mine))
    head, _, tail = agreed.partition(":")
    if not head.isdigit() or len(head) > 9 or not tail:
        raise CommitError(f"broadcast returned {agreed[:40]!r}, not rank 0's '<attempt>:<token>'")
    attempt = int(head)
    return StagingName(final_name, attempt, derive_nonce(final_name, step, attempt, 0, token + tail, {}))


# ------------------------------------------------------------------------------------ file system


def _walk(root: Path, limit: int = MAX_MANIFEST_FILES) -> Iterator[tuple[str, os.stat_result]]:
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


def _is_own(rel: str) -> bool:
    return rel.rsplit("/", 1)[-1].startswith(_OWN_PREFIX) and "/" not in rel


def sync_tree(root: Path) -> list[str]:
    """fsync every regular file under ``root`` this process can see, then every directory.
    Returns the files seen (relative paths). On a node-local view this covers this rank's own
    files, which is all a rank can make durable."""
    files: list[str] = []
    dirs: list[Path] = [root]
    for rel, st in _walk(root):
        path = root / rel
        if stat.S_ISDIR(st.st_mode):
            dirs.append(path)
        elif stat.S_ISREG(st.st_mode):
            if not _is_own(rel):
                files.append(rel)
            try:
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            except OSError:
                continue
            try:
                with contextlib.suppress(OSError):
                    os.fsync(fd)
            finally:
                os.close(fd)
    for directory in dirs:
        fsync_dir(directory)
    return sorted(files)


def _write_durably(path: Path, data: bytes) -> None:
    """``path`` gets ``data`` whole or not at all: temp file, fsync, rename, fsync the dir."""
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def _read_small(path: Path, limit: int) -> bytes | None:
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


def _rmtree(path: Path) -> None:
    """Remove a directory tree without following symlinks (a symlink itself is unlinked)."""
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)  # fd-based on Linux: links inside are removed, never followed
    else:
        os.unlink(path)


# ------------------------------------------------------------------------------------ the marker


def read_marker(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The commit marker of ``directory`` (a dict), None when there is none. ValueError when one
    exists but is not a marker this module wrote (unreadable, not JSON, wrong kind)."""
    try:
        data = _read_small(Path(directory) / MARKER, MAX_MARKER_BYTES)
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
        present = {rel: st for rel, st in _walk(root) if not stat.S_ISDIR(st.st_mode) and not _is_own(rel)}
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


# ------------------------------------------------------------------------------------ the save


def _rank_note(rank: int) -> str:
    return f"{RANK_NOTE_PREFIX}{rank}.json"


@dataclass
class DirCommit:
    """One directory save (see the module docstring). Use it through :func:`saving_dir`; the
    fields after the save say what was committed (``manifest`` on rank 0 only)."""

    step: int | None
    final: Path
    rank: int
    world_size: int
    barrier: Callable[[], Any] | None
    nonce: str | None = None
    broadcast: Callable[[str], str] | None = None
    checksums: bool = False
    writer: str = "custom"
    after_publish: Callable[[Path], Any] | None = None
    visibility_timeout: float = VISIBILITY_TIMEOUT_S
    report: bool = True
    staging: Path | None = field(default=None, init=False)
    name: StagingName | None = field(default=None, init=False)
    manifest: dict[str, Any] | None = field(default=None, init=False)
    committed: bool = field(default=False, init=False)
    _saving: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.final = Path(self.final)
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} of world size {self.world_size}: not a rank of this world")
        if self.world_size > 1 and self.barrier is None:
            raise ValueError("a save by several ranks needs their barrier (e.g. torch.distributed.barrier)")
        if not self.final.name or self.final.name in (".", ".."):
            raise ValueError(f"{self.final}: not a checkpoint name")

    def __enter__(self) -> Path:
        self.name = agree_staging(self.final.name, self.step, rank=self.rank, nonce=self.nonce,
                                  broadcast=self.broadcast)
        self.staging = self.final.with_name(self.name.name)
        if self.rank == 0 and self.report:
            # lazily: the validators import this module for its names, not for the channel
            from . import client

            self._saving = client.saving(self.step, self.final)
            self._saving.__enter__()
        try:
            self.final.parent.mkdir(parents=True, exist_ok=True)
            self.staging.mkdir(exist_ok=True)
            if not stat.S_ISDIR(os.lstat(self.staging).st_mode):
                raise CommitError(f"{self.staging} exists and is not a directory (a symlink?): not written through")
            if os.path.lexists(self.staging / MARKER):
                raise CommitError(f"{self.staging} is already committed: a staging name was reused")
        except BaseException as exc:
            self._end_report(exc)
            raise
        return self.staging

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is not None:
            # This rank's part failed: nothing is committed and the staging directory stays (never
            # a resume candidate; removed at the next attempt start). The other ranks wait in the
            # barrier until the launcher ends the group, as with any failed collective.
            self._end_report(exc)
            return
        first_barrier_passed = False
        try:
            staging = self._staging()
            seen = sync_tree(staging)
            note = {"rank": self.rank, "world_size": self.world_size, "nonce": self._name().nonce,
                    "step": self.step, "files": seen}
            _write_durably(staging / _rank_note(self.rank), json.dumps(note).encode())
            self._barrier()
            first_barrier_passed = True
            if self.rank == 0:
                self.manifest = self._commit(staging)
                publish(staging, self.final, self._name())
                self.committed = True
                if self.after_publish is not None:
                    self.after_publish(self.final)
        except BaseException as failure:
            self._end_report(failure)
            if first_barrier_passed and self.rank == 0:
                with contextlib.suppress(Exception):
                    self._barrier()  # release the others; they find no commit and raise too
            raise
        self._end_report(None)
        self._barrier()
        if self.rank != 0:
            self._confirm_published()

    # -- parts ----------------------------------------------------------------------------

    def _name(self) -> StagingName:
        assert self.name is not None, "used outside its with-block"
        return self.name

    def _staging(self) -> Path:
        assert self.staging is not None, "used outside its with-block"
        return self.staging

    def _barrier(self) -> None:
        if self.barrier is not None and self.world_size > 1:
            self.barrier()

    def _end_report(self, exc: BaseException | None) -> None:
        saving, self._saving = self._saving, None
        if saving is not None:
            saving.__exit__(type(exc) if exc is not None else None, exc, None)

    def _commit(self, staging: Path) -> dict[str, Any]:
        """Rank 0, after the barrier: every rank's note, the file list, the marker."""
        nonce = self._name().nonce
        deadline = time.monotonic() + self.visibility_timeout
        notes: dict[int, dict[str, Any]] = {}
        while True:
            for rank in range(self.world_size):
                if rank in notes:
                    continue
                try:
                    data = _read_small(staging / _rank_note(rank), 1 << 26)
                    note = json.loads(data) if data is not None else None
                except (OSError, ValueError):
                    note = None
                if isinstance(note, dict):
                    if note.get("nonce") != nonce or note.get("world_size") != self.world_size:
                        raise CommitError(f"rank {rank}'s note is for another save (nonce {note.get('nonce')}, "
                                          f"world size {note.get('world_size')}): not committed")
                    notes[rank] = note
            if len(notes) == self.world_size:
                break
            if time.monotonic() > deadline:
                missing = sorted(set(range(self.world_size)) - set(notes))
                raise CommitError(f"rank(s) {missing} never reported in {staging} within "
                                  f"{self.visibility_timeout:.0f} s: not committed")
            time.sleep(0.05)
            with contextlib.suppress(OSError):
                os.listdir(staging)  # revalidates a shared filesystem's directory cache
        names = {rel for rel, st in _walk(staging) if not stat.S_ISDIR(st.st_mode) and not _is_own(rel)}
        for note in notes.values():
            names.update(n for n in note.get("files", []) if isinstance(n, str))
        files: dict[str, dict[str, Any]] = {}
        for rel in sorted(names):
            try:
                st = os.lstat(staging / rel)
            except FileNotFoundError:
                continue  # a temp file a writer renamed away after another rank listed it
            if not stat.S_ISREG(st.st_mode):
                continue
            entry: dict[str, Any] = {"size": st.st_size}
            if self.checksums:
                entry["crc32"] = crc32_of(staging / rel)
            files[rel] = entry
        if not files:
            raise CommitError(f"{staging} holds no files: nothing was saved, not committed")
        manifest = {"kind": MARKER_KIND, "version": MARKER_VERSION, "name": self.final.name,
                    "step": self.step, "world_size": self.world_size, "attempt": self._name().attempt,
                    "nonce": nonce, "writer": self.writer, "created": time.time(), "files": files}
        _write_durably(staging / MARKER, json.dumps(manifest, separators=(",", ":")).encode())
        return manifest

    def _confirm_published(self) -> None:
        """Other ranks, after the last barrier: rank 0's publish is visible, else it failed."""
        deadline = time.monotonic() + self.visibility_timeout
        nonce = self._name().nonce
        while True:
            try:
                marker = read_marker(self.final)
            except ValueError:
                marker = None
            if marker is not None and marker.get("nonce") == nonce:
                self.committed = True
                return
            if time.monotonic() > deadline:
                raise CommitError(f"rank 0 did not publish {self.final} (see rank 0's error): not committed")
            time.sleep(0.05)


def saving_dir(step: int | None, final_path: str | os.PathLike[str], *, rank: int, world_size: int,
               barrier: Callable[[], Any] | None, nonce: str | None = None,
               broadcast: Callable[[str], str] | None = None, checksums: bool = False,
               writer: str = "custom", after_publish: Callable[[Path], Any] | None = None,
               visibility_timeout: float = VISIBILITY_TIMEOUT_S, report: bool = True) -> DirCommit:
    """Context manager for an atomic directory save by ``world_size`` ranks; yields the staging
    directory to write into. Every rank calls it, for the same saves in the same order (it is a
    collective: it calls ``barrier`` twice, and ``broadcast`` once when given).

    ``barrier``: the ranks' barrier (``torch.distributed.barrier``); None only for one rank.
    ``broadcast(value) -> rank 0's value``: agrees the staging nonce through the framework
    (``integrations.dcp.broadcast_str``); without it the nonce is derived from shared facts
    (:func:`derive_nonce`). ``nonce``: a caller's token mixed in. ``checksums``: rank 0 records
    each file's CRC32 (reads every byte once; ``supervise verify --deep`` compares them).
    ``after_publish(final)``: rank 0 runs it once the checkpoint is in place, before the last
    barrier (the DeepSpeed helper writes ``latest`` there). ``report``: rank 0 reports
    ``save_begin``/``save_end`` through the client.

        with sharded.saving_dir(step, ckpt / f"step-{step}", rank=r, world_size=w,
                                barrier=dist.barrier) as staging:
            dcp.save(state, checkpoint_id=staging)
    """
    return DirCommit(step, Path(final_path), rank, world_size, barrier, nonce=nonce, broadcast=broadcast,
                     checksums=checksums, writer=writer, after_publish=after_publish,
                     visibility_timeout=visibility_timeout, report=report)


def publish(staging: Path, final: Path, name: StagingName) -> None:
    """Put a committed staging directory in place of ``final`` (see the module's crash table)."""
    parent = final.parent
    aside = final.with_name(f"{final.name}.old-{name.nonce}")
    had_old = os.path.lexists(final)
    if had_old:
        os.rename(final, aside)
        fsync_dir(parent)
    try:
        os.rename(staging, final)
    except BaseException:
        if had_old:
            with contextlib.suppress(OSError):
                os.rename(aside, final)  # put the old one back: nothing changed
        raise
    fsync_dir(parent)
    if had_old:
        discard(aside, attempt=name.attempt)


def discard(path: str | os.PathLike[str], *, attempt: int | None = None) -> None:
    """Remove a checkpoint directory so that no crash can leave half of it looking like a
    checkpoint: its commit marker goes first, then it is renamed to one of our staging names
    (a crash now leaves a temp name that the attempt-start cleanup removes), then removed.
    Retention of sharded checkpoints should use this, not ``shutil.rmtree``."""
    path = Path(path)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        fsync_dir(path.parent)
        return
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path / MARKER)
        fsync_dir(path)
    base = parse_aside_name(path.name)
    final_name = base[0] if base else path.name
    attempt = _attempt_from_env(os.environ) if attempt is None else attempt
    trash = path.with_name(StagingName(final_name, attempt, secrets.token_hex(NONCE_HEX // 2)).name)
    os.rename(path, trash)
    fsync_dir(path.parent)
    shutil.rmtree(trash, ignore_errors=True)
    fsync_dir(path.parent)


# ------------------------------------------------------------------------------------ cleanup


class StagingAction(enum.Enum):
    """What the attempt-start cleanup does with one of our directories."""

    REMOVE_UNCOMMITTED = "remove_uncommitted"  # a staging dir whose writer died before the commit
    ROLL_FORWARD = "roll_forward"  # a committed staging dir whose publish was cut short: publish it
    REMOVE_SUPERSEDED = "remove_superseded"  # committed, but the final name holds the same or a newer step
    REMOVE_ASIDE = "remove_aside"  # an old checkpoint moved aside; its replacement is committed
    RESTORE_ASIDE = "restore_aside"  # an old checkpoint moved aside and nothing replaced it
    KEEP = "keep"  # a writer may still be at it, or it is not safe to decide


@dataclass(frozen=True)
class OurDir:
    """The facts about one staging or aside directory that the cleanup decides on."""

    path: Path
    final_name: str
    kind: str  # "staging" or "aside"
    attempt: int | None  # staging only
    idle_s: float  # seconds since anything inside changed
    check: CommitCheck


@dataclass(frozen=True)
class FinalFacts:
    """The directory a staging/aside dir belongs to (``<name>``), as it is now."""

    exists: bool
    check: CommitCheck | None = None  # None: not a directory (a file, a link) or absent


@dataclass(frozen=True)
class StagingStep:
    """One cleanup decision, with its reason."""

    path: Path
    action: StagingAction
    reason: str
    final: Path | None = None


def plan_staging_cleanup(dirs: Sequence[OurDir], finals: Mapping[str, FinalFacts], *, attempt: int | None,
                         min_idle_s: float = STALE_STAGING_S) -> tuple[StagingStep, ...]:
    """Decide, per final name, what to do with our staging and aside directories. Pure.

    A staging dir is *abandoned* when its attempt is older than the current ``attempt`` (that
    writer is dead: the run loop calls this between attempts), or when nothing in it changed for
    ``min_idle_s`` (a writer we cannot know about: another layout, no supervisor). Abandoned and
    uncommitted: removed. Abandoned and committed: the newest one is rolled forward when the
    final name is absent, or holds a committed checkpoint of an older step written by the same or
    an earlier attempt (a later attempt's checkpoint is never replaced by an earlier attempt's);
    else it is superseded and removed. A final name that exists but is not one of our committed
    checkpoints is left to the resume scan, and so is the staging dir.
    An aside dir is removed once the final name holds a committed checkpoint, restored when the
    final name is absent and nothing is rolled forward, and kept otherwise."""
    steps: list[StagingStep] = []
    by_final: dict[str, list[OurDir]] = {}
    for d in dirs:
        by_final.setdefault(d.final_name, []).append(d)
    for final_name, group in sorted(by_final.items()):
        final = finals.get(final_name, FinalFacts(False))
        stagings = [d for d in group if d.kind == "staging"]
        asides = [d for d in group if d.kind == "aside"]
        live: list[OurDir] = []
        committed: list[OurDir] = []
        for d in stagings:
            dead_attempt = attempt is not None and d.attempt is not None and 0 < d.attempt < attempt
            if not dead_attempt and d.idle_s < min_idle_s:
                live.append(d)
                steps.append(StagingStep(d.path, StagingAction.KEEP, f"attempt {d.attempt}, changed "
                                         f"{d.idle_s:.0f} s ago: its writer may be alive"))
            elif d.check.committed:
                committed.append(d)
            else:
                steps.append(StagingStep(d.path, StagingAction.REMOVE_UNCOMMITTED,
                                         f"never committed ({d.check.reason}); its writer is gone"))
        committed.sort(key=lambda d: (d.check.step if d.check.step is not None else -1, -d.idle_s), reverse=True)
        rolled: OurDir | None = None
        final_step = final.check.step if final.check is not None and final.check.committed else None
        final_attempt = final.check.attempt if final.check is not None else None
        final_whole = final.check is not None and final.check.committed
        for d in committed:
            same_history = final_attempt is None or d.attempt is None or d.attempt >= final_attempt
            newer = (d.check.step is not None and final_step is not None and d.check.step > final_step
                     and same_history)
            if rolled is None and final.exists and not final_whole:
                steps.append(StagingStep(d.path, StagingAction.KEEP, f"committed at step {d.check.step}; "
                                         f"{final_name} exists but is not a committed checkpoint of ours: "
                                         "neither is replaced (the resume scan judges it)"))
                continue
            if rolled is None and (not final.exists or newer):
                rolled = d
                steps.append(StagingStep(d.path, StagingAction.ROLL_FORWARD,
                                         f"committed at step {d.check.step} but never put in place "
                                         f"({'no ' + final_name if not final.exists else final_name + ' is older'})"))
            else:
                steps.append(StagingStep(d.path, StagingAction.REMOVE_SUPERSEDED,
                                         f"committed at step {d.check.step}; {final_name} holds step "
                                         f"{final_step if rolled is None else rolled.check.step}"))
        for d in asides:
            if rolled is not None or final_whole:
                steps.append(StagingStep(d.path, StagingAction.REMOVE_ASIDE,
                                         f"{final_name} holds a committed checkpoint: the old copy is not needed"))
            elif not final.exists and not live and d.check.state is not CommitState.TORN:
                steps.append(StagingStep(d.path, StagingAction.RESTORE_ASIDE,
                                         f"{final_name} is missing and nothing replaces it: the old one goes back"))
            else:
                steps.append(StagingStep(d.path, StagingAction.KEEP,
                                         f"{final_name} is not a committed checkpoint: the old copy stays"))
    return tuple(steps)


def _idle_s(path: Path, now: float) -> float:
    newest = os.lstat(path).st_mtime
    try:
        for _rel, st in _walk(path, limit=100_000):
            newest = max(newest, st.st_mtime)
    except CommitError:
        return 0.0  # too big to judge: treat as live
    return max(now - newest, 0.0)


def _collect(ckpt_dir: Path, now: float) -> tuple[list[OurDir], dict[str, FinalFacts]]:
    dirs: list[OurDir] = []
    try:
        entries = list(os.scandir(ckpt_dir))
    except OSError:
        return [], {}
    for entry in entries:
        staging = parse_staging_name(entry.name)
        aside = None if staging else parse_aside_name(entry.name)
        if staging is None and aside is None:
            continue
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue  # never a symlink, never a file: not one of ours
            path = Path(entry.path)
            dirs.append(OurDir(path, staging.final_name if staging else aside[0],  # type: ignore[index]
                               "staging" if staging else "aside", staging.attempt if staging else None,
                               _idle_s(path, now), verify_commit(path)))
        except OSError:
            continue
    finals: dict[str, FinalFacts] = {}
    for name in {d.final_name for d in dirs}:
        path = ckpt_dir / name
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            finals[name] = FinalFacts(False)
            continue
        except OSError:
            finals[name] = FinalFacts(True)
            continue
        finals[name] = FinalFacts(True, verify_commit(path) if stat.S_ISDIR(st.st_mode) else None)
    return dirs, finals


def stale_staging(ckpt_dir: str | os.PathLike[str], now: float, *, attempt: int | None = None,
                  min_idle_s: float = STALE_STAGING_S) -> list[StagingStep]:
    """What :func:`remove_stale_staging` would do (nothing is changed). ``now``: epoch seconds;
    ``attempt``: the attempt about to start (staging dirs of earlier attempts are dead)."""
    dirs, finals = _collect(Path(ckpt_dir), now)
    return [s for s in plan_staging_cleanup(dirs, finals, attempt=attempt, min_idle_s=min_idle_s)]


@dataclass(frozen=True)
class StagingResult:
    """One carried-out cleanup step: ``ok`` False with ``error`` when the filesystem refused."""

    path: str
    action: str
    reason: str
    ok: bool
    error: str | None = None

    def to_event(self) -> dict[str, Any]:
        return {"path": self.path, "action": self.action, "reason": self.reason, "ok": self.ok, "error": self.error}


def remove_stale_staging(ckpt_dir: str | os.PathLike[str], now: float, *, attempt: int | None = None,
                         min_idle_s: float = STALE_STAGING_S) -> list[StagingResult]:
    """Carry out :func:`stale_staging`'s plan: remove abandoned staging dirs, roll committed ones
    forward, remove or restore asides. Call it only while no writer of this run is alive (the run
    loop at attempt start) and, with one supervisor per node, on one node only. Steps that keep a
    directory are not returned. Never raises for a filesystem error: the result says so."""
    root = Path(ckpt_dir)
    done: list[StagingResult] = []
    for s in stale_staging(root, now, attempt=attempt, min_idle_s=min_idle_s):
        if s.action is StagingAction.KEEP:
            continue
        try:
            final = root / (parse_staging_name(s.path.name) or _aside_as_staging(s.path.name)).final_name
            if s.action is StagingAction.ROLL_FORWARD:
                name = parse_staging_name(s.path.name)
                assert name is not None
                publish(s.path, final, name)
            elif s.action is StagingAction.RESTORE_ASIDE:
                if os.path.lexists(final):
                    raise FileExistsError(f"{final} appeared meanwhile")
                os.rename(s.path, final)
                fsync_dir(root)
            elif s.action is StagingAction.REMOVE_ASIDE:
                if not os.path.lexists(s.path):
                    continue  # the roll-forward of this final name removed it already
                discard(s.path, attempt=attempt)
            else:
                _rmtree(s.path)
                fsync_dir(root)
        except OSError as exc:
            done.append(StagingResult(str(s.path), s.action.value, s.reason, False,
                                      f"{type(exc).__name__}: {exc.strerror or exc}"))
            continue
        done.append(StagingResult(str(s.path), s.action.value, s.reason, True))
    return done


def _aside_as_staging(name: str) -> StagingName:
    parts = parse_aside_name(name)
    assert parts is not None
    return StagingName(parts[0], 0, parts[1])
