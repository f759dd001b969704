"""The safetensors header judged as the ``safetensors`` library judges it (its Rust parser,
version 0.8 as installed with the test extra), so that "whole" here means "``load_file`` reads
it". The rules are written out in docs/checkpoint-validation.md ("safetensors").

Pure functions: the header's bytes and the length of the byte buffer after it in, a
:class:`HeaderVerdict` out. Nothing is read from disk here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MAX_HEADER = 100_000_000  # the library's MAX_HEADER_SIZE
_U64 = 1 << 64

# Element sizes in bits of every dtype name the library's parser accepts (exact spelling).
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8,
    "F8_E8M0": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}
# Parsed by the library, but ``safetensors.torch`` has no torch dtype for them: it fails to load.
NOT_FOR_TORCH = frozenset({"F8_E8M0", "F4", "F6_E2M3", "F6_E3M2"})


@dataclass(frozen=True)
class HeaderVerdict:
    ok: bool
    reason: str
    tensors: int = 0
    metadata: dict[str, str] | None = None
    torch_loadable: bool = True  # False: a dtype safetensors.torch cannot build


class _Refused(Exception):
    """The header breaks one of the library's rules (``str(exc)`` says which)."""


class _Negative:
    """A JSON number written with a minus sign (``-0`` included): never a usize."""


class _Float:
    """A JSON number with a fraction or exponent: never a usize."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Refused(f"key {key[:80]!r} appears twice in one JSON object (readers disagree on which counts)")
        out[key] = value
    return out


def _constant(name: str) -> Any:
    raise _Refused(f"{name} is not JSON")


def _parse(raw: bytes) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _Refused("header is not UTF-8") from None
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_constant,
                          parse_int=lambda s: _Negative() if s.startswith("-") else int(s),
                          parse_float=lambda s: _Float())
    except (ValueError, RecursionError):
        raise _Refused("JSON header unreadable (damaged, zero-filled or nested too deeply)") from None


def _strict_text(value: str) -> bool:
    """serde_json refuses lone surrogates (``"\\ud800"``), Python's json keeps them."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _usize(value: Any) -> bool:
    return type(value) is int and 0 <= value < _U64


def check_header(raw: bytes, buffer_len: int) -> HeaderVerdict:
    """``raw``: the header's bytes (after the 8-byte length); ``buffer_len``: bytes after it."""
    try:
        return _check(raw, buffer_len)
    except _Refused as exc:
        return HeaderVerdict(False, str(exc))


def _check(raw: bytes, buffer_len: int) -> HeaderVerdict:
    header = _parse(raw)
    if not isinstance(header, dict):
        raise _Refused("JSON header is not an object")
    meta = header.pop("__metadata__", None)
    if meta is not None:
        if not (isinstance(meta, dict) and all(isinstance(v, str) and _strict_text(v) and _strict_text(k)
                                               for k, v in meta.items())):
            raise _Refused("__metadata__ is not a map of strings to strings")
    spans: list[tuple[int, int, str]] = []
    torch_loadable = True
    for name, info in header.items():
        shown = ascii(name[:80])
        if not _strict_text(name):
            raise _Refused(f"tensor name {shown} is not valid Unicode")
        if not isinstance(info, dict):
            raise _Refused(f"tensor {shown}: header entry is not an object")
        missing = [k for k in ("dtype", "shape", "data_offsets") if k not in info]
        if missing:
            raise _Refused(f"tensor {shown}: header entry lacks {missing[0]}")
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
            raise _Refused(f"tensor {shown}: unknown dtype {ascii(dtype)[:40]}")
        if not (isinstance(shape, list) and all(_usize(d) for d in shape)):
            raise _Refused(f"tensor {shown}: shape is not a list of non-negative integers")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_usize(o) for o in offsets)):
            raise _Refused(f"tensor {shown}: data_offsets is not two non-negative integers")
        numel = 1
        for dim in shape:  # the library multiplies left to right and stops at the first overflow
            numel *= dim
            if numel >= _U64:
                raise _Refused(f"tensor {shown}: shape {shape[:8]} overflows")
        if numel * DTYPE_BITS[dtype] >= _U64:
            raise _Refused(f"tensor {shown}: shape {shape[:8]} overflows")
        bits = numel * DTYPE_BITS[dtype]
        if bits % 8:
            raise _Refused(f"tensor {shown}: {dtype}{shape[:8]} is not a whole number of bytes")
        begin, end = offsets
        if end < begin:
            raise _Refused(f"tensor {shown}: data_offsets end before they begin")
        if end - begin != bits // 8:
            raise _Refused(f"tensor {shown}: {end - begin} bytes, {dtype}{shape[:8]} needs {bits // 8}")
        torch_loadable = torch_loadable and dtype not in NOT_FOR_TORCH
        spans.append((begin, end, shown))
    spans.sort()
    cursor = 0
    for begin, end, shown in spans:
        if begin != cursor:
            raise _Refused(f"tensor {shown} does not follow the previous one (hole or overlap at {cursor})")
        cursor = end
    if cursor > buffer_len:
        raise _Refused(f"truncated: tensors need {cursor} data bytes, file has {buffer_len}")
    if cursor < buffer_len:
        raise _Refused(f"{buffer_len - cursor} bytes after the last tensor (appended data?)")
    return HeaderVerdict(True, f"{len(spans)} tensors cover the file exactly (format has no checksum)",
                         len(spans), meta, torch_loadable)
