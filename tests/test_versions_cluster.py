"""Every way a supervised job gets stopped, on every Slurm version under test (issue #15).

Each test runs once per version (``test_x[slurm-22.05]``, ``[slurm-24.11]``, ``[slurm-26.05]``; pick
them with ``SLURM_TEST_VERSIONS``, see conftest.py) on the throwaway two-node cluster: partition
``extra`` (GraceTime set per test) is preempted by ``own``; ``cred_expire=10`` so a requeued job
waits 11 s (BeginTime) before it runs again. The job is always ``srun supervise run -- <child>``
with ``--requeue --open-mode=append`` and a short time limit, so a test that fails never leaves a
job behind that needs ``scancel -s KILL``.

They assert what must happen, whatever the version does underneath:

* a preemption is requeued exactly once (never twice, never zero times) and the training resumes at
  its saved step, with or without the client;
* more than MaxBatchRequeue (5) graceful preemptions of one job still end in a completed training,
  never a job held by Slurm;
* a person's ``scancel`` (or ``scancel -s KILL``, or ``scancel --signal=TERM``) is final: never
  requeued, and the event log's run_end says a person cancelled it;
* the time-limit warning (``--signal=B:USR1@N``, or ``scancel --signal=USR1`` standing in for it)
  requeues only when ``preemption.requeue_on_time_limit`` is on;
* a node that fails under the job: Slurm's own requeue, exactly once, and a resume elsewhere.

docs/slurm-versions.md ties each version difference to the test that shows it.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO, events_named

pytest.importorskip("torch")  # the children save real torch checkpoints
PY = sys.executable
CHILDREN = Path(__file__).resolve().parent / "children"
SETTLE_S = 13  # longer than the BeginTime wait of a requeue (cred_expire 10 s + 1): a stray requeue shows


# ---- helpers ------------------------------------------------------------------------------------
def job_script(run_dir: Path, child: str, sets: str = "", exec_srun: bool = False) -> str:
    """The batch script: one line per run in the output, then ``srun supervise run -- child``.
    ``exec_srun``: the batch shell becomes srun (the time-limit template's layout), so a
    ``--signal=B:SIG`` or ``scancel --batch`` reaches srun, which forwards it to the step."""
    run = (f"srun -n1 --cpus-per-task=1 {PY} -m supervisor run --run-dir {run_dir} --set preemption.margin=2 "
           f"{sets} -- {child}")
    tail = f"exec {run}\n" if exec_srun else f"{run}\necho \"SUPERVISE EXIT $?\"\n"
    return ("#!/bin/bash\n"
            f"export PYTHONPATH={REPO}\n"
            "export PYTHONUNBUFFERED=1\n"
            'echo "JOB RUN restart=${SLURM_RESTART_COUNT:-0} node=$SLURMD_NODENAME"\n' + tail)


def submit(cluster, job_dir: Path, script: str, *args: str, node: str | None = "n1", name: str = "victim") -> int:
    where = ("-w", node) if node else ()
    return cluster.sbatch(script, "-p", "extra", "-N1", "--exclusive", *where, "--requeue", "--open-mode=append",
                          "--time=5", "-J", name, "-o", f"{job_dir}/{name}-%j.out", *args)


def slow_saver(steps: int, step_time: float = 0.1, save_every: int = 10, save_seconds: float = 0.2) -> str:
    return (f"{PY} {CHILDREN / 'slow_saver.py'} --steps {steps} --step-time {step_time} "
            f"--save-every {save_every} --save-seconds {save_seconds}")


def wait_until(predicate, timeout: float, what: str, cluster=None, job: int | None = None) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.1)
    seen = f"; job: {cluster.job(job)}" if cluster is not None and job is not None else ""
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{seen}")


def events(run_dir: Path, name: str) -> list[dict]:
    try:
        return events_named(run_dir, name)
    except OSError:
        return []


def saved(run_dir: Path, attempt: int | None = None, min_step: int = 1) -> bool:
    return any(e.get("ok") and (e.get("step") or 0) >= min_step and (attempt is None or e.get("attempt") == attempt)
               for e in events(run_dir, "save_end"))


def attempts_started(run_dir: Path) -> int:
    return len(events(run_dir, "attempt_start"))


def runs_in_output(info) -> list[str]:
    """One ``JOB RUN restart=N`` line per run of the batch script (the output is appended)."""
    text = Path(info.std_out).read_text(errors="replace") if info.std_out and Path(info.std_out).exists() else ""
    return re.findall(r"JOB RUN restart=(\d+)", text)


class _NoJob:
    restarts = -1


final_none = _NoJob()


def resumed_steps(run_dir: Path) -> list[int]:
    """Where each attempt's child says it resumed (its own words, not the supervisor's)."""
    steps = []
    for log in sorted((run_dir / "supervisor").glob("attempt-*.log"), key=lambda p: int(p.stem.split("-")[1])):
        found = re.search(r"resumed from \S+ at step (\d+)", log.read_text(errors="replace"))
        steps.append(int(found.group(1)) if found else 0)
    return steps


EVIDENCE_EVENTS = ("notice", "arbitration", "requeue", "attempt_end", "run_end", "stop", "stop_cause")


def evidence(run_dir: Path, info=None) -> str:
    """What the event log and the job's output say: the text of a failed assertion."""
    lines = []
    for e in events_named_any(run_dir):
        if e.get("event") in EVIDENCE_EVENTS:
            keep = {k: v for k, v in e.items() if k in (
                "ts", "event", "attempt", "source", "signal", "class", "decision", "how", "ok", "planned",
                "outcome", "exit_code", "reason", "result", "job_state", "preempt_time", "cause", "stopped_by")}
            lines.append("  " + str(keep)[:400])
    if info is not None and info.std_out and Path(info.std_out).exists():
        tail = Path(info.std_out).read_text(errors="replace").splitlines()
        lines.append("  job output (last lines):")
        lines += ["    " + line[:300] for line in tail if not re.match(r"^(step \d+|saved step)", line)][-25:]
    return "\n" + "\n".join(lines)


def events_named_any(run_dir: Path) -> list[dict]:
    path = run_dir / "supervisor" / "events.jsonl"
    if not path.exists():
        return []
    import json
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def settled(cluster, job: int, run_dir: Path, timeout: float = 240):
    """The job's final record once it has ended for good: after it reached a final state, wait out
    the BeginTime of a possible requeue nobody asked for, and read it again."""
    end = time.monotonic() + timeout
    while True:
        info = cluster.job(job)
        if info is not None and info.is_finished:
            time.sleep(SETTLE_S)
            again = cluster.job(job)
            if again is not None and again.is_finished and again.restarts == info.restarts:
                return again
        if time.monotonic() > end:
            raise AssertionError(f"job {job} did not end in {timeout:.0f}s: {info}" + evidence(run_dir, info))
        time.sleep(0.3)


def assert_job(final, run_dir: Path, state: str, restarts: int) -> None:
    assert (final.state, final.restarts) == (state, restarts), (
        f"job {final.job_id} ended {final.state} after {final.restarts} requeues (Reason={final.reason} "
        f"BatchFlag={final.batch_flag}); wanted {state} after {restarts}" + evidence(run_dir, final))
    assert runs_in_output(final) == [str(n) for n in range(restarts + 1)], evidence(run_dir, final)


def run_end(run_dir: Path, index: int = -1, final=None) -> dict:
    ends = events(run_dir, "run_end")
    assert ends, f"no run_end in {run_dir}" + evidence(run_dir, final)
    return ends[index]


def explicit_requeues(run_dir: Path) -> list[dict]:
    return [e for e in events(run_dir, "requeue") if e.get("how") == "scontrol" and e.get("ok") is True]


def assert_cancelled_by_a_person(run_dir: Path, final) -> None:
    end = run_end(run_dir, final=final)
    said = f"{end.get('outcome')} {end.get('reason')}".lower()
    assert "cancel" in said and "person" in said, "run_end does not say a person cancelled" + evidence(run_dir, final)
    assert end.get("outcome") != "requeue", evidence(run_dir, final)
    assert not explicit_requeues(run_dir), evidence(run_dir, final)


# ---- preemption -----------------------------------------------------------------------------------
def test_preemption_with_a_save_that_fits_is_requeued_once_and_resumes_at_the_saved_step(
        slurm_cluster, slurm_job_dir):
    run_dir = slurm_job_dir / "run"
    with slurm_cluster.grace(10):
        job = submit(slurm_cluster, slurm_job_dir, job_script(run_dir, slow_saver(80, save_every=20, save_seconds=0.5)))
        wait_until(lambda: saved(run_dir, 1, 20), 90, "the save of step 20", slurm_cluster, job)
        slurm_cluster.preempt("n1")
        final = settled(slurm_cluster, job, run_dir)
    assert_job(final, run_dir, "COMPLETED", 1)
    notice_at = events(run_dir, "notice")[0]["ts"]
    arbitration = events(run_dir, "arbitration")[0]
    saves = [s for s in events(run_dir, "save_end") if s["attempt"] == 1 and s["ok"]]
    if not [s for s in saves if s["ts"] > notice_at]:
        # The notice came before the training reported a step past its last save: nothing new to save
        # (supervisor/preemption.py, arbitrate), so the run resumes from that save.
        assert "nothing to save" in arbitration["reason"], ("no save after the notice", arbitration)
    assert resumed_steps(run_dir)[-1] == saves[-1]["step"], (arbitration, saves[-1])  # exactly the saved step
    assert [e["outcome"] for e in events(run_dir, "run_end")] == ["requeue", "complete"]


def test_zero_code_preemption_is_requeued_once_and_resumes_from_the_newest_checkpoint(
        slurm_cluster, slurm_job_dir):
    run_dir = slurm_job_dir / "run"
    ckpt = run_dir / "checkpoints"
    child = (f"{PY} {CHILDREN / 'zero_code_slow.py'} --steps 60 --step-time 0.1 --save-every 10 "
             f"--last-seconds 0.2 --ckpt-dir {ckpt}")
    with slurm_cluster.grace(8):
        job = submit(slurm_cluster, slurm_job_dir, job_script(run_dir, child, sets="--resume-arg '--ckpt_path {path}'"),
                     node="n2")
        wait_until(lambda: (ckpt / "step=20.ckpt").exists(), 90, "the checkpoint of step 20", slurm_cluster, job)
        slurm_cluster.preempt("n2")
        final = settled(slurm_cluster, job, run_dir)
    assert_job(final, run_dir, "COMPLETED", 1)
    resume = events(run_dir, "resume_point")[-1]
    assert resume["step"] and resume["step"] >= 20
    assert resumed_steps(run_dir)[-1] == resume["step"]
    assert run_end(run_dir)["outcome"] == "complete"


def test_exit_during_grace_is_requeued_exactly_once(slurm_cluster, slurm_job_dir):
    """A long grace, a child that stops at once: the supervisor is gone well inside the grace. On
    22.05-23.11 only an explicit requeue brings the job back; from 24.05 Slurm requeues it itself;
    either way it must run exactly twice, and never a third time."""
    run_dir = slurm_job_dir / "run"
    with slurm_cluster.grace(25):
        job = submit(slurm_cluster, slurm_job_dir, job_script(run_dir, slow_saver(60, save_every=10, save_seconds=0.1)))
        wait_until(lambda: saved(run_dir, 1, 10), 90, "a first save", slurm_cluster, job)
        slurm_cluster.preempt("n1", seconds=1)
        wait_until(lambda: len(events(run_dir, "run_end")) >= 1, 60, "the first run to end", slurm_cluster, job)
        ended = time.time()
        final = settled(slurm_cluster, job, run_dir)
    notice = events(run_dir, "notice")[0]
    assert ended < notice["ts"] + 25, "the supervisor did not leave during the grace" + evidence(run_dir, final)
    assert_job(final, run_dir, "COMPLETED", 1)
    assert [e["outcome"] for e in events(run_dir, "run_end")] == ["requeue", "complete"]


def test_many_graceful_preemptions_of_one_job_never_leave_it_held_unsaid(slurm_cluster, slurm_job_dir):
    """Six preemptions, each answered inside the grace. From 24.05 a job that exits during its
    grace is requeued through Slurm's batch-requeue path, which counts toward MaxBatchRequeue (5)
    and then holds the job (Reason JobHoldMaxRequeue). Nobody of the run is alive then to release
    it, so the supervisor says so before it leaves, loudly and with the exact command; a person
    (here the test) releases it, and the training goes on to completion. On 22.05 there is no hold."""
    run_dir = slurm_job_dir / "run"
    preemptions = 6
    with slurm_cluster.grace(10):
        job = submit(slurm_cluster, slurm_job_dir,
                     job_script(run_dir, slow_saver(30 * (preemptions + 1), save_every=10, save_seconds=0.1)))
        for n in range(1, preemptions + 1):
            def started_and_saved(n: int = n) -> bool:
                return attempts_started(run_dir) >= n and saved(run_dir, n, 10 + 30 * (n - 1))

            def requeued(n: int = n) -> bool:
                info = slurm_cluster.job(job)
                return info is not None and info.restarts >= n

            wait_until(started_and_saved, 120, f"run {n} to start and save", slurm_cluster, job)
            slurm_cluster.preempt("n1")
            wait_until(requeued, 90, f"requeue {n}", slurm_cluster, job)
            info = slurm_cluster.job(job)
            if info.is_held:
                said = [w for w in events(run_dir, "warning") if w.get("held")]
                assert said and said[-1]["command"] == f"scontrol release {job}", (
                    f"after {n} preemptions Slurm holds the job and the supervisor did not say so: "
                    f"JobState={info.state} Reason={info.reason} Restarts={info.restarts}" + evidence(run_dir, info))
                assert [r for r in events(run_dir, "requeue") if r.get("held")], evidence(run_dir, info)
                slurm_cluster.run(["scontrol", "release", str(job)])  # what the warning told the person
        final = settled(slurm_cluster, job, run_dir)
    assert_job(final, run_dir, "COMPLETED", preemptions)
    assert run_end(run_dir)["outcome"] == "complete"
    steps = resumed_steps(run_dir)
    assert steps == sorted(steps) and steps[-1] >= 10 * preemptions, steps  # every run went on from the last


# ---- a person stops the job ---------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["scancel", "scancel_signal_term", "scancel_signal_kill"])
def test_a_persons_scancel_is_final_never_requeued(slurm_cluster, slurm_job_dir, how):
    """``scancel JOB`` and ``scancel -s KILL JOB`` (both cancel the job: Slurm sends SIGTERM, then
    SIGKILL after KillWait, and the job ends CANCELLED, on every version), and ``scancel
    --signal=TERM JOB`` (only the steps get SIGTERM; the job is not cancelled and its batch script
    goes on): each is a person stopping the training. Never requeued, on any version; run_end says
    a person cancelled it."""
    run_dir = slurm_job_dir / "run"
    job = submit(slurm_cluster, slurm_job_dir, job_script(run_dir, slow_saver(400, save_every=10, save_seconds=0.1)))
    wait_until(lambda: saved(run_dir, 1, 10), 90, "a first save", slurm_cluster, job)
    argv = {"scancel": ["scancel"], "scancel_signal_term": ["scancel", "--signal=TERM"],
            "scancel_signal_kill": ["scancel", "-s", "KILL"]}[how]
    slurm_cluster.run([*argv, str(job)])
    final = settled(slurm_cluster, job, run_dir)
    assert_job(final, run_dir, "COMPLETED" if how == "scancel_signal_term" else "CANCELLED", 0)
    assert_cancelled_by_a_person(run_dir, final)


# ---- the time limit ---------------------------------------------------------------------------------
@pytest.mark.parametrize("opted_in", [True, False], ids=["requeue_on_time_limit", "no_requeue_on_time_limit"])
def test_time_limit_warning_signal_requeues_only_when_opted_in(slurm_cluster, slurm_job_dir, opted_in):
    """A real time limit with ``--signal=B:USR1@10`` (the batch shell is srun, which forwards USR1 to
    the step): the warning comes 10-40 s before the one-minute limit. With
    ``preemption.requeue_on_time_limit`` (on by default) the job is requeued once and finishes in
    its second run; without, it stops at the warning and stays stopped."""
    run_dir = slurm_job_dir / "run"
    sets = "" if opted_in else "--set preemption.requeue_on_time_limit=false"
    script = job_script(run_dir, slow_saver(550, step_time=0.1, save_every=50, save_seconds=0.1), sets=sets,
                        exec_srun=True)
    node = "n1" if opted_in else "n2"
    job = slurm_cluster.sbatch(script, "-p", "extra", "-N1", "--exclusive", "-w", node, "--requeue",
                               "--open-mode=append", "--time=1", "--signal=B:USR1@10", "-o", f"{slurm_job_dir}/tl-%j.out")
    wait_until(lambda: events(run_dir, "notice"), 90, "the time-limit warning", slurm_cluster, job)
    notice = events(run_dir, "notice")[0]
    assert notice["signal"] == "USR1" and notice["class"] == "time_limit", notice
    if opted_in:  # the second run gets 5 minutes: no second warning while it finishes
        wait_until(lambda: (slurm_cluster.job(job) or final_none).restarts >= 1, 60, "the requeue", slurm_cluster, job)
        slurm_cluster.run(["scontrol", "update", f"JobId={job}", "TimeLimit=5"], check=False)
    final = settled(slurm_cluster, job, run_dir)
    if opted_in:
        assert_job(final, run_dir, "COMPLETED", 1)
        assert [e["outcome"] for e in events(run_dir, "run_end")] == ["requeue", "complete"], evidence(run_dir, final)
        assert resumed_steps(run_dir)[-1] >= 50
    else:  # the batch shell is srun: its exit 75 (handed back, not requeued) makes the job FAILED
        assert final.restarts == 0 and final.state in ("FAILED", "COMPLETED"), evidence(run_dir, final)
        assert runs_in_output(final) == ["0"] and not explicit_requeues(run_dir), evidence(run_dir, final)
        assert saved(run_dir, 1, 50)


@pytest.mark.parametrize("batch", [False, True], ids=["steps", "batch"])
def test_scancel_signal_usr1_is_taken_as_the_time_limit_warning(slurm_cluster, slurm_job_dir, batch):
    """``scancel --signal=USR1`` (to the steps) and ``scancel --batch --signal=USR1`` (to the batch
    shell, srun here, which forwards it): the same signal as ``--signal=B:USR1@N``, so the same
    answer: save, stop, and with requeue_on_time_limit off, do not come back."""
    run_dir = slurm_job_dir / "run"
    script = job_script(run_dir, slow_saver(400, save_every=10, save_seconds=0.1),
                        sets="--set preemption.requeue_on_time_limit=false", exec_srun=True)
    job = submit(slurm_cluster, slurm_job_dir, script, node="n2")
    wait_until(lambda: saved(run_dir, 1, 10), 90, "a first save", slurm_cluster, job)
    slurm_cluster.run(["scancel", *(["--batch"] if batch else []), "--signal=USR1", str(job)])
    final = settled(slurm_cluster, job, run_dir)
    assert final.restarts == 0 and runs_in_output(final) == ["0"], evidence(run_dir, final)
    notice = events(run_dir, "notice")[0]
    assert notice["signal"] == "USR1" and notice["class"] == "time_limit", evidence(run_dir, final)
    assert not explicit_requeues(run_dir), evidence(run_dir, final)


# ---- a node fails -----------------------------------------------------------------------------------
def test_node_failure_under_a_running_job_is_requeued_once_by_slurm_and_resumes(
        slurm_cluster, slurm_job_dir):
    """``scontrol update nodename=N state=down`` under the running job: Slurm requeues it itself
    (JobRequeue=1) and it runs again; the supervisor must not requeue it again."""
    run_dir = slurm_job_dir / "run"
    job = submit(slurm_cluster, slurm_job_dir, job_script(run_dir, slow_saver(120, save_every=10, save_seconds=0.1)),
                 node=None)
    wait_until(lambda: saved(run_dir, 1, 20), 90, "the save of step 20", slurm_cluster, job)
    node = slurm_cluster.job(job).node_names[0]
    try:
        slurm_cluster.run(["scontrol", "update", f"nodename={node}", "state=down", "reason=test_node_failure"])
        wait_until(lambda: (slurm_cluster.job(job) or final_none).restarts >= 1, 60, "Slurm's requeue",
                   slurm_cluster, job)
    finally:
        slurm_cluster.resume_node(node)  # (ReturnToService=2 may bring it back by itself)
    final = settled(slurm_cluster, job, run_dir)
    assert_job(final, run_dir, "COMPLETED", 1)
    assert resumed_steps(run_dir)[-1] >= 20, evidence(run_dir, final)
    assert run_end(run_dir)["outcome"] == "complete", evidence(run_dir, final)
    assert not explicit_requeues(run_dir), evidence(run_dir, final)


# ---- printed text never overrides the job record (issue 25, item 3) -----------------------------------
LIAR = """import os, time
for step in range(1, 6):
    print(f"step {step}", flush=True)
    time.sleep(0.1)
node = os.environ.get("SLURMD_NODENAME", "n1")
print(f"slurmstepd: error: *** STEP {os.environ['SLURM_JOB_ID']}.0 ON {node} CANCELLED AT 2026-12-02T01:00:00 "
      "DUE TO PREEMPTION ***", flush=True)
raise SystemExit(1)
"""


def test_a_running_job_that_prints_the_preemption_line_and_exits_1_is_a_crash_not_a_requeue(
        slurm_cluster, slurm_job_dir):
    """The training prints Slurm's own preemption line while the job is RUNNING (no PreemptTime, no
    notice), then exits 1: the job record decides. Not requeued (by the supervisor or by Slurm), the
    attempt is reported as the failure it is, and the event says what the text claimed."""
    run_dir = slurm_job_dir / "run"
    child = slurm_job_dir / "liar.py"
    child.write_text(LIAR)
    job = submit(slurm_cluster, slurm_job_dir,
                 job_script(run_dir, f"{PY} {child}", sets="--set policy.unknown.retries=0"))
    final = settled(slurm_cluster, job, run_dir)
    assert final.restarts == 0 and final.state != "PENDING", evidence(run_dir, final)
    assert not explicit_requeues(run_dir) and not events(run_dir, "notice"), evidence(run_dir, final)
    end = run_end(run_dir)
    assert end["outcome"] == "stopped" and end["exit_code"] not in (0, 75), evidence(run_dir, final)
    failure = events(run_dir, "failure")[0]
    assert failure["class"] == "unknown", evidence(run_dir, final)
    assert failure["text_claim"].startswith("preemption, contradicted by the job record (JobState=RUNNING"), failure
