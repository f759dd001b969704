"""Lightning's DeepSpeed strategy: ``<name>.ckpt/`` is a DeepSpeed save dir with the fixed tag
``checkpoint``, rewritten in place on every save (mixed shard mtimes: a torn overwrite). No commit
marker; the step is the model states' ``global_steps``.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..limits import ScanLimitError
from ..outcome import Outcome, corrupt
from .base import DirContext, DirFormat
from .deepspeed import check_deepspeed_tag, is_ds_states_name, read_text
from .kinds import LIGHTNING_DEEPSPEED


class LightningDeepSpeed(DirFormat):
    name = LIGHTNING_DEEPSPEED
    step_where = "DeepSpeed tag"
    commit_marker = None
    nests = True

    def detect(self, path: Path, names: frozenset[str]) -> bool:
        if "checkpoint" not in names or not (path / "checkpoint").is_dir():
            return False
        try:
            return any(is_ds_states_name(n) for n in os.listdir(path / "checkpoint"))
        except OSError:
            return False

    def validate(self, path: str, ctx: DirContext) -> Outcome:
        return check_lightning_deepspeed(path, ctx)


FORMAT = LightningDeepSpeed()


def check_lightning_deepspeed(path: str, ctx: DirContext) -> Outcome:
    """Lightning's DeepSpeed strategy saves ``<name>.ckpt/`` as a DeepSpeed dir with the fixed tag
    ``checkpoint``, rewritten in place on every save: mixed mtimes mean a torn overwrite."""
    latest = os.path.join(path, "latest")
    tag = "checkpoint"
    if os.path.isfile(latest):
        try:
            tag = read_text(latest, 4096).strip() or tag
        except ScanLimitError:
            return corrupt(LIGHTNING_DEEPSPEED, 1, "'latest' is not a tag name (over 4 KiB)")
    tag_dir = os.path.join(path, tag)
    if os.path.sep in tag or "\0" in tag or tag in (".", "..") or not os.path.isdir(tag_dir):
        return corrupt(LIGHTNING_DEEPSPEED, 1, f"tag dir {tag[:80]}/ missing")
    outcome = check_deepspeed_tag(tag_dir, ctx, in_place=True)
    return outcome.but(format=LIGHTNING_DEEPSPEED, reason=f"{tag}/: {outcome.reason}")
