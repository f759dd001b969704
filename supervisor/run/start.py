"""Before each attempt: clear dead writers' temp files, choose the resume point (quarantining torn
checkpoints), check it against the saves the event log remembers, warn about a single-copy
checkpoint set-up. (The optional GPU preflight is an add-on: ``supervisor/addons/gpu_preflight.py``,
reached through ``AddOn.before_attempt`` of ``supervisor/run/hooks.py``.)

At attempt start the run lock is held and no child of this run is alive, so nothing of this run
is being written: a torn file is torn, whatever its age, and is quarantined.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from ..budget import audit_durable_history
from ..checkpoints import find_resume_point, quarantine_tag
from ..checkpoints.naming import parse_name
from ..events import Ev
from ..checkpoints.staging import remove_stale_staging
from .attempt import AttemptState
from .context import RunContext
from .saves import own_saves, recorded_steps, remove_stale_temp_files

log = logging.getLogger("supervisor.run")


def start_state(ctx: RunContext, attempt_no: int) -> AttemptState:
    """Choose the resume point (quarantining torn checkpoints) and open the attempt's state."""
    now = ctx.clock.now()
    remove_stale_temp_files(ctx, attempt_no, now)
    if ctx.cfg.quarantine:  # like quarantine: on one node only when there is a supervisor per node
        settled = remove_stale_staging(ctx.layout.ckpt_dir, now, attempt=attempt_no)
        if settled:
            ctx.emit(Ev.WARNING, attempt=attempt_no, reason="sharded saves cut short: staging directories settled",
                     staging=[d.to_event() for d in settled])
    kwargs: dict[str, Any] = dict(quarantine=ctx.cfg.quarantine, quarantine_tag=quarantine_tag(ctx.environ),
                                  deep_confirm=ctx.cfg.verify_resume_deep)
    events = ctx.save_events()
    result = find_resume_point(ctx.layout.ckpt_dir, writers_alive=False,
                               extra_safe_globals=ctx.cfg.checkpoint.safe_globals,
                               require_trusted=ctx.cfg.checkpoint.require_trusted,
                               step_from=ctx.cfg.checkpoint.step_from,
                               own=own_saves(events), recorded_steps=recorded_steps(events), **kwargs)
    for q in result.quarantined:
        ctx.emit(Ev.QUARANTINE, attempt=attempt_no, **q.to_event())
        if q.ok:
            log.warning("quarantined torn checkpoint %s -> %s (%s)", q.path, q.dest, q.reason)
        else:
            log.error("could not quarantine %s: %s", q.path, q.error)
    ctx.emit(Ev.RESUME_POINT, attempt=attempt_no, **result.event_fields())
    if result.path:
        log.info("resume point: %s (step %s; %s)", result.path, result.step, result.trust)
    warn_single_copy(ctx, attempt_no, result)
    state = AttemptState(attempt=attempt_no, started_at=now, resume_path=result.path, resume_step=result.step)
    state.checkpoint_dir_error = getattr(result, "error", None)
    state.resume_step_source = getattr(getattr(result, "chosen", None), "step_source", None)
    return state


def single_copy_hazard(saved_paths: list[str], present: list[str]) -> str | None:
    """The run keeps one checkpoint, overwritten in place (``save_top_k=0`` with ``last.ckpt``):
    a preemption mid-save leaves nothing to resume from. Judged from the saves the log recorded
    and what the directory holds now. Pure."""
    names = {Path(p).name for p in saved_paths}
    if len(saved_paths) < 2 or len(names) != 1:
        return None
    only = next(iter(names))
    if not parse_name(only).is_last:
        return None
    others = [p for p in present if Path(p).name != only and not Path(p).name.startswith(("CORRUPT_", "."))]
    if others:
        return None
    return (f"only one checkpoint is kept ({only}, saved {len(saved_paths)} times in place): a preemption or "
            "crash during a save leaves no valid copy. Keep at least two (e.g. save_top_k>=2 or step=N files) "
            "or save atomically (supervisor.client.save writes a temp file and renames it)")


def warn_single_copy(ctx: RunContext, attempt_no: int, result: Any) -> None:
    events = ctx.save_events()
    try:
        present = [e.path for e in os.scandir(ctx.layout.ckpt_dir)]
    except OSError:
        return
    saved = [str(e.get("path")) for e in events if e.event == Ev.SAVE_END.value and e.get("ok")]
    hazard = single_copy_hazard(saved, present)
    if hazard:
        ctx.emit(Ev.WARNING, attempt=attempt_no, reason="single checkpoint copy", detail=hazard)
        log.warning("SINGLE CHECKPOINT COPY: %s", hazard)


def check_durable_history(ctx: RunContext, state: AttemptState) -> str | None:
    """The event log remembers every save that landed. If it says step S was saved but no valid
    checkpoint at or near S exists now, the checkpoint directory vanished, was emptied, or points
    elsewhere: restarting from scratch would silently throw the run away. A checkpoint directory
    that cannot be listed is never taken for an empty one. Returns the stop reason."""
    if state.checkpoint_dir_error:
        reason = (f"cannot read the checkpoint directory {ctx.layout.ckpt_dir}: {state.checkpoint_dir_error}; "
                  "not starting from scratch")
        log.error("%s", reason)
        return f"resume audit failed: {reason}"
    events = ctx.save_events()
    ckpt = ctx.layout.ckpt_dir.resolve()
    inside = []
    for e in events:
        step = e.get("step")
        if e.event != Ev.SAVE_END.value or not e.get("ok") or not isinstance(step, int) or isinstance(step, bool):
            continue
        path = Path(str(e.get("path")))
        if path.parent.resolve() == ckpt:
            inside.append((step, str(path), os.path.lexists(path)))
    verdict = audit_durable_history(inside, state.resume_step, state.resume_path)
    if verdict.ok:
        return None
    ctx.emit(Ev.RESUME_MISMATCH, attempt=state.attempt, expected_step=verdict.expected_step,
             got_step=state.resume_step, resume_path=state.resume_path, reason=verdict.reason)
    log.error("CHECKPOINTS MISSING: %s", verdict.reason)
    if ctx.cfg.budget.on_resume_mismatch == "stop":
        return f"resume audit failed: {verdict.reason}"
    return None
