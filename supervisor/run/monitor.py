"""Watching one attempt: one :func:`tick` at a time until the child's main process has ended.

Each tick drains the child's output lines (steps), the control channel (heartbeats, saves,
resumed, done), polls the checkpoint directory (zero-code saves), handles received signals
(notices, Ctrl-C), asks Slurm in the background, checks health (stall, slowdown), and advances the
stop machine. Every wait is the waker's, so a signal ends it at once.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..checkpoints import DirWatcher
from ..checkpoints.watch import DirEvents
from ..child import ChildExit
from ..client import STACK_DUMP_SIGNAL
from ..control_wire import MAX_STEP, valid_step
from ..errors import RunLockedError
from ..events import Ev
from ..preemption import InFlightSave
from ..progress import BarEvidence, LossTracker, ProgressTracker, StepConfirmer, StepExtractor, StepMatch
from ..stall import StallTimeout
from . import notice as notices
from . import resumable
from .resumable import inside as _inside
from .attempt import AttemptState
from .context import RunContext
from .hooks import AddOn, AddOns, Heartbeat
from .saves import WATCH_INTERVAL, final_rescan, note_step_line, record_save, watch_saves
from .stop import Cause, CauseKind, ForceKill, SaveLanded, StopAsked, StopPhase, Tick, kill_due
from .writers import WRITER, open_save

log = logging.getLogger("supervisor.run")

TICK = 0.05  # seconds between monitor passes; signals and exits wake the loop sooner
LINES_PER_TICK = 5000
Line = TypeVar("Line")  # what matches_worth_observing reads: a line, or its position in the tick
JOB_RECORD_REFRESH = 60.0  # seconds between background reads of the job record
LOCK_CHECK_EVERY = 5.0  # seconds between checks that the run lock is still ours
MAX_PEERS = 4096  # clients and nodes remembered per attempt (both come from authenticated datagrams)


@dataclass
class Watch:
    """The per-attempt trackers the ticks share."""

    extractor: StepExtractor
    progress: ProgressTracker
    losses: LossTracker
    watcher: DirWatcher
    events: DirEvents | None = None  # inotify wake-ups for the directory poll, where available
    next_watch: float = 0.0
    next_poll: float = 0.0
    next_refresh: float = 0.0
    next_lock_check: float = 0.0
    flood_warned: bool = False
    add_ons: AddOn = field(default_factory=AddOns)  # the run's add-ons (supervisor/run/hooks.py)
    confirm: StepConfirmer = field(default_factory=StepConfirmer)  # output steps count once their line proved itself
    bars: BarEvidence = field(default_factory=lambda: BarEvidence(None))  # progress lines proven to count steps
    saves_seen: int = 0  # state.saves already shown to ``bars``


def new_watch(ctx: RunContext, state: AttemptState, add_ons: AddOn | None = None) -> Watch:
    now = ctx.clock.now()
    if ctx.stall is None:  # one for the run: what it learned carries over a restart
        ctx.stall = StallTimeout(ctx.cfg.stall, ctx.cfg.stall_timeout)
    ctx.stall.start_attempt()
    return Watch(StepExtractor(ctx.cfg.step_regex), ProgressTracker(started_at=state.started_at),
                 LossTracker(spike_factor=ctx.cfg.loss_spike_factor), DirWatcher(ctx.layout.ckpt_dir),
                 DirEvents(ctx.layout.ckpt_dir), next_poll=now + ctx.cfg.preemption.poll_interval,
                 add_ons=add_ons if add_ons is not None else AddOns(), bars=BarEvidence(state.resume_step))


def monitor(ctx: RunContext, child: Any, state: AttemptState, add_ons: AddOn | None = None) -> ChildExit:
    """Tick until the child's main process has ended; then drain what it left behind. ``add_ons``:
    told of heartbeats and loss anomalies, asked for a node to leave (supervisor/run/hooks.py)."""
    w = new_watch(ctx, state, add_ons)
    try:
        return _watch_until_exit(ctx, child, state, w)
    finally:
        if w.events is not None:
            w.events.close()


def _watch_until_exit(ctx: RunContext, child: Any, state: AttemptState, w: Watch) -> ChildExit:
    while True:
        exit_ = tick(ctx, child, state, w)
        if exit_ is not None:
            ctx.waker.wait(0.05)  # datagrams sent just before the exit are still in flight
            child.finish()  # the output readers have delivered every line
            now = ctx.clock.now()
            while drain_lines(ctx, child, state, w, now):
                pass
            for step in w.confirm.unconfirmed():  # seen once each: counted, but no stop on them
                observe_step(ctx, child, state, w, step, now, "regex", confirmed=False)
            drain_control(ctx, child, state, w, now)
            final_rescan(ctx, w.watcher, state, now)
            resumable.check(ctx, state, now)
            rejected = getattr(w.extractor, "rejected", 0)
            if rejected:
                ctx.emit(Ev.WARNING, attempt=state.attempt, reason="step numbers out of range ignored", count=rejected)
            return exit_
        ctx.waker.wait(TICK)


def tick(ctx: RunContext, child: Any, state: AttemptState, w: Watch) -> ChildExit | None:
    exit_ = child.poll()
    now = ctx.clock.now()
    drain_lines(ctx, child, state, w, now)
    drain_control(ctx, child, state, w, now)
    # A write that begins wakes the poll at this tick (inotify), not up to WATCH_INTERVAL later.
    woken = state.in_flight is None and w.events is not None and w.events.changed()
    if now >= w.next_watch or woken:
        had_save = state.in_flight is not None
        watch_saves(ctx, w.watcher, state, now)
        show_saves_to_bars(ctx, child, state, w, now)
        if not had_save and state.in_flight is not None:
            w.bars.save_began(now)  # the training waits for its save: its bars stand at the save's step
        w.next_watch = now + WATCH_INTERVAL
        if state.in_flight is not None and state.in_flight.source == WRITER and open_save(ctx, child) is None:
            state.in_flight = None  # the file seen open for writing was closed: the save ended
        if had_save and state.in_flight is None:
            notices.step(ctx, child, state, SaveLanded(), now)
    for sig in ctx.waker.drain():
        if sig.signum in ctx.notice_signals and state.notice is None:
            watch_saves(ctx, w.watcher, state, now)  # an in-place save may have begun since the last poll
        notices.on_signal(ctx, child, state, sig.signum, sig.received_at, w.progress.rate(now))
    if ctx.slurm_env.job_id and now >= w.next_refresh:
        # Keep a recent job record at hand (EndTime, the time limit), so a notice is planned with the
        # real deadline at once instead of waiting for Slurm when it arrives.
        w.next_refresh = now + JOB_RECORD_REFRESH
        ctx.slurm.request_job_info()
    if (ctx.cfg.preemption.poll_interval > 0 and ctx.slurm_env.job_id and state.notice is None
            and now >= w.next_poll):
        w.next_poll = now + ctx.cfg.preemption.poll_interval
        notices.poll_for_preemption(ctx, child, state, now, w.progress.rate(now))
    if state.notice is not None and exit_ is None:
        notices.refine_deadline(ctx, child, state, now)
    resumable.check(ctx, state, now)
    if exit_ is not None:
        return exit_
    check_health(ctx, child, state, w, now)
    if now >= w.next_lock_check:
        w.next_lock_check = now + LOCK_CHECK_EVERY
        check_lock(ctx, child, state, now)
    notices.check_block(ctx, child, state, now)
    writer_open = False
    if kill_due(state.stop, now) and not state.peers.clients:
        # The last look before an unchanged child is killed: a save it began after the notice.
        if state.in_flight is None:
            notices.note_open_save(ctx, child, state, now, "right before the kill")
        if state.in_flight is not None:
            writer_open = True
            path = state.in_flight.path
            ctx.emit(Ev.ARBITRATION, attempt=state.attempt, decision="block", save_path=path,
                     reason=f"a save in flight right before the kill ({path}) -> block: let it finish, then stop")
    notices.step(ctx, child, state, Tick(save_in_flight=state.in_flight is not None, writer_open=writer_open),
                 now)
    return None


def drain_lines(ctx: RunContext, child: Any, state: AttemptState, w: Watch, now: float) -> int:
    """Analyse up to LINES_PER_TICK queued output lines; returns how many there were."""
    lines = child.drain_lines(LINES_PER_TICK)
    resumable.observe_lines(ctx, state, lines)
    # When each step line was read (wall clock), where the child handle keeps it: a save's step is
    # the one reported before its files were written (saves.reported_before_written). The lines are
    # matched by position, so only the few matches kept are looked up, not every line of the tick.
    read_times = getattr(child, "read_times", None)
    if not (read_times and len(read_times) == len(lines)):
        read_times = None
    position_of: dict[int, int] = {}

    def match_at(i: int) -> StepMatch | None:
        found = w.extractor.match(lines[i])
        if found is not None and read_times is not None:
            position_of[id(found)] = i
        return found

    # Every match counts until the first step is known and the output has proven a progress line:
    # a first step the client reported proves no line, and a tick holding a whole burst ("step 1
    # loss" ... "step 15 loss", "hanging at step 15") read newest first would feed the confirmer one
    # unproven line per tick, so the printed steps would never count.
    every_match = state.first_step is None or not (w.extractor.user or w.confirm.confirmed)
    for match in matches_worth_observing(range(len(lines)), match_at, every_match=every_match):
        if match.progress_only:
            if match.candidate is not None and w.bars.counts(match.shape, match.candidate, now):
                observe_step(ctx, child, state, w, match.candidate, now, "regex")  # a line proven to count steps
                continue
            if w.progress.observe_counter(match.value, now):  # activity, not the global step
                ctx.stall.progress(now)
            continue
        at = position_of.get(id(match))
        note_step_line(state, match.value, match.epoch, now,  # a save named by its epoch may be reported after
                       read_times[at] if read_times is not None and at is not None else None)
        steps = (match.value,) if w.extractor.user else w.confirm.feed(match.shape, match.value)
        if not steps:
            w.progress.touch(now)  # a line not yet proven a progress line: activity only
        for step in steps:
            observe_step(ctx, child, state, w, step, now, "regex")
    return len(lines)


def matches_worth_observing(lines: Sequence[Line], match: Callable[[Line], StepMatch | None], *,
                            every_match: bool) -> list[StepMatch]:
    """The step matches of one tick's lines that change what the loop knows, oldest first.

    Every line of a tick is observed at the same moment, so once the attempt's first step is known
    and a progress line proven, of a burst only the newest global step and the newest progress-only
    counter matter (the rate needs one sample per moment, the stall watch one sign of progress):
    the lines are read newest first and reading stops at the newest global step. A chatty training
    printing hundreds of thousands of lines a second then costs one match per tick, not thousands. Until the first
    step is known (proven by a second reading of its line, ``progress.StepConfirmer``) every match is
    kept in order: the resume audit compares that first step, and skipping lines there would make a
    later step look like the start ("started at 25, past the resume point 20"); and until a progress
    line has proven itself, every match is kept too, or a burst would never prove one (the caller
    decides: ``every_match``)."""
    if every_match:
        return [m for m in (_in_range(match(line)) for line in lines) if m is not None]
    counter: StepMatch | None = None  # the newest progress-only counter seen
    for line in reversed(lines):
        got = _in_range(match(line))
        if got is None:
            continue
        if not got.progress_only:
            return [m for m in (counter, got) if m is not None]
        if counter is None:
            counter = got
    return [counter] if counter else []


def _in_range(found: StepMatch | None) -> StepMatch | None:
    return found if found is not None and 0 <= found.value < MAX_STEP else None


def observe_step(ctx: RunContext, child: Any, state: AttemptState, w: Watch, step: int, now: float,
                 source: str, *, confirmed: bool = True) -> None:
    first = state.observe_step(step, now, source)
    if w.progress.observe(step, now):
        ctx.stall.progress(now)
    if first and not state.resume_checked:
        audit_resume(ctx, child, state, step if state.reported_resume_step is None else state.reported_resume_step,
                     confirmed=confirmed)
    if now - state.last_progress_event_at >= ctx.cfg.progress_event_interval:
        state.last_progress_event_at = now
        ctx.emit(Ev.PROGRESS, attempt=state.attempt, step=state.last_step, rate=w.progress.rate(now),
                 source=state.step_source, **progress_extras(state, ctx.cfg.max_steps))


def _whole(value: Any) -> int | None:
    """A metric that must be a step (``max_steps``): an int, or a float with no fraction (tensors
    and numpy scalars arrive as floats)."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    return value if valid_step(value) else None


def progress_extras(state: AttemptState, configured_max: int | None) -> dict[str, Any]:
    """What `supervise status` shows besides the step and rate: the newest finite loss, and the step
    the training ends at (the client's own report wins over the config's ``max_steps``)."""
    extras: dict[str, Any] = {}
    if state.last_loss is not None and math.isfinite(state.last_loss):
        extras["loss"] = state.last_loss
    max_step = state.max_step if state.max_step is not None else configured_max
    if max_step is not None:
        extras["max_step"] = max_step
    return extras


def audit_resume(ctx: RunContext, child: Any, state: AttemptState, first_step: int, *,
                 confirmed: bool = True) -> None:
    """``confirmed=False``: the first step comes from a line seen once (the attempt ended before a
    second reading proved it): the audit is recorded, never acted on."""
    from ..budget import audit_resume as audit
    from ..budget import audit_fresh_start

    state.resume_checked = True
    verdict = audit(state.resume_step, first_step, state.resume_path)
    if (not verdict.ok and state.resume_step_source == "log" and state.resume_step is not None
            and first_step > state.resume_step):
        # The resume point's step is the one the output showed when its save began: a lower bound
        # of what the file holds. A child that resumes past it lost nothing.
        verdict = type(verdict)(True, f"resumed at step {first_step}, at or past the resume point's step "
                                f"{state.resume_step} (read from the log when its save began)")
    expected, where = state.resume_step, state.resume_path
    if state.resume_path is None and state.resume_step is None and state.elsewhere_before is not None:
        where, expected, by = state.elsewhere_before  # saved before, nothing handed over: a fresh start loses it
        outside = where is None or not _inside(where, ctx.layout.ckpt_dir)
        verdict = audit_fresh_start(expected, where, by, str(ctx.layout.ckpt_dir), first_step, outside=outside)
    extra = {} if confirmed else {"confirmed": False}
    ctx.emit(Ev.RESUMED, attempt=state.attempt, step=first_step, expected_step=expected, ok=verdict.ok,
             reason=verdict.reason, **extra)
    if verdict.ok:
        return
    ctx.emit(Ev.RESUME_MISMATCH, attempt=state.attempt, expected_step=expected, got_step=first_step,
             resume_path=where, reason=verdict.reason, **extra)
    log.error("RESUME AUDIT FAILED: %s", verdict.reason)
    if ctx.cfg.budget.on_resume_mismatch == "stop" and confirmed:
        cause = Cause(CauseKind.POLICY, f"resume audit failed: {verdict.reason}", by="resume_audit")
        notices.step(ctx, child, state, StopAsked(cause, ctx.cfg.term_timeout), ctx.clock.now())


def show_saves_to_bars(ctx: RunContext, child: Any, state: AttemptState, w: Watch, now: float) -> None:
    """Saves that landed since the last look, with a step from their name or contents (not from
    the log, which the bars would only echo), are evidence about bare progress bars."""
    for save in state.saves[w.saves_seen:]:
        if save.ok and save.step is not None and save.source == "watch":
            for step in w.bars.saved(save.step):
                observe_step(ctx, child, state, w, step, now, "regex")
    w.saves_seen = len(state.saves)


def drain_control(ctx: RunContext, child: Any, state: AttemptState, w: Watch, now: float) -> None:
    if ctx.channel is None:
        return
    for msg in ctx.channel.poll():
        kind, f = str(getattr(msg.kind, "value", msg.kind)), msg.fields
        if msg.attempt is not None and msg.attempt != state.attempt:
            continue  # a straggler from an earlier attempt
        if len(state.peers.clients) < MAX_PEERS:
            state.peers.clients.add(msg.sender)
        if msg.host and len(state.peers.nodes) < MAX_PEERS:
            state.peers.nodes.add(str(msg.host))
        if kind == "heartbeat" and valid_step(f.get("step")):
            metrics = f.get("metrics") if isinstance(f.get("metrics"), dict) else {}
            own = metrics.get("step_time")  # a rank's own compute time, when it reports one
            w.add_ons.on_heartbeat(ctx, state, Heartbeat(
                msg.rank, msg.host, f["step"], getattr(msg, "received_at", now),
                own if isinstance(own, (int, float)) and not isinstance(own, bool) else None))
            if msg.rank not in (None, 0):
                w.progress.touch(now)  # other ranks prove liveness; rank 0 owns the step
                continue
            raw_loss = metrics.get("loss")
            loss = float(raw_loss) if isinstance(raw_loss, (int, float)) and not isinstance(raw_loss, bool) else None
            if loss is not None:
                state.last_loss = loss
            reported_max = _whole(metrics.get("max_steps"))
            if reported_max is not None and reported_max > 0:
                state.max_step = reported_max
            observe_step(ctx, child, state, w, f["step"], now, "client")
            if loss is not None:
                check_loss(ctx, child, state, w, f["step"], loss, msg.host)
        elif kind == "resumed" and valid_step(f.get("step")):
            state.reported_resume_step = f["step"]
            if state.first_step is None:  # the child says where it starts: its first step
                state.first_step = f["step"]
            if not state.resume_checked:
                audit_resume(ctx, child, state, f["step"])
        elif kind == "save_begin":
            w.progress.touch(now)
            step = f.get("step") if valid_step(f.get("step")) else None
            state.in_flight = InFlightSave(path=str(f.get("path")), step=step, started_at=now, source="client")
            ctx.emit(Ev.SAVE_BEGIN, attempt=state.attempt, step=step, path=f.get("path"), source="client")
        elif kind == "save_end":
            w.progress.touch(now)
            step = f.get("step") if valid_step(f.get("step")) else None
            record_save(ctx, state, step, str(f.get("path")), f.get("bytes"), f.get("duration"),
                        bool(f.get("ok", True)), "client", now)
            if f.get("ok", True):
                ctx.stall.saved()
            notices.step(ctx, child, state, SaveLanded(), now)
        elif kind == "done":
            state.peers.client_done = True
        elif kind == "determinism":
            state.peers.determinism = dict(f.get("settings") or f)
            ctx.emit(Ev.DETERMINISM, attempt=state.attempt, settings=state.peers.determinism)


def check_loss(ctx: RunContext, child: Any, state: AttemptState, w: Watch, step: int, loss: float,
               host: str | None = None) -> None:
    verdict = w.losses.observe(step, loss)
    if verdict is None:
        return
    ctx.emit(Ev.LOSS_ANOMALY, attempt=state.attempt, step=step, loss=loss, median=verdict.median, kind=verdict.kind,
             reason=verdict.reason)
    w.add_ons.on_loss_anomaly(ctx, state, verdict, host or ctx.slurm_env.nodename or ctx.host)
    log.warning("loss anomaly at step %d: %s", step, verdict.reason)
    if ctx.cfg.loss_policy == "stop":
        cause = Cause(CauseKind.POLICY, f"loss anomaly: {verdict.reason}", by="loss_policy")
        notices.step(ctx, child, state, StopAsked(cause, ctx.cfg.term_timeout), ctx.clock.now())


def check_lock(ctx: RunContext, child: Any, state: AttemptState, now: float) -> None:
    """The run directory may be deleted or replaced under a running supervisor; then a second one
    could start on the same path. Re-take the lock, or stop if another supervisor holds it now."""
    lock = ctx.lock
    if lock is None or not hasattr(lock, "check"):
        return
    check = lock.check()
    if check.held:
        return
    ctx.emit(Ev.WARNING, attempt=state.attempt, reason=f"run lock lost: {check.reason}")
    log.warning("run lock lost (%s): taking it again", check.reason)
    try:
        lock.reacquire(ctx.environ)
    except RunLockedError as exc:
        log.error("another supervisor holds this run directory now: %s", exc)
        notices.step(ctx, child, state, ForceKill(Cause(CauseKind.LOCK_LOST, str(exc))), now)


def _flooded(ctx: RunContext, now: float, window: float) -> bool:
    probe = getattr(ctx.channel, "flooded", None)
    try:
        return bool(probe(now, window=max(window, 10.0))) if callable(probe) else False
    except Exception:
        return False


def check_health(ctx: RunContext, child: Any, state: AttemptState, w: Watch, now: float) -> None:
    if state.stop.phase is not StopPhase.RUNNING:
        return
    if state.in_flight is not None:  # a long save is not a stall
        w.progress.touch(now)
        return
    limit = ctx.stall.limit(never_progressed=w.progress.last_progress_at is None)
    stall = w.progress.is_stalled(now, limit.tracker_timeout)
    if stall is not None and _flooded(ctx, now, limit.seconds):
        if not w.flood_warned:
            w.flood_warned = True
            ctx.emit(Ev.WARNING, attempt=state.attempt, reason="channel flooded: no hang verdict while forged or "
                     "excess datagrams arrive (heartbeats may have been dropped)", idle_s=stall.idle_s)
            log.warning("control channel flooded: not judging a stall now")
        return
    if stall is not None:
        why = f"{stall.reason}; {limit.reason}"
        dump = child.dump_stacks(ctx.layout.paths.stack_dump(state.attempt), STACK_DUMP_SIGNAL)
        ctx.emit(Ev.STALL, attempt=state.attempt, last_step=state.last_step, idle_s=stall.idle_s,
                 reason=why, dump=dump, limit=limit.seconds, limit_phase=limit.phase)
        log.error("stall: %s; %s", stall.reason, dump)
        notices.step(ctx, child, state, StopAsked(Cause(CauseKind.HANG, why), min(ctx.cfg.term_timeout, 10.0)),
                     ctx.clock.now())
        return
    slow = w.progress.slowdown(now, ctx.cfg.slowdown_fraction, ctx.cfg.slowdown_window)
    if slow is not None and not state.health.slowdown_active:
        state.health.slowdown_active = True
        ctx.emit(Ev.SLOWDOWN, attempt=state.attempt, rate=slow.rate, median_rate=slow.median_rate,
                 fraction=ctx.cfg.slowdown_fraction, nodes=sorted(state.peers.nodes) or ctx.slurm_env.nodelist,
                 reason=slow.reason)
        log.warning("slowdown: %s", slow.reason)
    elif slow is None and state.health.slowdown_active:
        state.health.slowdown_active = False
    check_slow_node(ctx, child, state, w, now)


def check_slow_node(ctx: RunContext, child: Any, state: AttemptState, w: Watch, now: float) -> None:
    """A node the add-ons say to leave (a node whose ranks step slower than the other nodes', named
    in the event log by the slow-node finder); with slow_node.action requeue, the attempt stops and
    the job is requeued without it."""
    found = w.add_ons.node_to_leave(ctx, state, now)
    if found is None:
        return
    if ctx.cfg.slow_node.action == "requeue" and not state.stop.is_(CauseKind.POLICY):
        state.health.exclude.add(found.node)
        notices.step(ctx, child, state, StopAsked(Cause(CauseKind.REQUEUE, f"slow node: {found.reason}"),
                                                  ctx.cfg.term_timeout), ctx.clock.now())


__all__ = ["ForceKill", "TICK", "monitor", "tick"]
