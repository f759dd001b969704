"""safetensors: an 8-byte little-endian header length, a JSON header, then a byte buffer the
header's offsets must cover exactly. No checksum and no pickle. The step is a ``global_step``/
``step``/``iteration`` string in the header's ``__metadata__``.
"""

from __future__ import annotations

import re
import struct
from typing import Any

from ..limits import MAX_STEP
from ..outcome import Outcome, corrupt, unverifiable, valid
from ..stheader import MAX_HEADER as MAX_SAFETENSORS_HEADER
from ..stheader import check_header
from ..zipcheck import pread_exact
from .base import FileContext, FileFormat
from .common import TAR_ARCHIVE_REASON, tar_header_reason
from .kinds import SAFETENSORS, UNKNOWN
from .kinds import MAX_SAFETENSORS_HEADER as MAX_PLAUSIBLE_HEADER


class Safetensors(FileFormat):
    name = SAFETENSORS
    suffixes = (".safetensors",)
    step_where = None
    unpickled = False

    def detect(self, head: bytes, name: str) -> bool:
        if name.lower().endswith(".safetensors"):
            return True
        if len(head) >= 9 and head[8:9] == b"{":
            (header_len,) = struct.unpack_from("<Q", head)
            return bool(header_len <= MAX_PLAUSIBLE_HEADER)
        return False

    def validate(self, fd: int, size: int, ctx: FileContext) -> Outcome:
        if not ctx.name.endswith(".safetensors") and tar_header_reason(fd, size):
            # torch.load reads a file that is also a tar archive as one (a safetensors header is no zip)
            return unverifiable(UNKNOWN, 1, TAR_ARCHIVE_REASON, load_safe=False)
        return check_safetensors(fd, size, max_level=ctx.max_level)


FORMAT = Safetensors()


def check_safetensors(fd: int, size: int, *, max_level: int = 3, base: int = 0) -> Outcome:
    """8-byte header length, JSON header, then the byte buffer, which must be covered exactly.
    The header is judged by :mod:`.stheader` as the safetensors library judges it. The format has
    no checksum. ``base``/``size``: a safetensors blob inside a larger file (DCP's SAFETENSORS
    serialization)."""
    fmt = SAFETENSORS
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
