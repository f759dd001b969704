"""`supervise run` locally, without Slurm: real child processes, real signals, the real run directory."""

from __future__ import annotations

import json
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest

from helpers import (
    events_named,
    pid_alive,
    read_events,
    run_supervise,
    start_supervise,
    wait_for,
)

PY = sys.executable


def test_success_streams_output_and_records_the_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    code = "import sys; print('hello from the child'); print('to stderr', file=sys.stderr)"
    res = run_supervise(["run", "--run-dir", str(run_dir), "--", PY, "-c", code])
    assert res.returncode == 0, res.stderr
    assert "hello from the child" in res.stdout  # console, unchanged, on stdout
    assert "to stderr" in res.stderr  # stderr stays stderr
    log = (run_dir / "supervisor" / "attempt-1.log").read_text()
    assert "hello from the child" in log and "to stderr" in log
    names = [e["event"] for e in read_events(run_dir)]
    for needed in ("run_start", "attempt_start", "attempt_end", "run_end"):
        assert needed in names
    start = events_named(run_dir, "attempt_start")[0]
    assert start["argv"][-1] == code and start["pid"] > 0 and start["host"]
    end = events_named(run_dir, "attempt_end")[0]
    assert end["exit_code"] == 0 and end["signal"] is None and end["duration"] >= 0
    assert end["class"] == "completed"
    assert events_named(run_dir, "run_end")[0]["outcome"] == "complete"
    for ev in read_events(run_dir):
        assert isinstance(ev["ts"], float) and ev["v"] == 1


def test_python_exception_stops_the_run_and_names_the_childs_status(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    res = run_supervise(["run", "--run-dir", str(run_dir), "--", PY, "-c",
                         "raise ValueError('bad learning rate')"])
    assert res.returncode == 4  # stopped by policy; the child's 1 is named beside it
    assert events_named(run_dir, "run_end")[0]["child_exit_code"] == 1
    assert "(the child exited 1)" in events_named(run_dir, "run_end")[0]["reason"]
    failure = events_named(run_dir, "failure")[0]
    assert failure["class"] == "python_exception"
    assert any("ValueError: bad learning rate" in line for line in failure["evidence"])
    assert events_named(run_dir, "run_end")[0]["outcome"] == "stopped"
    assert len(events_named(run_dir, "attempt_start")) == 1  # an exception is not retried


def test_the_childs_exit_code_is_named_never_passed_through_when_policy_stops(tmp_path: Path) -> None:
    res = run_supervise(["run", "--run-dir", str(tmp_path / "r"), "--set", "policy.unknown=stop",
                         "--", PY, "-c", "import sys; sys.exit(7)"])
    assert res.returncode == 4 and "the child exited 7" in res.stderr


@pytest.mark.parametrize("signame", ["SIGUSR2", "SIGINT"])
def test_signals_are_forwarded_to_the_child(tmp_path: Path, signame: str) -> None:
    marker = tmp_path / "got"
    child = textwrap.dedent(f"""
        import signal, sys, time, pathlib
        def on(sig, frame):
            pathlib.Path({str(marker)!r}).write_text(signal.Signals(sig).name)
            sys.exit(0)
        signal.signal(signal.{signame}, on)
        print('ready', flush=True)
        time.sleep(60)
    """)
    run_dir = tmp_path / "run"
    proc = start_supervise(["run", "--run-dir", str(run_dir), "--", PY, "-c", child])
    assert wait_for(lambda: (run_dir / "supervisor" / "attempt-1.log").exists()
                    and "ready" in (run_dir / "supervisor" / "attempt-1.log").read_text(), 30)
    proc.send_signal(getattr(signal, signame))
    proc.communicate(timeout=30)
    assert marker.read_text() == signame
    if signame == "SIGINT":
        assert proc.returncode == 130  # a person interrupted: respected, not restarted
        assert len(events_named(run_dir, "attempt_start")) == 1


def test_sigterm_is_a_stop_notice_and_ends_with_requeue_code(tmp_path: Path) -> None:
    """Locally a SIGTERM means the allocation is ending: stop the child and exit 75 (come back)."""
    run_dir = tmp_path / "run"
    child = "import time\nfor i in range(600):\n    print(f'step {i}', flush=True)\n    time.sleep(0.05)\n"
    proc = start_supervise(["run", "--run-dir", str(run_dir), "--", PY, "-c", child])
    log = run_dir / "supervisor" / "attempt-1.log"
    assert wait_for(lambda: log.exists() and "step 3" in log.read_text(), 30)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 75
    assert events_named(run_dir, "notice")[0]["signal"] == "TERM"
    assert events_named(run_dir, "attempt_end")[0]["class"] == "preempted"
    assert events_named(run_dir, "run_end")[0]["outcome"] == "requeue"


def test_second_supervisor_on_the_same_run_dir_is_refused(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = start_supervise(["run", "--run-dir", str(run_dir), "--", PY, "-c",
                             "import time; print('up', flush=True); time.sleep(30)"])
    try:
        assert wait_for(lambda: (run_dir / "supervisor" / "lock.owner.json").exists(), 30)
        second = run_supervise(["run", "--run-dir", str(run_dir), "--", PY, "-c", "print(1)"])
        assert second.returncode == 3
        assert f"pid {first.pid}" in second.stderr and "held by another supervisor" in second.stderr
        assert "Traceback" not in second.stderr
    finally:
        first.kill()
        first.communicate()


def test_killed_supervisor_leaves_no_orphan_and_the_next_start_takes_over(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    pidfile = tmp_path / "child.pid"
    child = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    sup = start_supervise(["run", "--run-dir", str(run_dir), "--", PY, "-c", child])
    assert wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 30)
    child_pid = int(pidfile.read_text())
    assert pid_alive(child_pid)
    sup.send_signal(signal.SIGKILL)
    sup.communicate()
    assert wait_for(lambda: not pid_alive(child_pid), 10), "training child outlived its supervisor"
    again = run_supervise(["run", "--run-dir", str(run_dir), "--", PY, "-c", "print('second')"])
    assert again.returncode == 0, again.stderr
    starts = events_named(run_dir, "attempt_start")
    assert [s["attempt"] for s in starts] == [1, 2]  # attempts are numbered across the run


def test_output_without_newlines_does_not_exhaust_memory(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    child = "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(300):\n    sys.stdout.write(chunk)\nsys.stdout.flush()\n"
    proc = start_supervise(["run", "--quiet", "--run-dir", str(run_dir), "--", PY, "-c", child])
    peak_kb = 0
    while proc.poll() is None:
        try:
            for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak_kb = max(peak_kb, int(line.split()[1]))
        except OSError:
            pass
        time.sleep(0.05)
    proc.communicate()
    assert proc.returncode == 0
    assert (run_dir / "supervisor" / "attempt-1.log").stat().st_size == 300 << 20  # all logged
    assert peak_kb < 150_000, f"supervisor peaked at {peak_kb} kB for a 300 MB line"


# --------------------------------------------------------------------------- bad input


def _no_traceback(res) -> None:
    assert "Traceback" not in res.stderr
    assert res.stderr.strip().startswith("supervise: error:")  # one style for every user error
    assert len(res.stderr.strip().splitlines()) == 1


def test_missing_command(tmp_path: Path) -> None:
    res = run_supervise(["run", "--run-dir", str(tmp_path / "r")])
    assert res.returncode == 2 and "missing the training command" in res.stderr
    _no_traceback(res)
    assert not (tmp_path / "r").exists()


def test_command_that_does_not_exist(tmp_path: Path) -> None:
    res = run_supervise(["run", "--run-dir", str(tmp_path / "r"), "--", "no-such-trainer-xyz"])
    assert res.returncode == 2 and "no-such-trainer-xyz" in res.stderr
    _no_traceback(res)
    assert not (tmp_path / "r").exists()


def test_unwritable_run_dir(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    res = run_supervise(["run", "--run-dir", str(blocker / "run"), "--", PY, "-c", "pass"])
    assert res.returncode == 2 and "not writable" in res.stderr
    _no_traceback(res)


@pytest.mark.parametrize("yaml_text, needle", [
    ("stall_timeout: [unclosed\n", "malformed YAML"),
    ("no_such_key: 1\n", "unknown key"),
    ("budget:\n  max_total_restarts: -3\n", "budget.max_total_restarts"),
    ("policy:\n  segfault_typo: restart\n", "unknown failure class"),
    ("policy:\n  native_crash: {action: reboot}\n", "allowed: restart, requeue, stop"),
    ("- just\n- a list\n", "mapping"),
])
def test_bad_config_files(tmp_path: Path, yaml_text: str, needle: str) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml_text)
    res = run_supervise(["run", "--config", str(cfg), "--run-dir", str(tmp_path / "r"), "--", PY, "-c", "pass"])
    assert res.returncode == 2 and needle in res.stderr, res.stderr
    _no_traceback(res)
    assert not (tmp_path / "r").exists()


def test_negative_count_on_the_command_line(tmp_path: Path) -> None:
    res = run_supervise(["run", "--set", "budget.max_restarts_per_allocation=-1", "--run-dir",
                         str(tmp_path / "r"), "--", PY, "-c", "pass"])
    assert res.returncode == 2 and "max_restarts_per_allocation" in res.stderr and "-1" in res.stderr
    _no_traceback(res)


def test_config_show_layers(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("stall_timeout: 100\nbudget:\n  max_total_restarts: 9\n")
    res = run_supervise(["config", "show", "--config", str(cfg), "--json", "--set", "stall_timeout=300"],
                        env={"SUPERVISE_BUDGET__MAX_TOTAL_RESTARTS": "4", "SUPERVISE_STALL_TIMEOUT": "200"})
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["config"]["stall_timeout"] == 300  # CLI beats env beats file
    assert data["config"]["budget"]["max_total_restarts"] == 4  # env beats file
    assert len(data["config_hash"]) == 64
    yaml_out = run_supervise(["config", "show", "--config", str(cfg)])
    assert "stall_timeout: 100" in yaml_out.stdout and "config_hash" in yaml_out.stdout


def test_bad_environment_value_names_its_source(tmp_path: Path) -> None:
    res = run_supervise(["config", "show"], env={"SUPERVISE_TERM_TIMEOUT": "soon"})
    assert res.returncode == 2
    assert "term_timeout" in res.stderr and "environment" in res.stderr
