"""What the pickle-based formats share: the inert scan of a stream of pickles, the trust judgement
on the globals they name, the facts copied out of a checkpoint's top-level mapping, the tensor
checks torch.load would fail, and the tar ambiguity torch.load resolves in the tar's favour.

Never unpickles: every pickle is walked by supervisor/checkpoints/picklescan.py.
"""

from __future__ import annotations

import re
import tarfile
from typing import Any

from .. import trust as T
from ..limits import MAX_PICKLE_OPS, ScanLimitError
from ..outcome import Outcome, unverifiable
from ..picklescan import (
    Blob,
    Global,
    PersistentRef,
    PickleScan,
    as_mapping,
    describe,
    iter_calls,
    scan_pickle,
)
from ..zipcheck import pread_exact

# Scalars copied out of a checkpoint's top-level mapping (DeepSpeed world sizes, steps, versions).
_FACT_TYPES = (int, str, float, bool)
_MAX_FACT_TEXT = 256

TAR_ARCHIVE_REASON = ("a tar archive (torch's oldest checkpoint format): torch.load would unpickle its "
                      "members, which are not scanned")


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


def over_limit(fmt: str, level: int, exc: ScanLimitError, **kw: Any) -> Outcome:
    """Over a scanner cap: not proven damaged, but never a resume point (unscanned = unknown)."""
    return unverifiable(fmt, level, exc.reason, load_safe=False, **kw)



# Storage types whose tensors cannot require gradients (torch.load raises when a file says they do).
_INTEGER_STORAGES = frozenset({"ByteStorage", "CharStorage", "ShortStorage", "IntStorage", "LongStorage", "BoolStorage",
                               "QInt8Storage", "QUInt8Storage", "QInt32Storage", "QUInt4x2Storage", "QUInt2x4Storage"})
# torch._utils' tensor rebuilders and how many arguments each takes (storage, offset, sizes,
# strides, then for v2: requires_grad, backward_hooks and an optional metadata).
_REBUILDERS = {"_rebuild_tensor_v2": (6, 7), "_rebuild_tensor": (4, 4)}
# Values that can never be a tensor's backward-hook dict (torch.save writes an OrderedDict).
_NOT_A_MAPPING = (int, float, str, bytes, tuple, list, type(None), Blob, PersistentRef, Global)


def view_problem(scan: PickleScan) -> str | None:
    """A tensor rebuild torch.load cannot make (the callers add that it fails): its view (offset,
    sizes, strides) reaches past its storage, its arguments are not the ones ``torch.save`` writes
    (an offset that is not an int, sizes or strides that are not tuples of ints of one length, the
    wrong number of them), or an integer tensor that requires gradients. The scan judges them as the
    loader will use them, so a flipped bit that turns ``K`` (one-byte int) into ``J`` (four-byte
    int) and swallows the strides tuple is damage, not a whole file."""
    storages = {ref.key: ref for ref in scan.storages if ref.type_name != "UntypedStorage"}
    for name, (fewest, most) in _REBUILDERS.items():
        for call in iter_calls(scan.root, name):
            if call.func.module != "torch._utils":
                continue
            args = call.args if isinstance(call.args, tuple) else ()
            if not fewest <= len(args) <= most:
                return f"a tensor is rebuilt with {len(args)} arguments; {name} takes {fewest}-{most}"
            if not isinstance(args[0], PersistentRef) or not isinstance(args[0].pid, tuple):
                continue  # not a storage torch would hand over: the persistent-id checks judge it
            pid = args[0].pid
            ref = storages.get(str(pid[2])) if len(pid) > 2 and isinstance(pid[2], (str, int)) else None
            if ref is None:
                continue  # an untyped or unknown storage: its own checks judge it
            key = str(pid[2])[:40]
            offset, sizes, strides = args[1], args[2], args[3]
            if (type(offset) is not int or not _int_tuple(sizes) or not _int_tuple(strides)
                    or len(sizes) != len(strides)):
                return (f"tensor on storage {key} has offset, sizes or strides that are not the ints and tuples "
                        "torch.save writes")
            if name == "_rebuild_tensor_v2":
                requires_grad = args[4]
                if type(requires_grad) is not bool:
                    return f"tensor on storage {key} has a requires_grad that is not a bool"
                if requires_grad and ref.type_name in _INTEGER_STORAGES:
                    return (f"tensor on storage {key} ({ref.type_name}) requires gradients, which no integer "
                            "tensor can")
                if isinstance(args[5], _NOT_A_MAPPING):  # a call is left to the class it names (trust)
                    return f"tensor on storage {key} has backward hooks that are not a dict (torch.save writes one)"
                if len(args) == 7 and args[6] and isinstance(args[6], _NOT_A_MAPPING):  # falsy: torch skips it
                    return f"tensor on storage {key} has metadata that is not a dict"
            if 0 in sizes:
                continue
            last = offset + sum((size - 1) * stride for size, stride in zip(sizes, strides, strict=True))
            if offset < 0 or last >= ref.numel:
                return f"a tensor view reaches element {last} of storage {key}, which holds {ref.numel}"
    return None


def _int_tuple(value: Any) -> bool:
    return isinstance(value, tuple) and all(type(v) is int for v in value)


# Device tags torch.load restores a storage to without a map_location ("cpu", "cuda:1", ...): torch's
# own and the common out-of-tree backends. Any other tag of the same shape may be a backend we do
# not know; one of another shape is damage.
_KNOWN_DEVICES = frozenset({"cpu", "meta", "cuda", "mps", "xpu", "hpu", "mtia", "xla", "npu", "privateuseone"})
_DEVICE_TAG = re.compile(r"([a-z][a-z0-9_]{0,31})(:[0-9]{1,6})?", re.ASCII)


def location_problem(scan: PickleScan) -> tuple[bool, str] | None:
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


def file_reader(fd: int, base: int = 0) -> Any:
    def reader(offset: int, length: int) -> bytes:
        return pread_exact(fd, length, base + offset)

    return reader


def scan_stream(data: bytes | None, count: int | None = None, *, start: int = 0, reader: Any = None,
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
