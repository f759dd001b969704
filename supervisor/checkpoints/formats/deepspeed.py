"""DeepSpeed checkpoints: a tag directory (``global_stepN/``: ``mp_rank_XX_model_states.pt`` and,
with ZeRO, one ``*_optim_states.pt`` per data-parallel rank) or a save directory whose ``latest``
names the tag to load. No commit marker: ``latest`` is written by rank 0 before the final
barrier, so the tag it names is checked in full, not trusted. The step is the model states'
``global_steps``, else the tag's name.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ...commit_marker import MARKER
from ...states import Verdict
from ..fsio import read_regular
from ..limits import MAX_SHARDS, MAX_SMALL_FILE, ScanLimitError
from ..naming import step_from_name
from ..outcome import Outcome, corrupt, unverifiable, valid, worst
from .base import DirContext, DirFormat
from .kinds import DEEPSPEED

# Shards of one committed DeepSpeed tag are written in one save window. A wider mtime spread
# means files from different saves (in-place overwrite interrupted). Seconds.
MTIME_SPREAD_LIMIT_S = 600.0


class DeepSpeed(DirFormat):
    name = DEEPSPEED
    step_where = "DeepSpeed tag"
    commit_marker = None
    nests = True  # a global_stepN/ inside an HF Trainer checkpoint

    def detect(self, path: Path, names: frozenset[str]) -> bool:
        if any(is_ds_states_name(n) for n in names):
            return True
        return "latest" in names and (path / "latest").is_file()

    def validate(self, path: str, ctx: DirContext) -> Outcome:
        if any(is_ds_states_name(n) for n in os.listdir(path)):
            return check_deepspeed_tag(path, ctx)
        return check_deepspeed_save_dir(path, ctx)


FORMAT = DeepSpeed()


def is_ds_states_name(name: str) -> bool:
    return name.endswith(("_model_states.pt", "_optim_states.pt"))


def read_text(path: str, limit: int = MAX_SMALL_FILE) -> str:
    """A small text file (DeepSpeed 'latest'), regular files only, bounded."""
    return read_regular(path, limit).decode("utf-8", errors="replace")


_OPTIM = re.compile(r"^(bf16_)?zero_pp_rank_([0-9]{1,7})_mp_rank_([0-9]{1,7})_optim_states\.pt$", re.ASCII)
_ZERO3_MODEL = re.compile(r"^zero_pp_rank_([0-9]{1,7})_mp_rank_([0-9]{1,7})_model_states\.pt$", re.ASCII)
_MP_MODEL = re.compile(r"^mp_rank_([0-9]{1,7})_model_states\.pt$", re.ASCII)


def check_deepspeed_tag(path: str, ctx: DirContext, *, in_place: bool = False,
                        reference_mtime: float | None = None) -> Outcome:
    """A ``global_stepN/`` tag: the model states give ``dp_world_size``/``mp_world_size``; every
    implied model and optimizer shard must exist and pass L1-L3 (L4 with ``deep``): DeepSpeed
    unpickles every shard, so every shard's pickle is scanned. Shard mtimes must lie in one save
    window (``in_place`` tags, rewritten each save, are corrupt otherwise)."""
    fmt = DEEPSPEED
    deep = ctx.deep
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
    head = ctx.member(os.path.join(path, primary), primary)
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
        outcome = ctx.member(os.path.join(path, name), name)
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


def check_deepspeed_save_dir(path: str, ctx: DirContext) -> Outcome:
    """A DeepSpeed save dir: ``latest`` names the tag to load. It is written by rank 0 before the
    final barrier, so the tag it names is checked in full, not trusted."""
    fmt = DEEPSPEED
    latest = os.path.join(path, "latest")
    try:
        tag = read_text(latest, 4096).strip()
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
        outcome = ctx.committed(tag_dir, lambda: check_deepspeed_tag(tag_dir, ctx))
    else:
        outcome = check_deepspeed_tag(tag_dir, ctx, reference_mtime=os.stat(latest).st_mtime)
    step = outcome.embedded_step if outcome.embedded_step is not None else step_from_name(tag)
    return outcome.but(reason=f"tag {tag}: {outcome.reason}", embedded_step=step)
