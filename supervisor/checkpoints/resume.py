"""Which checkpoint to resume from: a pure decision over validation reports.

The rule, in order:

1. Every CORRUPT report goes to ``to_quarantine``. IN_PROGRESS and UNVERIFIABLE ones never do.
2. *Usable* = VALID, or UNVERIFIABLE where something was read (level >= 1) and nothing proved it
   damaged (all-zero CRCs, a step mismatch). A symlink leaving the checkpoint dir is never usable,
   and neither is anything not ``load_safe`` (a pickle the scanner could not read to the end: over
   a cap, an unknown format torch.load would unpickle) or hostile (names a code-execution
   primitive). Trust is otherwise a note, not a verdict: a whole file naming the training's own
   classes is usable. With ``require_trusted`` an untrusted file is usable only when this run
   wrote it (``own``: path -> the size and mtime its ``save_end`` recorded, matching now).
3. Among usable candidates with a known step (the step in the name; for ``last.ckpt`` and other
   names without one, the embedded step or the step in the name of the file a symlink points
   to), the highest step wins. Never mtime, never lexical order. On equal steps: VALID beats
   UNVERIFIABLE, a step-named checkpoint beats a ``last`` alias (its name is immutable; ``last``
   is rewritten by the next save), then the higher ``-vN`` version. So an UNVERIFIABLE checkpoint
   is chosen only when no VALID one is as new, and ``last.ckpt`` only when it is valid and newer
   than every step checkpoint. With ``require_verified`` (``--deep`` and the run loop's deep
   confirmation), an UNVERIFIABLE checkpoint is chosen only when no VALID one exists at all: a
   verified older checkpoint beats an unverifiable newer one.
4. When no usable candidate has a step, the newest save by its save index (Accelerate's
   ``checkpoint_<i>``: the index orders saves; the step stays unknown, never the index).
5. Otherwise a single ``last``-style alias (``last.ckpt``,
   ``latest.pt``; the highest ``-vN``) is chosen; other step-less files are never guessed at.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..states import Verdict
from .trust import Trust

if TYPE_CHECKING:  # a pure decision over reports: the validator itself is not needed here
    from .validate import CheckpointReport


@dataclass(frozen=True)
class ResumeDecision:
    path: str | None
    step: int | None
    reason: str
    candidates: tuple[CheckpointReport, ...]  # newest first by step; step-less ones last
    to_quarantine: tuple[CheckpointReport, ...]
    chosen: CheckpointReport | None = None
    chosen_own: bool = False  # the chosen file is one this run wrote (its save_end matches it)

    @property
    def trust_note(self) -> str | None:
        """``untrusted (names __main__.Cfg), written by this run`` -- None when nothing is chosen."""
        if self.chosen is None:
            return None
        return describe_trust(self.chosen, self.chosen_own)


Fingerprints = Mapping[str, tuple[int, float]]  # path -> (size, mtime) recorded when this run saved it


def is_own(report: CheckpointReport, own: Fingerprints) -> bool:
    """This run wrote the file and it has not changed since: same size and mtime as its save_end."""
    recorded = own.get(os.path.abspath(report.path))
    return (recorded is not None and report.mtime is not None and recorded[0] == report.size
            and abs(recorded[1] - report.mtime) < 1e-6)


def is_usable(report: CheckpointReport, *, require_trusted: bool = False, own: Fingerprints | None = None) -> bool:
    if report.link_outside or not report.load_safe or report.trust is Trust.HOSTILE:
        return False
    if require_trusted and report.trust is not Trust.TRUSTED and not is_own(report, own or {}):
        return False
    if report.verdict is Verdict.VALID:
        return True
    return report.verdict is Verdict.UNVERIFIABLE and report.level >= 1


def describe_trust(report: CheckpointReport, own: bool) -> str:
    """The trust note of a resume point, for the event log and the report."""
    text = report.trust.value
    if report.trust_names:
        text += f" (names {', '.join(report.trust_names[:4])}{' ...' if len(report.trust_names) > 4 else ''})"
    return text + (", written by this run" if own else "")


def _rank(report: CheckpointReport) -> tuple[int | None, bool, bool, int, str]:
    return (report.step, report.verdict is Verdict.VALID, not report.is_last, report.version, report.path)


def order_candidates(reports: Sequence[CheckpointReport]) -> tuple[CheckpointReport, ...]:
    """Newest first by step (never mtime); step-less ones last, by name."""
    stepped = sorted((r for r in reports if r.step is not None), key=_rank, reverse=True)
    indexed = sorted((r for r in reports if r.step is None and r.index is not None),
                     key=lambda r: (r.index, r.path), reverse=True)
    stepless = sorted((r for r in reports if r.step is None and r.index is None), key=lambda r: r.path)
    return tuple(stepped + indexed + stepless)


def choose_resume_point(reports: Sequence[CheckpointReport], *, require_verified: bool = False,
                        require_trusted: bool = False, own: Fingerprints | None = None) -> ResumeDecision:
    """Apply the module's rule to one directory's reports. ``own``: the files this run wrote
    (path -> size, mtime from its ``save_end`` events), trusted by provenance."""
    own = own or {}
    candidates = order_candidates(reports)
    to_quarantine = tuple(r for r in candidates if r.verdict is Verdict.CORRUPT and not r.link_outside)
    usable = [r for r in candidates if is_usable(r, require_trusted=require_trusted, own=own)]
    if require_verified and any(r.verdict is Verdict.VALID for r in usable):
        usable = [r for r in usable if r.verdict is Verdict.VALID]
    stepped = [r for r in usable if r.step is not None]
    if stepped:
        chosen = max(stepped, key=_rank)
        return ResumeDecision(chosen.path, chosen.step, _explain(chosen, candidates, usable, own), candidates,
                              to_quarantine, chosen, is_own(chosen, own))
    indexed = [r for r in usable if r.index is not None]
    if indexed:
        chosen = max(indexed, key=lambda r: (r.index, r.verdict is Verdict.VALID, r.path))
        return ResumeDecision(chosen.path, None,
                              f"{chosen.name}: newest {chosen.verdict.value} save by its save index "
                              f"{chosen.index}; its step is unknown (no step in its name, inside it or in the log "
                              "when it was saved)", candidates, to_quarantine, chosen, is_own(chosen, own))
    aliases = [r for r in usable if r.is_last]
    if aliases:
        chosen = max(aliases, key=lambda r: (r.verdict is Verdict.VALID, r.version, r.path))
        return ResumeDecision(chosen.path, None,
                              f"{chosen.name}: {chosen.verdict.value} 'last' checkpoint, step unknown "
                              "(no step in any usable checkpoint)", candidates, to_quarantine, chosen,
                              is_own(chosen, own))
    return ResumeDecision(None, None, _nothing_reason(candidates, usable), candidates, to_quarantine)


def _explain(chosen: CheckpointReport, candidates: tuple[CheckpointReport, ...], usable: list[CheckpointReport],
             own: Fingerprints) -> str:
    kind = "valid" if chosen.verdict is Verdict.VALID else f"unverifiable ({chosen.reason}) but no valid one is as new"
    source = f" (step from {chosen.step_source})" if chosen.step_source not in (None, "name") else ""
    parts = [f"{chosen.name} at step {chosen.step}{source}: newest {kind}"]
    if chosen.trust is not Trust.TRUSTED:
        parts[0] += f", {describe_trust(chosen, is_own(chosen, own))}"
    chosen_step = chosen.step if chosen.step is not None else -1
    usable_ids = {id(r) for r in usable}
    skipped = [r for r in candidates if r.step is not None and r.step >= chosen_step and r is not chosen
               and not (id(r) in usable_ids and r.step == chosen.step)]
    if skipped:
        parts.append("skipped " + "; ".join(_why_skipped(r) for r in skipped[:5]))
    return ". ".join(parts)


def _why_skipped(report: CheckpointReport) -> str:
    if report.verdict is not Verdict.CORRUPT and report.load_safe and report.trust is Trust.UNTRUSTED:
        return (f"{report.name} ({report.verdict.value} but {describe_trust(report, False)}, "
                "not written by this run: checkpoint.require_trusted)")
    return f"{report.name} ({report.verdict.value}: {report.reason})"


def _nothing_reason(candidates: tuple[CheckpointReport, ...], usable: list[CheckpointReport]) -> str:
    if not candidates:
        return "no checkpoints found"
    counts: dict[str, int] = {}
    for report in candidates:
        counts[report.verdict.value] = counts.get(report.verdict.value, 0) + 1
    summary = ", ".join(f"{n} {verdict}" for verdict, n in sorted(counts.items()))
    usable_ids = {id(r) for r in usable}
    distrusted = sum(1 for r in candidates if r.trust is Trust.UNTRUSTED and r.load_safe and id(r) not in usable_ids
                     and r.verdict in (Verdict.VALID, Verdict.UNVERIFIABLE))
    if distrusted:
        summary += (f"; {distrusted} whole but untrusted by name and not written by this run "
                    "(checkpoint.require_trusted; add their classes with --safe-global MODULE:NAME)")
    stepless = [r for r in candidates if id(r) in usable_ids and r.step is None]
    hint = (f"; {len(stepless)} usable checkpoint(s) carry no step number and are not guessed at "
            "(put step=N in the name or save global_step)") if stepless else ""
    return f"no usable checkpoint among {len(candidates)} ({summary}){hint}"
