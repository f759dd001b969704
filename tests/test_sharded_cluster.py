"""Sharded DCP checkpoints on the real two-node test cluster (tests/slurm_cluster.py): two ranks, one
per node, each writing its shards into the shared checkpoint directory, preempted while a save is
in flight.

Layout (a) of sbatch_templates/ (one supervisor in the batch step; the ranks are an ``srun`` step
it starts): ``supervise run -- srun --kill-on-bad-exit=1 bash ranks.sh examples/train_fsdp.py``.
Every save takes 5 s more on every rank (``--save-seconds``, a slow filesystem), so the
preemption lands mid-save; the grace (25 s) leaves room for it. What must happen: the supervisor
lets the save finish (it was reported by rank 0 once both ranks were done), stops the training at
that step, requeues; the requeued job resumes from that save, the newest complete checkpoint, with
0 steps lost; every directory left is committed by both ranks and validates.
"""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO, events_named

pytest.importorskip("torch")
PY = sys.executable
FSDP = REPO / "examples" / "train_fsdp.py"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rank_wrapper(job_dir: Path, port: int) -> Path:
    """srun starts one task per node; torch.distributed's env:// wants RANK, WORLD_SIZE and a
    master. Both test nodes live on this host, so the master is 127.0.0.1. A requeued run takes
    the next port (the previous run's may linger in TIME_WAIT)."""
    path = job_dir / "ranks.sh"
    path.write_text(f"""#!/bin/bash
export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=0 MASTER_ADDR=127.0.0.1
export MASTER_PORT=$(( {port} + ${{SLURM_RESTART_COUNT:-0}} ))
exec {PY} {FSDP} "$@"
""")
    return path


def job_script(run_dir: Path, wrapper: Path, args: str) -> str:
    return f"""#!/bin/bash
export PYTHONPATH={REPO}
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
echo "JOB RUN restart=${{SLURM_RESTART_COUNT:-0}}"
{PY} -m supervisor run --run-dir {run_dir} --set preemption.margin=2 --set preemption.poll_interval=1 -- \\
    srun --kill-on-bad-exit=1 --cpus-per-task=1 bash {wrapper} {args}
echo "SUPERVISE EXIT $?"
"""


def events(run_dir: Path, name: str) -> list[dict]:
    try:
        return events_named(run_dir, name)
    except OSError:
        return []


def wait_until(predicate, timeout: float, what: str, cluster=None, job: int | None = None) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.1)
    seen = f"; job: {cluster.job(job)}" if cluster is not None and job is not None else ""
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{seen}")


def test_two_ranks_on_two_nodes_preempted_mid_save_resume_from_that_save_with_nothing_lost(
        slurm_cluster, slurm_job_dir):
    from supervisor import sharded
    from supervisor.checkpoints import validate_checkpoint
    from supervisor.states import Verdict

    run_dir = slurm_job_dir / "run"
    ckpt = run_dir / "checkpoints"
    wrapper = rank_wrapper(slurm_job_dir, free_port())
    args = "--steps 40 --step-time 0.2 --save-every 10 --save-seconds 5"
    with slurm_cluster.grace(25):
        job = slurm_cluster.sbatch(job_script(run_dir, wrapper, args), "-p", "extra", "-N2", "--ntasks-per-node=1",
                                   "--exclusive", "--requeue", "--open-mode=append", "--time=8", "-J", "dcp2",
                                   "-o", f"{slurm_job_dir}/dcp2-%j.out")
        # One save measured first (the supervisor learns how long saves take), then preempt as
        # the second one begins: both ranks are writing their shards.
        wait_until(lambda: any(e.get("step") == 20 for e in events(run_dir, "save_begin")), 240,
                   "the save of step 20", slurm_cluster, job)
        slurm_cluster.preempt("n2")
        final = slurm_cluster.wait_state(job, "COMPLETED", timeout=300, min_restarts=1)

    assert final.restarts == 1 and final.node_names == ("n1", "n2"), final
    arbitration = events(run_dir, "arbitration")[0]
    assert arbitration["decision"] == "block", arbitration["reason"]
    first = {e["step"]: e for e in events(run_dir, "save_end") if e["attempt"] == 1}
    assert first[20]["ok"] and Path(first[20]["path"]).name == "step-20", "the save in flight did not land"
    ends = events(run_dir, "attempt_end")
    assert ends[0]["last_step"] == 20 and ends[0]["steps_lost"] == 0, ends[0]
    resume = events(run_dir, "resume_point")[1]
    assert Path(resume["path"]).name == "step-20" and resume["step"] == 20, resume
    assert [e["step"] for e in events(run_dir, "resumed") if e["attempt"] == 2] == [20]
    # Requeued once (by the supervisor on 22.05-23.11, by Slurm itself from 24.05 on), then complete.
    assert [e["outcome"] for e in events(run_dir, "run_end")] == ["requeue", "complete"]

    left = sorted(p.name for p in ckpt.iterdir())
    assert not [n for n in left if sharded.parse_staging_name(n) or sharded.parse_aside_name(n)], left
    for name in (n for n in left if n.startswith("step-")):
        marker = sharded.read_marker(ckpt / name)
        assert marker is not None and marker["world_size"] == 2, name
        assert {"__0_0.distcp", "__1_0.distcp"} <= set(marker["files"]), marker["files"]
        report = validate_checkpoint(ckpt / name, deep=True)
        assert report.verdict is Verdict.VALID and report.level == 4, (name, report.reason)
    assert "step-40" in left
