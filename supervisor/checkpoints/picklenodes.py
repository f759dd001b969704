"""What the inert pickle scan (supervisor/checkpoints/picklescan.py) builds, and how the rest of
the supervisor reads it: placeholders for what a pickle names (a :class:`Global` is a name, a
:class:`Call` a record of a call never made), and queries over that tree (a tensor, a mapping, the
step). Nothing here imports, calls or constructs anything a pickle names."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from .limits import MAX_STEP

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


_TENSOR_REBUILDERS = frozenset({"_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_tensor_v3"})


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
