"""Where a checkpoint's step comes from, when several places say: a pure precedence.

People keep the step in different places: in the name (``step=900.ckpt``, ``checkpoint-1500/``),
inside the file (``iter_num`` in nanoGPT's ``ckpt.pt``, Lightning's ``global_step``, HF's
``trainer_state.json``), or nowhere but the log (an in-place ``model.pt``). The order, strongest
first (docs/checkpoint-validation.md, "Where the step comes from"):

1. the user's rule ``checkpoint.step_from`` (``name:REGEX``, ``key:NAME``, ``log``), when it yields
   a step;
2. the step in the name, unless the name's number is a save *index* (Accelerate's automatic
   ``checkpoint_<i>`` directories count saves 0, 1, 2...: an index orders saves, it is never a step);
3. the step inside, read by the inert scan (never by unpickling);
4. the step the log reported when the save landed (zero-code mode: the watch saw the save, the
   output knew the step).

The winner is recorded with its source; sources that disagree with it are named in the reason.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from .limits import MAX_STEP

# Accelerate's save_state() writes these next to the model and optimizer files.
_ACCELERATE_STATE = re.compile(r"^random_states_[0-9]+\.pkl$", re.ASCII)


@dataclass(frozen=True)
class StepRule:
    """A parsed ``checkpoint.step_from``: ``kind`` is ``name``, ``key`` or ``log``."""

    kind: str
    arg: str = ""

    @property
    def text(self) -> str:
        return f"{self.kind}:{self.arg}" if self.arg else self.kind

    def step_from_name(self, name: str) -> int | None:
        """The rule's step for ``name`` (a ``name:REGEX`` rule; its first group), else None."""
        if self.kind != "name":
            return None
        found = re.search(self.arg, name)
        if found is None or not found.groups():
            return None
        return bounded_step(found.group(1))


def parse_step_rule(text: str | None) -> StepRule | None:
    """``name:REGEX`` | ``key:NAME`` | ``log`` -> a rule; None for None/empty. The config module
    has already validated the text (supervisor/config.py); anything else here is None."""
    if not text:
        return None
    kind, _, arg = text.partition(":")
    if kind == "log" and not arg:
        return StepRule("log")
    if kind in ("name", "key") and arg:
        return StepRule(kind, arg)
    return None


def bounded_step(text: str | None) -> int | None:
    """1-16 ASCII digits at most MAX_STEP -> int, else None."""
    if not text or not text.isascii() or not text.isdigit():
        return None
    digits = text.lstrip("0") or "0"
    if len(digits) > len(str(MAX_STEP)):
        return None
    value = int(digits)
    return value if value <= MAX_STEP else None


def is_accelerate_state_dir(names: Iterable[str]) -> bool:
    """A directory Accelerate's ``save_state`` wrote: it holds ``random_states_<rank>.pkl`` and no
    ``trainer_state.json`` (HF Trainer writes both, and its directory name is a step)."""
    listed = set(names)
    return "trainer_state.json" not in listed and any(_ACCELERATE_STATE.match(n) for n in listed)


@dataclass(frozen=True)
class StepEvidence:
    """What each place says about one checkpoint's step. None: that place does not say."""

    name: str
    name_step: int | None = None  # from the name (supervisor/checkpoints/naming.py)
    name_is_index: bool = False  # the name's number counts saves (Accelerate checkpoint_<i>)
    inside_step: int | None = None  # read by the inert scan
    inside_key: str | None = None  # the key it was under ("iter_num"), when a key of the pickle
    inside_where: str | None = None  # where else inside: "trainer_state.json", "DCP metadata"...
    log_step: int | None = None  # the step the log reported when the save landed


@dataclass(frozen=True)
class StepChoice:
    """The step of a checkpoint and where it came from. ``step`` None: no source said (``index``
    may still order the save among its siblings)."""

    step: int | None
    source: str | None  # "name", "key iter_num", "log", "rule name:...", None
    index: int | None  # the save index in the name, when the name counts saves
    reason: str

    @property
    def described(self) -> str:
        """``240 (key iter_num)``, ``- (save index 3)``, ``-``: for listings."""
        if self.step is not None:
            return f"{self.step} ({self.source})"
        if self.index is not None:
            return f"- (save index {self.index})"
        return "-"


def choose_step(evidence: StepEvidence, rule: StepRule | None = None) -> StepChoice:
    """Apply the module's precedence to one checkpoint's evidence."""
    index = evidence.name_step if evidence.name_is_index else None
    name_step = None if evidence.name_is_index else evidence.name_step
    inside_source = (f"key {evidence.inside_key}" if evidence.inside_key
                     else evidence.inside_where or "inside the file")
    candidates: list[tuple[int, str]] = []
    if rule is not None:
        ruled = _by_rule(evidence, rule)
        if ruled is not None:
            candidates.append((ruled, f"rule {rule.text}"))
    if name_step is not None:
        candidates.append((name_step, "name"))
    if evidence.inside_step is not None:
        candidates.append((evidence.inside_step, inside_source))
    if evidence.log_step is not None:
        candidates.append((evidence.log_step, "log"))
    if not candidates:
        what = f"save index {index} in the name, no step anywhere" if index is not None else "no step anywhere"
        return StepChoice(None, None, index, what)
    step, source = candidates[0]
    others = [f"{s} from {where}" for s, where in candidates[1:] if s != step]
    reason = f"step {step} from {source}"
    if others:
        reason += f" (also {', '.join(others)}: {source} decides)"
    return StepChoice(step, source, index, reason)


def _by_rule(evidence: StepEvidence, rule: StepRule) -> int | None:
    if rule.kind == "name":
        return rule.step_from_name(evidence.name)
    if rule.kind == "key":
        return evidence.inside_step if evidence.inside_key == rule.arg.rsplit(".", 1)[-1] else None
    return evidence.log_step  # "log"
