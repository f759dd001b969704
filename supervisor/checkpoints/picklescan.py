"""Inert pickle scan (L3): decode a pickle's opcodes and simulate the unpickler's stack with plain
placeholders. Nothing is imported, called or constructed: a ``GLOBAL`` becomes a :class:`Global`
name, a ``REDUCE``/``NEWOBJ`` a :class:`Call` record, a persistent id a :class:`PersistentRef`. A
checkpoint's pickle may be hostile (``__reduce__`` can run any code), so this is the only way the
supervisor looks inside one.

The decoder is our own (not :mod:`pickletools`) so that every cost is bounded before it is paid
(:mod:`.limits`): lengths are checked against the buffer before anything is sliced, constants over
``MAX_SMALL_CONSTANT`` are not decoded, opcodes are counted, and nothing recurses on the decoded
structure (no hashing, comparing or printing of untrusted containers; a post-pass measures nesting
with an explicit stack).

What comes out: the tensor storage records torch writes as persistent ids
``('storage', StorageType, key, location, numel)``, the object tree with scalars intact (so
``global_step``, ``dp_world_size`` and DCP's ``_StorageInfo`` extents can be read), every global the
pickle names (resolved as the loader would), and where the pickle ended.
"""

from __future__ import annotations

import codecs
import contextlib
import struct
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Literal

from .allowlist import resolve
from .limits import (
    LEAN_AFTER_OPS,
    LEAN_KEEP,
    LEAN_STACK,
    MAX_GLOBALS,
    MAX_NESTING,
    MAX_PICKLE_OPS,
    MAX_SMALL_CONSTANT,
    MAX_STEP,
    MAX_STORAGES,
    ScanLimitError,
)

# Element sizes of torch's pickled storage types (torch.storage._dtype_to_storage_type_map).
STORAGE_ITEMSIZE: dict[str, int] = {
    "DoubleStorage": 8, "FloatStorage": 4, "HalfStorage": 2, "BFloat16Storage": 2,
    "LongStorage": 8, "IntStorage": 4, "ShortStorage": 2, "CharStorage": 1, "ByteStorage": 1,
    "BoolStorage": 1, "ComplexDoubleStorage": 16, "ComplexFloatStorage": 8, "QInt8Storage": 1,
    "QInt32Storage": 4, "QUInt8Storage": 1, "QUInt4x2Storage": 1, "QUInt2x4Storage": 1,
    "UntypedStorage": 1,  # numel is nbytes for untyped storages (new dtypes: float8, uint16, ...)
}

# Keys that hold the training step, strongest first (Lightning, DeepSpeed, plain loops, Megatron,
# litgpt's step_count, nanoGPT's iter_num, fairseq's num_updates). A user's checkpoint.step_from
# key:NAME goes first. step_count before iter_num: litgpt keeps both, iter_num counting micro-batches
# and step_count optimizer steps (the N of its step-N directories).
STEP_KEYS = ("global_step", "global_steps", "step", "iteration", "step_count", "iter_num", "iter", "num_updates")
_USER_STEP_KEY: ContextVar[str | None] = ContextVar("supervisor_user_step_key", default=None)


@contextlib.contextmanager
def user_step_key(key: str | None) -> Iterator[None]:
    """Look for ``key`` (checkpoint.step_from key:NAME; its last dotted part) before the usual
    step keys inside this block."""
    token = _USER_STEP_KEY.set(key.rsplit(".", 1)[-1] if key else None)
    try:
        yield
    finally:
        _USER_STEP_KEY.reset(token)


def step_keys() -> tuple[str, ...]:
    """The keys searched for the step, strongest first (a user key, then :data:`STEP_KEYS`)."""
    user = _USER_STEP_KEY.get()
    return (user, *STEP_KEYS) if user else STEP_KEYS
EPOCH_KEYS = ("epoch",)


class PickleScanError(Exception):
    """The pickle is malformed or truncated: it cannot be what a writer produced."""


class TruncatedPickle(PickleScanError):
    """The buffer ended before STOP (a reader holding only a prefix of the file may read more)."""


class _PastInput(TruncatedPickle):
    """An opcode needs bytes past the end of the whole input: reading more cannot help."""


@dataclass(frozen=True)
class Global:
    """A class or function the pickle names, as the loader would resolve it. Never imported."""

    module: str
    name: str

    def __str__(self) -> str:
        return f"{self.module}.{self.name}"


@dataclass(eq=False)
class Call:
    """A call the pickle asks for (REDUCE, NEWOBJ, INST, OBJ). Never made: only recorded."""

    func: Any
    args: Any
    state: Any = None
    items: dict = field(default_factory=dict)  # SETITEM(S) onto the result
    elements: list = field(default_factory=list)  # APPEND(S) onto the result

    @property
    def qualname(self) -> str:
        return str(self.func) if isinstance(self.func, Global) else ""

    def attrs(self) -> dict:
        """The attribute dict a BUILD would set (dataclass/object state), or {}."""
        state = self.state
        if isinstance(state, tuple) and len(state) == 2:  # (dict state, slot state)
            merged: dict = {}
            for part in state:
                if isinstance(part, dict):
                    merged.update(part)
            return merged
        return state if isinstance(state, dict) else {}


@dataclass(frozen=True, eq=False)  # identity hash: pid may be any (deep) structure
class PersistentRef:
    pid: Any


class Blob:
    """A str/bytes constant longer than ``MAX_SMALL_CONSTANT``: bounds-checked, not decoded."""

    __slots__ = ("kind", "length")

    def __init__(self, kind: str, length: int) -> None:
        self.kind, self.length = kind, length


@dataclass(frozen=True, slots=True)
class StorageRef:
    """One tensor storage record: torch stores its bytes as ``data/<key>`` (zip) or after the
    pickles (legacy)."""

    type_name: str  # "FloatStorage", "UntypedStorage", ...
    key: str
    location: str
    numel: int
    itemsize: int | None  # None for a storage type we do not know

    @property
    def nbytes(self) -> int | None:
        return None if self.itemsize is None else self.numel * self.itemsize


@dataclass(frozen=True)
class PickleScan:
    root: Any
    storages: tuple[StorageRef, ...]
    globals: frozenset[tuple[str, str]]  # (module, name) as the loader resolves them
    end: int  # offset just after STOP, relative to where the scan started
    ops: int


class _Key:
    """Stands in for a dict key that is not a plain scalar: hashing a (deeply nested) tuple
    recurses in C, so untrusted containers are never hashed."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


_PLAIN_KEYS = (str, int, float, bool, bytes, type(None))
_OD = Global("collections", "OrderedDict")
_TENSOR_REBUILDERS = frozenset({"_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_tensor_v3"})
_NODE_TYPES = (tuple, list, dict, Call, _Key, PersistentRef)
_U2 = struct.Struct("<H").unpack_from
_U4 = struct.Struct("<I").unpack_from
_I4 = struct.Struct("<i").unpack_from
_U8 = struct.Struct("<Q").unpack_from
_F8 = struct.Struct(">d").unpack_from


class _Dropped:
    """Stands in for what the lean mode let go of (see :class:`_LeanMemo`)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<dropped>"


DROPPED = _Dropped()
_SCALARS = (int, float, bool, type(None), Global)
_SHORT_TEXT = 256
_CHECK_EVERY = 1 << 16  # opcodes between two looks at the caps and the pages already read


def _keepable(value: Any) -> bool:
    return isinstance(value, _SCALARS) or (type(value) is str and len(value) <= _SHORT_TEXT)


_LEAN_MAPPING = 4096  # entries a mapping may reach through lean-mode SETITEMs
_LEAN_MEMO_BYTES = 16 << 20  # what the lean memo may hold, about


class _Lean:
    """The bounded mode a scan switches to after ``LEAN_AFTER_OPS`` opcodes (big pickles only).

    Every opcode is still decoded and every global still recorded, so the safety verdict is the
    same; what is kept shrinks to what the step and format readers need: containers and calls
    built from here on are :data:`DROPPED` placeholders (tuples stay: persistent ids are read from
    them), plain scalars are still set into the mappings built before (``global_step`` after a
    huge ``state_dict``), at most ``LEAN_KEEP`` of them and ``_LEAN_MAPPING`` per mapping, and the
    memo keeps short strings and globals (so ``STACK_GLOBAL`` names stay exact) up to about
    ``_LEAN_MEMO_BYTES``. A memo index whose object was let go reads as :data:`DROPPED`."""

    __slots__ = ("kept", "memo_bytes")

    def __init__(self) -> None:
        self.kept = 0
        self.memo_bytes = 0

    def setitem(self, target: Any, key: Any, value: Any) -> None:
        if target is DROPPED:
            return
        mapping = target if isinstance(target, dict) else target.items if isinstance(target, Call) else None
        if mapping is None:
            raise TypeError("SETITEM on a non-mapping")
        if self.kept < LEAN_KEEP and len(mapping) < _LEAN_MAPPING and _keepable(value):
            self.kept += 1
            _setitem(target, key, value)

    def append(self, target: Any, values: list) -> None:
        if target is not DROPPED and not isinstance(target, (list, Call)):
            raise TypeError("APPEND on a non-list")

    def keep_in_memo(self, value: Any) -> bool:
        if not _keepable(value):
            return False
        cost = 160 + (len(value) if type(value) is str else 0)  # the entry, the object, the text
        if self.memo_bytes + cost > _LEAN_MEMO_BYTES:
            return False
        self.memo_bytes += cost
        return True


class _LeanMemo(dict):
    """The memo in lean mode (see :class:`_Lean`). ``len`` counts every index set, as the
    unpickler's MEMOIZE does."""

    def __init__(self, base: dict, lean: _Lean) -> None:
        super().__init__()
        self.base, self.lean, self.count = base, lean, len(base)

    def __setitem__(self, key: int, value: Any) -> None:
        if key >= self.count:
            self.count = key + 1
        if self.lean.keep_in_memo(value):
            super().__setitem__(key, value)
        elif key in self.base:
            self.base[key] = DROPPED

    def __missing__(self, key: int) -> Any:
        return self.base.get(key, DROPPED)

    def __len__(self) -> int:
        return self.count


def _lean_reduce(func: Any, args: Any) -> Any:
    """REDUCE in lean mode: the ints of :func:`_reduce` (numpy scalars, ZeroStageEnum), else a
    placeholder."""
    value = _reduce(func, args)
    return value if type(value) is int else DROPPED


WINDOW = 8 << 20  # bytes of a file read at once when a scan reads through ``reader``
FIRST_WINDOW = 256 << 10  # the first read: most pickles (legacy headers, small data.pkl) fit


def scan_pickle(source: bytes | bytearray | memoryview | None, start: int = 0, *,
                max_ops: int = MAX_PICKLE_OPS, reader: Any = None, total: int | None = None) -> PickleScan:
    """Simulate the one pickle that starts at ``start`` in ``source``, or, with ``reader``
    (``reader(offset, length) -> bytes``, e.g. a pread of a file) and ``total`` (where the input
    ends), in a file read window by window: a big pickle never sits in memory whole.

    Raises :class:`TruncatedPickle` when the input ends first, :class:`PickleScanError` when it is
    not a well-formed pickle, :class:`~.limits.ScanLimitError` when it is over a cap."""
    if reader is None:
        data = source if isinstance(source, bytes) else bytes(source or b"")
        wbase, pos, final, total = 0, start, True, len(data)
    else:
        assert total is not None
        data, wbase, pos, final = _refill(reader, total, b"", start, 0, FIRST_WINDOW)
    end = len(data)
    stack: list = []
    metastack: list[list] = []
    memo: dict[int, Any] = {}
    storages: dict[str, StorageRef] = {}
    names: set[tuple[str, str]] = set()
    proto = 0
    ops = 0
    op_at = pos
    check_at = min(max_ops, _CHECK_EVERY)
    lean: _Lean | None = None
    setitem: Any = _setitem
    while True:  # one pass per window: an opcode cut by the window's end is read again after a refill
        try:
            while True:
                op_at = pos
                if pos >= end:
                    raise TruncatedPickle("pickle ended without STOP (truncated)")
                code = data[pos]
                pos += 1
                ops += 1
                if ops > check_at:
                    if ops > max_ops:
                        raise ScanLimitError(f"too large to scan: more than {max_ops:,} pickle opcodes")
                    check_at = min(max_ops, ops + _CHECK_EVERY)
                    if len(names) > MAX_GLOBALS:
                        raise ScanLimitError(f"too large to scan: names more than {MAX_GLOBALS:,} different globals")
                    if len(metastack) > MAX_NESTING:  # a pickler cannot write MARKs this deep
                        raise ScanLimitError(f"too deeply nested to scan: more than {MAX_NESTING:,} open MARKs")
                    if lean is not None and len(stack) > LEAN_STACK:  # pickler output batches by 1,000
                        raise ScanLimitError(f"too large to scan: more than {LEAN_STACK:,} items on the "
                                             "pickle stack at once")
                    if lean is None and ops > LEAN_AFTER_OPS:
                        lean = _Lean()
                        memo = _LeanMemo(memo, lean)
                        setitem = lean.setitem
                # the frequent opcodes of torch pickles first
                if code == 0x71:  # BINPUT
                    _need(pos + 1, end)
                    memo[data[pos]] = stack[-1]
                    pos += 1
                elif code == 0x68:  # BINGET
                    _need(pos + 1, end)
                    stack.append(memo[data[pos]])
                    pos += 1
                elif code == 0x58:  # BINUNICODE
                    _need(pos + 4, end)
                    n = _U4(data, pos)[0]
                    stack.append(_text(data, pos + 4, n, end))
                    pos += 4 + n
                elif code == 0x28:  # MARK
                    metastack.append(stack)
                    stack = []
                elif code == 0x74:  # TUPLE
                    items = tuple(stack)
                    stack = metastack.pop()
                    stack.append(items)
                elif code == 0x52:  # REDUCE
                    args = stack.pop()
                    stack[-1] = _reduce(stack[-1], args) if lean is None else _lean_reduce(stack[-1], args)
                elif code == 0x4B:  # BININT1
                    _need(pos + 1, end)
                    stack.append(data[pos])
                    pos += 1
                elif code == 0x72:  # LONG_BINPUT
                    _need(pos + 4, end)
                    memo[_U4(data, pos)[0]] = stack[-1]
                    pos += 4
                elif code == 0x6A:  # LONG_BINGET
                    _need(pos + 4, end)
                    stack.append(memo[_U4(data, pos)[0]])
                    pos += 4
                elif code == 0x7D:  # EMPTY_DICT
                    stack.append({} if lean is None else DROPPED)
                elif code == 0x75:  # SETITEMS
                    pairs = stack
                    stack = metastack.pop()
                    if len(pairs) % 2:
                        raise PickleScanError(f"SETITEMS with an odd number of items at byte {op_at}")
                    target = stack[-1]
                    for i in range(0, len(pairs), 2):
                        setitem(target, pairs[i], pairs[i + 1])
                elif code == 0x51:  # BINPERSID
                    stack[-1] = _persistent(stack[-1], storages)
                elif code == 0x89:  # NEWFALSE
                    stack.append(False)
                elif code == 0x88:  # NEWTRUE
                    stack.append(True)
                elif code == 0x85:  # TUPLE1
                    stack[-1] = (stack[-1],)
                elif code == 0x86:  # TUPLE2
                    if len(stack) < 2:
                        raise IndexError
                    stack[-2:] = [(stack[-2], stack[-1])]
                elif code == 0x87:  # TUPLE3
                    if len(stack) < 3:
                        raise IndexError
                    stack[-3:] = [(stack[-3], stack[-2], stack[-1])]
                elif code == 0x29:  # EMPTY_TUPLE
                    stack.append(())
                elif code == 0x4E:  # NONE
                    stack.append(None)
                elif code == 0x4A:  # BININT
                    _need(pos + 4, end)
                    stack.append(_I4(data, pos)[0])
                    pos += 4
                elif code == 0x4D:  # BININT2
                    _need(pos + 2, end)
                    stack.append(_U2(data, pos)[0])
                    pos += 2
                elif code == 0x8C:  # SHORT_BINUNICODE
                    _need(pos + 1, end)
                    n = data[pos]
                    stack.append(_text(data, pos + 1, n, end))
                    pos += 1 + n
                elif code == 0x94:  # MEMOIZE
                    memo[len(memo)] = stack[-1]
                elif code == 0x2E:  # STOP
                    if len(stack) != 1 or metastack:
                        raise PickleScanError("pickle stack not balanced at STOP")
                    root = stack[0]
                    if ops > MAX_NESTING and _nesting_exceeds(root, MAX_NESTING):
                        raise ScanLimitError(f"too deeply nested to scan: containers nested more than "
                                             f"{MAX_NESTING:,} deep")
                    if len(names) > MAX_GLOBALS:
                        raise ScanLimitError(f"too large to scan: names more than {MAX_GLOBALS:,} different globals")
                    return PickleScan(root, tuple(storages.values()), frozenset(names), wbase + pos - start, ops)
                else:
                    pos, stack, proto = _rare(code, data, pos, end, stack, metastack, memo, storages, names, proto,
                                              lean, total - wbase)
        except TruncatedPickle as exc:
            if final or isinstance(exc, _PastInput):
                raise
            ops -= pos != op_at  # the opcode is read again whole
            data, wbase, pos, final = _refill(reader, total, data, wbase, op_at)
            end = len(data)
        except (PickleScanError, ScanLimitError):
            raise
        except (IndexError, KeyError, TypeError, ValueError, AttributeError, OverflowError, struct.error) as exc:
            raise PickleScanError(f"malformed pickle near byte {wbase + op_at - start}: {type(exc).__name__}") from None


def _refill(reader: Any, total: int, data: bytes, wbase: int, pos: int,
            size: int | None = None) -> tuple[bytes, int, int, bool]:
    """The next window: the old one from ``pos`` on (an opcode it cut), then up to ``size`` more
    bytes; or, when ``pos`` lies past it (a long constant skipped, not read), from there.
    Returns (data, wbase, pos, final)."""
    here = wbase + pos
    keep = data[pos:] if pos < len(data) else b""
    read_from = here + len(keep)
    want = max(0, min(WINDOW if size is None else size, total - read_from))
    more = reader(read_from, want) if want else b""
    final = len(more) < want or read_from + len(more) >= total
    return keep + more, here, 0, final


def _need(upto: int, end: int) -> None:
    if upto > end:
        raise TruncatedPickle("pickle ended inside an opcode argument (truncated)")


def _text(data: bytes, pos: int, n: int, end: int) -> Any:
    if n > MAX_SMALL_CONSTANT:  # skipped, not read: the next read past it finds a truncation
        return Blob("str", n)
    _need(pos + n, end)
    return str(data[pos:pos + n], "utf-8", "surrogatepass")


def _raw(data: bytes, pos: int, n: int, end: int) -> Any:
    if n > MAX_SMALL_CONSTANT:
        return Blob("bytes", n)
    _need(pos + n, end)
    return data[pos:pos + n]


def _line(data: bytes, pos: int, end: int) -> tuple[bytes, int]:
    newline = data.find(b"\n", pos, end)
    if newline < 0:
        raise TruncatedPickle("pickle ended inside a text argument (truncated)")
    return data[pos:newline], newline + 1


def _mark_items(stack: list, metastack: list[list]) -> tuple[list, list]:
    """(the stack below the topmost MARK, the items above it)."""
    return metastack.pop(), stack


def _global(module: str, name: str, proto: int, names: set) -> Global:
    module, name = resolve(module, name, proto)
    names.add((module, name))
    return Global(module, name)


def _rare(code: int, data: Any, pos: int, end: int, stack: list, metastack: list[list], memo: dict,
          storages: dict, names: set, proto: int, lean: _Lean | None = None,
          input_end: int | None = None) -> tuple[int, list, int]:
    """Every other opcode: returns (position, stack, protocol). ``input_end``: where the whole
    input ends, relative to ``data`` (past the window when reading a file window by window)."""
    input_end = end if input_end is None else input_end
    push = stack.append
    if code == 0x80:  # PROTO
        _need(pos + 1, end)
        proto = data[pos]
        if proto > 5:
            raise PickleScanError(f"unsupported pickle protocol {proto}")
        return pos + 1, stack, proto
    if code == 0x95:  # FRAME: the frame's bytes follow inline; the unpickler reads it whole
        _need(pos + 8, end)
        if pos + 8 + _U8(data, pos)[0] > input_end:
            raise _PastInput("a pickle frame runs past the end of the input (truncated)")
        return pos + 8, stack, proto
    if code == 0x63 or code == 0x69:  # GLOBAL, INST: "module\nname\n"
        module, pos = _line(data, pos, end)
        name, pos = _line(data, pos, end)
        target = _global(module.decode("utf-8"), name.decode("utf-8"), proto, names)
        if code == 0x63:
            push(target)
            return pos, stack, proto
        stack, items = _mark_items(stack, metastack)
        stack.append(Call(target, tuple(items)))
        return pos, stack, proto
    if code == 0x93:  # STACK_GLOBAL
        name = stack.pop()
        module = stack.pop()
        if module is DROPPED or name is DROPPED:  # lean mode let the string go: the name is unknown
            raise ScanLimitError("too large to scan: a global is named by a string the bounded scan no longer holds")
        if type(module) is not str or type(name) is not str:
            raise PickleScanError("STACK_GLOBAL needs two strings")
        push(_global(module, name, proto, names))
        return pos, stack, proto
    if code in (0x82, 0x83, 0x84):  # EXT1/2/4: a name from the loading process's copyreg registry
        width = {0x82: 1, 0x83: 2, 0x84: 4}[code]
        _need(pos + width, end)
        ext = int.from_bytes(data[pos:pos + width], "little")
        names.add(("<copyreg extension>", str(ext)))
        push(Global("<copyreg extension>", str(ext)))
        return pos + width, stack, proto
    if code == 0x5D or code == 0x8F:  # EMPTY_LIST, EMPTY_SET
        push([] if lean is None else DROPPED)
    elif code == 0x6C:  # LIST
        stack, items = _mark_items(stack, metastack)
        stack.append(list(items) if lean is None else DROPPED)
    elif code == 0x91:  # FROZENSET
        stack, items = _mark_items(stack, metastack)
        stack.append(tuple(items))
    elif code == 0x64:  # DICT
        stack, items = _mark_items(stack, metastack)
        if len(items) % 2:
            raise PickleScanError("DICT with an odd number of items")
        out: dict = {}
        for i in range(0, len(items), 2 if lean is None else len(items) + 2):
            _setitem(out, items[i], items[i + 1])
        stack.append(out if lean is None else DROPPED)
    elif code == 0x73:  # SETITEM
        value = stack.pop()
        key = stack.pop()
        (lean.setitem if lean else _setitem)(stack[-1], key, value)
    elif code == 0x61:  # APPEND
        value = stack.pop()
        (lean.append if lean else _append)(stack[-1], [value])
    elif code == 0x65 or code == 0x90:  # APPENDS, ADDITEMS
        stack, items = _mark_items(stack, metastack)
        (lean.append if lean else _append)(stack[-1], items)
    elif code == 0x30:  # POP
        if stack:
            stack.pop()
        else:
            stack = metastack.pop()
    elif code == 0x31:  # POP_MARK
        stack = metastack.pop()
    elif code == 0x32:  # DUP
        push(stack[-1])
    elif code == 0x62:  # BUILD
        state = stack.pop()
        target = stack[-1]
        if isinstance(target, Call):
            target.state = state
    elif code == 0x81:  # NEWOBJ
        args = stack.pop()
        cls = stack.pop()
        push(Call(cls, args) if lean is None else DROPPED)
    elif code == 0x92:  # NEWOBJ_EX
        kwargs = stack.pop()
        args = stack.pop()
        cls = stack.pop()
        push(Call(cls, (args, kwargs)) if lean is None else DROPPED)
    elif code == 0x6F:  # OBJ
        stack, items = _mark_items(stack, metastack)
        if not items:
            raise PickleScanError("OBJ without a class")
        stack.append(Call(items[0], tuple(items[1:])))
    elif code == 0x50:  # PERSID
        pid, pos = _line(data, pos, end)
        push(PersistentRef(pid.decode("ascii")))
    elif code in (0x70, 0x67):  # PUT, GET (text index)
        text, pos = _line(data, pos, end)
        index = _small_int(text)
        if code == 0x70:
            memo[index] = stack[-1]
        else:
            push(memo[index])
    elif code == 0x49:  # INT: "01"/"00" are True/False in protocol 0
        text, pos = _line(data, pos, end)
        push(True if text == b"01" else False if text == b"00" else _small_int(text))
    elif code == 0x4C:  # LONG
        text, pos = _line(data, pos, end)
        push(_small_int(text[:-1] if text.endswith(b"L") else text))
    elif code == 0x46:  # FLOAT
        text, pos = _line(data, pos, end)
        push(float(text))
    elif code == 0x47:  # BINFLOAT
        _need(pos + 8, end)
        push(_F8(data, pos)[0])
        pos += 8
    elif code in (0x8A, 0x8B):  # LONG1, LONG4
        width = 1 if code == 0x8A else 4
        _need(pos + width, end)
        n = data[pos] if width == 1 else _I4(data, pos)[0]
        if n < 0:
            raise PickleScanError("negative LONG4 length")
        pos += width
        if n <= MAX_SMALL_CONSTANT:
            _need(pos + n, end)
        push(int.from_bytes(data[pos:pos + n], "little", signed=True) if n <= MAX_SMALL_CONSTANT else Blob("int", n))
        pos += n
    elif code == 0x53:  # STRING: a quoted, escaped line
        text, pos = _line(data, pos, end)
        if len(text) < 2 or text[0] != text[-1] or text[:1] not in (b"'", b'"'):
            raise PickleScanError("STRING argument not quoted")
        push(_maybe_ascii(codecs.escape_decode(text[1:-1])[0]))
    elif code in (0x54, 0x55):  # BINSTRING, SHORT_BINSTRING (protocol 0-2 str)
        width = 4 if code == 0x54 else 1
        _need(pos + width, end)
        n = _I4(data, pos)[0] if width == 4 else data[pos]
        if n < 0:
            raise PickleScanError("negative BINSTRING length")
        raw = _raw(data, pos + width, n, end)
        push(_maybe_ascii(raw) if isinstance(raw, bytes) else raw)
        pos += width + n
    elif code == 0x56:  # UNICODE
        text, pos = _line(data, pos, end)
        push(text.decode("raw-unicode-escape"))
    elif code == 0x8D:  # BINUNICODE8
        _need(pos + 8, end)
        n = _U8(data, pos)[0]
        push(_text(data, pos + 8, n, end))
        pos += 8 + n
    elif code in (0x42, 0x43, 0x8E, 0x96):  # BINBYTES, SHORT_BINBYTES, BINBYTES8, BYTEARRAY8
        width = {0x42: 4, 0x43: 1, 0x8E: 8, 0x96: 8}[code]
        _need(pos + width, end)
        n = data[pos] if width == 1 else _U4(data, pos)[0] if width == 4 else _U8(data, pos)[0]
        push(_raw(data, pos + width, n, end))
        pos += width + n
    elif code == 0x98:  # READONLY_BUFFER
        pass
    elif code == 0x97:  # NEXT_BUFFER
        raise PickleScanError("out-of-band buffer (protocol 5) with no buffers: cannot be loaded")
    else:
        raise PickleScanError(f"unknown pickle opcode 0x{code:02x}")
    return pos, stack, proto


def _small_int(text: bytes) -> int:
    """A decimal argument of a text opcode (int() refuses more than 4,300 digits: ValueError)."""
    return int(text)


def _maybe_ascii(raw: bytes) -> Any:
    try:
        return raw.decode("ascii")
    except UnicodeDecodeError:
        return raw


def _setitem(target: Any, key: Any, value: Any) -> None:
    if not (type(key) in _PLAIN_KEYS or isinstance(key, (Call, Global, PersistentRef))):
        key = _Key(key)
    if isinstance(target, dict):
        target[key] = value
    elif isinstance(target, Call):
        target.items[key] = value
    else:
        raise TypeError("SETITEM on a non-mapping")


def _append(target: Any, values: list) -> None:
    if isinstance(target, list):
        target.extend(values)
    elif isinstance(target, Call):
        target.elements.extend(values)
    else:
        raise TypeError("APPEND on a non-list")


def _persistent(pid: Any, storages: dict[str, StorageRef]) -> PersistentRef:
    """One record per storage key (a storage shared by many tensors is named many times)."""
    if isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage":
        storage_type, key, location, numel = pid[1], pid[2], pid[3], pid[4]
        type_name = storage_type.name if isinstance(storage_type, Global) else (
            storage_type if isinstance(storage_type, str) else "")
        if type(numel) is int and isinstance(key, (str, int)) and type(key) is not bool and str(key) not in storages:
            if len(storages) >= MAX_STORAGES:
                raise ScanLimitError(f"too large to scan: more than {MAX_STORAGES:,} tensor storages")
            storages[str(key)] = StorageRef(type_name, str(key), location if isinstance(location, str) else "",
                                            numel, STORAGE_ITEMSIZE.get(type_name))
    return PersistentRef(pid)


_NOT_CALLABLE = (int, float, bool, type(None), str, bytes, tuple, list, dict, Blob, PersistentRef)


def _reduce(func: Any, args: Any) -> Any:
    """Record a call; a few well-known shapes are kept as plain values so their contents stay
    readable (OrderedDict is a dict, a Parameter is its tensor, a numpy int scalar is an int,
    DeepSpeed's ZeroStageEnum(2) is 2). Calling what cannot be called (a number, a string, a
    container, a tensor) fails the real load: malformed."""
    if isinstance(func, _NOT_CALLABLE) or is_tensor(func):
        what = "tensor" if is_tensor(func) else type(func).__name__
        raise PickleScanError(f"a call of a {what}, which cannot be called (damaged memo or stack)")
    if isinstance(func, Global):
        if func == _OD and not args:
            return {}
        if func.module == "torch._utils" and func.name == "_rebuild_parameter" and args:
            return args[0]
        if func.module.startswith("numpy") and func.name == "scalar":
            value = _numpy_int(args)
            if value is not None:
                return value
        if (func.name == "ZeroStageEnum" and isinstance(args, tuple) and len(args) == 1
                and type(args[0]) is int):
            return args[0]
    return Call(func, args)


def _numpy_int(args: Any) -> int | None:
    try:
        dtype, raw = args
        code = dtype.args[0]
        if not isinstance(raw, (bytes, str)) or not isinstance(code, str) or code[:1] not in "iu":
            return None
        data = raw.encode("latin-1") if isinstance(raw, str) else raw
        if len(data) > 16:
            return None
        state = dtype.state
        big = isinstance(state, tuple) and len(state) > 1 and state[1] == ">"
        order: Literal["little", "big"] = "big" if big else "little"
        return int.from_bytes(data, order, signed=code[0] == "i")
    except (TypeError, ValueError, AttributeError, IndexError, UnicodeEncodeError):
        return None


def _children(node: Any) -> Iterator[Any]:
    if isinstance(node, (tuple, list)):
        return iter(node)
    if isinstance(node, dict):
        return iter((*node.keys(), *node.values()))
    if isinstance(node, Call):
        return iter((node.func, node.args, node.state, node.items, node.elements))
    if isinstance(node, _Key):
        return iter((node.value,))
    return iter((node.pid,))  # PersistentRef


def _nesting_exceeds(root: Any, limit: int) -> bool:
    """Whether containers nest more than ``limit`` deep under ``root``: one depth-first pass with
    an explicit stack and memoised subtree heights (shared subtrees are walked once; a reference
    back to a container on the current path, a cycle, adds no depth)."""
    if not isinstance(root, _NODE_TYPES):
        return False
    height: dict[int, int] = {}
    on_path = {id(root)}
    path: list[tuple[Any, Iterator[Any]]] = [(root, _children(root))]
    best = [0]
    while path:
        node, children = path[-1]
        for child in children:
            if not isinstance(child, _NODE_TYPES):
                continue
            known = height.get(id(child))
            if known is not None:
                if known > best[-1]:
                    best[-1] = known
                    if len(path) + known > limit:
                        return True
                continue
            if id(child) in on_path:
                continue
            if len(path) >= limit:
                return True
            on_path.add(id(child))
            path.append((child, _children(child)))
            best.append(0)
            break
        else:
            path.pop()
            on_path.discard(id(node))
            done = best.pop() + 1
            height[id(node)] = done
            if best and done > best[-1]:
                best[-1] = done
    return False


def is_tensor(value: Any) -> bool:
    """A value the pickle would rebuild as a tensor."""
    return isinstance(value, Call) and isinstance(value.func, Global) and value.func.name in _TENSOR_REBUILDERS


def as_mapping(value: Any) -> dict | None:
    """A dict, or the items of a mapping-like Call (OrderedDict subclasses, AttributeDict)."""
    if isinstance(value, dict):
        return value
    if isinstance(value, Call) and value.items:
        return value.items
    return None


def plain_int(value: Any) -> int | None:
    """``value`` when it is an int (not a bool) of a plausible step's size, else None."""
    return value if type(value) is int and 0 <= value <= MAX_STEP else None


def find_value(root: Any, keys: tuple[str, ...], accept: Any, depth: int = 1) -> Any:
    """The first value ``accept`` takes under one of ``keys`` in the top-level mapping, else in
    mappings directly below it (``meta: {iter: ...}``), down to ``depth``. Key order = priority."""
    found = find_item(root, keys, accept, depth)
    return None if found is None else found[1]


def find_item(root: Any, keys: tuple[str, ...], accept: Any, depth: int = 1) -> tuple[str, Any] | None:
    """(key, value) of :func:`find_value`."""
    level = [root]
    for _ in range(depth + 1):
        next_level: list[Any] = []
        for mapping in filter(None, map(as_mapping, level)):
            for key in keys:
                value = mapping.get(key)
                if value is not None and accept(value):
                    return key, value
            next_level.extend(v for v in mapping.values() if as_mapping(v) is not None)
        level = next_level
    return None


def find_int(root: Any, keys: tuple[str, ...], depth: int = 1) -> int | None:
    return find_value(root, keys, lambda v: plain_int(v) is not None, depth)


def find_step(root: Any) -> int | None:
    """The training step stored in the object (``global_step``, ``step``, ...), if plain."""
    return find_int(root, step_keys())


def find_epoch(root: Any) -> int | None:
    return find_int(root, EPOCH_KEYS)


def iter_calls(root: Any, name: str) -> Iterator[Call]:
    """Every recorded call whose function is named ``name``, anywhere in the tree."""
    seen: set[int] = set()
    todo = [root]
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, dict):
            todo.extend(node.keys())
            todo.extend(node.values())
        elif isinstance(node, (list, tuple)):
            todo.extend(node)
        elif isinstance(node, Call):
            if isinstance(node.func, Global) and node.func.name == name:
                yield node
            todo.extend((node.args, node.state, node.items, node.elements))
        elif isinstance(node, _Key):
            todo.append(node.value)


def describe(names: tuple[str, ...], limit: int = 3) -> str:
    """Global names for a reason: printable, each cut to 120 characters, at most ``limit``."""
    shown = [ascii(n)[1:-1][:120] for n in names[:limit]]
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(shown) + more


# torch.serialization._get_layout looks a layout up by its name: any other name fails the load.
TORCH_LAYOUTS = frozenset({"torch.strided", "torch.sparse_coo", "torch.sparse_csr", "torch.sparse_csc",
                           "torch.sparse_bsr", "torch.sparse_bsc", "torch._mkldnn", "torch.jagged"})


def unknown_layout(root: Any) -> str | None:
    """The first tensor layout name the loader could not look up (a damaged string), or None."""
    for call in iter_calls(root, "_get_layout"):
        arg = call.args[0] if isinstance(call.args, tuple) and len(call.args) == 1 else None
        if not isinstance(arg, str) or arg not in TORCH_LAYOUTS:
            return ascii(arg)[:80]
    return None
