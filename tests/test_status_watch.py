"""``supervise status --watch``: a real ``supervise`` process redraws the view while the event log
grows, and a real SIGINT ends it cleanly (exit 0, no traceback). The log is written the way the run
loop writes it (``EventLog``); this test process stands in for the live supervisor in
``lock.owner.json``.
"""

from __future__ import annotations

import json
import os
import pty
import re
import queue
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.events import Ev, EventLog
from tests.helpers import SUPERVISE, run_supervise, start_supervise, supervise_env

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

    def wait_lines(self, n: int, timeout: float = 30.0) -> bool:
        end = time.monotonic() + timeout
        while self.text.count("\n") < n and time.monotonic() < end:
            try:
                self.text += self._lines.get(timeout=0.05)
            except queue.Empty:
                pass
        return self.text.count("\n") >= n

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


def test_watch_to_a_pipe_prints_one_line_per_refresh_and_quits_cleanly_on_ctrl_c(
        live_run: tuple[Path, EventLog]) -> None:
    run_dir, log = live_run
    proc = start_supervise(["status", "--watch", "--interval", "0.2", str(run_dir)])
    try:
        out = Output(proc)
        assert out.wait_for("running, attempt 1: step 100, 5 steps/s"), out.text[-2000:]
        assert "nothing saved yet" in out.text and "preemption now loses 100 step(s) (~20s of training)" in out.text

        log.emit(Ev.SAVE_END, attempt=1, step=200, path=str(run_dir / "checkpoints" / "step=200.ckpt"), bytes=10,
                 duration=0.2, ok=True, source="client")
        log.emit(Ev.PROGRESS, attempt=1, step=250, rate=5.0, source="client")
        assert out.wait_for("step 250, 5 steps/s"), out.text[-2000:]
        assert out.wait_for("saved step 200"), out.text[-2000:]
        assert out.wait_for("preemption now loses 50 step(s) (~10s of training)"), out.text[-2000:]

        deadline = time.time() + 90
        log.emit(Ev.NOTICE, attempt=1, source="signal", signal="TERM", deadline=deadline, preempt_time=None, grace=90)
        assert out.wait_for("STOP NOTICE (TERM)"), out.text[-2000:]
        assert out.wait_for("grace deadline in 1m"), out.text[-2000:]  # 1m29s .. 1m20s while it counts down
    finally:
        code, err = stop(proc)
    assert code == 0, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    lines = [line for line in out.text.splitlines() if line.strip()]
    assert len(lines) >= 3 and "\x1b" not in out.text  # plain lines for a file: no escape sequences
    assert all(" running, attempt 1: step " in line for line in lines), lines  # one whole view per line
    assert "step 100" in lines[0] and "step 250" not in lines[0]


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
        assert out.wait_lines(5), out.text[-2000:]  # it goes on: nothing ends the watch but Ctrl-C
        assert proc.poll() is None
    finally:
        code, err = stop(proc)
    assert code == 0 and "Traceback" not in err, err
    whole = out.text.splitlines()[:-1]  # the last one may have been cut by the Ctrl-C
    assert len(whole) >= 3 and all(" finished, attempt 1: step 300" in f and "run ended (complete)" in f
                                   for f in whole if f.strip()), whole


def test_watch_on_a_terminal_redraws_in_place_without_clearing_the_screen(live_run: tuple[Path, EventLog]) -> None:
    """On a TTY each frame starts at the cursor home and clears each line to its end: the screen is
    never blanked between frames (no flicker)."""
    run_dir, log = live_run
    leader, follower = pty.openpty()
    proc = subprocess.Popen(SUPERVISE + ["status", "--watch", "--interval", "0.2", str(run_dir)], stdin=follower,
                            stdout=follower, stderr=subprocess.PIPE, env=supervise_env({"COLUMNS": "100"}))
    os.close(follower)
    seen = b""
    try:
        end = time.monotonic() + 30
        # A fourth frame's head: the three frames checked below have been read whole (a read may end
        # mid-frame).
        while seen.count(FRAME_HEAD.encode()) < 4 and time.monotonic() < end:
            ready, _, _ = select.select([leader], [], [], 0.2)
            if ready:
                try:
                    seen += os.read(leader, 65536)
                except OSError:
                    break
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=15)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            os.close(leader)
    text = seen.decode("utf-8", "replace")
    frames = text.split("\x1b[H")[1:]
    assert len(frames) >= 4, text[-2000:]
    assert "\x1b[2J" not in text  # never a clear screen
    for frame in frames[:3]:
        lines = frame.replace("\r", "").split("\n")
        assert lines[0].startswith(FRAME_HEAD) and "step 100, 5 steps/s" in frame, frame
        assert lines[-1] == "\x1b[J"  # what an earlier, longer frame left below is cleared
        assert all(line.endswith("\x1b[K") and len(line) <= 100 + len("\x1b[K") for line in lines[:-1]), lines


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


CHILD = Path(__file__).resolve().parent / "children" / "loss_reporter.py"


def test_watch_of_a_client_run_shows_step_loss_rate_and_eta(tmp_path: Path) -> None:
    """A real run: the supervisor starts a training that heartbeats its step, loss and max_steps
    through the client; ``status --watch`` shows them with the rate and the time left."""
    run_dir, stop_file = tmp_path / "run", tmp_path / "stop"
    run = start_supervise(["run", "--run-dir", str(run_dir), "--set", "progress_event_interval=0.2", "--",
                           sys.executable, str(CHILD), "--stop-file", str(stop_file), "--max-steps", "1000000"])
    watch = None
    try:
        owner = run_dir / "supervisor" / "lock.owner.json"
        end = time.monotonic() + 60
        while not owner.exists() and run.poll() is None and time.monotonic() < end:
            time.sleep(0.1)
        watch = start_supervise(["status", "--watch", "--interval", "0.3", str(run_dir)])
        out = Output(watch)
        pattern = re.compile(r" running, attempt 1: step (\d+)/1000000, loss ([0-9.e+-]+), ([0-9.]+) steps/s, "
                             r"ETA (\S+)")
        end = time.monotonic() + 60
        while not pattern.search(out.text) and time.monotonic() < end and run.poll() is None:
            out.wait_lines(out.text.count("\n") + 1, timeout=1)
        found = pattern.search(out.text)
        assert found, (out.text[-2000:], run.poll())
        step, loss, rate = int(found[1]), float(found[2]), float(found[3])
        assert step > 0 and rate > 0
        assert loss == pytest.approx(4.0 / (1.0 + step / 100.0), rel=1e-3)  # the loss it sent with that step
    finally:
        stop_file.touch()
        if watch is not None:
            code, err = stop(watch)
            assert code == 0 and "Traceback" not in err, err
        try:
            _out, err = run.communicate(timeout=60)
        finally:
            if run.poll() is None:
                run.kill()
                run.communicate()
    assert run.returncode == 0, err[-2000:]
