"""Stop notices, deadlines, save arbitration and the requeue decision (supervisor.preemption).

Pure functions, so every test states its numbers. Job records are parsed from ``scontrol show job -o``
lines shaped like the ones Slurm 22.05.8 printed during the grace window on our test cluster
(PreemptTime=13:28:57, EndTime=13:29:17 with GraceTime=20).
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from supervisor.events import Ev, EventLog, read_events
from supervisor.preemption import (
    Estimate,
    InFlightSave,
    Notice,
    SaveHistory,
    SaveSample,
    after_block,
    arbitrate,
    deadline_for,
    decide_requeue,
    notice_for,
)
from supervisor.slurm.parse import parse_scontrol_job
from supervisor.states import FailureClass, SaveDecision

D = SaveDecision


def _stamp(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch))


def scontrol_line(*, start: float, end: float, preempt: float | None, state: str = "RUNNING",
                  requeue: int = 1, partition: str = "extra") -> str:
    """One ``scontrol show job -o`` line in 22.05.8's field order (times in local time, as Slurm prints)."""
    pt = _stamp(preempt) if preempt is not None else "None"
    return (
        f"JobId=12 JobName=train UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=1 Nice=0 "
        f"Account=(null) QOS=normal JobState={state} Reason=None Dependency=(null) Requeue={requeue} "
        f"Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:41 TimeLimit=01:00:00 TimeMin=N/A "
        f"SubmitTime={_stamp(start - 6)} EligibleTime={_stamp(start - 6)} AccrueTime={_stamp(start - 6)} "
        f"StartTime={_stamp(start)} EndTime={_stamp(end)} Deadline=N/A PreemptEligibleTime={_stamp(start)} "
        f"PreemptTime={pt} SuspendTime=None SecsPreSuspend=0 LastSchedEval={_stamp(start)} Scheduler=Main "
        f"Partition={partition} AllocNode:Sid=host:4242 ReqNodeList=(null) ExcNodeList=(null) NodeList=n1 "
        f"BatchHost=n1 NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* "
        f"TRES=cpu=1,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 "
        f"MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK "
        f"Contiguous=0 Licenses=(null) Network=(null) Command=/work/job.sh WorkDir=/work "
        f"StdErr=/work/train-12.out StdIn=/dev/null StdOut=/work/train-12.out Power="
    )


T0 = float(int(time.time()) // 60 * 60)  # a whole minute: Slurm prints whole seconds


def history(*durations: float, nbytes: int | None = None, unknown: float = 60.0) -> SaveHistory:
    return SaveHistory([SaveSample(d, nbytes) for d in durations], unknown_save_s=unknown)


SEVEN = (1.5, 1.8, 2.0, 1.7, 1.9, 1.6, 2.0)  # p90 = 2.0


# ------------------------------------------------------------------------------------ deadlines


def test_deadline_in_grace_is_slurm_end_time() -> None:
    job = parse_scontrol_job(scontrol_line(start=T0 - 41, end=T0 + 20, preempt=T0))
    d = deadline_for(T0 + 0.4, job, 30.0, signal_name="TERM", time_limit_warning=None)
    assert d.at == T0 + 20 and d.source == "slurm_end_time" and not d.past
    assert "20 s grace" in d.reason and "19.6 s after SIGTERM" in d.reason


def test_deadline_already_past_stops_now_and_says_so() -> None:
    job = parse_scontrol_job(scontrol_line(start=T0 - 41, end=T0 + 20, preempt=T0))
    d = deadline_for(T0 + 25, job, 30.0, signal_name="TERM")
    assert d.at == T0 + 25 and d.past
    assert "already passed 5.0 s" in d.reason


def test_running_job_without_preempt_time_uses_default_grace() -> None:
    # A SIGTERM with EndTime an hour away: scancel or a stray signal, not the end of the job.
    job = parse_scontrol_job(scontrol_line(start=T0, end=T0 + 3600, preempt=None))
    d = deadline_for(T0 + 10, job, 30.0, signal_name="TERM")
    assert d.at == T0 + 40 and d.source == "default_grace"
    assert "too far" in d.reason


def test_a_record_that_does_not_show_the_preemption_yet_is_planned_with_the_configured_grace() -> None:
    # SIGTERM can reach the step before the job record shows PreemptTime (seconds on a busy
    # controller): the partition's GraceTime read at start plans it, when shorter than the default.
    from supervisor.slurm.grace import ClusterGrace

    stale = parse_scontrol_job(scontrol_line(start=T0, end=T0 + 3600, preempt=None))
    four = ClusterGrace(4.0, "partition extra GraceTime")
    d = deadline_for(T0 + 10, stale, 30.0, signal_name="TERM", cluster_grace=four)
    assert d.at == T0 + 14 and d.source == "cluster_grace" and "partition extra GraceTime of 4 s" in d.reason
    assert deadline_for(T0 + 10, None, 30.0, signal_name="TERM", cluster_grace=four).at == T0 + 14  # no record
    longer = ClusterGrace(600.0, "QOS scavenger GraceTime")  # never later than the default: the signal may be scancel's
    assert deadline_for(T0 + 10, stale, 30.0, signal_name="TERM", cluster_grace=longer).source == "default_grace"
    shown = parse_scontrol_job(scontrol_line(start=T0 - 41, end=T0 + 20, preempt=T0))
    assert deadline_for(T0 + 1, shown, 30.0, signal_name="TERM", cluster_grace=four).at == T0 + 20  # the record wins
    warned = parse_scontrol_job(scontrol_line(start=T0 - 3000, end=T0 + 340, preempt=None))
    notice, d = notice_for("signal", T0, warned, 30.0, signal_name="USR1", time_limit_signal="USR1",
                           cluster_grace=four)
    assert notice.source == "time_limit" and d.at == T0 + 340  # a time limit is not a preemption
    ended = parse_scontrol_job(scontrol_line(start=T0 - 3600, end=T0 - 1, preempt=None))  # the limit itself
    notice, d = notice_for("signal", T0, ended, 30.0, signal_name="TERM", cluster_grace=four)
    assert notice.source == "time_limit" and d.source == "default_grace"  # KillWait, not a preemption's grace


def test_time_limit_warning_plans_for_end_time() -> None:
    # --signal=B:USR1@300 may come up to 60 s early: EndTime 340 s away is still this warning's end.
    job = parse_scontrol_job(scontrol_line(start=T0 - 3000, end=T0 + 340, preempt=None))
    d = deadline_for(T0, job, 30.0, signal_name="USR1", time_limit_warning=300)
    assert d.at == T0 + 340 and d.source == "slurm_end_time"
    assert "time-limit warning" in d.reason


def test_time_limit_warning_without_slurm_uses_the_warning_time() -> None:
    d = deadline_for(1000.0, None, 30.0, signal_name="USR1", time_limit_warning=300)
    assert d.at == 1300.0 and d.source == "time_limit_warning"


def test_close_end_time_is_used_without_preempt_time() -> None:
    job = SimpleNamespace(preempt_time=None, end_time=1045.0)
    d = deadline_for(1000.0, job, 30.0, signal_name="TERM")
    assert d.at == 1045.0 and d.source == "slurm_end_time"


@pytest.mark.parametrize("job,why", [
    (None, "no Slurm job record"),
    (SimpleNamespace(preempt_time=None, end_time=None), "neither PreemptTime nor EndTime"),
    (SimpleNamespace(preempt_time=None, end_time=990.0), "time limit itself"),
    (SimpleNamespace(preempt_time=950.0, end_time=None), "no EndTime"),
])
def test_default_grace_when_slurm_tells_nothing_usable(job, why) -> None:
    d = deadline_for(1000.0, job, 30.0, signal_name="TERM")
    assert d.at == 1030.0 and d.source == "default_grace" and why in d.reason


def test_notice_for_tells_preemption_time_limit_and_cancel_apart() -> None:
    grace = parse_scontrol_job(scontrol_line(start=T0 - 41, end=T0 + 20, preempt=T0))
    # With preempt_send_user_signal, USR1 is also what preemption sends: PreemptTime decides.
    n, d = notice_for("signal", T0 + 1, grace, 30.0, signal_name="SIGUSR1", time_limit_signal="USR1",
                      time_limit_warning=120)
    assert n.failure_class is FailureClass.PREEMPTED and n.grace == 20 and d.at == T0 + 20

    running = parse_scontrol_job(scontrol_line(start=T0 - 3000, end=T0 + 150, preempt=None))
    n, d = notice_for("signal", T0, running, 30.0, signal_name="USR1", time_limit_signal="USR1",
                      time_limit_warning=120)
    assert n.source == "time_limit" and n.failure_class is FailureClass.TIME_LIMIT and d.at == T0 + 150

    at_limit = parse_scontrol_job(scontrol_line(start=T0 - 3600, end=T0, preempt=None))
    n, _ = notice_for("signal", T0 + 3, at_limit, 30.0, signal_name="TERM", time_limit_signal="USR1")
    assert n.failure_class is FailureClass.TIME_LIMIT

    cancelled = parse_scontrol_job(scontrol_line(start=T0 - 60, end=T0 + 3600, preempt=None,
                                                 state="CANCELLED"))
    n, _ = notice_for("signal", T0, cancelled, 30.0, signal_name="TERM")
    assert n.failure_class is FailureClass.CANCELLED


# ------------------------------------------------------------------------------------ history


def test_history_from_a_real_event_log_counts_only_good_measured_saves(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    with EventLog(path) as log:
        for d in (2.0, 3.0, 4.0):
            log.emit(Ev.SAVE_END, attempt=1, step=100, path="c.pt", bytes=1_000_000, duration=d, ok=True)
        log.emit(Ev.SAVE_END, attempt=1, step=200, path="c.pt", bytes=None, duration=90.0, ok=False)
        log.emit(Ev.SAVE_END, attempt=1, step=300, path="c.pt", bytes=5, duration=0.0, ok=True)  # unmeasured
        log.emit(Ev.SAVE_END, attempt=1, step=400, path="c.pt", duration=None, ok=True)
        log.emit(Ev.SAVE_BEGIN, attempt=1, step=500, path="c.pt")
    with open(path, "a") as fh:
        fh.write('{"ts": 1, "event": "save_end", "duration": 7')  # torn last line of a killed supervisor
    hist = SaveHistory.from_events(read_events(path).events)
    est = hist.expected_duration()
    assert (est.seconds, est.basis, est.samples, est.guess) == (4.0, "max of 3 saves", 3, False)


def test_p90_needs_five_saves_and_only_the_recent_window_counts() -> None:
    assert history(*SEVEN).expected_duration().seconds == 2.0
    assert history(*SEVEN).expected_duration().basis == "p90 of 7 saves"
    # One slow outlier among 20: the p90 ignores it, the max below five would not.
    twenty = (1.0,) * 19 + (30.0,)
    assert history(*twenty).expected_duration().seconds == 1.0
    old_slow = SaveHistory([SaveSample(50.0, None)] + [SaveSample(1.0, None)] * 20, window=20)
    assert old_slow.expected_duration().seconds == 1.0  # the model changed: the old slow save is out


def test_no_history_is_a_guess_that_says_so() -> None:
    est = SaveHistory(unknown_save_s=45.0).expected_duration()
    assert est.seconds == 45.0 and est.guess and "guess" in est.basis and est.samples == 0


def test_bigger_save_is_expected_to_take_longer() -> None:
    hist = history(*(2.0,) * 6, nbytes=1_000_000_000)  # 500 MB/s
    est = hist.expected_duration(bytes=3_000_000_000)
    assert est.seconds == pytest.approx(6.0) and "3.0 GB" in est.basis


def test_remaining_of_a_save_in_flight() -> None:
    hist = history(*(10.0,) * 10, nbytes=1_000_000_000)
    # 8 s in, 20 % written: the rate says 32 s more, history 2 s; blended by progress: 0.2*32 + 0.8*2.
    slow = InFlightSave("c.pt", 1200, started_at=100.0, bytes_so_far=200_000_000, source="watch")
    assert hist.expected_remaining(slow, now=108.0).seconds == pytest.approx(8.0)
    # 12 s in (past the history's 10 s), 60 % written: only the rate is left to trust.
    late = InFlightSave("c.pt", 1200, started_at=100.0, bytes_so_far=600_000_000, source="watch")
    assert hist.expected_remaining(late, now=112.0).seconds == pytest.approx(8.0)
    # No byte count: total minus elapsed, and an overrun expects as long again.
    client = InFlightSave("c.pt", 1200, started_at=100.0)
    assert hist.expected_remaining(client, now=103.0).seconds == pytest.approx(7.0)
    assert hist.expected_remaining(client, now=115.0).seconds == pytest.approx(10.0)
    assert "overrunning" in hist.expected_remaining(client, now=115.0).basis


# ------------------------------------------------------------------------------------ arbitration


def _arb(now, deadline, in_flight, hist, *, margin=3.0, emergency=True, client=True, zero_code=False, **kw):
    return arbitrate(now, deadline, margin, in_flight, hist, emergency_save_allowed=emergency,
                     client_connected=client, zero_code=zero_code, **kw)


def test_block_when_the_save_in_flight_fits() -> None:
    save = InFlightSave("ckpt/step=1200.ckpt", 1200, started_at=1000.0)
    a = _arb(1000.9, 1018.9, save, history(*SEVEN))  # 0.9 s in of an expected 2.0 s
    assert a.decision is D.BLOCK
    assert a.reason.startswith("save of step=1200 in flight for 0.9 s; expected 1.1 s more (p90 of 7 saves")
    assert "deadline in 18.0 s - margin 3.0 s" in a.reason
    assert a.budget_s == pytest.approx(15.0) and a.expected_s == pytest.approx(1.1)
    assert a.to_event()["decision"] == "block" and a.to_event()["save_in_flight"] == "ckpt/step=1200.ckpt"


def test_finishing_exactly_at_deadline_minus_margin_counts_as_in_time() -> None:
    hist = history(5.0, 5.0, 5.0, 5.0, 5.0)
    save = InFlightSave("c.pt", 7, started_at=999.0)  # 1 s in: 4 s more
    assert _arb(1000.0, 1007.0, save, hist).decision is D.BLOCK  # budget 4.0 == 4.0
    assert _arb(1000.0, 1006.999, save, hist).decision is D.ABORT


@pytest.mark.parametrize("zero_code,how", [(False, "tell the writer to abort"),
                                           (True, "kill the child and quarantine the partial file")])
def test_abort_when_the_save_cannot_finish(zero_code, how) -> None:
    save = InFlightSave("c.pt", 7, started_at=1000.0)
    a = _arb(1001.0, 1010.0, save, history(20.0, 22.0, 25.0), zero_code=zero_code, client=not zero_code)
    assert a.decision is D.ABORT and how in a.reason and "cannot finish in 6.0 s" in a.reason


def test_abort_when_the_deadline_has_passed() -> None:
    save = InFlightSave("c.pt", 7, started_at=999.0)
    a = _arb(1000.0, 1000.0, save, history(0.5))
    assert a.decision is D.ABORT and "already passed" in a.reason


def test_slow_writer_seen_through_its_bytes_is_aborted() -> None:
    hist = history(*(10.0,) * 10, nbytes=1_000_000_000)
    blind = InFlightSave("c.pt", None, started_at=100.0)
    seen = InFlightSave("c.pt", None, started_at=100.0, bytes_so_far=200_000_000, source="watch")
    assert _arb(108.0, 116.0, blind, hist, zero_code=True, client=False).decision is D.BLOCK  # 2 s vs 5 s
    a = _arb(108.0, 116.0, seen, hist, zero_code=True, client=False)  # 8 s vs 5 s
    assert a.decision is D.ABORT and "20% of a typical 1.0 GB" in a.reason


def test_in_flight_without_history_blocks_up_to_the_hard_line() -> None:
    save = InFlightSave("c.pt", 3, started_at=1000.0)
    a = _arb(1001.0, 1021.0, save, SaveHistory(unknown_save_s=60.0))
    assert a.decision is D.BLOCK and a.guess and "abort at deadline - margin" in a.reason


def test_emergency_save_when_one_fits() -> None:
    a = _arb(1000.0, 1020.0, None, history(*SEVEN))
    assert a.decision is D.EMERGENCY_SAVE and a.expected_s == 2.0
    assert "deadline in 20.0 s - margin 3.0 s -> emergency save" in a.reason


@pytest.mark.parametrize("kwargs,why", [
    (dict(emergency=False), "emergency saves are off"),
    (dict(client=False), "no client connected"),
    (dict(client=False, zero_code=True), "zero-code"),
    (dict(steps_since_save=0), "nothing to save"),
    (dict(step_time_s=16.0), "does not fit in 17.0 s"),
])
def test_stop_now_when_no_emergency_save_is_possible(kwargs, why) -> None:
    a = _arb(1000.0, 1020.0, None, history(*SEVEN), **kwargs)
    assert a.decision is D.STOP_NOW and why in a.reason


def test_no_history_guess_decides_the_emergency_save_and_says_so() -> None:
    hist = SaveHistory(unknown_save_s=60.0)
    short = _arb(1000.0, 1030.0, None, hist)
    assert short.decision is D.STOP_NOW and "guess" in short.reason
    long = _arb(1000.0, 1120.0, None, hist)
    assert long.decision is D.EMERGENCY_SAVE and "the estimate is a guess" in long.reason


def test_stop_now_when_the_deadline_has_passed() -> None:
    a = _arb(1000.0, 999.0, None, history(*SEVEN))
    assert a.decision is D.STOP_NOW and "already passed" in a.reason


# ------------------------------------------------------------------------------------ while blocking


def test_after_block_keeps_blocking_while_there_is_room() -> None:
    check = after_block(1005.0, 1020.0, 3.0, 1000.0, Estimate(2.0, "p90 of 7 saves", 7))
    assert check.decision is D.BLOCK and check.keep_blocking


def test_after_block_aborts_an_overrunning_save_before_the_line() -> None:
    hist = history(*(10.0,) * 10, nbytes=1_000_000_000)
    save = InFlightSave("c.pt", 9, started_at=100.0, bytes_so_far=600_000_000, source="watch")
    check = after_block(112.0, 120.0, 3.0, save.started_at, hist.expected_remaining(save, 112.0), in_flight=save)
    assert check.decision is D.ABORT and "overruns: 8.0 s more" in check.reason and "5.0 s left" in check.reason


@pytest.mark.parametrize("expected", [None, Estimate(60.0, "guess: no save history", 0, guess=True)])
def test_after_block_without_a_real_estimate_waits_until_deadline_minus_margin(expected) -> None:
    assert after_block(1016.9, 1020.0, 3.0, 1000.0, expected).decision is D.BLOCK
    check = after_block(1017.0, 1020.0, 3.0, 1000.0, expected)
    assert check.decision is D.ABORT and "still running at deadline - margin" in check.reason


# ------------------------------------------------------------------------------------ requeue


def _rq(**kw):
    base = dict(child_outcome=FailureClass.PREEMPTED, in_slurm=True, job_requeueable=True,
                slurm_version=(22, 5, 8), notice=None, already_requeued=False, policy="auto",
                requeue_on_time_limit=True, exclude_nodes=())
    base.update(kw)
    return decide_requeue(**base)


def _notice(source="signal", preempt_time=100.0):
    return Notice(source=source, signal="TERM", received_at=101.0, deadline=120.0,
                  preempt_time=preempt_time, grace=20.0)


def test_grace_exit_is_requeued_explicitly_before_24_05() -> None:
    for version in ((22, 5, 8), (23, 2, 7), (23, 11, 10), "slurm-wlm 22.05.8"):
        r = _rq(slurm_version=version, notice=_notice())
        assert (r.do, r.how) == (True, "scontrol"), version
    assert "finishes a job that exits during its grace" in _rq(slurm_version="slurm 22.05.8").reason


def test_24_05_requeues_a_grace_exit_by_itself() -> None:
    r = _rq(slurm_version=(24, 5, 1), notice=_notice())
    assert (r.do, r.how) == (True, "slurm_will") and "MaxBatchRequeue" in r.reason
    assert _rq(slurm_version="24.11.0", notice=_notice()).how == "slurm_will"
    # ... but not when we cannot be sure, or when asked to be explicit.
    assert _rq(slurm_version=(24, 5, 1), job_requeueable=None).how == "scontrol"
    assert _rq(slurm_version=(24, 5, 1), policy="always").how == "scontrol"
    assert _rq(slurm_version=None).how == "scontrol"


def test_time_limit_is_always_requeued_explicitly() -> None:
    r = _rq(child_outcome=FailureClass.TIME_LIMIT, slurm_version=(24, 11, 0))
    assert (r.do, r.how) == (True, "scontrol") and "never requeues" in r.reason
    by_notice = _rq(child_outcome=FailureClass.NATIVE_CRASH, slurm_version=(24, 11, 0),
                    notice=_notice(source="time_limit", preempt_time=None))
    assert by_notice.how == "scontrol" and "time limit" in by_notice.reason
    off = _rq(child_outcome=FailureClass.TIME_LIMIT, requeue_on_time_limit=False)
    assert (off.do, off.how) == (False, "none")


@pytest.mark.parametrize("kw,why", [
    (dict(child_outcome=FailureClass.COMPLETED, notice=_notice()), "training is complete"),
    (dict(child_outcome="completed"), "training is complete"),
    (dict(already_requeued=True), "already requeued"),
    (dict(job_state="PENDING"), "already requeued (state PENDING)"),
    (dict(job_state="REQUEUED"), "never twice"),
    (dict(in_slurm=False), "not a Slurm job"),
    (dict(policy="never"), "preemption.requeue=never"),
    (dict(child_outcome=FailureClass.CANCELLED), "cancelled by a person"),
])
def test_no_requeue(kw, why) -> None:
    r = _rq(**kw)
    assert (r.do, r.how) == (False, "none") and why in r.reason


def test_requeue_is_idempotent() -> None:
    first = _rq(notice=_notice())
    second = _rq(notice=_notice(), already_requeued=True)
    assert first.do and not second.do


def test_hardware_fault_requeues_away_from_the_node() -> None:
    r = _rq(child_outcome=FailureClass.HARDWARE_FAULT, exclude_nodes=("n2",))
    assert (r.do, r.how, r.exclude) == (True, "scontrol", ("n2",))
    assert "hardware_fault on n2" in r.reason and "excluding n2" in r.reason


def test_job_that_slurm_will_not_requeue() -> None:
    auto = _rq(job_requeueable=False)
    assert (auto.do, auto.how) == (False, "none") and "--no-requeue" in auto.reason
    always = _rq(job_requeueable=False, policy="always")
    assert (always.do, always.how) == (True, "resubmit")


def test_a_time_limit_warning_plans_for_endtime_however_early_it_comes() -> None:
    # `--signal=B:USR1@90` can arrive up to a minute before the 90 s: the deadline is still EndTime,
    # not the default grace (which would be too short for any save and lose the warning's purpose).
    job = SimpleNamespace(preempt_time=None, end_time=1150.0, state="RUNNING")
    n, d = notice_for("signal", 1000.0, job, 30.0, signal_name="USR1", time_limit_signal="USR1")
    assert (d.at, d.source, n.failure_class) == (1150.0, "slurm_end_time", FailureClass.TIME_LIMIT)
