"""The stop state machine (``supervisor/run/stop.py``) as a table: every phase x every event.

Each row starts from a state reached through ``advance()`` itself (never built by hand, so a row
cannot test a state the machine could not be in), applies one event at a given time and checks the
next phase and the effects the loop must carry out. What the table pins, in words:

* a notice decides the first move (block, emergency save, stop now, abort) only while RUNNING; a
  later notice only brings the deadline closer;
* a save that lands ends BLOCKING/SAVING with the graceful signal; an unchanged child gets SIGKILL at
  once after it, a cooperative one may use the time up to the deadline;
* at deadline - margin a save still running is aborted (SIGKILL plus an abort), never waited for;
* a deadline only ever moves earlier; SIGKILL repeats every second until the child is gone;
* why the attempt stops is one cause, set by advance() alone: the first stop sets it, a later one
  (while stopping) only replaces it when it ranks higher (``stop.CAUSE_RANK``), and never moves the
  phase.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any

import pytest

from supervisor.run.stop import (
    KILL_EVERY,
    AbortDue,
    AbortSave,
    Broadcast,
    Cause,
    CauseKind,
    DeadlineMoved,
    ForceKill,
    NoticeArrived,
    SaveLanded,
    SignalGroup,
    StopAsked,
    StopPhase,
    StopState,
    Tick,
    WriteStopFile,
    advance,
)
from supervisor.states import SaveDecision

AUDIT = Cause(CauseKind.POLICY, "resume audit failed", by="resume_audit")
STALL = Cause(CauseKind.HANG, "no progress for 300 s")
CTRL_C = Cause(CauseKind.INTERRUPT, "interrupted by a person")
SLOW = Cause(CauseKind.REQUEUE, "slow node: n1")

T0 = 1000.0  # the notice arrives here
DEADLINE = T0 + 60.0
MARGIN = 10.0  # so saves must be done by T0 + 50


def notice(decision: SaveDecision, *, cooperative: bool = False, deadline: float = DEADLINE) -> NoticeArrived:
    return NoticeArrived(decision, deadline, MARGIN, f"test: {decision.value}", cooperative)


def reach(phase: str) -> StopState:
    """A state in ``phase``, reached through advance() from RUNNING at T0."""
    start = StopState()
    if phase == "running":
        return start
    how = {
        "blocking": notice(SaveDecision.BLOCK),
        "saving": notice(SaveDecision.EMERGENCY_SAVE, cooperative=True),
        "terminating": notice(SaveDecision.STOP_NOW, cooperative=True),  # kill_at = the deadline
        "killing": notice(SaveDecision.ABORT),
    }[phase]
    state, _ = advance(start, how, T0)
    assert state.phase.value == phase
    return state


def shape(effects: tuple[Any, ...]) -> list[str]:
    """Effects as short words: 'stopfile', 'broadcast:stop', 'TERM', 'KILL', 'abort'."""
    out = []
    for e in effects:
        if isinstance(e, WriteStopFile):
            out.append("stopfile")
        elif isinstance(e, Broadcast):
            out.append(f"broadcast:{e.kind}")
        elif isinstance(e, SignalGroup):
            out.append(signal.Signals(e.signum).name.removeprefix("SIG"))
        elif isinstance(e, AbortSave):
            out.append("abort")
        else:  # pragma: no cover - a new effect type must be added to the table
            raise AssertionError(f"unknown effect {e!r}")
    return out


@dataclass(frozen=True)
class Row:
    phase: str
    event: Any
    at: float
    next_phase: str
    effects: list[str]


LATER = T0 + 5.0  # before deadline - margin
DUE = T0 + 50.0  # deadline - margin
PAST_KILL = DEADLINE + 0.1

ROWS = [
    # RUNNING: the notice's decision is the first move
    Row("running", notice(SaveDecision.BLOCK), T0, "blocking", ["stopfile", "broadcast:stop"]),
    Row("running", notice(SaveDecision.EMERGENCY_SAVE), T0, "saving",
        ["stopfile", "broadcast:save_now", "broadcast:stop"]),
    Row("running", notice(SaveDecision.STOP_NOW), T0, "terminating", ["stopfile", "broadcast:stop", "TERM"]),
    Row("running", notice(SaveDecision.ABORT), T0, "killing", ["stopfile", "broadcast:stop", "abort", "KILL"]),
    Row("running", StopAsked(AUDIT, grace=30.0), T0, "terminating",
        ["broadcast:stop", "TERM"]),
    Row("running", StopAsked(CTRL_C, grace=30.0, graceful_signal=signal.SIGINT), T0,
        "terminating", ["broadcast:stop", "INT"]),
    Row("running", ForceKill(CTRL_C), T0, "killing", ["KILL"]),
    Row("running", SaveLanded(), T0, "running", []),
    Row("running", AbortDue("overrun"), T0, "running", []),
    Row("running", DeadlineMoved(T0 + 20, MARGIN), T0, "running", []),
    Row("running", Tick(), T0, "running", []),
    # BLOCKING: the save lands (graceful end), or deadline - margin comes first (abort)
    Row("blocking", SaveLanded(), LATER, "terminating", ["broadcast:stop", "TERM"]),
    Row("blocking", AbortDue("projected overrun"), LATER, "killing", ["abort", "KILL"]),
    Row("blocking", Tick(save_in_flight=True), LATER, "blocking", ["broadcast:stop"]),
    Row("blocking", Tick(save_in_flight=True), DUE, "killing", ["abort", "KILL"]),
    Row("blocking", notice(SaveDecision.STOP_NOW), LATER, "blocking", []),
    Row("blocking", StopAsked(STALL, grace=5.0), LATER, "blocking", []),
    Row("blocking", ForceKill(CTRL_C), LATER, "killing", ["KILL"]),
    Row("blocking", DeadlineMoved(T0 + 20, MARGIN), LATER, "blocking", []),
    # SAVING (an emergency save asked of a client)
    Row("saving", SaveLanded(), LATER, "terminating", ["broadcast:stop", "TERM"]),
    Row("saving", Tick(save_in_flight=True), LATER, "saving", ["broadcast:stop"]),
    Row("saving", Tick(save_in_flight=True), DUE, "killing", ["abort", "KILL"]),
    Row("saving", Tick(save_in_flight=False), DUE, "terminating", ["broadcast:stop", "TERM"]),
    Row("saving", AbortDue("overrun"), LATER, "saving", []),  # only BLOCKING aborts on a projection
    Row("saving", ForceKill(CTRL_C), LATER, "killing", ["KILL"]),
    # TERMINATING: SIGKILL at kill_at
    Row("terminating", Tick(), LATER, "terminating", ["broadcast:stop"]),
    Row("terminating", Tick(), PAST_KILL, "killing", ["KILL"]),
    Row("terminating", SaveLanded(), LATER, "terminating", []),
    Row("terminating", ForceKill(CTRL_C), LATER, "killing", ["KILL"]),
    Row("terminating", notice(SaveDecision.ABORT), LATER, "terminating", []),
    # KILLING: SIGKILL every second until the group is gone; nothing else changes it
    Row("killing", Tick(), T0 + KILL_EVERY / 2, "killing", []),
    Row("killing", Tick(), T0 + KILL_EVERY, "killing", ["KILL"]),
    Row("killing", ForceKill(CTRL_C), LATER, "killing", []),
    Row("killing", SaveLanded(), LATER, "killing", []),
    Row("killing", notice(SaveDecision.BLOCK), LATER, "killing", []),
    Row("killing", StopAsked(STALL, grace=5.0), LATER, "killing", []),
]


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r.phase}-{type(r.event).__name__}-{r.at - T0:+g}s")
def test_every_phase_and_event(row: Row) -> None:
    state, effects = advance(reach(row.phase), row.event, row.at)
    assert (state.phase.value, shape(effects)) == (row.next_phase, row.effects)


def test_the_table_covers_every_phase_and_every_event_type() -> None:
    phases = {r.phase for r in ROWS}
    events = {type(r.event) for r in ROWS}
    assert phases == {p.value for p in StopPhase}
    assert events == {NoticeArrived, StopAsked, ForceKill, SaveLanded, AbortDue, DeadlineMoved, Tick}


def test_an_unchanged_child_is_killed_as_soon_as_its_save_lands() -> None:
    # Its notice signals are ignored (the shield): waiting would only let it begin another save.
    blocking = reach("blocking")
    assert not blocking.cooperative
    state, _ = advance(blocking, SaveLanded(), LATER)
    assert state.kill_at == LATER
    state, effects = advance(state, Tick(), LATER)
    assert state.phase is StopPhase.KILLING and shape(effects) == ["KILL"]


def test_a_cooperative_child_may_use_the_time_up_to_the_deadline_after_its_emergency_save() -> None:
    state, _ = advance(reach("saving"), SaveLanded(), LATER)
    assert state.phase is StopPhase.TERMINATING and state.kill_at == DEADLINE


def test_a_deadline_only_moves_earlier_and_pulls_the_kill_with_it() -> None:
    terminating = reach("terminating")
    later, effects = advance(terminating, DeadlineMoved(DEADLINE + 30, MARGIN), LATER)
    assert (later, effects) == (terminating, ())
    earlier, _ = advance(terminating, DeadlineMoved(T0 + 20, MARGIN), LATER)
    assert (earlier.deadline, earlier.usable, earlier.kill_at) == (T0 + 20, T0 + 20 - MARGIN, T0 + 20)


def test_a_notice_while_a_policy_stop_runs_only_brings_the_end_closer() -> None:
    state, _ = advance(StopState(), StopAsked(STALL, grace=300.0), T0)
    assert state.kill_at == T0 + 300
    state, effects = advance(state, notice(SaveDecision.BLOCK, deadline=T0 + 30), T0 + 1)
    assert effects == () and state.phase is StopPhase.TERMINATING
    assert (state.cause, state.deadline, state.kill_at) == (STALL, T0 + 30, T0 + 30)


def test_a_save_open_for_writing_when_an_unchanged_child_is_due_to_die_is_blocked_on_then_killed() -> None:
    # Stop now (no save seen at the notice): the kill is due at once. The loop's last look finds a
    # checkpoint open for writing: block on it, as on a save seen at the notice, then kill.
    from supervisor.run.stop import kill_due

    state, _ = advance(StopState(), notice(SaveDecision.STOP_NOW), T0)
    assert state.phase is StopPhase.TERMINATING and kill_due(state, T0)
    state, effects = advance(state, Tick(save_in_flight=True, writer_open=True), T0)
    assert state.phase is StopPhase.BLOCKING and shape(effects) == []
    state, effects = advance(state, SaveLanded(), LATER)
    assert state.phase is StopPhase.TERMINATING and kill_due(state, LATER)
    state, effects = advance(state, Tick(), LATER)
    assert state.phase is StopPhase.KILLING and shape(effects) == ["KILL"]


def test_a_writer_found_too_late_or_for_a_cooperative_child_changes_nothing() -> None:
    from supervisor.run.stop import kill_due

    # At deadline - margin a save cannot be let land: the kill goes ahead.
    state, _ = advance(StopState(), notice(SaveDecision.STOP_NOW, deadline=T0 + MARGIN), T0)
    assert not kill_due(state, T0)
    state, effects = advance(state, Tick(writer_open=True), T0)
    assert state.phase is StopPhase.KILLING and shape(effects) == ["KILL"]
    # A cooperative child saves on should_stop() and reports it; its kill comes at the deadline.
    cooperative = reach("terminating")
    assert not kill_due(cooperative, PAST_KILL)
    state, _ = advance(cooperative, Tick(writer_open=True), PAST_KILL)
    assert state.phase is StopPhase.KILLING
    # A policy stop (stall, resume audit) is not a notice: no blocking on writers there either.
    policy, _ = advance(StopState(), StopAsked(STALL, grace=0.0), T0)
    assert not kill_due(policy, T0)


# ------------------------------------------------------------------------------------ the one cause

NOTICE_WHY = "test: block"

CAUSE_ROWS = [
    # (first stop, second stop, the cause the verdict reads)
    (notice(SaveDecision.BLOCK), StopAsked(AUDIT, grace=30.0), AUDIT),  # a policy stop during a notice stops the run
    (notice(SaveDecision.BLOCK), StopAsked(CTRL_C, grace=30.0), CTRL_C),  # a person's word beats the notice
    (notice(SaveDecision.BLOCK), StopAsked(SLOW, grace=30.0), SLOW),
    (StopAsked(AUDIT, grace=30.0), notice(SaveDecision.BLOCK), AUDIT),  # the notice only moves the deadline
    (StopAsked(AUDIT, grace=30.0), StopAsked(SLOW, grace=30.0), AUDIT),  # a requeue never undoes a policy stop
    (StopAsked(SLOW, grace=30.0), StopAsked(AUDIT, grace=30.0), AUDIT),
    (StopAsked(AUDIT, grace=30.0), StopAsked(Cause(CauseKind.POLICY, "loss anomaly", by="loss_policy"), 30.0),
     AUDIT),  # equal rank: the first stays
    (StopAsked(STALL, grace=5.0), StopAsked(CTRL_C, grace=30.0), STALL),  # the stall is what ended the attempt
    (StopAsked(CTRL_C, grace=30.0), ForceKill(Cause(CauseKind.LOCK_LOST, "taken")),
     Cause(CauseKind.LOCK_LOST, "taken")),
]


@pytest.mark.parametrize("first,second,kept", CAUSE_ROWS,
                         ids=lambda x: getattr(getattr(x, "cause", None), "kind", type(x).__name__).__str__())
def test_one_cause_the_stronger_kept_and_the_phase_left_alone(first: Any, second: Any, kept: Cause) -> None:
    state, _ = advance(StopState(), first, T0)
    phase = state.phase
    state, _ = advance(state, second, T0 + 1)
    assert state.cause == kept
    if not isinstance(second, ForceKill):
        assert state.phase is phase


def test_a_notice_sets_the_notice_cause_with_the_arbitrations_words_and_clients_read_preemption() -> None:
    state, effects = advance(StopState(), notice(SaveDecision.STOP_NOW), T0)
    assert state.cause == Cause(CauseKind.NOTICE, "test: stop_now")
    stop = next(e for e in effects if isinstance(e, Broadcast) and e.kind == "stop")
    assert stop.as_dict()["reason"] == "preemption"
    state, effects = advance(StopState(), StopAsked(CTRL_C, grace=30.0), T0)
    assert next(e for e in effects if isinstance(e, Broadcast)).as_dict()["reason"] == "interrupt"
    state, effects = advance(StopState(), StopAsked(STALL, grace=30.0), T0)
    assert next(e for e in effects if isinstance(e, Broadcast)).as_dict()["reason"] == "policy"
