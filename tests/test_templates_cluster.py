"""Every sbatch template of sbatch_templates/, written by ``supervise init`` (the command a user
runs, not a Python call) and submitted to the real throwaway Slurm cluster (tests/slurm_cluster.py:
nodes n1 and n2, 2 CPUs each; partition ``extra`` preempted by ``own``). Each must run its training
under the supervisor to a ``run_end`` of ``complete``; the preemptible and time-limit scripts must
resume after the preemption or the warning. tests/test_templates.py checks the rendering itself
(quoting, refused values) and tests/test_init_cmd.py the command's input handling, without Slurm.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from helpers import preempt_while_the_child_waits


REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
TRAIN_PLAIN = str(REPO / "examples" / "train_plain.py")
# The console script of this interpreter (what a user's venv has), else the one on PATH.
SUPERVISE_BIN = str(Path(PY).parent / "supervise") if (Path(PY).parent / "supervise").exists() \
    else shutil.which("supervise")
# A training stand-in for the multi-node layouts: every rank prints its steps (the zero-code regex reads them).
RANKS = ("import os, time\nrank = os.environ.get('SLURM_PROCID', '?')\n"
         "for i in range(1, 21):\n    print(f'step {i} rank {rank}', flush=True)\n    time.sleep(0.02)\n")


def render(name: str, job_dir: Path, command: list[str], *flags: str) -> Path:
    """The script ``supervise init`` writes for template ``name`` (flags as a user types them)."""
    path = job_dir / f"{name}.sbatch"
    argv = [PY, "-m", "supervisor", "init", "--template", name, "--job-name", name.replace("_", "-"),
            "--partition", "extra", "--time", "10", "--run-dir", str(job_dir / "run"),
            "--var", f"output={job_dir / '%x-%j.out'}", "--supervise", SUPERVISE_BIN, *flags,
            "-o", str(path), "--", *command]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and path.is_file(), proc.stderr
    return path


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


def run_ends(run_dir: Path) -> list[dict]:
    return [e for e in events(run_dir) if e["event"] == "run_end"]


def wait_for_save(run_dir: Path, cluster, job_id: int, timeout: float = 120.0) -> dict:
    """Until the training has written a checkpoint (so a stop now has something to resume from)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        saves = [e for e in events(run_dir) if e["event"] == "save_end" and e.get("ok")]
        if saves:
            return saves[0]
        info = cluster.job(job_id)
        assert info is None or not info.is_finished, f"job {job_id} ended {info.state} before any checkpoint"
        time.sleep(0.2)
    raise AssertionError(f"no checkpoint in {run_dir} after {timeout:.0f}s")


def assert_resumed_after_requeue(run_dir: Path, job_id: int) -> None:
    """Two runs of the same job id: the second resumed from the first one's checkpoint."""
    starts = [e for e in events(run_dir) if e["event"] == "attempt_start"]
    assert [(s["job_id"], s["restart_count"]) for s in starts] == [(str(job_id), 0), (str(job_id), 1)], starts
    assert starts[1]["resume_step"] and starts[1]["resume_step"] >= 10
    resumed = [e for e in events(run_dir) if e["event"] == "resumed" and e["attempt"] == starts[1]["attempt"]]
    assert resumed and resumed[0]["ok"] and resumed[0]["step"] == starts[1]["resume_step"]
    ends = run_ends(run_dir)
    assert [e["outcome"] for e in ends] == ["requeue", "complete"], ends


def test_single_node_template_runs_the_training_to_completion(slurm_cluster, slurm_job_dir):
    script = render("single_node", slurm_job_dir,
                    [PY, TRAIN_PLAIN, "--steps", "20", "--step-time", "0.02", "--save-every", "10"])
    result = slurm_cluster.run_job(script, timeout=150)
    assert result.info.state == "COMPLETED", result.output
    assert "training complete at step 20" in result.output
    assert [e["outcome"] for e in run_ends(slurm_job_dir / "run")] == ["complete"]


def test_multi_node_template_one_supervisor_runs_ranks_on_both_nodes(slurm_cluster, slurm_job_dir):
    script = render("multi_node", slurm_job_dir, [PY, "-c", RANKS], "--nodes", "2",
                    "--var", "ntasks_per_node=1", "--var", "poll_interval=2")
    result = slurm_cluster.run_job(script, timeout=90)
    assert result.info.state == "COMPLETED", result.output
    assert result.info.node_names == ("n1", "n2")
    assert "step 20 rank 0" in result.output and "step 20 rank 1" in result.output
    log = events(slurm_job_dir / "run")
    assert [e["outcome"] for e in log if e["event"] == "run_end"] == ["complete"]
    assert [e["last_step"] for e in log if e["event"] == "attempt_end"] == [20]


def test_multi_node_per_node_template_runs_one_supervisor_per_node(slurm_cluster, slurm_job_dir):
    script = render("multi_node_per_node", slurm_job_dir, [PY, "-c", RANKS], "--nodes", "2")
    result = slurm_cluster.run_job(script, timeout=90)
    assert result.info.state == "COMPLETED", result.output
    for node in (0, 1):
        run_dir = slurm_job_dir / "run" / f"node-{node}"
        assert [e["outcome"] for e in run_ends(run_dir)] == ["complete"], node
        job_ids = {e.get("job_id") for e in events(run_dir) if e["event"] == "run_start"}
        assert job_ids == {str(result.job_id)}
    assert (slurm_job_dir / "run" / "checkpoints").is_dir()  # one checkpoint dir shared by the nodes


def test_preemptible_template_is_requeued_after_preemption_and_resumes(slurm_cluster, slurm_job_dir):
    run_dir = slurm_job_dir / "run"
    script = render("preemptible", slurm_job_dir,
                    [PY, TRAIN_PLAIN, "--steps", "60", "--step-time", "0.05", "--save-every", "10"])
    job_id = slurm_cluster.sbatch(script)
    wait_for_save(run_dir, slurm_cluster, job_id)
    node = slurm_cluster.job(job_id).node_names[0]
    preempt_while_the_child_waits(slurm_cluster, node, run_dir)
    final = slurm_cluster.wait_state(job_id, "COMPLETED", timeout=180, min_restarts=1)

    assert final.restarts == 1
    output = Path(final.std_out).read_text()
    # --open-mode=append: both runs of the job id are in one file, in order.
    assert_in_order(output, f"job {job_id} run 1 ", "stop notice", f"job {job_id} run 2 ",
                    "training complete at step 60")
    assert_resumed_after_requeue(run_dir, job_id)


def assert_in_order(text: str, *parts: str) -> None:
    """Each part found after the one before it; on failure the text is shown, not only an index."""
    at = 0
    for part in parts:
        found = text.find(part, at)
        assert found >= 0, f"{part!r} not found after offset {at} of the job's output:\n{text[-6000:]}"
        at = found + len(part)


def test_time_limit_template_checkpoints_and_requeues_on_the_warning_signal(slurm_cluster, slurm_job_dir):
    """The time-limit warning is simulated: a real one needs a job of at least a minute (Slurm's
    time limits are whole minutes and the warning may come up to 60 s early), so the test sends the
    warning signal itself, exactly as ``--signal=B:USR1@N`` does: ``scancel --batch --signal=USR1``
    to the batch shell, which is ``srun`` after the template's ``exec``, and srun forwards it to the
    step. The job is submitted through ``supervise submit``, which must follow the requeue (same job
    id, Restarts=1) instead of submitting a second job."""
    run_dir = slurm_job_dir / "run"
    script = render("time_limit", slurm_job_dir,
                    [PY, TRAIN_PLAIN, "--steps", "60", "--step-time", "0.05", "--save-every", "10"])
    env = {k: v for k, v in slurm_cluster.env.items() if not k.startswith(("SUPERVISE_", "SUPERVISOR_"))}
    proc = subprocess.Popen([PY, "-m", "supervisor", "submit", str(script), "--poll", "0.5", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=slurm_job_dir)
    try:
        ledger = run_dir / "supervisor" / "submissions.jsonl"
        deadline = time.monotonic() + 60
        while not ledger.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        job_id = json.loads(ledger.read_text().splitlines()[0])["job_id"]
        wait_for_save(run_dir, slurm_cluster, job_id)
        slurm_cluster.command(["scancel", "--batch", "--signal=USR1", str(job_id)])
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    result = json.loads(out)
    assert result["outcome"] == "complete"
    assert [(s["job_id"], s["restarts"], s["final_state"]) for s in result["submissions"]] == [
        (job_id, 1, "COMPLETED")]
    assert len(ledger.read_text().splitlines()) == 1
    notices = [e for e in events(run_dir) if e["event"] == "notice"]
    assert notices[0]["class"] == "time_limit" and notices[0]["signal"] == "USR1"
    requeues = [e for e in events(run_dir) if e["event"] == "requeue" and e.get("how") == "scontrol"]
    assert requeues and requeues[-1]["ok"] is True
    assert_resumed_after_requeue(run_dir, job_id)
    assert "was requeued (restart 1): following it" in err
