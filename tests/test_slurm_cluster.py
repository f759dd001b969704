"""The Slurm facts the supervisor relies on, checked on a real Slurm (the throwaway cluster of
tests/slurm_cluster.py: two slurmd on this host, partition ``extra`` preempted by ``own``), and the
facade (supervisor.slurm) against that real controller. CI starts the cluster; these tests must run
there, not skip.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import slurm_cluster as cluster_lib

from supervisor.errors import SlurmError
from supervisor.slurm import SlurmCli, get_backend, needs_explicit_requeue

pytestmark = pytest.mark.slurm

GRACE = 3  # seconds of GraceTime for the preemption tests: short, but long enough to see the window
PY = sys.executable


def wait_file(path: Path, timeout: float = 30.0) -> Path:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear within {timeout:.0f}s")
        time.sleep(0.05)
    return path


def step_that_traps_term(job_dir: Path) -> str:
    """An srun step that marks its start, and on SIGTERM writes the time and exits 0 (written
    aside and renamed: a reader that sees the file never reads it empty)."""
    body = (
        f'trap "date +%s.%N > {job_dir}/.term.\\$SLURM_JOB_ID && mv {job_dir}/.term.\\$SLURM_JOB_ID '
        f'{job_dir}/term.\\$SLURM_JOB_ID; echo STEP GOT TERM; exit 0" TERM; '
        f"touch {job_dir}/started.$SLURM_JOB_ID; echo STEP STARTED; "
        "while true; do sleep 0.1; done"
    )
    return f"srun bash -c '{body}'"


def victim_args(node: str, job_dir: Path, name: str) -> tuple[str, ...]:
    return ("-p", "extra", "-N1", "--exclusive", "-w", node, "--requeue", "--open-mode=append",
            "-J", name, "-o", f"{job_dir}/{name}-%j.out")


def test_preempted_step_gets_sigterm_at_grace_start_and_slurm_requeues_after_grace(slurm_cluster, slurm_job_dir):
    cli = SlurmCli(env=slurm_cluster.env)
    script = f"""#!/bin/bash
echo "RUN restart=${{SLURM_RESTART_COUNT:-0}} job=$SLURM_JOB_ID node=$SLURMD_NODENAME"
if [ "${{SLURM_RESTART_COUNT:-0}}" -ge 1 ]; then echo "SECOND RUN DONE"; exit 0; fi
{step_that_traps_term(slurm_job_dir)}
echo "STEP ENDED rc=$?"
sleep 120  # stay until Slurm ends the grace: exiting now would finish the job for good on 22.05
"""
    with slurm_cluster.grace(GRACE):
        job = slurm_cluster.sbatch(script, *victim_args("n1", slurm_job_dir, "victim"))
        wait_file(slurm_job_dir / f"started.{job}")
        preemptor = slurm_cluster.preempt("n1")
        term_at = float(wait_file(slurm_job_dir / f"term.{job}", timeout=30).read_text())

        in_grace = cli.job_info(job)
        for _ in range(30):  # under load the controller may show the grace EndTime a moment later
            if in_grace is not None and in_grace.end_time is not None:
                break
            time.sleep(0.1)
            in_grace = cli.job_info(job)
        assert in_grace is not None and in_grace.state == "RUNNING", in_grace
        assert in_grace.in_grace and in_grace.restarts == 0
        assert in_grace.end_time == in_grace.preempt_time + GRACE, in_grace.raw
        assert in_grace.grace_deadline == in_grace.end_time
        # The step got SIGTERM at grace start, not at its end (times in whole seconds).
        assert in_grace.preempt_time - 1 <= term_at < in_grace.preempt_time + GRACE

        final = slurm_cluster.wait_state(job, "COMPLETED", timeout=90, min_restarts=1)
    # 24.11 runs a job that was requeued at grace expiry once more after its clean exit (Restarts=2):
    # SlurmVersion.may_requeue_again_after_grace_expiry. 22.05 and 26.05 do not.
    extra = int(slurm_cluster.version.may_requeue_again_after_grace_expiry)
    if extra:
        final = slurm_cluster.wait_state(job, "COMPLETED", timeout=90, min_restarts=1 + extra)
    assert final.job_id == job and final.restarts == 1 + extra
    assert final.preempt_time is None  # reset by the requeue
    output = Path(final.std_out).read_text()
    first, second = output.index("RUN restart=0"), output.index("RUN restart=1")
    assert first < output.index("STEP GOT TERM") < output.index("DUE TO PREEMPTION") < second
    assert "SECOND RUN DONE" in output
    assert slurm_cluster.wait_finished(preemptor).state == "COMPLETED"


def test_exit_during_grace_is_not_requeued_and_explicit_requeue_brings_it_back(slurm_cluster, slurm_job_dir):
    cli = SlurmCli(env=slurm_cluster.env)
    version = cli.version()
    requeue_call = (
        f"{PY} -c 'import os; from supervisor.slurm import SlurmEnv, get_backend; "
        "env = SlurmEnv.from_environ(os.environ); "
        "r = get_backend().requeue(env.job_id, expected_restarts=env.restart_count); "
        "print(\"REQUEUE requeued=%s already=%s\" % (r.requeued, r.already), flush=True)'"
    )
    exits = f"""#!/bin/bash
echo "RUN restart=${{SLURM_RESTART_COUNT:-0}}"
if [ "${{SLURM_RESTART_COUNT:-0}}" -ge 1 ]; then echo "SECOND RUN DONE"; exit 0; fi
{step_that_traps_term(slurm_job_dir)}
echo "BATCH EXITS DURING GRACE"
"""
    requeues = f"""#!/bin/bash
echo "RUN restart=${{SLURM_RESTART_COUNT:-0}}"
if [ "${{SLURM_RESTART_COUNT:-0}}" -ge 1 ]; then echo "SECOND RUN DONE"; exit 0; fi
{step_that_traps_term(slurm_job_dir)}
{requeue_call}
sleep 60  # the requeue ends this run
"""
    with slurm_cluster.grace(GRACE):
        plain = slurm_cluster.sbatch(exits, *victim_args("n1", slurm_job_dir, "plain"))
        explicit = slurm_cluster.sbatch(requeues, *victim_args("n2", slurm_job_dir, "explicit"))
        wait_file(slurm_job_dir / f"started.{plain}")
        wait_file(slurm_job_dir / f"started.{explicit}")
        slurm_cluster.preempt("n1")
        slurm_cluster.preempt("n2")

        slurm_requeues_it = not needs_explicit_requeue(version, "preempted")
        ended = slurm_cluster.wait_state(plain, "COMPLETED", timeout=90, min_restarts=int(slurm_requeues_it))
        # 24.11: a job requeued by scontrol during its grace runs once more after its clean exit
        # (SlurmVersion.may_requeue_again_after_grace_expiry): Restarts=2 there, 1 elsewhere.
        again = int(version.may_requeue_again_after_grace_expiry)
        back = slurm_cluster.wait_state(explicit, "COMPLETED", timeout=90, min_restarts=1 + again)

    # The job that simply exited during its grace: on 22.05-23.11 finished for good, never requeued
    # (that is why the supervisor requeues explicitly); on 24.05+ Slurm requeues it.
    plain_info = cli.job_info(plain)
    assert slurm_requeues_it is (version >= (24, 5))
    assert plain_info.state == "COMPLETED" and plain_info.restarts == ended.restarts == int(slurm_requeues_it)
    if not slurm_requeues_it:
        assert plain_info.preempt_time is not None  # it was preempted, and still just finished
        assert "SECOND RUN DONE" not in Path(ended.std_out).read_text()
    # The job that requeued itself through the facade: same id, Restarts=1, ran again, log appended.
    assert back.job_id == explicit and back.restarts == 1 + again
    output = Path(back.std_out).read_text()
    assert "REQUEUE requeued=True already=False" in output
    assert output.index("RUN restart=0") < output.index("RUN restart=1") < output.index("SECOND RUN DONE")


def test_srun_two_tasks_land_one_on_each_node_and_see_their_step(slurm_cluster, slurm_job_dir):
    probe = (
        "import json, os; from supervisor.slurm import SlurmEnv; e = SlurmEnv.from_environ(os.environ); "
        "print('ENV', json.dumps(dict(job=e.job_id, procid=e.procid, node=e.nodename, in_step=e.in_step, "
        "ntasks=e.ntasks, nodes=list(e.node_names))), flush=True)"
    )
    script = f"""#!/bin/bash
{PY} -c "{probe}"
srun -N2 -n2 {PY} -c "{probe}"
"""
    result = slurm_cluster.run_job(script, "-N2", "-n2", "-o", f"{slurm_job_dir}/two-%j.out", timeout=60)
    assert result.info.state == "COMPLETED", result.output
    envs = [json.loads(line[4:]) for line in result.output.splitlines() if line.startswith("ENV ")]
    batch = [e for e in envs if not e["in_step"]]
    tasks = sorted((e for e in envs if e["in_step"]), key=lambda e: e["procid"])
    assert len(batch) == 1 and batch[0]["job"] == str(result.job_id) and batch[0]["nodes"] == ["n1", "n2"]
    assert [t["procid"] for t in tasks] == [0, 1]
    assert {t["node"] for t in tasks} == {"n1", "n2"}
    assert all(t["job"] == str(result.job_id) and t["ntasks"] == 2 for t in tasks)


def test_facade_job_info_for_running_finished_failed_and_unknown_jobs(slurm_cluster, slurm_job_dir):
    slurm = get_backend(env=slurm_cluster.env)
    assert slurm.name == "cli"  # pyslurm cannot import against this 22.05 libslurm
    assert slurm.version()[:2] >= (20, 11)
    script = slurm_job_dir / "sleeper.sh"
    script.write_text("#!/bin/bash\nsleep 30\n")
    running = slurm.submit(str(script), ["-p", "extra", "-J", "sleeper", "-o", f"{slurm_job_dir}/sleeper-%j.out"])
    info = slurm_cluster.wait_state(running, "RUNNING", timeout=30)
    via_facade = slurm.job_info(running)
    assert via_facade.state == "RUNNING" and via_facade.name == "sleeper" and via_facade.partition == "extra"
    assert via_facade.node_names[0] in ("n1", "n2") and via_facade.preempt_time is None
    assert via_facade.requeue is True  # JobRequeue=1
    assert slurm.queue_state(running) == "RUNNING"
    assert info.start_time <= time.time() + 1

    done = slurm_cluster.run_job("echo fine\n", "-o", f"{slurm_job_dir}/ok-%j.out")
    failed = slurm_cluster.run_job("echo bad; exit 3\n", "-o", f"{slurm_job_dir}/bad-%j.out")
    ok_info, bad_info = slurm.job_info(done.job_id), slurm.job_info(failed.job_id)
    assert (ok_info.state, ok_info.exit_code) == ("COMPLETED", 0) and done.output.strip() == "fine"
    assert (bad_info.state, bad_info.exit_code, bad_info.reason) == ("FAILED", 3, "NonZeroExitCode")
    assert slurm.job_info(999999) is None and slurm.queue_state(999999) is None

    slurm.cancel(running)
    assert slurm_cluster.wait_finished(running).state == "CANCELLED"


def test_facade_requeue_is_idempotent_and_excludes_nodes(slurm_cluster, slurm_job_dir):
    slurm = get_backend(env=slurm_cluster.env)
    script = slurm_job_dir / "job.sh"
    script.write_text("#!/bin/bash\nsleep 30\n")
    out = f"{slurm_job_dir}/job-%j.out"
    # Running job: the first call requeues it, the second sees it already requeued.
    job = slurm.submit(str(script), ["--requeue", "-o", out])
    slurm_cluster.wait_state(job, "RUNNING", timeout=30)
    node = slurm.job_info(job).node_names[0]
    first = slurm.requeue(job, expected_restarts=0, exclude=[node])
    second = slurm.requeue(job)  # no expected count: still idempotent while the old run completes
    assert first.ok and first.requeued and not first.already
    assert first.excluded == (node,) and first.exclude_error is None
    assert second.ok and second.already and not second.requeued
    after = slurm.job_info(job)
    assert after.restarts == 1 and after.exc_node_names == (node,)
    # ExcNodeList only changes while pending: adding a node keeps the first one.
    assert slurm.update_exclude(job, ["n1", "n2"]) == tuple(dict.fromkeys([node, "n1", "n2"]))
    assert set(slurm.job_info(job).exc_node_names) == {"n1", "n2"}
    slurm.cancel(job)

    # A job that may not be requeued: the error says why and what to do.
    fixed = slurm.submit(str(script), ["--no-requeue", "-o", out])
    slurm_cluster.wait_state(fixed, "RUNNING", timeout=30)
    with pytest.raises(SlurmError, match="not requeueable.*--requeue"):
        slurm.requeue(fixed)
    with pytest.raises(SlurmError, match="requeue it first"):
        slurm.update_exclude(fixed, ["n1"])
    slurm.cancel(fixed)
    # A job Slurm no longer knows: reported, not raised.
    gone = slurm.requeue(999999)
    assert not gone.ok and "no longer known" in gone.reason


def test_transient_controller_error_is_retried(slurm_cluster, tmp_path):
    """A stand-in scontrol fails once the way a busy slurmctld does, then runs the real one."""
    real = Path(shutil.which("scontrol", path=slurm_cluster.env["PATH"])).parent  # this cluster's version
    calls = tmp_path / "calls"
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "scontrol").write_text(
        f"""#!/bin/bash
echo x >> {calls}
if [ $(wc -l < {calls}) -eq 1 ]; then
  echo "slurm_load_jobs error: Socket timed out on send/recv operation" >&2; exit 1
fi
exec {real}/scontrol "$@"
"""
    )
    (fake_bin / "scontrol").chmod(0o755)
    env = dict(slurm_cluster.env, PATH=f"{fake_bin}{os.pathsep}{slurm_cluster.env['PATH']}")
    job = slurm_cluster.sbatch("true\n", "-o", f"{tmp_path}/t-%j.out")
    info = SlurmCli(env=env, attempts=3, backoff=0.05).job_info(job)
    assert info is not None and info.job_id == job
    assert calls.read_text().count("x") == 2


def test_a_crashed_sessions_cluster_is_cleaned_up_and_a_live_one_is_not(slurm_cluster, slurm_job_dir):
    """A second cluster, owned by a process that has died (a crashed test session), runs beside the
    session's cluster on its own ports; the clean-up at start removes it and leaves ours alone."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    orphan = cluster_lib.start_cluster(owner_pid=dead.pid, install=slurm_cluster.install)
    try:
        daemons = list(orphan.read_state()["pids"].values())
        assert orphan.alive() and orphan.read_state()["ports"] != slurm_cluster.read_state()["ports"]
        cleaned = cluster_lib.clean_stale_clusters()
        assert orphan.base_dir in cleaned and not orphan.base_dir.exists()
        assert not any(Path(f"/proc/{pid}").exists() and cluster_lib._pid_alive(pid) for pid in daemons)
    finally:
        orphan.stop()
    assert slurm_cluster.alive() and slurm_cluster.base_dir not in cleaned
    result = slurm_cluster.run_job("echo still here\n", "-o", f"{slurm_job_dir}/alive-%j.out")
    assert result.info.state == "COMPLETED" and result.output.strip() == "still here"
