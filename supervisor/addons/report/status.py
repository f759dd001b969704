"""The one-screen live view (``supervise status``): a pure summary of a :class:`Report` plus what
``lock.owner.json`` says about the supervisor holding the run. ``now`` is passed in."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .model import AttemptRow, Report


@dataclass(frozen=True)
class StatusView:
    name: str | None
    run_dir: str | None
    state: str  # running | finished | requeued | dead | unknown
    alive: bool | None
    liveness_reason: str
    owner: Mapping[str, Any] | None
    attempt: int | None
    job_id: str | None
    host: str | None
    attempt_start: float | None
    attempt_age: float | None
    last_step: int | None
    rate: float | None
    progress_age: float | None
    loss: float | None  # the newest loss the training reported (client heartbeats)
    max_step: int | None  # where the training ends: its client's report, else the config's max_steps
    eta: float | None  # seconds to max_step at the current rate (running only)
    last_checkpoint: Mapping[str, Any] | None
    checkpoint_age: float | None
    # What a preemption right now would cost: the steps past the last durable point (save or resume
    # point) and the training time they took at the current rate. Running only; None when unknown.
    at_risk_steps: int | None
    at_risk_time: float | None
    restarts: int
    requeues: int
    steps_lost: int
    wall_lost: float
    last_failure: Mapping[str, Any] | None
    # A stop notice in the current attempt (preemption, time limit, cancel): the clock a person watches.
    notice_ts: float | None
    notice_signal: str | None
    notice_deadline: float | None  # epoch s; None when the notice named none
    deadline_left: float | None  # seconds to the grace deadline (negative once passed)
    outcome: str | None
    exit_code: int | None
    reason: str | None
    problems: tuple[str, ...]
    warnings: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def _age(now: float, ts: float | None) -> float | None:
    return None if ts is None else max(now - ts, 0.0)


def _number(v: Any) -> float | None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok else None


def _open_notice(report: Report, attempt: int | None) -> Mapping[str, Any] | None:
    """The newest stop notice of the attempt still running, if any: the grace clock is ticking."""
    if attempt is None:
        return None
    return next((n for n in reversed(report.events_summary.notices) if n.get("attempt") == attempt), None)


def _eta(step: int | None, max_step: int | None, rate: float | None, since_report: float | None) -> float | None:
    """Seconds to ``max_step`` at ``rate``, counted from the report (steps went on since)."""
    if step is None or max_step is None or rate is None or max_step < step:
        return None
    return max((max_step - step) / rate - (since_report or 0.0), 0.0)


def _at_risk(step: int | None, ckpt: Mapping[str, Any] | None, current: AttemptRow | None) -> int | None:
    """Steps a preemption now would lose: past the newest durable point, the last good save or, when
    the running attempt resumed from a newer one, its resume point (step 0 for a fresh start)."""
    if step is None or current is None:
        return None
    saved = _number(ckpt.get("step")) if ckpt else None
    if ckpt and saved is None:
        return None  # a save of unknown step: counting from an older point would call saved steps lost
    points = [p for p in (saved, current.resume_step) if p is not None]
    durable = max(points) if points else 0.0
    return max(step - int(durable), 0)


def summarize_status(report: Report, alive: bool | None, liveness_reason: str,
                     owner: Mapping[str, Any] | None, now: float) -> StatusView:
    """Where the run stands now. ``alive`` None means the holder is on another host."""
    run = report.run
    last_session_ended = bool(run.jobs) and run.jobs[-1].ended_by is not None
    if alive:
        state = "running"
    elif last_session_ended or (run.outcome and not run.jobs):
        state = "requeued" if run.outcome == "requeue" else "finished"
    elif alive is None:
        state = "unknown"
    else:
        state = "dead" if run.jobs else "not started"  # a supervisor started and vanished
    current = report.attempts[-1] if report.attempts else None
    last_step = None
    rate = None
    progress_ts = None
    stepped = None
    for a in reversed(report.attempts):
        if a.last_step is not None:
            last_step, rate, progress_ts, stepped = a.last_step, a.last_rate, a.last_progress_ts or a.end, a
            break
    failure = next((a for a in reversed(report.attempts) if a.failed), None)
    notice = _open_notice(report, current.attempt if current and not current.ended else None)
    deadline = _number(notice.get("deadline")) if notice else None
    signal = str(notice.get("signal") or notice.get("source") or "") if notice else ""
    ckpt = report.events_summary.last_checkpoint
    running = state == "running"
    live_rate = rate if running and rate is not None and rate > 0 else None
    max_step = stepped.max_step if stepped else None
    risk = _at_risk(last_step, ckpt, current) if running else None
    return StatusView(
        name=run.name, run_dir=run.run_dir, state=state, alive=alive, liveness_reason=liveness_reason,
        owner=owner,
        attempt=current.attempt if current else None,
        job_id=current.job_id if current else None,
        host=current.host if current else None,
        attempt_start=current.start if current else None,
        attempt_age=_age(now, current.start) if current and not current.ended else None,
        last_step=last_step, rate=rate if state == "running" else None,
        progress_age=_age(now, progress_ts),
        loss=stepped.last_loss if stepped else None, max_step=max_step,
        eta=_eta(last_step, max_step, live_rate, _age(now, progress_ts)),
        last_checkpoint=ckpt, checkpoint_age=_age(now, ckpt.get("ts")) if ckpt else None,
        at_risk_steps=risk,
        at_risk_time=risk / live_rate if risk is not None and live_rate else None,
        restarts=run.restarts, requeues=run.requeues, steps_lost=run.steps_lost, wall_lost=run.wall_lost,
        last_failure={"attempt": failure.attempt, "class": failure.end_class, "step": failure.evidence_step
                      if failure.evidence_step is not None else failure.last_step,
                      "evidence": failure.evidence, "action": failure.action} if failure else None,
        notice_ts=_number(notice.get("ts")) if notice else None,
        notice_signal=signal or None,
        notice_deadline=deadline,
        deadline_left=None if deadline is None or state != "running" else deadline - now,
        outcome=run.outcome if state != "running" else None,
        exit_code=run.exit_code if state != "running" else None,
        reason=run.reason if state != "running" else None,
        problems=run.problems, warnings=report.warnings,
    )
