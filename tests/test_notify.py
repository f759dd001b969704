"""Notifications: which logged events tell a person, and sending them without ever holding up or
failing the run. Real HTTP (``http.server`` on 127.0.0.1 in a thread) and real commands (a small
Python script), nothing mocked.

The time bounds here are behavioural, not benchmarks: ``on_event`` must return at once while the
endpoint takes seconds, which a bound of half a second against a three-second endpoint shows with a
margin wide enough for a loaded machine.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from supervisor.addons import notify
from supervisor.config import NotifyConfig, load_config
from supervisor.errors import ConfigError
from supervisor.events import Ev
from supervisor.addons.notify import NotifyEvent, notification_for, on_event

RUN_START = {"name": "exp1", "run_dir": "/scratch/runs/exp1", "job_id": "4242", "host": "n1"}
STOPPED = {"outcome": "stopped", "exit_code": 4, "reason": "budget same_failure_limit exhausted: crash loop",
           "attempts": 3, "last_step": 15, "stopped_by": "same_failure_limit"}


# ---------------------------------------------------------------------------------------------
# A local endpoint


@dataclass
class Endpoint:
    url: str
    received: list[dict[str, Any]] = field(default_factory=list)
    hits: int = 0
    status: int = 200
    delay: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def wait_hits(self, n: int, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.lock:
                if self.hits >= n:
                    return True
            time.sleep(0.01)
        return False


@pytest.fixture()
def endpoint() -> Iterator[Endpoint]:
    ep = Endpoint(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with ep.lock:
                ep.hits += 1
                ep.received.append({"body": json.loads(body), "content_type": self.headers.get("Content-Type")})
            if ep.delay:
                time.sleep(ep.delay)
            try:
                self.send_response(ep.status)
                self.end_headers()
                self.wfile.write(b"ok")
            except OSError:  # the client gave up (its timeout): nothing to answer
                pass

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    ep.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    try:
        yield ep
    finally:
        server.shutdown()
        server.server_close()


def cfg(**kw: Any) -> NotifyConfig:
    """A fresh config per test (each config has its own notifier thread and counts)."""
    kw.setdefault("backoff", 0.05)
    kw.setdefault("timeout", 2.0)
    return NotifyConfig(**kw)


def timed_on_event(c: NotifyConfig, name: str, fields: dict[str, Any]) -> float:
    t0 = time.perf_counter()
    on_event(c, name, fields)
    return time.perf_counter() - t0


# ---------------------------------------------------------------------------------------------
# Which events tell a person


@pytest.mark.parametrize(("name", "fields", "expected"), [
    ("run_end", STOPPED, NotifyEvent.STOPPED),
    ("run_end", {"outcome": "failed", "reason": "exit 1, no restart configured"}, NotifyEvent.STOPPED),
    ("run_end", {"outcome": "complete", "reason": "training complete"}, NotifyEvent.COMPLETE),
    ("run_end", {"outcome": "interrupted", "reason": "cancelled by a person: JobState=CANCELLED"},
     NotifyEvent.CANCELLED),
    ("requeue", {"job_id": "4242", "held": True, "reason": "JobHoldMaxRequeue"}, NotifyEvent.HELD),
    ("attempt_end", {"attempt": 2, "class": "illegal_memory_access", "last_step": 1200}, NotifyEvent.RESULTS_CHECK),
    ("loss_anomaly", {"attempt": 2, "step": 900, "kind": "nan", "loss": float("nan")}, NotifyEvent.RESULTS_CHECK),
    ("resumability", {"attempt": 1, "ok": False, "missing": ["resume"],
                      "reason": "this run cannot resume (resume missing): ... Add: --resume-arg '--resume {path}'"},
     NotifyEvent.RESUMABILITY),
])
def test_events_that_need_a_person(name: str, fields: dict[str, Any], expected: NotifyEvent) -> None:
    n = notification_for(name, fields)
    assert n is not None and n.event is expected and n.trigger == name and n.reason


def test_enum_values_are_read_as_their_values() -> None:
    from supervisor.states import FailureClass, RunOutcome

    stopped = notification_for("run_end", {"outcome": RunOutcome.STOPPED, "reason": "crash loop"})
    suspect = notification_for("attempt_end", {"attempt": 1, "class": FailureClass.ILLEGAL_MEMORY_ACCESS})
    assert stopped is not None and stopped.event is NotifyEvent.STOPPED
    assert suspect is not None and suspect.event is NotifyEvent.RESULTS_CHECK


@pytest.mark.parametrize(("name", "fields"), [
    ("run_end", {"outcome": "requeue", "reason": "preempted"}),  # normal on a preemptible QOS
    ("attempt_end", {"attempt": 1, "class": "native_crash"}),  # restarted: the budget watches it
    ("requeue", {"job_id": "4242", "held": False}),
    ("progress", {"step": 10}),
    ("resumability", {"attempt": 1, "ok": True, "reason": "this run can resume"}),
])
def test_everyday_events_tell_nobody(name: str, fields: dict[str, Any]) -> None:
    assert notification_for(name, fields) is None


def test_the_config_names_exactly_the_notification_events() -> None:
    assert set(NotifyConfig.EVENTS) == {e.value for e in NotifyEvent}


# ---------------------------------------------------------------------------------------------
# Config validation: one line naming the key


@pytest.mark.parametrize(("sets", "key", "says"), [
    (("notify.url=ftp://hooks.example.org/x",), "notify.url", "http:// or https://"),
    (("notify.url=hooks.example.org/x",), "notify.url", "http:// or https://"),
    (('notify.command=""',), "notify.command", "empty command"),
    (("notify.command='   '",), "notify.command", "empty command"),
    (("notify.events=[stopped,finished]",), "notify.events", "allowed: stopped, held"),
    (("notify.timeout=0",), "notify.timeout", "> 0"),
])
def test_bad_notify_config_is_one_clear_line(sets: tuple[str, ...], key: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(environ={}, sets=sets)
    message = str(err.value)
    assert f"'{key}'" in message and says in message and "\n" not in message


def test_bad_notify_config_exits_2_without_a_traceback(tmp_path: Path) -> None:
    from tests.helpers import run_supervise

    config = tmp_path / "c.yaml"
    config.write_text("notify:\n  url: https://hooks.example.org/x\n  events: [stopped, done]\n")
    res = run_supervise(["config", "show", "--config", str(config)])
    assert res.returncode == 2
    assert "notify.events" in res.stderr and "'done'" in res.stderr and "Traceback" not in res.stderr


def test_good_notify_config_from_yaml_and_environment(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("notify:\n  command: /usr/local/bin/page-me --team ml\n  events: [stopped, held]\n")
    c = load_config(config, environ={"SUPERVISE_NOTIFY__URL": "https://hooks.example.org/${HOOK}"})
    assert c.notify.enabled and c.notify.events == ("stopped", "held")
    assert c.notify.url == "https://hooks.example.org/${HOOK}" and c.notify.retries == 3
    assert not load_config(environ={}).notify.enabled  # off unless a command or a URL is given


# ---------------------------------------------------------------------------------------------
# Sending: a normal, a slow and a failing endpoint


def test_normal_endpoint_receives_the_payload(endpoint: Endpoint) -> None:
    c = cfg(url=endpoint.url)
    on_event(c, Ev.RUN_START, RUN_START)  # the loop hands over the Ev it logged
    on_event(c, Ev.PROGRESS, {"attempt": 1, "step": 10})
    on_event(c, Ev.RUN_END, STOPPED)
    stats = notify.drain(c, timeout=10)
    assert stats is not None and stats.sent == 1 and stats.failed == 0, stats
    (got,) = endpoint.received
    body = got["body"]
    assert got["content_type"] == "application/json"
    assert body["event"] == "stopped" and body["reason"] == STOPPED["reason"]
    assert (body["run_name"], body["run_dir"], body["job_id"]) == ("exp1", "/scratch/runs/exp1", "4242")
    assert body["trigger"] == "run_end" and body["fields"] == STOPPED
    assert body["text"].startswith("[exp1] stopped: budget same_failure_limit")


def test_only_the_chosen_events_are_sent_and_each_once(endpoint: Endpoint) -> None:
    c = cfg(url=endpoint.url, events=("results_check",))
    on_event(c, "run_start", RUN_START)
    on_event(c, "attempt_end", {"attempt": 2, "class": "illegal_memory_access", "last_step": 1200})
    on_event(c, "loss_anomaly", {"attempt": 2, "step": 1190, "kind": "nan"})  # same attempt: told already
    on_event(c, "run_end", STOPPED)  # not chosen
    notify.drain(c, timeout=10)
    assert [r["body"]["event"] for r in endpoint.received] == ["results_check"]
    assert endpoint.received[0]["body"]["fields"]["class"] == "illegal_memory_access"


def test_slow_endpoint_times_out_is_retried_and_never_blocks_the_caller(endpoint: Endpoint) -> None:
    endpoint.delay = 3.0
    c = cfg(url=endpoint.url, timeout=0.3, retries=2)
    on_event(c, "run_start", RUN_START)
    took = timed_on_event(c, "run_end", STOPPED)
    assert took < 0.5, f"on_event held the caller {took:.3f}s while the endpoint sleeps 3 s"
    assert endpoint.wait_hits(3, timeout=20), f"{endpoint.hits} tries, expected the first and 2 retries"
    stats = notify.drain(c, timeout=20)
    assert stats is not None and stats.failed == 1 and stats.sent == 0 and stats.retried == 2, stats
    assert "timed out" in stats.errors[-1] or "timeout" in stats.errors[-1].lower(), stats.errors
    assert endpoint.hits == 3


def test_failing_endpoint_is_retried_then_given_up_counted_and_nothing_raised(endpoint: Endpoint) -> None:
    endpoint.status = 500
    c = cfg(url=endpoint.url, retries=3)
    on_event(c, "run_end", {"outcome": "complete", "reason": "training complete"})  # returns, raises nothing
    stats = notify.drain(c, timeout=20)
    assert endpoint.hits == 4  # the first try and 3 retries
    assert stats is not None and stats.failed == 1 and stats.retried == 3 and stats.sent == 0
    assert "HTTP 500" in stats.errors[-1]


def test_a_client_error_is_not_retried(endpoint: Endpoint) -> None:
    endpoint.status = 404  # a wrong URL stays wrong: trying again only delays the other notifications
    c = cfg(url=endpoint.url, retries=3)
    on_event(c, "run_end", STOPPED)
    stats = notify.drain(c, timeout=20)
    assert endpoint.hits == 1 and stats is not None and stats.failed == 1 and stats.retried == 0


def test_unreachable_endpoint_is_counted_not_raised() -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = cfg(url=f"http://127.0.0.1:{port}/hook", retries=1)
    on_event(c, "run_end", STOPPED)
    stats = notify.drain(c, timeout=20)
    assert stats is not None and stats.failed == 1 and stats.retried == 1


def test_the_last_notification_is_sent_before_the_process_exits(endpoint: Endpoint) -> None:
    """run_end is the supervisor's last event: a process that logs it and exits at once still tells."""
    import subprocess

    code = (f"from supervisor.config import NotifyConfig\nfrom supervisor.addons.notify import on_event\n"
            f"on_event(NotifyConfig(url={endpoint.url!r}), 'run_end', {{'outcome': 'complete', 'reason': 'done'}})\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False,
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr
    assert [r["body"]["event"] for r in endpoint.received] == ["complete"]


def test_a_full_queue_drops_and_counts_without_blocking(endpoint: Endpoint) -> None:
    endpoint.delay = 2.0
    c = cfg(url=endpoint.url, queue_size=1, timeout=5.0, retries=0)
    durations = []
    for attempt in range(1, 6):  # the worker holds one, the queue one, the rest are dropped
        durations.append(timed_on_event(c, "attempt_end", {"attempt": attempt, "class": "device_assert"}))
    assert max(durations) < 0.5, durations
    stats = notify.drain(c, timeout=30)
    assert stats is not None and stats.dropped >= 3 and stats.sent + stats.dropped == 5, stats


# ---------------------------------------------------------------------------------------------
# The command notifier

RECORDER = """\
import json, os, sys
payload = json.load(sys.stdin)
env = {k: v for k, v in os.environ.items() if k.startswith("SUPERVISE_")}
with open(sys.argv[1], "a") as fh:
    fh.write(json.dumps({"payload": payload, "env": env}) + "\\n")
sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
"""


def test_command_gets_the_payload_on_stdin_and_in_its_environment(tmp_path: Path) -> None:
    script = tmp_path / "recorder.py"
    script.write_text(RECORDER)
    out = tmp_path / "told.jsonl"
    c = cfg(command=f"{sys.executable} {script} '{out}'")
    on_event(c, "run_start", RUN_START)
    on_event(c, "requeue", {"attempt": 4, "job_id": "4242", "held": True,
                            "reason": "held after MaxBatchRequeue: scontrol release 4242"})
    stats = notify.drain(c, timeout=20)
    assert stats is not None and stats.sent == 1, stats
    (told,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert told["payload"]["event"] == "held" and told["payload"]["job_id"] == "4242"
    assert told["env"]["SUPERVISE_EVENT"] == "held"
    assert told["env"]["SUPERVISE_REASON"] == "held after MaxBatchRequeue: scontrol release 4242"
    assert told["env"]["SUPERVISE_RUN_NAME"] == "exp1" and told["env"]["SUPERVISE_RUN_DIR"] == "/scratch/runs/exp1"
    assert told["env"]["SUPERVISE_JOB_ID"] == "4242" and told["env"]["SUPERVISE_TRIGGER"] == "requeue"
    assert set(told["env"]) >= set(NotifyConfig.ENV_VARS)


def test_failing_command_is_retried_then_counted(tmp_path: Path) -> None:
    script = tmp_path / "recorder.py"
    script.write_text(RECORDER)
    out = tmp_path / "told.jsonl"
    c = cfg(command=f"{sys.executable} {script} {out} 3", retries=2)
    on_event(c, "run_end", STOPPED)
    stats = notify.drain(c, timeout=20)
    assert len(out.read_text().splitlines()) == 3  # ran three times
    assert stats is not None and stats.failed == 1 and "exited 3" in stats.errors[-1]


def test_hanging_command_is_killed_with_what_it_started(tmp_path: Path) -> None:
    script = tmp_path / "hang.sh"
    script.write_text("#!/bin/sh\nsleep 30 &\nsleep 30\n")  # a background child keeps the pipes open too
    script.chmod(0o755)
    c = cfg(command=str(script), timeout=0.5, retries=0)
    took = timed_on_event(c, "run_end", STOPPED)
    stats = notify.drain(c, timeout=15)
    assert took < 0.5 and stats is not None and stats.failed == 1, stats
    assert "did not finish within 0.5s" in stats.errors[-1]


def test_missing_command_is_counted_not_raised(tmp_path: Path) -> None:
    c = cfg(command=str(tmp_path / "no-such-notifier"), retries=3)
    on_event(c, "run_end", STOPPED)
    stats = notify.drain(c, timeout=10)
    assert stats is not None and stats.failed == 1 and stats.retried == 0  # another try cannot help
    assert "cannot run" in stats.errors[-1]


def test_command_and_url_both_told(tmp_path: Path, endpoint: Endpoint) -> None:
    script = tmp_path / "recorder.py"
    script.write_text(RECORDER)
    out = tmp_path / "told.jsonl"
    c = cfg(command=f"{sys.executable} {script} {out}", url=endpoint.url)
    on_event(c, "run_end", {"outcome": "interrupted", "reason": "cancelled by a person"})
    stats = notify.drain(c, timeout=20)
    assert stats is not None and stats.sent == 2
    assert endpoint.received[0]["body"]["event"] == "cancelled"
    assert json.loads(out.read_text())["payload"]["event"] == "cancelled"


def test_disabled_notifications_do_nothing() -> None:
    c = NotifyConfig()
    on_event(c, "run_end", STOPPED)
    assert notify.drain(c, timeout=0) is None
