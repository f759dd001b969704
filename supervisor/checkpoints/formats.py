"""Which checkpoint format a path holds, from a few bytes or a directory listing (no parsing).

Formats are plain strings (they go into JSON and the event log unchanged). Detection is cheap
and only says which validator to run; the validators decide the verdict.
"""

from __future__ import annotations

import os
import re
import struct
from pathlib import Path

TORCH_ZIP = "torch_zip"  # torch.save, default since 1.6
TORCH_LEGACY = "torch_legacy"  # torch.save(..., _use_new_zipfile_serialization=False)
SAFETENSORS = "safetensors"
PICKLE = "pickle"  # a plain pickle.dump
DCP = "dcp"  # torch.distributed.checkpoint directory
DEEPSPEED = "deepspeed"  # a DeepSpeed tag dir (global_stepN/) or a save dir with `latest`
LIGHTNING_DEEPSPEED = "lightning_deepspeed"  # Lightning's DeepSpeed "file": <name>.ckpt/checkpoint/
HF_TRAINER = "hf_trainer"  # HF Trainer checkpoint-N/
DIRECTORY = "directory"  # any other directory of checkpoint files (Megatron iter_N/, ...)
ZIP = "zip"  # a zip archive that is not a torch.save file
EMPTY = "empty"
ZEROED = "zero_filled"
TEXT = "text"
SYMLINK = "symlink"  # a link we did not (or could not) follow
MISSING = "missing"
UNKNOWN = "unknown"

FILE_FORMATS = (TORCH_ZIP, TORCH_LEGACY, SAFETENSORS, PICKLE)
DIR_FORMATS = (DCP, DEEPSPEED, LIGHTNING_DEEPSPEED, HF_TRAINER, DIRECTORY)

ZIP_MAGIC = b"PK\x03\x04"
LEGACY_MAGIC = bytes.fromhex("80028a0a6cfc9c46f9206aa85019")  # pickled 0x1950a86a20f9469cfc6c
_PICKLE_PROTOCOLS = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")
MAX_SAFETENSORS_HEADER = 100_000_000
HEAD_BYTES = 64


def sniff_bytes(head: bytes, name: str = "") -> str:
    """The format of a file from its first bytes (``HEAD_BYTES`` is enough) and its name."""
    if not head:
        return EMPTY
    if name.lower().endswith(".safetensors"):
        return SAFETENSORS
    if head.startswith(ZIP_MAGIC) or (len(head) < len(ZIP_MAGIC) and ZIP_MAGIC.startswith(head)):
        return TORCH_ZIP  # a head shorter than the magic is a file cut short: the zip ladder says so
    if head.startswith(LEGACY_MAGIC) or (len(head) < len(LEGACY_MAGIC) and LEGACY_MAGIC.startswith(head)):
        return TORCH_LEGACY
    if len(head) >= 9 and head[8:9] == b"{":
        (header_len,) = struct.unpack_from("<Q", head)
        if header_len <= MAX_SAFETENSORS_HEADER:
            return SAFETENSORS
    if head.count(0) == len(head):
        return ZEROED
    if head[:2] in _PICKLE_PROTOCOLS:
        return PICKLE
    if _looks_like_text(head):
        return TEXT
    return UNKNOWN


def sniff_file(path: str | os.PathLike[str]) -> str:
    """The format of a regular file (OSError for anything else: a FIFO is never opened)."""
    from .fsio import regular_fd

    with regular_fd(path) as (fd, _):
        return sniff_bytes(os.pread(fd, HEAD_BYTES, 0), os.path.basename(path))


def _looks_like_text(head: bytes) -> bool:
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return all(ch.isprintable() or ch in "\r\n\t" for ch in text)


def detect_dir(path: str | os.PathLike[str]) -> str:
    """The format of a checkpoint directory from its listing (one ``scandir`` plus a peek)."""
    path = Path(path)
    try:
        names = set(os.listdir(path))
    except OSError:
        return UNKNOWN
    if ".metadata" in names or ".metadata.tmp" in names or any(n.endswith(".distcp") for n in names):
        return DCP
    if any(n.endswith(".metadata") and n.startswith("__") for n in names):
        return DCP
    if "checkpoint" in names and (path / "checkpoint").is_dir() and _has_ds_states(path / "checkpoint"):
        return LIGHTNING_DEEPSPEED
    if "trainer_state.json" in names or _is_hf_name(path.name):
        return HF_TRAINER
    if any(_is_ds_states_name(n) for n in names):
        return DEEPSPEED
    if "latest" in names and (path / "latest").is_file():
        return DEEPSPEED
    return DIRECTORY


def _has_ds_states(path: Path) -> bool:
    try:
        return any(_is_ds_states_name(n) for n in os.listdir(path))
    except OSError:
        return False


def _is_ds_states_name(name: str) -> bool:
    return name.endswith(("_model_states.pt", "_optim_states.pt"))


def _is_hf_name(name: str) -> bool:
    return _HF_NAME.fullmatch(name) is not None


_HF_NAME = re.compile(r"checkpoint-[0-9]+", re.ASCII)
