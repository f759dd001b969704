"""The README's sbatch example, submitted as written on the two-node test cluster.

What is changed, and why: ``--gpus-per-node`` is dropped (the test cluster has no GPUs), the time
limit and the warning are shortened (``--time=3`` or ``--time=2``, ``--signal=B:USR1@90``) so a
warning comes in about 90 or 30 s instead of a day, ``$SCRATCH`` is the test's directory, and ``python train.py --lr 3e-4`` is
a training that really runs here. Everything else, the ``exec srun supervise run`` line included,
is the README's text: the layout that once let the USR1 kill the batch shell before any save.

* With the client, every requeue resumes from the save made at the warning, and the run completes.
* A script that cannot save (no checkpoints at all) is stopped after the requeues without progress
  the budget allows, with that budget named, never requeued forever.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

from helpers import REPO, events_named

pytestmark = pytest.mark.slurm
pytest.importorskip("torch")

PY = sys.executable
README = Path(REPO) / "README.md"


def readme_sbatch() -> str:
    text = README.read_text()
    section = text[text.index("## In an sbatch script"):]
    match = re.search(r"```bash\n(#!/bin/bash\n.*?)```", section, re.S)  # the script, not the init line
    assert match, "the README lost its sbatch example"
    return match.group(1)


def as_test_job(example: str, scratch: Path, command: str, env: dict[str, str], minutes: int = 2) -> str:
    """The example with only the changes the module docstring lists."""
    lines = []
    for line in example.splitlines():
        if line.startswith("#SBATCH"):
            line = line.replace(" --gpus-per-node=1", "").replace("--time=1-00:00:00", f"--time={minutes}")
            line = line.replace("--signal=B:USR1@120", "--signal=B:USR1@90")
        lines.append(line)
    body = "\n".join(lines)
    assert "exec srun supervise run" in body and "python train.py --lr 3e-4" in body
    body = body.replace("python train.py --lr 3e-4", command)
    exports = "".join(f"export {k}={v}\n" for k, v in {"SCRATCH": str(scratch), "PYTHONPATH": REPO,
                                                         "PYTHONUNBUFFERED": "1", **env}.items())
    head, _, rest = body.partition("\n\n")  # after the #SBATCH header: sbatch reads it only at the top
    return f"{head}\n\n{exports}echo \"JOB RUN restart=${{SLURM_RESTART_COUNT:-0}}\"\n{rest}\n"


def job_output(scratch: Path, most: int = 4000) -> str:
    """The tail of the job's own output files (``%x-%j.out``): what to read when the run left no log."""
    return "\n".join(f"--- {f.name}:\n{f.read_text(errors='replace')[-most:]}" for f in sorted(scratch.glob("*.out")))


def assert_run_logged(run_dir: Path, scratch: Path, info) -> None:
    assert (run_dir / "supervisor" / "events.jsonl").exists(), \
        f"the job ended but the supervisor left no event log: {info}\n{job_output(scratch)}"


def wait_finished(cluster, job: int, timeout: float, run_dir: Path | None = None):
    """The job's record once it has ended for good (a requeue passes through pending states, and
    a requeued job waits out a BeginTime: the same final state twice, 15 s apart). A job still running
    at the timeout is shown with each attempt's resume step and last step, so that a failure says
    whether the job was moving (a heavily loaded machine) or stuck."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        info = cluster.job(job)
        if info is not None and info.is_finished:
            time.sleep(15)
            again = cluster.job(job)
            if again is not None and again.is_finished and again.restarts == info.restarts:
                return again
        time.sleep(1)
    moved = ""
    if run_dir is not None and (run_dir / "supervisor" / "events.jsonl").exists():
        ends = {e["attempt"]: e.get("last_step") for e in events_named(run_dir, "attempt_end")}
        moved = "; attempts (resume step, last step): " + ", ".join(
            f"{e['attempt']}: ({e.get('resume_step')}, {ends.get(e['attempt'])})"
            for e in events_named(run_dir, "attempt_start"))
    raise AssertionError(f"job {job} did not end in {timeout:.0f} s: {cluster.job(job)}{moved}")


def test_readme_example_saves_at_the_warning_and_every_requeue_resumes_from_it(slurm_cluster, slurm_job_dir):
    scratch = slurm_job_dir
    plain = Path(REPO) / "examples" / "train_plain.py"
    # Runs of about 90 s (3 min, the warning 90 s before the end): with 30 s runs, a heavily loaded
    # machine spent most of each run starting up, and the job was requeued 14 times in 420 s.
    script = as_test_job(readme_sbatch(), scratch, f"{PY} {plain} --steps 2000 --step-time 0.05 --save-every 1500",
                         {"PATH": f"{Path(PY).parent}:$PATH"}, minutes=3)
    job = slurm_cluster.sbatch(script, "-D", str(scratch))
    run_dir = scratch / "runs" / "exp1"
    info = wait_finished(slurm_cluster, job, timeout=420, run_dir=run_dir)
    assert_run_logged(run_dir, scratch, info)
    ends = [e["outcome"] for e in events_named(run_dir, "run_end")]
    assert ends[-1] == "complete" and "requeue" in ends, (ends, info)
    notices = events_named(run_dir, "notice")
    assert notices and all(n["signal"] == "USR1" and n["class"] == "time_limit" for n in notices), notices
    starts = {e["attempt"]: e for e in events_named(run_dir, "attempt_start")}
    saves = events_named(run_dir, "save_end")
    for end in events_named(run_dir, "attempt_end"):
        if end["class"] != "time_limit":
            continue
        begun = starts.get(end["attempt"], {}).get("resume_step") or 0
        if end.get("last_step") is None or end["last_step"] <= begun:
            continue  # the warning came while the training was still starting: nothing new to save
        at_warning = [s for s in saves if s["attempt"] == end["attempt"] and s["ok"]]
        assert at_warning, f"attempt {end['attempt']} made no save at the warning"
        nxt = starts.get(end["attempt"] + 1)
        assert nxt is not None and nxt["resume_step"] == at_warning[-1]["step"], (nxt, at_warning[-1])
    assert info.state == "COMPLETED", info


def test_readme_example_without_saves_is_stopped_by_the_requeue_budget(slurm_cluster, slurm_job_dir):
    scratch = slurm_job_dir
    zero = Path(REPO) / "examples" / "train_zero_code.py"
    script = as_test_job(readme_sbatch(), scratch,
                         f"{PY} {zero} --steps 100000 --save-every 1000000 --step-time 0.05",
                         {"PATH": f"{Path(PY).parent}:$PATH", "SUPERVISE_BUDGET__MAX_REQUEUES_WITHOUT_PROGRESS": "1"})
    job = slurm_cluster.sbatch(script, "-D", str(scratch))
    info = wait_finished(slurm_cluster, job, timeout=420)
    run_dir = scratch / "runs" / "exp1"
    assert_run_logged(run_dir, scratch, info)
    ends = events_named(run_dir, "run_end")
    assert [e["outcome"] for e in ends] == ["requeue", "stopped"], ends
    assert ends[-1]["stopped_by"] == "max_requeues_without_progress", ends[-1]
    assert info.restarts == 1, info
