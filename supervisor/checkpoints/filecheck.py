"""The validation ladder for single-file checkpoints: torch zip, torch legacy, safetensors and
plain pickles. Reads a few hundred bytes plus the (small) pickle up to L3; L4 reads everything.
Never unpickles for real: pickles are walked by :mod:`.picklescan`. Which globals they name is a
trust note (:mod:`.trust`), not an integrity verdict, except for a known code-execution primitive
(``os.system``...), which no ``torch.save`` writes: such a file is CORRUPT ("hostile pickle").
"""

from __future__ import annotations

import os
import re
import struct
import tarfile
from typing import Any, Literal

from ..states import Verdict
from . import formats as F
from . import trust as T
from .allowlist import allowed_for
from .fsio import regular_fd
from .limits import MAX_PICKLE_BYTES, MAX_PICKLE_OPS, MAX_STEP, ScanLimitError
from .outcome import Outcome, corrupt, unverifiable, valid
from .stheader import MAX_HEADER as MAX_SAFETENSORS_HEADER
from .stheader import check_header
from .picklescan import (
    STEP_KEYS,
    Call,
    PersistentRef,
    PickleScan,
    PickleScanError,
    TruncatedPickle,
    as_mapping,
    describe,
    find_epoch,
    find_step,
    find_value,
    is_tensor,
    iter_calls,
    plain_int,
    scan_pickle,
    unknown_layout,
)
from .zipcheck import (
    ZipCheckError,
    ZipIndex,
    cached_crc_check,
    crc_cache_key,
    crc_check,
    entry_crc,
    entry_reader,
    pread_exact,
    read_entry,
    read_index,
    read_trailer,
    torch_archive_problem,
)

# Scalars copied out of a checkpoint's top-level mapping (DeepSpeed world sizes, steps, versions).
_FACT_TYPES = (int, str, float, bool)
_MAX_FACT_TEXT = 256


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
        if max_level < 2 and not deep and torch_tail_ok(fd, size):
            # quick look (candidates older than the resume point): one read at the end of the file
            return valid(F.TORCH_ZIP, 1, "zip trailer intact (end of file only)")
        head = pread_exact(fd, F.HEAD_BYTES, 0)
        fmt = F.sniff_bytes(head, name)
        if fmt == F.EMPTY:
            return corrupt(F.EMPTY, 0, "empty file (0 bytes): the save never wrote data")
        if fmt == F.TORCH_ZIP:
            return check_torch_zip(fd, size, deep=deep, max_level=max_level, allowed=allowed,
                                   cache_key=crc_cache_key(path, st) if deep else None)
        if fmt != F.TORCH_ZIP and not name.endswith(".safetensors") and (tar := tar_header_reason(fd, size)):
            # torch.load reads any file that does not start with a zip header as a tar archive
            # first, and only then as pickles: a file both can read (a legacy or pickle header
            # too) is forged; a plain tar is torch's oldest format, whose members are not scanned.
            if fmt in (F.TORCH_LEGACY, F.PICKLE):
                return corrupt(fmt, 1, tar, load_safe=False)
            return unverifiable(F.UNKNOWN, 1, "a tar archive (torch's oldest checkpoint format): torch.load "
                                              "would unpickle its members, which are not scanned", load_safe=False)
        if fmt == F.TORCH_LEGACY:
            return check_torch_legacy(fd, size, max_level=max_level, allowed=allowed)
        if fmt == F.SAFETENSORS:
            return check_safetensors(fd, size, max_level=max_level)
        if fmt == F.PICKLE:
            if max_level < 2:
                return valid(F.PICKLE, 1, "plain pickle (not scanned at this level)")
            return check_plain_pickle(fd, size, allowed=allowed)
        if fmt == F.ZEROED:
            return corrupt(F.ZEROED, 1, "zero-filled start (size kept, data never written)")
        if fmt == F.TEXT:
            return corrupt(F.TEXT, 1, _text_reason(head))
        if torch_tail_ok(fd, size):
            return corrupt(F.TORCH_ZIP, 1, "damaged start: the zip trailer is intact but the file does "
                                           f"not begin with a local header (first bytes {head[:8].hex()}); "
                                           "torch writes one at offset 0")
        return check_unknown(fd, size, head, allowed=allowed)


def tar_header_reason(fd: int, size: int) -> str | None:
    """A reason when the file's first 512 bytes are a valid tar header: ``torch.load`` would then
    take it for torch's oldest (tar) checkpoint format and unpickle its ``storages``/``tensors``/``pickle``
    members instead of the pickles the bytes hold at offset 0. All zeros is no header (the
    zero-filled checks report that)."""
    block = pread_exact(fd, tarfile.BLOCKSIZE, 0)
    if len(block) < tarfile.BLOCKSIZE or block.count(0) == len(block):
        return None
    try:
        tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
    except tarfile.HeaderError:
        return None
    except Exception:  # noqa: BLE001 -- tarfile raises it on to torch.load: not pickles either
        pass
    return ("ambiguous: also a valid tar archive, which torch.load reads (tar first) instead of the "
            "pickles at its start; no writer produces this")


def torch_tail_ok(fd: int, size: int) -> bool:
    try:
        read_trailer(fd, 0, size, check_head=False)
    except ZipCheckError:
        return False
    return True


def _text_reason(head: bytes) -> str:
    text = head.decode("utf-8", "replace")
    if text.startswith("version https://git-lfs"):
        return "a git-lfs pointer file, not the checkpoint itself"
    first = text.splitlines()[0][:40] if text.strip() else ""
    return f"a text file, not a checkpoint (starts {first!r})"


def unsafe_reason(scans: list[PickleScan], allowed: frozenset[tuple[str, str]]) -> str | None:
    """A reason when the pickles name a code-execution primitive (hostile: never a resume point).
    Their trust note (trusted, untrusted: names outside ``allowed``, hostile) is recorded for the
    validation in progress (:func:`.trust.record`); an untrusted file is not judged here."""
    note = T.judge_globals((g for scan in scans for g in scan.globals), allowed)
    T.record(note)
    if note.trust is not T.Trust.HOSTILE:
        return None
    return (f"hostile pickle: names {describe(note.names)} ({note.reason}); no torch.save writes "
            "that, so the file is forged or damaged")


def _limit(fmt: str, level: int, exc: ScanLimitError, **kw: Any) -> Outcome:
    """Over a scanner cap: not proven damaged, but never a resume point (unscanned = unknown)."""
    return unverifiable(fmt, level, exc.reason, load_safe=False, **kw)


# ---------------------------------------------------------------------------- torch zip


def check_torch_zip(
    fd: int, size: int, *, base: int = 0, deep: bool = False, max_level: int = 3,
    cache_key: tuple | None = None, allowed: frozenset[tuple[str, str]] | None = None,
) -> Outcome:
    """L1 trailer, L2 central directory, L3 inert data.pkl scan, L4 CRC (``deep``)."""
    fmt = F.TORCH_ZIP
    allowed = allowed_for() if allowed is None else allowed
    try:
        trailer = read_trailer(fd, base, size)
        if max_level < 2:
            return valid(fmt, 1, "zip trailer intact")
        index = read_index(fd, base, size, trailer)
        pkl = index.get("data.pkl")
        if pkl is None:
            return unverifiable(F.ZIP, 2, "a zip archive without data.pkl: not a torch.save file", load_safe=False)
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
        if located := _location_problem(scan):
            return (corrupt if located[0] else unverifiable)(fmt, 3, located[1], embedded_step=step)
        if view := _view_problem(scan):
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
        return _limit(fmt, 3, exc)


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


def _view_problem(scan: PickleScan) -> str | None:
    """A tensor whose view (offset, sizes, strides) reaches past its storage: torch.load fails."""
    numels = {ref.key: ref.numel for ref in scan.storages if ref.type_name != "UntypedStorage"}
    for name in ("_rebuild_tensor_v2", "_rebuild_tensor"):
        for call in iter_calls(scan.root, name):
            args = call.args if isinstance(call.args, tuple) else ()
            if len(args) < 4 or not isinstance(args[0], PersistentRef) or not isinstance(args[0].pid, tuple):
                continue
            pid, offset, sizes, strides = args[0].pid, args[1], args[2], args[3]
            numel = numels.get(str(pid[2])) if len(pid) > 2 and isinstance(pid[2], (str, int)) else None
            if (numel is None or type(offset) is not int or not isinstance(sizes, tuple)
                    or not isinstance(strides, tuple) or len(sizes) != len(strides)
                    or not all(type(v) is int for v in (*sizes, *strides))):
                continue
            if 0 in sizes:
                continue
            last = offset + sum((size - 1) * stride for size, stride in zip(sizes, strides, strict=True))
            if offset < 0 or last >= numel:
                return f"a tensor view reaches element {last} of storage {str(pid[2])[:40]}, which holds {numel}"
    return None


def _scan_data_pkl(fd: int, base: int, index: ZipIndex, pkl: Any) -> PickleScan | Outcome:
    """The one pickle torch.load unpickles: CRC, scan read window by window, nothing after its
    STOP."""
    if index.crc_present and entry_crc(fd, base, pkl) != pkl.crc:
        return corrupt(F.TORCH_ZIP, 3, "data.pkl CRC32 mismatch: the pickle is damaged")
    reader, total = entry_reader(fd, base, pkl)
    data = None
    try:
        scan = scan_pickle(data, reader=reader, total=total)
    except PickleScanError as exc:
        return corrupt(F.TORCH_ZIP, 3, f"data.pkl: {exc}")
    if scan.end != total:
        extra = total - scan.end
        try:  # a second pickle hidden after the first: name what it would call
            unsafe = unsafe_reason(_scan_stream(data, start=scan.end, reader=reader, total=total), allowed_for())
        except (PickleScanError, ScanLimitError):
            unsafe = None
        what = f"; the trailing pickle: {unsafe}" if unsafe else ""
        return corrupt(F.TORCH_ZIP, 3, f"data.pkl: {extra} bytes after the pickle (torch writes exactly one){what}",
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


# Device tags torch.load restores a storage to without a map_location ("cpu", "cuda:1", ...): torch's
# own and the common out-of-tree backends. Any other tag of the same shape may be a backend we do
# not know; one of another shape is damage.
_KNOWN_DEVICES = frozenset({"cpu", "meta", "cuda", "mps", "xpu", "hpu", "mtia", "xla", "npu", "privateuseone"})
_DEVICE_TAG = re.compile(r"([a-z][a-z0-9_]{0,31})(:[0-9]{1,6})?", re.ASCII)


def _location_problem(scan: PickleScan) -> tuple[bool, str] | None:
    """(damaged, reason) for the first storage whose device tag torch.load cannot restore."""
    for ref in scan.storages:
        match = _DEVICE_TAG.fullmatch(ref.location)
        if match is None:
            return True, f"tensor storage {ref.key[:40]} is tagged with device {ref.location[:40]!r}: damaged"
        if match.group(1) not in _KNOWN_DEVICES:
            return False, (f"tensor storage {ref.key[:40]} is tagged with device {ref.location[:40]!r}, "
                           "which torch does not know (a custom backend, or damage)")
    return None


def top_level_facts(root: Any) -> dict[str, Any]:
    """Plain scalars of the top-level mapping, plus the few nested ones validators need."""
    mapping = as_mapping(root) or {}
    facts: dict[str, Any] = {k: v for k, v in mapping.items() if isinstance(k, str) and len(k) <= _MAX_FACT_TEXT
                             and isinstance(v, _FACT_TYPES) and not (isinstance(v, str) and len(v) > _MAX_FACT_TEXT)}
    ds_config = as_mapping(mapping.get("ds_config"))
    zero = as_mapping(ds_config.get("zero_optimization")) if ds_config else None
    if zero and type(zero.get("stage")) is int:
        facts["zero_stage"] = zero["stage"]
    optim = as_mapping(mapping.get("optimizer_state_dict"))
    if optim:
        for key in ("zero_stage", "partition_count"):
            value = optim.get(key)
            if type(value) is int or (isinstance(value, list) and len(value) <= 4096
                                      and all(type(v) is int for v in value)):
                facts[key] = value
    return facts


# ---------------------------------------------------------------------------- torch legacy


def check_torch_legacy(fd: int, size: int, *, max_level: int = 3,
                       allowed: frozenset[tuple[str, str]] | None = None) -> Outcome:
    """Five pickles back to back (magic, protocol, sys_info, object, storage keys), then for each
    key an int64 element count and the raw bytes; EOF must land exactly after the last one.
    There is no checksum: a zero-filled payload cannot be detected."""
    fmt = F.TORCH_LEGACY
    allowed = allowed_for() if allowed is None else allowed
    try:
        scans = _legacy_pickles(fd, size)
    except PickleScanError as exc:
        return corrupt(fmt, 2, f"pickle header: {exc}")
    except ScanLimitError as exc:
        return _limit(fmt, 2, exc)
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
    if located := _location_problem(scans[3]):
        return (corrupt if located[0] else unverifiable)(fmt, 3, located[1], embedded_step=step)
    if view := _view_problem(scans[3]):
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
        return _scan_stream(None, count=5, reader=_file_reader(fd), total=total)
    except TruncatedPickle:
        if total < size:
            raise ScanLimitError(
                f"too large to scan: the legacy pickles run past {MAX_PICKLE_BYTES:,} bytes") from None
        raise


def _file_reader(fd: int, base: int = 0) -> Any:
    def reader(offset: int, length: int) -> bytes:
        return pread_exact(fd, length, base + offset)

    return reader


def _scan_stream(data: bytes | None, count: int | None = None, *, start: int = 0, reader: Any = None,
                 total: int | None = None) -> list[PickleScan]:
    """``count`` pickles back to back from ``start`` (None: until the end of the input), sharing
    one opcode budget; the input is ``data`` or, with ``reader``, a file read window by window."""
    end = len(data or b"") if reader is None else (total or 0)
    scans: list[PickleScan] = []
    pos = start
    ops_left = MAX_PICKLE_OPS
    while (len(scans) < count) if count is not None else (pos < end):
        scan = scan_pickle(data, pos, max_ops=ops_left, reader=reader, total=end)
        ops_left -= scan.ops
        pos += scan.end
        scans.append(scan)
    return scans


# ---------------------------------------------------------------------------- safetensors

def check_safetensors(fd: int, size: int, *, max_level: int = 3, base: int = 0) -> Outcome:
    """8-byte header length, JSON header, then the byte buffer, which must be covered exactly.
    The header is judged by :mod:`.stheader` as the safetensors library judges it. The format has
    no checksum. ``base``/``size``: a safetensors blob inside a larger file (DCP's SAFETENSORS
    serialization)."""
    fmt = F.SAFETENSORS
    if size < 8:
        return corrupt(fmt, 1, f"truncated: {size} bytes, shorter than the 8-byte header length")
    (header_len,) = struct.unpack("<Q", pread_exact(fd, 8, base))
    if header_len == 0 and size >= 8 and pread_exact(fd, 8, base + 8).count(0) == min(8, size - 8):
        return corrupt(fmt, 1, "zero-filled start (size kept, data never written)")
    if header_len > MAX_SAFETENSORS_HEADER:
        return corrupt(fmt, 1, f"header length {header_len} is implausible (damaged start)")
    if 8 + header_len > size:
        return corrupt(fmt, 1, f"truncated: header needs {8 + header_len} bytes, file has {size}")
    if max_level < 2:
        return valid(fmt, 1, "header length plausible")
    verdict = check_header(pread_exact(fd, header_len, base + 8), size - 8 - header_len)
    if not verdict.ok:
        return corrupt(fmt, 2 if "JSON" in verdict.reason else 3, verdict.reason)
    step = _int_from_meta(verdict.metadata, ("global_step", "step", "iteration"))
    if not verdict.torch_loadable:
        return unverifiable(fmt, 3, f"{verdict.reason}, but a dtype safetensors.torch cannot load",
                            embedded_step=step)
    return valid(fmt, 3, verdict.reason, embedded_step=step)


def _int_from_meta(meta: Any, keys: tuple[str, ...]) -> int | None:
    if not isinstance(meta, dict):
        return None
    for key in keys:
        value = meta.get(key)
        if isinstance(value, str) and _ASCII_STEP.fullmatch(value.strip()):
            return int(value.strip())
    return None


_ASCII_STEP = re.compile(rf"[0-9]{{1,{len(str(MAX_STEP))}}}", re.ASCII)


# ---------------------------------------------------------------------------- plain pickle


def check_plain_pickle(fd: int, size: int, *, allowed: frozenset[tuple[str, str]] | None = None,
                       fmt: str = F.PICKLE) -> Outcome:
    """One or more pickles (``pickle.dump``) that must end exactly at EOF; every one is scanned
    (a loader calling pickle.load repeatedly reads them all)."""
    allowed = allowed_for() if allowed is None else allowed
    if size > MAX_PICKLE_BYTES:
        return _limit(fmt, 1, ScanLimitError(f"too large to scan: a {size:,}-byte pickle (limit {MAX_PICKLE_BYTES:,})"))
    try:
        scans = _scan_stream(None, reader=_file_reader(fd), total=size)
    except PickleScanError as exc:
        return corrupt(fmt, 2, str(exc))
    except ScanLimitError as exc:
        return _limit(fmt, 2, exc)
    if unsafe := unsafe_reason(scans, allowed):
        return corrupt(fmt, 3, unsafe, load_safe=False)
    root = scans[0].root if scans else None
    more = f" ({len(scans)} pickles)" if len(scans) > 1 else ""
    return valid(fmt, 3, f"pickle stream complete{more} (inert scan; no checksum)",
                 embedded_step=find_step(root), epoch=find_epoch(root), facts=top_level_facts(root))


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
