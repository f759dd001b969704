"""HF Trainer ``checkpoint-N/`` directories: ``trainer_state.json`` is written last (the commit
marker) and holds ``global_step`` (the step); weights in safetensors or torch files, optionally
sharded behind an index; nested DeepSpeed tags or DCP (FSDP) dirs.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

from ...states import Verdict
from ..fsio import read_regular
from ..limits import MAX_PICKLE_BYTES, MAX_SHARDS, ScanLimitError
from ..naming import has_checkpoint_suffix, step_from_name
from ..outcome import Outcome, corrupt, unverifiable, valid, worst
from ..picklescan import plain_int
from .base import DirContext, DirFormat
from .deepspeed import check_deepspeed_save_dir
from .kinds import DCP, DEEPSPEED, HF_TRAINER
from .registry import detect_dir

_HF_NAME = re.compile(r"checkpoint-[0-9]+", re.ASCII)
_NESTED = (DCP, DEEPSPEED)  # what Trainer nests: FSDP's DCP dir, DeepSpeed's global_stepN/


class HfTrainer(DirFormat):
    name = HF_TRAINER
    step_where = "trainer_state.json"
    commit_marker = "trainer_state.json"
    nests = False

    def detect(self, path: Path, names: frozenset[str]) -> bool:
        return "trainer_state.json" in names or _HF_NAME.fullmatch(path.name) is not None

    def validate(self, path: str, ctx: DirContext) -> Outcome:
        return check_hf(path, ctx)


FORMAT = HfTrainer()


_RNG_STATE = re.compile(r"^rng_state_([0-9]{1,9})\.pth$", re.ASCII)
_TRAINING_ARGS = "training_args.bin"
_WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json",
                   "adapter_model.safetensors.index.json")


def check_hf(path: str, ctx: DirContext) -> Outcome:
    """``trainer_state.json`` (written last by HF Trainer) must parse with ``global_step``; every
    shard named in a weight index must exist; every torch/safetensors file passes its ladder;
    nested DeepSpeed or DCP (FSDP) dirs are checked too."""
    fmt = HF_TRAINER
    deep = ctx.deep
    names = sorted(os.listdir(path))
    if "trainer_state.json" not in names:
        return corrupt(fmt, 1, "trainer_state.json missing: HF Trainer writes it last, so the save did not finish")
    try:
        state = json.loads(read_regular(os.path.join(path, "trainer_state.json"), MAX_PICKLE_BYTES))
        step = state.get("global_step")
        epoch = state.get("epoch")
    except ScanLimitError as exc:
        return unverifiable(fmt, 1, f"trainer_state.json: {exc.reason}",
                            embedded_step=step_from_name(os.path.basename(path)))
    except (ValueError, UnicodeDecodeError, AttributeError, RecursionError) as exc:
        return corrupt(fmt, 1, f"trainer_state.json unreadable ({type(exc).__name__}): torn write")
    if plain_int(step) is None:
        return corrupt(fmt, 1, "trainer_state.json has no integer global_step")
    for index_name in (n for n in _WEIGHT_INDEXES if n in names):
        try:
            weight_map = json.loads(read_regular(os.path.join(path, index_name), MAX_PICKLE_BYTES))["weight_map"]
            shards = sorted({str(v) for v in weight_map.values()})
        except ScanLimitError as exc:
            return unverifiable(fmt, 2, f"{index_name}: {exc.reason}", embedded_step=step)
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError, RecursionError):
            return corrupt(fmt, 2, f"{index_name} unreadable")
        missing = [s for s in shards if s not in names]
        if missing:
            return corrupt(fmt, 2, f"shard {missing[0]} named in {index_name} is missing")
    files = [n for n in names if has_checkpoint_suffix(n) and not os.path.isdir(os.path.join(path, n))]
    subdirs = [n for n in names if os.path.isdir(os.path.join(path, n))]
    rng = sorted(int(m.group(1)) for m in map(_RNG_STATE.match, names) if m)
    if rng and rng[-1] >= MAX_SHARDS:
        return corrupt(fmt, 2, f"rng_state_{rng[-1]}.pth: implausible rank")
    if rng and rng != list(range(rng[-1] + 1)):
        gap = min(set(range(rng[-1] + 1)) - set(rng))
        return corrupt(fmt, 2, f"rng_state_{gap}.pth missing (ranks 0..{rng[-1]} saved the others)")
    outcomes = []
    for name in files:
        outcome = ctx.member(os.path.join(path, name), name)
        if name == _TRAINING_ARGS and outcome.verdict is Verdict.CORRUPT and not outcome.load_safe:
            # Trainer never loads training_args.bin on resume; subclasses from other libraries
            # (TRL's SFTConfig...) are not on the allowlist: unknown, not torn.
            outcome = unverifiable(fmt, 3, f"{outcome.reason} (HF Trainer does not load it on resume)")
        outcomes.append(outcome)
    nested = [n for n in subdirs if detect_dir(os.path.join(path, n)) in _NESTED]
    for name in nested:
        outcome = ctx.nested(os.path.join(path, name))
        outcomes.append(outcome.but(reason=f"{name}/: {outcome.reason}"))
    if "latest" in names and not nested:
        outcomes.append(check_deepspeed_save_dir(path, ctx))
    bad = worst(outcomes)
    if bad:
        return bad.but(format=fmt, embedded_step=step)
    has_weights = any(n.endswith((".safetensors", ".bin")) for n in files) or nested
    if not has_weights:
        return unverifiable(fmt, 2, "trainer_state.json present but no model weights found",
                            embedded_step=step)
    level = 4 if deep and any(o.level >= 4 for o in outcomes) else 3
    return valid(fmt, level, f"trainer_state.json global_step={step}; {len(outcomes)} files/dirs intact",
                 embedded_step=step, epoch=_whole_epoch(epoch))


def _whole_epoch(epoch: Any) -> int | None:
    """trainer_state.json's epoch is a float (1.0, 2.5); JSON also allows Infinity and NaN."""
    if isinstance(epoch, float) and math.isfinite(epoch):
        return plain_int(int(epoch))
    return plain_int(epoch)
