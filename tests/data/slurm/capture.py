"""Re-capture the literal Slurm outputs in this directory from a real cluster (the throwaway one).

    python tests/data/slurm/capture.py [--dir OUT]                 # the basic set, host Slurm (22.05)
    python tests/data/slurm/capture.py --stops --slurm 24.11       # how each stop looks: -> 24.11/

The basic set (this directory) is what the parser tests read. ``--stops`` captures, into
``<release>/`` (22.05/, 24.11/, 26.05/), what ``scontrol show job`` and ``squeue`` show while a job
is being stopped: a person's scancel during its kill window, scancel --signal=TERM, the time limit's
kill window, a preemption's grace, a node set DOWN under the job, and (24.05+) the hold after more
than MaxBatchRequeue graceful preemptions. ``--slurm``: the host's version or a root's
(tests/slurm_roots/). Takes two to four minutes.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # tests/, for slurm_cluster

import slurm_cluster


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--slurm", default="host", help="host, or a root's version (24.11, 26.05)")
    parser.add_argument("--stops", action="store_true", help="capture the stop scenarios into <release>/")
    args = parser.parse_args()
    cluster = slurm_cluster.start_cluster(grace_time=5, install=slurm_cluster.install_for(args.slurm))
    try:
        out: Path = args.dir or (HERE / cluster.label if args.stops else HERE)
        out.mkdir(parents=True, exist_ok=True)
        if args.stops:
            capture_stops(cluster, out)
        else:
            capture(cluster, out)
    finally:
        cluster.stop()
    return 0


TRAP_STEP = ("srun bash -c 'trap \"touch {work}/{tag}.$SLURM_JOB_ID; sleep {linger}; exit 0\" TERM; "
             "touch {work}/start-{tag}.$SLURM_JOB_ID; while true; do sleep 0.1; done'\n")


def capture_stops(cluster: slurm_cluster.Cluster, out: Path) -> None:
    """What a job looks like while it is being stopped, for each kind of stop."""
    work = cluster.shared_dir

    def save(name: str, text: str) -> None:
        (out / name).write_text(text)
        print(f"{out.name}/{name}: {text.strip()[:110]}")

    def wait_file(path: Path, timeout: float = 120) -> None:
        end = time.monotonic() + timeout
        while not path.exists():
            if time.monotonic() > end:
                raise RuntimeError(f"{path} did not appear")
            time.sleep(0.02)

    def squeue(job: int) -> str:
        return cluster.run(["squeue", "-h", "-t", "all", "-j", str(job), "-o", "%i|%T|%r|%p"], check=False).stdout

    def trap_job(tag: str, linger: float, *args: str) -> int:
        job = cluster.sbatch(TRAP_STEP.format(work=work, tag=tag, linger=linger), *args, "-o", f"{work}/{tag}-%j.out")
        wait_file(work / f"start-{tag}.{job}")
        return job

    def json_of(job: int) -> str:  # 23.02+: the full state (base state and flags), as scontrol --json prints it
        if cluster.version < (23, 2):
            return ""
        return cluster.run(["scontrol", "show", "job", "--json", str(job)], check=False).stdout

    def save_json(name: str, job: int) -> None:
        text = json_of(job)
        if text:
            import json
            data = json.loads(text)
            keep = ("job_id", "job_state", "state_reason", "exit_code", "restart_cnt", "batch_flag", "requeue",
                    "preempt_time", "end_time", "start_time", "time_limit", "priority")
            jobs = [{k: j.get(k) for k in keep} for j in data.get("jobs", [])]
            (out / name).write_text(json.dumps({"jobs": jobs}, indent=1) + "\n")
            print(f"{out.name}/{name}: {jobs[0].get('job_state') if jobs else None}")

    save("version.txt", cluster.run(["scontrol", "--version"]).stdout)
    # The time limit (whole minutes) runs alongside the rest.
    limited = trap_job("timeout", 3, "--time=1", "-w", "n2", "-N1")

    # A person's scancel: the step traps SIGTERM and lingers 3 s, so the kill window can be seen.
    job = trap_job("cancel", 3, "-w", "n1", "-N1", "--requeue")
    cluster.run(["scancel", str(job)])
    wait_file(work / f"cancel.{job}")
    save("cancel_kill_window.txt", cluster.job_text(job) or "")
    save("cancel_kill_window.squeue", squeue(job))
    save_json("cancel_kill_window.json", job)
    cluster.wait_finished(job)
    save("cancel_done.txt", cluster.job_text(job) or "")

    # scancel --signal=TERM: a signal to the steps; the job itself is not cancelled.
    job = trap_job("sigterm", 30, "-w", "n1", "-N1", "--requeue")
    cluster.run(["scancel", "--signal=TERM", str(job)])
    wait_file(work / f"sigterm.{job}")
    save("signal_term_running.txt", cluster.job_text(job) or "")
    cluster.run(["scancel", str(job)])
    cluster.wait_finished(job)

    # Preemption: in grace (RUNNING with PreemptTime, EndTime pulled in).
    job = trap_job("grace", 1, "-p", "extra", "-N1", "--exclusive", "-w", "n1", "--requeue")
    cluster.preempt("n1")
    wait_file(work / f"grace.{job}")
    save("grace.txt", cluster.job_text(job) or "")
    save("grace.squeue", squeue(job))
    save_json("grace.json", job)
    cluster.wait_state(job, ("PENDING", "COMPLETED"), timeout=90)
    save("grace_after.txt", cluster.job_text(job) or "")
    cluster.run(["scancel", str(job)])
    cluster.wait_finished(job)

    # The time limit's kill window, then its end.
    wait_file(work / f"timeout.{limited}", timeout=150)
    save("timeout_kill_window.txt", cluster.job_text(limited) or "")
    save_json("timeout_kill_window.json", limited)
    cluster.wait_finished(limited, timeout=60)
    save("timeout.txt", cluster.job_text(limited) or "")

    # A node set DOWN under a running job (what `scontrol update nodename=n2 state=down` does).
    job = trap_job("nodedown", 3, "-w", "n2", "-N1", "--requeue")
    cluster.run(["scontrol", "update", "nodename=n2", "state=down", "reason=capture"])
    time.sleep(0.5)
    save("node_down.txt", cluster.job_text(job) or "")
    save("node_down.squeue", squeue(job))
    time.sleep(5)
    save("node_down_after.txt", cluster.job_text(job) or "")
    save_json("node_down.json", job)
    cluster.run(["scancel", str(job)])
    cluster.wait_finished(job, timeout=60)
    for _ in range(50):  # RESUME is refused while the node still has the killed job completing
        if cluster.run(["scontrol", "update", "nodename=n2", "state=resume"], check=False).returncode == 0:
            break
        time.sleep(0.2)
    cluster.wait_idle(timeout=60)

    # More graceful preemptions than MaxBatchRequeue (5), each run exiting during its grace: from
    # 24.05 each is a batch requeue and the job ends up held.
    if cluster.version >= (24, 5):
        script = ('echo "run ${SLURM_RESTART_COUNT:-0}"\n'
                  + TRAP_STEP.format(work=work, tag="held", linger=0.2).replace("start-held.$SLURM_JOB_ID",
                                                                                 "start-held.$SLURM_JOB_ID.${SLURM_RESTART_COUNT:-0}"))
        job = cluster.sbatch(script, "-p", "extra", "-N1", "--exclusive", "-w", "n1", "--requeue",
                             "--open-mode=append", "-o", f"{work}/held-%j.out")
        for run in range(8):
            info = cluster.job(job)
            if info is not None and info.is_held:
                break
            wait_file(work / f"start-held.{job}.{run}", timeout=90)
            cluster.preempt("n1")
            cluster.wait_state(job, ("PENDING", "REQUEUE_HOLD", "COMPLETED"), timeout=90, min_restarts=run + 1)
        save("held_max_requeue.txt", cluster.job_text(job) or "")
        save("held_max_requeue.squeue", squeue(job))
        save_json("held_max_requeue.json", job)
        cluster.run(["scontrol", "release", str(job)])
        save("released.txt", cluster.job_text(job) or "")
        cluster.run(["scancel", str(job)])
        cluster.wait_finished(job, timeout=60)


def capture(cluster: slurm_cluster.Cluster, out: Path) -> None:
    work = cluster.shared_dir

    def save(name: str, text: str) -> None:
        (out / name).write_text(text)
        print(f"{name}: {text.strip()[:100]}")

    def job_text(job: int) -> str:
        text = cluster.job_text(job)
        assert text is not None, job
        return text

    def wait_file(path: Path) -> None:
        while not path.exists():
            time.sleep(0.05)

    time_limited = cluster.sbatch("sleep 300\n", "--time=0:01", "-w", "n2", "-o", f"{work}/t-%j.out")
    save("version.txt", cluster.command(["scontrol", "--version"]).stdout)
    save("sbatch_parsable.txt", cluster.command(["sbatch", "--parsable", "--wrap", "true"], cwd=work).stdout)
    pending = cluster.sbatch("sleep 1\n", "--begin=now+1hour", "-J", "a name with spaces", "--comment", "k=v and more")
    save("pending.txt", job_text(pending))
    save("requeue_pending.stderr", cluster.scontrol("requeue", str(pending), check=False).stderr)
    save("invalid_job.stderr", cluster.scontrol("show", "job", "-o", "999999", check=False).stderr)

    victim = cluster.sbatch(
        'if [ "${SLURM_RESTART_COUNT:-0}" -ge 1 ]; then echo second run; exit 0; fi\n'
        f"srun bash -c 'trap \"touch {work}/term.$SLURM_JOB_ID; exit 0\" TERM; touch {work}/start.$SLURM_JOB_ID;"
        " while true; do sleep 0.1; done'\nsleep 120\n",
        "-p", "extra", "-N1", "--exclusive", "-w", "n1", "--requeue", "--open-mode=append", "-o", f"{work}/v-%j.out",
    )
    wait_file(work / f"start.{victim}")
    save("running.txt", job_text(victim))
    save("exclude_running.stderr",
         cluster.scontrol("update", f"JobId={victim}", "ExcNodeList=n2", check=False).stderr)
    cluster.sbatch("sleep 1\n", "-p", "own", "-N1", "--exclusive", "-w", "n1", "-o", f"{work}/own-%j.out")
    wait_file(work / f"term.{victim}")
    save("grace.txt", job_text(victim))
    cluster.wait_state(victim, "PENDING", timeout=60, min_restarts=1)
    save("preempted_pending.txt", job_text(victim))
    save("completed_after_requeue.txt", _wait_text(cluster, victim, "COMPLETED", 1))

    running = cluster.sbatch("sleep 30\n", "--requeue", "-o", f"{work}/r-%j.out")
    cluster.wait_state(running, "RUNNING")
    cluster.scontrol("requeue", str(running))
    save("requeued_completing.txt", job_text(running))
    save("requeue_completing.stderr", cluster.scontrol("requeue", str(running), check=False).stderr)
    cluster.wait_state(running, "PENDING", min_restarts=1)
    save("requeued_pending.txt", job_text(running))
    cluster.scontrol("update", f"JobId={running}", "ExcNodeList=n1,n2")
    save("excluded_pending.txt", job_text(running))
    cluster.command(["scancel", str(running), str(pending)])

    fixed = cluster.sbatch("sleep 30\n", "--no-requeue", "-o", f"{work}/f-%j.out")
    cluster.wait_state(fixed, "RUNNING")
    save("not_requeueable.stderr", cluster.scontrol("requeue", str(fixed), check=False).stderr)
    cluster.command(["scancel", str(fixed)])
    save("cancelled.txt", _wait_text(cluster, fixed, "CANCELLED", 0))

    save("completed.txt", _finished_text(cluster, "echo ok\n", "-o", f"{work}/c-%j.out"))
    save("failed.txt", _finished_text(cluster, "exit 3\n", "-o", f"{work}/e-%j.out"))
    save("signaled.txt", _finished_text(cluster, "kill -SEGV $$\n", "-o", f"{work}/s-%j.out"))
    cluster.wait_finished(time_limited, timeout=150)
    save("timeout.txt", cluster.job_text(time_limited) or "")
    array = cluster.sbatch("sleep 1\n", "--array=1-2", "-o", f"{work}/a-%A_%a.out")
    cluster.wait_idle()
    save("array.txt", job_text(array))


def _wait_text(cluster: slurm_cluster.Cluster, job: int, state: str, restarts: int) -> str:
    cluster.wait_state(job, state, timeout=90, min_restarts=restarts)
    return cluster.job_text(job) or ""


def _finished_text(cluster: slurm_cluster.Cluster, script: str, *args: str, timeout: float = 60) -> str:
    job = cluster.sbatch(script, *args)
    cluster.wait_finished(job, timeout)
    return cluster.job_text(job) or ""


if __name__ == "__main__":
    sys.exit(main())
