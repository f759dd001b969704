"""``supervise submit``: the resubmission loop.

The decision (``decide_next``), the run-directory parsing and the event-log scoping are pure and
tested as tables. The loop itself runs against the real throwaway Slurm cluster (tests/slurm_cluster.py):
a ``--no-requeue`` job on the preemptible partition ``extra`` is preempted by a job on ``own``.

What Slurm 22.05 does there (checked on the cluster): the job is selected for preemption, its step
(the supervisor, in ``srun``) gets SIGTERM, the supervisor lets the training save and exits 75 within
the grace time, so the job ends FAILED with exit code 75 and PreemptTime set, and is NOT requeued
(it is not requeueable). A ``--no-requeue`` job that outlives its grace ends PREEMPTED instead.
Either way only a resubmission brings the run back.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import preempt_while_the_child_waits

from supervisor.addons import templates
from supervisor.budget import BudgetVerdict
from supervisor.config import BudgetConfig
from supervisor.errors import UsageError
from supervisor.events import Event
from supervisor.addons.resubmit import (
    decide_next,
    job_scope,
    job_workdir,
    judge_for_resubmission,
    last_run_end,
    run_dir_from_script,
    sbatch_args_with_exclude,
)
from supervisor.slurm import JobInfo
from supervisor.states import SubmitAction

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
SUPERVISE_BIN = str(Path(PY).parent / "supervise") if (Path(PY).parent / "supervise").exists() else "supervise"
TRAIN_PLAIN = str(REPO / "examples" / "train_plain.py")


# ---------------------------------------------------------------------------------------------
# decide_next: the table


def job(state: str, preempt_time: float | None = None, exit_code: int | None = 0, job_id: int = 7) -> JobInfo:
    return JobInfo(job_id=job_id, state=state, preempt_time=preempt_time, exit_code=exit_code, exit_signal=0)


OK = BudgetVerdict(True, None, "within budget")
SPENT = BudgetVerdict(False, "max_total_restarts", "51 crashes across the run; at most 50 restarts")
END = lambda outcome, reason="r": {"outcome": outcome, "exit_code": 0, "reason": reason}

TABLE = [
    # (job final state, run_end, submissions, max, verdict) -> (action, outcome, exit code, words in reason)
    (job("COMPLETED"), END("complete", "training complete"), 1, 5, OK, "done", "complete", 0, "training complete"),
    (job("COMPLETED"), END("complete"), 5, 5, SPENT, "done", "complete", 0, ""),  # complete beats limits
    (job("FAILED", exit_code=4), END("stopped", "budget max_restarts_per_allocation exhausted"), 1, 5, OK,
     "stop", "stopped", 4, "max_restarts_per_allocation"),
    (job("PREEMPTED", preempt_time=1.0), END("stopped", "resume audit failed"), 1, 5, OK, "stop", "stopped", 4,
     "resume audit"),  # the supervisor's stop beats a preempted state
    (job("FAILED", exit_code=1), END("failed", "python exception"), 1, 5, OK, "stop", "failed", 1, "python exception"),
    (job("FAILED", exit_code=75, preempt_time=1.0), END("requeue"), 1, 5, OK, "resubmit", "resubmit", 0,
     "handed the run back"),
    (job("COMPLETED", preempt_time=1.0), END("requeue"), 1, 5, OK, "resubmit", "resubmit", 0, "COMPLETED"),
    (job("TIMEOUT"), END("requeue"), 2, 5, OK, "resubmit", "resubmit", 0, ""),
    (job("PREEMPTED", preempt_time=1.0, exit_code=0), None, 1, 5, OK, "resubmit", "resubmit", 0, "taken away"),
    (job("TIMEOUT"), None, 1, 5, OK, "resubmit", "resubmit", 0, "TIMEOUT"),
    (job("NODE_FAIL"), None, 1, 5, OK, "resubmit", "resubmit", 0, "NODE_FAIL"),
    (job("CANCELLED", preempt_time=1.0), None, 1, 5, OK, "resubmit", "resubmit", 0, "CANCELLED"),
    (job("CANCELLED"), END("requeue"), 1, 5, OK, "stop", "cancelled", 1, "cancelled by a person"),
    (job("CANCELLED"), None, 1, 5, OK, "stop", "cancelled", 1, "scancel"),
    (job("COMPLETED", exit_code=0), END("interrupted"), 1, 5, OK, "stop", "cancelled", 1, "interrupted"),
    (job("COMPLETED"), None, 1, 5, OK, "stop", "failed", 1, "no run_end"),
    (job("FAILED", exit_code=2), None, 1, 5, OK, "stop", "failed", 1, "--run-dir"),
    (job("OUT_OF_MEMORY"), None, 1, 5, OK, "stop", "failed", 1, "OUT_OF_MEMORY"),
    (job("FAILED", exit_code=75), END("requeue"), 3, 5, SPENT, "stop", "stopped", 4, "max_total_restarts"),
    (job("PREEMPTED", preempt_time=1.0), None, 1, 5, SPENT, "stop", "stopped", 4, "budget max_total_restarts"),
    (job("FAILED", exit_code=75), END("requeue"), 5, 5, OK, "stop", "gave_up", 1, "5 of at most 5 submissions"),
    (job("PREEMPTED", preempt_time=1.0), None, 1, 1, None, "stop", "gave_up", 1, "--max-submissions"),
    (job("UNKNOWN", exit_code=None), END("requeue"), 1, 5, None, "resubmit", "resubmit", 0, "no longer knows"),
    (job("FAILED"), END("weird"), 1, 5, OK, "stop", "failed", 1, "unknown run_end outcome"),
]


@pytest.mark.parametrize("final, run_end, n, limit, verdict, action, outcome, code, words", TABLE)
def test_decide_next_table(final, run_end, n, limit, verdict, action, outcome, code, words):
    step = decide_next(final, run_end, n, limit, verdict)
    assert (step.action, step.outcome, step.exit_code) == (SubmitAction(action), outcome, code), step.reason
    assert words in step.reason
    with pytest.raises(dataclasses.FrozenInstanceError):
        step.action = SubmitAction.DONE  # type: ignore[misc]  # frozen


# ---------------------------------------------------------------------------------------------
# Reading the run directory and the script


def ev(name: str, ts: float, **fields) -> Event:
    return Event(name, ts, fields)


def test_job_scope_takes_the_events_of_this_job_and_restart_only():
    events = [
        ev("run_start", 1, job_id="10", restart_count=0), ev("run_end", 2, outcome="requeue"),
        ev("run_start", 3, job_id="10", restart_count=1), ev("requeue", 3.5, exclude=["n2"]),
        ev("run_end", 4, outcome="requeue", reason="again"),
        ev("run_start", 5, job_id="11", restart_count=None), ev("run_end", 6, outcome="complete"),
    ]
    assert last_run_end(job_scope(events, 10, 0)) == {"outcome": "complete"}  # runs on to the log's end
    assert last_run_end(job_scope(events[:5], 10, 0))["reason"] == "again"
    assert last_run_end(job_scope(events[:5], 10, 1))["reason"] == "again"
    assert job_scope(events, 10, 2) == []  # the restarted job's supervisor never started
    assert last_run_end(job_scope(events, "11", 0)) == {"outcome": "complete"}
    assert job_scope(events, 12, 0) == []


def test_resubmission_budget_shares_the_ledger_but_not_the_allocation_limit():
    # Two allocations of one job, each with one native crash then a preemption; each attempt resumes
    # from the step the one before it saved, as the run loop logs it.
    events = []
    t = 0.0
    for restart, attempts in ((0, (1, 2)), (1, (3, 4))):
        for a in attempts:
            t += 1
            crash = a % 2 == 1
            resume = {"resume_path": f"ckpt/step={(a - 1) * 10}.pt", "resume_step": (a - 1) * 10} if a > 1 else {}
            events += [ev("attempt_start", t, attempt=a, job_id="5", restart_count=restart, **resume),
                       ev("progress", t + 0.1, attempt=a, step=a * 10),
                       ev("attempt_end", t + 0.5, attempt=a, last_step=a * 10, last_durable_step=a * 10,
                          steps_lost=0, **{"class": "native_crash" if crash else "preempted"})]
    roomy = BudgetConfig(max_restarts_per_allocation=0, max_total_restarts=5)
    assert judge_for_resubmission(events, roomy).ok  # one crash per allocation, the next job is new
    tight = BudgetConfig(max_restarts_per_allocation=0, max_total_restarts=1)
    verdict = judge_for_resubmission(events, tight)
    assert not verdict.ok and verdict.budget == "max_total_restarts"


def test_run_dir_is_read_from_a_rendered_template(tmp_path):
    run = tmp_path / "runs dir" / "exp 1"
    for name in ("single_node", "preemptible", "time_limit", "multi_node"):
        for command in (["python", "train.py"], ["python", "-c", "import sys\nprint('it''s', sys.argv) # x\n"]):
            text = templates.render(name, run_dir=str(run), command=command, time="10")
            assert run_dir_from_script(text, tmp_path) == run


def test_run_dir_forms_and_errors(tmp_path):
    assert run_dir_from_script("srun supervise run --run-dir=/a/b -- python t.py\n", tmp_path) == Path("/a/b")
    assert run_dir_from_script("srun supervise run --run-dir runs/x -- python t.py\n", tmp_path) == tmp_path / "runs/x"
    text = "BASE=/s\nexport RUN=\"$BASE/exp\"\nsrun supervise run \\\n  --run-dir \"${RUN}/r\" -- python t.py\n"
    assert run_dir_from_script(text, tmp_path) == Path("/s/exp/r")
    assert run_dir_from_script("export SUPERVISE_RUN_DIR=/e\nsrun supervise run -- python t.py\n",
                               tmp_path) == Path("/e")
    with pytest.raises(UsageError, match="depends on the job's environment.*--run-dir"):
        run_dir_from_script("srun supervise run --run-dir $SCRATCH/r -- python t.py\n", tmp_path)
    with pytest.raises(UsageError, match="no --run-dir"):
        run_dir_from_script("# --run-dir /commented\nsrun supervise run -- python t.py\n", tmp_path)
    with pytest.raises(UsageError, match="several run directories"):
        run_dir_from_script("supervise run --run-dir /a -- x\nsupervise run --run-dir /b -- x\n", tmp_path)


def test_a_relative_run_dir_is_relative_to_the_jobs_working_directory(tmp_path):
    text = "#!/bin/bash\n#SBATCH --chdir=/work/exp\nsrun supervise run --run-dir runs/a -- python t.py\n"
    assert run_dir_from_script(text, job_workdir(text, [], tmp_path)) == Path("/work/exp/runs/a")
    assert job_workdir(text, ["-D", "other"], tmp_path) == tmp_path / "other"  # the command line wins
    assert job_workdir("srun x\n", [], tmp_path) == tmp_path


def test_excluded_nodes_merge_into_the_sbatch_arguments():
    assert sbatch_args_with_exclude(["-p", "extra"], []) == ["-p", "extra"]
    assert sbatch_args_with_exclude(["-p", "extra"], ["n2"]) == ["-p", "extra", "--exclude=n2"]
    assert sbatch_args_with_exclude(["-x", "n1", "--exclude=n3", "-xn4", "-t", "5"], ["n2", "n1"]) == [
        "-t", "5", "--exclude=n1,n3,n4,n2"]


def test_submit_usage_errors_exit_2(tmp_path):
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\nsrun supervise run -- python train.py\n")
    for args, words in (([str(tmp_path / "missing.sbatch")], "cannot read"),
                        ([str(script)], "no --run-dir"),
                        ([str(script), "--run-dir", str(tmp_path), "--max-submissions", "0"], "max-submissions")):
        proc = subprocess.run([PY, "-m", "supervisor", "submit", *args], check=False, capture_output=True, text=True,
                              cwd=tmp_path, timeout=60)
        assert proc.returncode == 2 and words in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr


# ---------------------------------------------------------------------------------------------
# On the real cluster


def submit_env(cluster) -> dict[str, str]:
    env = {k: v for k, v in cluster.env.items() if not k.startswith(("SUPERVISE_", "SUPERVISOR_"))}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def write_job(job_dir: Path, run_dir: Path, command: list[str], *, name: str, run_args: str = "",
              requeue: bool = False) -> Path:
    """A batch script as a user writes it: the supervisor inside a step, the run dir in a variable."""
    script = job_dir / f"{name}.sbatch"
    script.write_text(f"""#!/bin/bash
#SBATCH --job-name={name}
#SBATCH --partition=extra
#SBATCH --nodes=1
#SBATCH --cpus-per-task=2
#SBATCH --{'requeue' if requeue else 'no-requeue'}
#SBATCH --open-mode=append
#SBATCH --output={job_dir}/%x-%j.out
RUN_DIR={shlex.quote(str(run_dir))}
exec srun --ntasks=1 --cpus-per-task=2 {shlex.quote(SUPERVISE_BIN)} run --run-dir "$RUN_DIR" {run_args} -- \\
    {' '.join(shlex.quote(c) for c in command)}
""")
    return script


def start_submit(cluster, job_dir: Path, script: Path, *args: str,
                 env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """``supervise submit`` as a terminal starts it: SIGINT at its default. A runner launched in the
    background (``nohup``, ``&`` in a script) ignores SIGINT, and a child inherits that, so without
    this the Ctrl-C tests would test how the suite was launched."""
    return subprocess.Popen([PY, "-m", "supervisor", "submit", str(script), "--poll", "0.5", "--json", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env or submit_env(cluster), cwd=job_dir,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def events(run_dir: Path) -> list[dict]:
    path = run_dir / "supervisor" / "events.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def ledger(run_dir: Path) -> list[dict]:
    path = run_dir / "supervisor" / "submissions.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_until(predicate, what: str, proc: subprocess.Popen | None = None, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"supervise submit ended (rc {proc.returncode}) before {what}: "
                                 f"{proc.stderr.read() if proc.stderr else ''}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def finish(proc: subprocess.Popen[str], timeout: float = 180) -> tuple[int, dict, str]:
    out, err = proc.communicate(timeout=timeout)
    try:
        result = json.loads(out)
    except ValueError:
        raise AssertionError(f"no JSON on stdout (rc {proc.returncode}): {out!r}\n{err}") from None
    return proc.returncode, result, err


def preempt_running_job(cluster, job_id: int, run_dir: Path) -> None:
    info = cluster.wait_state(job_id, "RUNNING", timeout=60)
    preempt_while_the_child_waits(cluster, info.node_names[0], run_dir)


def test_preempted_no_requeue_job_is_resubmitted_and_resumes_from_its_checkpoint(slurm_cluster, slurm_job_dir):
    run_dir = slurm_job_dir / "run"
    script = write_job(slurm_job_dir, run_dir, [PY, TRAIN_PLAIN, "--steps", "50", "--step-time", "0.05",
                                                "--save-every", "10"], name="resub")
    with slurm_cluster.grace(15):
        proc = start_submit(slurm_cluster, slurm_job_dir, script)
        first = wait_until(lambda: ledger(run_dir), "the first submission", proc)[0]["job_id"]
        wait_until(lambda: any(e["event"] == "save_end" and e.get("ok") for e in events(run_dir)),
                   "a checkpoint saved by the first job", proc)
        preempt_running_job(slurm_cluster, first, run_dir)
        rc, result, err = finish(proc)

    assert rc == 0, err
    assert result["outcome"] == "complete"
    jobs = [s["job_id"] for s in result["submissions"]]
    assert len(jobs) == 2 and jobs[0] == first and jobs[1] != first
    # Real 22.05 behaviour: the supervisor exits 75 inside the grace, so the job is FAILED (75), not requeued.
    # 24.05+ ends a job that exits during its grace as preempted: PREEMPTED (0) when it may not be requeued.
    ended = ("PREEMPTED", 0) if slurm_cluster.version.grace_exit_ends_as_preempted else ("FAILED", 75)
    assert (result["submissions"][0]["final_state"], result["submissions"][0]["exit_code"]) == ended
    assert result["submissions"][0]["restarts"] == 0
    lines = ledger(run_dir)
    assert [line["job_id"] for line in lines] == jobs
    assert lines[0]["reason"] == "first submission" and "handed the run back" in lines[1]["reason"]
    assert all(line["script"] == str(script) for line in lines)

    log = events(run_dir)
    first_run_end = next(e for e in log if e["event"] == "run_end")
    assert first_run_end["outcome"] == "requeue"
    second_start = next(e for e in log if e["event"] == "attempt_start" and e.get("job_id") == str(jobs[1]))
    assert second_start["resume_step"] and second_start["resume_step"] >= 10
    resumed = next(e for e in log if e["event"] == "resumed" and e["attempt"] == second_start["attempt"])
    assert resumed["ok"] and resumed["step"] == second_start["resume_step"]
    assert log[-1]["event"] == "run_end" and log[-1]["outcome"] == "complete"
    assert "submitted job" in err and f"job {jobs[1]}" in err  # the progress lines


LOOP = ("import time\nfor i in range(1, 601):\n    print('step', i, flush=True)\n    time.sleep(0.1)\n")


def test_max_submissions_reached_after_a_preemption_gives_up_with_exit_1(slurm_cluster, slurm_job_dir):
    run_dir = slurm_job_dir / "run"
    script = write_job(slurm_job_dir, run_dir, [PY, "-c", LOOP], name="once")
    proc = start_submit(slurm_cluster, slurm_job_dir, script, "--max-submissions", "1")
    job_id = wait_until(lambda: ledger(run_dir), "the submission", proc)[0]["job_id"]
    wait_until(lambda: any(e["event"] == "progress" for e in events(run_dir)), "training progress", proc)
    preempt_running_job(slurm_cluster, job_id, run_dir)
    rc, result, err = finish(proc)

    assert rc == 1, err
    assert result["outcome"] == "gave_up"
    assert "1 of at most 1 submissions" in result["reason"] and "--max-submissions" in err
    assert len(ledger(run_dir)) == 1 and [s["job_id"] for s in result["submissions"]] == [job_id]
    same_name = slurm_cluster.command(["squeue", "-h", "-n", "once", "-o", "%i"]).stdout.split()
    assert same_name in ([], [str(job_id)])  # nothing resubmitted


SEGFAULT = ("import ctypes, time\nfor i in range(1, 4):\n    print('step', i, flush=True)\n    time.sleep(0.05)\n"
            "ctypes.string_at(0)\n")


def test_run_stopped_by_budget_is_not_resubmitted_and_exits_4(slurm_cluster, slurm_job_dir):
    run_dir = slurm_job_dir / "run"
    script = write_job(slurm_job_dir, run_dir, [PY, "-c", SEGFAULT], name="budget",
                       run_args="--set budget.max_restarts_per_allocation=0")
    proc = start_submit(slurm_cluster, slurm_job_dir, script)
    rc, result, err = finish(proc)

    assert rc == 4, err
    assert result["outcome"] == "stopped" and "max_restarts_per_allocation" in result["reason"]
    assert len(result["submissions"]) == 1 and len(ledger(run_dir)) == 1
    assert result["submissions"][0]["decision"] == "stop"
    run_end = [e for e in events(run_dir) if e["event"] == "run_end"]
    assert len(run_end) == 1 and run_end[0]["outcome"] == "stopped"


def test_ctrl_c_stops_following_and_leaves_a_pending_job_in_the_queue(slurm_cluster, slurm_job_dir):
    run_dir = slurm_job_dir / "run"
    script = write_job(slurm_job_dir, run_dir, [PY, "-c", LOOP], name="pending")
    proc = start_submit(slurm_cluster, slurm_job_dir, script, "--", "--begin=now+3600")
    job_id = wait_until(lambda: ledger(run_dir), "the submission", proc)[0]["job_id"]
    slurm_cluster.wait_state(job_id, "PENDING", timeout=30)
    time.sleep(1.0)  # let it follow for a couple of polls
    proc.send_signal(signal.SIGINT)
    rc, result, err = finish(proc, timeout=30)

    assert rc == 130
    assert result["outcome"] == "interrupted" and "left alone" in result["reason"]
    assert "not cancelled" in err and f"squeue -j {job_id}" in err
    time.sleep(1.0)
    assert slurm_cluster.job(job_id).state == "PENDING"  # its place in the queue is kept


def test_sbatch_refusing_the_script_is_one_clear_error(slurm_cluster, slurm_job_dir):
    run_dir = slurm_job_dir / "run"
    script = write_job(slurm_job_dir, run_dir, [PY, "-c", LOOP], name="refused")
    proc = start_submit(slurm_cluster, slurm_job_dir, script, "--", "--partition=nosuchpartition")
    rc, result, err = finish(proc, timeout=60)

    assert rc == 1 and result["outcome"] == "slurm_error"
    assert "invalid partition" in err.lower() and "Traceback" not in err
    assert result["submissions"] == [] and ledger(run_dir) == []


def test_a_controller_that_fails_for_a_while_is_waited_out(slurm_cluster, slurm_job_dir, tmp_path):
    """A stand-in scontrol answers the first four job queries the way a busy slurmctld does, then
    runs the real one: the facade's retries and the loop's patience ride it out."""
    real = shutil.which("scontrol", path=slurm_cluster.env["PATH"])
    calls = tmp_path / "calls"
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "scontrol").write_text(f"""#!/bin/bash
if [ "$1 $2" = "show job" ]; then
  echo x >> {calls}
  if [ $(wc -l < {calls}) -le 4 ]; then
    echo "slurm_load_jobs error: Socket timed out on send/recv operation" >&2; exit 1
  fi
fi
exec {real} "$@"
""")
    (fake_bin / "scontrol").chmod(0o755)
    env = submit_env(slurm_cluster)
    env["PATH"] = f"{fake_bin}{os.pathsep}{env['PATH']}"
    run_dir = slurm_job_dir / "run"
    script = write_job(slurm_job_dir, run_dir, [PY, "-c", LOOP], name="flaky")
    proc = start_submit(slurm_cluster, slurm_job_dir, script, "--", "--begin=now+3600", env=env)
    job_id = wait_until(lambda: ledger(run_dir), "the submission", proc)[0]["job_id"]
    wait_until(lambda: calls.exists() and len(calls.read_text().split()) >= 7, "job queries that work", proc)
    proc.send_signal(signal.SIGINT)
    rc, result, err = finish(proc, timeout=30)

    assert rc == 130 and result["outcome"] == "interrupted", err  # not a Slurm error: it was waited out
    assert f"cannot read job {job_id}" in err and "Socket timed out" in err
    assert f"job {job_id} [submission 1/10] PENDING" in err  # then it followed the job again
