"""Stop notices and the stop machine's effects, carried out.

A notice is acted on at once with what is known now: the newest Slurm job record the background
view has (when it does not show the deadline yet: the GraceTime read from the cluster's
configuration at start, or the configured default grace), arbitrated against any save in flight.
The real deadline is then asked for in the background and only ever moves the plan earlier.
Which cause ended the attempt (preemption, time limit, a person's cancel) is settled after the
child has ended, from a fresh job record (:func:`settle_cause`).
"""

from __future__ import annotations

import json
import logging
import signal
from pathlib import Path
from typing import Any

from ..events import Ev
from ..failures import SlurmEvidence
from ..preemption import GUESSED_DEADLINES, Notice, after_block, arbitrate, notice_for
from ..private import GROUP_READ, write_atomic
from ..slurm.stop_cause import StopCause, StopVerdict, stop_cause
from ..states import FailureClass
from .attempt import AttemptState
from .context import RunContext
from .saves import remove_our_temp_files
from .writers import open_save, save_of
from .stop import (
    AbortDue, AbortSave, Broadcast, Cause, CauseKind, DeadlineMoved, Effect, ForceKill, NoticeArrived, SignalGroup,
    StopAsked, StopEvent, StopPhase, WriteStopFile, advance,
)

log = logging.getLogger("supervisor.run")

REFINE_INTERVAL = 0.3  # after a notice planned with the default grace: ask Slurm again this often ...
REFINE_WINDOW = 10.0  # ... for this long


def step(ctx: RunContext, child: Any, state: AttemptState, event: StopEvent, now: float) -> None:
    """Advance the stop machine and carry out its effects."""
    state.stop, effects = advance(state.stop, event, now)
    for effect in effects:
        apply(ctx, child, state, effect)


def apply(ctx: RunContext, child: Any, state: AttemptState, effect: Effect) -> None:
    if isinstance(effect, Broadcast):
        ctx.broadcast(effect.kind, **effect.as_dict())
    elif isinstance(effect, SignalGroup):
        child.signal_group(effect.signum)
    elif isinstance(effect, AbortSave):
        path = state.in_flight.path if state.in_flight else None
        ctx.broadcast("abort_save", path=path, reason=effect.why)
        removed = remove_our_temp_files(Path(path)) if path else []
        state.aborted_save = True
        ctx.emit(Ev.SAVE_ABORTED, attempt=state.attempt, path=path, reason=effect.why,
                 removed_temp=[str(p) for p in removed])
        state.in_flight = None
    elif isinstance(effect, WriteStopFile):
        write_stop_file(ctx, state, effect.why, effect.deadline, ctx.clock.now())


def write_stop_file(ctx: RunContext, state: AttemptState, reason: str, deadline: float | None, now: float) -> None:
    """Clients on a shared filesystem see the stop even when datagrams cannot reach them."""
    target = ctx.layout.paths.stop_file
    data = {"reason": reason, "deadline": deadline, "signal": state.notice.signal if state.notice else None,
            "ts": now, "attempt": state.attempt}
    try:
        write_atomic(target, json.dumps(data).encode(), GROUP_READ, durable=False)
    except OSError:
        pass


def on_signal(ctx: RunContext, child: Any, state: AttemptState, signum: int, received_at: float,
              rate: float | None) -> None:
    now = ctx.clock.now()
    if signum == signal.SIGINT:
        ctx.interrupts += 1
        if ctx.interrupts == 1:
            log.warning("interrupted: stopping the child (Ctrl-C again to kill it)")
            step(ctx, child, state, StopAsked(Cause(CauseKind.INTERRUPT, "interrupted by a person"),
                                              ctx.cfg.term_timeout, signal.SIGINT), now)
        else:
            step(ctx, child, state, ForceKill(Cause(CauseKind.INTERRUPT, "interrupted twice")), now)
        return
    if signum in ctx.notice_signals:
        on_notice(ctx, child, state, "signal", signal.Signals(signum).name, received_at, rate)
        return
    child.signal_group(signum)  # anything else is the user's business: pass it on


def on_notice(ctx: RunContext, child: Any, state: AttemptState, source: str, signal_name: str | None,
              received_at: float, rate: float | None) -> None:
    """Plan the stop now, with the job record already in hand; never wait for Slurm here."""
    if state.notice is not None:
        return  # one notice per attempt; later ones change nothing
    pcfg = ctx.cfg.preemption
    now = ctx.clock.now()
    info = ctx.slurm.job_info()
    notice, deadline = notice_for(source, received_at, info, pcfg.default_grace, signal_name=signal_name,  # type: ignore[arg-type]
                                  time_limit_signal=pcfg.time_limit_signal, time_limit_warning=pcfg.time_limit_warning,
                                  cluster_grace=ctx.slurm.grace())
    state.slurm.notice = notice
    state.slurm.deadline_source = deadline.source
    state.slurm.refine_until = now + REFINE_WINDOW
    ctx.noticed = True
    ctx.slurm.request_job_info()
    grace = ctx.slurm.grace()
    known = {"cluster_grace": grace.seconds, "cluster_grace_source": grace.source} if grace is not None else {}
    ctx.emit(Ev.NOTICE, attempt=state.attempt, deadline_source=deadline.source, deadline_past=deadline.past,
             reason=deadline.reason, **known, **notice.to_event())
    history = ctx.current_save_history()  # from memory: the notice path reads no file
    state.save_history = history
    if state.in_flight is None and not state.peers.clients:
        note_open_save(ctx, child, state, now, "at the notice")
    durable = state.last_durable_step
    decision = arbitrate(now, deadline.at, pcfg.margin, state.in_flight, history,
                         emergency_save_allowed=pcfg.emergency_save, client_connected=bool(state.peers.clients),
                         zero_code=not state.peers.clients, step_time_s=(1.0 / rate) if rate else None,
                         steps_since_save=(state.last_step - durable)
                         if state.last_step is not None and durable is not None else None)
    ctx.emit(Ev.ARBITRATION, attempt=state.attempt, **decision.to_event())
    log.warning("stop notice (%s): %s", notice.signal or notice.source, decision.reason)
    step(ctx, child, state, NoticeArrived(decision.decision, deadline.at, pcfg.margin, decision.reason,
                                          cooperative=bool(state.peers.clients) or handles_term(child)), now)


def note_open_save(ctx: RunContext, child: Any, state: AttemptState, now: float, when: str) -> bool:
    """Zero-code mode: a checkpoint file the child's tree holds open for writing is a save in flight,
    even before the directory poll has seen it change. Returns whether one was found."""
    writer = open_save(ctx, child)
    if writer is None:
        return False
    state.in_flight = save_of(writer, now)
    ctx.emit(Ev.SAVE_BEGIN, attempt=state.attempt, path=writer.path, source="writer", pid=writer.pid, seen=when)
    log.warning("a save is being written (%s, open for writing %s)", writer.path, when)
    return True


def handles_term(child: Any) -> bool:
    """The training installed its own SIGTERM handler (Lightning's SLURM plugin, torchrun's agent):
    it asked for the signal and may use the time to the deadline to leave cleanly."""
    catches = getattr(child, "catches", None)
    try:
        return bool(catches(signal.SIGTERM)) if callable(catches) else False
    except Exception:
        return False


def refine_deadline(ctx: RunContext, child: Any, state: AttemptState, now: float) -> None:
    """Slurm may signal a step a moment before its job record shows PreemptTime/EndTime: a notice
    planned with the default grace is re-planned once the real deadline is readable. Only earlier."""
    if state.notice is None or state.slurm.deadline_source not in GUESSED_DEADLINES or now >= state.slurm.refine_until:
        return
    info = ctx.slurm.job_info()
    if info is None or not getattr(info, "preempt_time", None):
        ctx.slurm.request_job_info()
        return
    pcfg = ctx.cfg.preemption
    notice, deadline = notice_for(state.notice.source, state.notice.received_at, info, pcfg.default_grace,  # type: ignore[arg-type]
                                  signal_name=state.notice.signal, time_limit_signal=pcfg.time_limit_signal,
                                  time_limit_warning=pcfg.time_limit_warning, cluster_grace=ctx.slurm.grace())
    state.slurm.deadline_source = deadline.source
    if state.notice.deadline is not None and deadline.at >= state.notice.deadline:
        return
    state.slurm.notice = notice
    step(ctx, child, state, DeadlineMoved(deadline.at, pcfg.margin), now)
    ctx.emit(Ev.NOTICE, attempt=state.attempt, refined=True, deadline_source=deadline.source, reason=deadline.reason,
             **notice.to_event())
    log.warning("deadline refined from Slurm: %s", deadline.reason)


def check_block(ctx: RunContext, child: Any, state: AttemptState, now: float) -> None:
    """While blocking on a save: abort as soon as it is projected to overrun deadline - margin."""
    if state.stop.phase is not StopPhase.BLOCKING or state.in_flight is None or state.deadline is None:
        return
    history = state.save_history
    expected = history.expected_remaining(state.in_flight, now) if history else None
    check = after_block(now, state.deadline, ctx.cfg.preemption.margin, state.in_flight.started_at, expected,
                        in_flight=state.in_flight)
    if not check.keep_blocking:
        ctx.emit(Ev.ARBITRATION, attempt=state.attempt, **check.to_event())
        step(ctx, child, state, AbortDue(check.reason), now)


def poll_for_preemption(ctx: RunContext, child: Any, state: AttemptState, now: float, rate: float | None) -> None:
    """Batch-shell layouts: only the srun step is signalled, so PreemptTime is watched as well."""
    info = ctx.slurm.job_info()
    ctx.slurm.request_job_info()
    if info is not None and getattr(info, "preempt_time", None) and state.notice is None:
        on_notice(ctx, child, state, "poll", None, now, rate)


_CAUSE_CLASS = {
    StopCause.PREEMPTED: FailureClass.PREEMPTED,
    StopCause.TIME_LIMIT: FailureClass.TIME_LIMIT,
    StopCause.CANCELLED_BY_PERSON: FailureClass.CANCELLED,
    StopCause.NODE_FAILURE: FailureClass.NODE_FAILURE,
    StopCause.REQUEUED: FailureClass.PREEMPTED,  # it comes back through Slurm: not a failure of the run
}


def settle_cause(notice: Notice | None, verdict: StopVerdict | None,
                 status: int) -> tuple[FailureClass | None, str | None]:
    """After the child ended: what ended the attempt, from Slurm's fresh job record as
    :func:`supervisor.slurm.stop_cause` reads it (a cancel is a person's, whatever signal came),
    else from the notice itself. ``(None, None)``: nothing from outside ended it (the child's own
    exit decides)."""
    if verdict is not None and verdict.cause is not StopCause.UNKNOWN:
        if notice is None and verdict.cause not in (StopCause.CANCELLED_BY_PERSON, StopCause.NODE_FAILURE) \
                and status != 0 and verdict.cause is not StopCause.REQUEUED:
            return None, None  # the child failed by itself; Slurm's state is not why
        if notice is None and status == 0:
            return None, None
        return _CAUSE_CLASS[verdict.cause], verdict.reason
    if notice is None:
        return None, None
    return notice.failure_class, f"stop notice ({notice.signal or notice.source})"


def slurm_evidence(notice: Notice | None, verdict: StopVerdict | None, cause: FailureClass | None,
                   in_slurm: bool) -> SlurmEvidence:
    """What the scheduler says about the attempt's end, for the classifier to weigh the text against
    (supervisor/failures/evidence.py). ``cause``: :func:`settle_cause`'s class (from a notice and
    the job record, or the notice alone when the record could not be read); a preemption, time
    limit or node failure printed in the output counts only when it is one of those."""
    record = None
    fields = (verdict.fields or {}) if verdict is not None else {}
    if fields.get("job_state"):
        record = f"JobState={fields['job_state']}, " + ("PreemptTime set" if fields.get("preempt_time")
                                                          else "no PreemptTime")
    return SlurmEvidence(confirmed=cause, in_slurm=in_slurm, record=record, noticed=notice is not None)


def read_stop_cause(ctx: RunContext, notice: Notice | None, timeout: float) -> StopVerdict | None:
    """The job record read now (bounded) and judged; read once more when the verdict asks for it."""
    if not ctx.slurm_env.job_id:
        return None
    info = ctx.slurm.job_info_now(timeout)
    verdict = _judge_stop(ctx, info, notice)
    if verdict.recheck_after is not None:
        ctx.waker.wait(verdict.recheck_after)
        info = ctx.slurm.job_info_now(timeout)
        verdict = _judge_stop(ctx, info, notice)
    return verdict


def _judge_stop(ctx: RunContext, info: Any, notice: Notice | None) -> StopVerdict:
    return stop_cause(info, ctx.clock.now(), notice.signal if notice else None, version=ctx.slurm.version(),
                      time_limit_signal=ctx.cfg.preemption.time_limit_signal,
                      expected_restarts=ctx.slurm_env.restart_count)
