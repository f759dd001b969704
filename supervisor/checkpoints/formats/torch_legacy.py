"""torch.save's legacy format (``_use_new_zipfile_serialization=False``): five pickles back to back
(magic number, protocol, sys_info, the object, the storage keys), then each storage's element
count and raw bytes. No checksum: the ladder stops at L3 (sizes add up to the file size).
"""

from __future__ import annotations

from typing import Literal

from ..limits import MAX_PICKLE_BYTES, ScanLimitError
from ..outcome import Outcome, corrupt, unverifiable, valid
from ..picklescan import PickleScan, PickleScanError, TruncatedPickle, as_mapping, find_epoch, find_step
from ..allowlist import allowed_for
from ..zipcheck import pread_exact
from .base import FileContext, FileFormat
from .common import (
    file_reader,
    location_problem,
    over_limit,
    scan_stream,
    tar_header_reason,
    top_level_facts,
    unsafe_reason,
    view_problem,
)
from .kinds import LEGACY_MAGIC, TORCH_LEGACY


class TorchLegacy(FileFormat):
    name = TORCH_LEGACY
    suffixes = (".pt", ".pth", ".ckpt", ".bin", ".tar")
    step_where = None
    unpickled = True

    def detect(self, head: bytes, name: str) -> bool:
        return head.startswith(LEGACY_MAGIC) or (len(head) < len(LEGACY_MAGIC) and LEGACY_MAGIC.startswith(head))

    def validate(self, fd: int, size: int, ctx: FileContext) -> Outcome:
        if tar := tar_header_reason(fd, size):  # torch.load would read the tar, not these pickles
            return corrupt(TORCH_LEGACY, 1, tar, load_safe=False)
        return check_torch_legacy(fd, size, max_level=ctx.max_level, allowed=ctx.allowed)


FORMAT = TorchLegacy()


def check_torch_legacy(fd: int, size: int, *, max_level: int = 3,
                       allowed: frozenset[tuple[str, str]] | None = None) -> Outcome:
    """Five pickles back to back (magic, protocol, sys_info, object, storage keys), then for each
    key an int64 element count and the raw bytes; EOF must land exactly after the last one.
    There is no checksum: a zero-filled payload cannot be detected."""
    fmt = TORCH_LEGACY
    allowed = allowed_for() if allowed is None else allowed
    try:
        scans = _legacy_pickles(fd, size)
    except PickleScanError as exc:
        return corrupt(fmt, 2, f"pickle header: {exc}")
    except ScanLimitError as exc:
        return over_limit(fmt, 2, exc)
    if unsafe := unsafe_reason(scans, allowed):
        return corrupt(fmt, 3, unsafe, load_safe=False)
    magic, protocol, sys_info, obj, keys = (s.root for s in scans)
    if type(magic) is not int or magic != 0x1950A86A20F9469CFC6C or type(protocol) is not int or protocol != 1001:
        return corrupt(fmt, 2, "legacy torch header damaged (magic or protocol number)")
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        return corrupt(fmt, 2, "legacy storage key list damaged")
    step, epoch = find_step(obj), find_epoch(obj)
    facts = top_level_facts(obj)
    if max_level < 3:
        return valid(fmt, 2, "legacy pickles intact", embedded_step=step, epoch=epoch, facts=facts)
    if located := location_problem(scans[3]):
        return (corrupt if located[0] else unverifiable)(fmt, 3, located[1], embedded_step=step)
    if view := view_problem(scans[3]):
        return corrupt(fmt, 3, f"{view}: torch.load fails", embedded_step=step)
    info = as_mapping(sys_info) or {}
    order: Literal["little", "big"] = "little" if info.get("little_endian", True) else "big"
    itemsize: dict[str, int | None] = {}
    numels: dict[str, int] = {}
    for ref in scans[3].storages:
        itemsize.setdefault(ref.key, ref.itemsize)
        numels.setdefault(ref.key, ref.numel)
    pos = sum(s.end for s in scans)
    for key in keys:
        key_itemsize = itemsize.get(key)
        if key_itemsize is None:
            return unverifiable(fmt, 3, f"storage {key[:40]!r} has an unknown element type", embedded_step=step)
        raw = pread_exact(fd, 8, pos)
        if len(raw) < 8:
            return corrupt(fmt, 3, f"truncated: storage {key[:40]} starts past the end of the file")
        numel = int.from_bytes(raw, order, signed=True)
        if numel != numels.get(key, numel):  # torch.load compares the two and refuses the file
            return corrupt(fmt, 3, f"storage {key[:40]} holds {numel} elements, the pickle says {numels[key]}")
        pos += 8 + numel * key_itemsize
        if numel < 0 or pos > size:
            return corrupt(fmt, 3, f"truncated: storage {key[:40]} needs {pos - size} more bytes")
    if pos != size:
        return corrupt(fmt, 3, f"{size - pos} unexpected bytes after the last storage")
    return valid(fmt, 3, f"{len(keys)} storages, sizes add up to the file size (format has no checksum)",
                 embedded_step=step, epoch=epoch, facts=facts)


def _legacy_pickles(fd: int, size: int) -> list[PickleScan]:
    """The five pickles at the start of a legacy file, read window by window (the storages after
    them can be gigabytes), never past MAX_PICKLE_BYTES."""
    total = min(size, MAX_PICKLE_BYTES)
    try:
        return scan_stream(None, count=5, reader=file_reader(fd), total=total)
    except TruncatedPickle:
        if total < size:
            raise ScanLimitError(
                f"too large to scan: the legacy pickles run past {MAX_PICKLE_BYTES:,} bytes") from None
        raise
