"""torch.save's zip format (the default since torch 1.6): ``<name>/data.pkl`` plus one ``data/<key>``
record per tensor storage, a central directory at the end.

Ladder: L1 the end-of-central-directory trailer, L2 the central directory (and torch's own
records: alignment, byte order, serialization id), L3 an inert scan of ``data.pkl`` (storages
present and big enough, devices known, views inside their storage), L4 every record's CRC32.
The step is the pickled mapping's ``global_step``/``step``/... (a one-element tensor too).
"""

from __future__ import annotations

import re
from typing import Any

from ..allowlist import allowed_for
from ..limits import ScanLimitError
from ..outcome import Outcome, corrupt, unverifiable, valid
from ..picklescan import (
    STEP_KEYS,
    Call,
    PersistentRef,
    PickleScan,
    PickleScanError,
    find_epoch,
    find_step,
    find_value,
    is_tensor,
    plain_int,
    scan_pickle,
    unknown_layout,
)
from ..zipcheck import (
    ZipCheckError,
    ZipIndex,
    cached_crc_check,
    crc_check,
    entry_crc,
    entry_reader,
    pread_exact,
    read_entry,
    read_index,
    read_trailer,
    torch_archive_problem,
)
from .base import FileContext, FileFormat
from .common import location_problem, over_limit, scan_stream, top_level_facts, unsafe_reason, view_problem
from .kinds import TORCH_ZIP, ZIP, ZIP_MAGIC


class TorchZip(FileFormat):
    name = TORCH_ZIP
    suffixes = (".pt", ".pth", ".ckpt", ".bin")
    step_where = None
    unpickled = True

    def detect(self, head: bytes, name: str) -> bool:
        # a head shorter than the magic is a file cut short: the zip ladder says so
        return head.startswith(ZIP_MAGIC) or (len(head) < len(ZIP_MAGIC) and ZIP_MAGIC.startswith(head))

    def validate(self, fd: int, size: int, ctx: FileContext) -> Outcome:
        return check_torch_zip(fd, size, deep=ctx.deep, max_level=ctx.max_level, allowed=ctx.allowed,
                               cache_key=ctx.cache_key)

    def quick_look(self, fd: int, size: int) -> Outcome | None:
        if torch_tail_ok(fd, size):
            return valid(TORCH_ZIP, 1, "zip trailer intact (end of file only)")
        return None

    def damaged_start(self, fd: int, size: int, head: bytes) -> Outcome | None:
        if not torch_tail_ok(fd, size):
            return None
        return corrupt(TORCH_ZIP, 1, "damaged start: the zip trailer is intact but the file does "
                                     f"not begin with a local header (first bytes {head[:8].hex()}); "
                                     "torch writes one at offset 0")

    def written_to_the_end(self, fd: int, size: int) -> bool:
        return torch_tail_ok(fd, size)  # torch writes the central directory last


FORMAT = TorchZip()


def torch_tail_ok(fd: int, size: int) -> bool:
    try:
        read_trailer(fd, 0, size, check_head=False)
    except ZipCheckError:
        return False
    return True



def check_torch_zip(
    fd: int, size: int, *, base: int = 0, deep: bool = False, max_level: int = 3,
    cache_key: tuple | None = None, allowed: frozenset[tuple[str, str]] | None = None,
) -> Outcome:
    """L1 trailer, L2 central directory, L3 inert data.pkl scan, L4 CRC (``deep``)."""
    fmt = TORCH_ZIP
    allowed = allowed_for() if allowed is None else allowed
    try:
        trailer = read_trailer(fd, base, size)
        if max_level < 2:
            return valid(fmt, 1, "zip trailer intact")
        index = read_index(fd, base, size, trailer)
        pkl = index.get("data.pkl")
        if pkl is None:
            return unverifiable(ZIP, 2, "a zip archive without data.pkl: not a torch.save file", load_safe=False)
        if problem := torch_archive_problem(index):
            return corrupt(fmt, 2, problem, load_safe=False)
        _check_alignment(fd, base, index)
        _check_byteorder(fd, base, index)
        _check_serialization_id(fd, base, index)
        if max_level < 3:
            return valid(fmt, 2, f"zip index intact ({len(index.entries)} entries)")
        scan = _scan_data_pkl(fd, base, index, pkl)
        if isinstance(scan, Outcome):
            return scan
        if unsafe := unsafe_reason([scan], allowed):
            return corrupt(fmt, 3, unsafe, load_safe=False)
        problem = _storage_problem(index, scan)
        if problem:
            return corrupt(fmt, 3, problem)
        if layout := unknown_layout(scan.root):
            return corrupt(fmt, 3, f"data.pkl: tensor layout {layout} does not exist: torch cannot load it (damaged)")
        facts = top_level_facts(scan.root)
        step, epoch = find_step(scan.root), find_epoch(scan.root)
        if located := location_problem(scan):
            return (corrupt if located[0] else unverifiable)(fmt, 3, located[1], embedded_step=step)
        if view := view_problem(scan):
            return corrupt(fmt, 3, f"data.pkl: {view}: torch.load fails", embedded_step=step)
        if step is None:  # 'step': torch.tensor(1200) -- read the 8 bytes, still without unpickling
            tensor = find_value(scan.root, STEP_KEYS, is_tensor, depth=0)
            step = plain_int(read_tensor_int(fd, base, index, tensor)) if tensor is not None else None
        summary = f"{len(index.entries)} entries, {len({ref.key for ref in scan.storages})} tensor storages"
        if not deep:
            crc_note = "" if index.crc_present else "; no CRC32 recorded"
            return valid(fmt, 3, f"structure intact ({summary}){crc_note}",
                         embedded_step=step, epoch=epoch, facts=facts)
        try:
            crc = cached_crc_check(fd, base, index, cache_key) if cache_key else crc_check(fd, base, index)
        except ScanLimitError as exc:
            return unverifiable(fmt, 4, f"structure intact ({summary}); CRC not checked: {exc.reason}",
                                embedded_step=step, epoch=epoch, facts=facts)
        if not crc.verifiable:
            return unverifiable(fmt, 4, f"structure intact ({summary}); {crc.reason}",
                                embedded_step=step, epoch=epoch, facts=facts)
        if not crc.ok:
            return corrupt(fmt, 4, crc.reason, embedded_step=step, epoch=epoch, facts=facts)
        return valid(fmt, 4, f"{summary}; {crc.reason}", embedded_step=step, epoch=epoch, facts=facts)
    except ZipCheckError as exc:
        return corrupt(fmt, exc.level, exc.reason)
    except ScanLimitError as exc:
        return over_limit(fmt, 3, exc)


def _check_alignment(fd: int, base: int, index: ZipIndex) -> None:
    """Torch aligns every ``data/`` record to ``.storage_alignment`` (64) so it can be mmapped."""
    entry = index.get(".storage_alignment")
    if entry is None:
        return
    if entry.size > 16:
        raise ZipCheckError(2, f".storage_alignment record of {entry.size:,} bytes (torch writes a number)")
    text = read_entry(fd, base, entry).strip()
    if not re.fullmatch(rb"[0-9]{1,6}", text):
        raise ZipCheckError(2, "unreadable .storage_alignment record")
    alignment = int(text)
    if alignment <= 0:
        return
    data_prefix = f"{index.prefix}/data/".encode("utf-8", "surrogateescape").lower()
    for record in index.entries:
        if (record.raw_name or record.name.encode()).lower().startswith(data_prefix) and record.data_offset % alignment:
            raise ZipCheckError(2, f"{record.name!r} is not {alignment}-byte aligned")


def _check_byteorder(fd: int, base: int, index: ZipIndex) -> None:
    """torch.load refuses a ``byteorder`` record other than ``little`` or ``big``."""
    entry = index.get("byteorder")
    if entry is None:
        return
    if entry.size > 16 or read_entry(fd, base, entry) not in (b"little", b"big"):
        raise ZipCheckError(2, "byteorder record is neither 'little' nor 'big': torch refuses the file")


def _check_serialization_id(fd: int, base: int, index: ZipIndex) -> None:
    """torch.load decodes ``.data/serialization_id`` as UTF-8 after unpickling (and fails)."""
    entry = index.get(".data/serialization_id")
    if entry is None:
        return
    if entry.size > 256:
        raise ZipCheckError(2, f".data/serialization_id record of {entry.size:,} bytes (torch writes 40)")
    try:
        read_entry(fd, base, entry).decode("utf-8")
    except UnicodeDecodeError:
        raise ZipCheckError(2, ".data/serialization_id is not UTF-8: torch.load fails on it") from None



def _scan_data_pkl(fd: int, base: int, index: ZipIndex, pkl: Any) -> PickleScan | Outcome:
    """The one pickle torch.load unpickles: CRC, scan read window by window, nothing after its
    STOP."""
    if index.crc_present and entry_crc(fd, base, pkl) != pkl.crc:
        return corrupt(TORCH_ZIP, 3, "data.pkl CRC32 mismatch: the pickle is damaged")
    reader, total = entry_reader(fd, base, pkl)
    data = None
    try:
        scan = scan_pickle(data, reader=reader, total=total)
    except PickleScanError as exc:
        return corrupt(TORCH_ZIP, 3, f"data.pkl: {exc}")
    if scan.end != total:
        extra = total - scan.end
        try:  # a second pickle hidden after the first: name what it would call
            unsafe = unsafe_reason(scan_stream(data, start=scan.end, reader=reader, total=total), allowed_for())
        except (PickleScanError, ScanLimitError):
            unsafe = None
        what = f"; the trailing pickle: {unsafe}" if unsafe else ""
        return corrupt(TORCH_ZIP, 3, f"data.pkl: {extra} bytes after the pickle (torch writes exactly one){what}",
                       load_safe=False)
    return scan


def _storage_problem(index: ZipIndex, scan: PickleScan) -> str | None:
    """Every tensor storage the pickle names must have its ``data/<key>`` record, big enough."""
    for ref in scan.storages:
        entry = index.get(f"data/{ref.key}")
        if entry is None:
            return f"tensor storage data/{ref.key[:40]} named in data.pkl is missing"
        need = ref.nbytes
        if need is not None and entry.size < need:
            return f"data/{ref.key} holds {entry.size} bytes, its tensor needs {need}"
    return None



def read_tensor_int(fd: int, base: int, index: ZipIndex, value: Any) -> int | None:
    """The integer inside a one-element integer tensor (``'step': torch.tensor(5)``), read
    from its storage record without unpickling."""
    if not is_tensor(value) or not isinstance(value, Call) or not value.args:
        return None
    ref = value.args[0]
    if not isinstance(ref, PersistentRef) or not isinstance(ref.pid, tuple) or len(ref.pid) < 5:
        return None
    storage_type = getattr(ref.pid[1], "name", "")
    sizes = {"LongStorage": 8, "IntStorage": 4, "ShortStorage": 2, "CharStorage": 1, "ByteStorage": 1}
    itemsize = sizes.get(storage_type)
    offset = value.args[1] if len(value.args) > 1 and isinstance(value.args[1], int) else 0
    entry = index.get(f"data/{ref.pid[2]}")
    if itemsize is None or entry is None or entry.size < (offset + 1) * itemsize:
        return None
    raw = pread_exact(fd, itemsize, base + entry.data_offset + offset * itemsize)
    return int.from_bytes(raw, "little", signed=storage_type != "ByteStorage")
