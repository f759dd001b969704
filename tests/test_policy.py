"""Decide by progress (issue #12): the restart policy and the budgets played over whole runs.

Each scenario is played the way the run loop plays it: after every attempt the ledger is folded
from the events written so far, ``policy.decide`` gets the failure, the earlier attempts and the
attempt that just ended, and ``budget.judge`` weighs a restart or a requeue. The training itself is
a rule (where each attempt ends, which steps it saves), so every run is plain data and takes
milliseconds; no clock, no process. The real loop is exercised end to end in test_run_restarts.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pytest

from supervisor.budget import judge, run_verdict
from supervisor.config import BudgetConfig, load_config
from supervisor.events import Ev, Event
from supervisor.failures import Failure
from supervisor.ledger import AttemptRecord, ledger_from_events
from supervisor.policy import DEFAULT_POLICY, ClassPolicy, decide, failures_in_a_row
from supervisor.states import Action
from supervisor.states import FailureClass as FC

IMA = "torch.AcceleratorError: CUDA error: an illegal memory access was encountered"


@dataclass(frozen=True)
class End:
    """How one attempt ends: its class and the last step it reached; ``saves_last`` = it saved that
    step before it went (an emergency save at a stop notice)."""

    cls: FC
    step: int
    saves_last: bool = False


@dataclass
class Played:
    events: list[Event] = field(default_factory=list)
    decisions: list[tuple[str, str]] = field(default_factory=list)  # (action, reason) per failure
    outcome: str = "running"
    stopped_by: str | None = None
    reason: str = ""

    @property
    def attempts(self) -> int:
        return sum(1 for e in self.events if e.event == Ev.ATTEMPT_START.value)


def play(ends: Callable[[int, int], End | None], *, total: int, save_every: int,
         budget: BudgetConfig | None = None, policy: dict[FC, ClassPolicy] | None = None,
         source: str = "regex", job: str = "4242", max_attempts: int = 60) -> Played:
    """Run a training of ``total`` steps that saves every ``save_every`` steps; ``ends(attempt,
    resume_step)`` says how each attempt ends (None: it completes). The supervisor side is the real
    decide/judge over the real ledger; the events are the ones the loop writes."""
    budget = budget or BudgetConfig()
    policy = policy if policy is not None else dict(DEFAULT_POLICY)
    out = Played()
    t = 1000.0
    restart_count = 0
    durable: int | None = None  # newest checkpoint on disk
    out.events.append(Event(Ev.RUN_START.value, t, {"job_id": job, "restart_count": 0}))
    for n in range(1, max_attempts + 1):
        t += 10
        path = f"ckpt/step={durable}.ckpt" if durable is not None else None
        out.events.append(Event(Ev.RESUME_POINT.value, t, {"attempt": n, "path": path, "step": durable}))
        out.events.append(Event(Ev.ATTEMPT_START.value, t, {
            "attempt": n, "job_id": job, "restart_count": restart_count, "resume_path": path, "resume_step": durable}))
        start = durable or 0
        end = ends(n, start)
        last = total if end is None else end.step
        for step in range(start + 1, last + 1):
            t += 1
            if step % 10 == 0 or step == last:
                out.events.append(Event(Ev.PROGRESS.value, t, {"attempt": n, "step": step, "source": source}))
            saved = step % save_every == 0 and (step < last or end is None or end.saves_last)
            if saved or (end is not None and end.saves_last and step == last):
                durable = step
                out.events.append(Event(Ev.SAVE_END.value, t, {
                    "attempt": n, "step": step, "path": f"ckpt/step={step}.ckpt", "ok": True, "source": "watch"}))
        t += 1
        cls = FC.COMPLETED if end is None else end.cls
        out.events.append(Event(Ev.ATTEMPT_END.value, t, {
            "attempt": n, "first_step": start + 1 if last > start else None, "last_step": last,
            "last_durable_step": durable, "resume_step": start if start else None, "step_source": source,
            "class": cls.value, "action": None if end is None else DEFAULT_POLICY[cls].action.value}))
        if end is None:
            out.events.append(Event(Ev.RUN_END.value, t, {"outcome": "complete", "reason": "training complete"}))
            out.outcome = "complete"
            return out
        failure = Failure(cls=cls, evidence=(IMA,) if cls == FC.ILLEGAL_MEMORY_ACCESS
                          else ("evidence",), step=last)
        out.events.append(Event(Ev.FAILURE.value, t, {"attempt": n, "class": cls.value, "step": last,
                                                      "evidence": list(failure.evidence)}))
        records = ledger_from_events(out.events)
        decision = decide(failure, records[:-1], policy, job, current=records[-1],
                          min_progress=budget.min_durable_progress)
        out.decisions.append((decision.action.value, decision.reason))
        stop: tuple[str | None, str] | None = None
        if decision.action == Action.STOP:
            stop = (decision.stopped_by, decision.reason)
        else:
            verdict = judge(records, budget, job)
            if not verdict.ok:
                stop = (verdict.budget, verdict.stop_reason)
        if stop is not None:
            out.events.append(Event(Ev.RUN_END.value, t, {"outcome": "stopped", "reason": stop[1],
                                                          "stopped_by": stop[0]}))
            out.outcome, out.stopped_by, out.reason = "stopped", stop[0], stop[1]
            return out
        out.events.append(Event(Ev.DECISION.value, t, {"attempt": n, "action": decision.action.value,
                                                       "reason": decision.reason}))
        if decision.action == Action.REQUEUE:
            restart_count += 1
            out.events.append(Event(Ev.RUN_END.value, t, {"outcome": "requeue", "reason": decision.reason}))
            out.events.append(Event(Ev.RUN_START.value, t + 60, {"job_id": job, "restart_count": restart_count}))
    raise AssertionError(f"no end after {max_attempts} attempts: {out.decisions[-3:]}")


def crashes_at(steps: list[int], cls: FC = FC.ILLEGAL_MEMORY_ACCESS) -> Callable[[int, int], End | None]:
    return lambda n, _start: End(cls, steps[n - 1]) if n <= len(steps) else None


# --------------------------------------------------------------------------------------------- progress


def test_h200_illegal_memory_access_every_120_steps_is_carried_to_the_end():
    """Measured on an H200: a genuine illegal memory access at steps 120..600 of 700, saves every 50.
    Each attempt saved 100+ steps past its resume point, so no crash is 'in a row'."""
    run = play(crashes_at([120, 240, 360, 480, 600]), total=700, save_every=50)
    assert run.outcome == "complete", run.reason
    assert run.attempts == 6
    assert [action for action, _ in run.decisions] == ["restart"] * 5
    assert all("after durable progress" in reason for _, reason in run.decisions)
    assert "attempt 3 saved up to step 350 from step 200" in run.decisions[2][1]
    records = ledger_from_events(run.events)
    assert [r.resume_step for r in records] == [None, 100, 200, 350, 450, 550]
    assert [r.steps_lost for r in records] == [20, 40, 10, 30, 50, 0]
    # Every restart waited the first backoff only: the count started again each time.
    assert len({reason.split("after ")[1].split("s")[0] for _, reason in run.decisions}) == 1
    verdict = run_verdict(run.events, BudgetConfig())
    assert verdict.ok and verdict.source == "judge"


def test_h200_case_stops_when_the_user_asks_for_more_progress_per_crash():
    """``budget.min_durable_progress`` is the bar: 200 steps per attempt makes those crashes a loop."""
    run = play(crashes_at([120, 240, 360, 480, 600]), total=700, save_every=50,
               budget=BudgetConfig(min_durable_progress=200))
    assert run.outcome == "stopped" and run.stopped_by == "policy.illegal_memory_access.retries"
    assert run.attempts == 4
    assert "illegal_memory_access 4 times in a row; policy allows 3 restarts in a row without durable progress" \
        in run.reason


def test_the_same_crash_at_the_same_step_is_stopped_within_a_few_attempts():
    run = play(lambda n, start: End(FC.NATIVE_CRASH, 35), total=100, save_every=10)
    assert run.outcome == "stopped"
    assert 2 <= run.attempts <= 10
    assert run.stopped_by == "same_failure_limit" and "native_crash at step 35 3 times" in run.reason


def test_the_same_crash_without_the_same_step_budget_is_stopped_by_the_class_retries():
    run = play(lambda n, start: End(FC.NATIVE_CRASH, 35), total=100, save_every=10,
               budget=BudgetConfig(same_failure_limit=None))
    assert run.outcome == "stopped" and 2 <= run.attempts <= 10
    assert run.stopped_by == "policy.native_crash.retries"
    # Attempt 1 saved 10..30 (progress); attempts 2-4 resumed from 30 and saved nothing new.
    assert "native_crash 4 times in a row" in run.reason and "every time from step 30" in run.reason


def test_a_crash_every_5_steps_of_progress_is_stopped_by_the_absolute_failure_rate_when_asked():
    run = play(lambda n, start: End(FC.NATIVE_CRASH, start + 6), total=1000, save_every=5,
               budget=BudgetConfig(min_steps_per_failure=50))
    assert run.outcome == "stopped" and run.stopped_by == "min_steps_per_failure"
    assert run.attempts == 5  # the window: five failures
    assert "the last 5 failures" in run.reason and "25 steps of durable progress" in run.reason
    assert "at least 50 per failure" in run.reason
    # Each of them did make progress: the class count alone would have gone on.
    assert all(action == "restart" for action, _ in run.decisions)


def test_the_failure_rate_budget_can_be_switched_off():
    run = play(lambda n, start: End(FC.NATIVE_CRASH, start + 6) if n <= 8 else None, total=100, save_every=5,
               budget=BudgetConfig(min_steps_per_failure=None, min_kept_per_lost=None))
    assert run.outcome == "complete" and run.attempts == 9


def test_a_crash_every_20_steps_with_saves_every_10_completes_under_the_default_config():
    """Issue 21: it keeps 20 steps for every 5 it loses. Steps are not comparable across trainings,
    so the default rate budget weighs steps kept against steps lost, never an absolute count."""
    ends = lambda n, start: End(FC.NATIVE_CRASH, start + 25) if start + 25 < 200 else None
    run = play(ends, total=200, save_every=10)
    assert run.outcome == "complete", run.reason
    assert run.attempts == 10 and all(action == "restart" for action, _ in run.decisions)
    verdict = run_verdict(run.events, BudgetConfig())
    assert verdict.ok, verdict.reason
    assert "steps kept for ≥25 lost over the last 5 failures (min 1 per step lost)" in verdict.reason
    # The old absolute default (50 steps of progress per failure) stopped this run at its fifth crash.
    old = play(ends, total=200, save_every=10, budget=BudgetConfig(min_steps_per_failure=50, min_kept_per_lost=None))
    assert old.outcome == "stopped" and old.stopped_by == "min_steps_per_failure" and old.attempts == 5


def test_a_run_that_loses_more_than_it_keeps_is_stopped_by_the_scale_free_rate():
    """Odd attempts save step +50 and die 1 step later; even ones die 1 step before their first save
    (another class, so no retry count grows). Attempts 2-6 keep 100 steps and lose 149."""
    ends = lambda n, start: End(FC.NATIVE_CRASH, start + 51) if n % 2 else End(FC.ILLEGAL_MEMORY_ACCESS, start + 49)
    run = play(ends, total=2000, save_every=50, budget=BudgetConfig(max_steps_lost_fraction=None))
    assert run.outcome == "stopped" and run.stopped_by == "min_kept_per_lost", run.reason
    assert run.attempts == 6
    assert "kept 100 steps (durable progress, step 50 to 150) and lost ≥149" in run.reason
    assert "at least 1 step(s) kept per step lost" in run.reason


def test_crashes_from_the_same_resume_point_in_different_classes_are_still_stopped():
    """Alternating classes never make one class's count grow; the budgets stop the loop."""
    classes = [FC.ILLEGAL_MEMORY_ACCESS, FC.NATIVE_CRASH] * 10
    ends = lambda n, start: End(classes[n - 1], 41 + n)
    run = play(ends, total=100, save_every=50)
    assert run.outcome == "stopped" and run.stopped_by == "max_steps_lost_fraction" and run.attempts == 3
    assert all("1st in a row without durable progress" in reason for _, reason in run.decisions)
    run = play(ends, total=100, save_every=50, budget=BudgetConfig(max_steps_lost_fraction=None))
    assert run.outcome == "stopped" and run.stopped_by == "min_kept_per_lost" and run.attempts == 5
    assert "kept 0 steps" in run.reason
    run = play(ends, total=100, save_every=50, budget=BudgetConfig(max_steps_lost_fraction=None,
                                                                   min_kept_per_lost=None, min_steps_per_failure=50))
    assert run.outcome == "stopped" and run.stopped_by == "min_steps_per_failure" and run.attempts == 5
    assert "0 steps of durable progress" in run.reason


# --------------------------------------------------------------------------------------------- requeues


def test_requeues_without_progress_are_stopped_by_their_budget():
    """Measured: a zero-code run killed at every start before any save was requeued again and again."""
    run = play(lambda n, start: End(FC.TIME_LIMIT, start + 3), total=500, save_every=50)
    assert run.outcome == "stopped" and run.stopped_by == "max_requeues_without_progress"
    assert run.attempts == 4  # three allowed
    assert "4 preemptions or time limits in a row without durable progress" in run.reason
    assert [action for action, _ in run.decisions] == ["requeue"] * 4


def test_requeues_that_save_go_on_to_the_end():
    """With the client each stop saved and the next job resumed there (measured: 507 -> 961)."""
    run = play(lambda n, start: End(FC.PREEMPTED, start + 454, saves_last=True) if start + 454 < 3000 else None,
               total=3000, save_every=1000, source="client")
    assert run.outcome == "complete", run.reason
    assert run.attempts == 7
    records = ledger_from_events(run.events)
    assert [r.steps_lost for r in records] == [0] * 7


def test_a_requeue_with_progress_resets_the_count():
    # Two empty requeues, one that saved, three empty ones: never more than 3 in a row.
    saving = {3}
    run = play(lambda n, start: End(FC.PREEMPTED, start + (60 if n in saving else 3), saves_last=n in saving)
               if n <= 6 else None, total=200, save_every=100)
    assert run.outcome == "complete", run.reason


# --------------------------------------------------------------------------------------------- decide


def _failure(cls: FC, step: int | None = None) -> Failure:
    return Failure(cls=cls, evidence=("evidence line",), step=step)


def test_decide_without_the_current_record_counts_as_before():
    """The loop passes ``current``; without it (or without steps) nothing says there was progress."""
    history = [AttemptRecord(attempt=i, cls=FC.NATIVE_CRASH) for i in (1, 2, 3)]
    d = decide(_failure(FC.NATIVE_CRASH), history, DEFAULT_POLICY, None)
    assert d.action == Action.STOP and d.stopped_by == "policy.native_crash.retries" and d.in_a_row == 4


def test_progress_of_an_earlier_attempt_is_read_from_where_the_next_one_resumed():
    # Attempt 1 saved nothing the watch saw, but attempt 2 resumed from step 80 (a save seen late).
    history = [AttemptRecord(attempt=1, cls=FC.NATIVE_CRASH, fresh=True, last_step=90),
               AttemptRecord(attempt=2, cls=FC.NATIVE_CRASH, resume_step=80, last_step=85, last_durable_step=80)]
    current = AttemptRecord(attempt=3, cls=FC.NATIVE_CRASH, resume_step=80, last_step=85, last_durable_step=80)
    streak = failures_in_a_row(FC.NATIVE_CRASH, history, current)
    assert streak.count == 3 and streak.reset_by is not None and streak.reset_by.attempt == 1
    assert streak.resume_steps == (80, 80)  # attempt 1 made progress: not part of the loop


def test_a_torn_save_is_no_progress():
    """Attempt 1 saved step 100, but the file was torn and attempt 2 resumed from 50 again."""
    first = AttemptRecord(attempt=1, cls=FC.NATIVE_CRASH, resume_step=50, last_step=120, last_durable_step=100)
    second = AttemptRecord(attempt=2, cls=FC.NATIVE_CRASH, resume_step=50, last_step=60, last_durable_step=50)
    assert failures_in_a_row(FC.NATIVE_CRASH, [first], second).count == 2
    assert failures_in_a_row(FC.NATIVE_CRASH, [replace(first, resume_step=10)], second).count == 2


def test_stop_classes_name_their_policy_key():
    d = decide(_failure(FC.CUDA_OOM), [], DEFAULT_POLICY, "1")
    assert d.action == Action.STOP and d.stopped_by == "policy.cuda_oom.action"


# --------------------------------------------------------------------------------------------- config


def test_budget_keys_old_and_new_load_from_yaml_keys(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("budget:\n  min_progress_between_crashes: 20\n  max_requeues_without_progress: 5\n"
                        "  min_steps_per_failure: 10\n  results_check_crash_free_steps: 500\n")
    budget = load_config(cfg_file, environ={}).budget
    assert (budget.min_progress_between_crashes, budget.max_requeues_without_progress) == (20, 5)
    assert (budget.min_steps_per_failure, budget.results_check_crash_free_steps) == (10, 500)
    defaults = load_config(environ={}).budget
    assert (defaults.min_durable_progress, defaults.max_requeues_without_progress, defaults.min_steps_per_failure,
            defaults.failure_rate_window, defaults.max_restarts_from_scratch) == (1, 3, None, 5, 0)
    assert defaults.min_kept_per_lost == 1.0


def test_a_bad_budget_value_is_one_clear_line(tmp_path):
    from supervisor.errors import ConfigError

    with pytest.raises(ConfigError, match="budget.max_requeues_without_progress"):
        load_config(environ={}, sets=("budget.max_requeues_without_progress=many",))


def test_judge_names_every_new_budget_only_when_it_applies():
    ok = judge([AttemptRecord(attempt=1, cls=FC.PREEMPTED, fresh=True, last_step=3)], BudgetConfig(), None)
    assert ok.ok and ok.numbers["requeues_without_progress"] == 1 and "1 requeue(s) without progress" in ok.reason
