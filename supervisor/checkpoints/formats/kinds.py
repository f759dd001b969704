"""The names of checkpoint kinds, and the few byte constants detection needs.

Kinds are plain strings (they go into JSON and the event log unchanged). A kind is either a
format (a registered :class:`~.base.FileFormat` or :class:`~.base.DirFormat` of the same name) or
what a file is when no format claims it (empty, zero-filled, text, a symlink...).
"""

from __future__ import annotations

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

# The built-in formats (the registry may hold more: supervisor/checkpoints/formats/registry.py).
FILE_FORMATS = (TORCH_ZIP, TORCH_LEGACY, SAFETENSORS, PICKLE)
DIR_FORMATS = (DCP, DEEPSPEED, LIGHTNING_DEEPSPEED, HF_TRAINER, DIRECTORY)

ZIP_MAGIC = b"PK\x03\x04"
LEGACY_MAGIC = bytes.fromhex("80028a0a6cfc9c46f9206aa85019")  # pickled 0x1950a86a20f9469cfc6c
PICKLE_PROTOCOLS = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")
MAX_SAFETENSORS_HEADER = 100_000_000
HEAD_BYTES = 64  # what detection reads of a file; a format's detect sees no more
