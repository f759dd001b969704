"""Validation of directory checkpoints: DCP, DeepSpeed tag and save dirs, Lightning's DeepSpeed
``*.ckpt/`` dirs, HF Trainer ``checkpoint-N/`` and any other directory of checkpoint files.

Directory formats have no single commit marker that covers every rank, so each check rebuilds
the set of files the writer must have produced (from the manifest or the recorded world size)
and runs the file ladder on each. Reasons say exactly what was checked.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Iterable

from ..states import Verdict
from . import formats as F
from .filecheck import check_file, check_safetensors, read_tensor_int
from .naming import has_checkpoint_suffix, step_from_name
from .outcome import Outcome, corrupt, unverifiable, valid, worst
from .picklescan import STEP_KEYS, Call, PickleScanError, as_mapping, is_tensor, scan_pickle
from .zipcheck import (
    ZipCheckError,
    cached_crc_check,
    crc_cache_key,
    pread_exact,
    read_entry,
    read_index,
    read_trailer,
)

# Shards of one committed DeepSpeed tag are written in one save window. A wider mtime spread
# means files from different saves (in-place overwrite interrupted). Seconds.
MTIME_SPREAD_LIMIT_S = 600.0
_MAX_WALK_FILES = 10_000


def check_dir(path: str, *, deep: bool = False, depth: int = 0) -> Outcome:
    """Dispatch on the directory's detected format."""
    fmt = F.detect_dir(path)
    if fmt == F.DCP:
        return check_dcp(path, deep=deep)
    if fmt == F.LIGHTNING_DEEPSPEED:
        return check_lightning_deepspeed(path, deep=deep)
    if fmt == F.DEEPSPEED:
        names = os.listdir(path)
        if any(n.endswith("_model_states.pt") or n.endswith("_optim_states.pt") for n in names):
            return check_deepspeed_tag(path, deep=deep)
        return check_deepspeed_save_dir(path, deep=deep)
    if fmt == F.HF_TRAINER:
        return check_hf(path, deep=deep, depth=depth)
    return check_generic_dir(path, deep=deep, depth=depth)


# ---------------------------------------------------------------------------- DCP


def check_dcp(path: str, *, deep: bool = False) -> Outcome:
    """``.metadata`` (the commit marker, renamed into place last) lists every item's
    (relative_path, offset, length): each shard must exist and be long enough, and each zip item
    must be framed (``PK`` header at its start, end-of-archive at its end)."""
    fmt = F.DCP
    names = set(os.listdir(path))
    metadata = [".metadata"] if ".metadata" in names else sorted(
        n for n in names if n.startswith("__") and n.endswith(".metadata"))
    if ".metadata.tmp" in names:
        what = "an overwrite of this checkpoint" if metadata else "the save"
        return corrupt(fmt, 1, f".metadata.tmp left over: {what} did not finish")
    if not metadata:
        return corrupt(fmt, 1, "no .metadata: the save was never committed")
    items: list[tuple[str, int, int, str, bool]] = []
    understood = True
    for name in metadata:
        meta_path = os.path.join(path, name)
        with open(meta_path, "rb") as handle:
            data = handle.read()
        if not data:
            return corrupt(fmt, 1, f"{name} is empty")
        try:
            root = scan_pickle(data).root
        except PickleScanError as exc:
            return corrupt(fmt, 2, f"{name}: {exc}")
        found = _dcp_items(root)
        understood = understood and found is not None
        items.extend(found or [])
    shard_names = sorted(n for n in names if n.endswith(".distcp"))
    if not understood or not items:
        return _dcp_fallback(path, shard_names)
    need: dict[str, int] = {}
    for rel, offset, length, *_ in items:
        if os.path.isabs(rel) or ".." in Path(rel).parts:
            return corrupt(fmt, 2, f"manifest names a path outside the checkpoint: {rel!r}")
        need[rel] = max(need.get(rel, 0), offset + length)
    for rel, end in sorted(need.items()):
        try:
            size = os.stat(os.path.join(path, rel)).st_size
        except FileNotFoundError:
            return corrupt(fmt, 2, f"shard {rel} listed in .metadata is missing")
        if size < end:
            return corrupt(fmt, 2, f"shard {rel} has {size} bytes, .metadata needs {end} (truncated)")
    return _dcp_items_framing(path, items, len(need), deep)


def _dcp_items(root: Any) -> list[tuple[str, int, int, str, bool]] | None:
    """(relative_path, offset, length, fqn, transformed) of every item, read inertly from the
    Metadata tree."""
    meta = root.attrs() if isinstance(root, Call) else {}
    storage_data = as_mapping(meta.get("storage_data"))
    if storage_data is None:
        return None
    out = []
    for index, info in storage_data.items():
        attrs = info.attrs() if isinstance(info, Call) else {}
        rel, offset, length = attrs.get("relative_path"), attrs.get("offset"), attrs.get("length")
        if not (isinstance(rel, str) and isinstance(offset, int) and isinstance(length, int)):
            return None
        fqn = index.attrs().get("fqn") if isinstance(index, Call) else None
        transformed = bool(attrs.get("transform_descriptors"))
        out.append((rel, offset, length, fqn if isinstance(fqn, str) else "", transformed))
    return out


def _dcp_fallback(path: str, shard_names: list[str]) -> Outcome:
    if not shard_names:
        return unverifiable(F.DCP, 1, ".metadata present but its layout was not understood and no .distcp files exist")
    for name in shard_names:
        if os.path.getsize(os.path.join(path, name)) == 0:
            return corrupt(F.DCP, 1, f"shard {name} is empty (0 bytes)")
    return valid(F.DCP, 1, f".metadata present, {len(shard_names)} shard files nonempty "
                           "(manifest layout not understood: item extents not checked)")


def _dcp_items_framing(path: str, items: list[tuple[str, int, int, str, bool]], files: int, deep: bool) -> Outcome:
    """TORCH_SAVE-format items are each a torch.save zip: check their framing (and CRC with
    ``deep``). Other items (SAFETENSORS serialization, transforms such as compression) are only
    checked for extents, and for a zero-filled start when the checkpoint's other items are zips."""
    fmt = F.DCP
    framed = unframed = 0
    zero_items: list[str] = []
    crc_missing = False
    step = None
    by_file: dict[str, list[tuple[int, int, str, bool]]] = {}
    for rel, offset, length, fqn, transformed in items:
        by_file.setdefault(rel, []).append((offset, length, fqn, transformed))
    for rel, spans in by_file.items():
        shard = os.path.join(path, rel)
        with open(shard, "rb", buffering=0) as handle:
            fd = handle.fileno()
            st = os.fstat(fd)
            blob_checked = False
            for offset, length, fqn, transformed in spans:
                head = pread_exact(fd, 9, offset)
                if not transformed and not blob_checked and F.sniff_bytes(head) == F.SAFETENSORS:
                    # SAFETENSORS serialization: one safetensors blob from here to the end of the file
                    blob = check_safetensors(fd, st.st_size - offset, base=offset)
                    if blob.verdict is not Verdict.VALID:
                        return blob.but(format=fmt, reason=f"safetensors data in {rel}: {blob.reason}")
                    blob_checked = True
                if transformed or head[:4] != b"PK\x03\x04":
                    probe = pread_exact(fd, min(length, 64), offset)
                    if length and probe.count(0) == len(probe):
                        zero_items.append(f"item {fqn or offset} in {rel} is zero-filled")
                    unframed += 1
                    continue
                framed += 1
                try:
                    trailer = read_trailer(fd, offset, length)
                    if deep or _is_step_fqn(fqn):
                        index = read_index(fd, offset, length, trailer)
                        if _is_step_fqn(fqn) and step is None:
                            step = _item_int(fd, offset, length)
                        if deep:
                            crc = cached_crc_check(fd, offset, index, crc_cache_key(shard, st, offset))
                            if crc.verifiable and not crc.ok:
                                return corrupt(fmt, 4, f"item {fqn or offset} in {rel}: {crc.reason}")
                            crc_missing = crc_missing or not crc.verifiable
                except ZipCheckError as exc:
                    return corrupt(fmt, 3, f"item {fqn or offset} in {rel}: {exc.reason}")
    if zero_items and framed:  # zip-framed items never start with zeros: a hole, not data
        return corrupt(fmt, 3, zero_items[0])
    note = f"; {unframed} items not zip-framed (extents only)" if unframed else ""
    summary = f"{len(items)} items in {files} shard files: extents fit, {framed} items framed{note}"
    if deep and crc_missing:
        return unverifiable(fmt, 4, f"{summary}; some items carry no CRC32", embedded_step=step)
    level = 4 if deep and not unframed else 3
    return valid(fmt, level, summary + ("; CRC32 match" if deep and framed else ""), embedded_step=step)


def _is_step_fqn(fqn: str) -> bool:
    parts = fqn.split(".")
    return len(parts) <= 2 and parts[-1] in STEP_KEYS


def _item_int(fd: int, base: int, length: int) -> int | None:
    """An int (or one-element int tensor) saved as one DCP item: scan its own data.pkl."""
    try:
        index = read_index(fd, base, length, read_trailer(fd, base, length))
        pkl = index.get("data.pkl")
        if pkl is None or pkl.size > 1 << 20:
            return None
        root = scan_pickle(read_entry(fd, base, pkl)).root
    except (ZipCheckError, PickleScanError):
        return None
    if isinstance(root, int) and not isinstance(root, bool):
        return root
    return read_tensor_int(fd, base, index, root) if is_tensor(root) else None


# ---------------------------------------------------------------------------- DeepSpeed

_OPTIM = re.compile(r"^(bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
_ZERO3_MODEL = re.compile(r"^zero_pp_rank_(\d+)_mp_rank_(\d+)_model_states\.pt$")
_MP_MODEL = re.compile(r"^mp_rank_(\d+)_model_states\.pt$")


def check_deepspeed_tag(path: str, *, deep: bool = False, in_place: bool = False,
                        reference_mtime: float | None = None) -> Outcome:
    """A ``global_stepN/`` tag: the model states give ``dp_world_size``/``mp_world_size``; every
    implied model and optimizer shard must exist and pass L1-L2 (L4 with ``deep``); shard mtimes
    must lie in one save window (``in_place`` tags, rewritten each save, are corrupt otherwise)."""
    fmt = F.DEEPSPEED
    names = sorted(os.listdir(path))
    model_files = [n for n in names if n.endswith("_model_states.pt")]
    optim_files = [n for n in names if _OPTIM.match(n)]
    if not model_files:
        what = "empty tag directory" if not names else "no *_model_states.pt"
        return corrupt(fmt, 1, f"{what}: the save did not get far")
    zero3 = any(_ZERO3_MODEL.match(n) for n in model_files)
    primary = "mp_rank_00_model_states.pt" if "mp_rank_00_model_states.pt" in names else (
        "zero_pp_rank_0_mp_rank_00_model_states.pt" if zero3 else model_files[0])
    if primary not in names:
        return corrupt(fmt, 2, f"{primary} is missing")
    head = check_file(os.path.join(path, primary), deep=deep)
    if head.verdict is not Verdict.VALID and not (deep and head.verdict is Verdict.UNVERIFIABLE):
        return head.but(format=fmt, reason=f"{primary}: {head.reason}")
    facts = dict(head.facts)
    dp, mp = facts.get("dp_world_size"), facts.get("mp_world_size", 1)
    expected, note = _expected_deepspeed_files(names, dp, mp, zero3, optim_files, facts.get("zero_stage"))
    missing = sorted(set(expected) - set(names))
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        return corrupt(fmt, 2, f"missing shard(s) {shown} ({note})")
    outcomes: list[Outcome] = []
    shard_files = [n for n in names if n.endswith(".pt") and n != primary]
    for name in shard_files:
        level = 3 if (name == (optim_files[0] if optim_files else None) or _MP_MODEL.match(name)) else 2
        outcome = check_file(os.path.join(path, name), deep=deep, max_level=level)
        outcomes.append(outcome.but(reason=f"{name}: {outcome.reason}"))
        if name == (optim_files[0] if optim_files else None) and outcome.verdict is Verdict.VALID:
            problem = _partition_problem(outcome.facts, len([n for n in optim_files if n.endswith("_mp_rank_00_optim_states.pt")]))
            if problem:
                return corrupt(fmt, 3, f"{name}: {problem}")
    bad = worst(outcomes)
    if bad and bad.verdict is Verdict.CORRUPT:
        return bad.but(format=fmt)
    spread = _mtime_problem(path, [primary, *shard_files], reference_mtime)
    if spread:
        maker = corrupt if in_place else unverifiable
        return maker(fmt, 3, spread, embedded_step=head.embedded_step, epoch=head.epoch, facts=facts)
    if bad:
        return bad.but(format=fmt, embedded_step=head.embedded_step, epoch=head.epoch, facts=facts)
    level = 4 if deep else 3
    return valid(fmt, level, f"{len(shard_files) + 1} shard files intact ({note})",
                 embedded_step=head.embedded_step, epoch=head.epoch, facts=facts)


def _expected_deepspeed_files(names: list[str], dp: Any, mp: Any, zero3: bool, optim_files: list[str],
                              zero_stage: Any) -> tuple[list[str], str]:
    if not isinstance(mp, int) or mp < 1:
        mp = 1
    if not isinstance(dp, int) or dp < 1:
        ranks = [int(m.group(2)) for m in map(_OPTIM.match, optim_files) if m]
        dp = max(ranks) + 1 if ranks else 1
        note = f"dp_world_size not recorded; inferred {dp} from the shards present"
    else:
        note = f"dp_world_size={dp}, mp_world_size={mp}"
    expected = []
    for m in range(mp):
        if zero3:
            expected += [f"zero_pp_rank_{d}_mp_rank_{m:02d}_model_states.pt" for d in range(dp)]
        else:
            expected.append(f"mp_rank_{m:02d}_model_states.pt")
    has_optim = bool(optim_files) or (isinstance(zero_stage, int) and zero_stage >= 1)
    if has_optim:
        prefix = "bf16_" if any(n.startswith("bf16_") for n in optim_files) else ""
        for m in range(mp):
            expected += [f"{prefix}zero_pp_rank_{d}_mp_rank_{m:02d}_optim_states.pt" for d in range(dp)]
    return expected, note


def _partition_problem(facts: Any, optim_count: int) -> str | None:
    counts = facts.get("partition_count")
    values = counts if isinstance(counts, list) else [counts] if isinstance(counts, int) else []
    for value in values:
        if optim_count and value != optim_count:
            return f"partition_count={value} but {optim_count} optimizer shards per model-parallel rank"
    return None


def _mtime_problem(path: str, names: Iterable[str], reference: float | None) -> str | None:
    mtimes = [os.stat(os.path.join(path, n)).st_mtime for n in names]
    if not mtimes:
        return None
    spread = max(mtimes) - min(mtimes)
    if spread > MTIME_SPREAD_LIMIT_S:
        return f"shard mtimes span {spread:.0f} s: files from different saves (interrupted overwrite?)"
    if reference is not None and reference - min(mtimes) > MTIME_SPREAD_LIMIT_S:
        return f"a shard is {reference - min(mtimes):.0f} s older than 'latest': files from an older save"
    return None


def check_deepspeed_save_dir(path: str, *, deep: bool = False) -> Outcome:
    """A DeepSpeed save dir: ``latest`` names the tag to load. It is written by rank 0 before the
    final barrier, so the tag it names is checked in full, not trusted."""
    fmt = F.DEEPSPEED
    latest = os.path.join(path, "latest")
    try:
        with open(latest, encoding="utf-8", errors="replace") as handle:
            tag = handle.read().strip()
    except FileNotFoundError:
        return unverifiable(fmt, 0, "DeepSpeed save dir without 'latest': check its global_step*/ dirs one by one")
    if not tag:
        return corrupt(fmt, 1, "'latest' is empty (lost in a crash before it reached disk)")
    tag_dir = os.path.join(path, tag)
    if os.path.sep in tag or not os.path.isdir(tag_dir):
        return corrupt(fmt, 1, f"'latest' names tag {tag!r}, which does not exist")
    outcome = check_deepspeed_tag(tag_dir, deep=deep, reference_mtime=os.stat(latest).st_mtime)
    step = outcome.embedded_step if outcome.embedded_step is not None else step_from_name(tag)
    return outcome.but(reason=f"tag {tag}: {outcome.reason}", embedded_step=step)


def check_lightning_deepspeed(path: str, *, deep: bool = False) -> Outcome:
    """Lightning's DeepSpeed strategy saves ``<name>.ckpt/`` as a DeepSpeed dir with the fixed tag
    ``checkpoint``, rewritten in place on every save: mixed mtimes mean a torn overwrite."""
    latest = os.path.join(path, "latest")
    tag = "checkpoint"
    if os.path.isfile(latest):
        with open(latest, encoding="utf-8", errors="replace") as handle:
            tag = handle.read().strip() or tag
    tag_dir = os.path.join(path, tag)
    if not os.path.isdir(tag_dir):
        return corrupt(F.LIGHTNING_DEEPSPEED, 1, f"tag dir {tag}/ missing")
    outcome = check_deepspeed_tag(tag_dir, deep=deep, in_place=True)
    return outcome.but(format=F.LIGHTNING_DEEPSPEED, reason=f"{tag}/: {outcome.reason}")


# ---------------------------------------------------------------------------- HF Trainer

_WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json",
                   "adapter_model.safetensors.index.json")


def check_hf(path: str, *, deep: bool = False, depth: int = 0) -> Outcome:
    """``trainer_state.json`` (written last by HF Trainer) must parse with ``global_step``; every
    shard named in a weight index must exist; every torch/safetensors file passes its ladder;
    nested DeepSpeed or DCP (FSDP) dirs are checked too."""
    fmt = F.HF_TRAINER
    names = sorted(os.listdir(path))
    if "trainer_state.json" not in names:
        return corrupt(fmt, 1, "trainer_state.json missing: HF Trainer writes it last, so the save did not finish")
    try:
        with open(os.path.join(path, "trainer_state.json"), encoding="utf-8") as handle:
            state = json.load(handle)
        step = state.get("global_step")
        epoch = state.get("epoch")
    except (ValueError, UnicodeDecodeError, AttributeError) as exc:
        return corrupt(fmt, 1, f"trainer_state.json unreadable ({type(exc).__name__}): torn write")
    if not isinstance(step, int) or isinstance(step, bool):
        return corrupt(fmt, 1, "trainer_state.json has no integer global_step")
    for index_name in (n for n in _WEIGHT_INDEXES if n in names):
        try:
            with open(os.path.join(path, index_name), encoding="utf-8") as handle:
                weight_map = json.load(handle)["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
            return corrupt(fmt, 2, f"{index_name} unreadable")
        missing = [s for s in shards if s not in names]
        if missing:
            return corrupt(fmt, 2, f"shard {missing[0]} named in {index_name} is missing")
    files = [n for n in names if has_checkpoint_suffix(n) and os.path.isfile(os.path.join(path, n))]
    subdirs = [n for n in names if os.path.isdir(os.path.join(path, n))]
    rng = sorted(int(m.group(1)) for m in map(re.compile(r"^rng_state_(\d+)\.pth$").match, names) if m)
    if rng and rng != list(range(rng[-1] + 1)):
        gap = min(set(range(rng[-1] + 1)) - set(rng))
        return corrupt(fmt, 2, f"rng_state_{gap}.pth missing (ranks 0..{rng[-1]} saved the others)")
    outcomes = []
    for name in files:
        outcome = check_file(os.path.join(path, name), deep=deep)
        outcomes.append(outcome.but(reason=f"{name}: {outcome.reason}"))
    nested = [n for n in subdirs if F.detect_dir(os.path.join(path, n)) in (F.DCP, F.DEEPSPEED)]
    for name in nested:
        outcome = check_dir(os.path.join(path, name), deep=deep, depth=depth + 1)
        outcomes.append(outcome.but(reason=f"{name}/: {outcome.reason}"))
    if "latest" in names and not nested:
        outcomes.append(check_deepspeed_save_dir(path, deep=deep))
    bad = worst(outcomes)
    if bad:
        return bad.but(format=fmt, embedded_step=step)
    has_weights = any(n.endswith((".safetensors", ".bin")) for n in files) or nested
    if not has_weights:
        return unverifiable(fmt, 2, "trainer_state.json present but no model weights found",
                            embedded_step=step)
    level = 4 if deep and any(o.level >= 4 for o in outcomes) else 3
    return valid(fmt, level, f"trainer_state.json global_step={step}; {len(outcomes)} files/dirs intact",
                 embedded_step=step, epoch=int(epoch) if isinstance(epoch, (int, float)) else None)


# ---------------------------------------------------------------------------- any directory


def check_generic_dir(path: str, *, deep: bool = False, depth: int = 0) -> Outcome:
    """Any other directory (Megatron ``iter_N/``, custom layouts): every checkpoint file inside
    (three levels deep) passes its ladder; nested DCP/DeepSpeed dirs are checked as such."""
    fmt = F.DIRECTORY
    files, nested = _walk(path, max_depth=3)
    if not files and not nested:
        return unverifiable(fmt, 0, "directory holds no checkpoint files")
    outcomes = []
    for rel in files:
        outcome = check_file(os.path.join(path, rel), deep=deep)
        outcomes.append(outcome.but(reason=f"{rel}: {outcome.reason}"))
    for rel in nested:
        outcome = check_dir(os.path.join(path, rel), deep=deep, depth=depth + 1)
        outcomes.append(outcome.but(reason=f"{rel}/: {outcome.reason}"))
    step = next((o.embedded_step for o in outcomes if o.embedded_step is not None), None)
    bad = worst(outcomes)
    if bad:
        return bad.but(format=fmt, embedded_step=step)
    level = min(o.level for o in outcomes)
    return valid(fmt, level, f"{len(outcomes)} checkpoint files/dirs inside intact", embedded_step=step)


def _walk(path: str, max_depth: int) -> tuple[list[str], list[str]]:
    files: list[str] = []
    nested: list[str] = []
    todo = [("", 0)]
    while todo and len(files) < _MAX_WALK_FILES:
        rel, level = todo.pop()
        here = os.path.join(path, rel)
        try:
            entries = sorted(os.scandir(here), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            child = os.path.join(rel, entry.name)
            if entry.name.startswith(".") or entry.is_symlink():
                continue
            if entry.is_dir():
                if F.detect_dir(entry.path) in (F.DCP, F.DEEPSPEED, F.LIGHTNING_DEEPSPEED):
                    nested.append(child)
                elif level + 1 < max_depth:
                    todo.append((child, level + 1))
            elif has_checkpoint_suffix(entry.name) or entry.name.endswith(".distcp"):
                if not entry.name.endswith(".distcp"):
                    files.append(child)
    return sorted(files), sorted(nested)


def dir_size_and_mtime(path: str) -> tuple[int, float]:
    """Total bytes and newest mtime of the files under ``path`` (symlinks not followed)."""
    total, newest = 0, os.stat(path).st_mtime
    for root, dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            total += st.st_size
            newest = max(newest, st.st_mtime)
    return total, newest

