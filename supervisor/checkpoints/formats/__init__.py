"""Checkpoint formats: what each is (one module per format), and the registry that detects them.

Detection is cheap and only says which validator to run; the validators decide the verdict.
Everything a format knows (how it is detected, validated, where its step is read, its commit
marker) lives in its module; the callers ask the registry. To add a format, write its module and
register it (docs/extending/checkpoint-format.md).

The built-ins, in detection order (registry.py states the precedence rules):

    files:        safetensors, torch_zip, torch_legacy, plain_pickle
    directories:  dcp, lightning_deepspeed, hf_trainer, deepspeed; any other: directory
"""

from __future__ import annotations

from . import dcp, deepspeed, directory, hf_trainer, lightning_deepspeed, plain_pickle, safetensors
from . import torch_legacy, torch_zip
from .base import DirContext, DirFormat, FileContext, FileFormat
from .kinds import (
    DCP,
    DEEPSPEED,
    DIR_FORMATS,
    DIRECTORY,
    EMPTY,
    FILE_FORMATS,
    HEAD_BYTES,
    HF_TRAINER,
    LEGACY_MAGIC,
    LIGHTNING_DEEPSPEED,
    MAX_SAFETENSORS_HEADER,
    MISSING,
    PICKLE,
    SAFETENSORS,
    SYMLINK,
    TEXT,
    TORCH_LEGACY,
    TORCH_ZIP,
    UNKNOWN,
    ZEROED,
    ZIP,
    ZIP_MAGIC,
)
from .registry import (
    RegistryError,
    detect_dir,
    dir_format,
    dir_format_of,
    dir_formats,
    file_format,
    file_formats,
    names,
    register,
    sniff_bytes,
    sniff_file,
    step_where,
    unregister,
)

__all__ = [
    "DCP", "DEEPSPEED", "DIRECTORY", "DIR_FORMATS", "EMPTY", "FILE_FORMATS", "HEAD_BYTES", "HF_TRAINER",
    "LEGACY_MAGIC", "LIGHTNING_DEEPSPEED", "MAX_SAFETENSORS_HEADER", "MISSING", "PICKLE", "SAFETENSORS",
    "SYMLINK", "TEXT", "TORCH_LEGACY", "TORCH_ZIP", "UNKNOWN", "ZEROED", "ZIP", "ZIP_MAGIC",
    "DirContext", "DirFormat", "FileContext", "FileFormat", "RegistryError",
    "detect_dir", "dir_format", "dir_format_of", "dir_formats", "file_format", "file_formats", "names", "register",
    "sniff_bytes", "sniff_file", "step_where", "unregister",
]

# The built-ins, in precedence order. safetensors goes first: its name alone decides it.
for _builtin in (safetensors, torch_zip, torch_legacy, plain_pickle, dcp, lightning_deepspeed, hf_trainer, deepspeed):
    if _builtin.FORMAT.name not in names():
        register(_builtin.FORMAT)
if directory.FORMAT.name not in names():
    register(directory.FORMAT, fallback=True)
