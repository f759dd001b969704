"""Property-based fuzzing of the checkpoint validator (Hypothesis) on real torch.save files:
truncations, bit flips, zip mutations (local headers, central directory, end records, size
fields), deep nesting and hostile globals injected into real checkpoints.

Properties, for every input:
- ``validate`` never raises (a FileNotFoundError aside, there is none here) and returns within
  ``PER_INPUT_S`` (generous: a slow CI machine must not flake; a scan takes milliseconds);
- a pickle naming a global outside the allowlist is never VALID and never a resume point;
- a truncated real checkpoint is never VALID, and one with a bit flipped inside an entry's bytes
  is never VALID when its CRCs are checked (``deep``).

CI (``CI`` set) runs derandomized, so a failure there reproduces; locally the seed varies.
"""

from __future__ import annotations

import os
import pickle
import struct
import tempfile
import time
import zipfile
from functools import cache
from pathlib import Path

import ckpt_factory as cf
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor.checkpoints.allowlist import SAFE_GLOBALS, resolve
from supervisor.checkpoints.limits import ScanLimitError
from supervisor.checkpoints.picklescan import PickleScanError, scan_pickle
from supervisor.checkpoints.resume import is_usable
from supervisor.checkpoints.trust import Trust, hostile_reason
from supervisor.checkpoints.validate import CheckpointReport, validate
from supervisor.states import Verdict

PER_INPUT_S = 5.0
FUZZ = settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", "60")), deadline=None,
               derandomize=bool(os.environ.get("CI")), database=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
_WORK = Path(tempfile.mkdtemp(prefix="ckpt-fuzz-"))


@cache
def original(kind: str) -> bytes:
    """Real files, built once per session (torch.save, torch's legacy writer, safetensors)."""
    path = _WORK / f"orig-{kind}"
    if kind == "zip":
        cf.save_zip(path, 900, epoch=1)
    elif kind == "legacy":
        cf.save_legacy(path, 900)
    elif kind == "safetensors":
        path = cf.save_safetensors(_WORK / "orig.safetensors", cf.model_state(1), {"step": "900"})
    else:
        path.write_bytes(pickle.dumps({"global_step": 900, "w": [1.0, 2.0]}, protocol=4))
    return path.read_bytes()


def checked(data: bytes, name: str = "step=900.ckpt", deep: bool = False) -> CheckpointReport:
    """validate() on ``data`` written to a file: it must not raise and must be quick."""
    path = _WORK / name
    path.write_bytes(data)
    start = time.perf_counter()
    report = validate(path, deep=deep)
    elapsed = time.perf_counter() - start
    assert elapsed < PER_INPUT_S, f"{elapsed:.1f} s for {len(data)} bytes: {report.reason}"
    assert report.reason
    return report


@cache
def entry_spans(kind: str = "zip") -> tuple[tuple[int, int], ...]:
    """(offset, length) of every zip entry's bytes in the original (what CRC32 covers)."""
    data = original(kind)
    spans = []
    path = _WORK / "spans.ckpt"
    path.write_bytes(data)
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            name_len, extra_len = struct.unpack_from("<HH", data, info.header_offset + 26)
            start = info.header_offset + 30 + name_len + extra_len
            if info.file_size:
                spans.append((start, info.file_size))
    return tuple(spans)


KINDS = st.sampled_from(["zip", "legacy", "safetensors", "pickle"])


# ---------------------------------------------------------------------------- damage


@FUZZ
@given(kind=KINDS, cut=st.floats(min_value=0.0, max_value=1.0, exclude_max=True))
def test_truncated_real_checkpoints_are_never_valid(kind: str, cut: float) -> None:
    data = original(kind)
    name = "model.safetensors" if kind == "safetensors" else "step=900.ckpt"
    report = checked(data[: int(len(data) * cut)], name)
    assert report.verdict is not Verdict.VALID, (kind, cut, report.reason)


@FUZZ
@given(data=st.data())
def test_bit_flips_inside_entries_are_never_valid_when_crcs_are_checked(data: st.DataObject) -> None:
    offset, length = data.draw(st.sampled_from(entry_spans()))
    where = offset + data.draw(st.integers(0, length - 1))
    bit = data.draw(st.integers(0, 7))
    raw = bytearray(original("zip"))
    raw[where] ^= 1 << bit
    report = checked(bytes(raw), deep=True)
    assert report.verdict is not Verdict.VALID, (where, bit, report.reason)


@FUZZ
@given(kind=KINDS, flips=st.lists(st.tuples(st.floats(0.0, 1.0, exclude_max=True), st.integers(0, 7)),
                                  min_size=1, max_size=8), deep=st.booleans())
def test_bit_flips_anywhere_never_raise_or_hang(kind: str, flips: list[tuple[float, int]], deep: bool) -> None:
    raw = bytearray(original(kind))
    for where, bit in flips:
        raw[int(where * len(raw))] ^= 1 << bit
    name = "model.safetensors" if kind == "safetensors" else "step=900.ckpt"
    checked(bytes(raw), name, deep=deep)


def _zip_regions(data: bytes) -> dict[str, tuple[int, int]]:
    eocd = data.rfind(b"PK\x05\x06")
    cd = data.find(b"PK\x01\x02")
    return {"local headers": (0, 30), "central directory": (cd, eocd - cd),
            "end records": (len(data) - 98, 98), "size fields": (cd + 16, 12)}


@FUZZ
@given(region=st.sampled_from(["local headers", "central directory", "end records", "size fields"]),
       at=st.floats(0.0, 1.0, exclude_max=True),
       value=st.sampled_from([b"\x00", b"\xff", b"\xff\xff\xff\xff", b"\x00\x00\x00\x80",
                              b"\xff\xff\xff\xff\xff\xff\xff\x7f", b"PK\x05\x06", b"PK\x01\x02"]),
       deep=st.booleans())
def test_zip_structure_mutations_never_raise_or_hang(region: str, at: float, value: bytes, deep: bool) -> None:
    raw = bytearray(original("zip"))
    start, length = _zip_regions(bytes(raw))[region]
    pos = start + int(at * max(length - len(value), 1))
    raw[pos: pos + len(value)] = value
    checked(bytes(raw), deep=deep)


# ---------------------------------------------------------------------------- hostile pickles

_MODULES = ["os", "posix", "subprocess", "builtins", "__builtin__", "torch.serialization", "logging",
            "cProfile", "pydoc", "collections", "torch._utils", "numpy", "argparse", "copyreg", "runpy"]
_NAMES = ["system", "os.system", "run", "pipepager", "eval", "exec", "getattr", "OrderedDict",
          "_rebuild_tensor_v2", "Namespace", "_reconstructor", "run_path", "set", "apply", "__import__"]


def _short(text: str) -> bytes:
    raw = text.encode()
    return (b"\x8c" + bytes([len(raw)]) + raw) if len(raw) < 256 else (b"X" + struct.pack("<I", len(raw)) + raw)


@st.composite
def hostile_pickles(draw: st.DrawFn) -> tuple[bytes, set[tuple[str, str]]]:
    """A pickle naming 1-3 globals (GLOBAL at protocol 2 or STACK_GLOBAL at 4), each called; and
    the (module, name) pairs the loader would resolve."""
    count = draw(st.integers(1, 3))
    proto = draw(st.sampled_from([2, 4]))
    body, names = b"", set()
    for _ in range(count):
        module = draw(st.sampled_from(_MODULES) | st.from_regex(r"[a-z_][a-z0-9_.]{0,20}", fullmatch=True))
        name = draw(st.sampled_from(_NAMES) | st.from_regex(r"[A-Za-z_][A-Za-z0-9_.]{0,20}", fullmatch=True))
        if proto == 2 and "." in name:
            name = name.replace(".", "_")  # GLOBAL names are one line each; dots only via STACK_GLOBAL
        if proto == 2:
            body += b"c" + module.encode() + b"\n" + name.encode() + b"\n"
        else:
            body += _short(module) + _short(name) + b"\x93"
        body += _short("x") + b"\x85R"
        names.add(resolve(module, name, proto))
    pkl = bytes([0x80, proto]) + b"(" + body + b"l."
    return pkl, names


@FUZZ
@given(hostile=hostile_pickles(), how=st.sampled_from(["data.pkl", "appended", "plain", "plain-second"]))
def test_a_primitive_is_never_resumable_and_an_unlisted_global_never_trusted(hostile: tuple[bytes, set],
                                                                             how: str) -> None:
    pkl, names = hostile
    base = _WORK / "base.ckpt"
    if not base.exists():
        base.write_bytes(original("zip"))
    if how == "data.pkl":
        path = cf.with_data_pkl(base, _WORK / "inj.ckpt", pkl)
    elif how == "appended":
        path = cf.with_data_pkl(base, _WORK / "inj.ckpt", cf.data_pkl_of(base) + pkl)
    else:
        path = _WORK / "inj.pkl"
        first = pickle.dumps({"step": 1}, protocol=2)
        path.write_bytes(pkl if how == "plain" else first + pkl)
    report = checked(path.read_bytes(), path.name)
    if any(hostile_reason(*n) for n in names):
        assert report.verdict is not Verdict.VALID and report.trust is Trust.HOSTILE, (names, report.reason)
        assert not is_usable(report), (names, report.reason)
    elif names - SAFE_GLOBALS:
        assert report.trust is not Trust.TRUSTED, (names, report.reason)
        assert not is_usable(report, require_trusted=True), (names, report.reason)


@FUZZ
@given(depth=st.integers(900, 120_000), where=st.sampled_from(["key", "value", "list"]))
def test_deep_nesting_never_crashes_and_is_never_resumable_past_the_cap(depth: int, where: str) -> None:
    if where == "key":
        pkl = cf.pickle_nested_tuple_key(depth)
    elif where == "value":
        pkl = b"\x80\x02}(X\x01\x00\x00\x00k)" + b"\x85" * depth + b"u."
    else:
        pkl = b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b"."
    path = cf.torch_zip_with_pickle(_WORK / "deep.ckpt", pkl)
    report = checked(path.read_bytes(), "deep.ckpt")
    if depth > 1_000:
        assert report.verdict is not Verdict.VALID and not is_usable(report), report.reason


# ---------------------------------------------------------------------------- the decoder alone


@FUZZ
@given(blob=st.binary(max_size=2048))
def test_the_decoder_on_arbitrary_bytes_raises_only_its_own_errors(blob: bytes) -> None:
    start = time.perf_counter()
    try:
        scan_pickle(blob)
    except (PickleScanError, ScanLimitError):
        pass
    assert time.perf_counter() - start < PER_INPUT_S


@FUZZ
@given(data=st.data())
def test_the_decoder_on_a_mutated_real_data_pkl_raises_only_its_own_errors(data: st.DataObject) -> None:
    pkl = bytearray(cf.data_pkl_of(_WORK / "base.ckpt") if (_WORK / "base.ckpt").exists()
                    else _real_data_pkl())
    for _ in range(data.draw(st.integers(1, 6))):
        pos = data.draw(st.integers(0, len(pkl) - 1))
        op = data.draw(st.sampled_from(["flip", "delete", "insert"]))
        if op == "flip":
            pkl[pos] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "delete":
            del pkl[pos]
        else:
            pkl[pos:pos] = data.draw(st.binary(min_size=1, max_size=9))
    start = time.perf_counter()
    try:
        scan_pickle(bytes(pkl))
    except (PickleScanError, ScanLimitError):
        pass
    assert time.perf_counter() - start < PER_INPUT_S


def _real_data_pkl() -> bytes:
    (_WORK / "base.ckpt").write_bytes(original("zip"))
    return cf.data_pkl_of(_WORK / "base.ckpt")


@pytest.mark.parametrize("kind", ["zip", "legacy", "safetensors", "pickle"])
def test_the_originals_are_valid(kind: str) -> None:
    """The properties above mean something only if the undamaged files pass."""
    name = "model.safetensors" if kind == "safetensors" else "step=900.ckpt"
    report = checked(original(kind), name, deep=True)
    assert report.verdict is Verdict.VALID and report.load_safe, report.reason
