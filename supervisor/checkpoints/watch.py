"""Zero-code save detection: watch the checkpoint dir between polls.

A save is *in flight* while a temp file for it exists (``.<name>.tmp-*``, ``*.tmp``,
``*.partial``, NeMo's ``-unfinished`` marker, DCP's ``.metadata.tmp``, a sharded save's staging
directory ``<name>.tmp-<attempt>-<nonce>/``) or while a checkpoint's size/mtime/inode keeps
changing between polls (``torch.save`` straight onto its final name). It is *complete* when the
temp was renamed onto the final name, or when the checkpoint stayed unchanged over a whole poll
interval and is whole by its own format: for DCP/HF dirs and sharded saves, the commit marker
exists; for a torch zip, its trailer is there (a writer descheduled for a moment on a busy node
leaves a file that stops growing without being finished). A file that stays cut short for
``INCOMPLETE_GIVE_UP_S`` is a torn write, no longer a save in flight. An old checkpoint a
sharded save moves aside for a moment (``<name>.old-<nonce>``) is not a save. The
first/last poll times bound the save's duration; the runner logs ``save_begin``/``save_end``
from them and learns how long saves take.

Pure bookkeeping plus ``scandir``/``stat``; the clock is passed in. :class:`DirEvents` (inotify,
where the kernel has it) only says *when* to poll: a write that begins is seen at the next loop tick
instead of the next poll interval.
"""

from __future__ import annotations

import ctypes
import os
import struct
from dataclasses import dataclass, field
from typing import Any

from ..commit_marker import MARKER, parse_aside_name
from . import formats as F
from .fsio import regular_fd
from .naming import final_name_of_temp, has_checkpoint_suffix, is_temp_name, parse_name

TRACKED_DIRS = 8  # besides new and "last" dirs, only the newest step dirs are walked each poll
INCOMPLETE_GIVE_UP_S = 30.0  # an unchanged file still cut short after this long: torn, not in flight


@dataclass(frozen=True)
class CompletedSave:
    path: str
    bytes: int
    first_seen: float  # poll time the save was first noticed (a lower bound on its start is unknown)
    done_at: float  # poll time it was seen complete

    @property
    def duration(self) -> float:
        return max(self.done_at - self.first_seen, 0.0)


@dataclass(frozen=True)
class SaveActivity:
    in_flight: bool
    path: str | None = None  # the oldest save still in flight
    bytes: int = 0
    since: float | None = None
    completed: tuple[CompletedSave, ...] = ()
    reason: str = ""


@dataclass(frozen=True)
class _Snap:
    size: int
    mtime_ns: int
    ino: int
    committed: bool = True  # DCP .metadata / HF trainer_state.json present


@dataclass
class _Active:
    first_seen: float
    bytes: int = 0
    via_temp: bool = False
    cut_short_since: float | None = None  # unchanged but not whole since this poll


@dataclass
class DirWatcher:
    """Call :meth:`poll` every few seconds with the current time."""

    ckpt_dir: str
    _prev: dict[str, _Snap] | None = field(default=None, init=False)
    _temps: dict[str, str] = field(default_factory=dict, init=False)  # temp name -> final name
    _active: dict[str, _Active] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.ckpt_dir = os.fspath(self.ckpt_dir)

    def poll(self, now: float) -> SaveActivity:
        snaps, temps = self._snapshot()
        completed: list[CompletedSave] = []
        first_poll = self._prev is None
        prev = self._prev or {}
        finals_with_temp = set(temps.values())
        for temp_name, final in temps.items():
            size = _size_of(os.path.join(self.ckpt_dir, temp_name))
            active = self._active.setdefault(final, _Active(now, via_temp=True))
            active.via_temp, active.bytes = True, size
        for final in [f for f, a in self._active.items() if a.via_temp and f not in finals_with_temp]:
            active = self._active[final]
            snap, before = snaps.get(final), prev.get(final)
            if snap is not None and snap != before and snap.committed:
                completed.append(self._complete(final, snap, active, now))
            elif snap is None or snap == before:
                del self._active[final]  # temp removed without a rename: aborted save
            else:
                active.via_temp = False
        if not first_poll:
            for name, snap in snaps.items():
                before = prev.get(name)
                tracked = self._active.get(name)
                if name in finals_with_temp or any(c.path.endswith(os.sep + name) for c in completed):
                    continue
                if snap != before:
                    if tracked is None:
                        self._active[name] = _Active(now, snap.size)
                    else:
                        tracked.bytes, tracked.cut_short_since = snap.size, None
                elif tracked is not None and not tracked.via_temp:
                    if not snap.committed:
                        del self._active[name]  # stopped changing without its commit marker: torn
                    elif written_to_the_end(os.path.join(self.ckpt_dir, name)):
                        completed.append(self._complete(name, snap, tracked, now))
                    elif tracked.cut_short_since is None:
                        tracked.cut_short_since = now  # paused mid-write, or torn: still in flight for now
                    elif now - tracked.cut_short_since >= INCOMPLETE_GIVE_UP_S:
                        del self._active[name]  # torn: the resume point's validation quarantines it
        for name in [n for n, a in self._active.items() if n not in snaps and n not in finals_with_temp]:
            del self._active[name]
        self._prev = snaps
        return self._activity(completed)

    def _complete(self, name: str, snap: _Snap, active: _Active, now: float) -> CompletedSave:
        self._active.pop(name, None)
        return CompletedSave(os.path.join(self.ckpt_dir, name), snap.size, active.first_seen, now)

    def _activity(self, completed: list[CompletedSave]) -> SaveActivity:
        if not self._active:
            return SaveActivity(False, completed=tuple(completed),
                                reason=f"{len(completed)} save(s) completed" if completed else "no save in flight")
        name, active = min(self._active.items(), key=lambda item: item[1].first_seen)
        how = "temp file present" if active.via_temp else "size/mtime changing"
        return SaveActivity(True, os.path.join(self.ckpt_dir, name), active.bytes, active.first_seen,
                            tuple(completed), f"{name}: {how}")

    def _snapshot(self) -> tuple[dict[str, _Snap], dict[str, str]]:
        snaps: dict[str, _Snap] = {}
        temps: dict[str, str] = {}
        dirs: list[os.DirEntry] = []
        try:
            entries = list(os.scandir(self.ckpt_dir))
        except OSError:
            return snaps, temps
        for entry in entries:
            name = entry.name
            if is_temp_name(name):
                final = final_name_of_temp(name)
                if final:
                    temps[name] = final
                continue
            if name.startswith((".", "CORRUPT_")) or parse_aside_name(name):
                continue
            try:
                if entry.is_dir(follow_symlinks=False):
                    dirs.append(entry)
                elif entry.is_file(follow_symlinks=False) and has_checkpoint_suffix(name):
                    st = entry.stat(follow_symlinks=False)
                    snaps[name] = _Snap(st.st_size, st.st_mtime_ns, st.st_ino)
            except OSError:
                continue
        walked = self._dirs_to_walk(dirs)
        for entry in walked:
            snap, dir_temp = _dir_snap(entry.path)
            snaps[entry.name] = snap
            if dir_temp:
                temps[f"{entry.name}/{dir_temp}"] = entry.name
        # A known directory not walked this time (older than the TRACKED_DIRS newest) keeps the look it
        # had: dropped, it would come back as new at the next poll, be walked, and be taken for a save.
        known, seen = self._prev or {}, {entry.name for entry in walked}
        for entry in dirs:
            if entry.name not in seen and entry.name in known:
                snaps[entry.name] = known[entry.name]
        return snaps, temps

    def _dirs_to_walk(self, dirs: list[os.DirEntry]) -> list[os.DirEntry]:
        known = self._prev or {}
        named = [(parse_name(d.name), d) for d in dirs]
        ordered = [(n, d) for info, d in named if (n := info.step if info.step is not None else info.index) is not None]
        stepped = sorted(ordered, key=lambda x: x[0], reverse=True)
        keep = {d.name for _, d in stepped[:TRACKED_DIRS]}
        keep |= {d.name for info, d in named if info.is_last or d.name not in known or d.name in self._active}
        return [d for d in dirs if d.name in keep and (parse_name(d.name).step is not None
                                                      or parse_name(d.name).index is not None
                                                      or has_checkpoint_suffix(d.name)
                                                      or parse_name(d.name).is_last
                                                      or F.detect_dir(d.path) not in (F.DIRECTORY, F.UNKNOWN))]


def _dir_snap(path: str) -> tuple[_Snap, str | None]:
    """Total size, newest mtime and the marker state of a directory checkpoint."""
    total, newest, ino = 0, 0, 0
    temp = None
    for root, subdirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            total += st.st_size
            newest = max(newest, st.st_mtime_ns)
            ino ^= st.st_ino
            if temp is None and (name == ".metadata.tmp" or is_temp_name(name)):
                temp = os.path.relpath(os.path.join(root, name), path)
    try:
        names = set(os.listdir(path))
    except OSError:
        names = set()
    # a sharded save's commit marker is written last, after every rank's files; else the format's own
    fmt = F.dir_format(F.detect_dir(path))
    committed = MARKER in names or fmt is None or fmt.committed(frozenset(names))
    return _Snap(total, newest, ino, committed), temp


def written_to_the_end(path: str) -> bool:
    """False when the file's own format says it is cut short: empty, or (the format's
    ``written_to_the_end``) a torch zip without its trailer (torch writes the central directory
    last). Other formats and directories: True (the watch cannot tell; validation at the resume
    point still can)."""
    try:
        with regular_fd(path) as (fd, st):
            if st.st_size == 0:
                return False
            head = os.pread(fd, F.HEAD_BYTES, 0)
            fmt = F.file_format(F.sniff_bytes(head, os.path.basename(path)))
            return fmt is None or fmt.written_to_the_end(fd, st.st_size)
    except OSError:
        return True


def _size_of(path: str) -> int:
    try:
        st = os.lstat(path)
    except OSError:
        return 0
    if os.path.isdir(path):
        return _dir_snap(path)[0].size
    return st.st_size


_IN_MODIFY, _IN_CLOSE_WRITE, _IN_MOVED_TO, _IN_CREATE = 0x2, 0x8, 0x80, 0x100
_IN_ISDIR, _IN_Q_OVERFLOW, _IN_NONBLOCK, _IN_CLOEXEC = 0x40000000, 0x4000, 0o4000, 0o2000000
_IN_EVENT_HEAD = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then the name)
MAX_DIR_WATCHES = 256  # the checkpoint dir and this many subdirectories; deeper trees fall back to polling


class DirEvents:
    """Event-driven wake-ups for the poll: Linux inotify on the checkpoint dir and its subdirectories
    (a file created, written, closed after writing, or renamed in). :meth:`changed` says whether
    anything happened since the last call, so the loop polls at once instead of up to
    ``WATCH_INTERVAL`` later. Where inotify is missing (not Linux, no watches left) it always says
    False and the regular poll is all there is. No new dependency: libc through ctypes."""

    MASK = _IN_CREATE | _IN_MODIFY | _IN_CLOSE_WRITE | _IN_MOVED_TO

    def __init__(self, ckpt_dir: str | os.PathLike[str]) -> None:
        self.root = os.fspath(ckpt_dir)
        self._fd = -1
        self._dirs: dict[int, str] = {}  # watch descriptor -> directory
        self._libc: Any = None
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        except (OSError, AttributeError):
            return
        if fd < 0:
            return
        self._fd, self._libc = fd, libc
        self._watch_tree(self.root)

    @property
    def available(self) -> bool:
        return self._fd >= 0

    def changed(self) -> bool:
        """Whether the directory tree saw a create/write/close/rename since the last call."""
        if self._fd < 0:
            return False
        if not self._dirs:
            self._watch_tree(self.root)  # the training creates the checkpoint dir late
        seen = False
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                break
            except OSError:
                self.close()
                return True  # something is wrong with the watch: poll now, then by the clock
            if not data:
                break
            seen = True
            self._follow_new_dirs(data)
        return seen

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        self._dirs.clear()
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass

    def _follow_new_dirs(self, data: bytes) -> None:
        offset = 0
        while offset + _IN_EVENT_HEAD.size <= len(data):
            wd, mask, _cookie, length = _IN_EVENT_HEAD.unpack_from(data, offset)
            name = data[offset + _IN_EVENT_HEAD.size:offset + _IN_EVENT_HEAD.size + length].split(b"\0", 1)[0]
            offset += _IN_EVENT_HEAD.size + length
            parent = self._dirs.get(wd)
            if mask & _IN_Q_OVERFLOW or parent is None or not mask & _IN_ISDIR or not name:
                continue
            self._watch_tree(os.path.join(parent, os.fsdecode(name)))  # a new step dir, or one renamed in

    def _watch_tree(self, top: str) -> None:
        for root, subdirs, _files in os.walk(top):  # never follows symlinks
            if not self._add(root):
                subdirs[:] = []
            subdirs[:] = [d for d in subdirs if not d.startswith("CORRUPT_")]

    def _add(self, path: str) -> bool:
        if len(self._dirs) >= MAX_DIR_WATCHES or self._fd < 0:
            return False
        wd = self._libc.inotify_add_watch(self._fd, os.fsencode(path), self.MASK)
        if wd < 0:
            return False
        self._dirs[wd] = path
        return True
