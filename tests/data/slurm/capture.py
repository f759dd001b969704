"""Re-capture the literal Slurm outputs in this directory from a real cluster (the throwaway one).

    python tests/data/slurm/capture.py [--dir OUT]

Run it on another Slurm release to add that release's outputs (OUT: a new subdirectory); the parser
tests read every *.txt here. Takes about two minutes (a one-minute time limit runs alongside).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # tests/, for slurm_cluster

import slurm_cluster  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", type=Path, default=HERE)
    out: Path = parser.parse_args().dir
    out.mkdir(parents=True, exist_ok=True)
    cluster = slurm_cluster.start_cluster(grace_time=5)
    try:
        capture(cluster, out)
    finally:
        cluster.stop()
    return 0


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
