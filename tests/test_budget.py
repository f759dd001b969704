"""The step-budget audit: ledger folded from the event log, budget verdicts, resume audit, and the
``supervise audit`` command on a run directory written by the real EventLog."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from supervisor.budget import AttemptRecord, audit_resume, judge, ledger_from_events
from supervisor.cli import main
from supervisor.config import BudgetConfig
from supervisor.events import Ev, Event, EventLog
from supervisor.states import Action
from supervisor.states import FailureClass as FC

NO_LIMITS = BudgetConfig(max_restarts_per_allocation=None, max_total_restarts=None, max_steps_lost=None,
                         max_steps_lost_fraction=None, min_progress_between_crashes=None, same_failure_limit=None)


def ev(name: Ev | str, ts: float, **fields) -> Event:
    return Event(name.value if isinstance(name, Ev) else name, ts, fields)


def attempt(n: int, t0: float, *, job: str | None = "500", restart_count: int | None = None,
            resume: tuple[str, int] | None = None, steps: tuple[int, ...] = (), saves: tuple[int, ...] = (),
            cls: FC | None = FC.NATIVE_CRASH, action: Action | None = Action.RESTART,
            failure_step: int | None = None, end: bool = True) -> list[Event]:
    """The events one attempt of the run loop leaves: start, progress, saves, end, failure, decision."""
    out = [ev(Ev.ATTEMPT_START, t0, attempt=n, job_id=job, restart_count=restart_count, nodes="n[1-2]",
              host="n1", resume_path=resume[0] if resume else None, resume_step=resume[1] if resume else None)]
    t = t0
    for i, step in enumerate(steps):
        t += 10
        if i == 0:
            out.append(ev(Ev.RESUMED, t, attempt=n, step=step, expected_step=resume[1] if resume else None))
        out.append(ev(Ev.PROGRESS, t, attempt=n, step=step, rate=1.0, source="regex"))
        if step in saves:
            out.append(ev(Ev.SAVE_END, t + 1, attempt=n, step=step, path=f"ckpt/step_{step}.pt", bytes=10,
                          duration=1.0, ok=True, source="client"))
    if end:
        t += 5
        out.append(ev(Ev.ATTEMPT_END, t, attempt=n, exit_code=None if cls == FC.NATIVE_CRASH else 1,
                      signal="SIGSEGV" if cls == FC.NATIVE_CRASH else None,
                      **{"class": cls.value if cls else None, "action": action.value if action else None}))
        if cls not in (None, FC.COMPLETED):
            out.append(ev(Ev.FAILURE, t, attempt=n, action=action.value if action else None,
                          evidence=[f"evidence of attempt {n}"], step=failure_step if failure_step is not None
                          else (steps[-1] if steps else None), **{"class": cls.value}))
            out.append(ev(Ev.DECISION, t, attempt=n, action=action.value if action else "stop", reason="x",
                          delay=0))
    return out


# --------------------------------------------------------------------------------------------- ledger


def test_ledger_per_attempt_numbers():
    events = (attempt(1, 1000, steps=(1, 100, 200, 250), saves=(200,))
              + attempt(2, 2000, resume=("ckpt/step_200.pt", 200), steps=(201, 300, 380), saves=(300,)))
    first, second = ledger_from_events(events)
    assert (first.attempt, first.job_id, first.nodes) == (1, "500", ("n[1-2]",))
    assert (first.first_step, first.last_step, first.last_durable_step, first.steps_lost) == (1, 250, 200, 50)
    assert first.cls == FC.NATIVE_CRASH and first.action == Action.RESTART
    assert first.signal == 11  # attempt_end writes the signal's name
    assert first.evidence == ("evidence of attempt 1",)
    # wall lost: from the save of step 200 (ts 1031) to the end (ts 1045)
    assert first.wall_lost == pytest.approx(14.0)
    assert (second.resume_path, second.resume_step, second.first_step) == ("ckpt/step_200.pt", 200, 201)
    assert (second.last_durable_step, second.steps_lost) == (300, 80)


def test_ledger_never_invents_steps():
    events = attempt(1, 0, resume=("ckpt/x.pt", None), steps=(), cls=FC.PYTHON_EXCEPTION, action=Action.STOP)
    record = ledger_from_events(events)[0]
    assert (record.first_step, record.last_step, record.steps_lost) == (None, None, None)
    # a resume point whose step is unknown: the loss is unknown too
    events = attempt(1, 0, resume=("ckpt/x.pt", None), steps=(5, 9))
    record = ledger_from_events(events)[0]
    assert record.last_step == 9 and record.last_durable_step is None and record.steps_lost is None


def test_fresh_attempt_without_checkpoint_loses_every_step():
    record = ledger_from_events(attempt(1, 0, steps=(1, 40)))[0]
    assert record.steps_lost == 40


def test_ledger_prefers_the_runners_own_numbers():
    events = attempt(1, 0, steps=(10,), end=False) + [
        ev(Ev.ATTEMPT_END, 50, attempt=1, exit_code=1, signal=None, first_step=1, last_step=77,
           last_durable_step=70, steps_lost=7, wall_lost=3.5, **{"class": "illegal_memory_access",
                                                                   "action": "restart"})]
    record = ledger_from_events(events)[0]
    assert (record.first_step, record.last_step, record.last_durable_step) == (1, 77, 70)
    assert (record.steps_lost, record.wall_lost, record.cls) == (7, 3.5, FC.ILLEGAL_MEMORY_ACCESS)


def test_killed_supervisor_leaves_an_incomplete_attempt():
    events = attempt(1, 0, steps=(1, 40, 50), saves=(40,), end=False) + attempt(2, 500, resume=("c", 40), steps=(41,),
                                                                            end=False)
    first, second = ledger_from_events(events)
    assert first.cls is None and first.status == "incomplete" and first.end is None
    assert first.steps_lost == 10  # a later attempt started: what was not saved is gone
    assert second.status == "incomplete" and second.steps_lost is None  # may still be running


def test_ledger_tolerates_gaps_and_order():
    events = [
        ev(Ev.PROGRESS, 1, attempt=3, step=7),  # an attempt whose start is missing
        ev(Ev.ATTEMPT_START, 2, attempt=4, job_id=123, restart_count=1),
        ev(Ev.PROGRESS, 3, step=12),  # no attempt field: the attempt in progress
        ev(Ev.SAVE_END, 4, attempt=4, step=12, ok=False),  # a failed save is not durable
        ev(Ev.ATTEMPT_END, 5, attempt=4, **{"class": "not-a-class"}),
        ev("some_future_event", 6, attempt=4),
    ]
    r3, r4 = ledger_from_events(events)
    assert r3.attempt == 3 and r3.last_step == 7 and r3.start is None
    assert r4.job_id == "123" and r4.restart_count == 1 and r4.last_step == 12
    assert r4.last_durable_step is None and r4.cls is None


# --------------------------------------------------------------------------------------------- judge


def _records(*specs: tuple) -> list[AttemptRecord]:
    out = []
    for i, spec in enumerate(specs, 1):
        cls, job, rc, first, last, lost = spec
        out.append(AttemptRecord(attempt=i, job_id=job, restart_count=rc, cls=cls, first_step=first, last_step=last,
                                 steps_lost=lost, resume_step=first))
    return out


def test_restarts_per_allocation_counts_each_requeue_as_a_new_allocation():
    budget = BudgetConfig(max_restarts_per_allocation=2, max_total_restarts=None, max_steps_lost_fraction=None,
                          same_failure_limit=None)
    crash = FC.NATIVE_CRASH
    # 2 crashes, requeue (same job id, restart count 1), then 2 crashes: within 2 per allocation
    records = _records((crash, "9", None, 0, 10, 1), (crash, "9", None, 10, 20, 1),
                       (FC.PREEMPTED, "9", None, 20, 30, 0), (crash, "9", 1, 30, 40, 1), (crash, "9", 1, 40, 50, 1))
    assert judge(records, budget, "9").ok
    records += _records((crash, "9", 1, 50, 60, 1))[:1]
    verdict = judge(records, budget, "9")
    assert not verdict.ok and verdict.budget == "max_restarts_per_allocation"
    assert verdict.numbers["restarts_in_allocation"] == 3


def test_total_restarts_across_requeues():
    budget = BudgetConfig(max_restarts_per_allocation=None, max_total_restarts=2, max_steps_lost_fraction=None,
                          same_failure_limit=None)
    records = _records((FC.NATIVE_CRASH, "9", None, 0, 10, 1), (FC.PREEMPTED, "9", None, 10, 20, 0),
                       (FC.NCCL_ERROR, "9", 1, 20, 30, 1))
    assert judge(records, budget, "9").ok  # a preemption is not a restart after a failure
    records += [AttemptRecord(attempt=4, job_id="9", restart_count=2, cls=FC.HANG, last_step=35)]
    verdict = judge(records, budget, "9")
    assert (verdict.ok, verdict.budget, verdict.numbers["total_restarts"]) == (False, "max_total_restarts", 3)


def test_total_steps_lost():
    budget = NO_LIMITS.__class__(**{**NO_LIMITS.__dict__, "max_steps_lost": 100})
    records = _records((FC.NATIVE_CRASH, "9", None, 0, 500, 60), (FC.NATIVE_CRASH, "9", None, 440, 900, 50))
    verdict = judge(records, budget, "9")
    assert (verdict.ok, verdict.budget, verdict.numbers["total_steps_lost"]) == (False, "max_steps_lost", 110)


def test_steps_lost_fraction_needs_a_pattern_of_losses():
    budget = NO_LIMITS.__class__(**{**NO_LIMITS.__dict__, "max_steps_lost_fraction": 0.5})
    # one crash before the first checkpoint loses everything: that alone is no budget matter
    assert judge(_records((FC.NATIVE_CRASH, "9", None, 0, 900, 900)), budget, "9").ok
    records = _records((FC.NATIVE_CRASH, "9", None, 0, 900, 900), (FC.NATIVE_CRASH, "9", None, 0, 950, 950),
                       (FC.NATIVE_CRASH, "9", None, 0, 990, 990))
    verdict = judge(records, budget, "9")
    assert (verdict.ok, verdict.budget) == (False, "max_steps_lost_fraction")
    assert verdict.numbers["steps_lost_fraction"] == pytest.approx(2840 / 990, rel=1e-3)


def test_crash_loop_with_too_little_progress_between_crashes():
    budget = NO_LIMITS.__class__(**{**NO_LIMITS.__dict__, "min_progress_between_crashes": 50})
    records = _records((FC.NATIVE_CRASH, "9", None, 0, 1000, 10), (FC.ILLEGAL_MEMORY_ACCESS, "9", None, 990, 1020, 20))
    verdict = judge(records, budget, "9")
    assert (verdict.ok, verdict.budget, verdict.numbers["last_attempt_progress"]) == \
        (False, "min_progress_between_crashes", 30)
    # a preemption in between is not a crash: no loop
    records = _records((FC.PREEMPTED, "9", None, 0, 1000, 0), (FC.NATIVE_CRASH, "9", None, 990, 1020, 20))
    assert judge(records, budget, "9").ok


def test_attempt_that_reported_no_step_made_no_progress_when_the_run_reports_steps():
    budget = NO_LIMITS.__class__(**{**NO_LIMITS.__dict__, "min_progress_between_crashes": 1})
    records = _records((FC.NATIVE_CRASH, "9", None, 0, 100, 0), (FC.NATIVE_CRASH, "9", None, None, None, None))
    assert judge(records, budget, "9").budget == "min_progress_between_crashes"
    # a run whose steps are never seen (zero-code mode, no match): nothing is known, nothing judged
    records = _records((FC.NATIVE_CRASH, "9", None, None, None, None), (FC.NATIVE_CRASH, "9", None, None, None, None))
    assert judge(records, budget, "9").ok


def test_same_failure_at_the_same_step():
    budget = NO_LIMITS.__class__(**{**NO_LIMITS.__dict__, "same_failure_limit": 3})
    records = [AttemptRecord(attempt=i, job_id="9", cls=FC.CUDA_LAUNCH_FAILURE, last_step=s, failure_step=4242)
               for i, s in enumerate((4242, 4242, 4242), 1)]
    verdict = judge(records, budget, "9")
    assert (verdict.ok, verdict.budget, verdict.numbers["same_failure_count"]) == (False, "same_failure_limit", 3)
    assert "4242" in verdict.reason
    assert judge(records[:2], budget, "9").ok


def test_within_budget_says_so_with_numbers():
    records = _records((FC.NATIVE_CRASH, "9", None, 0, 100, 10))
    verdict = judge(records, BudgetConfig(), "9")
    assert verdict.ok and verdict.budget is None and verdict.reason.startswith("within budget")
    assert verdict.numbers["restarts_in_allocation"] == 1
    assert judge([], BudgetConfig(), None).ok


def test_judge_over_the_folded_log():
    budget = BudgetConfig(max_restarts_per_allocation=1, max_total_restarts=None, max_steps_lost_fraction=None,
                          same_failure_limit=None)
    events = attempt(1, 0, steps=(1, 50)) + attempt(2, 100, steps=(1, 60))
    verdict = judge(ledger_from_events(events), budget, "500")
    assert (verdict.ok, verdict.budget) == (False, "max_restarts_per_allocation")


# --------------------------------------------------------------------------------------------- resume audit


@pytest.mark.parametrize("expected, first, path, ok, words", [
    (2000, 2000, "ckpt/step_2000.pt", True, "as expected"),
    (2000, 2001, "ckpt/step_2000.pt", True, "as expected"),  # loops that report the next step to run
    (2000, 0, "ckpt/step_2000.pt", False, "from scratch"),
    (2000, 1, "ckpt/step_2000.pt", False, "from scratch"),
    (2000, 1500, "ckpt/step_2000.pt", False, "at step 1500"),
    (2000, 2600, "ckpt/step_2000.pt", True, "past the resume point"),  # sparse step lines: nothing redone
    (None, 0, None, True, "fresh start"),
    (None, 731, None, True, "fresh start"),
    (2000, None, "ckpt/step_2000.pt", True, "unknown"),
    (None, 0, "ckpt/last.ckpt", True, "unknown"),
])
def test_audit_resume(expected, first, path, ok, words):
    verdict = audit_resume(expected, first, path)
    assert verdict.ok is ok
    assert words in verdict.reason
    if not ok:
        assert str(expected) in verdict.reason and path in verdict.reason


# --------------------------------------------------------------------------------------------- CLI


def _write_run(run_dir: Path, events: list[Event]) -> None:
    """Write the events through the real EventLog (its clock replaced to keep the recorded times)."""
    times = iter([e.ts for e in events])
    log = EventLog(run_dir / "supervisor" / "events.jsonl", clock=lambda: next(times))
    with log:
        for e in events:
            log.emit(e.event, **e.fields)


def test_cli_audit_json(tmp_path):
    events = (attempt(1, 1000, steps=(1, 100, 200, 250), saves=(200,))
              + attempt(2, 2000, resume=("ckpt/step_200.pt", 200), steps=(201, 300), saves=(300,),
                        cls=FC.PREEMPTED, action=Action.REQUEUE))
    _write_run(tmp_path, events)
    result = CliRunner().invoke(main, ["audit", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    a1, a2 = data["attempts"]
    assert (a1["attempt"], a1["resume_step"], a1["first_step"], a1["last_step"], a1["steps_lost"], a1["class"],
            a1["action"]) == (1, None, 1, 250, 50, "native_crash", "restart")
    assert (a2["resume_step"], a2["first_step"], a2["steps_lost"], a2["class"], a2["action"]) == \
        (200, 201, 0, "preempted", "requeue")
    assert a2["resume_audit"]["ok"] is True
    assert data["verdict"]["ok"] is True and data["verdict"]["budget"] is None


def test_cli_audit_table_and_a_failed_resume(tmp_path):
    events = (attempt(1, 1000, steps=(1, 100, 200), saves=(200,))
              + attempt(2, 2000, resume=("ckpt/step_200.pt", 200), steps=(0, 50)))
    _write_run(tmp_path, events)
    with open(tmp_path / "supervisor" / "events.jsonl", "a") as fh:
        fh.write('{"ts": 3000, "event": "progr')  # a torn last line, as after a kill
    result = CliRunner().invoke(main, ["audit", str(tmp_path)])
    assert result.exit_code == 1
    assert "attempt" in result.stdout and "native_crash" in result.stdout
    assert "resume audit FAILED for attempt 2" in result.stdout and "from scratch" in result.stdout
    assert "1 line(s)" in result.stderr


def test_cli_audit_exhausted_budget_from_config(tmp_path):
    _write_run(tmp_path, attempt(1, 0, steps=(1, 10)) + attempt(2, 100, steps=(1, 12)))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("budget:\n  max_restarts_per_allocation: 1\n")
    result = CliRunner().invoke(main, ["audit", str(tmp_path), "--config", str(cfg), "--json"])
    assert result.exit_code == 1
    verdict = json.loads(result.stdout)["verdict"]
    assert (verdict["ok"], verdict["budget"]) == (False, "max_restarts_per_allocation")


def test_cli_audit_not_a_run_dir(tmp_path):
    result = CliRunner().invoke(main, ["audit", str(tmp_path)])
    assert result.exit_code == 2 and "not a run directory" in result.output
    result = CliRunner().invoke(main, ["audit", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "not a directory" in result.output
    bad = tmp_path / "cfg.yaml"
    bad.write_text("budget: [1, 2\n")
    _write_run(tmp_path, attempt(1, 0, steps=(1,)))
    result = CliRunner().invoke(main, ["audit", str(tmp_path), "--config", str(bad)])
    assert result.exit_code == 2 and "malformed YAML" in result.output


def test_durable_history_refuses_a_fresh_start_when_every_recorded_checkpoint_is_gone() -> None:
    from supervisor.budget import audit_durable_history

    gone = [(10, "/c/step=10.ckpt", False), (20, "/c/step=20.ckpt", False)]
    verdict = audit_durable_history(gone, None, None)
    assert not verdict.ok and verdict.expected_step == 20 and "not restarting from scratch" in verdict.reason
    # A recorded save still on disk in a format the scanner does not know: the script decides.
    assert audit_durable_history([(10, "/c/model.custom", True)], None, None).ok
    # An older resume point (the newest was torn and quarantined) is allowed, and said.
    older = audit_durable_history(gone, 10, "/c/step=10.ckpt")
    assert older.ok and "older than the newest recorded save" in older.reason
    assert audit_durable_history([], None, None).ok
