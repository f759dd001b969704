"""Atomic, durable checkpoint writes for the training side. STDLIB ONLY at import time: the
client imports this module inside the training process; torch is imported lazily in
:func:`atomic_torch_save`. Retention (deleting old checkpoints, which validates them) is
:mod:`supervisor.checkpoints.retention`.

The recipe: write ``<dir>/.<name>.tmp-<pid>-<rand>`` in the
SAME directory (a rename is atomic only within one filesystem), flush + fsync (so the rename
cannot reach disk before the data: ext4 delalloc, NFS writeback), ``os.replace`` (replaces a
symlink itself, never writes through it), fsync the directory (so the rename survives a crash).
A kill at any moment leaves either the old file or the new one, plus at worst a hidden temp file
that validators ignore.

This is the one temp-and-rename writer of the package: the supervisor's own files go through it too
(supervisor/private.py gives them their explicit modes), and so do the commit markers and rank
notes of a sharded save (supervisor/sharded.py). ``mode`` is the new file's permission bits (the
temp file is created ``O_EXCL`` with them, so the umask can only narrow them and the file never
exists with wider bits); ``durable=False`` skips the two fsyncs where a file is rewritten often and
losing its newest version to a crash costs nothing (a lock's owner note, a metrics snapshot).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from pathlib import Path
from typing import Any, BinaryIO, Iterator

_COPY_CHUNK = 16 << 20


def temp_path_for(path: str | os.PathLike[str]) -> Path:
    """``<dir>/.<name>.tmp-<pid>-<rand>``: hidden, and named so the watcher knows its final name."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make a rename in ``directory`` durable. Some filesystems refuse fsync on a directory: the
    rename is still atomic there, only its durability is up to the filesystem."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike[str], mode: int = 0o666, *, durable: bool = True) -> Iterator[BinaryIO]:
    """Yield a binary file; on a clean exit it becomes ``path`` atomically (and durably, unless
    ``durable=False``), with permission bits ``mode`` or narrower (the umask applies). On an
    exception the temp file is removed and ``path`` is untouched."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        raise IsADirectoryError(f"{path} is a directory (a DeepSpeed/Lightning checkpoint dir?): not replaced")
    directory = path.parent if str(path.parent) else Path(".")
    tmp = temp_path_for(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(directory)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, mode: int = 0o666, *, durable: bool = True) -> None:
    """``path`` holds ``data`` whole or not at all (see :func:`atomic_writer`)."""
    with atomic_writer(path, mode, durable=durable) as handle:
        handle.write(data)


def atomic_torch_save(obj: Any, path: str | os.PathLike[str], **save_kwargs: Any) -> None:
    """``torch.save(obj, path)``, atomically. The archive's internal prefix becomes ``archive/``
    (torch names it after the file only when given a path): harmless, torch.load ignores it."""
    import torch  # lazily: the supervisor never imports torch

    with atomic_writer(path) as handle:
        torch.save(obj, handle, **save_kwargs)


def update_last(step_path: str | os.PathLike[str], last_path: str | os.PathLike[str]) -> str:
    """Point ``last_path`` (e.g. ``last.ckpt``) at the checkpoint ``step_path``, atomically.

    A hard link (no copy, no extra space) swapped in by rename; where hard links are not possible
    (another filesystem, a filesystem without them) an atomic copy. Never a symlink: torch.save
    writes *through* a symlink into the step checkpoint. A hard link shares the inode in the same
    way, so whoever writes ``last_path`` later must replace it (atomic_torch_save, Lightning's
    atomic save), never truncate it in place. Returns ``"link"``, ``"copy"`` or ``"same"``."""
    step_path, last_path = Path(step_path), Path(last_path)
    if last_path.is_dir() and not last_path.is_symlink():
        raise IsADirectoryError(f"{last_path} is a directory: not replaced")
    with contextlib.suppress(OSError):
        if os.path.samefile(step_path, last_path) and not last_path.is_symlink():
            return "same"
    tmp = temp_path_for(last_path)
    try:
        os.link(step_path, tmp, follow_symlinks=False)
    except OSError:
        with open(step_path, "rb") as src, atomic_writer(last_path) as dst:
            shutil.copyfileobj(src, dst, _COPY_CHUNK)
        return "copy"
    try:
        os.replace(tmp, last_path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(last_path.parent)
    return "link"
