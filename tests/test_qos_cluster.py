"""The extra QOS for real: QOS preemption and QOS limits on a cluster with slurmdbd and MariaDB.

One accounting cluster per Slurm version (tests/slurm_accounting.py; module-scoped, its own
ports, beside the partition-preemption cluster of the other tests): ``PreemptType=preempt/qos``,
QOS ``extra`` (preemptible, its own GraceTime and PreemptMode) and ``normal`` with
``Preempt=extra``. Each test sets QOS ``extra`` up with ``sacctmgr`` as it needs (PreemptMode
REQUEUE or CANCEL, a per-user limit, MaxWall) and the fixture puts it back afterwards.

What is checked is what a user of an "extra"/"scavenger" QOS sees (docs/qos.md):

* preempted by a ``normal`` job, the supervised job plans with the QOS's GraceTime (read from
  sacctmgr before the notice, recorded in the ``notice`` event), saves in time, and resumes at the
  saved step: requeued by Slurm under REQUEUE, resubmitted by ``supervise submit`` under CANCEL;
* a resubmission refused by ``MaxSubmitJobsPerUser`` or held by ``MaxJobsPerUser`` is waited out and
  the run completes; a ``--time`` over ``MaxWall`` is one line and exit 5 before any submission.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import slurm_accounting as acct_lib
import slurm_cluster as cluster_lib
from accounting_check import check_accounting_history
from helpers import REPO, events_named

pytest.importorskip("torch")
PY = sys.executable
CHILDREN = Path(__file__).resolve().parent / "children"
TRAIN_PLAIN = str(REPO / "examples" / "train_plain.py")
QOS_GRACE = 8  # short (CI time) but room for a 0.5 s emergency save, the 2 s margin and a loaded machine
EXTRA_DEFAULTS = {"PreemptMode": "requeue", "GraceTime": QOS_GRACE, "MaxSubmitJobsPerUser": -1,
                  "MaxJobsPerUser": -1, "MaxWall": -1}


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@pytest.fixture(scope="module")
def qos_cluster(slurm_version: str, request: pytest.FixtureRequest) -> Iterator[cluster_lib.Cluster]:
    """The accounting cluster of ``slurm_version``; its start-up time is printed (and kept in its
    cluster.json under ``accounting.timings``). It fails in CI, never skips, when it cannot start."""
    keep = os.environ.get("SLURM_TEST_KEEP", "") not in ("", "0")
    started = time.monotonic()
    try:
        cluster = cluster_lib.start_cluster(
            owner_pid=os.getpid(), die_with_owner=True, install=cluster_lib.install_for(slurm_version),
            accounting=acct_lib.QosSetup(grace_time=QOS_GRACE, preempt_mode="requeue"))
    except (cluster_lib.ClusterError, acct_lib.AccountingError) as exc:
        message = f"the Slurm {slurm_version} accounting cluster could not start: {exc}"
        if _in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    took = time.monotonic() - started
    timings = cluster.read_state().get("accounting", {}).get("timings", {})
    line = (f"accounting cluster (Slurm {cluster.label}) up in {took:.1f} s; database and slurmdbd: "
            + ", ".join(f"{k} {v}" for k, v in timings.items()))
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
        print(f"\n{line}", file=sys.stderr, flush=True)  # shown in the CI log, not only on a failure
    try:
        yield cluster
    finally:
        cluster.stop(keep=keep)


@pytest.fixture
def qos_job_dir(qos_cluster: cluster_lib.Cluster, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A fresh directory for the test's jobs; afterwards jobs are cancelled and QOS extra is set
    back to its defaults (REQUEUE, the test grace, no limits)."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)[:80]
    path = qos_cluster.shared_dir / name
    path.mkdir(parents=True, exist_ok=True)
    try:
        yield path
    finally:
        qos_cluster.cancel_all()
        with contextlib.suppress(cluster_lib.ClusterError):
            qos_cluster.wait_idle(timeout=30)
        acct_lib.modify_qos(qos_cluster, acct_lib.QOS_EXTRA, **EXTRA_DEFAULTS)


# ---------------------------------------------------------------------------------------------
# helpers


def wait_until(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"supervise submit ended (rc {proc.returncode}) before {what}")
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def preempt_with_normal(cluster: cluster_lib.Cluster, node: str) -> int:
    """A short job on QOS normal that needs the whole ``node``: preempts the extra job there."""
    return cluster.sbatch("sleep 1\n", "--qos=normal", "-N1", "--exclusive", "-w", node, "-o", "/dev/null")


def blocker(cluster: cluster_lib.Cluster, node: str) -> int:
    """Another job of the same user on QOS extra: what makes a per-user limit bite."""
    job = cluster.sbatch("sleep 600\n", "--qos=extra", "-N1", "-w", node, "-o", "/dev/null")
    cluster.wait_state(job, "RUNNING", timeout=60)
    return job


def ok_saves(run_dir: Path, attempt: int) -> list[int]:
    if not (run_dir / "supervisor" / "events.jsonl").exists():
        return []
    return [e["step"] for e in events_named(run_dir, "save_end") if e.get("attempt") == attempt and e.get("ok")]


def resumed_step_from_child(run_dir: Path, attempt: int) -> int:
    text = (run_dir / "supervisor" / f"attempt-{attempt}.log").read_text()
    found = re.search(r"resumed from \S+ at step (\d+)", text)
    assert found, f"attempt {attempt} did not report a resume:\n{text[:2000]}"
    return int(found.group(1))


def assert_qos_grace_planned(run_dir: Path) -> dict:
    """The notice was planned with QOS extra's GraceTime, read from sacctmgr before the notice
    (or with the deadline the job record already showed): never the 30 s default."""
    notice = events_named(run_dir, "notice")[0]
    assert notice.get("cluster_grace_source") == "QOS extra GraceTime", notice
    assert notice.get("cluster_grace") == QOS_GRACE, notice
    assert notice["deadline_source"] in ("slurm_end_time", "cluster_grace"), notice["reason"]
    return notice


class Submit:
    """``supervise submit`` running in the background; its stderr read as it comes."""

    def __init__(self, cluster: cluster_lib.Cluster, job_dir: Path, script: Path, *args: str) -> None:
        env = {k: v for k, v in cluster.env.items() if not k.startswith(("SUPERVISE_", "SUPERVISOR_"))}
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONPATH"] = str(REPO)
        self.proc = subprocess.Popen([PY, "-m", "supervisor", "submit", str(script), "--poll", "0.5", "--json", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=job_dir)
        self.err_lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.err_lines.append(line)

    def said(self, words: str) -> bool:
        return any(words in line for line in list(self.err_lines))

    def finish(self, timeout: float = 240) -> tuple[int, dict, str]:
        out, _ = self.proc.communicate(timeout=timeout)
        self._reader.join(timeout=10)
        err = "".join(self.err_lines)
        try:
            return self.proc.returncode, json.loads(out), err
        except ValueError:
            raise AssertionError(f"no JSON on stdout (rc {self.proc.returncode}): {out!r}\n{err}") from None


def write_job(job_dir: Path, run_dir: Path, command: list[str], *, name: str, extra: str = "") -> Path:
    """A batch script as a user of the extra QOS writes it (docs/qos.md)."""
    script = job_dir / f"{name}.sbatch"
    script.write_text(f"""#!/bin/bash
#SBATCH --job-name={name}
#SBATCH --qos=extra
#SBATCH --nodes=1
#SBATCH --cpus-per-task=2
#SBATCH --open-mode=append
#SBATCH --output={job_dir}/%x-%j.out
{extra}
export PYTHONPATH={REPO}
RUN_DIR={shlex.quote(str(run_dir))}
exec srun --ntasks=1 --cpus-per-task=2 {PY} -m supervisor run --run-dir "$RUN_DIR" --set preemption.margin=2 -- \\
    {' '.join(shlex.quote(c) for c in command)}
""")
    return script


# ---------------------------------------------------------------------------------------------
# QOS preemption


def test_requeue_qos_preempted_job_saves_within_the_qos_grace_and_resumes_at_the_saved_step(qos_cluster, qos_job_dir):
    run_dir = qos_job_dir / "run"
    child = [PY, str(CHILDREN / "slow_saver.py"), "--steps", "60", "--step-time", "0.1", "--save-every", "20",
             "--save-seconds", "0.5"]
    script = write_job(qos_job_dir, run_dir, child, name="victim", extra="#SBATCH --requeue\n#SBATCH --exclusive")
    job = qos_cluster.sbatch(script, "-w", "n1")
    # One save measured (step 20); the next is due at step 40: the notice lands between saves.
    wait_until(lambda: (run_dir / "supervisor" / "attempt-1.log").exists()
               and "step 24\n" in (run_dir / "supervisor" / "attempt-1.log").read_text(errors="replace"),
               120, "step 24")
    preempt_with_normal(qos_cluster, "n1")
    final = qos_cluster.wait_state(job, "COMPLETED", timeout=180, min_restarts=1)

    assert final.restarts >= 1
    assert final.qos == "extra"
    notice = assert_qos_grace_planned(run_dir)
    emergency = [s for s in events_named(run_dir, "save_end")
                 if s["ts"] > notice["ts"] and s.get("attempt") == 1 and s.get("ok")]
    assert emergency, "no save after the notice within the QOS grace"
    assert events_named(run_dir, "attempt_end")[0]["steps_lost"] == 0
    assert resumed_step_from_child(run_dir, 2) == emergency[0]["step"]  # the saved step, none lost
    assert events_named(run_dir, "run_end")[-1]["outcome"] == "complete"
    assert_report_shows_slurms_history(qos_cluster, run_dir, [str(job)])


def test_cancel_qos_preempted_job_is_resubmitted_by_supervise_submit_and_resumes_at_the_saved_step(
        qos_cluster, qos_job_dir):
    acct_lib.modify_qos(qos_cluster, acct_lib.QOS_EXTRA, PreemptMode="cancel")
    run_dir = qos_job_dir / "run"
    script = write_job(qos_job_dir, run_dir, [PY, TRAIN_PLAIN, "--steps", "50", "--step-time", "0.05",
                                              "--save-every", "10"], name="resub", extra="#SBATCH --no-requeue")
    submit = Submit(qos_cluster, qos_job_dir, script)
    ledger = run_dir / "supervisor" / "submissions.jsonl"
    wait_until(lambda: ledger.exists() and ledger.read_text().strip(), 60, "the first submission", submit.proc)
    first = json.loads(ledger.read_text().splitlines()[0])["job_id"]
    wait_until(lambda: ok_saves(run_dir, 1), 120, "a checkpoint saved by the first job", submit.proc)
    info = qos_cluster.wait_state(first, "RUNNING", timeout=30)
    preempt_with_normal(qos_cluster, info.node_names[0])
    rc, result, err = submit.finish()

    assert rc == 0, err
    assert result["outcome"] == "complete"
    jobs = [s["job_id"] for s in result["submissions"]]
    assert len(jobs) == 2 and jobs[0] == first, result
    assert result["submissions"][0]["restarts"] == 0  # cancelled, not requeued: only the resubmission brought it back
    assert_qos_grace_planned(run_dir)
    assert events_named(run_dir, "run_end")[0]["outcome"] == "requeue"
    saved = max(ok_saves(run_dir, 1))
    second = next(e for e in events_named(run_dir, "attempt_start") if e.get("job_id") == str(jobs[1]))
    assert second["resume_step"] == saved  # the last save of the preempted job
    assert events_named(run_dir, "run_end")[-1]["outcome"] == "complete"
    assert_report_shows_slurms_history(qos_cluster, run_dir, [str(j) for j in jobs])


def assert_report_shows_slurms_history(cluster: cluster_lib.Cluster, run_dir: Path, jobs: list[str]) -> None:
    """`supervise report` (text and HTML) shows Slurm's own record of every job of the run, beside
    the attempts, and finds no disagreement with the supervisor's (tests/accounting_check.py)."""
    check_accounting_history(run_dir, cluster.env, final_state="COMPLETED")
    env = {k: v for k, v in cluster.env.items() if not k.startswith(("SUPERVISE_", "SUPERVISOR_"))}
    env.update(PYTHONPATH=str(REPO), COLUMNS="100")
    html = run_dir / "report.html"
    base = [PY, "-m", "supervisor", "report", str(run_dir), "--no-checkpoints"]
    shown = subprocess.run(base, capture_output=True, text=True, env=env, timeout=120)
    paged = subprocess.run([*base, "--html", str(html)], capture_output=True, text=True, env=env, timeout=120)
    assert shown.returncode == 0 and paged.returncode == 0, shown.stderr[-2000:] + paged.stderr[-2000:]
    section = shown.stdout[shown.stdout.index("Slurm's history (sacct)"):]
    assert "not available" not in section.splitlines()[0], section[:2000]
    assert all(job in section for job in jobs), (jobs, section[:2000])
    assert "COMPLETED" in section and "Slurm and the supervisor agree" in section, section[:2000]
    page = html.read_text()
    assert "history (sacct)" in page and all(job in page for job in jobs)  # the apostrophe is escaped there


# ---------------------------------------------------------------------------------------------
# QOS limits in the resubmission loop


def test_submission_refused_by_max_submit_jobs_per_user_is_waited_out_and_the_run_completes(qos_cluster, qos_job_dir):
    acct_lib.modify_qos(qos_cluster, acct_lib.QOS_EXTRA, MaxSubmitJobsPerUser=1)
    other = blocker(qos_cluster, "n2")
    run_dir = qos_job_dir / "run"
    script = write_job(qos_job_dir, run_dir, [PY, TRAIN_PLAIN, "--steps", "10", "--save-every", "5"], name="limited")
    submit = Submit(qos_cluster, qos_job_dir, script)
    wait_until(lambda: submit.said("held back by the QOS limit MaxSubmitJobsPerUser"), 60,
               "the refused submission to be waited on", submit.proc)
    assert not (run_dir / "supervisor" / "submissions.jsonl").exists()  # refused: nothing was submitted
    qos_cluster.run(["scancel", str(other)])  # the user's other job ends: the limit passes
    rc, result, err = submit.finish()

    assert rc == 0, err
    assert result["outcome"] == "complete" and len(result["submissions"]) == 1
    assert result["limit_waits"] >= 1
    assert "Traceback" not in err and "giving up" not in err


def test_job_pending_on_max_jobs_per_user_is_waited_out_and_the_run_completes(qos_cluster, qos_job_dir):
    acct_lib.modify_qos(qos_cluster, acct_lib.QOS_EXTRA, MaxJobsPerUser=1)
    other = blocker(qos_cluster, "n2")
    run_dir = qos_job_dir / "run"
    script = write_job(qos_job_dir, run_dir, [PY, TRAIN_PLAIN, "--steps", "10", "--save-every", "5"], name="held")
    submit = Submit(qos_cluster, qos_job_dir, script)
    wait_until(lambda: submit.said("QOSMaxJobsPerUserLimit"), 60, "the job pending on the limit", submit.proc)
    assert submit.said("held back by the QOS limit MaxJobsPerUser")
    qos_cluster.run(["scancel", str(other)])
    rc, result, err = submit.finish()

    assert rc == 0, err
    assert result["outcome"] == "complete" and len(result["submissions"]) == 1
    assert result["limit_waits"] >= 1
    assert result["submissions"][0]["final_state"] == "COMPLETED"


def test_wall_time_over_the_qos_max_wall_is_refused_before_any_submission(qos_cluster, qos_job_dir):
    acct_lib.modify_qos(qos_cluster, acct_lib.QOS_EXTRA, MaxWall="00:05:00")
    run_dir = qos_job_dir / "run"
    script = write_job(qos_job_dir, run_dir, [PY, TRAIN_PLAIN, "--steps", "10"], name="toolong",
                       extra="#SBATCH --time=10")
    rc, _, err = _run_submit(qos_cluster, qos_job_dir, script)

    assert rc == 5, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "--time=10" in lines[0] and "MaxWall=00:05:00" in lines[0] and "QOS extra" in lines[0]
    assert not (run_dir / "supervisor" / "submissions.jsonl").exists()
    assert not qos_cluster.queued_jobs()  # nothing was submitted


def _run_submit(cluster, job_dir: Path, script: Path, *args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in cluster.env.items() if not k.startswith(("SUPERVISE_", "SUPERVISOR_"))}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([PY, "-m", "supervisor", "submit", str(script), "--poll", "0.5", "--json", *args],
                          capture_output=True, text=True, env=env, cwd=job_dir, timeout=180)
    return proc.returncode, proc.stdout, proc.stderr
