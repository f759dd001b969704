"""I/O around the resume decision: list a checkpoint dir, validate, choose, quarantine.

:func:`find_resume_point` is what the run loop calls before each attempt. Its result carries
everything the ``resume_point`` and ``quarantine`` events need.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..states import Verdict
from . import formats as F
from .fsio import describe_oserror
from .naming import has_checkpoint_suffix, is_ignored_name, parse_name
from .quarantine import QuarantineRecord, quarantine_all
from .quarantine import quarantine_tag as default_tag
from .resume import Fingerprints, ResumeDecision, choose_resume_point, is_usable
from .trust import Trust
from .validate import CheckpointReport, validate

# A CORRUPT verdict on anything modified more recently than this is reported IN_PROGRESS and
# left alone: a writer (or a stale NFS attribute cache) may not be done with it.
DEFAULT_QUIET_S = 2.0


def list_candidates(ckpt_dir: str | os.PathLike[str]) -> list[str]:
    """Checkpoint candidates directly in ``ckpt_dir`` (symlinks listed, never followed):
    files with a checkpoint suffix, directories whose name carries a step or a suffix or
    that hold a known directory format. Temp, hidden, quarantined and sidecar names are skipped."""
    return _list(ckpt_dir)[0]


def _list(ckpt_dir: str | os.PathLike[str]) -> tuple[list[str], frozenset[str]]:
    """(candidate paths, every name in the dir)."""
    root = os.fspath(ckpt_dir)
    out = []
    names = []
    with os.scandir(root) as entries:
        for entry in entries:
            name = entry.name
            names.append(name)
            if is_ignored_name(name):
                continue
            info = parse_name(name)
            named = has_checkpoint_suffix(name) or info.step is not None or info.is_last or info.index is not None
            if entry.is_symlink():
                keep = named
            elif entry.is_dir(follow_symlinks=False):
                keep = named or F.detect_dir(entry.path) not in (F.DIRECTORY, F.UNKNOWN)
            elif entry.is_file(follow_symlinks=False):
                keep = has_checkpoint_suffix(name)
            else:
                keep = False
            if keep:
                out.append(os.path.join(root, name))
    return sorted(out), frozenset(names)


def scan(
    ckpt_dir: str | os.PathLike[str],
    deep: bool = False,
    *,
    now: float | None = None,
    quiet_s: float = 0.0,
    writers_alive: bool = True,
    extra_safe_globals: Iterable[str] = (),
    step_from: str | None = None,
    recorded_steps: Mapping[str, RecordedStep] | None = None,
) -> list[CheckpointReport]:
    """Validate every candidate in ``ckpt_dir``; newest first by step. (OSError when the dir
    itself cannot be listed.)"""
    from .resume import order_candidates

    paths, names = _list(ckpt_dir)
    opts = _Opts(os.fspath(ckpt_dir), names, time.time() if now is None else now, quiet_s,
                 writers_alive, tuple(extra_safe_globals), step_from, dict(recorded_steps or {}))
    reports = [r for r in (_validate(path, deep, opts) for path in paths) if r is not None]
    return list(order_candidates(reports))


@dataclass(frozen=True)
class ResumeResult:
    """Outcome of :func:`find_resume_point`: the choice, every candidate, what was quarantined."""

    ckpt_dir: str
    path: str | None
    step: int | None
    reason: str
    candidates: tuple[dict[str, Any], ...]
    quarantined: tuple[QuarantineRecord, ...] = ()
    reports: tuple[CheckpointReport, ...] = field(default=(), repr=False)
    chosen: CheckpointReport | None = field(default=None, repr=False)
    deep_checked: tuple[str, ...] = ()  # paths CRC-checked (L4) while confirming the choice
    error: str | None = None  # the checkpoint dir exists but could not be listed (EACCES, EIO...)
    trust: str | None = None  # the chosen one's trust note: "untrusted (names __main__.Cfg), written by this run"

    @property
    def found(self) -> bool:
        return self.path is not None

    def event_fields(self) -> dict[str, Any]:
        """Fields of the ``resume_point`` event (the caller adds ``attempt``)."""
        return {
            "path": self.path,
            "step": self.step,
            "step_source": self.chosen.step_source if self.chosen is not None else None,
            "reason": self.reason,
            "candidates": list(self.candidates),
            "quarantined": [q.path for q in self.quarantined if q.ok],
            "quarantine_failed": [q.path for q in self.quarantined if not q.ok],
            "trust": self.trust,
        }

    def quarantine_events(self) -> list[dict[str, Any]]:
        """One ``quarantine`` event's fields per torn candidate (moved or not)."""
        return [q.to_event() for q in self.quarantined]

    def to_dict(self) -> dict[str, Any]:
        data = self.event_fields()
        data["ckpt_dir"] = self.ckpt_dir
        data["quarantined"] = self.quarantine_events()
        data["deep_checked"] = list(self.deep_checked)
        data["error"] = self.error
        return data


def find_resume_point(
    ckpt_dir: str | os.PathLike[str],
    *,
    quarantine: bool = False,
    quarantine_tag: str | None = None,
    deep_confirm: bool = False,
    now: float | None = None,
    quiet_s: float = DEFAULT_QUIET_S,
    writers_alive: bool = True,
    extra_safe_globals: Iterable[str] = (),
    step_from: str | None = None,
    recorded_steps: Mapping[str, RecordedStep] | None = None,
    require_trusted: bool = False,
    own: Fingerprints | None = None,
) -> ResumeResult:
    """Validate ``ckpt_dir``, choose the resume point, and with ``deep_confirm`` CRC-check (L4)
    the chosen one, falling back to the next candidate while the check finds damage; an
    UNVERIFIABLE candidate (no CRCs recorded) then wins only when no VALID one exists. With
    ``quarantine``, every CORRUPT candidate is renamed aside. ``writers_alive=False``: no process of
    this run can be writing (the run loop holds the run lock and its child is gone), so a torn file
    modified a moment ago is CORRUPT, not IN_PROGRESS. ``extra_safe_globals``: globals
    (``"pkg.mod:Class"``) a user declared safe, on top of the allowlist. ``step_from``: the user's
    rule for the step (config ``checkpoint.step_from``). ``recorded_steps``: path -> the step the
    log reported when that checkpoint was saved (from the event log), the last source of a step
    (supervisor/checkpoints/stepsource.py). ``require_trusted``: an untrusted file is a resume point
    only when this run wrote it (``own``: path -> size and mtime from its ``save_end``); it is never
    touched either way. Never raises for a missing
    or unlistable dir or a read-only filesystem: the result says so (``error``).

    Cost stays flat with the number of checkpoints: step checkpoints are checked newest first
    (L0-L3) down to the first usable one; older ones only get the L1 framing check, which still
    finds the truncated ones to quarantine. ``last``-style and step-less names always get L0-L3
    (their step is inside)."""
    root = os.fspath(ckpt_dir)
    now = time.time() if now is None else now
    if not writers_alive:
        quiet_s = 0.0
    if not os.path.isdir(root):
        what = "does not exist yet" if not os.path.lexists(root) else "is not a directory"
        return ResumeResult(root, None, None, f"checkpoint dir {root} {what}: starting fresh", ())
    try:
        paths, names = _list(root)
    except OSError as exc:
        reason = f"cannot list checkpoint dir {root}: {describe_oserror(exc)}"
        return ResumeResult(root, None, None, reason, (), error=reason)
    opts = _Opts(root, names, now, quiet_s, writers_alive, tuple(extra_safe_globals), step_from,
                 dict(recorded_steps or {}))
    own = {os.path.abspath(p): fp for p, fp in (own or {}).items()}
    known: dict[str, CheckpointReport] = {}
    quick: dict[str, CheckpointReport | None] = {}
    deep_checked: list[str] = []
    while True:
        reports = _reports_for_resume(paths, known, quick, opts, want_valid=deep_confirm,
                                      usable=lambda r: is_usable(r, require_trusted=require_trusted, own=own))
        decision = choose_resume_point(reports, require_verified=deep_confirm, require_trusted=require_trusted,
                                       own=own)
        chosen = decision.chosen
        if not deep_confirm or chosen is None or chosen.path in deep_checked:
            break
        deep_checked.append(chosen.path)
        report = _validate(chosen.path, True, opts)
        if report is None:
            paths = [p for p in paths if p != chosen.path]
            known.pop(chosen.path, None)
        else:
            known[chosen.path] = report
    records: tuple[QuarantineRecord, ...] = ()
    if quarantine and decision.to_quarantine:
        tag = quarantine_tag or default_tag(now=now)
        records = quarantine_all(decision.to_quarantine, root, tag, now=now)
    return _result(root, decision, records, deep_checked)


@dataclass(frozen=True)
class _Opts:
    root: str
    names: frozenset[str]
    now: float
    quiet_s: float
    writers_alive: bool
    extra_safe: tuple[str, ...]
    step_from: str | None = None
    recorded: dict[str, RecordedStep] = field(default_factory=dict)


@dataclass(frozen=True)
class RecordedStep:
    """What the event log says about a save: the step then, and the size it had (None: unknown).
    The step holds only for the file as it was: a file of another size was rewritten since."""

    step: int
    bytes: int | None = None

    def holds_for(self, size: int, is_dir: bool) -> bool:
        return self.bytes is None or is_dir or self.bytes == size


def _validate(path: str, deep: bool, opts: _Opts, max_level: int = 3) -> CheckpointReport | None:
    """One report, or None when the path vanished since the listing (rotation)."""
    try:
        return validate(path, deep, confine_to=opts.root, now=opts.now, quiet_s=opts.quiet_s,
                        max_level=max_level, siblings=opts.names, writers_alive=opts.writers_alive,
                        extra_safe=opts.extra_safe, step_from=opts.step_from, log_step=_log_step(path, opts))
    except FileNotFoundError:
        return None
    except OSError as exc:  # lstat of the path itself failed (EACCES on a parent, ENAMETOOLONG...)
        name = os.path.basename(path)
        return CheckpointReport(path=path, format=F.UNKNOWN, verdict=Verdict.UNVERIFIABLE, level=0,
                                reason=f"cannot stat: {describe_oserror(exc)}", size=0,
                                step=parse_name(name).step, name_step=parse_name(name).step,
                                load_safe=False, trust=Trust.UNSCANNED)


def _log_step(path: str, opts: _Opts) -> int | None:
    """The step the log reported when ``path`` was saved, if the file is still the one saved then."""
    recorded = opts.recorded.get(path)
    if recorded is None:
        return None
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return recorded.step if recorded.holds_for(st.st_size, os.path.isdir(path)) else None


def _reports_for_resume(paths: list[str], known: dict[str, CheckpointReport],
                        quick: dict[str, CheckpointReport | None], opts: _Opts, *,
                        want_valid: bool = False,
                        usable: Callable[[CheckpointReport], bool] = is_usable) -> list[CheckpointReport]:
    """Full reports down to the first usable step checkpoint (the first VALID one with
    ``want_valid``), quick (L1) ones below it."""

    def full(path: str) -> CheckpointReport | None:
        if path not in known:
            report = _validate(path, False, opts)
            if report is None:
                return None
            known[path] = report
        return known[path]

    infos = [(p, parse_name(os.path.basename(p))) for p in paths]
    named = sorted(((p, i) for p, i in infos if i.step is not None and not i.is_last),
                   key=lambda item: (item[1].step, item[1].version, item[0]), reverse=True)
    others = [p for p, i in infos if i.step is None or i.is_last]
    reports = [r for r in map(full, others) if r is not None]
    anchor_step: int | None = None
    for path, info in named:
        if anchor_step is None or info.step == anchor_step:
            report = full(path)
            if (report is not None and anchor_step is None and usable(report)
                    and (not want_valid or report.verdict is Verdict.VALID)):
                anchor_step = info.step
        else:
            if path not in quick:
                quick[path] = known.get(path) or _validate(path, False, opts, max_level=1)
            report = quick[path]
        if report is not None:
            reports.append(report)
    return reports


def _result(root: str, decision: ResumeDecision, records: tuple[QuarantineRecord, ...],
            deep_checked: list[str]) -> ResumeResult:
    reason = decision.reason
    if decision.chosen is not None and decision.chosen.level >= 4 and decision.chosen.verdict is Verdict.VALID:
        reason += " (CRC-confirmed)"
    return ResumeResult(
        ckpt_dir=root,
        path=decision.path,
        step=decision.step,
        reason=reason,
        candidates=tuple(r.brief() for r in decision.candidates),
        quarantined=records,
        reports=decision.candidates,
        chosen=decision.chosen,
        deep_checked=tuple(deep_checked),
        trust=decision.trust_note,
    )
