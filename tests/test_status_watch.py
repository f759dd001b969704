"""``supervise status --watch``: a real ``supervise`` process redraws the view while the event log
grows, and a real SIGINT ends it cleanly (exit 0, no traceback). The log is written the way the run
loop writes it (``EventLog``); this test process stands in for the live supervisor in
``lock.owner.json``.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.events import Ev, EventLog
from tests.helpers import run_supervise, start_supervise

FRAME_HEAD = "supervise status --watch: refreshed"


class Output:
    """Reads a process's stdout on a thread, so the test can wait for text without blocking."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.text = ""
        self._lines: queue.Queue[str] = queue.Queue()
        assert proc.stdout is not None
        stream = proc.stdout
        threading.Thread(target=lambda: [self._lines.put(line) for line in stream], daemon=True).start()

    def wait_for(self, needle: str, timeout: float = 30.0) -> bool:
        end = time.monotonic() + timeout
        while needle not in self.text and time.monotonic() < end:
            try:
                self.text += self._lines.get(timeout=0.05)
            except queue.Empty:
                pass
        return needle in self.text

    def wait_frames(self, n: int, timeout: float = 30.0) -> bool:
        end = time.monotonic() + timeout
        while len(self.frames()) < n and time.monotonic() < end:
            try:
                self.text += self._lines.get(timeout=0.05)
            except queue.Empty:
                pass
        return len(self.frames()) >= n

    def frames(self) -> list[str]:
        return self.text.split(FRAME_HEAD)[1:]


def write_owner(run_dir: Path) -> None:
    (run_dir / "supervisor" / "lock.owner.json").write_text(json.dumps(
        {"host": socket.gethostname(), "pid": os.getpid(), "job_id": "77", "started": time.time()}))


@pytest.fixture()
def live_run(tmp_path: Path) -> Iterator[tuple[Path, EventLog]]:
    run_dir = tmp_path / "run"
    log = EventLog(run_dir / "supervisor" / "events.jsonl")
    log.emit(Ev.RUN_START, name="watched", run_dir=str(run_dir), checkpoint_dir=str(run_dir / "checkpoints"),
             host=socket.gethostname(), job_id="77", restart_count=0)
    log.emit(Ev.ATTEMPT_START, attempt=1, pid=os.getpid(), host=socket.gethostname(), job_id="77", restart_count=0,
             resume_path=None, resume_step=None)
    log.emit(Ev.PROGRESS, attempt=1, step=100, rate=5.0, source="client")
    write_owner(run_dir)
    yield run_dir, log
    log.close()


def stop(proc: subprocess.Popen[str]) -> tuple[int, str]:
    proc.send_signal(signal.SIGINT)
    try:
        _out, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, err


def test_watch_redraws_as_the_log_grows_and_quits_cleanly_on_ctrl_c(live_run: tuple[Path, EventLog]) -> None:
    run_dir, log = live_run
    proc = start_supervise(["status", "--watch", "--interval", "0.2", str(run_dir)])
    try:
        out = Output(proc)
        assert out.wait_for("step 100, 5 steps/s"), out.text[-2000:]
        assert "state: running" in out.text and "attempt 1 (job 77" in out.text

        log.emit(Ev.SAVE_END, attempt=1, step=200, path=str(run_dir / "checkpoints" / "step=200.ckpt"), bytes=10,
                 duration=0.2, ok=True, source="client")
        log.emit(Ev.PROGRESS, attempt=1, step=250, rate=6.5, source="client")
        assert out.wait_for("step 250, 6.5 steps/s"), out.text[-2000:]
        assert out.wait_for("last checkpoint: step 200 (step=200.ckpt)")

        deadline = time.time() + 90
        log.emit(Ev.NOTICE, attempt=1, source="signal", signal="TERM", deadline=deadline, preempt_time=None, grace=90)
        assert out.wait_for("STOP NOTICE (TERM)"), out.text[-2000:]
        assert out.wait_for("grace deadline in 1m"), out.text[-2000:]  # 1m29s .. 1m20s while it counts down
    finally:
        code, err = stop(proc)
    assert code == 0, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    frames = out.frames()
    assert len(frames) >= 3
    assert "step 100" in frames[0] and "step 250" not in frames[0]  # the first view was redrawn, not reprinted


def test_watch_of_an_ended_run_says_so_and_keeps_refreshing(live_run: tuple[Path, EventLog]) -> None:
    run_dir, log = live_run
    log.emit(Ev.ATTEMPT_END, attempt=1, exit_code=0, signal=None, duration=20.0, first_step=0, last_step=300,
             last_durable_step=300, steps_lost=0, wall_lost=0.0, **{"class": "completed", "action": None})
    log.emit(Ev.RUN_END, outcome="complete", exit_code=0, reason="training complete", attempts=1, last_step=300)
    (run_dir / "supervisor" / "lock.owner.json").unlink()  # the supervisor let go of the run
    proc = start_supervise(["status", "--watch", "--interval", "0.2", str(run_dir)])
    try:
        out = Output(proc)
        assert out.wait_for("run ended (complete)"), out.text[-2000:]
        assert out.wait_frames(4), out.text[-2000:]  # it goes on: nothing ends the watch but Ctrl-C
        assert proc.poll() is None
    finally:
        code, err = stop(proc)
    assert code == 0 and "Traceback" not in err, err
    whole = out.frames()[:-1]  # the last one may have been cut by the Ctrl-C
    assert len(whole) >= 3 and all("state: finished" in f for f in whole)


def test_watch_json_prints_one_object_per_refresh(live_run: tuple[Path, EventLog]) -> None:
    run_dir, log = live_run
    proc = start_supervise(["status", "--watch", "--json", "--interval", "0.2", str(run_dir)])
    try:
        out = Output(proc)
        assert out.wait_for('"last_step": 100')
        log.emit(Ev.PROGRESS, attempt=1, step=130, rate=5.0, source="client")
        assert out.wait_for('"last_step": 130')
    finally:
        code, err = stop(proc)
    assert code == 0, err
    views = [json.loads(line) for line in out.text.splitlines() if line.strip()]
    assert views[0]["last_step"] == 100 and views[-1]["last_step"] == 130
    assert all(v["state"] == "running" and v["attempt"] == 1 for v in views)


def test_watch_of_a_missing_run_directory_is_a_usage_error(tmp_path: Path) -> None:
    res = run_supervise(["status", "--watch", "--interval", "0.2", str(tmp_path / "nope")], timeout=30)
    assert res.returncode == 2 and "does not exist" in res.stderr and "Traceback" not in res.stderr
