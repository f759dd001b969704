"""Settling what an interrupted directory save left, at attempt start (supervisor side).

A staging directory ``<name>.tmp-<attempt>-<nonce>`` whose writer is gone is removed, or rolled
forward when it was committed (its marker is whole) but not yet published; an ``<name>.old-<nonce>``
left beside a published ``<name>`` is removed. Only names that match the protocol's own patterns
(:mod:`supervisor.commit_marker`) are ever touched, symlinks are never followed, and a committed
checkpoint that is the only copy of its step is never removed. The run loop calls
:func:`remove_stale_staging` when no writer of the run is alive (``supervisor/run/start.py``).
"""

from __future__ import annotations

import enum
import os
import shutil
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..commit_marker import (
    STALE_STAGING_S,
    CommitCheck,
    CommitError,
    CommitState,
    StagingName,
    parse_aside_name,
    parse_staging_name,
    verify_commit,
    walk_tree,
)
from ..sharded import discard, publish
from .atomic import fsync_dir


def remove_tree(path: Path) -> None:
    """Remove a directory tree without following symlinks (a symlink itself is unlinked)."""
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)  # fd-based on Linux: links inside are removed, never followed
    else:
        os.unlink(path)



class StagingAction(enum.Enum):
    """What the attempt-start cleanup does with one of our directories."""

    REMOVE_UNCOMMITTED = "remove_uncommitted"  # a staging dir whose writer died before the commit
    ROLL_FORWARD = "roll_forward"  # a committed staging dir whose publish was cut short: publish it
    REMOVE_SUPERSEDED = "remove_superseded"  # committed, but the final name holds the same or a newer step
    REMOVE_ASIDE = "remove_aside"  # an old checkpoint moved aside; its replacement is committed
    RESTORE_ASIDE = "restore_aside"  # an old checkpoint moved aside and nothing replaced it
    KEEP = "keep"  # a writer may still be at it, or it is not safe to decide


@dataclass(frozen=True)
class OurDir:
    """The facts about one staging or aside directory that the cleanup decides on."""

    path: Path
    final_name: str
    kind: str  # "staging" or "aside"
    attempt: int | None  # staging only
    idle_s: float  # seconds since anything inside changed
    check: CommitCheck


@dataclass(frozen=True)
class FinalFacts:
    """The directory a staging/aside dir belongs to (``<name>``), as it is now."""

    exists: bool
    check: CommitCheck | None = None  # None: not a directory (a file, a link) or absent


@dataclass(frozen=True)
class StagingStep:
    """One cleanup decision, with its reason."""

    path: Path
    action: StagingAction
    reason: str
    final: Path | None = None


def plan_staging_cleanup(dirs: Sequence[OurDir], finals: Mapping[str, FinalFacts], *, attempt: int | None,
                         min_idle_s: float = STALE_STAGING_S) -> tuple[StagingStep, ...]:
    """Decide, per final name, what to do with our staging and aside directories. Pure.

    A staging dir is *abandoned* when its attempt is older than the current ``attempt`` (that
    writer is dead: the run loop calls this between attempts), or when nothing in it changed for
    ``min_idle_s`` (a writer we cannot know about: another layout, no supervisor). Abandoned and
    uncommitted: removed. Abandoned and committed: the newest one is rolled forward when the
    final name is absent, or holds a committed checkpoint of an older step written by the same or
    an earlier attempt (a later attempt's checkpoint is never replaced by an earlier attempt's);
    else it is superseded and removed. A final name that exists but is not one of our committed
    checkpoints is left to the resume scan, and so is the staging dir.
    An aside dir is removed once the final name holds a committed checkpoint, restored when the
    final name is absent and nothing is rolled forward, and kept otherwise."""
    steps: list[StagingStep] = []
    by_final: dict[str, list[OurDir]] = {}
    for d in dirs:
        by_final.setdefault(d.final_name, []).append(d)
    for final_name, group in sorted(by_final.items()):
        final = finals.get(final_name, FinalFacts(False))
        stagings = [d for d in group if d.kind == "staging"]
        asides = [d for d in group if d.kind == "aside"]
        live: list[OurDir] = []
        committed: list[OurDir] = []
        for d in stagings:
            dead_attempt = attempt is not None and d.attempt is not None and 0 < d.attempt < attempt
            if not dead_attempt and d.idle_s < min_idle_s:
                live.append(d)
                steps.append(StagingStep(d.path, StagingAction.KEEP, f"attempt {d.attempt}, changed "
                                         f"{d.idle_s:.0f} s ago: its writer may be alive"))
            elif d.check.committed:
                committed.append(d)
            else:
                steps.append(StagingStep(d.path, StagingAction.REMOVE_UNCOMMITTED,
                                         f"never committed ({d.check.reason}); its writer is gone"))
        committed.sort(key=lambda d: (d.check.step if d.check.step is not None else -1, -d.idle_s), reverse=True)
        rolled: OurDir | None = None
        final_step = final.check.step if final.check is not None and final.check.committed else None
        final_attempt = final.check.attempt if final.check is not None else None
        final_whole = final.check is not None and final.check.committed
        for d in committed:
            same_history = final_attempt is None or d.attempt is None or d.attempt >= final_attempt
            newer = (d.check.step is not None and final_step is not None and d.check.step > final_step
                     and same_history)
            if rolled is None and final.exists and not final_whole:
                steps.append(StagingStep(d.path, StagingAction.KEEP, f"committed at step {d.check.step}; "
                                         f"{final_name} exists but is not a committed checkpoint of ours: "
                                         "neither is replaced (the resume scan judges it)"))
                continue
            if rolled is None and (not final.exists or newer):
                rolled = d
                steps.append(StagingStep(d.path, StagingAction.ROLL_FORWARD,
                                         f"committed at step {d.check.step} but never put in place "
                                         f"({'no ' + final_name if not final.exists else final_name + ' is older'})"))
            else:
                steps.append(StagingStep(d.path, StagingAction.REMOVE_SUPERSEDED,
                                         f"committed at step {d.check.step}; {final_name} holds step "
                                         f"{final_step if rolled is None else rolled.check.step}"))
        for d in asides:
            if rolled is not None or final_whole:
                steps.append(StagingStep(d.path, StagingAction.REMOVE_ASIDE,
                                         f"{final_name} holds a committed checkpoint: the old copy is not needed"))
            elif not final.exists and not live and d.check.state is not CommitState.TORN:
                steps.append(StagingStep(d.path, StagingAction.RESTORE_ASIDE,
                                         f"{final_name} is missing and nothing replaces it: the old one goes back"))
            else:
                steps.append(StagingStep(d.path, StagingAction.KEEP,
                                         f"{final_name} is not a committed checkpoint: the old copy stays"))
    return tuple(steps)


def _idle_s(path: Path, now: float) -> float:
    newest = os.lstat(path).st_mtime
    try:
        for _rel, st in walk_tree(path, limit=100_000):
            newest = max(newest, st.st_mtime)
    except CommitError:
        return 0.0  # too big to judge: treat as live
    return max(now - newest, 0.0)


def _collect(ckpt_dir: Path, now: float) -> tuple[list[OurDir], dict[str, FinalFacts]]:
    dirs: list[OurDir] = []
    try:
        entries = list(os.scandir(ckpt_dir))
    except OSError:
        return [], {}
    for entry in entries:
        staging = parse_staging_name(entry.name)
        aside = None if staging else parse_aside_name(entry.name)
        if staging is None and aside is None:
            continue
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue  # never a symlink, never a file: not one of ours
            path = Path(entry.path)
            dirs.append(OurDir(path, staging.final_name if staging else aside[0],  # type: ignore[index]
                               "staging" if staging else "aside", staging.attempt if staging else None,
                               _idle_s(path, now), verify_commit(path)))
        except OSError:
            continue
    finals: dict[str, FinalFacts] = {}
    for name in {d.final_name for d in dirs}:
        path = ckpt_dir / name
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            finals[name] = FinalFacts(False)
            continue
        except OSError:
            finals[name] = FinalFacts(True)
            continue
        finals[name] = FinalFacts(True, verify_commit(path) if stat.S_ISDIR(st.st_mode) else None)
    return dirs, finals


def stale_staging(ckpt_dir: str | os.PathLike[str], now: float, *, attempt: int | None = None,
                  min_idle_s: float = STALE_STAGING_S) -> list[StagingStep]:
    """What :func:`remove_stale_staging` would do (nothing is changed). ``now``: epoch seconds;
    ``attempt``: the attempt about to start (staging dirs of earlier attempts are dead)."""
    dirs, finals = _collect(Path(ckpt_dir), now)
    return [s for s in plan_staging_cleanup(dirs, finals, attempt=attempt, min_idle_s=min_idle_s)]


@dataclass(frozen=True)
class StagingResult:
    """One carried-out cleanup step: ``ok`` False with ``error`` when the filesystem refused."""

    path: str
    action: str
    reason: str
    ok: bool
    error: str | None = None

    def to_event(self) -> dict[str, Any]:
        return {"path": self.path, "action": self.action, "reason": self.reason, "ok": self.ok, "error": self.error}


def remove_stale_staging(ckpt_dir: str | os.PathLike[str], now: float, *, attempt: int | None = None,
                         min_idle_s: float = STALE_STAGING_S) -> list[StagingResult]:
    """Carry out :func:`stale_staging`'s plan: remove abandoned staging dirs, roll committed ones
    forward, remove or restore asides. Call it only while no writer of this run is alive (the run
    loop at attempt start) and, with one supervisor per node, on one node only. Steps that keep a
    directory are not returned. Never raises for a filesystem error: the result says so."""
    root = Path(ckpt_dir)
    done: list[StagingResult] = []
    for s in stale_staging(root, now, attempt=attempt, min_idle_s=min_idle_s):
        if s.action is StagingAction.KEEP:
            continue
        try:
            final = root / (parse_staging_name(s.path.name) or _aside_as_staging(s.path.name)).final_name
            if s.action is StagingAction.ROLL_FORWARD:
                name = parse_staging_name(s.path.name)
                assert name is not None
                publish(s.path, final, name)
            elif s.action is StagingAction.RESTORE_ASIDE:
                if os.path.lexists(final):
                    raise FileExistsError(f"{final} appeared meanwhile")
                os.rename(s.path, final)
                fsync_dir(root)
            elif s.action is StagingAction.REMOVE_ASIDE:
                if not os.path.lexists(s.path):
                    continue  # the roll-forward of this final name removed it already
                discard(s.path, attempt=attempt)
            else:
                remove_tree(s.path)
                fsync_dir(root)
        except OSError as exc:
            done.append(StagingResult(str(s.path), s.action.value, s.reason, False,
                                      f"{type(exc).__name__}: {exc.strerror or exc}"))
            continue
        done.append(StagingResult(str(s.path), s.action.value, s.reason, True))
    return done


def _aside_as_staging(name: str) -> StagingName:
    parts = parse_aside_name(name)
    assert parts is not None
    return StagingName(parts[0], 0, parts[1])
