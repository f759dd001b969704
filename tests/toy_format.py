"""A made-up checkpoint format, added the way docs/extending/checkpoint-format.md says: one module
and one ``register`` call, no other file of the supervisor touched (tests/test_checkpoint_format_registry.py
shows it works end to end).

Layout of a ``.toy`` file::

    b"TOYF"  | step: uint64 LE | length: uint32 LE | payload: length bytes | crc32(payload): uint32 LE

L1: the sizes add up to the file size (a cut-short file is CORRUPT); L3: the CRC32 matches. The step
is the header's. No commit marker (a single file).

And a made-up directory format, ``toydir``: ``shard-<rank>.toy`` files, then the commit marker
``TOYDIR`` written last (``step N`` and one shard name a line). The step is the marker's.
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

from supervisor.checkpoints.formats import DirContext, DirFormat, FileContext, FileFormat, register, unregister
from supervisor.checkpoints.outcome import Outcome, corrupt, valid, worst

NAME = "toy"
MAGIC = b"TOYF"
_HEADER = struct.Struct("<4sQI")  # magic, step, payload length
_CRC = struct.Struct("<I")


def encode(step: int, payload: bytes) -> bytes:
    """The bytes of a whole toy checkpoint (what the training side would write)."""
    return _HEADER.pack(MAGIC, step, len(payload)) + payload + _CRC.pack(zlib.crc32(payload))


class ToyFormat(FileFormat):
    name = NAME
    suffixes = (".toy",)
    step_where = "TOYF header"
    unpickled = False

    def detect(self, head: bytes, name: str) -> bool:
        return head.startswith(MAGIC)

    def validate(self, fd: int, size: int, ctx: FileContext) -> Outcome:
        if size < _HEADER.size:
            return corrupt(NAME, 1, f"truncated: {size} bytes, shorter than the {_HEADER.size}-byte header")
        _, step, length = _HEADER.unpack(os.pread(fd, _HEADER.size, 0))
        need = _HEADER.size + length + _CRC.size
        if size != need:
            return corrupt(NAME, 1, f"the header says {need} bytes, the file has {size}", embedded_step=step)
        if ctx.max_level < 3 and not ctx.deep:
            return valid(NAME, 1, "sizes add up", embedded_step=step)
        payload = os.pread(fd, length, _HEADER.size)
        (crc,) = _CRC.unpack(os.pread(fd, _CRC.size, _HEADER.size + length))
        if zlib.crc32(payload) != crc:
            return corrupt(NAME, 3, "payload CRC32 mismatch", embedded_step=step)
        return valid(NAME, 3, f"{length} payload bytes, CRC32 match", embedded_step=step)

    def written_to_the_end(self, fd: int, size: int) -> bool:
        if size < _HEADER.size:
            return False
        _, _, length = _HEADER.unpack(os.pread(fd, _HEADER.size, 0))
        return size >= _HEADER.size + length + _CRC.size


FORMAT = ToyFormat()

DIR_NAME = "toydir"
COMMIT = "TOYDIR"


def write_dir(path: Path, step: int, shards: int, *, commit: bool = True) -> Path:
    """A toy directory checkpoint as its writer saves it: the shards, then the marker."""
    path.mkdir()
    names = [f"shard-{rank}.toy" for rank in range(shards)]
    for rank, name in enumerate(names):
        (path / name).write_bytes(encode(step, bytes([rank]) * 256))
    if commit:
        (path / COMMIT).write_text(f"step {step}\n" + "\n".join(names) + "\n")
    return path


class ToyDirFormat(DirFormat):
    name = DIR_NAME
    step_where = "TOYDIR marker"
    commit_marker = COMMIT
    nests = False

    def detect(self, path: Path, names: frozenset[str]) -> bool:
        return COMMIT in names or any(n.startswith("shard-") and n.endswith(".toy") for n in names)

    def validate(self, path: str, ctx: DirContext) -> Outcome:
        try:
            with open(os.path.join(path, COMMIT), "rb") as handle:
                words = handle.read(1 << 16).decode("ascii", "replace").split()
        except FileNotFoundError:
            return corrupt(DIR_NAME, 1, f"no {COMMIT} marker: the save was never committed")
        if len(words) < 2 or words[0] != "step" or not words[1].isdigit():
            return corrupt(DIR_NAME, 1, f"{COMMIT} marker unreadable")
        step, shards = int(words[1]), words[2:]
        missing = [s for s in shards if not os.path.isfile(os.path.join(path, s))]
        if missing:
            return corrupt(DIR_NAME, 2, f"shard {missing[0]} named in {COMMIT} is missing", embedded_step=step)
        bad = worst([ctx.member(os.path.join(path, s), s) for s in shards])
        if bad is not None:
            return bad.but(format=DIR_NAME, embedded_step=step)
        return valid(DIR_NAME, 3, f"{len(shards)} shards intact", embedded_step=step)


DIR_FORMAT = ToyDirFormat()


def install() -> None:
    """The lines a real format adds to supervisor/checkpoints/formats/__init__.py."""
    register(FORMAT)
    register(DIR_FORMAT)


def uninstall() -> None:
    unregister(DIR_NAME)
    unregister(NAME)
