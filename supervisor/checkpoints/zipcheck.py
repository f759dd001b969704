"""Zip framing checks for torch.save files (and the zip items inside DCP shards), stdlib only.

- L1 :func:`read_trailer`: the first 4 bytes and the last 98 (torch always writes ZIP64 and no
  comment, so the end of the file is fixed). Catches every truncation, zero-filled tail and
  appended garbage in two ``pread`` calls, whatever the file size.
- L2 :func:`read_index`: the central directory plus one probe per local header.
- L4 :func:`crc_check`: CRC32 of every entry against the central directory. torch.load never
  checks it (miniz is built with CRC checks disabled), so this is the only way to find a hole or
  a flipped bit inside tensor data. All-zero CRCs (``compute_crc32=False``) mean *unverifiable*.

Everything works on an open file descriptor and a ``base`` offset so that a torch zip embedded
in a larger file (a DCP ``.distcp`` item) is checked the same way.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import struct
import threading
import zlib
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .limits import MAX_PICKLE_BYTES, ScanLimitError

LOCAL_SIG = b"PK\x03\x04"
CENTRAL_SIG = b"PK\x01\x02"
EOCD_SIG = b"PK\x05\x06"
ZIP64_EOCD_SIG = b"PK\x06\x06"
ZIP64_LOCATOR_SIG = b"PK\x06\x07"
TORCH_TRAILER = 98  # ZIP64 EOCD (56) + ZIP64 locator (20) + EOCD (22)
_MAX_COMMENT = 0xFFFF
_CHUNK = 8 << 20


class ZipCheckError(Exception):
    """A check failed at ``level`` (1..4) for ``reason``: the archive is damaged."""

    def __init__(self, level: int, reason: str) -> None:
        super().__init__(reason)
        self.level, self.reason = level, reason


@dataclass(frozen=True)
class Trailer:
    cd_offset: int  # relative to base
    cd_size: int
    entries: int
    torch_layout: bool  # the exact 98-byte ZIP64 trailer torch writes


@dataclass(frozen=True)
class ZipEntry:
    name: str
    header_offset: int
    data_offset: int
    comp_size: int
    size: int
    crc: int
    method: int
    raw_name: bytes = b""  # the name's bytes as stored: what torch's reader compares


@dataclass(frozen=True)
class ZipIndex:
    entries: tuple[ZipEntry, ...]
    prefix: str  # torch's archive prefix ("archive", or the file's stem at save time)
    crc_present: bool  # False when every non-empty entry has CRC 0 (compute_crc32=False)
    cd_offset: int

    def get(self, relname: str) -> ZipEntry | None:
        """The entry torch's reader opens for ``<prefix>/<relname>``: names are compared as bytes
        with ASCII letters folded to lower case (miniz's lookup). :func:`read_index` refused any
        archive where two names fold to the same key, so there is at most one."""
        key = (self.prefix + "/" + relname).encode("utf-8", "surrogateescape").lower()
        return self._by_name().get(key)

    def _by_name(self) -> dict[bytes, ZipEntry]:
        cached = self.__dict__.get("_names")
        if cached is None:
            cached = {(e.raw_name or e.name.encode()).lower(): e for e in self.entries}
            object.__setattr__(self, "_names", cached)
        return cached


def pread_exact(fd: int, length: int, offset: int) -> bytes:
    """Read exactly ``length`` bytes or fewer only at end of file."""
    data = os.pread(fd, length, offset)
    if len(data) == length or not data:
        return data
    parts = [data]
    got = len(data)
    while got < length:
        more = os.pread(fd, length - got, offset + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def read_trailer(fd: int, base: int, length: int, *, check_head: bool = True) -> Trailer:
    """L1: find and cross-check the end-of-central-directory records. Raises ZipCheckError(1).
    ``check_head=False`` skips the read of the first bytes (one I/O instead of two)."""
    if length < 22 + 30:
        raise ZipCheckError(1, f"too small for a zip archive ({length} bytes)")
    head = pread_exact(fd, 8, base) if check_head else LOCAL_SIG
    if head[:4] != LOCAL_SIG:
        if head == b"\0" * len(head):
            raise ZipCheckError(1, "zero-filled start (size kept, data never written)")
        raise ZipCheckError(1, "does not start with a zip local header")
    tail_len = min(length, TORCH_TRAILER)
    tail = pread_exact(fd, tail_len, base + length - tail_len)
    if len(tail) != tail_len:
        raise ZipCheckError(1, "file shorter than its recorded size (changed while reading?)")
    if (tail_len == TORCH_TRAILER and tail[76:80] == EOCD_SIG and tail[56:60] == ZIP64_LOCATOR_SIG
            and tail[0:4] == ZIP64_EOCD_SIG and struct.unpack_from("<H", tail, 96)[0] == 0):
        z64_offset = struct.unpack_from("<Q", tail, 64)[0]
        entries, cd_size, cd_offset = struct.unpack_from("<QQQ", tail, 32)
        end = length - TORCH_TRAILER
        if z64_offset != end or cd_offset + cd_size != end:
            raise ZipCheckError(1, "central directory bounds do not match the ZIP64 trailer")
        _same_counts(tail[76:], entries, cd_size, cd_offset)
        _one_disk_zip64(tail[:56], tail[56:76])
        return Trailer(cd_offset, cd_size, entries, torch_layout=True)
    return _generic_trailer(fd, base, length, tail)


def _same_counts(eocd: bytes, entries: int, cd_size: int, cd_offset: int) -> None:
    """miniz (torch's reader) takes each count from the classic end record unless it holds the
    ZIP64 sentinel; other readers take the ZIP64 record. Both must agree, and say one disk."""
    disk, cd_disk, here, total, size32, offset32 = struct.unpack_from("<HHHHII", eocd, 4)
    for classic, sentinel, real in ((here, 0xFFFF, entries), (total, 0xFFFF, entries),
                                    (size32, 0xFFFFFFFF, cd_size), (offset32, 0xFFFFFFFF, cd_offset)):
        if classic != sentinel and classic != real:
            raise ZipCheckError(1, "the end-of-central-directory record and the ZIP64 record disagree")
    if disk != 0 or cd_disk != 0:
        raise ZipCheckError(1, "a split (multi-disk) zip archive: torch cannot read it")


def _one_disk_zip64(z64: bytes, locator: bytes) -> None:
    """The ZIP64 records of a single-file archive, as miniz requires them: the record's own size
    field right, disk 0 of 1, every entry on it."""
    record_size = struct.unpack_from("<Q", z64, 4)[0]
    if record_size != 56 - 12:  # what miniz, zipfile and torch.save write; miniz refuses less
        raise ZipCheckError(1, f"the ZIP64 end-of-central-directory record gives its size as {record_size}, not 44")
    disk, cd_disk, here, total = struct.unpack_from("<IIQQ", z64, 16)
    locator_disk, disks = struct.unpack_from("<I8xI", locator, 4)
    if disk or cd_disk or locator_disk or disks != 1 or here != total:
        raise ZipCheckError(1, "a split (multi-disk) zip archive: torch cannot read it")


def _generic_trailer(fd: int, base: int, length: int, tail: bytes) -> Trailer:
    """Foreign zips and old torch writers: a classic EOCD, maybe a comment, maybe ZIP64."""
    if tail[-22:-18] == EOCD_SIG and struct.unpack_from("<H", tail, len(tail) - 2)[0] == 0:
        eocd_pos, eocd = length - 22, tail[-22:]
    else:
        scan_len = min(length, 22 + _MAX_COMMENT)
        window = pread_exact(fd, scan_len, base + length - scan_len)
        pos = window.rfind(EOCD_SIG)
        while pos >= 0:
            if pos + 22 <= len(window):
                comment_len = struct.unpack_from("<H", window, pos + 20)[0]
                if pos + 22 + comment_len == len(window):
                    break
            pos = window.rfind(EOCD_SIG, 0, pos)
        if pos < 0:
            if tail[-22:].count(0) == len(tail[-22:]):
                raise ZipCheckError(1, "zero-filled tail: the end of the archive was never written")
            last = window.rfind(EOCD_SIG)
            if last >= 0 and last + 22 < len(window):
                extra = len(window) - last - 22
                raise ZipCheckError(1, f"{extra} bytes after the end of the zip archive (appended data?)")
            raise ZipCheckError(1, "no end-of-central-directory record: truncated (save cut short)")
        eocd_pos = length - scan_len + pos
        eocd = window[pos : pos + 22]
        # miniz takes the last signature with 22 bytes after it, whatever the comment length says
        if window.rfind(EOCD_SIG, 0, len(window) - 22 + 4) != pos:
            raise ZipCheckError(1, "two end-of-central-directory records: readers disagree on which one counts")
    _, _, _, entries, cd_size, cd_offset, _ = struct.unpack_from("<HHHHIIH", eocd, 4)
    cd_end = eocd_pos
    locator = pread_exact(fd, 20, base + eocd_pos - 20) if eocd_pos >= 20 + 56 else b""
    sentinel = entries == 0xFFFF or cd_size == 0xFFFFFFFF or cd_offset == 0xFFFFFFFF
    if sentinel or locator[:4] == ZIP64_LOCATOR_SIG:  # miniz reads ZIP64 records whenever a locator is there
        if locator[:4] != ZIP64_LOCATOR_SIG:
            raise ZipCheckError(1, "ZIP64 locator missing")
        z64_offset = struct.unpack_from("<Q", locator, 8)[0]
        z64 = pread_exact(fd, 56, base + z64_offset)
        if z64[:4] != ZIP64_EOCD_SIG or z64_offset + 56 > eocd_pos - 20:
            raise ZipCheckError(1, "ZIP64 end-of-central-directory record missing or misplaced")
        entries, cd_size, cd_offset = struct.unpack_from("<QQQ", z64, 32)
        _same_counts(eocd, entries, cd_size, cd_offset)
        _one_disk_zip64(z64, locator)
        cd_end = z64_offset
    else:
        _same_counts(eocd, entries, cd_size, cd_offset)
    if cd_offset + cd_size != cd_end:
        raise ZipCheckError(1, "central directory bounds do not match the end-of-central-directory record")
    return Trailer(cd_offset, cd_size, entries, torch_layout=False)


def read_index(fd: int, base: int, length: int, trailer: Trailer) -> ZipIndex:
    """L2: parse the central directory and probe every local header. Raises ZipCheckError(2).

    The archive must read the same whichever way a reader walks it (docs/checkpoint-validation.md,
    "One reading"): no two names equal with ASCII case folded (torch's miniz lookup folds case, so
    ``data.pkl`` and ``DATA.PKL`` would be one name with two contents), each local header repeats
    its central directory entry (name, method, sizes, CRC unless a data descriptor follows), and no
    two entries share bytes."""
    cd = pread_exact(fd, trailer.cd_size, base + trailer.cd_offset)
    if len(cd) != trailer.cd_size:
        raise ZipCheckError(2, "central directory runs past the end of the file")
    raw = _parse_central_directory(cd, trailer.entries)
    if not raw:
        raise ZipCheckError(2, "empty zip archive")
    seen: dict[bytes, str] = {}
    for item in raw:
        folded = item[1].lower()
        if folded in seen:
            same = "twice" if seen[folded] == item[0] else f"twice ({seen[folded]!r} and {item[0]!r})"
            raise ZipCheckError(2, f"entry name {item[0]!r} appears {same} in letter case folded: "
                                   "readers disagree on which one is meant (no writer produces this)")
        seen[folded] = item[0]
    entries = [_probe_local_header(fd, base, trailer.cd_offset, *item) for item in raw]
    ordered = sorted(entries, key=lambda e: e.header_offset)
    for before, after in itertools.pairwise(ordered):
        if before.data_offset + before.comp_size > after.header_offset:
            raise ZipCheckError(2, f"entries {before.name!r} and {after.name!r} overlap")
    prefix = entries[0].raw_name.split(b"/", 1)[0].decode("utf-8", "surrogateescape")
    crc_present = any(e.crc != 0 for e in entries if e.size > 0)
    return ZipIndex(tuple(entries), prefix, crc_present, trailer.cd_offset)


# General purpose flags torch's zip reader refuses an entry for: encrypted, compressed patched data
# (bit 5: "unsupported feature"), strong encryption, masked directory. torch.save sets none of them.
_UNSUPPORTED_FLAGS = 0x0001 | 0x0020 | 0x0040 | 0x2000


def _parse_central_directory(cd: bytes, expected: int) -> list[tuple]:
    out: list[tuple] = []
    pos = 0
    view = memoryview(cd)
    while pos < len(cd):
        if cd[pos : pos + 4] != CENTRAL_SIG or pos + 46 > len(cd):
            raise ZipCheckError(2, f"central directory damaged at entry {len(out)}")
        (flags, method, crc, csize, usize, nlen, elen, clen, disk, offset) = struct.unpack_from(
            "<2xHH4xIIIHHHH6xI", cd, pos + 6
        )
        name_raw = bytes(view[pos + 46 : pos + 46 + nlen])
        extra = bytes(view[pos + 46 + nlen : pos + 46 + nlen + elen])
        if pos + 46 + nlen + elen + clen > len(cd):
            raise ZipCheckError(2, f"central directory entry {len(out)} runs past its end")
        if 0xFFFFFFFF in (csize, usize, offset):
            usize, csize, offset = _zip64_extra(extra, usize, csize, offset)
        name = name_raw.decode("utf-8" if flags & 0x800 else "cp437", errors="replace")
        if flags & _UNSUPPORTED_FLAGS:
            raise ZipCheckError(2, f"entry {name!r} is encrypted or patched data (flags 0x{flags:04x}): "
                                   "torch cannot read it")
        if disk not in (0, 0xFFFF):
            raise ZipCheckError(2, f"entry {name!r} is on disk {disk} of a split archive")
        out.append((name, name_raw, offset, csize, usize, crc, method, flags))
        pos += 46 + nlen + elen + clen
    if len(out) != expected:
        raise ZipCheckError(2, f"central directory lists {len(out)} entries, trailer says {expected}")
    return out


def _zip64_extra(extra: bytes, usize: int, csize: int, offset: int) -> tuple[int, int, int]:
    pos = 0
    while pos + 4 <= len(extra):
        tag, size = struct.unpack_from("<HH", extra, pos)
        if tag == 0x0001:
            if pos + 4 + size > len(extra):
                break
            values = list(struct.unpack_from(f"<{size // 8}Q", extra, pos + 4))
            if usize == 0xFFFFFFFF and values:
                usize = values.pop(0)
            if csize == 0xFFFFFFFF and values:
                csize = values.pop(0)
            if offset == 0xFFFFFFFF and values:
                offset = values.pop(0)
            if 0xFFFFFFFF in (usize, csize, offset):
                break
            return usize, csize, offset
        pos += 4 + size
    raise ZipCheckError(2, "ZIP64 sizes missing from a central directory entry")


def _probe_local_header(
    fd: int, base: int, cd_offset: int, name: str, name_raw: bytes, offset: int, csize: int,
    usize: int, crc: int, method: int, flags: int,
) -> ZipEntry:
    """The local header must say what the central directory says: torch's reader takes the
    sizes, method and CRC from the central directory and only the name and extra lengths from
    here; Python's zipfile and other tools read more of it. Any disagreement is a forgery or
    damage, never a writer's output."""
    if offset + 30 > cd_offset:
        raise ZipCheckError(2, f"entry {name!r} starts beyond the central directory")
    header = pread_exact(fd, 30 + len(name_raw), base + offset)
    if header[:4] != LOCAL_SIG:
        hint = " (zero-filled)" if header.count(0) == len(header) else ""
        raise ZipCheckError(2, f"local header of {name!r} missing{hint}")
    (l_flags, l_method, l_crc, l_csize, l_usize, nlen, elen) = struct.unpack_from("<2xHH4xIIIHH", header, 4)
    if header[30 : 30 + nlen] != name_raw or nlen != len(name_raw):
        raise ZipCheckError(2, f"local header of {name!r} names another entry")
    if l_method != method:
        raise ZipCheckError(2, f"local header of {name!r} gives compression method {l_method}, "
                               f"the central directory {method}")
    if (l_flags ^ flags) & (0x0008 | _UNSUPPORTED_FLAGS):
        raise ZipCheckError(2, f"local header of {name!r} has flags 0x{l_flags:04x}, "
                               f"the central directory 0x{flags:04x}")
    descriptor = bool(flags & 0x0008)
    for what, local, central in (("CRC32", l_crc, crc), ("compressed size", l_csize, csize),
                                 ("size", l_usize, usize)):
        if local == central or (descriptor and local == 0):
            continue
        if what != "CRC32" and local == 0xFFFFFFFF and central >= 0xFFFFFFFF:
            continue  # ZIP64: the real value is in the local extra field
        raise ZipCheckError(2, f"local header of {name!r} gives {what} {local}, the central directory {central}")
    data_offset = offset + 30 + nlen + elen
    if data_offset + csize > cd_offset:
        raise ZipCheckError(2, f"data of {name!r} runs into the central directory")
    if method not in (0, 8):
        raise ZipCheckError(2, f"entry {name!r} uses unsupported compression method {method}")
    if method == 0 and csize != usize:
        raise ZipCheckError(2, f"stored entry {name!r} has two different sizes")
    return ZipEntry(name, offset, data_offset, csize, usize, crc, method, name_raw)


def torch_archive_problem(index: ZipIndex) -> str | None:
    """What in an intact zip makes ``torch.load`` read it otherwise than a ``torch.save`` file,
    or fail: an entry outside the archive folder (torch lists records by stripping the folder of
    the first entry, and refuses others), a pickle besides ``data.pkl`` (``constants.pkl`` sends
    the file to ``torch.jit.load``; any other is a second program no writer puts there), no
    ``version`` record (torch refuses the archive). None when it reads as a torch.save file."""
    folder = index.prefix.encode("utf-8", "surrogateescape") + b"/"
    main = folder.lower() + b"data.pkl"
    for entry in index.entries:
        raw = entry.raw_name or entry.name.encode()
        if not raw.startswith(folder) or raw == folder:
            return (f"entry {entry.name!r} is outside the archive folder {index.prefix!r}: "
                    "torch refuses the archive")
        folded = raw.lower()
        if folded.endswith(b"/constants.pkl"):
            return (f"entry {entry.name!r}: a TorchScript archive, which torch.load hands to torch.jit.load "
                    "(code runs); torch.save never writes it")
        if folded.endswith(b".pkl") and folded != main:
            return f"a second pickle {entry.name!r} besides data.pkl: torch.save writes exactly one"
    if index.get(".data/version") is None and index.get("version") is None:
        return "no version record: torch refuses the archive"
    return None


def read_entry(fd: int, base: int, entry: ZipEntry, limit: int = MAX_PICKLE_BYTES) -> bytes:
    """The uncompressed bytes of one (small) entry, e.g. ``data.pkl``. Never more than ``limit``
    bytes are read or inflated, whatever the size fields say: ScanLimitError beyond that."""
    if entry.size > limit:
        raise ScanLimitError(f"too large to scan: {entry.name!r} is {entry.size:,} bytes (limit {limit:,})")
    if entry.method == 0:
        if entry.comp_size != entry.size:
            raise ZipCheckError(2, f"stored entry {entry.name!r} has two different sizes")
        data = pread_exact(fd, entry.comp_size, base + entry.data_offset)
        if len(data) != entry.comp_size:
            raise ZipCheckError(3, f"entry {entry.name!r} is cut short")
        return data
    return b"".join(inflated_chunks(fd, base, entry, limit))


def inflated_chunks(fd: int, base: int, entry: ZipEntry, limit: int = MAX_PICKLE_BYTES) -> Iterator[bytes]:
    """A deflated entry's bytes, at most 1 MiB at a time, never past ``limit`` (ScanLimitError),
    and exactly its size field's worth (ZipCheckError(3) otherwise, after the last chunk)."""
    if entry.size > limit:
        raise ScanLimitError(f"too large to scan: {entry.name!r} is {entry.size:,} bytes (limit {limit:,})")
    inflater = zlib.decompressobj(-15)
    got = 0
    offset, remaining = base + entry.data_offset, entry.comp_size
    try:
        while remaining > 0 or inflater.unconsumed_tail:
            if inflater.unconsumed_tail:
                chunk = inflater.unconsumed_tail
            else:
                chunk = pread_exact(fd, min(remaining, 1 << 20), offset)
                if not chunk:
                    raise ZipCheckError(3, f"entry {entry.name!r} is cut short")
                offset += len(chunk)
                remaining -= len(chunk)
            out = inflater.decompress(chunk, min(1 << 20, limit + 1 - got))
            got += len(out)
            if got > limit:
                raise ScanLimitError(f"too large to scan: {entry.name!r} inflates past {limit:,} bytes "
                                     f"(its size field says {entry.size:,})")
            if out:
                yield out
            if inflater.eof:
                break
    except zlib.error as exc:
        raise ZipCheckError(3, f"entry {entry.name!r} does not decompress: {exc}") from None
    if not inflater.eof:
        raise ZipCheckError(3, f"entry {entry.name!r}: compressed data ends early")
    if got != entry.size:
        raise ZipCheckError(3, f"entry {entry.name!r} inflates to {got:,} bytes, its size field says {entry.size:,}")


class _InflatingReader:
    """``reader(offset, length)`` over a deflated entry for a windowed scan: offsets only grow
    (a skipped stretch is inflated and dropped), so memory stays one window."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks, self.pending, self.at = chunks, b"", 0

    def __call__(self, offset: int, length: int) -> bytes:
        if offset < self.at:
            raise ValueError("a windowed scan read backwards")
        out: list[bytes] = []
        need = length
        while need > 0 or offset > self.at:
            if not self.pending:
                self.pending = next(self.chunks, b"")
                if not self.pending:
                    break
            if offset > self.at:  # skip
                drop = min(offset - self.at, len(self.pending))
                self.pending, self.at = self.pending[drop:], self.at + drop
                continue
            take = self.pending[:need]
            self.pending, self.at, need = self.pending[len(take):], self.at + len(take), need - len(take)
            out.append(take)
        return b"".join(out)


@dataclass(frozen=True)
class CrcResult:
    ok: bool  # True: every CRC matched. False: see reason
    verifiable: bool  # False: the writer recorded no CRCs, so nothing could be checked
    reason: str
    bytes_checked: int


def crc_check(fd: int, base: int, index: ZipIndex) -> CrcResult:
    """L4: CRC32 of every entry against the central directory (reads every byte)."""
    if not index.crc_present:
        return CrcResult(True, False, "no CRC32 recorded (saved with compute_crc32=False): content unverifiable", 0)
    with contextlib.suppress(OSError, AttributeError):  # advice only; not on every OS
        os.posix_fadvise(fd, base, 0, os.POSIX_FADV_SEQUENTIAL)
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    checked = 0
    for entry in index.entries:
        crc = _entry_crc(fd, base, entry, view)
        checked += entry.comp_size
        if crc != entry.crc:
            return CrcResult(False, True, f"CRC32 mismatch in {entry.name!r}: content damaged", checked)
    return CrcResult(True, True, f"CRC32 of all {len(index.entries)} entries match", checked)


def entry_crc(fd: int, base: int, entry: ZipEntry) -> int:
    """CRC32 of one entry's uncompressed bytes, read (and inflated) 1 MiB at a time."""
    if entry.method == 8:
        crc = 0
        for chunk in inflated_chunks(fd, base, entry):
            crc = zlib.crc32(chunk, crc)
        return crc
    return _entry_crc(fd, base, entry, memoryview(bytearray(1 << 20)))


def entry_reader(fd: int, base: int, entry: ZipEntry,
                 limit: int = MAX_PICKLE_BYTES) -> tuple[Any, int]:
    """What a pickle scan reads an entry through: ``(reader, total)``, windows preaded from a
    stored entry (torch never compresses) or inflated in order from a deflated one, so the entry
    never sits in memory whole."""
    if entry.method != 0:
        return _InflatingReader(inflated_chunks(fd, base, entry, limit)), entry.size
    if entry.size > limit:
        raise ScanLimitError(f"too large to scan: {entry.name!r} is {entry.size:,} bytes (limit {limit:,})")
    start = base + entry.data_offset

    def reader(offset: int, length: int) -> bytes:
        return pread_exact(fd, length, start + offset)

    return reader, entry.size


def _entry_crc(fd: int, base: int, entry: ZipEntry, view: memoryview) -> int:
    if entry.method == 8:
        return _inflated_crc(fd, base, entry)
    crc = 0
    remaining = entry.comp_size
    offset = base + entry.data_offset
    while remaining > 0:
        want = min(remaining, len(view))
        got = os.preadv(fd, [view[:want]], offset)
        if got <= 0:
            raise ZipCheckError(4, f"entry {entry.name!r} is cut short")
        crc = zlib.crc32(view[:got], crc)
        offset += got
        remaining -= got
    return crc


def _inflated_crc(fd: int, base: int, entry: ZipEntry) -> int:
    """CRC of a deflated entry (torch never compresses; a re-zipped file might). Bounded: output
    is inflated in chunks and never past the recorded size, so a bomb costs its recorded size."""
    if entry.size > MAX_PICKLE_BYTES:
        raise ScanLimitError(f"too large to scan: compressed entry {entry.name!r} of {entry.size:,} bytes "
                             "(torch never compresses)")
    return entry_crc(fd, base, entry)


# L4 results are cached per file identity so the same checkpoint is CRC-read at most once.
# The key includes ctime_ns: Lustre inode numbers can change on migration, mtime can be reset.
_CRC_CACHE: OrderedDict[tuple, CrcResult] = OrderedDict()
_CRC_CACHE_MAX = 4096
_CRC_LOCK = threading.Lock()


def crc_cache_key(path: str, st: os.stat_result, base: int = 0) -> tuple:
    return (os.path.realpath(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns, base)


def cached_crc_check(fd: int, base: int, index: ZipIndex, key: tuple) -> CrcResult:
    """:func:`crc_check`, remembered for the same (path, size, mtime_ns, ctime_ns)."""
    with _CRC_LOCK:
        hit = _CRC_CACHE.get(key)
        if hit is not None:
            _CRC_CACHE.move_to_end(key)
            return hit
    result = crc_check(fd, base, index)
    with _CRC_LOCK:
        _CRC_CACHE[key] = result
        while len(_CRC_CACHE) > _CRC_CACHE_MAX:
            _CRC_CACHE.popitem(last=False)
    return result


def clear_crc_cache() -> None:
    with _CRC_LOCK:
        _CRC_CACHE.clear()
