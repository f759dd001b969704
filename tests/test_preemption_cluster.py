"""Preemption on the real test cluster (Slurm 22.05, partition `extra` preempted by `own`):
grace-aware save arbitration, the explicit requeue, and the resume that follows.

The victim runs `srun supervise run -- python <child>`; a job on `own` preempts it at a chosen
moment (before, during, after a save). Children are real trainings whose saves take a controlled
time (tests/children/): a stand-in for a slow filesystem, so the notice lands where we want it.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

from helpers import REPO, events_named, run_supervise

pytest.importorskip("torch")
PY = sys.executable
CHILDREN = Path(__file__).resolve().parent / "children"


def victim_script(run_dir: Path, child_args: str, sets: str = "") -> str:
    return f"""#!/bin/bash
export PYTHONPATH={REPO}
echo "JOB RUN restart=${{SLURM_RESTART_COUNT:-0}}"
srun --cpus-per-task=1 {PY} -m supervisor run --run-dir {run_dir} --set preemption.margin=2 {sets} -- {child_args}
echo "SUPERVISE EXIT $?"
"""


def submit_victim(cluster, job_dir: Path, node: str, script: str) -> int:
    return cluster.sbatch(script, "-p", "extra", "-N1", "--exclusive", "-w", node, "--requeue",
                          "--open-mode=append", "-J", "victim", "-o", f"{job_dir}/victim-%j.out")


def wait_until(predicate, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def log_has(run_dir: Path, needle: str, attempt: int = 1) -> bool:
    log = run_dir / "supervisor" / f"attempt-{attempt}.log"
    try:
        return needle in log.read_text(errors="replace")
    except OSError:
        return False


def event_seen(run_dir: Path, name: str, **match) -> bool:
    try:
        return any(all(e.get(k) == v for k, v in match.items()) for e in events_named(run_dir, name))
    except OSError:
        return False


def in_place_writes_seen(run_dir: Path, count: int) -> bool:
    """The supervisor has seen ``count`` in-place writes of last.ckpt begin in attempt 1: the
    moment a preemption lands mid-write as far as the supervisor can know (the child's own "writing"
    line can come well before its first byte on a loaded machine)."""
    try:
        return len([e for e in events_named(run_dir, "save_begin")
                    if e.get("attempt") == 1 and str(e.get("path", "")).endswith("/last.ckpt")]) >= count
    except OSError:
        return False


def resumed_step_from_child(run_dir: Path, attempt: int) -> int:
    """The child's own report of where it resumed (not the supervisor's opinion)."""
    text = (run_dir / "supervisor" / f"attempt-{attempt}.log").read_text()
    found = re.search(r"resumed from \S+ at step (\d+)", text)
    assert found, f"attempt {attempt} did not report a resume:\n{text[:2000]}"
    return int(found.group(1))


def verify_all(ckpt_dir: Path) -> list[dict]:
    files = sorted(p for p in ckpt_dir.iterdir() if p.suffix == ".ckpt" and not p.name.startswith("CORRUPT_"))
    res = run_supervise(["verify", "--json", *map(str, files)])
    return json.loads(res.stdout)


def test_emergency_save_within_grace_then_requeue_resumes_at_the_saved_step(slurm_cluster, slurm_job_dir):
    run_dir = slurm_job_dir / "run"
    child = f"{PY} {CHILDREN / 'slow_saver.py'} --steps 80 --step-time 0.1 --save-every 20 --save-seconds 0.5"
    with slurm_cluster.grace(10):
        job = submit_victim(slurm_cluster, slurm_job_dir, "n1", victim_script(run_dir, child))
        # One save measured (step 20); the next is due at step 40, ~1.5 s after step 24: the notice
        # (0.3-1 s after the preempting job is submitted) lands between saves.
        wait_until(lambda: log_has(run_dir, "step 24\n"), 90, "step 24")
        slurm_cluster.preempt("n1")
        final = slurm_cluster.wait_state(job, "COMPLETED", timeout=150, min_restarts=1)
    assert final.restarts == 1
    arbitration = events_named(run_dir, "arbitration")[0]
    assert arbitration["decision"] == "emergency_save", arbitration["reason"]
    notice_at = events_named(run_dir, "notice")[0]["ts"]
    emergency = [s for s in events_named(run_dir, "save_end") if s["ts"] > notice_at and s["attempt"] == 1]
    assert emergency and emergency[0]["ok"], "no emergency save after the notice"
    saved_step = emergency[0]["step"]
    assert events_named(run_dir, "attempt_end")[0]["steps_lost"] == 0
    requeue = [r for r in events_named(run_dir, "requeue") if r.get("how") == "scontrol"]
    if slurm_cluster.version.requeues_on_exit_during_grace and not requeue:
        # 24.05+: Slurm requeues a job that exits during its grace; the supervisor may leave it to Slurm.
        requeue = [dict(r, ok=True) for r in events_named(run_dir, "requeue") if r.get("how") == "slurm_will"]
    assert requeue and requeue[-1].get("ok") is True
    assert resumed_step_from_child(run_dir, 2) == saved_step  # exactly the saved step, no step lost
    assert events_named(run_dir, "run_end")[-1]["outcome"] == "complete"
    assert all(r["ok"] for r in verify_all(run_dir / "checkpoints"))


def test_preempted_mid_save_that_fits_blocks_until_the_save_lands(slurm_cluster, slurm_job_dir):
    run_dir = slurm_job_dir / "run"
    child = f"{PY} {CHILDREN / 'slow_saver.py'} --steps 50 --step-time 0.1 --save-every 10 --save-seconds 2.5"
    with slurm_cluster.grace(12):
        job = submit_victim(slurm_cluster, slurm_job_dir, "n2", victim_script(run_dir, child))
        # One full save first (history), then preempt as the second save begins.
        wait_until(lambda: event_seen(run_dir, "save_begin", step=20), 120, "the save of step 20")
        slurm_cluster.preempt("n2")
        final = slurm_cluster.wait_state(job, "COMPLETED", timeout=150, min_restarts=1)
    assert final.restarts == 1
    arbitration = events_named(run_dir, "arbitration")[0]
    assert arbitration["decision"] == "block", arbitration["reason"]
    saves = {s["step"]: s for s in events_named(run_dir, "save_end") if s["attempt"] == 1}
    assert saves[20]["ok"], "the in-flight save was not allowed to finish"
    assert resumed_step_from_child(run_dir, 2) >= 20
    assert events_named(run_dir, "run_end")[-1]["outcome"] == "complete"
    assert all(r["ok"] for r in verify_all(run_dir / "checkpoints"))


def test_preempted_mid_save_that_cannot_fit_is_aborted_and_the_previous_checkpoint_stays(
        slurm_cluster, slurm_job_dir):
    run_dir = slurm_job_dir / "run"
    # Saves take 10 s; the grace is 4 s: a save caught in flight cannot finish in time.
    child = f"{PY} {CHILDREN / 'slow_saver.py'} --steps 30 --step-time 0.1 --save-every 10 --save-seconds 10"
    with slurm_cluster.grace(4):
        job = submit_victim(slurm_cluster, slurm_job_dir, "n1", victim_script(run_dir, child))
        wait_until(lambda: event_seen(run_dir, "save_begin", step=20), 150, "the save of step 20")
        slurm_cluster.preempt("n1")
        wait_until(lambda: event_seen(run_dir, "run_end"), 60, "the supervisor to end")
        # The last word is an abort: at once when Slurm showed the deadline with the notice, or as
        # soon as it did (a notice can reach the step a moment before the job record shows it).
        arbitration = events_named(run_dir, "arbitration")[-1]
        assert arbitration["decision"] == "abort", arbitration["reason"]
        # Planned with the partition's GraceTime (read at start) or the record, never the 30 s default.
        notice = events_named(run_dir, "notice")[0]
        assert notice["deadline_source"] != "default_grace", notice["reason"]
        # Right after the abort, before the requeued job runs: nothing torn, step 10 intact.
        ckpt = run_dir / "checkpoints"
        assert not (ckpt / "step=20.ckpt").exists()
        assert not list(ckpt.glob(".step=20.ckpt.tmp-*")), "the aborted writer's temp file was left behind"
        assert all(r["ok"] for r in verify_all(ckpt))
        final = slurm_cluster.wait_state(job, "COMPLETED", timeout=180, min_restarts=1)
    assert events_named(run_dir, "save_aborted")
    assert final.restarts >= 1
    assert resumed_step_from_child(run_dir, 2) == 10
    assert events_named(run_dir, "run_end")[-1]["outcome"] == "complete"


def test_zero_code_child_torn_mid_write_is_quarantined_and_resumed_from_a_step_checkpoint(
        slurm_cluster, slurm_job_dir):
    run_dir = slurm_job_dir / "run"
    ckpt = run_dir / "checkpoints"
    child = (f"{PY} {CHILDREN / 'zero_code_slow.py'} --steps 40 --step-time 0.1 --save-every 10 "
             f"--last-seconds 4 --ckpt-dir {ckpt}")
    with slurm_cluster.grace(3):
        job = submit_victim(slurm_cluster, slurm_job_dir, "n2",
                            victim_script(run_dir, child, sets="--resume-arg '--ckpt_path {path}'"))
        wait_until(lambda: in_place_writes_seen(run_dir, 2), 150, "the write of last.ckpt for step 20")
        slurm_cluster.preempt("n2")
        final = slurm_cluster.wait_state(job, "COMPLETED", timeout=180, min_restarts=1)
    assert final.restarts >= 1
    notice = events_named(run_dir, "notice")[0]
    assert notice["deadline_source"] != "default_grace", notice["reason"]
    assert events_named(run_dir, "arbitration")[0]["decision"] == "abort"  # a 4 s write cannot fit 3 s of grace
    quarantined = events_named(run_dir, "quarantine")
    assert quarantined and quarantined[0]["path"].endswith("last.ckpt") and quarantined[0]["ok"]
    assert list(ckpt.glob("CORRUPT_last.ckpt.*.json")), "no sidecar saying why"
    resume = events_named(run_dir, "resume_point")[1]
    assert resume["path"].endswith("step=20.ckpt") and resume["step"] == 20
    assert resumed_step_from_child(run_dir, 2) == 20
    assert events_named(run_dir, "run_end")[-1]["outcome"] == "complete"


def test_zero_code_preempted_mid_save_that_fits_keeps_the_file_whole_and_resumes_from_it(
        slurm_cluster, slurm_job_dir):
    """An unchanged script, preempted while it overwrites last.ckpt in place (4 s) with a grace that
    fits the write (15 s). Slurm's SIGTERM reaches every process of the step at once; the child
    starts with it ignored, so the supervisor blocks on the write it sees in the directory, then ends
    the child: last.ckpt is whole, nothing is quarantined, and the requeued run resumes from it."""
    run_dir = slurm_job_dir / "run"
    ckpt = run_dir / "checkpoints"
    child = (f"{PY} {CHILDREN / 'zero_code_slow.py'} --steps 40 --step-time 0.1 --save-every 10 "
             f"--last-seconds 4 --ckpt-dir {ckpt}")
    with slurm_cluster.grace(15):
        job = submit_victim(slurm_cluster, slurm_job_dir, "n2",
                            victim_script(run_dir, child, sets="--resume-arg '--ckpt_path {path}'"))
        wait_until(lambda: in_place_writes_seen(run_dir, 2), 150, "the write of last.ckpt for step 20")
        time.sleep(0.5)  # well into the write, with most of it still to go
        slurm_cluster.preempt("n2")
        final = slurm_cluster.wait_state(job, "COMPLETED", timeout=180, min_restarts=1)
    assert final.restarts >= 1
    assert [a["decision"] for a in events_named(run_dir, "arbitration")][0] == "block"
    assert log_has(run_dir, "saved step 20"), "the write of step 20 did not finish"
    assert events_named(run_dir, "quarantine") == []  # nothing torn
    resume = events_named(run_dir, "resume_point")[1]
    assert resume["step"] == 20, resume
    assert resumed_step_from_child(run_dir, 2) == 20
    assert events_named(run_dir, "run_end")[-1]["outcome"] == "complete"


def test_zero_code_save_that_begins_with_the_notice_is_seen_open_and_lands_whole(slurm_cluster, slurm_job_dir):
    """The race at the notice: an unchanged script begins a save as the preemption reaches it (its
    SIGCONT handler opens last.ckpt in place; Slurm sends SIGCONT, then SIGTERM) and writes its
    first byte 0.5 s later, so the directory shows nothing when the notice is arbitrated. The
    supervisor sees the file open for writing (at the notice, or at the last look before the kill)
    and blocks until it is closed: last.ckpt is whole, nothing is quarantined, and the requeued run
    resumes from the step it saved. Before the open files were looked at, the child was killed at
    once and the save was lost (resumed from step 10)."""
    run_dir = slurm_job_dir / "run"
    ckpt = run_dir / "checkpoints"
    child = (f"{PY} {CHILDREN / 'zero_code_late_save.py'} --steps 25 --step-time 0.1 --save-every 10 "
             f"--first-byte-after 0.5 --late-seconds 1.5 --ckpt-dir {ckpt}")
    with slurm_cluster.grace(10):
        job = submit_victim(slurm_cluster, slurm_job_dir, "n1",
                            victim_script(run_dir, child, sets="--resume-arg '--ckpt_path {path}'"))
        wait_until(lambda: log_has(run_dir, "step 12\n"), 120, "step 12 (after the save of step 10)")
        slurm_cluster.preempt("n1")
        final = slurm_cluster.wait_state(job, "COMPLETED", timeout=120, min_restarts=1)
    assert final.restarts >= 1
    first = (run_dir / "supervisor" / "attempt-1.log").read_text()
    begun = re.search(r"late save of step (\d+) begins", first)
    assert begun, f"the child's save did not begin with the notice (no SIGCONT?):\n{first[-1500:]}"
    late = int(begun.group(1))
    assert late > 10
    assert log_has(run_dir, f"saved step {late}\n"), "the save begun with the notice was cut short"
    assert "block" in [a["decision"] for a in events_named(run_dir, "arbitration")]
    assert events_named(run_dir, "quarantine") == []  # nothing torn
    assert events_named(run_dir, "resume_point")[1]["step"] == late
    assert resumed_step_from_child(run_dir, 2) == late
    assert events_named(run_dir, "run_end")[-1]["outcome"] == "complete"
    assert all(r["ok"] for r in verify_all(ckpt))


def test_completed_training_is_not_requeued(slurm_cluster, slurm_job_dir):
    run_dir = slurm_job_dir / "run"
    child = f"{PY} {CHILDREN / 'slow_saver.py'} --steps 15 --step-time 0.05 --save-every 5 --save-seconds 0.1"
    result = slurm_cluster.run_job(victim_script(run_dir, child), "-p", "extra", "-N1", "-w", "n1",
                                   "--requeue", "--open-mode=append", "-o", f"{slurm_job_dir}/done-%j.out",
                                   timeout=90)
    assert result.info.state == "COMPLETED" and result.info.restarts == 0
    assert "SUPERVISE EXIT 0" in result.output
    assert not events_named(run_dir, "requeue")
    assert events_named(run_dir, "run_end")[-1]["outcome"] == "complete"
