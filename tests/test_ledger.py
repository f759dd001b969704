"""One ledger, one verdict (issues #12 and #14): the fold of the event log into attempts agrees with
the resume points, and ``supervise audit``, ``supervise report`` and the run's own ``run_end`` never
disagree. Event logs are built the way the run loop writes them (field for field), written through
the real EventLog where a command reads them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from supervisor.budget import judge, run_verdict, stopped_by
from supervisor.cli import main
from supervisor.config import BudgetConfig
from supervisor.events import Ev, Event, EventLog
from supervisor.ledger import (
    Ledger,
    final_run_end,
    ledger_from_events,
    loss_anomalies,
    records_to_json,
    restarts_from_scratch,
    results_check,
)
from supervisor.addons.report import build_report
from supervisor.addons.report.render import render_text
from supervisor.states import FailureClass as FC

IMA = "torch.AcceleratorError: CUDA error: an illegal memory access was encountered"


class Log:
    """Events in file order with a clock that moves one second per event."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.t = 1_750_000_000.0

    def __call__(self, event: Ev, /, **fields: Any) -> Log:
        self.t += 1
        self.events.append(Event(event.value, self.t, fields))
        return self

    def attempt(self, n: int, resume: int | None, *, job: str = "900", restart_count: int = 0) -> Log:
        path = f"/ck/step={resume}.ckpt" if resume is not None else None
        self(Ev.RESUME_POINT, attempt=n, path=path, step=resume, candidates=[], quarantined=[])
        return self(Ev.ATTEMPT_START, attempt=n, job_id=job, restart_count=restart_count, resume_path=path,
                    resume_step=resume)

    def steps(self, n: int, steps: range, *, saves: tuple[int, ...] = (), source: str = "regex") -> Log:
        for step in steps:
            self(Ev.PROGRESS, attempt=n, step=step, rate=5.0, source=source)
            if step in saves:
                self(Ev.SAVE_END, attempt=n, step=step, path=f"/ck/step={step}.ckpt", bytes=100, duration=0.1,
                     ok=True, source="watch")
        return self

    def crash(self, n: int, cls: FC, last: int, durable: int | None, resume: int | None, *,
              source: str | None = "regex", evidence: str = "Segmentation fault") -> Log:
        lost = last - (durable or 0)
        fields: dict[str, Any] = {"step_source": source} if source else {}
        self(Ev.ATTEMPT_END, attempt=n, exit_code=1, signal=None, duration=60.0, first_step=(resume or 0) + 1,
             last_step=last, last_durable_step=durable, steps_lost=lost, wall_lost=3.0, resume_step=resume,
             resume_path=f"/ck/step={resume}.ckpt" if resume is not None else None, **fields,
             **{"class": cls.value, "action": "restart"})
        return self(Ev.FAILURE, attempt=n, action="restart", evidence=[evidence], context=[], step=last,
                    node="gpu-07", exit_code=1, reason=cls.value, **{"class": cls.value})

    def complete(self, n: int, last: int, resume: int | None) -> Log:
        self(Ev.ATTEMPT_END, attempt=n, exit_code=0, first_step=(resume or 0) + 1, last_step=last,
             last_durable_step=last, steps_lost=0, wall_lost=0.0, resume_step=resume,
             **{"class": "completed", "action": None})
        return self(Ev.RUN_END, outcome="complete", exit_code=0, reason="training complete", attempts=n,
                    last_step=last)

    def write(self, run_dir: Path) -> Path:
        times = iter(e.ts for e in self.events)
        with EventLog(run_dir / "supervisor" / "events.jsonl", clock=lambda: next(times)) as log:
            for e in self.events:
                log.emit(e.event, **e.fields)
        return run_dir


def late_save_run(source: str = "regex") -> Log:
    """Zero-code: ``step=N.ckpt`` saved atomically every 10 steps, a segfault at step 35. The watch saw
    the save of step 30 only at the final rescan, after attempt_end; attempt 2 resumed from 30."""
    log = Log()
    log(Ev.RUN_START, name="zc", job_id="900", restart_count=0)
    log.attempt(1, None).steps(1, range(5, 36, 5), saves=(10, 20), source=source)
    log.crash(1, FC.NATIVE_CRASH, 35, 20, None, source=source)
    log(Ev.SAVE_END, attempt=1, step=30, path="/ck/step=30.ckpt", bytes=100, duration=None, ok=True, source="rescan")
    log(Ev.DECISION, attempt=1, action="restart", reason="native_crash (1st in a row)", delay=2.0)
    log.attempt(2, 30).steps(2, range(35, 101, 5), saves=(40, 50, 60, 70, 80, 90, 100), source=source)
    return log.complete(2, 100, 30)


def audit(run_dir: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["audit", str(run_dir), *args])
    return result.exit_code, result.stdout


def test_the_ledger_applied_event_by_event_is_the_fold_of_the_log_at_every_point():
    # The run loop keeps a Ledger in memory and applies each event as it is written; at every point
    # of the run it must say what a fold of the log so far says (audit, report, resubmit read that).
    events = late_save_run().events
    ledger = Ledger()
    for n, ev in enumerate(events, start=1):
        ledger.apply(ev)
        assert ledger.records() == ledger_from_events(events[:n]), f"after event {n} ({ev.event})"
    assert [e.get("step") for e in ledger.saves][-2:] == [90, 100]


# --------------------------------------------------------------------------------------------- the resume point is the truth


def test_steps_lost_agree_with_the_step_the_next_attempt_resumed_from():
    first, second = ledger_from_events(late_save_run().events)
    assert (first.last_step, first.last_durable_step, second.resume_step) == (35, 30, 30)
    assert first.steps_lost == 5  # not the 15 the attempt_end said (durable 20 at the time)
    assert second.steps_lost == 0 and second.cls == FC.COMPLETED


def test_a_loss_known_only_to_the_last_printed_step_is_a_lower_bound(tmp_path: Path):
    first, _ = ledger_from_events(late_save_run("regex").events)
    assert first.steps_lost == 5 and first.steps_lost_at_least and first.step_source == "regex"
    run_dir = late_save_run("regex").write(tmp_path / "zero-code")
    code, out = audit(run_dir)
    assert code == 0, out
    row = next(line for line in out.splitlines() if line.startswith("1 "))
    assert " ≥5 " in row
    code, out = audit(run_dir, "--json")
    data = json.loads(out)["attempts"][0]
    assert (data["steps_lost"], data["steps_lost_at_least"]) == (5, True)
    text = render_text(build_report(run_dir, check_checkpoints=False))
    assert "steps lost ≥5" in text


def test_a_client_reported_step_is_exact(tmp_path: Path):
    first, _ = ledger_from_events(late_save_run("client").events)
    assert first.steps_lost == 5 and not first.steps_lost_at_least
    code, out = audit(late_save_run("client").write(tmp_path / "client"))
    assert code == 0 and "≥" not in out


def test_without_a_step_source_field_the_progress_events_tell():
    events = [Event(e.event, e.ts, {k: v for k, v in e.fields.items() if k != "step_source"})
              for e in late_save_run("regex").events]
    assert ledger_from_events(events)[0].steps_lost_at_least


def test_the_only_checkpoint_quarantined_and_a_restart_from_zero_counts_every_step_and_is_not_ok(tmp_path: Path):
    log = Log()
    log(Ev.RUN_START, name="single", job_id="900", restart_count=0)
    log.attempt(1, None).steps(1, range(50, 151, 50), saves=(100,), source="client")
    log.crash(1, FC.NATIVE_CRASH, 150, 100, None, source="client")
    log(Ev.DECISION, attempt=1, action="restart", reason="native_crash (1st in a row)", delay=2.0)
    log(Ev.QUARANTINE, attempt=2, path="/ck/step=100.ckpt", dest="/ck/CORRUPT_step=100.ckpt.900", ok=True,
        reason="torn: no zip end record")
    log(Ev.RESUME_POINT, attempt=2, path=None, step=None, candidates=[], quarantined=["/ck/step=100.ckpt"])
    log(Ev.ATTEMPT_START, attempt=2, job_id="900", restart_count=0, resume_path=None, resume_step=None)
    first, second = ledger_from_events(log.events)
    assert second.fresh and first.steps_lost == 150  # everything: attempt 2 starts again from nothing
    assert [(r.attempt, saved, by) for r, saved, by in restarts_from_scratch([first, second])] == [(2, 100, 1)]
    verdict = run_verdict(log.events, BudgetConfig())
    assert not verdict.ok and verdict.budget == "max_restarts_from_scratch" and verdict.source == "judge"
    assert "attempt 2 started from step 0 although attempt 1 had saved step 100" in verdict.reason
    assert "150 steps of attempt 1 lost" in verdict.reason
    # Still so once attempt 2 reports its first steps from scratch.
    log.steps(2, range(1, 30, 10), source="client")
    assert run_verdict(log.events, BudgetConfig()).budget == "max_restarts_from_scratch"
    run_dir = log.write(tmp_path / "single")
    code, out = audit(run_dir)
    assert code == 1 and "EXCEEDED (max_restarts_from_scratch)" in out
    report = build_report(run_dir, check_checkpoints=False)
    assert report.verdict is not None and report.verdict.ok is False
    assert any("max_restarts_from_scratch" in p for p in report.run.problems)


def test_a_child_that_resumed_by_itself_is_no_restart_from_scratch():
    log = Log()
    log.attempt(1, None).steps(1, range(50, 151, 50), saves=(100,), source="client")
    log.crash(1, FC.NATIVE_CRASH, 150, 100, None, source="client")
    log.attempt(2, None)(Ev.RESUMED, attempt=2, step=101)(Ev.PROGRESS, attempt=2, step=120, source="client")
    assert restarts_from_scratch(ledger_from_events(log.events)) == []
    assert judge(ledger_from_events(log.events), BudgetConfig(), "900").ok


def test_a_resume_point_alone_is_no_attempt():
    log = Log()
    log.attempt(1, None).steps(1, range(1, 3))
    log(Ev.RESUME_POINT, attempt=2, path="/ck/step=2.ckpt", step=2)  # then the supervisor stopped
    assert [r.attempt for r in ledger_from_events(log.events)] == [1]


# --------------------------------------------------------------------------------------------- one verdict


def h200_stopped_on_the_4th_crash(reason: str, **end: Any) -> Log:
    """The measured H200 run, as the old policy stopped it: four crashes, each after 100+ steps saved."""
    log = Log()
    log(Ev.RUN_START, name="h200", job_id="900", restart_count=0)
    resume: int | None = None
    for n, (crash, saved) in enumerate(((120, 100), (240, 200), (360, 350), (480, 450)), 1):
        log.attempt(n, resume).steps(n, range((resume or 0) + 10, crash + 1, 10),
                                     saves=tuple(range(50, saved + 1, 50)))
        log.crash(n, FC.ILLEGAL_MEMORY_ACCESS, crash, saved, resume, evidence=IMA)
        resume = saved
    log(Ev.DECISION, attempt=4, action="stop", reason=reason, delay=0)
    return log(Ev.RUN_END, outcome="stopped", exit_code=1, reason=reason, attempts=4, last_step=480, **end)


OLD_STOP = f"illegal_memory_access 4 times in a row; policy allows 3 restarts: {IMA}"


def test_run_verdict_of_a_stopped_run_is_the_stop_not_the_budget():
    log = h200_stopped_on_the_4th_crash(OLD_STOP)
    assert judge(ledger_from_events(log.events), BudgetConfig(), "900").ok  # the budgets alone: fine
    verdict = run_verdict(log.events, BudgetConfig())
    assert (verdict.ok, verdict.source, verdict.outcome) == (False, "run_end", "stopped")
    assert verdict.budget == "policy.illegal_memory_access.retries" and verdict.reason == OLD_STOP
    assert verdict.numbers["total_restarts"] == 4  # the ledger's numbers still come with it


def test_run_verdict_reads_stopped_by_when_the_loop_writes_it():
    log = h200_stopped_on_the_4th_crash("budget max_total_restarts exhausted: 4 crashes across the run; at most 3",
                                        stopped_by="max_total_restarts")
    verdict = run_verdict(log.events, BudgetConfig())
    assert (verdict.ok, verdict.budget, verdict.reason) == \
        (False, "max_total_restarts", "4 crashes across the run; at most 3")
    assert stopped_by({"reason": "resume audit failed: started at 0", "stopped_by": "resume_audit"}) == \
        ("resume_audit", "resume audit failed: started at 0")
    assert stopped_by({"reason": "budget same_failure_limit exhausted: crash loop"}) == \
        ("same_failure_limit", "crash loop")
    assert stopped_by({"reason": "device_assert: policy says stop, a person must act"})[0] == \
        "policy.device_assert.action"
    assert stopped_by({})[0] is None


def test_audit_and_report_show_the_stop_and_exit_1(tmp_path: Path):
    run_dir = h200_stopped_on_the_4th_crash(OLD_STOP).write(tmp_path / "h200")
    code, out = audit(run_dir)
    assert code == 1
    assert "verdict: STOPPED (policy.illegal_memory_access.retries): illegal_memory_access 4 times" in out
    assert "budget: ok" not in out
    data = json.loads(audit(run_dir, "--json")[1])
    assert (data["verdict"]["ok"], data["verdict"]["budget"], data["verdict"]["source"]) == \
        (False, "policy.illegal_memory_access.retries", "run_end")
    report = build_report(run_dir, check_checkpoints=False)
    assert report.verdict is not None and report.verdict.ok is False
    assert report.verdict.budget == "policy.illegal_memory_access.retries"
    text = render_text(report)
    assert "STOPPED (policy.illegal_memory_access.retries)" in text and "\nok" not in text
    assert [p for p in report.run.problems if p.startswith("run stopped")] == [f"run stopped: {OLD_STOP}"]
    result = CliRunner().invoke(main, ["report", str(run_dir), "--no-checkpoints"])
    assert result.exit_code == 1


def test_a_requeued_run_that_went_on_is_judged_not_stopped():
    log = Log()
    log.attempt(1, None).steps(1, range(10, 51, 10), saves=(50,))
    log(Ev.ATTEMPT_END, attempt=1, last_step=50, last_durable_step=50, **{"class": "preempted", "action": "requeue"})
    log(Ev.RUN_END, outcome="requeue", exit_code=75, reason="preempted")
    assert final_run_end(log.events) is not None and run_verdict(log.events, BudgetConfig()).outcome == "requeue"
    log(Ev.RUN_START, job_id="900", restart_count=1).attempt(2, 50, restart_count=1)
    assert final_run_end(log.events) is None
    verdict = run_verdict(log.events, BudgetConfig())
    assert verdict.ok and verdict.source == "judge" and verdict.outcome is None


def test_a_completed_run_is_ok_within_its_budgets_and_not_ok_past_one():
    """The verdict and the numbers beside it agree: a run that completed after costing more than a
    budget allows is "complete, but budget ... exceeded", not ok (audit and report exit 1)."""
    verdict = run_verdict(late_save_run().events, BudgetConfig())
    assert verdict.ok and verdict.reason.startswith("training complete; within budget")
    verdict = run_verdict(late_save_run().events, BudgetConfig(max_total_restarts=0))
    assert not verdict.ok and verdict.budget == "max_total_restarts" and verdict.outcome == "complete"
    assert verdict.reason.startswith("training complete, but budget max_total_restarts exceeded: 1 crashes")


# --------------------------------------------------------------------------------------------- results that need a check


def h200_completed() -> Log:
    log = Log()
    resume: int | None = None
    for n, (crash, saved) in enumerate(((120, 100), (240, 200), (360, 350), (480, 450), (600, 550)), 1):
        log.attempt(n, resume).steps(n, range((resume or 0) + 10, crash + 1, 10),
                                     saves=tuple(range(50, saved + 1, 50)))
        log.crash(n, FC.ILLEGAL_MEMORY_ACCESS, crash, saved, resume, evidence=IMA)
        resume = saved
    log.attempt(6, 550).steps(6, range(560, 701, 10), saves=(600, 650, 700))
    return log.complete(6, 700, 550)


def test_results_check_lists_memory_errors_and_the_crash_free_steps_since():
    records = ledger_from_events(h200_completed().events)
    check = results_check(records, [], 15000)
    assert check is not None and not check.settled
    assert [(e.attempt, e.what, e.step) for e in check.events] == \
        [(n, "illegal_memory_access", s) for n, s in zip(range(1, 6), (120, 240, 360, 480, 600))]
    assert check.crash_free_steps == 100 and check.crash_free_needed == 15000
    assert check.events[0].evidence == IMA
    assert "results need a check" in check.reason and "100 crash-free steps" in check.reason
    settled = results_check(records, [], 100)
    assert settled is not None and settled.settled


def test_results_check_includes_loss_anomalies_and_skips_plain_crashes():
    log = late_save_run()
    assert results_check(ledger_from_events(log.events), loss_anomalies(log.events), 15000) is None
    log(Ev.LOSS_ANOMALY, attempt=2, step=60, loss=float("nan"), median=2.0, kind="nan")
    check = results_check(ledger_from_events(log.events), loss_anomalies(log.events), 15000)
    assert check is not None and [(e.attempt, e.what, e.step) for e in check.events] == \
        [(2, "loss_anomaly (nan)", 60)]
    assert check.crash_free_steps == 40


@pytest.mark.parametrize("cls", [FC.CUDA_LAUNCH_FAILURE, FC.DEVICE_ASSERT, FC.HARDWARE_FAULT])
def test_device_side_errors_need_a_check_too(cls: FC):
    log = Log()
    log.attempt(1, None).steps(1, range(10, 31, 10), saves=(20,))
    log.crash(1, cls, 30, 20, None, evidence=f"{cls.value} evidence")
    check = results_check(ledger_from_events(log.events), [], 15000)
    assert check is not None and check.events[0].what == cls.value and check.crash_free_steps == 0


def test_audit_and_report_mark_results_that_need_a_check(tmp_path: Path):
    run_dir = h200_completed().write(tmp_path / "h200")
    code, out = audit(run_dir)
    assert code == 0  # the run completed within its budgets
    assert "results need a check: illegal_memory_access at steps 120, 240, 360, 480, 600 (attempts 1, 2, 3, 4, 5)" \
        in out
    data = json.loads(audit(run_dir, "--json")[1])
    assert data["results_check"]["crash_free_steps"] == 100 and len(data["results_check"]["events"]) == 5
    report = build_report(run_dir, check_checkpoints=False)
    assert report.run.results_check is not None
    assert any(p.startswith("results need a check") for p in report.run.problems)
    assert report.to_json()["run"]["results_check"]["settled"] is False
    text = render_text(report)
    assert "Results need a check" in text and "100 crash-free steps since the last of these" in text


def test_records_to_json_carries_the_lower_bound_flag():
    (first, _) = ledger_from_events(late_save_run().events)
    data = records_to_json([first])[0]
    assert data["steps_lost"] == 5 and data["steps_lost_at_least"] is True and data["class"] == "native_crash"
