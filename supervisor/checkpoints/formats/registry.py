"""The ordered registry of checkpoint formats, and detection through it.

Detection precedence (first match wins):

* a file: empty -> each registered file format's ``detect`` in registration order (the built-ins:
  safetensors, torch zip, torch legacy, plain pickle; then any format registered later, unless it
  asked to go before one of them) -> zero-filled -> text -> unknown.
* a directory: each registered directory format's ``detect`` in registration order (the built-ins:
  DCP, Lightning DeepSpeed, HF Trainer, DeepSpeed) -> the fallback (any other directory).

Registering a format is the only change a new format needs outside its own module
(docs/extending/checkpoint-format.md).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..naming import add_checkpoint_suffixes, remove_checkpoint_suffixes
from .base import DirFormat, FileFormat
from .kinds import DIRECTORY, EMPTY, HEAD_BYTES, TEXT, UNKNOWN, ZEROED

_FILE: list[FileFormat] = []
_DIR: list[DirFormat] = []
_FALLBACK_DIR: list[DirFormat] = []  # at most one: the format of a directory nothing else claims


class RegistryError(ValueError):
    """A format registered twice, or before a format that is not registered."""


def register(fmt: FileFormat | DirFormat, *, before: str | None = None, fallback: bool = False) -> None:
    """Add a format, last in its precedence list or just before the format named ``before``.
    ``fallback``: a directory format that claims what no other does (there is one)."""
    if fmt.name in names():
        raise RegistryError(f"checkpoint format {fmt.name!r} is registered already")
    if fallback and not isinstance(fmt, DirFormat):
        raise RegistryError(f"only a directory format can be the fallback, not {fmt.name!r}")
    if isinstance(fmt, DirFormat):
        if fallback:
            _FALLBACK_DIR[:] = [fmt]
            return
        _insert(_DIR, fmt, before)
        return
    _insert(_FILE, fmt, before)
    add_checkpoint_suffixes(fmt.suffixes)


def unregister(name: str) -> None:
    """Remove the format ``name`` (tests that add one remove it again)."""
    for fmt in [f for f in _FILE if f.name == name]:
        _FILE.remove(fmt)
        others = {s for f in _FILE for s in f.suffixes}
        remove_checkpoint_suffixes(tuple(s for s in fmt.suffixes if s not in others))
    _DIR[:] = [f for f in _DIR if f.name != name]


def _insert(formats: list[Any], fmt: FileFormat | DirFormat, before: str | None) -> None:
    if before is None:
        formats.append(fmt)
        return
    at = next((i for i, f in enumerate(formats) if f.name == before), None)
    if at is None:
        raise RegistryError(f"cannot register {fmt.name!r} before {before!r}: no such format")
    formats.insert(at, fmt)


def names() -> tuple[str, ...]:
    return (*(f.name for f in _FILE), *(f.name for f in _DIR), *(f.name for f in _FALLBACK_DIR))


def file_formats() -> tuple[FileFormat, ...]:
    """The file formats in detection order."""
    return tuple(_FILE)


def dir_formats() -> tuple[DirFormat, ...]:
    """The directory formats in detection order, the fallback last."""
    return (*_DIR, *_FALLBACK_DIR)


def file_format(name: str) -> FileFormat | None:
    return next((f for f in _FILE if f.name == name), None)


def dir_format(name: str) -> DirFormat | None:
    return next((f for f in dir_formats() if f.name == name), None)


def step_where(name: str) -> str | None:
    """Where a format reads the step inside a checkpoint, for the step's source in reports."""
    fmt = file_format(name) or dir_format(name)
    return fmt.step_where if fmt is not None else None


def sniff_bytes(head: bytes, name: str = "") -> str:
    """The kind of a file from its first bytes (``HEAD_BYTES`` is enough) and its name."""
    if not head:
        return EMPTY
    for fmt in _FILE:
        if fmt.detect(head, name):
            return fmt.name
    if head.count(0) == len(head):
        return ZEROED
    if _looks_like_text(head):
        return TEXT
    return UNKNOWN


def sniff_file(path: str | os.PathLike[str]) -> str:
    """The kind of a regular file (OSError for anything else: a FIFO is never opened)."""
    from ..fsio import regular_fd

    with regular_fd(path) as (fd, _):
        return sniff_bytes(os.pread(fd, HEAD_BYTES, 0), os.path.basename(path))


def _looks_like_text(head: bytes) -> bool:
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return all(ch.isprintable() or ch in "\r\n\t" for ch in text)


def detect_dir(path: str | os.PathLike[str]) -> str:
    """The format of a checkpoint directory from its listing (one ``listdir`` plus a peek);
    ``unknown`` when it cannot be listed."""
    path = Path(path)
    try:
        listing = frozenset(os.listdir(path))
    except OSError:
        return UNKNOWN
    for fmt in _DIR:
        if fmt.detect(path, listing):
            return fmt.name
    return _FALLBACK_DIR[0].name if _FALLBACK_DIR else DIRECTORY


def dir_format_of(path: str | os.PathLike[str]) -> DirFormat:
    """The format whose check a directory gets: the detected one, else the fallback."""
    found = dir_format(detect_dir(path))
    if found is not None:
        return found
    if not _FALLBACK_DIR:
        raise RegistryError("no fallback directory format is registered")
    return _FALLBACK_DIR[0]
