"""Validation of directory checkpoints: DCP, DeepSpeed tag and save dirs, Lightning's DeepSpeed
``*.ckpt/`` dirs, HF Trainer ``checkpoint-N/`` and any other directory of checkpoint files.

Directory formats have no single commit marker that covers every rank, so each check rebuilds
the set of files the writer must have produced (from the manifest or the recorded world size)
and runs the file ladder on each. A directory saved through :mod:`supervisor.sharded` carries
one: its ``.supervisor-commit.json`` lists every file of every rank with its size (and CRC32 when
recorded). That list is checked first (a mismatch is CORRUPT), then the format's own check runs
as for any directory. Reasons say exactly what was checked.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ..commit_marker import MARKER, CommitState, verify_commit
from ..states import Verdict
from . import formats as F
from .allowlist import allowed_for
from .filecheck import check_file, check_safetensors, check_torch_zip, read_tensor_int, unsafe_reason
from .fsio import describe_oserror, read_regular, regular_fd
from .limits import MAX_PICKLE_BYTES, MAX_SHARDS, MAX_SMALL_FILE, ScanLimitError
from .naming import has_checkpoint_suffix, step_from_name
from .outcome import Outcome, corrupt, unverifiable, valid, worst
from .picklescan import (
    STEP_KEYS,
    Call,
    PickleScan,
    PickleScanError,
    TruncatedPickle,
    as_mapping,
    is_tensor,
    plain_int,
    scan_pickle,
    unknown_layout,
)
from .zipcheck import (
    ZipCheckError,
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


def _member(path: str, label: str, *, deep: bool, max_level: int = 3) -> Outcome:
    """check_file on a file inside a directory checkpoint; an OSError (a FIFO, a symlink loop, no
    permission) becomes this member's verdict instead of failing the whole directory's check."""
    try:
        outcome = check_file(path, deep=deep, max_level=max_level)
    except OSError as exc:
        outcome = unverifiable(F.UNKNOWN, 0, f"cannot read: {describe_oserror(exc)}", load_safe=False)
    return outcome.but(reason=f"{label}: {outcome.reason}")


def _read_text(path: str, limit: int = MAX_SMALL_FILE) -> str:
    """A small text file (JSON sidecar, DeepSpeed 'latest'), regular files only, bounded."""
    return read_regular(path, limit).decode("utf-8", errors="replace")


def check_dir(path: str, *, deep: bool = False, depth: int = 0) -> Outcome:
    """A committed directory: its commit marker, then its format's check. Otherwise the format's
    check alone."""
    if os.path.lexists(os.path.join(path, MARKER)):
        return check_committed(path, deep=deep, depth=depth)
    return check_content(path, deep=deep, depth=depth)


def check_content(path: str, *, deep: bool = False, depth: int = 0) -> Outcome:
    """Dispatch on the directory's detected format."""
    fmt = F.detect_dir(path)
    if fmt == F.DCP:
        return check_dcp(path, deep=deep)
    if fmt == F.LIGHTNING_DEEPSPEED:
        return check_lightning_deepspeed(path, deep=deep)
    if fmt == F.DEEPSPEED:
        names = os.listdir(path)
        if any(n.endswith(("_model_states.pt", "_optim_states.pt")) for n in names):
            return check_deepspeed_tag(path, deep=deep)
        return check_deepspeed_save_dir(path, deep=deep)
    if fmt == F.HF_TRAINER:
        return check_hf(path, deep=deep, depth=depth)
    return check_generic_dir(path, deep=deep, depth=depth)


# ---------------------------------------------------------------------------- our commit marker


def check_committed(path: str, *, deep: bool = False, depth: int = 0,
                    content: Callable[[], Outcome] | None = None) -> Outcome:
    """A directory committed by :mod:`supervisor.sharded`: the marker's manifest against the
    files (names, sizes; CRC32s with ``deep``), then the format's own check (``content``, default
    :func:`check_content`). The marker is written after every rank finished and fsynced, so a
    mismatch means the directory changed after the commit or the commit is torn: CORRUPT."""
    commit = verify_commit(path, deep=deep)
    fmt = F.detect_dir(path)
    if commit.state is CommitState.TORN:
        level = 4 if "CRC32" in commit.reason else 1
        return corrupt(fmt, level, f"commit marker: {commit.reason}", embedded_step=commit.step)
    if commit.state is CommitState.UNCOMMITTED:  # the marker vanished between two looks
        return (content or (lambda: check_content(path, deep=deep, depth=depth)))()
    outcome = (content or (lambda: check_content(path, deep=deep, depth=depth)))()
    step = outcome.embedded_step if outcome.embedded_step is not None else commit.step
    if outcome.verdict is Verdict.CORRUPT:
        return outcome.but(reason=f"{outcome.reason} (although its commit marker matches the file sizes)",
                           embedded_step=step)
    if commit.state is CommitState.CHANGED:
        return unverifiable(outcome.format, min(outcome.level, 2), f"commit marker: {commit.reason}; {outcome.reason}",
                            embedded_step=step, epoch=outcome.epoch, facts=outcome.facts, load_safe=outcome.load_safe)
    summary = f"committed by {commit.world_size or '?'} rank(s): {commit.reason}"
    hostile = loose_pickle_problem(path, outcome.format, deep=deep)
    if hostile is not None:
        return hostile.but(embedded_step=step)
    if outcome.verdict is Verdict.UNVERIFIABLE and outcome.level == 0 and outcome.load_safe:
        # A layout no validator knows (numpy shards, a custom writer): the manifest is the check.
        return valid(outcome.format, 2, f"{summary}; no checkpoint format recognised, every file that holds "
                                        f"a pickle scanned ({outcome.reason})", embedded_step=step)
    level = outcome.level
    if deep and commit.crc_checked and outcome.verdict is Verdict.VALID:
        level = max(level, 4)
    return outcome.but(reason=f"{summary}; {outcome.reason}", embedded_step=step, level=level)


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
        try:
            data = read_regular(meta_path, MAX_PICKLE_BYTES)
        except ScanLimitError as exc:
            return unverifiable(fmt, 1, f"{name}: {exc.reason}", load_safe=False)
        if not data:
            return corrupt(fmt, 1, f"{name} is empty")
        try:  # DCP reads .metadata with plain pickle.load: its globals are a code path too
            scan = scan_pickle(data)
        except PickleScanError as exc:
            return corrupt(fmt, 2, f"{name}: {exc}")
        except ScanLimitError as exc:
            return unverifiable(fmt, 2, f"{name}: {exc.reason}", load_safe=False)
        if scan.end != len(data):
            return corrupt(fmt, 2, f"{name}: {len(data) - scan.end} bytes after the pickle", load_safe=False)
        if unsafe := unsafe_reason([scan], allowed_for(name)):
            return corrupt(fmt, 2, f"{name}: {unsafe}", load_safe=False)
        root = scan.root
        if layout := unknown_layout(root):
            return corrupt(fmt, 2, f"{name}: tensor layout {layout} does not exist: DCP cannot read it (damaged)")
        found = _dcp_items(root)
        understood = understood and found is not None
        items.extend(found or [])
    shard_names = sorted(n for n in names if n.endswith(".distcp"))
    if not understood or not items:
        return _dcp_fallback(path, shard_names)
    need: dict[str, int] = {}
    for rel, offset, length, *_ in items:
        if os.path.isabs(rel) or ".." in Path(rel).parts or "\0" in rel:
            return corrupt(fmt, 2, f"manifest names a path outside the checkpoint: {rel[:80]!r}")
        if offset < 0 or length < 0:
            return corrupt(fmt, 2, f"manifest gives {rel[:80]!r} a negative extent")
        need[rel] = max(need.get(rel, 0), offset + length)
    for rel, end in sorted(need.items()):
        try:
            st = os.stat(os.path.join(path, rel))
        except FileNotFoundError:
            return corrupt(fmt, 2, f"shard {rel} listed in .metadata is missing")
        if not stat.S_ISREG(st.st_mode):
            return unverifiable(fmt, 2, f"shard {rel} is not a regular file", load_safe=False)
        size = st.st_size
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
        if not (isinstance(rel, str) and type(offset) is int and type(length) is int):
            return None
        fqn = index.attrs().get("fqn") if isinstance(index, Call) else None
        transformed = bool(attrs.get("transform_descriptors"))
        out.append((rel, offset, length, fqn if isinstance(fqn, str) else "", transformed))
    return out


def _dcp_fallback(path: str, shard_names: list[str]) -> Outcome:
    if not shard_names:
        return unverifiable(F.DCP, 1, ".metadata present but its layout was not understood and no .distcp files exist")
    for name in shard_names:
        if os.stat(os.path.join(path, name)).st_size == 0:
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
        with regular_fd(shard) as (fd, st):
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
                # Each item is a torch.save zip that DCP hands to torch.load (bytes items with
                # weights_only=False): the same ladder as a file, data.pkl scanned included.
                item = check_torch_zip(fd, length, base=offset, deep=deep,
                                       cache_key=crc_cache_key(shard, st, offset) if deep else None)
                where = f"item {fqn or offset} in {rel}"
                if item.verdict is Verdict.CORRUPT:
                    return corrupt(fmt, max(item.level, 3), f"{where}: {item.reason}", load_safe=item.load_safe)
                if item.verdict is not Verdict.VALID:
                    if not item.load_safe or not deep:
                        return unverifiable(fmt, 3, f"{where}: {item.reason}", load_safe=item.load_safe)
                    crc_missing = True
                if _is_step_fqn(fqn) and step is None:
                    step = _item_int(fd, offset, length)
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
    except (ZipCheckError, PickleScanError, ScanLimitError):
        return None
    if plain_int(root) is not None:
        return root
    return plain_int(read_tensor_int(fd, base, index, root)) if is_tensor(root) else None


# ---------------------------------------------------------------------------- DeepSpeed

_OPTIM = re.compile(r"^(bf16_)?zero_pp_rank_([0-9]{1,7})_mp_rank_([0-9]{1,7})_optim_states\.pt$", re.ASCII)
_ZERO3_MODEL = re.compile(r"^zero_pp_rank_([0-9]{1,7})_mp_rank_([0-9]{1,7})_model_states\.pt$", re.ASCII)
_MP_MODEL = re.compile(r"^mp_rank_([0-9]{1,7})_model_states\.pt$", re.ASCII)


def check_deepspeed_tag(path: str, *, deep: bool = False, in_place: bool = False,
                        reference_mtime: float | None = None) -> Outcome:
    """A ``global_stepN/`` tag: the model states give ``dp_world_size``/``mp_world_size``; every
    implied model and optimizer shard must exist and pass L1-L3 (L4 with ``deep``): DeepSpeed
    unpickles every shard, so every shard's pickle is scanned. Shard mtimes must lie in one save
    window (``in_place`` tags, rewritten each save, are corrupt otherwise)."""
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
    head = _member(os.path.join(path, primary), primary, deep=deep)
    if head.verdict is not Verdict.VALID and not (deep and head.verdict is Verdict.UNVERIFIABLE):
        return head.but(format=fmt)
    facts = dict(head.facts)
    dp, mp = facts.get("dp_world_size"), facts.get("mp_world_size", 1)
    if any(type(v) is int and v > MAX_SHARDS for v in (dp, mp)) or (
            type(dp) is int and type(mp) is int and dp * mp > MAX_SHARDS):
        return corrupt(fmt, 3, f"{primary}: implausible world size (dp_world_size={dp}, mp_world_size={mp})")
    expected, note = _expected_deepspeed_files(names, dp, mp, zero3, optim_files, facts.get("zero_stage"))
    if expected is None:
        return corrupt(fmt, 2, note)
    missing = sorted(set(expected) - set(names))
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        return corrupt(fmt, 2, f"missing shard(s) {shown} ({note})")
    outcomes: list[Outcome] = [head] if head.verdict is not Verdict.VALID else []
    shard_files = [n for n in names if n.endswith(".pt") and n != primary]
    for name in shard_files:
        outcome = _member(os.path.join(path, name), name, deep=deep)
        outcomes.append(outcome)
        if name == (optim_files[0] if optim_files else None) and outcome.verdict is Verdict.VALID:
            first_ranks = [n for n in optim_files if n.endswith("_mp_rank_00_optim_states.pt")]
            problem = _partition_problem(outcome.facts, len(first_ranks))
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
                              zero_stage: Any) -> tuple[list[str] | None, str]:
    """The shard names the world size implies; (None, reason) when the shards present imply more
    than MAX_SHARDS files (a damaged or crafted name, not a DeepSpeed save)."""
    if type(mp) is not int or mp < 1:
        mp = 1
    if type(dp) is not int or dp < 1:
        ranks = [int(m.group(2)) for m in map(_OPTIM.match, optim_files) if m]
        dp = max(ranks) + 1 if ranks else 1
        note = f"dp_world_size not recorded; inferred {dp} from the shards present"
    else:
        note = f"dp_world_size={dp}, mp_world_size={mp}"
    if dp * mp > MAX_SHARDS:
        return None, f"implausible shard names: they imply {dp * mp:,} shards ({note})"
    expected = []
    for m in range(mp):
        if zero3:
            expected += [f"zero_pp_rank_{d}_mp_rank_{m:02d}_model_states.pt" for d in range(dp)]
        else:
            expected.append(f"mp_rank_{m:02d}_model_states.pt")
    has_optim = bool(optim_files) or (type(zero_stage) is int and zero_stage >= 1)
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
        tag = _read_text(latest, 4096).strip()
    except FileNotFoundError:
        return unverifiable(fmt, 0, "DeepSpeed save dir without 'latest': check its global_step*/ dirs one by one")
    except ScanLimitError:
        return corrupt(fmt, 1, "'latest' is not a tag name (over 4 KiB)")
    if not tag:
        return corrupt(fmt, 1, "'latest' is empty (lost in a crash before it reached disk)")
    tag_dir = os.path.join(path, tag)
    if os.path.sep in tag or "\0" in tag or tag in (".", "..") or not os.path.isdir(tag_dir):
        return corrupt(fmt, 1, f"'latest' names tag {tag[:80]!r}, which does not exist")
    if os.path.lexists(os.path.join(tag_dir, MARKER)):
        # Committed: the marker proves the shard set, and 'latest' was written after the commit
        # (so its age says nothing about the shards).
        outcome = check_committed(tag_dir, deep=deep, content=lambda: check_deepspeed_tag(tag_dir, deep=deep))
    else:
        outcome = check_deepspeed_tag(tag_dir, deep=deep, reference_mtime=os.stat(latest).st_mtime)
    step = outcome.embedded_step if outcome.embedded_step is not None else step_from_name(tag)
    return outcome.but(reason=f"tag {tag}: {outcome.reason}", embedded_step=step)


def check_lightning_deepspeed(path: str, *, deep: bool = False) -> Outcome:
    """Lightning's DeepSpeed strategy saves ``<name>.ckpt/`` as a DeepSpeed dir with the fixed tag
    ``checkpoint``, rewritten in place on every save: mixed mtimes mean a torn overwrite."""
    latest = os.path.join(path, "latest")
    tag = "checkpoint"
    if os.path.isfile(latest):
        try:
            tag = _read_text(latest, 4096).strip() or tag
        except ScanLimitError:
            return corrupt(F.LIGHTNING_DEEPSPEED, 1, "'latest' is not a tag name (over 4 KiB)")
    tag_dir = os.path.join(path, tag)
    if os.path.sep in tag or "\0" in tag or tag in (".", "..") or not os.path.isdir(tag_dir):
        return corrupt(F.LIGHTNING_DEEPSPEED, 1, f"tag dir {tag[:80]}/ missing")
    outcome = check_deepspeed_tag(tag_dir, deep=deep, in_place=True)
    return outcome.but(format=F.LIGHTNING_DEEPSPEED, reason=f"{tag}/: {outcome.reason}")


# ---------------------------------------------------------------------------- HF Trainer

_RNG_STATE = re.compile(r"^rng_state_([0-9]{1,9})\.pth$", re.ASCII)
_TRAINING_ARGS = "training_args.bin"
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
        outcome = _member(os.path.join(path, name), name, deep=deep)
        if name == _TRAINING_ARGS and outcome.verdict is Verdict.CORRUPT and not outcome.load_safe:
            # Trainer never loads training_args.bin on resume; subclasses from other libraries
            # (TRL's SFTConfig...) are not on the allowlist: unknown, not torn.
            outcome = unverifiable(fmt, 3, f"{outcome.reason} (HF Trainer does not load it on resume)")
        outcomes.append(outcome)
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
                 embedded_step=step, epoch=_whole_epoch(epoch))


def _whole_epoch(epoch: Any) -> int | None:
    """trainer_state.json's epoch is a float (1.0, 2.5); JSON also allows Infinity and NaN."""
    if isinstance(epoch, float) and math.isfinite(epoch):
        return plain_int(int(epoch))
    return plain_int(epoch)


# ---------------------------------------------------------------------------- any directory


_ACCELERATE_RNG = re.compile(r"^random_states_[0-9]+\.pkl$", re.ASCII)


def check_generic_dir(path: str, *, deep: bool = False, depth: int = 0) -> Outcome:
    """Any other directory (Megatron ``iter_N/``, custom layouts): every checkpoint file inside
    (three levels deep) passes its ladder; nested DCP/DeepSpeed dirs are checked as such."""
    fmt = F.DIRECTORY
    files, nested = _walk(path, max_depth=3)
    if not files and not nested:
        return unverifiable(fmt, 0, "directory holds no checkpoint files")
    outcomes = []
    for rel in files:
        outcomes.append(_member(os.path.join(path, rel), rel, deep=deep))
    for rel in nested:
        outcome = check_dir(os.path.join(path, rel), deep=deep, depth=depth + 1)
        outcomes.append(outcome.but(reason=f"{rel}/: {outcome.reason}"))
    # Accelerate's random_states_<rank>.pkl holds a "step" that counts gradient-accumulation
    # micro-steps (reset every epoch), not the training step: never the directory's step.
    step = next((o.embedded_step for rel, o in zip(files, outcomes)
                 if o.embedded_step is not None and not _ACCELERATE_RNG.match(os.path.basename(rel))), None)
    if step is None:
        step = next((o.embedded_step for o in outcomes[len(files):] if o.embedded_step is not None), None)
    loose = loose_pickle_problem(path, fmt, deep=deep)
    if loose is not None:
        outcomes.insert(0, loose)
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
            if entry.is_dir(follow_symlinks=False):
                if F.detect_dir(entry.path) in (F.DCP, F.DEEPSPEED, F.LIGHTNING_DEEPSPEED):
                    nested.append(child)
                elif level + 1 < max_depth:
                    todo.append((child, level + 1))
            elif has_checkpoint_suffix(entry.name):
                files.append(child)  # a FIFO or device too: its check reports it, never opens it
    return sorted(files), sorted(nested)


_PROBE_BYTES = 64 << 10
_OWN_CHECK_DIRS = (F.DCP, F.DEEPSPEED, F.LIGHTNING_DEEPSPEED)


def loose_pickle_problem(path: str, fmt: str, *, deep: bool = False) -> Outcome | None:
    """Files of a directory checkpoint that its format's check does not read, but a loader might
    unpickle: any regular file (dot files too, three levels deep) without a checkpoint suffix at
    the top level. One that holds a zip, a legacy torch file or a pickle is scanned with the same
    inert scanner; the first that is damaged or names globals outside the allowlist decides (a
    directory is never safer than its worst file). Data files (JSON, text, numpy) are not pickles
    and are passed over. None when nothing is wrong."""
    for rel in _all_files(path, max_depth=3):
        name = os.path.basename(rel)
        top = os.sep not in rel
        if name == MARKER or (top and has_checkpoint_suffix(name)):
            continue  # the format's own check (or the commit marker) read it
        if fmt == F.DCP and top and (name.endswith(".distcp") or name.endswith(".metadata")
                                     or name == ".metadata.tmp"):
            continue
        outcome = _loose_file(os.path.join(path, rel), rel, deep=deep)
        if outcome is not None:
            return outcome.but(format=fmt)
    return None


def _loose_file(path: str, rel: str, *, deep: bool) -> Outcome | None:
    try:
        with regular_fd(path) as (fd, st):
            head = pread_exact(fd, _PROBE_BYTES, 0)
            kind = F.sniff_bytes(head[: F.HEAD_BYTES], os.path.basename(path))
            if kind in (F.TORCH_ZIP, F.TORCH_LEGACY, F.PICKLE):
                verdict = _member(path, rel, deep=deep)
                # a zip with no data.pkl is no torch file (logs.zip): nothing a loader unpickles
                return None if verdict.verdict is Verdict.VALID or verdict.format == F.ZIP else verdict
            first = _first_pickle(fd, st.st_size, head)
    except OSError as exc:
        return unverifiable(F.UNKNOWN, 0, f"{rel}: cannot read: {describe_oserror(exc)}", load_safe=False)
    if first is None:
        return None  # not a pickle: a data file no unpickler reads
    if isinstance(first, Outcome):
        return first.but(reason=f"{rel}: {first.reason}")
    if unsafe := unsafe_reason([first], allowed_for(os.path.basename(path))):
        return corrupt(F.PICKLE, 3, f"{rel}: {unsafe}", load_safe=False)
    return None


def _first_pickle(fd: int, size: int, head: bytes) -> PickleScan | Outcome | None:
    """The scan of the pickle a ``pickle.load`` of this file would run, None when the file does
    not start with one (bounded: the probe, then at most MAX_PICKLE_BYTES)."""
    try:
        try:
            return scan_pickle(head)
        except TruncatedPickle:
            if len(head) >= size:
                return None
        if size > MAX_PICKLE_BYTES:
            return unverifiable(F.PICKLE, 2, f"starts like a pickle longer than {MAX_PICKLE_BYTES:,} bytes: "
                                             "too large to scan", load_safe=False)
        return scan_pickle(pread_exact(fd, size, 0))
    except ScanLimitError as exc:
        return unverifiable(F.PICKLE, 2, exc.reason, load_safe=False)
    except PickleScanError:
        return None


def _all_files(path: str, max_depth: int) -> list[str]:
    """Relative paths of the regular files under ``path`` (symlinks never followed), not inside
    nested DCP or DeepSpeed directories (their own checks read those, item by item)."""
    files: list[str] = []
    todo = [("", 0)]
    while todo and len(files) < _MAX_WALK_FILES:
        rel, level = todo.pop()
        try:
            entries = sorted(os.scandir(os.path.join(path, rel)), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            child = os.path.join(rel, entry.name)
            if entry.is_symlink():
                continue
            if entry.is_dir(follow_symlinks=False):
                if level + 1 < max_depth and F.detect_dir(entry.path) not in _OWN_CHECK_DIRS:
                    todo.append((child, level + 1))
            elif entry.is_file(follow_symlinks=False):
                files.append(child)
    return sorted(files)


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

