"""Shared helpers for tests that run the real ``supervise`` command as a subprocess."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
SUPERVISE = [sys.executable, "-m", "supervisor"]


def supervise_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERVISE_", "SUPERVISOR_"))}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    env["SUPERVISE_PROBE_SOFTWARE"] = "false"  # tests/conftest.py says why; a test of the probe passes "true"
    if extra:
        env.update(extra)
    return env


def run_supervise(args: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 120,
                  cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(SUPERVISE + list(args), capture_output=True, text=True, timeout=timeout,
                          env=supervise_env(env), cwd=cwd)


def start_supervise(args: Sequence[str], *, env: dict[str, str] | None = None,
                    cwd: Path | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(SUPERVISE + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=supervise_env(env), cwd=cwd)


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "supervisor" / "events.jsonl"
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def events_named(run_dir: Path, name: str) -> list[dict[str, Any]]:
    return [e for e in read_events(run_dir) if e["event"] == name]


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); look at its state.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        return state != "Z"
    except OSError:
        return False


def preempt_while_the_child_waits(cluster: Any, node: str, run_dir: Path, timeout: float = 60.0) -> None:
    """Preempt ``node`` while the newest attempt's training process is stopped (SIGSTOP), and let it
    go (SIGCONT) once the supervisor has logged the notice. A loaded machine may take longer to
    schedule the preemptor than a short training takes to finish; stopped, the training cannot end
    first, so the preemption lands while it trains (Slurm itself sends SIGCONT with the notice)."""
    starts = [e for e in read_events(run_dir) if e["event"] == "attempt_start"]
    child = int(starts[-1]["pid"])
    os.kill(child, signal.SIGSTOP)
    try:
        cluster.preempt(node)
        if not wait_for(lambda: any(e["event"] == "notice" for e in read_events(run_dir)), timeout, 0.1):
            raise AssertionError(f"no notice in {run_dir} within {timeout:.0f} s of preempting {node}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGCONT)
