"""Inert pickle scan (L3): walk a pickle's opcodes with :func:`pickletools.genops` and simulate
the unpickler's stack with plain placeholders. Nothing is imported, called or constructed: a
``GLOBAL`` becomes a :class:`Global` name, a ``REDUCE``/``NEWOBJ`` a :class:`Call` record, a
persistent id a :class:`PersistentRef`. A checkpoint's pickle may be hostile (``__reduce__`` can
run any code), so this is the only way the supervisor looks inside one.

What comes out: the tensor storage records torch writes as persistent ids
``('storage', StorageType, key, location, numel)``, the object tree with scalars intact (so
``global_step``, ``dp_world_size`` and DCP's ``_StorageInfo`` extents can be read), and where the
pickle ended (the legacy torch format is several pickles back to back).
"""

from __future__ import annotations

import io
import pickletools
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Iterable, Iterator

# Element sizes of torch's pickled storage types (torch.storage._dtype_to_storage_type_map).
STORAGE_ITEMSIZE: dict[str, int] = {
    "DoubleStorage": 8, "FloatStorage": 4, "HalfStorage": 2, "BFloat16Storage": 2,
    "LongStorage": 8, "IntStorage": 4, "ShortStorage": 2, "CharStorage": 1, "ByteStorage": 1,
    "BoolStorage": 1, "ComplexDoubleStorage": 16, "ComplexFloatStorage": 8, "QInt8Storage": 1,
    "QInt32Storage": 4, "QUInt8Storage": 1, "QUInt4x2Storage": 1, "QUInt2x4Storage": 1,
    "UntypedStorage": 1,  # numel is nbytes for untyped storages (new dtypes: float8, uint16, ...)
}

# Keys that hold the training step, strongest first (Lightning, DeepSpeed, plain loops, Megatron).
STEP_KEYS = ("global_step", "global_steps", "step", "iteration", "iter", "num_updates")
EPOCH_KEYS = ("epoch",)


class PickleScanError(Exception):
    """The pickle is malformed or truncated: it cannot be what a writer produced."""


@dataclass(frozen=True)
class Global:
    """A class or function the pickle names. Never imported."""

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


@dataclass(frozen=True)
class PersistentRef:
    pid: Any


@dataclass(frozen=True)
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
    globals: frozenset[str]
    end: int  # offset just after STOP, relative to where the scan started
    ops: int


class _Key:
    """Stands in for an unhashable dict key (only a hostile or broken pickle has one)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


(_PUT, _GET, _PUSH, _MARK, _MARK_TUPLE, _REDUCE, _CONST, _SMALL_TUPLE, _BINPERSID, _MEMOIZE, _NO_OP,
 _STOP, _OTHER) = range(13)
_KIND: dict[str, int] = {
    **dict.fromkeys(("PUT", "BINPUT", "LONG_BINPUT"), _PUT),
    **dict.fromkeys(("GET", "BINGET", "LONG_BINGET"), _GET),
    **dict.fromkeys(
        ("INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "STRING", "BINSTRING",
         "SHORT_BINSTRING", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8", "UNICODE",
         "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "FLOAT", "BINFLOAT"), _PUSH),
    "MARK": _MARK, "TUPLE": _MARK_TUPLE, "REDUCE": _REDUCE,
    **dict.fromkeys(("NONE", "NEWTRUE", "NEWFALSE", "EMPTY_TUPLE"), _CONST),
    **dict.fromkeys(("TUPLE1", "TUPLE2", "TUPLE3"), _SMALL_TUPLE),
    "BINPERSID": _BINPERSID, "MEMOIZE": _MEMOIZE,
    **dict.fromkeys(("PROTO", "FRAME", "READONLY_BUFFER"), _NO_OP),
    "STOP": _STOP,
}
_CONSTANTS: dict[str, Any] = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False, "EMPTY_TUPLE": ()}
_SMALL_TUPLE_LEN = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}
_OD = Global("collections", "OrderedDict")
_TENSOR_REBUILDERS = frozenset({"_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_tensor_v3"})


def scan_pickle(source: bytes | bytearray | memoryview | BinaryIO, max_ops: int = 50_000_000) -> PickleScan:
    """Simulate one pickle from ``source`` (bytes, or a binary file positioned at its start).

    Raises :class:`PickleScanError` when the stream is truncated or not a well-formed pickle.
    """
    stream = io.BytesIO(bytes(source)) if isinstance(source, (bytes, bytearray, memoryview)) else source
    start = stream.tell()
    stack: list = []
    metastack: list[list] = []
    memo: dict[int, Any] = {}
    storages: list[StorageRef] = []
    names: set[str] = set()
    ops = 0
    pos = 0
    try:
        for opcode, arg, pos in pickletools.genops(stream):
            ops += 1
            kind = _KIND.get(opcode.name, _OTHER)
            # the frequent opcodes of torch pickles first; the rest in _apply
            if kind == _PUT:
                memo[arg] = stack[-1]
            elif kind == _GET:
                stack.append(memo[arg])
            elif kind == _PUSH:
                stack.append(arg)
            elif kind == _MARK:
                metastack.append(stack)
                stack = []
            elif kind == _MARK_TUPLE:
                items = tuple(stack)
                stack = metastack.pop()
                stack.append(items)
            elif kind == _REDUCE:
                args = stack.pop()
                stack[-1] = _reduce(stack[-1], args)
            elif kind == _CONST:
                stack.append(_CONSTANTS[opcode.name])
            elif kind == _SMALL_TUPLE:
                n = _SMALL_TUPLE_LEN[opcode.name]
                items = tuple(stack[-n:])
                if len(items) != n:
                    raise IndexError("stack underflow")
                del stack[-n:]
                stack.append(items)
            elif kind == _BINPERSID:
                stack[-1] = _persistent(stack[-1], storages)
            elif kind == _MEMOIZE:
                memo[len(memo)] = stack[-1]
            elif kind == _NO_OP:
                pass
            elif kind == _STOP:
                if len(stack) != 1 or metastack:
                    raise PickleScanError("pickle stack not balanced at STOP")
                root = stack.pop()
                end = (stream.tell() - start) if hasattr(stream, "tell") else pos + 1
                return PickleScan(root, tuple(storages), frozenset(names), end, ops)
            else:
                if ops > max_ops:
                    raise PickleScanError(f"more than {max_ops} pickle opcodes")
                stack, result = _apply(opcode.name, arg, stack, metastack, memo, storages, names)
                if result is not _NOTHING:
                    stack.append(result)
    except PickleScanError:
        raise
    except ValueError as exc:  # genops: truncated or unknown opcode
        raise PickleScanError(f"malformed or truncated pickle: {exc}") from None
    except (IndexError, KeyError, TypeError, AttributeError) as exc:
        raise PickleScanError(f"malformed pickle near byte {pos}: {type(exc).__name__}") from None
    raise PickleScanError("pickle ended without STOP (truncated)")


_NOTHING = object()


def _pop_mark(stack: list, metastack: list[list]) -> tuple[list, list]:
    items = stack
    return metastack.pop(), items


def _apply(
    name: str, arg: Any, stack: list, metastack: list[list], memo: dict, storages: list, names: set
) -> tuple[list, Any]:
    """One structural opcode; returns (stack, value to push or _NOTHING)."""
    if name == "EMPTY_DICT":
        return stack, {}
    if name == "EMPTY_LIST":
        return stack, []
    if name == "EMPTY_SET":
        return stack, []
    if name == "LIST":
        stack, items = _pop_mark(stack, metastack)
        return stack, list(items)
    if name == "FROZENSET":
        stack, items = _pop_mark(stack, metastack)
        return stack, tuple(items)
    if name == "DICT":
        stack, items = _pop_mark(stack, metastack)
        out: dict = {}
        for i in range(0, len(items) - 1, 2):
            _setitem(out, items[i], items[i + 1])
        return stack, out
    if name == "SETITEM":
        value = stack.pop()
        key = stack.pop()
        _setitem(stack[-1], key, value)
        return stack, _NOTHING
    if name == "SETITEMS":
        stack, items = _pop_mark(stack, metastack)
        target = stack[-1]
        for i in range(0, len(items) - 1, 2):
            _setitem(target, items[i], items[i + 1])
        return stack, _NOTHING
    if name == "APPEND":
        value = stack.pop()
        _append(stack[-1], [value])
        return stack, _NOTHING
    if name in ("APPENDS", "ADDITEMS"):
        stack, items = _pop_mark(stack, metastack)
        _append(stack[-1], items)
        return stack, _NOTHING
    if name == "POP":
        if stack:
            stack.pop()
        else:
            stack = metastack.pop()
        return stack, _NOTHING
    if name == "POP_MARK":
        stack, _ = _pop_mark(stack, metastack)
        return stack, _NOTHING
    if name == "DUP":
        return stack, stack[-1]
    if name == "GLOBAL":
        module, _, attr = str(arg).partition(" ")
        names.add(f"{module}.{attr}")
        return stack, Global(module, attr)
    if name == "STACK_GLOBAL":
        attr = stack.pop()
        module = stack.pop()
        if not isinstance(module, str) or not isinstance(attr, str):
            raise TypeError("STACK_GLOBAL needs two strings")
        names.add(f"{module}.{attr}")
        return stack, Global(module, attr)
    if name in ("EXT1", "EXT2", "EXT4"):
        return stack, Global("<extension>", str(arg))
    if name == "BUILD":
        state = stack.pop()
        target = stack[-1]
        if isinstance(target, Call):
            target.state = state
        return stack, _NOTHING
    if name == "NEWOBJ":
        args = stack.pop()
        cls = stack.pop()
        return stack, Call(cls, args)
    if name == "NEWOBJ_EX":
        kwargs = stack.pop()
        args = stack.pop()
        cls = stack.pop()
        return stack, Call(cls, (args, kwargs))
    if name == "INST":
        module, _, attr = str(arg).partition(" ")
        names.add(f"{module}.{attr}")
        stack, items = _pop_mark(stack, metastack)
        return stack, Call(Global(module, attr), tuple(items))
    if name == "OBJ":
        stack, items = _pop_mark(stack, metastack)
        return stack, Call(items[0], tuple(items[1:]))
    if name == "PERSID":
        return stack, _persistent(arg, storages)
    if name == "NEXT_BUFFER":
        return stack, Call(Global("<buffer>", "out-of-band"), ())
    raise PickleScanError(f"unsupported pickle opcode {name}")


def _setitem(target: Any, key: Any, value: Any) -> None:
    try:
        hash(key)
    except TypeError:
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


def _persistent(pid: Any, storages: list[StorageRef]) -> PersistentRef:
    if isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage":
        storage_type, key, location, numel = pid[1], pid[2], pid[3], pid[4]
        type_name = storage_type.name if isinstance(storage_type, Global) else str(storage_type)
        if isinstance(numel, int) and not isinstance(numel, bool):
            storages.append(
                StorageRef(type_name, str(key), str(location), numel, STORAGE_ITEMSIZE.get(type_name))
            )
    return PersistentRef(pid)


def _reduce(func: Any, args: Any) -> Any:
    """Record a call; a few well-known shapes are kept as plain values so their contents stay
    readable (OrderedDict is a dict, a Parameter is its tensor, a numpy int scalar is an int)."""
    if isinstance(func, Global):
        if func == _OD and not args:
            return {}
        if func.module == "torch._utils" and func.name == "_rebuild_parameter" and args:
            return args[0]
        if func.module.startswith("numpy") and func.name == "scalar":
            value = _numpy_int(args)
            if value is not None:
                return value
        if func.module == "copyreg" and func.name == "_reconstructor" and args:
            return Call(args[0], args[1:])
    return Call(func, args)


def _numpy_int(args: Any) -> int | None:
    try:
        dtype, raw = args
        code = dtype.args[0]
        if not isinstance(raw, (bytes, str)) or not isinstance(code, str) or code[:1] not in "iu":
            return None
        data = raw.encode("latin-1") if isinstance(raw, str) else raw
        state = dtype.state
        order = "big" if isinstance(state, tuple) and len(state) > 1 and state[1] == ">" else "little"
        return int.from_bytes(data, order, signed=code[0] == "i")
    except (TypeError, ValueError, AttributeError, IndexError):
        return None


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


def _plain_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def find_value(root: Any, keys: tuple[str, ...], accept: Any, depth: int = 1) -> Any:
    """The first value ``accept`` takes under one of ``keys`` in the top-level mapping, else in
    mappings directly below it (``meta: {iter: ...}``), down to ``depth``. Key order = priority."""
    level = [root]
    for _ in range(depth + 1):
        next_level = []
        for mapping in filter(None, map(as_mapping, level)):
            for key in keys:
                value = mapping.get(key)
                if value is not None and accept(value):
                    return value
            next_level.extend(v for v in mapping.values() if as_mapping(v) is not None)
        level = next_level
    return None


def find_int(root: Any, keys: tuple[str, ...], depth: int = 1) -> int | None:
    return find_value(root, keys, lambda v: _plain_int(v) is not None, depth)


def embedded_step(root: Any) -> int | None:
    return find_int(root, STEP_KEYS)


def embedded_epoch(root: Any) -> int | None:
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


# Globals through which loading a pickle runs code or touches the system. A checkpoint naming one
# is hostile or broken whatever its structure: it must never become a resume point, because a child
# that loads with weights_only=False would execute it. (Ordinary checkpoints name torch, numpy,
# collections, argparse, omegaconf or framework classes: those are left alone.)
_UNSAFE_MODULES = frozenset({
    "os", "posix", "nt", "subprocess", "sys", "runpy", "importlib", "pty", "socket", "shutil",
    "pickle", "_pickle", "marshal", "types", "ctypes", "code", "codeop", "commands", "webbrowser",
    "pdb", "timeit", "multiprocessing", "asyncio", "signal", "tempfile", "glob", "io", "_io",
})
_UNSAFE_BUILTINS = frozenset({
    "eval", "exec", "compile", "__import__", "open", "getattr", "setattr", "delattr", "globals",
    "locals", "vars", "input", "breakpoint", "exit", "quit", "help", "memoryview",
})
_UNSAFE_QUALIFIED = frozenset({
    "operator.attrgetter", "operator.methodcaller", "functools.partial", "builtins.apply",
    "platform.popen", "torch.load", "torch.hub.load", "torch.jit.load", "numpy.load",
})


def unsafe_globals(names: Iterable[str]) -> tuple[str, ...]:
    """The names in a pickle's GLOBAL/STACK_GLOBAL records that would run code when loaded."""
    bad = []
    for name in names:
        module, _, attr = name.rpartition(".")
        top = module.split(".", 1)[0]
        if (top in _UNSAFE_MODULES or name in _UNSAFE_QUALIFIED
                or (module in ("builtins", "__builtin__") and attr in _UNSAFE_BUILTINS)):
            bad.append(name)
    return tuple(sorted(set(bad)))
