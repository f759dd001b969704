"""Opening files inside a checkpoint dir without trusting what they are.

A name like ``model.pt`` may be a FIFO (an open for reading blocks until a writer appears), a
socket (ENXIO), a device (opening some has side effects), a symlink loop (ELOOP) or unreadable
(EACCES). Validators therefore open only regular files: ``stat`` first, then ``open`` with
``O_NONBLOCK`` (so even a FIFO swapped in between cannot block), then ``fstat`` on the open
descriptor. Every failure is an :class:`OSError`, which the validators turn into a verdict.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator

from .limits import ScanLimitError

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


class NotRegularFile(OSError):
    """The path exists but is not a regular file (FIFO, socket, device, directory)."""

    def __init__(self, path: str, mode: int) -> None:
        what = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        super().__init__(errno.EINVAL, f"{what}, not a regular file", path)


def file_kind(mode: int) -> str:
    fallback = "a regular file" if stat.S_ISREG(mode) else "a special file"
    return next((name for test, name in _KINDS if test(mode)), fallback)


@contextlib.contextmanager
def regular_fd(path: str | os.PathLike[str]) -> Iterator[tuple[int, os.stat_result]]:
    """(fd, fstat) of the regular file at ``path`` (symlinks followed), closed on exit."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFile(os.fspath(path), st.st_mode)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(os.fspath(path), st.st_mode)
        yield fd, st
    finally:
        os.close(fd)


def read_regular(path: str | os.PathLike[str], limit: int) -> bytes:
    """The whole regular file at ``path``; ScanLimitError when it is larger than ``limit``."""
    with regular_fd(path) as (fd, st):
        if st.st_size > limit:
            raise ScanLimitError(f"too large to scan: {os.path.basename(os.fspath(path))} is "
                                 f"{st.st_size:,} bytes (limit {limit:,})")
        parts = []
        got = 0
        while got <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - got))
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
        if got > limit:
            raise ScanLimitError(f"too large to scan: {os.path.basename(os.fspath(path))} grew past {limit:,} bytes")
        return b"".join(parts)


def describe_oserror(exc: OSError) -> str:
    """A short reason for a verdict: what went wrong and on which file."""
    code = errno.errorcode.get(exc.errno or 0, "")
    text = exc.strerror or str(exc)
    if exc.errno == errno.ELOOP:
        text = "symlink loop (too many levels of symbolic links)"
    where = f" ({os.path.basename(os.fspath(exc.filename))})" if exc.filename else ""
    return f"{text}{f' [{code}]' if code and not isinstance(exc, NotRegularFile) else ''}{where}"
