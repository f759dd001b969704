"""Files the supervisor writes, created with an explicit mode whatever the umask. STDLIB ONLY.

Every file that can hold a command line, output lines, configuration or the environment is opened
here (docs/security.md lists them with their modes). ``os.open``'s mode is filtered by the umask,
which can only take bits away; the modes here are then enforced with ``fchmod`` so that a file
that already exists with wider bits (written by an earlier version, or under a lax umask) is
tightened. Bits are only ever removed: a file its owner made narrower (0600) stays so.
"""

from __future__ import annotations

import os
import stat

from .checkpoints.atomic import atomic_write_bytes

__all__ = ["GROUP_READ", "OWNER_ONLY", "append_fd", "tighten", "write_atomic"]

OWNER_ONLY = 0o600  # raw output, the environment, the per-user node ledger
GROUP_READ = 0o640  # redacted records the project group reads with `supervise report`


def tighten(fd: int, mode: int) -> None:
    """Remove from the open file every permission bit outside ``mode`` (never adds one)."""
    current = stat.S_IMODE(os.fstat(fd).st_mode)
    if current & ~mode:
        os.fchmod(fd, current & mode)


def append_fd(path: str | os.PathLike[str], mode: int, *, cloexec: bool = True) -> int:
    """An ``O_APPEND`` write descriptor of ``path`` (created when missing), at most ``mode``."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | (os.O_CLOEXEC if cloexec else 0)
    fd = os.open(path, flags, mode)
    try:
        tighten(fd, mode)
    except OSError:
        os.close(fd)
        raise
    return fd


def write_atomic(path: str | os.PathLike[str], data: bytes, mode: int, *, durable: bool = True) -> None:
    """``path`` holds ``data`` at ``mode`` or narrower (a temp file beside it, fsynced, renamed over
    it): a reader, or a supervisor killed mid-write, never sees half a file, and the mode is right
    from the first byte (a fresh ``O_EXCL`` file: the umask can only narrow it). The writer is the
    package's one temp-and-rename writer, supervisor/checkpoints/atomic.py."""
    atomic_write_bytes(path, data, mode, durable=durable)
