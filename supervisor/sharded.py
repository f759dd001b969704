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

The supervisor side reads the same marker through :mod:`supervisor.commit_marker`
(:func:`verify_commit`, the validator's check) and settles what a crash left with
:mod:`supervisor.checkpoints.staging` (:func:`remove_stale_staging`), called by the run loop at attempt
start, when no writer of the run is alive. They only ever touch directories whose names match this module's
own patterns (:func:`parse_staging_name`, :func:`parse_aside_name`), never follow a symlink, and
never remove a committed checkpoint that is the only copy of its step.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import stat
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .checkpoints.atomic import atomic_write_bytes, fsync_dir
from .commit_marker import (  # the marker's names and check: re-exported, callers know them from here
    MARKER,
    MARKER_KIND,
    MARKER_VERSION,
    NONCE_HEX,
    RANK_NOTE_PREFIX,
    VISIBILITY_TIMEOUT_S,
    CommitCheck,
    CommitError,
    CommitState,
    StagingName,
    crc32_of,
    is_own_file,
    parse_aside_name,
    parse_staging_name,
    read_marker,
    read_small,
    verify_commit,
    walk_tree,
)

if TYPE_CHECKING:  # annotations only
    from types import TracebackType

__all__ = [
    "MARKER",
    "CommitCheck",
    "CommitError",
    "CommitState",
    "DirCommit",
    "discard",
    "parse_aside_name",
    "parse_staging_name",
    "read_marker",
    "saving_dir",
    "verify_commit",
]


# ------------------------------------------------------------------------------------ names


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


def sync_tree(root: Path) -> list[str]:
    """fsync every regular file under ``root`` this process can see, then every directory.
    Returns the files seen (relative paths). On a node-local view this covers this rank's own
    files, which is all a rank can make durable."""
    files: list[str] = []
    dirs: list[Path] = [root]
    for rel, st in walk_tree(root):
        path = root / rel
        if stat.S_ISDIR(st.st_mode):
            dirs.append(path)
        elif stat.S_ISREG(st.st_mode):
            if not is_own_file(rel):
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
    """``path`` gets ``data`` whole or not at all, readable by the group and others like the shards
    beside it (supervisor/checkpoints/atomic.py: temp file, fsync, rename, fsync the dir)."""
    atomic_write_bytes(path, data, 0o644)


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
                    data = read_small(staging / _rank_note(rank), 1 << 26)
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
        names = {rel for rel, st in walk_tree(staging) if not stat.S_ISDIR(st.st_mode) and not is_own_file(rel)}
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
