"""What a checkpoint format is: the two protocols every format module implements.

A format knows four things and nothing else needs to: how it is *detected* (a file from its first
``HEAD_BYTES`` and its name, a directory from its listing), how a file or directory of it is
*validated* (an :class:`~supervisor.checkpoints.outcome.Outcome`, never by loading it), where its
*step* is read (the outcome's ``embedded_step``, and ``step_where`` says from what), and its
*commit marker* when it has one (the file its writer puts in place last). The dispatchers
(``filecheck.check_file``, ``dircheck.check_dir``, the save watch, the step source) ask the registry
(:mod:`.registry`) and never name a format.

Directory formats check their members through the :class:`DirContext` they are handed, so a format
module imports no dispatcher (and the dispatchers import the registry, not the formats).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from ..outcome import Outcome


@dataclass(frozen=True)
class FileContext:
    """One file's validation request: what ``check_file`` already knows about it."""

    path: str
    name: str  # the base name (allowlists and detection may depend on it)
    head: bytes  # the first HEAD_BYTES bytes, already read
    deep: bool  # level 4: read every byte (checksums)
    max_level: int  # stop the ladder after this level (1: a quick look)
    allowed: frozenset[tuple[str, str]]  # globals its pickles may name
    cache_key: tuple | None = None  # for remembered checksum results (set when ``deep``)


@dataclass(frozen=True)
class DirContext:
    """One directory's validation request, with the checks a directory format may run on what it
    holds (supplied by supervisor/checkpoints/dircheck.py)."""

    deep: bool
    depth: int  # how many directory checkpoints enclose this one
    # check_file on a member; an OSError becomes its verdict; the reason starts with the label
    member: Callable[[str, str], Outcome]
    # the full check of a nested directory (its commit marker first), one level deeper
    nested: Callable[[str], Outcome]
    # a directory committed by supervisor.sharded: the marker, then ``content`` (the format's own check)
    committed: Callable[[str, Callable[[], Outcome]], Outcome]
    # files a loader may unpickle that the format's check does not read: the worst, or None
    loose: Callable[[str, str], Outcome | None]


@runtime_checkable
class FileFormat(Protocol):
    """A single-file format. Subclass it explicitly to inherit the optional hooks' defaults."""

    name: str  # the kind it reports (a constant of supervisor/checkpoints/formats/kinds.py, or its own)
    suffixes: tuple[str, ...]  # file names that end so are checkpoint candidates ("" for none of its own)
    step_where: str | None  # where inside the step is read, for reports (None: the pickled mapping)
    unpickled: bool  # a loader unpickles it: found loose in a directory, it is scanned as such

    def detect(self, head: bytes, name: str) -> bool:
        """Whether a file with these first bytes and this name is of this format (cheap, pure)."""
        ...

    def validate(self, fd: int, size: int, ctx: FileContext) -> Outcome:
        """The ladder: L1 framing, L2 index, L3 inert content, L4 checksums (``ctx.deep``)."""
        ...

    def quick_look(self, fd: int, size: int) -> Outcome | None:
        """An L1 verdict from one read at the end of the file, before detection (older candidates
        than the resume point); None when the format cannot say that way."""
        return None

    def damaged_start(self, fd: int, size: int, head: bytes) -> Outcome | None:
        """For a file no format detected: a verdict when it is this format with its start
        destroyed (its end is intact), else None."""
        return None

    def written_to_the_end(self, fd: int, size: int) -> bool:
        """False when the file is visibly cut short (the save watch waits for it); True when the
        format cannot tell."""
        return True


@runtime_checkable
class DirFormat(Protocol):
    """A directory format. Subclass it explicitly to inherit the optional hooks' defaults."""

    name: str
    step_where: str | None  # where inside the step is read ("trainer_state.json"), for reports
    commit_marker: str | None  # the file its writer puts in place last, if it has one
    nests: bool  # found inside another directory checkpoint, it is checked as a unit of its own

    def detect(self, path: Path, names: frozenset[str]) -> bool:
        """Whether the directory at ``path`` holding ``names`` is of this format (a listing and at
        most a peek one level down)."""
        ...

    def validate(self, path: str, ctx: DirContext) -> Outcome:
        """Rebuild the set of files the writer must have produced and check each."""
        ...

    def committed(self, names: frozenset[str]) -> bool:
        """Whether a directory holding ``names`` has its commit marker (the save watch's "done")."""
        return self.commit_marker is None or self.commit_marker in names

    def reads_itself(self, name: str) -> bool:
        """Whether its own check reads the top-level file ``name`` (not judged again as a loose file)."""
        return False
