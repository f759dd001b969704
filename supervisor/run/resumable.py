"""Saying whether the run can resume, while it runs (the decision is :mod:`supervisor.resumability`).

The monitor hands every output line to :func:`observe_line` (a save to a path outside the watched
checkpoint directory, a line that shows the training loading a checkpoint) and calls :func:`check`
each tick. The statement is made once the run shows what it does: at its first save seen in the
checkpoint directory, at the first save the output names outside it, or after
``NO_SAVE_WARN_S`` of steps with nothing seen. It is repeated only when the verdict changes.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from ..checkpoints.naming import step_from_name
from ..events import Ev
from ..resumability import (
    MENTIONS_CHECKPOINTS, NO_SAVE_WARN_S, ResumeFacts, judge_resumability, resume_line, save_line_path,
)
from .attempt import AttemptState
from .context import RunContext

log = logging.getLogger("supervisor.run")

MAX_SAVES_ELSEWHERE = 1000  # save_elsewhere events recorded per attempt


def inside(path: str | Path, directory: str | Path) -> bool:
    """Is ``path`` the directory or under it (by name: no symlink is followed)?"""
    p, d = Path(os.path.normpath(path)), Path(os.path.normpath(directory))
    return p == d or d in p.parents


def observe_lines(ctx: RunContext, state: AttemptState, lines: list[str]) -> None:
    """:func:`observe_line` for each line, in order. A tick's lines that never mention a checkpoint
    (the usual burst of step lines) cost one search of their joined text, not one per line."""
    if lines and MENTIONS_CHECKPOINTS.search("\n".join(lines)):
        for line in lines:
            observe_line(ctx, state, line)


def observe_line(ctx: RunContext, state: AttemptState, line: str) -> None:
    """Note what a line of output says about checkpoints (pure reading; an event for a save elsewhere)."""
    saved = save_line_path(line)
    if saved is not None:
        path = Path(saved)
        if not path.is_absolute():
            path = Path(ctx.cwd or os.getcwd()) / path
        if inside(path, ctx.layout.ckpt_dir) or state.saves_elsewhere >= MAX_SAVES_ELSEWHERE:
            return
        state.saves_elsewhere += 1
        state.saved_elsewhere = (os.path.normpath(path), state.last_step)
        ctx.emit(Ev.SAVE_ELSEWHERE, attempt=state.attempt, path=os.path.normpath(path), step=state.last_step,
                 checkpoint_dir=str(ctx.layout.ckpt_dir), line=line[:300])
        return
    if state.resume_output is None and resume_line(line):
        state.resume_output = line.strip()[:300]


def _step_source(save: Any) -> str | None:
    named = getattr(save, "step_source", None)
    if named:
        return str(named)
    if save.step is None:
        return None
    if save.source == "client":
        return "client"
    return "name" if step_from_name(Path(save.path).name) == save.step else "inside the file"


def _said(ctx: RunContext) -> Any:
    return ctx.resumability_said[0] if ctx.resumability_said else None


def facts_now(ctx: RunContext, state: AttemptState, now: float) -> tuple[str, ResumeFacts] | None:
    """(what triggered the statement, the facts) when it is time to say something, else None."""
    saved = [s for s in state.saves if s.ok]
    # The newest save with a known step, else the first: the first save's step may be unknown only because
    # the log had not said it yet (a script that prints its step after saving), and a later one settles it.
    first = next((s for s in reversed(saved) if s.step is not None), saved[0] if saved else None)
    base = dict(checkpoint_dir=str(ctx.layout.ckpt_dir), resume_arg=ctx.cfg.resume_arg,
                resume_env=tuple(ctx.cfg.resume_env), client_resumed=state.reported_resume_step,
                resume_output=state.resume_output, last_step=state.last_step)
    if first is not None:
        return "save", ResumeFacts(saved_path=first.path, saved_step=first.step, step_source=_step_source(first),
                                   **base)  # type: ignore[arg-type]
    if _said(ctx) is not None:
        return None  # said already at a save: no seen-nothing guess overrides what a save showed
    if state.saved_elsewhere is not None:
        path, step = state.saved_elsewhere
        return "save_elsewhere", ResumeFacts(saved_elsewhere=path, saved_elsewhere_step=step,
                                             **base)  # type: ignore[arg-type]
    if _no_save_due(state, now):
        return "no_save", ResumeFacts(seconds_without_save=now - state.started_at, **base)  # type: ignore[arg-type]
    return None


def _no_save_due(state: AttemptState, now: float) -> bool:
    progressed = state.first_step is not None and state.last_step is not None and state.last_step > state.first_step
    return progressed and now - state.started_at >= NO_SAVE_WARN_S


def check(ctx: RunContext, state: AttemptState, now: float) -> None:
    """State whether the run can resume, when it is time and the verdict is new. Cheap when
    nothing it depends on changed (it runs every tick)."""
    key = (state.attempt, len(state.saves), state.reported_resume_step,
           state.resume_output is not None, state.saved_elsewhere, _no_save_due(state, now))
    if ctx.resumability_said is not None and ctx.resumability_said[1] == key:
        return
    found = facts_now(ctx, state, now)
    if found is None:
        ctx.resumability_said = (_said(ctx), key) if ctx.resumability_said is not None else None
        return
    trigger, facts = found
    verdict = judge_resumability(facts)
    said = (verdict.ok, verdict.missing)
    if _said(ctx) == said:
        ctx.resumability_said = (said, key)
        return
    ctx.resumability_said = (said, key)
    ctx.emit(Ev.RESUMABILITY, attempt=state.attempt, trigger=trigger, **verdict.to_event())
    if verdict.ok:
        log.info("%s", verdict.reason)
    else:
        log.warning("CANNOT RESUME: %s", verdict.reason)
