"""Progress from the child's output, and the trackers that turn progress into verdicts: stall,
slowdown, loss anomaly. Pure: lines and ``now`` come in, frozen verdicts with a ``reason`` go out;
no clock, no I/O. Memory is bounded: every history is a fixed-size ring.

Global step or progress only? The resume audit compares the first *global* step the child reports
with the resume point, so a counter that restarts every epoch must never pass for a global step
(resumed at step 5000, "Epoch 5 step 0" would read as a restart from zero). The rule:

* explicit global counters are global steps: ``global_step``/``global step``, fairseq's
  ``num_updates``, a ``'step': N`` / ``"step": N`` dict or JSON key (HF Trainer logs, JSON loggers);
* keyword counters (``step 123``, ``Step 123/1000``, ``iter 123``, ``iteration 123``,
  ``it 123/1000``, ``Iter(train) [123/1000]``) are global steps, *unless the line names an epoch*:
  on such lines they usually count batches within the epoch and are progress only;
* tqdm bars (``Epoch 0:  45%|####5     | 450/1000 [00:10<00:12, 43.2it/s]``, ``450it [00:10, ...]``),
  Keras bars and bare ``[450/1000]`` counters are progress only (Lightning's bar, timm, torchvision's
  references, mmdet and the PyTorch examples all count batches within the epoch), except a tqdm
  bar whose description names steps or iterations and no epoch (``Training steps:  45%|...``).

Progress-only counters still prove the child is alive (stall detection) and give a rate (slowdown);
they never set ``last_step``. A user ``step_regex`` replaces the defaults and its first capture group
is taken as the global step. Lines may carry ``\\r`` debris (tqdm redraws) and ANSI colour codes:
only the last non-empty ``\\r`` segment is read, with escape sequences removed.
"""

from __future__ import annotations

import math
import re
from collections import deque
from dataclasses import dataclass
from typing import Literal

from .control_wire import MAX_STEP, valid_step

# Steps are bounded integers (MAX_STEP, the wire protocol's bound too): anything the loop computes
# from them (rates, steps lost, float conversions) stays exact and can never overflow. Out-of-range
# values are ignored and counted.
_MAX_STEP_DIGITS = len(str(MAX_STEP))

# re.ASCII: \d is [0-9] only. Without it \d matches Arabic-Indic and other Unicode digits, which
# int() then reads as a number.
_FLAGS = re.IGNORECASE | re.ASCII


def step_from_text(text: str | None) -> int | None:
    """``text`` as a step when it is 1-16 ASCII digits below :data:`MAX_STEP`, else None."""
    if not text or len(text) > _MAX_STEP_DIGITS or not text.isascii() or not text.isdigit():
        return None
    value = int(text)
    return value if value < MAX_STEP else None


# (name, regex, scope). scope: "global" = a global step; "counter" = a global step unless the line
# names an epoch; "progress" = progress only. Each regex has the named group "n" (the counter).
DEFAULT_STEP_PATTERNS: tuple[tuple[str, str, str], ...] = (
    ("global_step", r"\bglobal[ _-]?step['\"]?\s*[:=]?\s*(?P<n>\d+)(?![\d.]*\d)", "global"),
    ("num_updates", r"\bnum_updates['\"]?\s*[:=]?\s*(?P<n>\d+)(?![\d.]*\d)", "global"),
    ("step_key", r"['\"]step['\"]\s*:\s*(?P<n>\d+)(?![\d.]*\d)", "global"),
    # a bar after its percentage, or after a description when the total is unknown (Lightning's
    # "Training: |          | 21/? [")
    ("tqdm", r"(?:\d{1,3}%|:\s{0,4})\|[^|]*\|\s*(?P<n>\d+)/(?:\d+|\?)\s*\[", "progress"),
    ("tqdm_total_unknown", r"(?<![\w.])(?P<n>\d+)it\s*\[", "progress"),
    ("step_keyword", r"\b(?:step|iter|iteration)(?:\s*\(\w+\))?\s*[:=#]?\s*\[?\s*(?P<n>\d+)(?![\d.]*\d)",
     "counter"),
    ("it_of_total", r"\bit\s+(?P<n>\d+)\s*/\s*\d+", "counter"),
    ("keras", r"(?<![\w.])(?P<n>\d+)/\d+\s*\[[=>.]+\]", "progress"),
    ("bracket", r"\[\s*(?P<n>\d+)\s*/\s*\d+\s*(?:\(\s*\d+%\s*\))?\s*\]", "progress"),
)

_EPOCH = re.compile(r"\bepochs?\b", _FLAGS)
# A loop beside training: evaluation, validation, test, warm-up, sanity checks, generation. Its
# counters ("eval step 3/50", "Warmup: step 0/2000", "Iter(val) [10/500]") are activity, not the
# global step. The word counts when it names the counter (right before it, or before an "i/N"
# counter on the same line); "step 2000: train loss 1.7, val loss 1.9" names the training step.
_SIDE_WORDS = (r"eval(?:uation|uating|uate)?|valid(?:ation|ating)?|val|test(?:ing)?|warm[ -]?up|warming[ -]up"
               r"|sanity(?:[ _-]check(?:ing)?)?|predict(?:ion|ing)?|inference|generat(?:ion|ing|e)|sampl(?:e|ing)"
               r"|dev|calibrat(?:ion|ing)|profil(?:e|ing)|benchmark(?:ing)?")
_SIDE_LOOP = re.compile(rf"(?<![a-z0-9])(?:{_SIDE_WORDS})(?![a-z0-9])", _FLAGS)
_SIDE_ATTACHED = re.compile(rf"(?<![a-z0-9])(?:{_SIDE_WORDS})[\s:_\-|\[\]()]*(?:dataloader\s*\d*\s*:?\s*)?$", _FLAGS)
# A setting that names a number of steps, not progress: "max step 500000", "total iters 1000",
# "save steps 500", "warmup steps: 2000" (config dumps, argument printouts). The qualifier sits
# right before the keyword ("max_steps" never matches the keyword: "_" is a word character).
_QUALIFIER = re.compile(r"(?<![a-z0-9])(?:max(?:imum)?|min(?:imum)?|total|num|number of|n|save|saving|log|logging"
                        r"|print|checkpoint(?:ing)?|ckpt|decay|remaining|target|accum(?:ulation)?|per|every|each"
                        r"|until)[\s_-]*$", _FLAGS)
_FRACTION_AFTER = re.compile(r"\s*/\s*\d+")
# File paths and checkpoint names carry step numbers that are not progress ("resuming from
# ckpt/step=3000.ckpt", "saving to out/checkpoint-1500"): the default patterns never read inside them.
_PATHLIKE = re.compile(r"(?<!\S)(?:\.{0,2}/|~/|[^\s/]+/[^\s/]+/)\S*"
                       r"|\S*\.(?:ckpt|pt|pth|bin|safetensors|distcp|pkl|tar)\b\S*",
                       _FLAGS)
_STEPS_DESC = re.compile(r"\b(?:global|steps?|iters?|iterations?)\b", _FLAGS)
# An epoch bar's description: "Epoch 3:" (Lightning's TQDMProgressBar), "Epoch 3/10" (the index and the
# number of epochs).
_EPOCH_INDEX = re.compile(r"\bepoch\s*[:#]?\s*(?P<e>\d{1,6})(?![\d.])", _FLAGS)
# The "step N" of a line that also names an epoch ("Epoch 1 | iter 46 step 23 | loss ..."): a step
# with no "/N" after it, the one keyword that usually counts optimizer steps over the whole run.
_STEP_ON_EPOCH_LINE = re.compile(r"\bstep\s*[:=#]?\s*(?P<n>\d+)(?![\d.]*\d)(?!\s*/\s*\d)", _FLAGS)
# A tqdm bar's fill between its pipes ("|####5     |", "|██▋       |"): it changes as the bar fills,
# so it is not part of what kind of line this is.
_BAR_FILL = re.compile(r"\|[^|]*\|\s*$")
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def _may_hold_a_counter(text: str) -> bool:
    """Every default pattern needs one of these substrings; most output lines have none. Substring
    tests cost tens of ns where running the patterns costs microseconds."""
    if "/" in text:
        return True
    low = text.lower()
    return "step" in low or "iter" in low or "num_updates" in low or "it [" in low or "it[" in low
_LOSS = re.compile(
    r"(?<![\w/.])(?:train[_/ ])?loss['\"]?\s*[:=]?\s*"
    r"(?P<v>[-+]?(?:nan|inf(?:inity)?|\d+(?:\.\d*)?(?:e[-+]?\d+)?|\.\d+(?:e[-+]?\d+)?))(?![\w.])",
    _FLAGS)


def clean_line(line: str) -> str:
    """The last non-empty ``\\r`` segment of a line, without ANSI escape sequences."""
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    if "\r" in line:
        for segment in reversed(line.split("\r")):
            if segment.strip():
                return segment
        return ""
    return line


@dataclass(frozen=True)
class StepMatch:
    """A counter found in a line. ``progress_only``: proof of activity, not the global step."""

    value: int
    progress_only: bool
    pattern: str  # which pattern matched ("user" for a step_regex)
    shape: str = ""  # what kind of line it is (see :func:`line_shape`): one line's steps agree with each other
    bare_bar: bool = False  # a tqdm bar that names no epoch and no side loop: may count global steps (BarEvidence)
    # What the global step would be if this progress-only line counts it (None: no such reading). A
    # bare bar: its count; an epoch bar with a known total ("Epoch E: ... B/N ["): E*N+B; a counter on
    # a line that names an epoch: its "step N". Counted only once BarEvidence has proved the line.
    candidate: int | None = None
    # The one whole epoch a global-step line names (``epoch 2: {..., 'epoch': 2, 'step': 30}`` -> 2;
    # None: it names none, a fractional one, or two different ones). Lets a save named by its epoch
    # be paired with the line that reports its step (supervisor/checkpoints/stepsource.py).
    epoch: int | None = None


# "epoch 2", "Epoch 2/10", "'epoch': 2", "epoch=2", "Epoch [2/10]"; not "epoch 1.5" (HF's fractional epochs).
_EPOCH_NUMBER = re.compile(r"\bepochs?\b['\"]?\s*[:=]?\s*\[?\s*(\d{1,9})(?![\d.]*\d)", _FLAGS)
_EPOCH_FRACTION = re.compile(r"\bepochs?\b['\"]?\s*[:=]?\s*\[?\s*\d+\.\d", _FLAGS)


def epoch_named(text: str) -> int | None:
    """The one whole epoch ``text`` names, else None (none, a fractional one, or several)."""
    if _EPOCH_FRACTION.search(text):
        return None
    named = {int(m.group(1)) for m in _EPOCH_NUMBER.finditer(text)}
    return named.pop() if len(named) == 1 else None


class StepExtractor:
    """Finds the step counter in one line of output, by the user's ``step_regex`` or the defaults.

    A counter that is not 1-16 ASCII digits below :data:`MAX_STEP` (a 400-digit number, Arabic-Indic
    digits matched by a user's ``\\d``) is not a step: the line is read as having none, and
    ``rejected`` counts it."""

    def __init__(self, step_regex: str | None = None) -> None:
        self.user = step_regex is not None
        self.rejected = 0  # counters found but out of range or not ASCII digits
        if step_regex is not None:
            # Config validation guarantees it compiles and has a capture group.
            self._patterns = [("user", re.compile(step_regex), "global")]
        else:
            self._patterns = [(name, re.compile(rx, _FLAGS), scope) for name, rx, scope in DEFAULT_STEP_PATTERNS]
        self._prefilter = None if self.user else _may_hold_a_counter

    def match(self, line: str) -> StepMatch | None:
        text = clean_line(line)
        if self._prefilter is not None:
            if not self._prefilter(text):
                return None
            if "/" in text or "." in text:
                text = _PATHLIKE.sub(" ", text)
        epoch_line: bool | None = None
        for name, regex, scope in self._patterns:
            found = self._first_match(name, regex, text)
            if found is None:
                continue
            try:
                digits = found.group("n") if not self.user else found.group(1)
            except IndexError:
                continue
            value = step_from_text(digits)
            if value is None:
                if digits:
                    self.rejected += 1
                continue
            if epoch_line is None:
                epoch_line = bool(_EPOCH.search(text))
            shape = line_shape(name, text, found, digits)
            if scope == "global":
                return StepMatch(value, False, name, shape, epoch=epoch_named(text) if epoch_line else None)
            side = not self.user and side_loop_counter(text, found)
            if scope == "counter":
                candidate = None if side or not epoch_line else epoch_line_step(text)
                return StepMatch(value, epoch_line or side, name, shape, candidate=candidate)
            desc = text[:found.start()]  # a tqdm bar's description: what it counts
            plain_bar = name.startswith("tqdm") and not epoch_line and not side
            global_bar = plain_bar and bool(_STEPS_DESC.search(desc))
            bare = plain_bar and not global_bar
            candidate = value if bare else None
            if name.startswith("tqdm") and epoch_line and not side:
                candidate = epoch_bar_step(desc, value, text[found.end("n"):])
            return StepMatch(value, not global_bar, name, shape, bare_bar=bare, candidate=candidate)
        return None

    def _first_match(self, name: str, regex: re.Pattern[str], text: str) -> re.Match[str] | None:
        """The first match of a default keyword pattern that is not a setting ("max step 500000")."""
        if self.user or name != "step_keyword":
            return regex.search(text)
        for found in regex.finditer(text):
            if not _QUALIFIER.search(text, max(0, found.start() - 32), found.start()):
                return found
        return None

    def extract(self, line: str) -> int | None:
        """The global step in ``line``, or None (progress-only counters give None)."""
        found = self.match(line)
        return None if found is None or found.progress_only else found.value


def epoch_line_step(text: str) -> int | None:
    """The "step N" of a line that names an epoch, or None (litgpt: "Epoch 1 | iter 46 step 23")."""
    for found in _STEP_ON_EPOCH_LINE.finditer(text):
        if not _QUALIFIER.search(text, max(0, found.start() - 32), found.start()):
            return step_from_text(found.group("n"))
    return None


def epoch_bar_step(desc: str, batch: int, after: str) -> int | None:
    """An epoch bar ("Epoch 2:  40%|####| 40/100 [") read as a global step: epoch x batches per
    epoch + batch (2*100+40). Needs the epoch index and the total; in epoch 0 the batch alone. Right
    only with one optimizer step per batch and every epoch the same length: a candidate that
    :class:`BarEvidence` accepts once a save or the resume point agrees with it, never a step by itself."""
    epoch = _EPOCH_INDEX.search(desc)
    if epoch is None:
        return None
    index = int(epoch.group("e"))
    if index == 0:
        return batch
    total = re.match(r"\s*/\s*(\d{1,9})", after)
    if total is None:
        return None
    value = index * int(total.group(1)) + batch
    return value if value < MAX_STEP else None


_SHAPE_DIGITS = re.compile(r"[0-9]+")


def line_shape(pattern: str, text: str, found: re.Match[str], digits: str) -> str:
    """What kind of line a counter sits in: the pattern, the words right before the counter
    (digits blanked) and the total of an ``i/N`` counter. Two readings of one progress line share a
    shape ("iter 100: loss" and "iter 200: loss"); "step 3/50" and "step 300/10000" do not."""
    groups = found.re.groupindex
    at = found.start("n") if "n" in groups else (found.start(1) if found.re.groups else -1)
    if at < 0:  # not where the counter is: the first place its digits appear
        at = text.find(digits, found.start()) if digits else found.start()
    prefix = _BAR_FILL.sub("|bar| ", text[:at]) if pattern.startswith("tqdm") else text[:at]
    before = _SHAPE_DIGITS.sub("#", " ".join(prefix[-24:].lower().split()))
    fraction = _FRACTION_AFTER.match(text, at + len(digits)) if digits else None
    total = fraction.group(0).replace(" ", "") if fraction else ""
    return f"{pattern}|{before}|{total}"


class StepConfirmer:
    """Steps read from output lines count once their line has proved itself a progress line: a
    second reading of the same shape (:func:`line_shape`) at or above the first. One stray line (an
    evaluation counter the rules missed, a setting printed once) never sets the attempt's first
    step, never moves its last step, and so never decides the resume audit. A shape whose next
    reading goes back replaces its first reading (the earlier one was the stray). Once progress is
    established, a reading of another shape that continues it (from the last step up to about twice
    it: "hanging at step 15" after "step 14 loss") counts too, without trusting its shape, and so
    does one that came one step before the proven start ("resumed ... at step 10"). Pure."""

    MAX_SHAPES = 64  # distinct line kinds remembered while unconfirmed (bounded memory)

    def __init__(self) -> None:
        self._pending: dict[str, int] = {}
        self._trusted: set[str] = set()
        self._last: int | None = None  # the highest step counted so far

    @property
    def confirmed(self) -> bool:
        """Whether some progress line has proved itself."""
        return bool(self._trusted)

    def feed(self, shape: str, value: int) -> tuple[int, ...]:
        """The steps this reading makes count, in order: none while its line is unproven, the
        first and this one when it proves the line, this one once the line is trusted."""
        if shape in self._trusted:
            return self._counted(value)
        if self._last is not None and self._last <= value <= 2 * self._last + 10:
            return self._counted(value)  # continues the established progress
        first = self._pending.get(shape)
        if first is None or value < first:
            if first is None and len(self._pending) >= self.MAX_SHAPES:
                return ()
            self._pending[shape] = value
            return ()
        del self._pending[shape]
        if len(self._trusted) < self.MAX_SHAPES:
            self._trusted.add(shape)
        # A reading of another line one step before the proven start agrees with it ("resumed from
        # ... at step 10" before "step 11 loss"): it counts, first.
        before = sorted({v for s, v in self._pending.items() if first - 1 <= v < first})
        self._pending = {s: v for s, v in self._pending.items() if not first - 1 <= v < first}
        proven = (*before, first, value) if value != first else (*before, value)
        return self._counted(*proven)

    def _counted(self, *values: int) -> tuple[int, ...]:
        self._last = max(values) if self._last is None else max(self._last, *values)
        return values

    def unconfirmed(self) -> tuple[int, ...]:
        """At the end of an attempt that never proved a progress line: the readings seen once,
        lowest first (the best left to know; the caller must not stop a run on them)."""
        return () if self._trusted else tuple(sorted(self._pending.values()))


class BarEvidence:
    """A progress line that may count the global step, or may not: a bare progress bar
    (`` 35%|###5      | 35/100 [``: HF Trainer's counts optimizer steps, a plain ``tqdm(loader)``
    counts batches of one epoch), an epoch bar read as epoch x batches + batch (Lightning's
    ``Epoch 1:  40%|...| 40/100 [``), a "step N" on a line that names an epoch (litgpt's
    ``Epoch 1 | iter 46 step 23``). The line cannot say; other sources can. Such a line counts global
    steps from the moment an independent step agrees with its reading (its :attr:`StepMatch.candidate`):
    its first reading (past a bar's initial 0) is the resume point's step (or the next one), or a
    save with a step from its name or contents lands while the line reads that step (one off
    allowed), at the moment the save began (the training waits for its save there) or when it is
    seen finished. A proven line
    that goes back (a new epoch of a per-epoch counter) is no longer believed: a global step never
    goes back within an attempt. Per attempt; pure."""

    MAX_BARS = 16
    MAX_WINDOW = 512  # readings of one line remembered while a save is in flight
    # A save is first seen up to a poll of the checkpoint directory after it began (run/saves.py polls
    # every 0.25 s), and a fast save may be whole by then: the readings of this many seconds before it
    # was seen count as read while it was in flight.
    SEEN_LATE_S = 0.5

    def __init__(self, resume_step: int | None) -> None:
        self.resume_step = resume_step
        self._last: dict[str, int] = {}
        self._global: set[str] = set()
        # Each line's readings from the moment a save began until it landed (None: no save in flight)
        self._window: dict[str, list[int]] | None = None
        self._recent: dict[str, deque[tuple[float, int]]] = {}  # (when read, reading), newest last
        self._at_sight: dict[str, int] = {}  # each line's reading when the save in flight was first seen
        self._refuted: set[str] = set()  # proven once, then went back: never again this attempt

    def counts(self, shape: str, value: int, now: float = 0.0) -> bool:
        """Whether this reading (read at ``now``) is a global step."""
        first = shape not in self._last
        if first and len(self._last) >= self.MAX_BARS:
            return False
        previous = self._last.get(shape)
        self._last[shape] = value
        if self._window is not None and len(seen := self._window.setdefault(shape, [])) < self.MAX_WINDOW:
            seen.append(value)
        self._recent.setdefault(shape, deque(maxlen=64)).append((now, value))
        if shape in self._global:
            if previous is not None and value < previous:
                self._global.discard(shape)
                self._refuted.add(shape)
                return False
            return True
        # The first reading, or the first past a bar's initial 0 (tqdm draws a new bar at 0: Lightning's
        # "Training: 0/?" and then "21/?" after a resume at step 20; a per-epoch bar goes 0, 1, 2, ...).
        fresh = first or (previous == 0 and shape not in self._refuted)
        if fresh and self.resume_step is not None and value in (self.resume_step, self.resume_step + 1):
            self._global.add(shape)
            return True
        return False

    def save_began(self, now: float = 0.0) -> None:
        """A save was first seen at ``now``: what each line read shortly before, and reads from now
        until the save lands, is what it read while the save was in flight."""
        self._window = {shape: [v for at, v in recent if at >= now - self.SEEN_LATE_S] or [self._last[shape]]
                        for shape, recent in self._recent.items()}
        self._at_sight = dict(self._last)

    def saved(self, step: int) -> tuple[int, ...]:
        """A save of ``step`` landed: a line that read it (one off allowed) while it was in flight
        counts global steps from now. A fast save may be whole before the watch first sees it, and
        the output reaches the supervisor a little after it is written: every reading from
        SEEN_LATE_S before the save was seen until now is looked at, provided they never go back (a
        new epoch of a per-epoch counter) and the line did not read about twice the save's step when
        it was seen (a bar counting batches under gradient accumulation reads at least twice the
        step). Returns the readings to take as steps, in order: the one that agreed, then
        the current one."""
        window, self._window = self._window or {}, None
        taken: list[int] = []
        for shape, value in self._last.items():
            if shape in self._global or shape in self._refuted:
                continue
            readings = [*window.get(shape, []), value]
            agreed = step if step in readings else next((r for r in readings if abs(r - step) <= 1), None)
            if agreed is None or any(b < a for a, b in zip(readings, readings[1:])):
                continue
            if self._at_sight.get(shape, value) >= max(2 * step - 1, step + 2):
                continue  # twice the save's step when it was seen: counts batches (gradient accumulation)
            taken.extend([agreed, value] if agreed != value else [value])
            self._global.add(shape)
        return tuple(taken)


def side_loop_counter(text: str, found: re.Match[str]) -> bool:
    """A counter of a loop beside training: an evaluation/validation/test/warm-up word names it
    (right before the counter: "eval step 3", "Iter(val) [10/500]", "Validation: step 3/10"), or
    such a word appears before an ``i/N`` counter ("Evaluating: 40%|...| 20/50 [", "val ... 3/10")."""
    before = text[:found.start()]
    keyword_at = found.start()
    # the text before the counter's keyword ("eval " in "eval step 3") or its "(val)" tag
    inner = found.group(0)
    tag = re.search(r"\((\w+)\)", inner)
    if tag and _SIDE_LOOP.fullmatch(tag.group(1)):
        return True
    if _SIDE_ATTACHED.search(text, max(0, keyword_at - 48), keyword_at):
        return True
    if not _SIDE_LOOP.search(before):
        return False
    fraction = _FRACTION_AFTER.match(text, found.end("n")) is not None
    return fraction or found.re.pattern.startswith(r"(?:\d{1,3}%")


def extract_loss(line: str) -> float | None:
    """The training loss printed in a line (``loss 2.31``, ``loss=nan``, ``'loss': 1.2``,
    ``train_loss: 0.5``), or None. Validation/eval losses are not training losses and are skipped."""
    text = clean_line(line)
    found = _LOSS.search(text)
    if found is None:
        return None
    try:
        return float(found.group("v"))
    except ValueError:
        return None


# ---------------------------------------------------------------------------------------------
# Verdicts


@dataclass(frozen=True)
class StallVerdict:
    idle_s: float  # seconds without progress (or since the attempt started, if it never progressed)
    last_step: int | None
    last_progress_at: float | None
    never_progressed: bool
    reason: str


@dataclass(frozen=True)
class SlowdownVerdict:
    rate: float  # steps (or progress units) per second now
    median_rate: float  # running median of the rate samples
    fraction: float
    below_since: float
    reason: str


LossKind = Literal["nan", "inf", "spike"]


@dataclass(frozen=True)
class LossVerdict:
    step: int | None
    loss: float
    median: float | None  # running median of recent finite losses (None before enough history)
    kind: LossKind
    reason: str


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


# ---------------------------------------------------------------------------------------------
# Trackers


class ProgressTracker:
    """Step and activity history of one attempt. Fed by the run loop; decides nothing by itself.

    Progress is a counter value different from the last one of its kind (global step or
    progress-only counter). The rate counts *work*: global step increments, plus progress-counter
    increments where a counter that goes back (a new epoch) restarts from its new value.
    """

    RATE_SAMPLES = 128  # ring of rate samples behind the slowdown median
    MIN_RATE_SAMPLES = 8  # no slowdown verdict before this many samples
    WORK_SAMPLES = 64  # ring of (time, work) points behind rate()

    def __init__(self, started_at: float, rate_window: float = 60.0) -> None:
        self.started_at = started_at
        self.rate_window = rate_window
        self.first_step: int | None = None
        self.last_step: int | None = None
        self.last_step_at: float | None = None
        self.last_counter: int | None = None
        self.last_progress_at: float | None = None
        self.last_activity_at: float | None = None  # touch(): a save began or ended
        self.observations = 0
        self.rejected = 0  # values that were not steps (out of range, not ints): ignored
        self._work = 0
        self._work_points: deque[tuple[float, int]] = deque(maxlen=self.WORK_SAMPLES)
        self._rate_samples: deque[float] = deque(maxlen=self.RATE_SAMPLES)
        self._last_rate_sample_at: float | None = None
        self._below_since: float | None = None
        self._slowdown_reported = False

    # feeding ---------------------------------------------------------------------------------

    def observe(self, step: int, now: float) -> bool:
        """A global step seen at ``now``. Returns whether it was progress (a new value). A value that
        is not a step (see :func:`valid_step`) is ignored and counted in ``rejected``."""
        if not valid_step(step):
            self.rejected += 1
            return False
        self.observations += 1
        if self.first_step is None:
            self.first_step = step
        previous = self.last_step
        self.last_step, self.last_step_at = step, now
        if previous is None:
            self._progress(now, 0)
            return True
        if step == previous:
            return False
        self._progress(now, max(step - previous, 0))
        return True

    def observe_counter(self, value: int, now: float) -> bool:
        """A progress-only counter (a per-epoch batch index) seen at ``now``."""
        if not valid_step(value):
            self.rejected += 1
            return False
        self.observations += 1
        previous, self.last_counter = self.last_counter, value
        if previous is None:
            self._progress(now, 0)
            return True
        if value == previous:
            return False
        self._progress(now, value - previous if value > previous else value)
        return True

    def touch(self, now: float) -> None:
        """Activity that is not a step (a save began or ended): holds off the stall verdict."""
        self.last_activity_at = now

    def _progress(self, now: float, work: int) -> None:
        self.last_progress_at = now
        self._work += work
        points = self._work_points
        spacing = self.rate_window / self.WORK_SAMPLES
        if points and now - points[-1][0] < spacing:
            return
        points.append((now, self._work))

    # questions -------------------------------------------------------------------------------

    def rate(self, now: float) -> float | None:
        """Work per second over the last ``rate_window`` seconds ending at ``now``; None before
        two observations of progress are at least a moment apart."""
        points = self._work_points
        if not points:
            return None
        first_at, first_work = points[0]
        if len(points) == 1 and self._work == first_work and now - first_at < self.rate_window:
            return None  # one observation so far: nothing measured yet
        start_at, start_work = first_at, first_work
        for at, work in points:  # the last point at or before the window start, else the oldest
            if at > now - self.rate_window:
                break
            start_at, start_work = at, work
        elapsed = now - start_at
        if elapsed <= 0:
            return None
        return (self._work - start_work) / elapsed

    def is_stalled(self, now: float, stall_timeout: float) -> StallVerdict | None:
        """No progress for ``stall_timeout`` s (0 = disabled). Before the first progress the clock
        runs from the attempt start with a startup grace of one more ``stall_timeout``."""
        if stall_timeout <= 0:
            return None
        never = self.last_progress_at is None
        reference = self.started_at if never else self.last_progress_at
        if self.last_activity_at is not None:
            reference = max(reference, self.last_activity_at)  # type: ignore[type-var]
        limit = 2 * stall_timeout if never else stall_timeout
        idle = now - reference  # type: ignore[operator]
        if idle <= limit:
            return None
        if never:
            reason = (f"no progress in the {idle:.0f} s since the attempt started "
                      f"(stall_timeout {stall_timeout:g} s + startup grace {stall_timeout:g} s)")
        else:
            reason = (f"no progress for {idle:.0f} s (stall_timeout {stall_timeout:g} s); "
                      f"last step {self.last_step}")
        return StallVerdict(idle_s=idle, last_step=self.last_step, last_progress_at=self.last_progress_at,
                            never_progressed=never, reason=reason)

    def slowdown(self, now: float, fraction: float, window: float) -> SlowdownVerdict | None:
        """The rate below ``fraction`` of its running median for ``window`` s. Call it on every tick;
        it samples the rate every ``rate_window / 4`` s and reports each slow episode once."""
        interval = self.rate_window / 4
        if self._last_rate_sample_at is not None and now - self._last_rate_sample_at < interval:
            return None
        rate = self.rate(now)
        if rate is None:
            return None
        self._last_rate_sample_at = now
        samples = self._rate_samples
        enough = len(samples) >= self.MIN_RATE_SAMPLES
        median = _median(list(samples)) if enough else 0.0
        below = enough and median > 0 and rate < fraction * median
        if not below:
            self._below_since = None
            self._slowdown_reported = False
            samples.append(rate)
            return None
        if self._below_since is None:
            self._below_since = now
        if self._slowdown_reported:
            samples.append(rate)  # reported: let the baseline adapt to the new normal
            return None
        if now - self._below_since < window:
            return None  # baseline frozen while the episode is being judged
        self._slowdown_reported = True
        return SlowdownVerdict(
            rate=rate, median_rate=median, fraction=fraction, below_since=self._below_since,
            reason=(f"step rate {rate:.3g}/s below {fraction:g} x its median {median:.3g}/s "
                    f"for {now - self._below_since:.0f} s"))


class LossTracker:
    """Flags a non-finite loss, or a spike over ``spike_factor`` x the running median of the last
    ``history`` finite losses (config ``loss_spike_factor``). Each anomaly run is reported once, at
    its first observation; a new run starts after a normal loss or with another kind."""

    def __init__(self, spike_factor: float = 10.0, history: int = 100, min_history: int = 10) -> None:
        self.factor = spike_factor
        self.min_history = min_history
        self._recent: deque[float] = deque(maxlen=history)
        self._last_kind: str | None = None

    def observe(self, step: int | None, loss: float | None) -> LossVerdict | None:
        if loss is None:
            return None
        try:
            value = float(loss)
        except (TypeError, ValueError, OverflowError):  # OverflowError: an int too large for a float
            return None
        kind: LossKind | None = None
        median: float | None = None
        if math.isnan(value):
            kind = "nan"
        elif math.isinf(value):
            kind = "inf"
        else:
            if len(self._recent) >= self.min_history:
                median = _median(list(self._recent))
                if median > 0 and value > self.factor * median:
                    kind = "spike"
            self._recent.append(value)
        first_of_run = kind is not None and kind != self._last_kind
        self._last_kind = kind
        if not first_of_run:
            return None
        if kind == "spike":
            reason = f"loss {value:.4g} at step {step} is over {self.factor:g} x the running median {median:.4g}"
        else:
            reason = f"loss is {value} at step {step}"
        return LossVerdict(step=step, loss=value, median=median, kind=kind, reason=reason)  # type: ignore[arg-type]
