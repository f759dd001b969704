"""A slurmctld that does not answer must not delay the reaction to a notice (real processes).

Measured before the run loop asked Slurm in the background: with ``scontrol show job`` hanging,
the notice was recorded 31.5 s after SIGTERM, past a 30 s grace, and no emergency save was made.
Here ``scontrol`` is a stand-in on PATH (what cannot run here: a wedged controller) that hangs on
``show`` and answers ``--version`` and ``requeue`` at once; everything else is real.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from helpers import events_named, start_supervise, wait_for

pytest.importorskip("torch")

PY = sys.executable
PLAIN = str(Path(__file__).resolve().parents[1] / "examples" / "train_plain.py")

FAKE_SCONTROL = """#!/bin/sh
case "$1" in
  --version|-V) echo "slurm 22.05.8"; exit 0 ;;
  requeue) exit 0 ;;
  *) sleep 300 ;;
esac
"""


def test_notice_is_acted_on_at_once_while_scontrol_hangs(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "scontrol").write_text(FAKE_SCONTROL)
    (bindir / "scontrol").chmod(0o755)
    run_dir = tmp_path / "run"
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "0",
           "FAULT_SIGTERM_AT": "12", "FAULT_SIGTERM_PID": "parent"}
    proc = start_supervise(["run", "--run-dir", str(run_dir), "--set", "preemption.default_grace=30", "--", PY, PLAIN,
                            "--steps", "400", "--save-every", "10", "--step-time", "0.02"], env=env)
    try:
        # The requeue call cannot answer (``show`` hangs): on 22.05 the supervisor stays until the grace
        # ends (tests/test_requeue_deadline.py); here Slurm's end-of-grace SIGTERM is sent by hand.
        assert wait_for(lambda: any(e.get("staying") for e in _events(run_dir, "requeue")), timeout=120), \
            proc.stderr.read() if proc.poll() is not None else "never stayed for Slurm"
        deadline = events_named(run_dir, "notice")[0]["deadline"]
        wait_for(lambda: time.time() > deadline + 0.2, timeout=40)
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=30) == 75
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    notice = events_named(run_dir, "notice")[0]
    assert notice["deadline_source"] == "default_grace"
    arbitration = events_named(run_dir, "arbitration")[0]
    assert arbitration["decision"] == "emergency_save", arbitration["reason"]
    emergency = [s for s in events_named(run_dir, "save_end") if s["ts"] >= notice["ts"]]
    assert emergency and emergency[0]["ok"] and emergency[0]["step"] >= 12
    assert emergency[0]["ts"] < notice["deadline"]  # saved inside the grace, not after it
    end = events_named(run_dir, "attempt_end")[0]
    assert end["class"] == "preempted" and end["last_durable_step"] == emergency[0]["step"]


def _events(run_dir: Path, name: str) -> list:
    return events_named(run_dir, name) if (run_dir / "supervisor" / "events.jsonl").exists() else []


class _Backend:
    """What BackgroundSlurm calls (a backend whose configuration reads fail at first or hang)."""

    def __init__(self, grace_answers: list) -> None:
        self.grace_answers, self.grace_calls = grace_answers, 0

    def job_info(self, job_id: str):
        from supervisor.slurm.parse import JobInfo
        return JobInfo(job_id=int(job_id), state="RUNNING", partition="extra")

    def preemption_grace(self, info):
        self.grace_calls += 1
        answer = self.grace_answers.pop(0) if self.grace_answers else None
        if isinstance(answer, Exception):
            raise answer
        if answer == "hang":
            import time
            time.sleep(30.0)
            return None
        return answer


def test_the_configured_grace_is_read_again_after_a_busy_controller_fails_the_first_read() -> None:
    from supervisor.errors import SlurmError
    from supervisor.run.seams import BackgroundSlurm
    from supervisor.slurm.grace import ClusterGrace

    four = ClusterGrace(4.0, "partition extra GraceTime")
    backend = _Backend([SlurmError(["scontrol", "show", "config"], "Socket timed out"), four])
    view = BackgroundSlurm("7", lambda: backend)
    assert view.job_info_now(5.0) is not None
    _wait_for(lambda: backend.grace_calls == 1)
    assert view.grace() is None  # the first read failed: nothing learned yet, the default stays
    view.job_info_now(5.0)
    _wait_for(lambda: view.grace() == four)
    view.job_info_now(5.0)
    assert backend.grace_calls == 2  # answered: never asked again


def test_a_hanging_grace_read_never_delays_the_job_record() -> None:
    from supervisor.run.seams import BackgroundSlurm

    backend = _Backend(["hang"])
    view = BackgroundSlurm("7", lambda: backend)
    view.job_info_now(5.0)
    _wait_for(lambda: backend.grace_calls == 1)
    import time
    started = time.monotonic()
    assert view.job_info_now(20.0) is not None  # answered while the grace read still hangs (30 s)
    assert time.monotonic() - started < 20.0 and backend.grace_calls == 1


def _wait_for(predicate, timeout: float = 5.0) -> None:
    import time
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)
