"""The training-side client, end to end: a real child process importing ``supervisor.client`` talks to
a real :class:`ControlServer` over UDP; real signals, real files. Nothing is mocked."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from supervisor.control import ControlServer, Kind, Message, new_token

REPO = Path(__file__).resolve().parents[1]
_CHILD_ENV_PREFIXES = ("SUPERVISOR_", "RANK", "LOCAL_RANK", "SLURM_PROCID")


def base_env(**extra: str) -> dict[str, str]:
    """The test's environment without any supervisor or rank variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_CHILD_ENV_PREFIXES)}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def supervised_env(server: ControlServer, run_dir: Path, attempt: int = 1, **extra: str) -> dict[str, str]:
    return base_env(SUPERVISOR_CONTROL=server.address, SUPERVISOR_TOKEN=server.token,
                    SUPERVISOR_RUN_DIR=str(run_dir), SUPERVISOR_ATTEMPT=str(attempt),
                    SUPERVISOR_RESUME_FROM="", SUPERVISOR_RESUME_STEP="", **extra)


def spawn(tmp_path: Path, body: str, env: dict[str, str], *args: str, name: str = "train.py") -> subprocess.Popen:
    script = tmp_path / name
    script.write_text("import sys, time, os, math, json\nfrom supervisor import client\n" + textwrap.dedent(body))
    return subprocess.Popen([sys.executable, str(script), *args], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def collect(server: ControlServer, until: Callable[[list[Message]], bool], timeout: float = 30.0,
            into: list[Message] | None = None) -> list[Message]:
    """Poll the server until ``until(messages)`` holds; fail the test on timeout."""
    messages = [] if into is None else into
    deadline = time.monotonic() + timeout
    while not until(messages):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting; got {[(m.kind.value, m.fields) for m in messages]}")
        messages.extend(server.poll())
        time.sleep(0.005)
    return messages


def kinds(messages: list[Message], kind: Kind) -> list[Message]:
    return [m for m in messages if m.kind is kind]


def read_line(proc: subprocess.Popen, timeout: float = 30.0) -> str:
    """Next stdout line of a child (the child flushes each line), failing the test on timeout."""
    assert proc.stdout is not None
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not line:
        proc.kill()
        pytest.fail(f"child printed nothing in {timeout} s; stderr: {proc.communicate()[1]}")
    return line[0].strip()


def finish(proc: subprocess.Popen, timeout: float = 30.0) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"child did not exit; stdout={out!r} stderr={err!r}")
    return proc.returncode, out, err


@pytest.fixture
def server():
    srv = ControlServer(new_token()).start()
    yield srv
    srv.close()


# ---------------------------------------------------------------------------------------------


def test_heartbeats_saves_and_resume_reach_the_supervisor(server, tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    proc = spawn(tmp_path, """
        client.resumed(100)
        for step in range(100, 400):
            client.heartbeat(step, loss=1.0 / step, lr=0.1)
            time.sleep(0.002)
        with client.saving(400, "ckpt/step-400.pt"):
            with open("ckpt/step-400.pt", "wb") as fh:
                fh.write(b"x" * 12345)
        os.mkdir("ckpt/dcp-400")
        with client.saving(400, "ckpt/dcp-400"):
            for i in range(3):
                open(f"ckpt/dcp-400/shard{i}", "wb").write(b"y" * 1000)
        try:
            with client.saving(401, "ckpt/step-401.pt"):
                raise RuntimeError("disk full")
        except RuntimeError:
            pass
        client.heartbeat(401, loss=0.5)
        client.done(401)
    """, supervised_env(server, tmp_path, attempt=3, RANK="0"))
    rc, _out, err = finish(proc)
    assert rc == 0, err
    messages = collect(server, lambda ms: bool(kinds(ms, Kind.DONE)))

    hello = kinds(messages, Kind.HELLO)[0]
    assert hello.pid == proc.pid and hello.rank == 0 and hello.attempt == 3 and hello.get("reply_port") > 0
    assert kinds(messages, Kind.RESUMED)[0].get("step") == 100
    beats = kinds(messages, Kind.HEARTBEAT)
    assert beats[0].get("step") == 100 and beats[0].get("metrics") == {"loss": 0.01, "lr": 0.1}
    # The final step arrives (sent at exit) although it came within the throttle interval.
    assert beats[-1].get("step") == 401
    # ~0.6 s of training at 500 steps/s: throttled to a handful of datagrams, not 300.
    assert len(beats) < 30

    ends = kinds(messages, Kind.SAVE_END)
    begins = kinds(messages, Kind.SAVE_BEGIN)
    assert [b.get("path") for b in begins] == ["ckpt/step-400.pt", "ckpt/dcp-400", "ckpt/step-401.pt"]
    assert [(e.get("step"), e.get("bytes"), e.get("ok")) for e in ends] == [
        (400, 12345, True), (400, 3000, True), (401, None, False)]
    assert all(e.get("duration") >= 0 for e in ends)
    assert kinds(messages, Kind.DONE)[0].get("step") == 401


def test_a_nonfinite_loss_is_sent_at_once_despite_the_throttle(server, tmp_path):
    proc = spawn(tmp_path, """
        client.heartbeat(1, loss=2.0)
        time.sleep(0.05)
        client.heartbeat(2, loss=float("nan"))
        client.heartbeat(3, loss=2.0)
        time.sleep(5)
    """, supervised_env(server, tmp_path))
    try:
        messages = collect(server, lambda ms: len(kinds(ms, Kind.HEARTBEAT)) >= 2, timeout=4)
        beats = kinds(messages, Kind.HEARTBEAT)
        assert beats[0].get("step") == 1
        assert beats[1].get("step") == 2 and math_isnan(beats[1].get("metrics")["loss"])
    finally:
        proc.kill()
        proc.communicate()


def math_isnan(value: float) -> bool:
    return math.isnan(value)


def test_broadcasts_reach_the_child_stop_with_deadline_abort_and_save_now(server, tmp_path):
    proc = spawn(tmp_path, """
        def wait_for(cond):
            t = time.time()
            while not cond():
                client.heartbeat(1)
                time.sleep(0.001)
                if time.time() - t > 8:
                    print("timeout", flush=True); sys.exit(3)
        wait_for(client.save_requested)
        print("save_now", client.save_deadline(), client.should_stop(), flush=True)
        wait_for(lambda: client.abort_requested("ckpt/step-9.pt"))
        print("abort", client.abort_requested("ckpt/other.pt"), flush=True)
        wait_for(client.should_stop)
        print("stop", client.stop_reason(), client.stop_deadline(), flush=True)
    """, supervised_env(server, tmp_path))
    collect(server, lambda ms: bool(kinds(ms, Kind.HELLO)))
    # A forged stop sent straight to the client's reply port must be ignored.
    import socket

    forged = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for token in ("wrong-token", None):
        record = {"v": 1, "kind": "stop", "reason": "forged", "deadline": 1.0}
        if token:
            record["token"] = token
        forged.sendto(json.dumps(record).encode(), server.clients[0].address)
    forged.close()
    assert server.broadcast(Kind.SAVE_NOW, deadline=1234.5) == 1
    assert read_line(proc) == "save_now 1234.5 False"
    # The supervisor names the temp file it sees being written; the client matches it to its save.
    server.broadcast(Kind.ABORT_SAVE, path="ckpt/.step-9.pt.tmp-77-ab12", reason="cannot finish in time")
    assert read_line(proc) == "abort False"
    server.broadcast(Kind.STOP, reason="preempted", deadline=2000000000.0)
    assert read_line(proc) == "stop preempted 2000000000.0"
    rc, _, err = finish(proc)
    assert rc == 0, err


def test_every_rank_says_hello_and_a_stop_reaches_all_of_them(server, tmp_path):
    body = """
        t = time.time()
        while not client.should_stop():
            client.heartbeat(7)
            time.sleep(0.002)
            if time.time() - t > 8:
                sys.exit(3)
        print(client.stop_reason(), flush=True)
    """
    procs = [spawn(tmp_path, body, supervised_env(server, tmp_path, SLURM_PROCID=str(rank)), name=f"r{rank}.py")
             for rank in (0, 1)]
    messages = collect(server, lambda ms: len(kinds(ms, Kind.HELLO)) == 2)
    assert sorted(m.rank for m in kinds(messages, Kind.HELLO)) == [0, 1]
    assert server.broadcast(Kind.STOP, reason="time limit", deadline=None) == 2
    for proc in procs:
        rc, out, err = finish(proc)
        assert (rc, out.strip()) == (0, "time limit"), err


def test_training_completes_when_the_supervisor_dies_mid_run(server, tmp_path):
    proc = spawn(tmp_path, """
        print("started", flush=True)
        t = time.time()
        step = 0
        while time.time() - t < 1.5:
            step += 1
            client.heartbeat(step, loss=1.0)
            client.should_stop()
            if step % 500 == 0:
                with client.saving(step, "ck.bin"):
                    open("ck.bin", "wb").write(b"z" * 10)
            time.sleep(0.0005)
        print("done", step, client.enabled(), client.should_stop(), flush=True)
    """, supervised_env(server, tmp_path))
    collect(server, lambda ms: bool(kinds(ms, Kind.HEARTBEAT)))
    server.close()
    rc, out, err = finish(proc)
    assert rc == 0, err
    assert out.splitlines()[-1].endswith("False False")  # channel off, and no false stop
    warnings = [line for line in err.splitlines() if "[supervisor.client] warning" in line]
    assert len(warnings) == 1, err
    assert "carries on" in warnings[0]


def test_without_a_supervisor_every_call_is_a_noop(tmp_path):
    proc = spawn(tmp_path, """
        assert client.resume_path() is None and client.resume_step() is None
        assert client.enabled() is False
        assert client.install() is True
        client.resumed(0)
        client.report_determinism(cudnn_deterministic=True)
        for step in range(1000):
            client.heartbeat(step, loss=float("nan"))
        with client.saving(5, "x.bin"):
            open("x.bin", "wb").write(b"abc")
        print(client.should_stop(), client.stop_deadline(), client.stop_reason(),
              client.save_requested(), client.abort_requested(), client.attempt(), flush=True)
    """, base_env())
    rc, out, err = finish(proc)
    assert (rc, out.strip(), err) == (0, "False None None False False None", "")
    assert (tmp_path / "x.bin").read_bytes() == b"abc"


def test_the_client_imports_with_the_stdlib_alone(tmp_path):
    code = ("import sys\n"
            "for name in ('torch', 'numpy', 'yaml', 'click', 'tenacity', 'filelock'):\n"
            "    sys.modules[name] = None  # any import of these now fails\n"
            "from supervisor import client\n"
            "client.heartbeat(1, loss=0.5); print(client.should_stop())\n")
    done = subprocess.run([sys.executable, "-c", code], env=base_env(), cwd=tmp_path, capture_output=True,
                          text=True, timeout=30, check=False)
    assert (done.returncode, done.stdout.strip()) == (0, "False"), done.stderr


def test_resume_point_is_read_from_the_environment(tmp_path):
    proc = spawn(tmp_path, """
        print(client.resume_path(), client.resume_step(), client.checkpoint_dir(), flush=True)
    """, base_env(SUPERVISOR_RESUME_FROM="/ck/step-500.pt", SUPERVISOR_RESUME_STEP="500",
                  SUPERVISOR_CHECKPOINT_DIR="/ck"))
    rc, out, err = finish(proc)
    assert (rc, out.strip()) == (0, "/ck/step-500.pt 500 /ck"), err


def test_the_stop_file_stops_a_client_without_a_channel_and_stale_files_are_ignored(tmp_path):
    stop_file = tmp_path / "supervisor" / "stop.json"
    stop_file.parent.mkdir()
    stop_file.write_text(json.dumps({"reason": "old", "deadline": 1.0, "attempt": 1}))
    proc = spawn(tmp_path, """
        t = time.time()
        while time.time() - t < 1.3:
            assert not client.should_stop(), "stale stop file honoured"
            time.sleep(0.01)
        print("ignored stale", flush=True)
        while not client.should_stop():
            time.sleep(0.01)
            if time.time() - t > 8:
                sys.exit(3)
        print(client.stop_reason(), client.stop_deadline(), flush=True)
    """, base_env(SUPERVISOR_RUN_DIR=str(tmp_path), SUPERVISOR_ATTEMPT="2"))
    assert read_line(proc) == "ignored stale"
    tmp = stop_file.with_suffix(".tmp")
    tmp.write_text(json.dumps({"reason": "preempted", "deadline": 1900000000.0, "attempt": 2}))
    os.replace(tmp, stop_file)
    rc, out, err = finish(proc)
    assert (rc, out.strip()) == (0, "preempted 1900000000.0"), err


def test_install_records_sigterm_and_the_child_exits_on_its_own(tmp_path):
    proc = spawn(tmp_path, """
        import threading
        from_thread = []
        t = threading.Thread(target=lambda: from_thread.append(client.install()))
        t.start(); t.join()
        assert from_thread == [False]
        assert client.install() and client.install(["TERM"])  # twice is harmless
        print("ready", flush=True)
        t = time.time()
        while not client.should_stop():
            client.heartbeat(1)
            time.sleep(0.001)
            if time.time() - t > 8:
                sys.exit(3)
        print(client.stop_reason(), flush=True)
    """, base_env())
    assert read_line(proc) == "ready"
    proc.send_signal(signal.SIGTERM)
    rc, out, err = finish(proc)
    assert (rc, out.strip()) == (0, "signal SIGTERM"), err


SAVE_UNDER_SIGTERM = """
    {prelude}
    client.install()
    chunk = b"c" * 100_000
    with client.saving(10, "ckpt.bin"):
        with open("ckpt.bin", "wb") as fh:
            print("in-save", flush=True)
            for _ in range(40):
                fh.write(chunk)
                time.sleep(0.01)
        print("save body done", client.should_stop(), flush=True)
    print("after save", flush=True)
"""


def test_sigterm_inside_saving_does_not_interrupt_the_save(server, tmp_path):
    proc = spawn(tmp_path, SAVE_UNDER_SIGTERM.format(prelude=""), supervised_env(server, tmp_path))
    assert read_line(proc) == "in-save"
    proc.send_signal(signal.SIGTERM)
    rc, out, err = finish(proc)
    assert rc == 0, err
    assert out.splitlines() == ["save body done True", "after save"]
    assert (tmp_path / "ckpt.bin").stat().st_size == 4_000_000
    messages = collect(server, lambda ms: bool(kinds(ms, Kind.SAVE_END)))
    assert kinds(messages, Kind.SAVE_END)[0].get("bytes") == 4_000_000


def test_a_chained_handler_that_exits_runs_only_after_the_save(server, tmp_path):
    prelude = "signal_prelude = __import__('signal'); signal_prelude.signal(15, lambda s, f: sys.exit(143))"
    proc = spawn(tmp_path, SAVE_UNDER_SIGTERM.format(prelude=prelude), supervised_env(server, tmp_path))
    assert read_line(proc) == "in-save"
    proc.send_signal(signal.SIGTERM)
    rc, out, err = finish(proc)
    # The earlier handler (as torchelastic's or a user's) did exit, but only once the file was complete
    # and the supervisor had been told the save succeeded.
    assert rc == 143, err
    assert out.splitlines() == ["save body done True"]
    assert (tmp_path / "ckpt.bin").stat().st_size == 4_000_000
    ends = kinds(collect(server, lambda ms: bool(kinds(ms, Kind.SAVE_END))), Kind.SAVE_END)
    assert (ends[0].get("ok"), ends[0].get("bytes")) == (True, 4_000_000)


def test_the_stack_dump_signal_prints_every_thread_and_is_harmless_without_install(tmp_path):
    proc = spawn(tmp_path, """
        client.install()
        def stuck_in_deep_function():
            print("ready", flush=True)  # from inside: the dump asked for after "ready" must show this frame
            while not client.should_stop():
                time.sleep(0.005)
        stuck_in_deep_function()
    """, base_env())
    assert read_line(proc) == "ready"
    proc.send_signal(client_stack_signal())
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    rc, _, err = finish(proc)
    assert rc == 0, err
    assert "stuck_in_deep_function" in err and 'File "' in err

    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    time.sleep(0.1)
    bystander.send_signal(client_stack_signal())
    assert bystander.wait(timeout=30) == 0  # SIGURG's default action is to ignore it


def client_stack_signal() -> int:
    from supervisor.client import STACK_DUMP_SIGNAL

    assert STACK_DUMP_SIGNAL is not None
    return STACK_DUMP_SIGNAL


@pytest.mark.torch
def test_save_writes_a_loadable_checkpoint_atomically_and_reports_it(server, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("supervisor.checkpoints.atomic", reason="atomic save not built yet")
    proc = spawn(tmp_path, """
        import torch
        client.save({"w": torch.arange(1000), "step": 3}, "step-3.pt", 3)
        print(torch.load("step-3.pt")["step"], flush=True)
    """, supervised_env(server, tmp_path))
    rc, out, err = finish(proc, timeout=60)
    assert (rc, out.strip()) == (0, "3"), err
    end = kinds(collect(server, lambda ms: bool(kinds(ms, Kind.SAVE_END))), Kind.SAVE_END)[0]
    assert end.get("ok") is True and end.get("bytes") == (tmp_path / "step-3.pt").stat().st_size
