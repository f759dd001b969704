"""The validation ladder for single-file checkpoints: which format a file is (the registry's
detection, supervisor/checkpoints/formats/registry.py), then that format's ladder
(supervisor/checkpoints/formats/<format>.py). A file no format claims is judged here: empty,
zero-filled, text, a tar archive, a format's damaged start, or scanned as a pickle stream
(torch.load unpickles whatever a non-zip file starts with).

Never unpickles for real: pickles are walked by :mod:`.picklescan`. Which globals they name is a
trust note (:mod:`.trust`), not an integrity verdict, except for a known code-execution primitive
(``os.system``...), which no ``torch.save`` writes: such a file is CORRUPT ("hostile pickle").
"""

from __future__ import annotations

import os

from ..states import Verdict
from . import formats as F
from .allowlist import allowed_for
from .formats.base import FileContext
from .formats.common import TAR_ARCHIVE_REASON, tar_header_reason
from .formats.plain_pickle import check_plain_pickle
from .fsio import regular_fd
from .outcome import Outcome, corrupt, unverifiable
from .zipcheck import crc_cache_key, pread_exact


def check_file(path: str, *, deep: bool = False, max_level: int = 3,
               allowed: frozenset[tuple[str, str]] | None = None) -> Outcome:
    """Run the ladder on one regular file (L1..``max_level``; L4 too when ``deep``). ``allowed``:
    the globals its pickles may name (default: the allowlist for this file name).

    Raises OSError when the file cannot be opened (missing, permission denied, a symlink loop, not
    a regular file: a FIFO is never opened for reading)."""
    name = os.path.basename(path)
    allowed = allowed_for(name) if allowed is None else allowed
    with regular_fd(path) as (fd, st):
        size = st.st_size
        if max_level < 2 and not deep:
            # quick look (candidates older than the resume point): one read at the end of the file
            for known in F.file_formats():
                if (quick := known.quick_look(fd, size)) is not None:
                    return quick
        head = pread_exact(fd, F.HEAD_BYTES, 0)
        kind = F.sniff_bytes(head, name)
        if kind == F.EMPTY:
            return corrupt(F.EMPTY, 0, "empty file (0 bytes): the save never wrote data")
        fmt = F.file_format(kind)
        if fmt is not None:
            return fmt.validate(fd, size, FileContext(path, name, head, deep, max_level, allowed,
                                                      crc_cache_key(path, st) if deep else None))
        if tar_header_reason(fd, size):
            # torch.load reads any file that does not start with a zip header as a tar archive
            # first, and only then as pickles: a plain tar is torch's oldest format, whose members
            # are not scanned.
            return unverifiable(F.UNKNOWN, 1, TAR_ARCHIVE_REASON, load_safe=False)
        if kind == F.ZEROED:
            return corrupt(F.ZEROED, 1, "zero-filled start (size kept, data never written)")
        if kind == F.TEXT:
            return corrupt(F.TEXT, 1, _text_reason(head))
        for known in F.file_formats():
            if (damaged := known.damaged_start(fd, size, head)) is not None:
                return damaged
        return check_unknown(fd, size, head, allowed=allowed)


def _text_reason(head: bytes) -> str:
    text = head.decode("utf-8", "replace")
    if text.startswith("version https://git-lfs"):
        return "a git-lfs pointer file, not the checkpoint itself"
    first = text.splitlines()[0][:40] if text.strip() else ""
    return f"a text file, not a checkpoint (starts {first!r})"



def check_unknown(fd: int, size: int, head: bytes, *, allowed: frozenset[tuple[str, str]] | None = None) -> Outcome:
    """A file no format claims. torch.load unpickles whatever a non-zip file starts with, so it is
    scanned as a pickle stream (protocol 0/1 pickles have no magic): a whole stream is a plain
    pickle, a hostile one is CORRUPT; anything else is UNVERIFIABLE and never a resume point."""
    outcome = check_plain_pickle(fd, size, allowed=allowed)
    if outcome.verdict is not Verdict.CORRUPT or not outcome.reason.startswith("hostile pickle"):
        if outcome.verdict is Verdict.VALID:
            return outcome.but(reason=f"protocol 0/1 {outcome.reason}")
        return unverifiable(F.UNKNOWN, 1, f"unknown format (first bytes {head[:8].hex()})", load_safe=False)
    return outcome
