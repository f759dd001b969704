"""The stop state machine: how an attempt is brought to an end once something asks it to stop.

One enum (:class:`StopPhase`), one frozen state (:class:`StopState`), and one pure function
(:func:`advance`) that takes the state, an event and ``now`` and returns the next state plus the
effects the loop must carry out (broadcast to clients, signal the child's process group, abort a
save, write the stop file). Nothing here touches a process or a clock.

::

    RUNNING --notice: block--------------> BLOCKING --save landed---------> TERMINATING
       |    --notice: emergency save-----> SAVING   --save landed / due---> TERMINATING
       |    --notice: stop now / policy--> TERMINATING --kill_at----------> KILLING
       |    --notice: abort / force kill-> KILLING  (SIGKILL, repeated every second)
       |                                   BLOCKING --overrun / due: abort--> KILLING
       |                                   TERMINATING --kill due, a checkpoint open for writing--> BLOCKING

``TERMINATING`` sends the graceful signal once (SIGTERM, or SIGINT for a person's Ctrl-C) and
waits until ``kill_at``. A *cooperative* child (a client is connected: it saves and exits on
``should_stop()``) may use the time up to the deadline; an unchanged child is killed at once,
since its notice signals are ignored (see :mod:`supervisor.run.layout`) and nothing it does after
the notice can be kept, except a save it had already begun: right before the kill the loop looks
at the files the child's tree holds open for writing (``Tick.writer_open``), and a save found there
is blocked on like one found at the notice.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Union

from ..states import SaveDecision

BROADCAST_EVERY = 0.5  # seconds: UDP may drop a datagram, so the stop is repeated until the child is gone
KILL_EVERY = 1.0  # seconds between SIGKILLs while the group still has members
# Seconds an unchanged child (no client, no SIGTERM handler of its own) gets between SIGTERM and SIGKILL:
# none. Its SIGTERM is ignored (the shield), so waiting only lets it start another save, which the
# kill would then tear (an in-place last.ckpt overwrite, measured on the test cluster).
UNCHANGED_EXIT_WAIT = 0.0


class StopPhase(str, Enum):
    RUNNING = "running"  # nobody asked for a stop
    BLOCKING = "blocking"  # a notice came during a save that fits: let it land, then stop
    SAVING = "saving"  # an emergency save was asked for: wait for it (until deadline - margin)
    TERMINATING = "terminating"  # the graceful signal is sent; SIGKILL at kill_at
    KILLING = "killing"  # SIGKILL sent; repeated until the child is gone


class CauseKind(str, Enum):
    """Why the attempt is being stopped. The value is what ``judge_attempt`` reads; ``wire`` is the
    ``reason`` clients see in the ``stop`` broadcast (preemption, policy, interrupt)."""

    NOTICE = "notice"  # Slurm's notice: preemption, time limit or cancel (settled from Slurm after the exit)
    REQUEUE = "requeue"  # the supervisor stops to come back elsewhere (a slow node)
    POLICY = "policy"  # a policy of the supervisor: resume audit, loss anomaly (``Cause.by`` names it)
    INTERRUPT = "interrupt"  # a person's Ctrl-C
    HANG = "hang"  # the supervisor found the child stalled
    LOCK_LOST = "lock_lost"  # another supervisor took the run directory

    @property
    def wire(self) -> str:
        return {CauseKind.NOTICE: "preemption", CauseKind.INTERRUPT: "interrupt"}.get(self, "policy")


# When a second cause meets a stop already under way, the higher rank is kept (the phase is not
# changed by it); at equal rank the first stays. The order is the one the verdict needs: a stall
# or a person's Ctrl-C says more about the attempt than a policy stop, a policy stop more than a
# requeue, and a notice least of all (what Slurm did is read again from the job record after the
# exit, whatever stopped the child).
CAUSE_RANK: dict[CauseKind, int] = {
    CauseKind.NOTICE: 0, CauseKind.REQUEUE: 1, CauseKind.POLICY: 2, CauseKind.INTERRUPT: 3, CauseKind.HANG: 4,
    CauseKind.LOCK_LOST: 5,
}


@dataclass(frozen=True)
class Cause:
    """One tagged reason for the stop: the kind, words for a person, and for a policy stop the
    policy key (``resume_audit``, ``loss_policy``) that ``run_end.stopped_by`` names."""

    kind: CauseKind
    why: str
    by: str | None = None


def stronger(current: Cause | None, new: Cause) -> Cause:
    """The cause kept when ``new`` meets ``current`` (see :data:`CAUSE_RANK`)."""
    if current is None or CAUSE_RANK[new.kind] > CAUSE_RANK[current.kind]:
        return new
    return current


@dataclass(frozen=True)
class StopState:
    phase: StopPhase = StopPhase.RUNNING
    cause: Cause | None = None  # set only by advance(): why the attempt is being stopped
    deadline: float | None = None  # the hard deadline (Slurm's, or a policy's)
    usable: float | None = None  # deadline - margin: saves must be done by then
    kill_at: float | None = None  # TERMINATING: when SIGKILL follows
    next_broadcast: float = 0.0
    next_kill: float = 0.0
    cooperative: bool = False  # a client is connected: it can be told to save and exit

    @property
    def stopping(self) -> bool:
        return self.phase is not StopPhase.RUNNING

    @property
    def why(self) -> str:
        return self.cause.why if self.cause is not None else ""

    def is_(self, kind: CauseKind) -> bool:
        """Whether the attempt is being stopped for ``kind``."""
        return self.cause is not None and self.cause.kind is kind


# ------------------------------------------------------------------------------------------ events


@dataclass(frozen=True)
class NoticeArrived:
    """A stop notice, already arbitrated (``preemption.arbitrate``) against any save in flight."""

    decision: SaveDecision
    deadline: float
    margin: float
    why: str
    cooperative: bool


@dataclass(frozen=True)
class StopAsked:
    """The supervisor (a policy, a stall, a slow node) or a person asks the child to stop within
    ``grace`` seconds. While a stop is under way it only records a stronger cause."""

    cause: Cause
    grace: float
    graceful_signal: int = signal.SIGTERM


@dataclass(frozen=True)
class ForceKill:
    """Kill now: a second Ctrl-C, the run directory taken by another supervisor."""

    cause: Cause


@dataclass(frozen=True)
class SaveLanded:
    """The save being waited for ended (successfully or not)."""


@dataclass(frozen=True)
class AbortDue:
    """While blocking, the save is projected to overrun deadline - margin (``preemption.after_block``)."""

    why: str


@dataclass(frozen=True)
class DeadlineMoved:
    """Slurm's real deadline became readable and is earlier than the one planned with."""

    deadline: float
    margin: float


@dataclass(frozen=True)
class Tick:
    """Time passes. ``save_in_flight``: whether a save is still being written. ``writer_open``: the
    child's tree holds a checkpoint file open for writing, read right before an unchanged child is
    killed (:func:`kill_due`): a save that began after the notice was arbitrated."""

    save_in_flight: bool = False
    writer_open: bool = False


StopEvent = Union[NoticeArrived, StopAsked, ForceKill, SaveLanded, AbortDue, DeadlineMoved, Tick]


# ------------------------------------------------------------------------------------------ effects


@dataclass(frozen=True)
class Broadcast:
    kind: str  # a control-channel kind: stop, save_now, abort_save
    fields: tuple[tuple[str, Any], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return dict(self.fields)


@dataclass(frozen=True)
class SignalGroup:
    signum: int


@dataclass(frozen=True)
class AbortSave:
    """Stop the writer now: tell it, remove our temp files, record ``save_aborted``."""

    why: str


@dataclass(frozen=True)
class WriteStopFile:
    why: str
    deadline: float | None


Effect = Union[Broadcast, SignalGroup, AbortSave, WriteStopFile]


def _stop_broadcast(state: StopState, **extra: Any) -> Broadcast:
    fields = {"reason": state.cause.kind.wire if state.cause else "stop", "deadline": state.deadline, **extra}
    return Broadcast("stop", tuple(fields.items()))


def _terminate(state: StopState, now: float, graceful_signal: int = signal.SIGTERM,
               wait: float | None = None) -> tuple[StopState, tuple[Effect, ...]]:
    """Send the graceful signal once and set when SIGKILL follows."""
    if wait is None:
        wait = UNCHANGED_EXIT_WAIT if not state.cooperative else max((state.deadline or now) - now, 0.0)
    kill_at = now + wait
    if state.deadline is not None:
        kill_at = min(kill_at, state.deadline)
    nxt = replace(state, phase=StopPhase.TERMINATING, kill_at=kill_at, next_broadcast=now + BROADCAST_EVERY)
    return nxt, (_stop_broadcast(nxt), SignalGroup(graceful_signal))


def _kill(state: StopState, now: float, *extra: Effect) -> tuple[StopState, tuple[Effect, ...]]:
    nxt = replace(state, phase=StopPhase.KILLING, next_kill=now + KILL_EVERY, kill_at=now)
    return nxt, (*extra, SignalGroup(signal.SIGKILL))


def advance(state: StopState, event: StopEvent, now: float) -> tuple[StopState, tuple[Effect, ...]]:
    """The next stop state and the effects to carry out, for ``event`` at ``now``."""
    if isinstance(event, NoticeArrived):
        return _on_notice(state, event, now)
    if isinstance(event, StopAsked):
        return _on_stop_asked(state, event, now)
    if isinstance(event, ForceKill):
        cause = stronger(state.cause, event.cause)
        if state.phase is StopPhase.KILLING:
            return replace(state, cause=cause), ()
        return _kill(replace(state, cause=cause), now)
    if isinstance(event, SaveLanded):
        if state.phase in (StopPhase.BLOCKING, StopPhase.SAVING):
            wait = None
            if state.phase is StopPhase.SAVING and state.cooperative:
                wait = max((state.deadline or now) - now, 0.0)
            return _terminate(state, now, wait=wait)
        return state, ()
    if isinstance(event, AbortDue):
        if state.phase is StopPhase.BLOCKING:
            return _kill(state, now, AbortSave(event.why))
        return state, ()
    if isinstance(event, DeadlineMoved):
        return _on_deadline_moved(state, event, now)
    return _on_tick(state, event, now)


def _on_notice(state: StopState, event: NoticeArrived, now: float) -> tuple[StopState, tuple[Effect, ...]]:
    usable = event.deadline - event.margin
    if state.stopping:
        # Already stopping (a person's Ctrl-C, a policy stop): the notice only brings the end closer.
        deadline = event.deadline if state.deadline is None else min(state.deadline, event.deadline)
        kill_at = state.kill_at if state.kill_at is None else min(state.kill_at, deadline)
        return replace(state, deadline=deadline, kill_at=kill_at), ()
    base = replace(state, cause=Cause(CauseKind.NOTICE, event.why), deadline=event.deadline, usable=usable,
                   cooperative=event.cooperative)
    stop_file = WriteStopFile("preemption", event.deadline)
    if event.decision is SaveDecision.BLOCK:
        nxt = replace(base, phase=StopPhase.BLOCKING, next_broadcast=now + BROADCAST_EVERY)
        return nxt, (stop_file, _stop_broadcast(nxt, after_save=True))
    if event.decision is SaveDecision.ABORT:
        nxt, effects = _kill(base, now, AbortSave(event.why))
        return nxt, (stop_file, _stop_broadcast(nxt), *effects)
    if event.decision is SaveDecision.EMERGENCY_SAVE:
        nxt = replace(base, phase=StopPhase.SAVING, next_broadcast=now + BROADCAST_EVERY)
        return nxt, (stop_file, Broadcast("save_now", (("deadline", usable),)), _stop_broadcast(nxt))
    nxt, effects = _terminate(base, now)
    return nxt, (stop_file, *effects)


def _on_stop_asked(state: StopState, event: StopAsked, now: float) -> tuple[StopState, tuple[Effect, ...]]:
    if state.stopping:
        return replace(state, cause=stronger(state.cause, event.cause)), ()
    deadline = now + event.grace
    base = replace(state, cause=event.cause, deadline=deadline, usable=deadline, cooperative=True)
    return _terminate(base, now, event.graceful_signal, wait=event.grace)


def _on_deadline_moved(state: StopState, event: DeadlineMoved, now: float) -> tuple[StopState, tuple[Effect, ...]]:
    if state.deadline is not None and event.deadline >= state.deadline:
        return state, ()
    usable = event.deadline - event.margin
    kill_at = state.kill_at if state.kill_at is None else min(state.kill_at, event.deadline)
    nxt = replace(state, deadline=event.deadline, usable=usable, kill_at=kill_at, next_broadcast=now)
    return nxt, ()


def kill_due(state: StopState, now: float) -> bool:
    """Whether the next :class:`Tick` at ``now`` ends an unchanged child stopped by a notice: the
    moment to look once more for a save it began after the notice (``Tick.writer_open``)."""
    return (state.phase is StopPhase.TERMINATING and state.kill_at is not None and now >= state.kill_at
            and _may_block_on_writer(state, now))


def _may_block_on_writer(state: StopState, now: float) -> bool:
    return (state.is_(CauseKind.NOTICE) and not state.cooperative and state.usable is not None
            and now < state.usable)


def _on_tick(state: StopState, event: Tick, now: float) -> tuple[StopState, tuple[Effect, ...]]:
    phase = state.phase
    if phase is StopPhase.RUNNING:
        return state, ()
    if phase is StopPhase.KILLING:
        if now >= state.next_kill:
            return replace(state, next_kill=now + KILL_EVERY), (SignalGroup(signal.SIGKILL),)
        return state, ()
    if phase is StopPhase.BLOCKING and state.usable is not None and now >= state.usable:
        return _kill(state, now, AbortSave("the save was still running at deadline - margin"))
    if phase is StopPhase.SAVING and state.usable is not None and now >= state.usable:
        if event.save_in_flight:
            return _kill(state, now, AbortSave("the emergency save did not finish before deadline - margin"))
        return _terminate(state, now)
    if phase is StopPhase.TERMINATING and state.kill_at is not None and now >= state.kill_at:
        if event.writer_open and _may_block_on_writer(state, now):
            # A save began between the notice and the kill: let it land (the loop aborts it if it is
            # projected to overrun, and at deadline - margin at the latest), then stop.
            return replace(state, phase=StopPhase.BLOCKING, kill_at=None, next_broadcast=now), ()
        return _kill(state, now)
    if now >= state.next_broadcast:
        return replace(state, next_broadcast=now + BROADCAST_EVERY), (_stop_broadcast(state),)
    return state, ()
