"""What a checkpoint's *name* says: its step, epoch, version, whether it is a "last" alias, and
whether it is a temp/partial/quarantined file to ignore. Pure string functions, no I/O.

Why names: the resume point is the newest checkpoint by the step number in its name, never by
mtime (fragile on NFS, reset by copies) and never by lexical order (``step=900`` > ``step=10000``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from ..commit_marker import parse_aside_name
from .limits import MAX_STEP

# Suffixes of single-file checkpoints we look at. Directories are judged by content, not suffix.
CHECKPOINT_SUFFIXES = (".ckpt", ".pt", ".pth", ".bin", ".safetensors", ".tar", ".pkl", ".pickle")
_suffixes: tuple[str, ...] = CHECKPOINT_SUFFIXES  # plus those of formats registered later


def add_checkpoint_suffixes(suffixes: tuple[str, ...]) -> None:
    """Names ending so are checkpoint candidates too (a registered format's own suffixes:
    supervisor/checkpoints/formats/registry.py)."""
    global _suffixes
    new = tuple(s.lower() for s in suffixes if s and s.lower() not in _suffixes)
    if new:
        _suffixes = _suffixes + new
        parse_name.cache_clear()
        step_from_name.cache_clear()


def remove_checkpoint_suffixes(suffixes: tuple[str, ...]) -> None:
    """Undo :func:`add_checkpoint_suffixes` (the built-in suffixes stay)."""
    global _suffixes
    drop = {s.lower() for s in suffixes} - set(CHECKPOINT_SUFFIXES)
    if drop & set(_suffixes):
        _suffixes = tuple(s for s in _suffixes if s not in drop)
        parse_name.cache_clear()
        step_from_name.cache_clear()

QUARANTINE_PREFIX = "CORRUPT_"
# A quarantine batch's manifest: the sidecars of the files beyond the batch's first few hundred,
# one JSON object per line (supervisor/checkpoints/quarantine.py).
MANIFEST_PREFIX = f"{QUARANTINE_PREFIX}batch."
MANIFEST_SUFFIX = ".jsonl"


def is_manifest_name(name: str) -> bool:
    return name.startswith(MANIFEST_PREFIX) and name.endswith(MANIFEST_SUFFIX)


NEMO_UNFINISHED_SUFFIX = "-unfinished"  # NeMo creates <name>-unfinished before a save, removes it after

# Named step keys, strongest first. Each needs a separator (or the start) before the key so that
# "timestep", "max_steps=" and friends do not count. Digits are ASCII only ([0-9] under re.ASCII:
# "step=٩٩" is not step 99), and a number of more than MAX_STEP_DIGITS digits is not a step.
MAX_STEP_DIGITS = len(str(MAX_STEP))
_NUM = r"([0-9]+)(?![0-9])"
_FLAGS = re.IGNORECASE | re.ASCII
_SEP = r"(?:^|[-_.=/ ])"
_STEP_PATTERNS: tuple[re.Pattern[str], ...] = (
    re.compile(_SEP + r"(?:global_)?steps?[=_-]?" + _NUM, _FLAGS),  # step=900, global_step1200
    re.compile(r"^checkpoint[-_]([0-9]+)$", _FLAGS),  # HF checkpoint-1500
    re.compile(_SEP + r"iter(?:ation)?s?[=_-]?" + _NUM, _FLAGS),  # iter_0000100, iteration=5
    re.compile(r"^(?:model|ckpt|checkpoint|weights|state|snapshot|save)[-_=]?([0-9]+)$", _FLAGS),
    re.compile(r"^([0-9]+)$", re.ASCII),  # orbax-style numeric directories: 1000/
)
# Accelerate's automatic naming (ProjectConfiguration(automatic_checkpoint_naming=True)) writes
# checkpoints/checkpoint_<i> with i = 0, 1, 2... per save: the number is a save index, not a step.
# Only the bare directory-style name counts (checkpoint_500.pt is a step, HF's checkpoint-500 too).
_INDEX_NAME = re.compile(r"^checkpoint_([0-9]+)$", re.ASCII)
# A checkpoint named by its epoch alone (``epoch_3/``: Accelerate's save_state once per epoch, as in its
# examples and its test_checkpointing.py; ``epoch_3.pt``): the number counts epochs, so it orders the
# saves like a save index and is never a step (a name that also has a step, ``epoch=3-step=900``, is not one).
# So is a name that ends with its epoch and carries no step: MACE's ``<name>_run-<seed>_epoch-<N>.pt``,
# ``model_epoch_3.pt``, ``checkpoint-epoch5.pth``.
_EPOCH_NAME = re.compile(r"(?:^|[-_.])epochs?[-_=]?([0-9]+)$", _FLAGS)
_EPOCH = re.compile(_SEP + r"epochs?[=_-]?" + _NUM, _FLAGS)
_VERSION = re.compile(r"-v([0-9]+)$", re.ASCII)  # Lightning's name-collision counter: last-v1, step=9-v2
_LAST = re.compile(r"^(?:last|latest)(?:-v[0-9]+)?$|[-_]last$", _FLAGS)
_TEMP = re.compile(r"\.tmp(?:$|[-_.])|\.partial$|\.incomplete$|\.part$|\.swp$", re.IGNORECASE)


@dataclass(frozen=True)
class NameInfo:
    """The facts a checkpoint name carries. ``None`` means the name does not say."""

    name: str
    stem: str  # without checkpoint suffix and without the -vN version
    step: int | None
    epoch: int | None
    version: int  # 0 when no -vN; -1 for an old copy moved aside (``<name>.old-<nonce>``)
    is_last: bool  # last.ckpt, last-v1.ckpt, last/, latest.pt, ...-last.ckpt
    index: int | None = None  # a save index (Accelerate's checkpoint_<i>, epoch_<e>): orders saves, never a step

    @property
    def index_may_be_step(self) -> bool:
        """``checkpoint_<N>`` that Accelerate did not write names step N; an epoch never does."""
        return self.index is not None and _EPOCH_NAME.search(self.stem) is None


def strip_suffix(name: str) -> str:
    """``epoch=3-step=9500.ckpt`` -> ``epoch=3-step=9500``; names without a known suffix unchanged."""
    lowered = name.lower()
    for suffix in _suffixes:
        if lowered.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return name


def aside_original(name: str) -> str | None:
    """``last.old-<nonce>`` -> ``last``: the name of a checkpoint that a sharded save's publish
    moved aside (a crash between the two renames leaves it as the only complete copy), else None."""
    parts = parse_aside_name(name)
    return parts[0] if parts else None


@lru_cache(maxsize=16384)
def parse_name(name: str) -> NameInfo:
    """Step, epoch, version and last-ness from a file or directory name (no directory part).
    An old copy moved aside (``<name>.old-<nonce>``) says what ``<name>`` says, with version -1:
    it ranks below ``<name>`` itself on equal steps."""
    original = aside_original(name)
    if original is not None:
        info = parse_name(original)
        return NameInfo(name=name, stem=info.stem, step=info.step, epoch=info.epoch, version=-1,
                        is_last=info.is_last, index=info.index)
    stem = strip_suffix(name)
    version = 0
    match = _VERSION.search(stem)
    if match:
        version = _bounded_int(match.group(1)) or 0
        stem = stem[: match.start()]
    return NameInfo(
        name=name,
        stem=stem,
        step=step_from_name(name),
        epoch=_int_or_none(_EPOCH.search(stem)),
        version=version,
        is_last=bool(_LAST.search(stem)),
        index=save_index_from_name(name),
    )


def save_index_from_name(name: str) -> int | None:
    """The save index of Accelerate's automatic naming (``checkpoint_3`` -> 3) or of a name that is
    an epoch alone (``epoch_3`` -> 3), else None. Such a name carries no step (:func:`step_from_name`
    says None for it)."""
    name = aside_original(name) or name
    found = _INDEX_NAME.match(name)
    if found is None and step_from_name(name) is None:
        found = _EPOCH_NAME.search(strip_suffix(name))
    return _bounded_int(found.group(1)) if found else None


@lru_cache(maxsize=16384)
def step_from_name(name: str) -> int | None:
    """The training step a name carries, or None. ``step=900.ckpt`` -> 900,
    ``epoch=3-step=9500-v1.ckpt`` -> 9500, ``global_step1200`` -> 1200, ``checkpoint-1500`` -> 1500,
    ``model_00012000.pt`` -> 12000, ``ckpt_300.pt`` -> 300, ``iter_0000100`` -> 100.
    ``epoch=3.ckpt``, ``hpc_ckpt_3.ckpt`` and Accelerate's ``checkpoint_3`` (counters) carry no
    step. An old copy moved aside, ``step-900.old-<nonce>``, carries its original's step."""
    name = aside_original(name) or name
    if _INDEX_NAME.match(name):
        return None  # Accelerate's checkpoint_<i>: a save index
    stem = strip_suffix(name)
    version = _VERSION.search(stem)
    if version:
        stem = stem[: version.start()]
    for pattern in _STEP_PATTERNS:
        match = pattern.search(stem)
        if match:
            return _bounded_int(match.group(1))
    return None


def is_temp_name(name: str) -> bool:
    """A file being written right now by an atomic writer (ours: ``.<name>.tmp-<pid>-<rand>``;
    others: ``*.tmp``, ``*.partial``, ``*.incomplete``) or a staging dir (``tmp-checkpoint-*``)."""
    if _TEMP.search(name):
        return True
    lowered = name.lower()
    return lowered.startswith(("tmp-checkpoint-", "tmp_checkpoint-")) or lowered.endswith(
        NEMO_UNFINISHED_SUFFIX
    )


def final_name_of_temp(name: str) -> str | None:
    """The checkpoint a temp name will become, when the name says it: ``.step=9.ckpt.tmp-12-ab``
    -> ``step=9.ckpt``; ``x.ckpt.tmp`` -> ``x.ckpt``; ``x.ckpt-unfinished`` -> ``x.ckpt``."""
    if name.endswith(NEMO_UNFINISHED_SUFFIX):
        return name[: -len(NEMO_UNFINISHED_SUFFIX)] or None
    match = _TEMP.search(name)
    if not match:
        return None
    base = name[: match.start()]
    base = base.removeprefix(".")
    if not has_checkpoint_suffix(base) and has_checkpoint_suffix(base.rsplit(".", 1)[0]):
        base = base.rsplit(".", 1)[0]  # mkstemp-style ".<name>.<random>.tmp"
    return base or None


def unfinished_marker_names(name: str) -> tuple[str, ...]:
    """Names of the NeMo marker that says the save of ``name`` did not finish. NeMo strips
    ``.nemo``, ``.ckpt`` and ``-EMA`` before appending ``-unfinished`` (``step=100.ckpt`` ->
    ``step=100-unfinished``); the unstripped form is accepted too."""
    base = name.removesuffix(".nemo").removesuffix(".ckpt")
    names = {name + NEMO_UNFINISHED_SUFFIX, base + NEMO_UNFINISHED_SUFFIX,
             base.removesuffix("-EMA") + NEMO_UNFINISHED_SUFFIX}
    return tuple(sorted(names))


def is_ignored_name(name: str) -> bool:
    """Entries that are never checkpoint candidates: temp and partial files, hidden files,
    quarantined ``CORRUPT_*`` entries and their ``.json`` sidecars, NeMo ``-unfinished`` markers,
    JSON/YAML/text/log sidecars."""
    if not name or name.startswith((".", QUARANTINE_PREFIX)):
        return True
    if is_temp_name(name):
        return True
    return name.lower().endswith((".json", ".yaml", ".yml", ".txt", ".log", ".lock", ".py", ".md"))


def has_checkpoint_suffix(name: str) -> bool:
    return name.lower().endswith(_suffixes)


def _int_or_none(match: re.Match[str] | None) -> int | None:
    return _bounded_int(match.group(1)) if match else None


def _bounded_int(digits: str) -> int | None:
    """ASCII digits -> int; None for more than MAX_STEP_DIGITS of them (not a step, and int() of
    thousands of digits is slow or refused)."""
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= MAX_STEP_DIGITS else None
