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
4. the step the log reported for the save *after* it landed (zero-code mode): a script that prints
   nothing while it trains reports a save's step on a line printed right after the save
   (``epoch 2: {..., 'epoch': 2, 'step': 30}`` after ``epoch_2/``). Believed only when the line names
   the epoch the save's name counts and the output has never named an epoch before a save of that
   epoch began (:func:`log_step_after_save`): an output that counts epochs from 1 while the names
   count from 0 (or the other way round), or that names the epoch on its progress lines, is told
   apart by that, and then this source says nothing;
5. the step the log reported when the save began (the step it had printed last: a lower bound).

The winner is recorded with its source; sources that disagree with it are named in the reason.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

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
    log_step: int | None = None  # the step the log had reported when the save began (a lower bound)
    log_after_step: int | None = None  # the step the log reported for the save after it landed


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
    if evidence.log_after_step is not None:
        candidates.append((evidence.log_after_step, LOG_AFTER_SAVE))
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
    return evidence.log_after_step if evidence.log_after_step is not None else evidence.log_step  # "log"


LOG_AFTER_SAVE = "log after the save"  # the source name of precedence 4


@dataclass(frozen=True)
class StepLine:
    """An output line that reported the global step. ``at``: when the supervisor read it (lines
    and saves seen at the same moment count as the save first: the watch polls after the output
    is read, so a save and the line printed right after it can be seen together)."""

    at: float
    step: int
    epoch: int | None = None  # the one whole epoch the line names (supervisor/progress.py ``epoch_named``)
    wall: float | None = None  # the wall clock (time.time()) when it was read: comparable with file times


@dataclass(frozen=True)
class SaveSeen:
    """A save of this attempt, from the moment the watch first saw it being written."""

    at: float
    epoch: int | None = None  # the epoch its name counts (``epoch_2/``, ``epoch=2.ckpt``), None: none
    reported: int | None = None  # the step the output had reported then: the lower bound of its step


@dataclass(frozen=True)
class AfterSave:
    """What the output said about one save's step after the save. ``settled`` False: nothing yet,
    ask again when more output came (or the attempt ended). ``step`` None: nothing usable (the
    step stays the lower bound read when the save began); ``reason`` says why either way."""

    step: int | None
    settled: bool
    reason: str


def numbering_broken(line: StepLine, saves: Sequence[SaveSeen]) -> str | None:
    """Why ``line`` shows that the output's epochs are not the names' epochs, or are not named
    after the save (None: it does not). A line that names epoch E before any save of epoch E
    began is a progress line within E, or counts epochs differently from the names (from 1 while
    they count from 0: its E is the names' E-1; the other way round its first epoch has no save).
    Either way a line naming E after a save of E cannot be taken for that save's report."""
    if line.epoch is None or any(s.epoch == line.epoch and s.at <= line.at for s in saves):
        return None
    return (f"the output named epoch {line.epoch} (step {line.step}) before a save of epoch {line.epoch} "
            "began: its epochs are not counted after the saves as their names count them")


def log_step_after_save(save: SaveSeen, log_at_start: int | None, lines: Sequence[StepLine],
                        saves: Sequence[SaveSeen], *, ended: bool, broken: str | None = None) -> AfterSave:
    """The step the output reported for ``save`` after it: the first step line read after the save
    began, before the next save began, when that line names the save's epoch, is not below the
    step the output had reported when the save began (``log_at_start``), and the output's epochs
    are the names' (``broken`` None: no earlier line broke the pairing, see :func:`numbering_broken`;
    the lines given are checked too). ``lines``: this attempt's step lines in reading order;
    ``saves``: its saves; ``ended``: the attempt is over, no more output will come."""
    if save.epoch is None:
        return AfterSave(None, True, "its name counts no epoch: a line after it cannot be told from further training")
    next_begin = min((s.at for s in saves if s.at > save.at), default=None)
    after = [ln for ln in lines if ln.at >= save.at and (next_begin is None or ln.at < next_begin)]
    if not after:
        if ended or next_begin is not None:
            return AfterSave(None, True, "no step line between the save and the next one")
        return AfterSave(None, False, "no step line since the save yet")
    first = after[0]
    if broken is None:
        broken = next((why for ln in lines if ln.at <= first.at and (why := numbering_broken(ln, saves))), None)
    if broken is not None:
        return AfterSave(None, True, broken)
    if first.epoch != save.epoch:
        named = "no whole epoch" if first.epoch is None else f"epoch {first.epoch}"
        return AfterSave(None, True, f"the first step line after the save (step {first.step}) names {named}, "
                                     f"the save's name epoch {save.epoch}: not its report")
    if log_at_start is not None and first.step < log_at_start:
        return AfterSave(None, True, f"the line after the save says step {first.step}, below the {log_at_start} "
                                     "the output had reported when it began")
    return AfterSave(first.step, True, f"the first step line after the save names its epoch {save.epoch}: "
                                       f"step {first.step}")



@dataclass
class SaveStepTimeline:
    """One attempt's step lines and saves, as :func:`log_step_after_save` needs them. Bookkeeping
    only, bounded: a line that leaves the window is checked against the saves on its way out (by
    then a save seen at the same moment is known), so a break of the pairing is never forgotten."""

    MAX_LINES = 256
    MAX_SAVES = 4096

    lines: deque[StepLine] = field(default_factory=lambda: deque(maxlen=SaveStepTimeline.MAX_LINES))
    saves: dict[str, SaveSeen] = field(default_factory=dict)  # path -> when its writing was first seen
    broken: str | None = None  # why the output's lines cannot be paired with saves (sticky)

    def line(self, at: float, step: int, epoch: int | None, wall: float | None = None) -> None:
        if len(self.lines) == self.lines.maxlen:
            self._check(self.lines[0])
        self.lines.append(StepLine(at, step, epoch, wall))

    def reported_by(self, wall: float) -> int | None:
        """The step of the newest line read by the wall-clock time ``wall`` (None: no line in the
        window was read by then). Every line read by then was printed by then: for a save last
        written at ``wall``, the step its training had reported before it, whenever the watch saw it."""
        before = [ln.step for ln in self.lines if ln.wall is not None and ln.wall <= wall]
        return before[-1] if before else None

    def saw(self, path: str, at: float, epoch: int | None, reported: int | None = None) -> None:
        """The watch saw the save at ``path`` being written (first sighting counts)."""
        if path in self.saves:
            return
        if len(self.saves) >= self.MAX_SAVES:
            self.broken = self.broken or f"more than {self.MAX_SAVES} saves in one attempt: not paired with lines"
            return
        self.saves[path] = SaveSeen(at, epoch, reported)

    def reported_when_seen(self, path: str) -> int | None:
        """The step the output had reported when the save at ``path`` was first seen (None: none)."""
        save = self.saves.get(path)
        return save.reported if save is not None else None

    def after(self, path: str, log_at_start: int | None, *, ended: bool) -> AfterSave:
        """:func:`log_step_after_save` for the save at ``path`` (one this timeline saw)."""
        save = self.saves.get(path)
        if save is None:
            return AfterSave(None, True, "the save was not seen being written")
        return log_step_after_save(save, log_at_start, list(self.lines), list(self.saves.values()),
                                   ended=ended, broken=self.broken)

    def _check(self, line: StepLine) -> None:
        if self.broken is None:
            self.broken = numbering_broken(line, list(self.saves.values()))
