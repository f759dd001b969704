"""Reading the rerun's output (pure): compute-sanitizer records, kernel assertions, Python tracebacks."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


_SAN_PREFIX = re.compile(r"^=========(?:\s|$)")
_SAN_ERROR = re.compile(
    r"^=+\s+((?:Invalid|Misaligned|Out-of-range|Address|Hardware Exception|Illegal|Warp|Lane|Barrier|"
    r"Device-side|Cuda API|Malloc|Free|Uninitialized)\b.*)$")
_SAN_AT = re.compile(r"^=+\s+at\s+(.+?)\s*$")
_SAN_HIT = re.compile(r"^=+\s+(Program hit .+?)\s*$")
_SAN_SUMMARY = re.compile(r"^=+\s+ERROR SUMMARY:\s*(\d+) errors?")
_SAN_HOST_PY = re.compile(r"^=+\s+Host Frame:\s*(?P<func>\S+)\s+in\s+(?P<where>\S+\.py:\d+)\s*$")
_SAN_DETAIL = re.compile(r"^=+\s+((?:by thread|Address|and is|is misaligned|Access (?:at|to)).+?)\s*$")
_SAN_REFUSED = re.compile(r"Device not supported|not supported on this (?:device|platform)|"
                          r"unrecognised option|unrecognized option|Unable to|Could not (?:start|find)|"
                          r"Error: .*(?:initialize|initialise)",
                          re.IGNORECASE)
_HEX_OFFSET = re.compile(r"\+0x[0-9a-fA-F]+$")
_SOURCE = re.compile(r"^(\S+?\.(?:cu|cuh|cpp|cc|h|hpp|py|ptx)):(\d+)")
_KERNEL_ASSERT = re.compile(
    r"(?P<source>\S+\.cuh?):(?P<line>\d+):\s*(?P<func>[^:]*?):?\s*block:\s*\[[\d,\s]+\],\s*thread:\s*"
    r"\[[\d,\s]+\]\s*Assertion\s*[`'](?P<assertion>.*?)[`']\s*failed")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+?)\s*$')
_LIBRARY = re.compile(r"site-packages|dist-packages|^<frozen |/lib/python\d[\d.]*/(?!site-packages)|^<string>$")
_GPUISH = re.compile(r"CUDA|cuda|illegal memory|assert|Triton Error|driver status|cudaError|CUBLAS|CUDNN|NCCL")


@dataclass(frozen=True)
class SanitizerFinding:
    """One memcheck error record."""

    error: str  # "Invalid __global__ write of size 4 bytes"
    kernel: str | None  # the function the access was in
    source: str | None  # file:line when the kernel was built with line info
    details: tuple[str, ...]  # thread/block, address, how far from the nearest allocation
    launch_frames: tuple[str, ...] = ()  # Python frames of the host backtrace at launch, innermost first

    @property
    def launch_site(self) -> str | None:
        """The Python line that launched the kernel (``_ptx_store in train_plain.py:112``)."""
        return self.launch_frames[0] if self.launch_frames else None


@dataclass(frozen=True)
class KernelAssert:
    """A device-side assertion message (``IndexKernel.cu:92: ... Assertion `...` failed.``)."""

    source: str
    function: str
    assertion: str


@dataclass(frozen=True)
class PythonFrame:
    file: str
    line: int
    function: str
    code: str | None


@dataclass(frozen=True)
class TracebackFinding:
    """A Python traceback: its exception line and the frames in the user's code (innermost last)."""

    error: str
    frames: tuple[PythonFrame, ...]

    @property
    def user_frame(self) -> PythonFrame | None:
        return self.frames[-1] if self.frames else None


def _kernel_and_source(where: str) -> tuple[str | None, str | None]:
    """``oob_store+0x10``, ``0x170 in oob_store``, ``kern(float*)+0x1a0 in /src/k.cu:12`` ->
    (kernel, source)."""
    where = where.strip()
    old = re.match(r"^0x[0-9a-fA-F]+\s+in\s+(.+)$", where)
    if old:  # older format: "at 0x170 in file.cu:12:kernel(args)" or "at 0x170 in kernel"
        rest = old.group(1)
        src = _SOURCE.match(rest)
        if src:
            tail = rest[src.end():].lstrip(":")
            return (tail or None), f"{src.group(1)}:{src.group(2)}"
        return rest, None
    source = None
    head, sep, tail = where.rpartition(" in ")
    if sep and _SOURCE.match(tail):
        src = _SOURCE.match(tail)
        assert src is not None
        source, where = f"{src.group(1)}:{src.group(2)}", head
    return _HEX_OFFSET.sub("", where.strip()) or None, source


def parse_sanitizer(text: str) -> list[SanitizerFinding]:
    """The error records of compute-sanitizer's memcheck output, in order."""
    findings: list[SanitizerFinding] = []
    current: dict[str, Any] | None = None

    def close() -> None:
        nonlocal current
        if current is not None:
            findings.append(SanitizerFinding(current["error"], current["kernel"], current["source"],
                                             tuple(current["details"]), tuple(current["frames"])))
        current = None

    for raw in text.splitlines():
        line = raw.rstrip()
        if not _SAN_PREFIX.match(line):
            continue
        error = _SAN_ERROR.match(line)
        if error:
            close()
            current = {"error": error.group(1).strip(), "kernel": None, "source": None, "details": [], "frames": []}
            continue
        if current is None:
            continue
        at = _SAN_AT.match(line)
        if at and current["kernel"] is None:
            current["kernel"], current["source"] = _kernel_and_source(at.group(1))
            continue
        host = _SAN_HOST_PY.match(line)
        if host:
            if len(current["frames"]) < 6:
                current["frames"].append(f"{host.group('func')} in {host.group('where')}")
            continue
        detail = _SAN_DETAIL.match(line)
        if detail and len(current["details"]) < 6:
            current["details"].append(detail.group(1))
            continue
        if _SAN_HIT.match(line) or _SAN_SUMMARY.match(line):
            close()
    close()
    return findings


def sanitizer_api_errors(text: str) -> list[str]:
    """``Program hit cudaErrorIllegalAddress ... on CUDA API call to cudaStreamSynchronize`` lines."""
    return [m.group(1) for m in map(_SAN_HIT.match, text.splitlines()) if m][:10]


def sanitizer_refused(text: str) -> str | None:
    """The sanitizer's own complaint when it could not instrument the program (no error record)."""
    for line in text.splitlines():
        if _SAN_PREFIX.match(line) and _SAN_REFUSED.search(line):
            return line.lstrip("= ").strip()[:300]
    return None


def parse_kernel_asserts(text: str) -> list[KernelAssert]:
    found: list[KernelAssert] = []
    seen: set[tuple[str, str]] = set()
    for match in _KERNEL_ASSERT.finditer(text):
        key = (f"{match.group('source')}:{match.group('line')}", match.group("assertion"))
        if key in seen:
            continue
        seen.add(key)
        found.append(KernelAssert(source=key[0], function=match.group("func").strip(),
                                  assertion=match.group("assertion")))
        if len(found) >= 10:
            break
    return found


def is_user_file(path: str) -> bool:
    """A frame in the user's code, not in an installed package or the standard library."""
    return not _LIBRARY.search(path)


def parse_tracebacks(text: str) -> list[TracebackFinding]:
    """Every Python traceback in ``text``, in order (a chained exception prints its cause first)."""
    found: list[TracebackFinding] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() != "Traceback (most recent call last):":
            i += 1
            continue
        i += 1
        frames: list[PythonFrame] = []
        error = ""
        while i < len(lines):
            line = lines[i]
            frame = _FRAME.match(line)
            if frame:
                code = None
                if i + 1 < len(lines) and not _FRAME.match(lines[i + 1]) and lines[i + 1].startswith("    "):
                    candidate = lines[i + 1].strip()
                    if candidate and set(candidate) - set("^~ "):
                        code = candidate
                        i += 1
                if is_user_file(frame.group("file")):
                    frames.append(PythonFrame(frame.group("file"), int(frame.group("line")),
                                              frame.group("func"), code))
                i += 1
                continue
            if not line.strip() or line.startswith(" ") or set(line.strip()) <= set("^~ "):
                i += 1
                continue
            error = line.strip()
            i += 1
            break
        found.append(TracebackFinding(error=error[:500], frames=tuple(frames[-8:])))
    return found


def pick_traceback(tracebacks: Sequence[TracebackFinding]) -> TracebackFinding | None:
    """The root cause: the first traceback whose exception names the GPU, else the last one."""
    for tb in tracebacks:
        if _GPUISH.search(tb.error):
            return tb
    return tracebacks[-1] if tracebacks else None
