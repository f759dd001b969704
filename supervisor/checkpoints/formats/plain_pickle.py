"""A plain ``pickle.dump`` (one or more pickles that end exactly at EOF), scanned inertly."""

from __future__ import annotations

from ..allowlist import allowed_for
from ..limits import MAX_PICKLE_BYTES, ScanLimitError
from ..outcome import Outcome, corrupt, valid
from ..picklescan import PickleScanError, find_epoch, find_step
from .base import FileContext, FileFormat
from .common import file_reader, over_limit, scan_stream, tar_header_reason, top_level_facts, unsafe_reason
from .kinds import PICKLE, PICKLE_PROTOCOLS


class PlainPickle(FileFormat):
    name = PICKLE
    suffixes = (".pkl", ".pickle")
    step_where = None
    unpickled = True

    def detect(self, head: bytes, name: str) -> bool:
        return head[:2] in PICKLE_PROTOCOLS

    def validate(self, fd: int, size: int, ctx: FileContext) -> Outcome:
        if tar := tar_header_reason(fd, size):  # torch.load would read the tar, not this pickle
            return corrupt(PICKLE, 1, tar, load_safe=False)
        if ctx.max_level < 2:
            return valid(PICKLE, 1, "plain pickle (not scanned at this level)")
        return check_plain_pickle(fd, size, allowed=ctx.allowed)


FORMAT = PlainPickle()


def check_plain_pickle(fd: int, size: int, *, allowed: frozenset[tuple[str, str]] | None = None,
                       fmt: str = PICKLE) -> Outcome:
    """One or more pickles (``pickle.dump``) that must end exactly at EOF; every one is scanned
    (a loader calling pickle.load repeatedly reads them all)."""
    allowed = allowed_for() if allowed is None else allowed
    if size > MAX_PICKLE_BYTES:
        return over_limit(fmt, 1, ScanLimitError(
            f"too large to scan: a {size:,}-byte pickle (limit {MAX_PICKLE_BYTES:,})"))
    try:
        scans = scan_stream(None, reader=file_reader(fd), total=size)
    except PickleScanError as exc:
        return corrupt(fmt, 2, str(exc))
    except ScanLimitError as exc:
        return over_limit(fmt, 2, exc)
    if unsafe := unsafe_reason(scans, allowed):
        return corrupt(fmt, 3, unsafe, load_safe=False)
    root = scans[0].root if scans else None
    more = f" ({len(scans)} pickles)" if len(scans) > 1 else ""
    return valid(fmt, 3, f"pickle stream complete{more} (inert scan; no checksum)",
                 embedded_step=find_step(root), epoch=find_epoch(root), facts=top_level_facts(root))
