"""The verdict and the numbers beside it agree (issue 21): a run that lost more than its budget
allows is never "ok", and supervise's exit code is never the child's. Plain data: events in, the
real ledger, budget and judge functions."""

from __future__ import annotations

from supervisor.budget import judge, run_verdict
from supervisor.config import BudgetConfig
from supervisor.errors import ExitCode
from supervisor.events import Ev, Event
from supervisor.failures import Failure
from supervisor.ledger import ledger_from_events
from supervisor.policy import DEFAULT_POLICY
from supervisor.run.judge import AttemptFacts, judge_attempt
from supervisor.states import FailureClass as FC, RunOutcome


def _in_place_run_restarted_from_scratch() -> list[Event]:
    """The issue's GPT script: one ``out/ckpt.pt`` rewritten in place, its step unknown to the
    supervisor, no way to tell the script to resume: each crash starts it over from step 0."""
    ev: list[Event] = [Event(Ev.RUN_START.value, 0.0, {"job_id": None})]
    t = 1.0
    for n, (resume, last, cls) in enumerate([(None, 100, "native_crash"), ("out/ckpt.pt", 95, "native_crash"),
                                             ("out/ckpt.pt", 200, "completed")], start=1):
        ev.append(Event(Ev.ATTEMPT_START.value, t, {"attempt": n, "resume_path": resume, "resume_step": None}))
        for step in range(0, last + 1, 10):
            ev.append(Event(Ev.PROGRESS.value, t + step, {"attempt": n, "step": step, "source": "regex"}))
            if step and step % 50 == 0:
                ev.append(Event(Ev.SAVE_END.value, t + step, {"attempt": n, "step": None, "path": "out/ckpt.pt",
                                                             "ok": True, "source": "watch"}))
        t += last + 1
        lost = 0 if cls == "completed" else last
        ev.append(Event(Ev.ATTEMPT_END.value, t, {"attempt": n, "class": cls, "first_step": 0, "last_step": last,
                                                  "steps_lost": lost, "step_source": "regex"}))
    ev.append(Event(Ev.RUN_END.value, t, {"outcome": "complete", "exit_code": 0, "reason": "training complete"}))
    return ev


def test_a_completed_run_that_lost_most_of_its_progress_is_not_ok():
    events = _in_place_run_restarted_from_scratch()
    verdict = run_verdict(events, BudgetConfig())
    assert not verdict.ok and verdict.budget == "max_steps_lost_fraction"
    assert verdict.reason.startswith("training complete, but budget max_steps_lost_fraction exceeded: ≥195 steps "
                                     "lost for 200 steps of progress (98%); at most 50%")


def test_while_running_a_fraction_past_its_max_is_never_called_within_budget_without_saying_so():
    records = ledger_from_events(_in_place_run_restarted_from_scratch()[:-2])  # before the last attempt_end
    verdict = judge(records, BudgetConfig(), None)
    assert verdict.ok  # two losses are no pattern yet: the class retries judge them
    assert "(over the max 50%: judged once 3 crashes lost steps, or when the run completes; 2 so far)" in \
        verdict.reason


def test_the_run_loop_says_complete_but_over_budget_and_still_exits_0():
    records = ledger_from_events(_in_place_run_restarted_from_scratch())
    done = Failure(cls=FC.COMPLETED, exit_code=0)
    verdict = judge_attempt(done, AttemptFacts(), records[:-1], records, DEFAULT_POLICY, BudgetConfig(), None, 0)
    assert verdict.outcome is RunOutcome.COMPLETE and verdict.exit_code == ExitCode.OK
    assert verdict.budget is not None and not verdict.budget.ok and verdict.budget.budget == "max_steps_lost_fraction"
    assert verdict.reason.startswith("training complete, but budget max_steps_lost_fraction exceeded")


def _stop_class_failure(cls: FC, exit_code: int | None, signal: int | None) -> Failure:
    return Failure(cls=cls, evidence=("x",), exit_code=exit_code, signal=signal)


def test_a_policy_stop_exits_4_whatever_the_child_exited_and_names_the_childs_status():
    for code in (2, 3, 4, 75, 1, 0):
        failure = _stop_class_failure(FC.PYTHON_EXCEPTION, code, None)
        verdict = judge_attempt(failure, AttemptFacts(), [], [], DEFAULT_POLICY, BudgetConfig(), None, code)
        assert verdict.outcome is RunOutcome.STOPPED and verdict.exit_code == ExitCode.STOPPED
        assert verdict.reason.endswith(f"(the child exited {code})")
    crash = _stop_class_failure(FC.NATIVE_CRASH, None, 11)
    history = ledger_from_events([Event(Ev.ATTEMPT_START.value, float(i), {"attempt": i}) for i in (1, 2, 3, 4)]
                                 + [Event(Ev.ATTEMPT_END.value, 9.0, {"attempt": i, "class": "native_crash"})
                                    for i in (1, 2, 3, 4)])
    verdict = judge_attempt(crash, AttemptFacts(), history[:-1], history, DEFAULT_POLICY,
                            BudgetConfig(same_failure_limit=None), None, 139)
    assert verdict.stopped_by == "policy.native_crash.retries" and verdict.exit_code == ExitCode.STOPPED
    assert "(the child was killed by SIGSEGV)" in verdict.reason
