"""The three ways people launch the supervisor, each end to end with real processes (issue 2):

1. locally, no Slurm: ``supervise run -- python train.py``;
2. one supervisor per task inside a job: ``srun supervise run -- python train.py``;
3. one supervisor around a multi-node step: ``supervise run -- srun -N2 -n2 python train.py``.

Modes 2 and 3 run on the throwaway two-node cluster (tests/slurm_cluster.py: slurmd ``n1`` and
``n2`` on this host). Crashes are real SIGSEGVs (a NULL read through ctypes).
"""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from pathlib import Path

import pytest


from helpers import EXAMPLES, REPO, events_named, read_events, run_supervise

pytest.importorskip("torch")
PY = sys.executable
PLAIN = str(EXAMPLES / "train_plain.py")


def supervise_exe() -> str:
    """The ``supervise`` console script of this interpreter (what an sbatch script calls)."""
    beside = Path(PY).with_name("supervise")
    if beside.is_file():
        return str(beside)
    found = shutil.which("supervise")
    return found if found else f"{PY} -m supervisor"


PROBE_ON = {"SUPERVISE_PROBE_SOFTWARE": "true"}  # the software probe, off elsewhere in the tests (conftest.py)


def job_preamble() -> str:
    """The job's python must import this checkout (sbatch --export=ALL is the default)."""
    return f"#!/bin/bash\nexport PYTHONPATH={REPO}:$PYTHONPATH\nexport PYTHONUNBUFFERED=1\ncd {REPO}\n"


# ------------------------------------------------------------------------------------ 1. local


def test_local_run_completes_with_valid_checkpoints_and_a_manifest_of_the_childs_torch(tmp_path: Path) -> None:
    import torch

    run_dir = tmp_path / "run"
    res = run_supervise(["run", "--run-dir", str(run_dir), "--", PY, PLAIN, "--steps", "20"], env=PROBE_ON)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "training complete at step 20" in res.stdout
    end = events_named(run_dir, "run_end")
    assert [e["outcome"] for e in end] == ["complete"]

    ckpt_dir = run_dir / "checkpoints"
    verify = run_supervise(["verify", "--json", str(ckpt_dir)])
    assert verify.returncode == 0, verify.stdout + verify.stderr
    reports = json.loads(verify.stdout)
    steps = sorted(r["step"] for r in reports if r["step"] is not None)
    assert all(r["ok"] for r in reports) and steps[-1] == 20 and 10 in steps, reports

    manifest = run_dir / "supervisor" / "manifest-1.json"
    assert manifest.exists(), "the supervisor exited without writing manifest-1.json"
    data = json.loads(manifest.read_text())
    assert data["software"]["torch"] == torch.__version__  # probed in the child's interpreter
    assert data["attempt"] == 1


def test_an_attempt_that_ends_before_the_provenance_probe_still_gets_its_manifest(tmp_path: Path) -> None:
    """A child that dies at once (an ImportError after a torch upgrade) is exactly the attempt whose
    provenance a post-mortem needs; the supervisor must not exit before the manifest is written."""
    import torch

    run_dir = tmp_path / "run"
    res = run_supervise(["run", "--run-dir", str(run_dir), "--", PY, "-c", "print('done at once')"], env=PROBE_ON)
    assert res.returncode == 0, res.stderr[-3000:]
    manifest = run_dir / "supervisor" / "manifest-1.json"
    assert manifest.exists(), "the supervisor exited without writing manifest-1.json"
    assert json.loads(manifest.read_text())["software"]["torch"] == torch.__version__


# ------------------------------------------------------------------------------------ 2. srun supervise run


def test_srun_supervise_run_restarts_a_native_crash_inside_the_job(slurm_cluster, slurm_job_dir: Path) -> None:
    run_dir = slurm_job_dir / "run"
    script = job_preamble() + textwrap.dedent(f"""\
        export FAULT_SEGFAULT_AT=15
        srun -n1 --cpus-per-task=1 {supervise_exe()} run --run-dir {run_dir} \\
            --set policy.native_crash.backoff=0.1 -- {PY} {PLAIN} --steps 30 --save-every 10
        echo "SUPERVISE EXIT $?"
    """)
    result = slurm_cluster.run_job(script, "-p", "extra", "-N1", "-n1", "-o", f"{slurm_job_dir}/job-%j.out",
                                   timeout=150)
    assert result.info.state == "COMPLETED", result.output[-4000:]
    assert "SUPERVISE EXIT 0" in result.output, result.output[-4000:]

    starts = events_named(run_dir, "attempt_start")
    assert [s["attempt"] for s in starts] == [1, 2]
    assert all(s["job_id"] == str(result.job_id) for s in starts), starts
    ends = events_named(run_dir, "attempt_end")
    assert [e["class"] for e in ends] == ["native_crash", "completed"]
    assert events_named(run_dir, "failure")[0]["signal"] == "SIGSEGV"
    assert [d["action"] for d in events_named(run_dir, "decision")] == ["restart"]
    assert starts[1]["resume_step"] == 10 and starts[1]["resume_path"].endswith("step=10.ckpt")
    assert "at step 10" in (run_dir / "supervisor" / "attempt-2.log").read_text()
    assert [e["outcome"] for e in events_named(run_dir, "run_end")] == ["complete"]


# ------------------------------------------------------------------------------------ 3. supervise run -- srun -N2


PROBE = textwrap.dedent("""\
    import ctypes, os, sys, time
    from supervisor import client

    rank = int(os.environ["SLURM_PROCID"])
    node = os.environ["SLURMD_NODENAME"]
    attempt = client.attempt()
    print(f"PROBE rank={rank} node={node} attempt={attempt} channel={client.enabled()}", flush=True)
    # A restarted attempt picks up from its own save of step 10 (kept outside the watched checkpoint
    # directory, so the supervisor cannot hand it over: the probe says where it resumed instead).
    start = 0 if attempt == 1 else 10
    if start and rank == 0:
        client.resumed(start)
    for step in range(start + 1, start + 11):
        client.heartbeat(step)  # rank 0 owns the step; rank 1 proves it is alive
        time.sleep(0.02)
    # A save report names the rank and node, so the event log shows whose datagram arrived.
    marker = os.path.join(os.environ["SUPERVISOR_RUN_DIR"], f"probe-rank{rank}-{node}.txt")
    with client.saving(start + 10, marker):
        with open(marker, "w") as fh:
            fh.write(node)
    if os.environ.get("PROBE_CRASH") == "1" and attempt == 1:
        if rank == 1:
            time.sleep(0.5)
            print(f"PROBE rank=1 segfaults on {node}", flush=True)
            ctypes.string_at(0)
        time.sleep(60)  # rank 0 waits to be killed by srun (--kill-on-bad-exit)
    if rank == 0:
        client.done(start + 10)
    print(f"PROBE rank={rank} done", flush=True)
""")


def _multi_node_job(slurm_cluster, job_dir: Path, crash: bool):
    run_dir = job_dir / "run"
    probe = job_dir / "probe.py"
    probe.write_text(PROBE)
    script = job_preamble() + textwrap.dedent(f"""\
        export PROBE_CRASH={int(crash)}
        {supervise_exe()} run --run-dir {run_dir} --set policy.native_crash.backoff=0.1 \\
            -- srun -N2 -n2 --cpus-per-task=1 --kill-on-bad-exit=1 {PY} {probe}
        echo "SUPERVISE EXIT $?"
    """)
    result = slurm_cluster.run_job(script, "-p", "extra", "-N2", "-n2", "-o", f"{job_dir}/job-%j.out",
                                   timeout=150)
    return run_dir, result


def _probe_nodes(output: str) -> dict[int, str]:
    nodes = {}
    for line in output.splitlines():
        if line.startswith("PROBE rank=") and " node=" in line:
            fields = dict(part.split("=", 1) for part in line.split()[1:] if "=" in part)
            nodes[int(fields["rank"])] = fields["node"]
    return nodes


def test_supervise_run_around_srun_hears_every_task_on_both_nodes(slurm_cluster, slurm_job_dir: Path) -> None:
    run_dir, result = _multi_node_job(slurm_cluster, slurm_job_dir, crash=False)
    assert result.info.state == "COMPLETED", result.output[-4000:]
    assert "SUPERVISE EXIT 0" in result.output, result.output[-4000:]
    nodes = _probe_nodes(result.output)
    assert sorted(nodes) == [0, 1] and set(nodes.values()) == {"n1", "n2"}, result.output[-3000:]
    assert "channel=True" in result.output  # the tasks found SUPERVISOR_CONTROL through srun

    start = events_named(run_dir, "attempt_start")[0]
    assert start["job_id"] == str(result.job_id)
    assert start["nodes"] == ["n1", "n2"]  # the job's nodes, expanded from its hostlist
    saved = {Path(e["path"]).name for e in events_named(run_dir, "save_end") if e["source"] == "client"}
    assert saved == {f"probe-rank{r}-{n}.txt" for r, n in nodes.items()}  # a datagram from each task
    end = events_named(run_dir, "attempt_end")[0]
    assert end["class"] == "completed" and end["last_step"] == 10  # rank 0's heartbeats
    assert [e["outcome"] for e in events_named(run_dir, "run_end")] == ["complete"]


def test_segfault_of_one_task_is_the_first_failure_even_after_srun_kills_the_other(
        slurm_cluster, slurm_job_dir: Path) -> None:
    run_dir, result = _multi_node_job(slurm_cluster, slurm_job_dir, crash=True)
    assert result.info.state == "COMPLETED", result.output[-4000:]
    assert "SUPERVISE EXIT 0" in result.output, result.output[-4000:]
    nodes = _probe_nodes(result.output)
    log1 = (run_dir / "supervisor" / "attempt-1.log").read_text()
    assert "PROBE rank=1 segfaults" in log1
    # srun's own last word is the kill of task 0, and srun exits with that kill's status.
    assert "task 0: Terminated" in log1 or "task 0: Killed" in log1, log1

    ends = events_named(run_dir, "attempt_end")
    assert [e["class"] for e in ends] == ["native_crash", "completed"], ends
    failure = events_named(run_dir, "failure")[0]
    assert failure["class"] == "native_crash"
    assert failure["rank"] == 1 and failure["node"] == nodes[1], failure  # task 1 failed first
    assert ends[0]["exit_code"] in (137, 139, 143), ends[0]
    assert any("task 1" in line for line in failure["evidence"]), failure["evidence"]
    assert [d["action"] for d in events_named(run_dir, "decision")] == ["restart"]
    assert [e["outcome"] for e in events_named(run_dir, "run_end")] == ["complete"]
    assert len([e for e in read_events(run_dir) if e["event"] == "attempt_start"]) == 2


def test_budgets_and_the_resume_audit_hold_inside_a_slurm_job(slurm_cluster, slurm_job_dir: Path) -> None:
    """Issue 4 under real Slurm: a crash loop is stopped by its budget, and a child that ignores
    its resume point is caught, with `srun supervise run` inside a job (not only locally)."""
    loop_dir, audit_dir = slurm_job_dir / "loop", slurm_job_dir / "audit"
    sup = supervise_exe()
    fast = "--set policy.native_crash.backoff=0.1 --set policy.native_crash.retries=10"
    script = job_preamble() + textwrap.dedent(f"""\
        FAULT_SEGFAULT_AT=12 FAULT_ATTEMPT=all srun --cpus-per-task=1 {sup} run --run-dir {loop_dir} {fast} \\
            --set budget.same_failure_limit=2 -- {PY} {PLAIN} --steps 40
        echo "LOOP EXIT $?"
        srun --cpus-per-task=1 {sup} run --run-dir {audit_dir} -- {PY} {PLAIN} --steps 20
        echo "FIRST EXIT $?"
        FAULT_RESTART_FROM_ZERO=1 FAULT_ATTEMPT=2 srun --cpus-per-task=1 {sup} run --run-dir {audit_dir} \\
            -- {PY} {PLAIN} --steps 40
        echo "AUDIT EXIT $?"
        """)
    result = slurm_cluster.run_job(script, "-p", "extra", "-N1", "-w", "n2", "-o",
                                   f"{slurm_job_dir}/budget-%j.out", timeout=240)
    out = result.output
    assert "LOOP EXIT 4" in out and "FIRST EXIT 0" in out and "AUDIT EXIT 4" in out, out[-4000:]
    loop_end = events_named(loop_dir, "run_end")[-1]
    assert loop_end["outcome"] == "stopped" and "same_failure_limit" in loop_end["reason"]
    assert all(str(s["job_id"]) == str(result.job_id) for s in events_named(loop_dir, "attempt_start"))
    mismatch = events_named(audit_dir, "resume_mismatch")[0]
    assert mismatch["expected_step"] == 20 and mismatch["got_step"] in (0, 1)
