"""``classify``: how an attempt ended, from its exit status and the end of its output."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..progress import StepExtractor
from ..signals import signal_name
from ..states import FailureClass
from .evidence import CLAIM_WORDS, SCHEDULER_CLASSES, SlurmEvidence
from .patterns import (
    _PRIORITY_NAMES,
    CONTEXT_AFTER,
    CONTEXT_BEFORE,
    DEFAULT_PATTERNS,
    ECHO,
    FC,
    MAX_INPUT_CHARS,
    VERDICT,
    FailurePattern,
    _signal_from_status,
    signal_class,
)
from .scan import (
    _DEFAULT_UNION,
    _choose,
    _clean,
    _find_completion,
    _Line,
    _locate,
    _Match,
    _needle_union,
    _scan,
    _split_lines,
    _status_text,
    _Steps,
)


# The built-in rows that print a scheduler cause (Slurm's and submitit's lines): evidence only, never
# a verdict without Slurm's confirmation. A user's own pattern of such a class is the user's policy.
_SCHEDULER_CLAIMS = frozenset(id(p) for p in DEFAULT_PATTERNS if p.cls in SCHEDULER_CLASSES)


@dataclass(frozen=True)
class Failure:
    """How an attempt ended: the class of its first failure and the evidence. What happened, never
    what to do: ``run/judge.py`` decides that once, from the class's row in ``failures/classes.py``
    through the policy."""

    cls: FailureClass
    evidence: tuple[str, ...] = ()  # the decisive line(s), cleaned
    context: tuple[str, ...] = ()  # a few lines around the first error
    step: int | None = None  # the last global step reported before the first error
    node: str | None = None
    rank: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    reason: str = ""
    # A scheduler cause (preemption, time limit, node failure) the output printed but Slurm did not
    # confirm, and why it was set aside (supervisor/failures/evidence.py); None when there was none.
    text_claim: str | None = None


def classify(
    exit_code: int | None,
    signal: int | None,
    output_tail: str,
    *,
    step_regex: str | None = None,
    patterns: Sequence[FailurePattern] | None = None,
    slurm: SlurmEvidence | None = None,
) -> Failure:
    """Classify an ended attempt from how it ended and the end of its output.

    ``exit_code``/``signal``: the child's status (``signal`` set when it died of one; ``exit_code`` may
    be None then, or unknown altogether). ``step_regex``: the user's step pattern (default: the
    shared patterns of :mod:`supervisor.progress`).
    What to do is judged later (supervisor/run/judge.py), never here. ``patterns``: a
    replacement evidence table. ``slurm``: what the scheduler says (:class:`SlurmEvidence`; None:
    nothing, as for a local run).
    A preemption, time limit or node failure printed in the text counts only when ``slurm`` confirms
    a scheduler end; otherwise those lines are set aside, the rest of the evidence decides, and
    ``text_claim`` says what was claimed and what contradicts it.
    Exit 0 is ``completed`` unless the scheduler's own message says the job was taken away. A child
    killed from outside (or of unknown status) after the training printed that it finished all its
    steps, with nothing failing after that line, is ``completed`` too: a kill at teardown.
    """
    if signal is None and exit_code is not None and exit_code < 0:  # subprocess's returncode -N
        signal, exit_code = -exit_code, None
    table = tuple(patterns) if patterns is not None else DEFAULT_PATTERNS
    union = _DEFAULT_UNION if patterns is None else _needle_union(table)
    text = output_tail or ""
    if len(text) > MAX_INPUT_CHARS:
        text = text[-MAX_INPUT_CHARS:]
    lines = _split_lines(text)
    extractor = StepExtractor(step_regex)
    matches = _scan(lines, table, union)
    claim, claimed = None, None
    claims = [m for m in matches if m.pattern is not None and id(m.pattern) in _SCHEDULER_CLAIMS]
    evidence = slurm if slurm is not None else SlurmEvidence()
    if claims and not evidence.confirms_scheduler_end:
        matches = [m for m in matches if m not in claims]
        first = min(claims, key=lambda m: (m.priority, m.line))
        claimed = CLAIM_WORDS.get(first.cls, first.cls.value)
        claim = f"{evidence.contradiction(first.cls)}; line {first.line + 1}: {_clean(lines[first.line].text)}"
    failure = _decide_class(exit_code, signal, lines, matches, extractor)
    if claim is None:
        return failure
    return replace(failure, text_claim=claim,
                   reason=f"{failure.reason}; the output claims a {claimed} that Slurm did not confirm: set aside")


def _decide_class(exit_code: int | None, signal: int | None, lines: list[_Line], matches: list[_Match],
                  extractor: StepExtractor) -> Failure:
    """The class from the matches that count (the scheduler claims Slurm did not confirm are gone)."""
    steps = _Steps(lines, extractor)
    chosen, others = _choose(matches, lines, steps)
    sig, inferred = _signal_from_status(exit_code, signal)
    status = _status_text(exit_code, None if inferred else sig)

    def from_text(cls: FailureClass, reason: str, m: _Match) -> Failure:
        node, rank = _locate(m, lines)
        where = ", ".join(x for x in (f"node {node}" if node else "", f"rank {rank}" if rank is not None else "")
                          if x)
        lo = max(m.line - CONTEXT_BEFORE, 0)
        return Failure(cls, evidence=tuple(_clean(lines[i].text) for i in sorted({m.line, *m.extra})),
                       context=tuple(_clean(ln.raw) for ln in lines[lo:m.line + CONTEXT_AFTER + 1]),
                       step=steps.before(m.start), node=node, rank=rank, exit_code=exit_code, signal=signal,
                       reason=reason.replace("{where}", f" ({where})" if where else ""))

    def from_status(cls: FailureClass, reason: str) -> Failure:
        evidence: tuple[str, ...] = ()
        if sig is not None and cls != FC.COMPLETED:
            evidence = (_status_text(None, sig) + (f" (exit status {exit_code})" if inferred else ""),)
        return Failure(cls, evidence=evidence,
                       step=steps.before(len(lines) - 1) if lines else None, exit_code=exit_code, signal=signal,
                       reason=reason)

    if exit_code == 0 and signal is None:
        if chosen is not None and chosen.priority == VERDICT and chosen.cls != FC.HOST_OOM:
            return from_text(chosen.cls, f"exit status 0, but {chosen.label}{{where}}: the allocation was taken away",
                             chosen)
        return from_status(FC.COMPLETED, "exit status 0: training finished")

    if (sig is None and exit_code is None) or (sig is not None and signal_class(sig) == FC.KILLED):
        finished = _find_completion(lines, matches)
        if finished is not None:
            idx, marker = finished
            how = "no exit status" if sig is None else status
            lo = max(idx - CONTEXT_BEFORE, 0)
            return Failure(FC.COMPLETED, evidence=(_clean(lines[idx].text),),
                           context=tuple(_clean(ln.raw) for ln in lines[lo:idx + CONTEXT_AFTER + 1]),
                           step=steps.before(len(lines) - 1), exit_code=exit_code, signal=signal,
                           reason=f"{how}, but the training had finished: {marker.label} (line {idx + 1}) and "
                                  f"nothing failed after it; a kill at teardown is not a crash to restart")

    if chosen is not None and chosen.priority == ECHO and sig is not None and signal_class(sig) == FC.NATIVE_CRASH:
        # "Terminated" echoes next to a child that itself died of a fault: the fault is the cause.
        return from_status(FC.NATIVE_CRASH, f"{status}: {signal_name(sig)} is the cause; the output holds only "
                                            f"echoes ({chosen.label})")

    if chosen is not None:
        reason = f"first failure{{where}}: {chosen.label} ({_PRIORITY_NAMES[chosen.priority]}, line {chosen.line + 1})"
        also = sorted({o.cls.value for o in others if o.cls != chosen.cls})
        if also:
            reason += f"; also seen, taken as consequences: {', '.join(also)}"
        return from_text(chosen.cls, reason + f"; {status}", chosen)

    if sig is not None:
        how = f"exit status {exit_code} = 128+{sig} ({signal_name(sig)})" if inferred else status
        return from_status(signal_class(sig), f"{how} and no failure evidence in the output")
    if exit_code is None:
        return from_status(FC.UNKNOWN, "no exit status and no failure evidence in the output")
    return from_status(FC.UNKNOWN, f"exit status {exit_code} and no failure evidence in the output")


def with_class(failure: Failure, cls: FailureClass, reason: str) -> Failure:
    """The same failure with a class the supervisor knows better (a stall it detected, a notice it got)."""
    return replace(failure, cls=cls, reason=reason)


