"""torch.distributed.checkpoint (DCP) directories: ``.metadata`` (or ``__<rank>_*.metadata``) is the
commit marker, renamed into place last; it lists every item's (relative_path, offset, length) in
the ``*.distcp`` shard files. The step is an item named ``step``/``global_step``... (an int or a
one-element tensor saved as its own torch.save zip).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from ...states import Verdict
from ..allowlist import allowed_for
from ..fsio import read_regular, regular_fd
from ..limits import MAX_PICKLE_BYTES, ScanLimitError
from ..outcome import Outcome, corrupt, unverifiable, valid
from ..picklescan import (
    STEP_KEYS,
    Call,
    PickleScanError,
    as_mapping,
    is_tensor,
    plain_int,
    scan_pickle,
    unknown_layout,
)
from ..zipcheck import ZipCheckError, crc_cache_key, pread_exact, read_entry, read_index, read_trailer
from .base import DirContext, DirFormat
from .common import unsafe_reason
from .kinds import DCP
from .safetensors import FORMAT as SAFETENSORS_FORMAT
from .safetensors import check_safetensors
from .torch_zip import check_torch_zip, read_tensor_int


class Dcp(DirFormat):
    name = DCP
    step_where = "DCP metadata"
    commit_marker = ".metadata"
    nests = True  # FSDP's state dir inside an HF or Accelerate checkpoint

    def detect(self, path: Path, names: frozenset[str]) -> bool:
        if ".metadata" in names or ".metadata.tmp" in names or any(n.endswith(".distcp") for n in names):
            return True
        return any(n.endswith(".metadata") and n.startswith("__") for n in names)

    def validate(self, path: str, ctx: DirContext) -> Outcome:
        return check_dcp(path, deep=ctx.deep)

    def committed(self, names: frozenset[str]) -> bool:
        return ".metadata" in names or any(n.startswith("__") and n.endswith(".metadata") for n in names)

    def reads_itself(self, name: str) -> bool:
        return name.endswith(".distcp") or name.endswith(".metadata") or name == ".metadata.tmp"


FORMAT = Dcp()


def check_dcp(path: str, *, deep: bool = False) -> Outcome:
    """``.metadata`` (the commit marker, renamed into place last) lists every item's
    (relative_path, offset, length): each shard must exist and be long enough, and each zip item
    must be framed (``PK`` header at its start, end-of-archive at its end)."""
    fmt = DCP
    names = set(os.listdir(path))
    metadata = [".metadata"] if ".metadata" in names else sorted(
        n for n in names if n.startswith("__") and n.endswith(".metadata"))
    if ".metadata.tmp" in names:
        what = "an overwrite of this checkpoint" if metadata else "the save"
        return corrupt(fmt, 1, f".metadata.tmp left over: {what} did not finish")
    if not metadata:
        return corrupt(fmt, 1, "no .metadata: the save was never committed")
    items: list[tuple[str, int, int, str, bool]] = []
    understood = True
    for name in metadata:
        meta_path = os.path.join(path, name)
        try:
            data = read_regular(meta_path, MAX_PICKLE_BYTES)
        except ScanLimitError as exc:
            return unverifiable(fmt, 1, f"{name}: {exc.reason}", load_safe=False)
        if not data:
            return corrupt(fmt, 1, f"{name} is empty")
        try:  # DCP reads .metadata with plain pickle.load: its globals are a code path too
            scan = scan_pickle(data)
        except PickleScanError as exc:
            return corrupt(fmt, 2, f"{name}: {exc}")
        except ScanLimitError as exc:
            return unverifiable(fmt, 2, f"{name}: {exc.reason}", load_safe=False)
        if scan.end != len(data):
            return corrupt(fmt, 2, f"{name}: {len(data) - scan.end} bytes after the pickle", load_safe=False)
        if unsafe := unsafe_reason([scan], allowed_for(name)):
            return corrupt(fmt, 2, f"{name}: {unsafe}", load_safe=False)
        root = scan.root
        if layout := unknown_layout(root):
            return corrupt(fmt, 2, f"{name}: tensor layout {layout} does not exist: DCP cannot read it (damaged)")
        found = _dcp_items(root)
        understood = understood and found is not None
        items.extend(found or [])
    shard_names = sorted(n for n in names if n.endswith(".distcp"))
    if not understood or not items:
        return _dcp_fallback(path, shard_names)
    need: dict[str, int] = {}
    for rel, offset, length, *_ in items:
        if os.path.isabs(rel) or ".." in Path(rel).parts or "\0" in rel:
            return corrupt(fmt, 2, f"manifest names a path outside the checkpoint: {rel[:80]!r}")
        if offset < 0 or length < 0:
            return corrupt(fmt, 2, f"manifest gives {rel[:80]!r} a negative extent")
        need[rel] = max(need.get(rel, 0), offset + length)
    for rel, end in sorted(need.items()):
        try:
            st = os.stat(os.path.join(path, rel))
        except FileNotFoundError:
            return corrupt(fmt, 2, f"shard {rel} listed in .metadata is missing")
        if not stat.S_ISREG(st.st_mode):
            return unverifiable(fmt, 2, f"shard {rel} is not a regular file", load_safe=False)
        size = st.st_size
        if size < end:
            return corrupt(fmt, 2, f"shard {rel} has {size} bytes, .metadata needs {end} (truncated)")
    return _dcp_items_framing(path, items, len(need), deep)


def _dcp_items(root: Any) -> list[tuple[str, int, int, str, bool]] | None:
    """(relative_path, offset, length, fqn, transformed) of every item, read inertly from the
    Metadata tree."""
    meta = root.attrs() if isinstance(root, Call) else {}
    storage_data = as_mapping(meta.get("storage_data"))
    if storage_data is None:
        return None
    out = []
    for index, info in storage_data.items():
        attrs = info.attrs() if isinstance(info, Call) else {}
        rel, offset, length = attrs.get("relative_path"), attrs.get("offset"), attrs.get("length")
        if not (isinstance(rel, str) and type(offset) is int and type(length) is int):
            return None
        fqn = index.attrs().get("fqn") if isinstance(index, Call) else None
        transformed = bool(attrs.get("transform_descriptors"))
        out.append((rel, offset, length, fqn if isinstance(fqn, str) else "", transformed))
    return out


def _dcp_fallback(path: str, shard_names: list[str]) -> Outcome:
    if not shard_names:
        return unverifiable(DCP, 1, ".metadata present but its layout was not understood and no .distcp files exist")
    for name in shard_names:
        if os.stat(os.path.join(path, name)).st_size == 0:
            return corrupt(DCP, 1, f"shard {name} is empty (0 bytes)")
    return valid(DCP, 1, f".metadata present, {len(shard_names)} shard files nonempty "
                           "(manifest layout not understood: item extents not checked)")


def _dcp_items_framing(path: str, items: list[tuple[str, int, int, str, bool]], files: int, deep: bool) -> Outcome:
    """TORCH_SAVE-format items are each a torch.save zip: check their framing (and CRC with
    ``deep``). Other items (SAFETENSORS serialization, transforms such as compression) are only
    checked for extents, and for a zero-filled start when the checkpoint's other items are zips."""
    fmt = DCP
    framed = unframed = 0
    zero_items: list[str] = []
    crc_missing = False
    step = None
    by_file: dict[str, list[tuple[int, int, str, bool]]] = {}
    for rel, offset, length, fqn, transformed in items:
        by_file.setdefault(rel, []).append((offset, length, fqn, transformed))
    for rel, spans in by_file.items():
        shard = os.path.join(path, rel)
        with regular_fd(shard) as (fd, st):
            blob_checked = False
            for offset, length, fqn, transformed in spans:
                head = pread_exact(fd, 9, offset)
                if not transformed and not blob_checked and SAFETENSORS_FORMAT.detect(head, ""):
                    # SAFETENSORS serialization: one safetensors blob from here to the end of the file
                    blob = check_safetensors(fd, st.st_size - offset, base=offset)
                    if blob.verdict is not Verdict.VALID:
                        return blob.but(format=fmt, reason=f"safetensors data in {rel}: {blob.reason}")
                    blob_checked = True
                if transformed or head[:4] != b"PK\x03\x04":
                    probe = pread_exact(fd, min(length, 64), offset)
                    if length and probe.count(0) == len(probe):
                        zero_items.append(f"item {fqn or offset} in {rel} is zero-filled")
                    unframed += 1
                    continue
                framed += 1
                # Each item is a torch.save zip that DCP hands to torch.load (bytes items with
                # weights_only=False): the same ladder as a file, data.pkl scanned included.
                item = check_torch_zip(fd, length, base=offset, deep=deep,
                                       cache_key=crc_cache_key(shard, st, offset) if deep else None)
                where = f"item {fqn or offset} in {rel}"
                if item.verdict is Verdict.CORRUPT:
                    return corrupt(fmt, max(item.level, 3), f"{where}: {item.reason}", load_safe=item.load_safe)
                if item.verdict is not Verdict.VALID:
                    if not item.load_safe or not deep:
                        return unverifiable(fmt, 3, f"{where}: {item.reason}", load_safe=item.load_safe)
                    crc_missing = True
                if _is_step_fqn(fqn) and step is None:
                    step = _item_int(fd, offset, length)
    if zero_items and framed:  # zip-framed items never start with zeros: a hole, not data
        return corrupt(fmt, 3, zero_items[0])
    note = f"; {unframed} items not zip-framed (extents only)" if unframed else ""
    summary = f"{len(items)} items in {files} shard files: extents fit, {framed} items framed{note}"
    if deep and crc_missing:
        return unverifiable(fmt, 4, f"{summary}; some items carry no CRC32", embedded_step=step)
    level = 4 if deep and not unframed else 3
    return valid(fmt, level, summary + ("; CRC32 match" if deep and framed else ""), embedded_step=step)


def _is_step_fqn(fqn: str) -> bool:
    parts = fqn.split(".")
    return len(parts) <= 2 and parts[-1] in STEP_KEYS


def _item_int(fd: int, base: int, length: int) -> int | None:
    """An int (or one-element int tensor) saved as one DCP item: scan its own data.pkl."""
    try:
        index = read_index(fd, base, length, read_trailer(fd, base, length))
        pkl = index.get("data.pkl")
        if pkl is None or pkl.size > 1 << 20:
            return None
        root = scan_pickle(read_entry(fd, base, pkl)).root
    except (ZipCheckError, PickleScanError, ScanLimitError):
        return None
    if plain_int(root) is not None:
        return root
    return plain_int(read_tensor_int(fd, base, index, root)) if is_tensor(root) else None
