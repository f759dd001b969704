"""The validation ladder for one path (file, directory or symlink) -> :class:`CheckpointReport`.

L0 stat (dangling or escaping symlinks, empty files, NeMo "unfinished" markers) -> L1 framing
-> L2 index -> L3 inert pickle scan and embedded step vs name -> L4 CRC (``deep``). Each format's
ladder lives in its module under supervisor/checkpoints/formats/, reached through :mod:`.filecheck`
and :mod:`.dircheck`; this module adds the rules that depend on the name and the surroundings.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from ..states import Verdict
from . import formats as F
from .allowlist import extra_safe_globals
from .dircheck import check_dir, dir_size_and_mtime
from .filecheck import check_file
from .fsio import describe_oserror, file_kind
from .naming import parse_name, unfinished_marker_names
from .outcome import Outcome, unverifiable
from .picklescan import step_keys, user_step_key
from .stepsource import StepChoice, StepEvidence, StepRule, choose_step, is_accelerate_state_dir, parse_step_rule
from .trust import Trust, TrustNote, collecting, file_trust

log = logging.getLogger("supervisor.checkpoints")


@dataclass(frozen=True)
class CheckpointReport:
    """The verdict on one checkpoint. ``level`` (0..4) is the deepest level passed when VALID,
    otherwise the level that failed or could not be done. ``step`` is the step in the name (for a
    symlink: in its own name, else its target's), else the step embedded in the checkpoint."""

    path: str
    format: str
    verdict: Verdict
    level: int
    reason: str
    size: int
    step: int | None
    embedded_step: int | None = None
    name_step: int | None = None
    epoch: int | None = None
    is_last: bool = False  # last.ckpt, last-v1.ckpt, latest.pt, ... (an alias, not a step name)
    version: int = 0  # Lightning's -vN collision counter
    is_dir: bool = False
    link_target: str | None = None  # what a symlink points to (as written in the link)
    link_outside: bool = False  # a symlink leaving the checkpoint dir: never followed or touched
    mtime: float | None = None  # newest mtime inside; informational only, never used to order
    # False: a pickle in it could not be scanned to the end (over a scanner cap, unknown format) or
    # names a code-execution primitive. Never a resume point, whatever the verdict.
    load_safe: bool = True
    step_source: str | None = None  # where ``step`` came from (supervisor/checkpoints/stepsource.py)
    index: int | None = None  # a save index in the name (Accelerate checkpoint_<i>): orders saves only
    # The trust note beside the verdict (checkpoints/trust.py): which globals its pickles name.
    # Untrusted is not torn: such a file stays a resume candidate unless require_trusted.
    trust: Trust = Trust.TRUSTED
    trust_names: tuple[str, ...] = ()  # the untrusted or hostile globals, "module.name"

    @property
    def step_described(self) -> str:
        """``240 (key iter_num)``, ``- (save index 3)`` or ``-``, for listings."""
        return StepChoice(self.step, self.step_source, self.index, "").described

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.VALID

    @property
    def name(self) -> str:
        return os.path.basename(self.path.rstrip("/"))

    @property
    def trust_note(self) -> TrustNote:
        return TrustNote(self.trust, self.trust_names)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["verdict"] = self.verdict.value
        data["integrity"] = self.verdict.value
        data["trust"] = self.trust.value
        data["trust_names"] = list(self.trust_names)
        data["ok"] = self.ok
        return data

    def brief(self) -> dict[str, Any]:
        """The fields of a ``resume_point`` event's candidate list."""
        return {"path": self.path, "verdict": self.verdict.value, "step": self.step,
                "step_source": self.step_source, "level": self.level, "format": self.format, "reason": self.reason,
                "trust": self.trust.value, "trust_names": list(self.trust_names[:8])}


def validate(
    path: str | os.PathLike[str],
    deep: bool = False,
    *,
    confine_to: str | os.PathLike[str] | None = None,
    now: float | None = None,
    quiet_s: float = 0.0,
    max_level: int = 3,
    siblings: frozenset[str] | None = None,
    writers_alive: bool = True,
    extra_safe: Iterable[str] = (),
    step_from: str | None = None,
    log_step: int | None = None,
) -> CheckpointReport:
    """Validate one checkpoint without executing anything in it.

    ``confine_to``: a symlink resolving outside this directory is reported (UNVERIFIABLE,
    ``link_outside``) and not followed. ``quiet_s``/``now``: a CORRUPT verdict on something
    modified less than ``quiet_s`` seconds before ``now`` becomes IN_PROGRESS (a writer may still
    be at it, or an NFS client may see a stale size). ``writers_alive=False`` says no writer of
    this run exists (the run loop between attempts): nothing is in progress then, so recent torn
    files and NeMo ``-unfinished`` markers mean CORRUPT. ``max_level`` < 3 stops a file's ladder
    early (a quick look at candidates older than the resume point; directories always get their
    full check). ``siblings``: the names in the parent directory when the caller has listed it
    (saves a stat per marker lookup). ``extra_safe``: globals (``"pkg.mod:Class"``) accepted on top
    of the allowlist. ``step_from``: the user's rule for the step (config ``checkpoint.step_from``);
    ``log_step``: the step the log reported when this checkpoint was saved (the event log), used
    when nothing better says. Raises FileNotFoundError only when ``path`` itself does not exist; every
    other OSError (a symlink loop, no permission, a FIFO) is a verdict with a reason."""
    raw = os.fspath(path)
    name = os.path.basename(raw.rstrip("/")) or raw
    info = parse_name(name)
    st = os.lstat(raw)  # FileNotFoundError: the caller's (rotation between listing and checking)
    base: dict[str, Any] = {"path": raw, "name_step": info.step, "is_last": info.is_last, "version": info.version,
                            "_rule": parse_step_rule(step_from), "_log_step": log_step, "_name": name,
                            "_index": info.index}
    name_step = info.step
    if stat.S_ISLNK(st.st_mode):
        try:
            link_target = os.readlink(raw)
        except OSError as exc:
            return _report(base, unverifiable(F.SYMLINK, 0, f"unreadable symlink: {describe_oserror(exc)}",
                                              load_safe=False), 0, None)
        resolved = os.path.realpath(raw)
        base["link_target"] = link_target
        if confine_to is not None and not _inside(resolved, os.path.realpath(confine_to)):
            return _report(base, unverifiable(F.SYMLINK, 0, f"symlink to {link_target} leaves the "
                                              "checkpoint dir: not followed"), 0, None, link_outside=True)
        try:
            st = os.stat(raw)
        except FileNotFoundError:
            return _report(base, Outcome(F.SYMLINK, Verdict.CORRUPT, 0, f"dangling symlink to {link_target} "
                                         "(target deleted, e.g. by top-k rotation)"), 0, None)
        except OSError as exc:  # ELOOP (points at itself), EACCES on the way...
            maker = Verdict.CORRUPT if exc.errno == errno.ELOOP else Verdict.UNVERIFIABLE
            return _report(base, Outcome(F.SYMLINK, maker, 0, f"symlink to {link_target}: {describe_oserror(exc)}",
                                         load_safe=False), 0, None)
        if name_step is None:
            name_step = parse_name(os.path.basename(resolved)).step
            base["name_step"] = name_step
    parent = os.path.dirname(raw.rstrip("/"))
    exists = (lambda m: m in siblings) if siblings is not None else (lambda m: os.path.lexists(os.path.join(parent, m)))
    marker = next((m for m in unfinished_marker_names(name) if exists(m)), None)
    if marker is not None:
        if writers_alive:
            outcome = Outcome(F.UNKNOWN, Verdict.IN_PROGRESS, 0,
                              f"NeMo marker '{marker}' present: the save did not finish")
        else:
            outcome = Outcome(F.UNKNOWN, Verdict.CORRUPT, 0,
                              f"NeMo marker '{marker}' present and no writer is alive: the save never finished")
        return _report(base, outcome, st.st_size, st.st_mtime)
    is_dir = stat.S_ISDIR(st.st_mode)
    rule = base["_rule"]
    with extra_safe_globals(extra_safe), collecting() as notes, \
            user_step_key(rule.arg if rule is not None and rule.kind == "key" else None):
        outcome = _run_ladder(raw, is_dir, st, deep, max_level)
    if info.index_may_be_step and not (is_dir and _accelerate_dir(raw)):
        name_step = info.index  # checkpoint_<N> that Accelerate did not write: N is the step
        base["name_step"], base["_index"] = name_step, None
    # Each pickle scanned to its end records a note. None recorded: trusted only when the ladder
    # reached the scan level and passed (safetensors, a directory of them: nothing names a global).
    reached_scan = (is_dir or deep or max_level >= 3) and outcome.verdict is not Verdict.CORRUPT
    note = file_trust(notes, fully_scanned=outcome.load_safe and (bool(notes) or reached_scan))
    if note.trust is Trust.HOSTILE and outcome.verdict is not Verdict.CORRUPT:
        # a hostile member the format check let pass (a training_args.bin HF never loads): the
        # directory is forged or damaged all the same
        outcome = outcome.but(verdict=Verdict.CORRUPT, load_safe=False,
                              reason=f"hostile pickle inside: names {', '.join(note.names[:3])} ({note.reason}); "
                                     f"{outcome.reason}")
    size, mtime = st.st_size, st.st_mtime
    if is_dir:
        try:
            size, mtime = dir_size_and_mtime(raw)
        except OSError:
            pass
    outcome = _step_rule(outcome, name_step)
    if outcome.verdict is Verdict.VALID and max_level < 3 and not is_dir:
        outcome = outcome.but(reason=f"{outcome.reason} (quick check: L{outcome.level} only)")
    if (outcome.verdict is Verdict.CORRUPT and writers_alive and quiet_s > 0 and now is not None
            and now - mtime < quiet_s):
        outcome = outcome.but(verdict=Verdict.IN_PROGRESS,
                              reason=f"modified {max(now - mtime, 0):.1f} s ago, may still be written "
                                     f"({outcome.reason})")
    return _report(base, outcome, size, mtime, is_dir=is_dir, name_step=name_step,
                   trust=note.trust, trust_names=note.names)


def fingerprint(path: str | os.PathLike[str]) -> tuple[int, float] | None:
    """(size, mtime) of a checkpoint as :func:`validate` reports them (a directory: total bytes and
    newest mtime inside): what a ``save_end`` event records, so a later scan can tell a file this
    run wrote from one put there since. None when it cannot be read."""
    try:
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            return dir_size_and_mtime(os.fspath(path))
        return st.st_size, st.st_mtime
    except OSError:
        return None


def _run_ladder(path: str, is_dir: bool, st: os.stat_result, deep: bool, max_level: int) -> Outcome:
    try:
        if is_dir:
            return check_dir(path, deep=deep)
        if stat.S_ISREG(st.st_mode):
            return check_file(path, deep=deep, max_level=3 if deep else max_level)
        return unverifiable(F.UNKNOWN, 0, f"{file_kind(st.st_mode)}, not a regular file or directory",
                            load_safe=False)
    except FileNotFoundError as exc:
        if not os.path.lexists(path):
            raise
        return unverifiable(F.UNKNOWN, 0, f"{exc.filename or 'a file'} vanished while checking (being rewritten?)")
    except OSError as exc:
        return unverifiable(F.UNKNOWN, 0, f"cannot read: {describe_oserror(exc)}", load_safe=False)
    except Exception as exc:  # a validator bug must not take the supervisor down
        log.exception("checkpoint validation of %s failed unexpectedly", path)
        return unverifiable(F.UNKNOWN, 0, f"internal error in the validator: {type(exc).__name__}: {exc}",
                            load_safe=False)


def _step_rule(outcome: Outcome, name_step: int | None) -> Outcome:
    """The step in the name and the step inside must agree. Off by one is common in hand-written
    loops (``step`` vs ``step + 1``) and accepted; more is a file that is not what its name says."""
    embedded = outcome.embedded_step
    if outcome.verdict is not Verdict.VALID or name_step is None or embedded is None or embedded == name_step:
        return outcome
    if abs(embedded - name_step) == 1:
        return outcome.but(reason=f"{outcome.reason}; embedded step {embedded} vs {name_step} in the name "
                                  "(off by one: accepted)")
    return outcome.but(verdict=Verdict.UNVERIFIABLE,
                       reason=f"embedded step {embedded} != step {name_step} in the name; {outcome.reason}")


def _report(base: dict, outcome: Outcome, size: int, mtime: float | None, **extra: Any) -> CheckpointReport:
    fields: dict[str, Any] = {"trust": Trust.UNSCANNED}  # paths that stop before any scan
    fields.update({k: v for k, v in base.items() if not k.startswith("_")})
    fields.update(extra)
    choice = choose_step(StepEvidence(
        name=base.get("_name", ""), name_step=fields.get("name_step") if base.get("_index") is None else None,
        name_is_index=False, inside_step=outcome.embedded_step, inside_key=_inside_key(outcome, base.get("_rule")),
        inside_where=_inside_where(outcome), log_step=base.get("_log_step")), base.get("_rule"))
    return CheckpointReport(format=outcome.format, verdict=outcome.verdict, level=outcome.level,
                            reason=outcome.reason, size=size, step=choice.step,
                            embedded_step=outcome.embedded_step, epoch=outcome.epoch, mtime=mtime,
                            load_safe=outcome.load_safe, step_source=choice.source, index=base.get("_index"),
                            **fields)


def _inside_key(outcome: Outcome, rule: StepRule | None) -> str | None:
    """The top-level key the embedded step was read from (``iter_num``), when one holds it."""
    if outcome.embedded_step is None:
        return None
    with user_step_key(rule.arg if rule is not None and rule.kind == "key" else None):
        keys = step_keys()
    return next((k for k in keys if outcome.facts.get(k) == outcome.embedded_step
                 and type(outcome.facts.get(k)) is int), None)


def _inside_where(outcome: Outcome) -> str | None:
    """Where inside a directory format the step was read, for the step's source."""
    return F.step_where(outcome.format)


def _accelerate_dir(path: str) -> bool:
    try:
        return is_accelerate_state_dir(os.listdir(path))
    except OSError:
        return False


def _inside(resolved: str, root: str) -> bool:
    return resolved == root or resolved.startswith(root.rstrip(os.sep) + os.sep)
