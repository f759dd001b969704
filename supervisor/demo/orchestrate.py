"""``supervise demo``: show restart, preemption, quarantine and resume on a tiny CPU training.

The scenario a user lives through on a preemptible QOS, run locally in under a minute:
attempt 1 segfaults (a real SIGSEGV) -> restarted from the last checkpoint; then the "scheduler"
preempts the job (SIGTERM to the supervisor, as Slurm sends it at grace start) -> emergency save,
exit 75; before the "requeued" job starts, last.ckpt is torn the way a plain torch.save is torn by
a preemption -> the next start quarantines it and resumes from the newest valid step checkpoint,
then the training completes. Every step goes through the real ``supervise run``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

Say = Callable[[str], None]


def _supervise(run_dir: Path, steps: int, extra_env: dict[str, str]) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "supervisor", "run", "--run-dir", str(run_dir),
            "--set", "policy.native_crash.backoff=0.5",
            "--", sys.executable, "-m", "supervisor.demo.train", "--steps", str(steps),
            "--save-every", "10", "--segfault-at", "25"]
    env = dict(os.environ, **extra_env)
    return subprocess.Popen(argv, env=env)


def _wait_for_step(log_dir: Path, step: int, proc: subprocess.Popen[bytes], timeout: float) -> bool:
    needle = f"step {step} loss"
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        for log in sorted(log_dir.glob("attempt-*.log")):
            try:
                if needle in log.read_text(errors="replace"):
                    return True
            except OSError:
                pass
        time.sleep(0.05)
    return False


def run_demo(run_dir: Path, say: Say, steps: int = 100) -> int:
    """Run the scenario; returns the final exit status of the last ``supervise run``."""
    log_dir = run_dir / "supervisor"
    say(f"demo run directory: {run_dir}")
    say("job 1: training starts; a native segfault is injected at step 25 of attempt 1")
    proc = _supervise(run_dir, steps, {})
    if _wait_for_step(log_dir, 65, proc, timeout=120):
        say("job 1: the scheduler preempts the job at step ~65, between saves (SIGTERM to the supervisor)")
        proc.send_signal(signal.SIGTERM)
    code = proc.wait()
    say(f"job 1: supervise exited {code} " + ("(75 = come back later: requeue)" if code == 75 else ""))
    if code != 75:
        return code

    last = run_dir / "checkpoints" / "last.ckpt"
    if last.exists():
        # Model what a plain torch.save does when the kill lands mid-overwrite: a torn file.
        data = last.read_bytes()
        last.unlink()  # break the hard link so the step checkpoint it shares stays whole
        last.write_bytes(data[: len(data) // 2])
        say("between jobs: last.ckpt is torn in half, as a preemption during a plain torch.save leaves it")

    say("job 2: the requeued job starts the same command")
    proc = _supervise(run_dir, steps, {"SLURM_RESTART_COUNT": "1"})
    code = proc.wait()
    say(f"job 2: supervise exited {code}")
    return code
