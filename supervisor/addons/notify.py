"""A word to a person when the run needs one: a command run and/or JSON POSTed to a URL.

The run loop calls :func:`on_event` with every event it logs. Which events deserve a notification is
a pure decision (:func:`notification_for`); sending happens on one background thread fed by a bounded
queue, with retries (tenacity) and a timeout per try. Nothing here may slow or stop the run:
:func:`on_event` only puts on the queue and never raises; a notification that cannot be sent is
logged and counted. The last notifications (run complete, run stopped) come just before the process
exits: :func:`drain` gives the queue a bounded time to empty, and at interpreter exit it gets
``min(timeout, 10 s)`` anyway.

Notifications, and the log events that raise them:

========================  ================================================================
``stopped``               ``run_end`` with outcome ``stopped`` (policy, a budget, the resume
                          audit) or ``failed``: the run will not go on by itself
``held``                  any event with ``held: true`` (e.g. ``requeue`` after Slurm's
                          ``JobHoldMaxRequeue``): the job waits for ``scontrol release``
``results_check``         ``attempt_end`` of a class after which results are suspect
                          (illegal memory access, device assert, launch failure, hardware
                          fault) or a ``loss_anomaly``; once per attempt
``complete``              ``run_end`` with outcome ``complete``
``cancelled``             ``run_end`` with outcome ``interrupted`` (scancel, Ctrl-C)
``resumability``          ``resumability`` with ``ok: false``: at its first save the run shows
                          it cannot resume (no checkpoint seen, its step unknown, or no resume
                          command); the reason names the flag to add
========================  ================================================================
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import shlex
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol
from urllib.parse import urlsplit

from tenacity import (
    RetryError,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
)

from .. import __version__
from ..config import NotifyConfig
from ..events import Event
from ..ledger import RESULTS_CHECK_CLASSES
from ..redact import redact_text, redact_value

log = logging.getLogger("supervisor.addons.notify")

PAYLOAD_VERSION = 1
MAX_BACKOFF_S = 60.0
EXIT_DRAIN_MAX_S = 10.0  # at interpreter exit, pending notifications get at most this long
MAX_ENV_VALUE = 4096  # a reason or path longer than this is cut in the command's environment
MAX_OUTPUT_LOGGED = 500  # characters of a failing command's output kept in the log line


class NotifyEvent(str, Enum):
    """What a person is told about. The values are ``notify.events`` in the config."""

    STOPPED = "stopped"
    HELD = "held"
    RESULTS_CHECK = "results_check"
    COMPLETE = "complete"
    CANCELLED = "cancelled"
    RESUMABILITY = "resumability"


_SUSPECT_CLASSES = frozenset(c.value for c in RESULTS_CHECK_CLASSES)
_RUN_END = {"stopped": NotifyEvent.STOPPED, "failed": NotifyEvent.STOPPED, "complete": NotifyEvent.COMPLETE,
            "interrupted": NotifyEvent.CANCELLED}


@dataclass(frozen=True)
class Notification:
    """One notification to send. ``key`` names it so that the same thing is told once."""

    event: NotifyEvent
    reason: str
    trigger: str  # the log event that raised it
    fields: Mapping[str, Any]
    key: str


def _value(v: Any) -> str:
    """An enum member's value (``RunOutcome.STOPPED`` -> ``"stopped"``), else the text itself."""
    return str(v.value) if isinstance(v, Enum) else str(v)


def notification_for(event_name: str, fields: Mapping[str, Any]) -> Notification | None:
    """The notification a logged event raises, if any (pure)."""
    if fields.get("held") is True:
        reason = str(fields.get("reason") or "the job is held: it runs again only after `scontrol release`")
        return Notification(NotifyEvent.HELD, reason, event_name, fields, f"held:{fields.get('job_id')}")
    if event_name == "run_end":
        kind = _RUN_END.get(_value(fields.get("outcome")))
        if kind is None:
            return None
        reason = str(fields.get("reason") or fields.get("outcome"))
        return Notification(kind, reason, event_name, fields, f"run_end:{kind.value}:{fields.get('attempts')}")
    if event_name == "resumability" and fields.get("ok") is False:
        missing = ",".join(str(m) for m in fields.get("missing") or ())
        return Notification(NotifyEvent.RESUMABILITY, str(fields.get("reason") or "this run cannot resume"),
                            event_name, fields, f"resumability:{missing}")
    if event_name == "attempt_end" and _value(fields.get("class")) in _SUSPECT_CLASSES:
        step = fields.get("last_step")
        reason = (f"attempt {fields.get('attempt')} ended in {fields.get('class')} (last step {step}): weights or "
                  "gradients may be corrupt; compare against a known-good run")
        return Notification(NotifyEvent.RESULTS_CHECK, reason, event_name, fields,
                            f"results_check:{fields.get('attempt')}")
    if event_name == "loss_anomaly":
        reason = (f"loss anomaly ({fields.get('kind') or '?'}, loss {fields.get('loss')}) at step "
                  f"{fields.get('step')} in attempt {fields.get('attempt')}")
        return Notification(NotifyEvent.RESULTS_CHECK, reason, event_name, fields,
                            f"results_check:{fields.get('attempt')}")
    return None


@dataclass(frozen=True)
class RunIdentity:
    """Who the notification is about, learnt from ``run_start`` (the process environment before it)."""

    name: str | None = None
    run_dir: str | None = None
    job_id: str | None = None
    host: str | None = None


def build_payload(n: Notification, run: RunIdentity, ts: float) -> dict[str, Any]:
    """The JSON body (and the command's stdin). ``text`` is one line for chat webhooks."""
    name = run.name or (os.path.basename(run.run_dir.rstrip("/")) if run.run_dir else None) or "run"
    job = n.fields.get("job_id") or run.job_id
    text = f"[{name}] {n.event.value}: {n.reason}" + (f" (job {job})" if job else "")
    return {"v": PAYLOAD_VERSION, "event": n.event.value, "run_name": run.name, "run_dir": run.run_dir,
            "job_id": str(job) if job is not None else None, "reason": n.reason, "trigger": n.trigger,
            "fields": dict(n.fields), "host": run.host, "ts": ts, "text": text, "supervisor_version": __version__}


def command_env(payload: Mapping[str, Any], base: Mapping[str, str]) -> dict[str, str]:
    """The command's environment: the supervisor's, plus the payload's main facts (NotifyConfig.ENV_VARS)."""

    def value(v: Any) -> str:
        text = "" if v is None else str(v)
        return text.replace("\x00", "")[:MAX_ENV_VALUE]

    env = dict(base)
    env.update({"SUPERVISE_EVENT": value(payload["event"]), "SUPERVISE_REASON": value(payload["reason"]),
                "SUPERVISE_RUN_NAME": value(payload["run_name"]), "SUPERVISE_RUN_DIR": value(payload["run_dir"]),
                "SUPERVISE_JOB_ID": value(payload["job_id"]), "SUPERVISE_TRIGGER": value(payload["trigger"])})
    return env


# ---------------------------------------------------------------------------------------------
# Sending


class SendFailed(Exception):
    """One try failed; ``retry`` False when trying again cannot help (a 404, a bad request)."""

    def __init__(self, message: str, retry: bool = True) -> None:
        super().__init__(message)
        self.retry = retry


def post_json(url: str, body: bytes, timeout: float) -> None:
    """POST once. 2xx is done; 408, 429, 5xx, timeouts and connection errors are worth another try;
    other answers are final."""
    target = os.path.expandvars(url)
    if urlsplit(target).scheme not in ("http", "https"):  # checked in the config; again after ${VAR}
        raise SendFailed(f"not an http(s) URL after expanding variables: {url}", retry=False)
    request = urllib.request.Request(
        target, data=body, method="POST",
        headers={"Content-Type": "application/json", "User-Agent": f"slurm-supervisor/{__version__}"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read(65536)
    except urllib.error.HTTPError as exc:
        raise SendFailed(f"HTTP {exc.code} {exc.reason}", retry=exc.code in (408, 429) or exc.code >= 500) from None
    except (urllib.error.URLError, OSError) as exc:  # refused, DNS, TLS, timeout
        reason = getattr(exc, "reason", exc)
        raise SendFailed(f"{type(reason).__name__}: {reason}") from None


def run_command(argv: list[str], body: bytes, env: Mapping[str, str], timeout: float) -> None:
    """Run once with the payload on stdin; exit 0 is done, anything else (or the timeout) is a failure.
    The command runs in its own process group, so a timeout ends whatever it started too (a shell
    script's ``curl`` or ``sleep`` would otherwise hold its output pipe open)."""
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=dict(env), start_new_session=True)
    except OSError as exc:
        raise SendFailed(f"cannot run {argv[0]}: {exc.strerror}", retry=False) from None
    try:
        out, err = proc.communicate(body, timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise SendFailed(f"{argv[0]} did not finish within {timeout:g}s") from None
    except BaseException:
        _kill_group(proc)
        raise
    if proc.returncode != 0:
        text = (err or out or b"").decode(errors="replace").strip()[-MAX_OUTPUT_LOGGED:]
        raise SendFailed(f"{argv[0]} exited {proc.returncode}{': ' + text if text else ''}")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        proc.communicate(timeout=5)
    except (subprocess.TimeoutExpired, OSError, ValueError):
        pass


class Channel(Protocol):
    """One way of telling a person. ``send`` runs on the notifier's thread with the JSON body and
    the payload it encodes; it raises :class:`SendFailed` (``retry=False`` for a fault no retry
    can mend), and is retried with backoff otherwise. ``name`` appears in failure messages."""

    @property
    def name(self) -> str: ...

    def send(self, body: bytes, payload: Mapping[str, Any]) -> None: ...


@dataclass(frozen=True)
class CommandChannel:
    """``notify.command``: the program gets the body on stdin and the main facts in its environment."""

    argv: tuple[str, ...]
    timeout: float
    name: str = "command"

    def send(self, body: bytes, payload: Mapping[str, Any]) -> None:
        run_command(list(self.argv), body, command_env(payload, os.environ), self.timeout)


@dataclass(frozen=True)
class UrlChannel:
    """``notify.url``: the body POSTed as JSON (``${VAR}`` in the URL read when sending)."""

    url: str
    timeout: float
    name: str = "url"

    def send(self, body: bytes, payload: Mapping[str, Any]) -> None:
        post_json(self.url, body, self.timeout)


ChannelFactory = Callable[[NotifyConfig], "Channel | None"]


def _command_channel(cfg: NotifyConfig) -> Channel | None:
    return CommandChannel(tuple(shlex.split(cfg.command)), cfg.timeout) if cfg.command else None


def _url_channel(cfg: NotifyConfig) -> Channel | None:
    return UrlChannel(cfg.url, cfg.timeout) if cfg.url else None


# The channels, in the order a notification is sent on them: each factory returns its channel when
# the configuration asks for it, else None. A new channel is one class and one entry here
# (docs/architecture.md, "How to add").
CHANNELS: list[ChannelFactory] = [_command_channel, _url_channel]


def register_channel(factory: ChannelFactory) -> None:
    """Add a channel factory (taken by notifiers created afterwards)."""
    if factory not in CHANNELS:
        CHANNELS.append(factory)


def channels_for(cfg: NotifyConfig) -> list[Channel]:
    """The channels ``cfg`` asks for, in :data:`CHANNELS` order."""
    return [c for c in (factory(cfg) for factory in CHANNELS) if c is not None]


@dataclass
class NotifyStats:
    """What happened to the notifications, for the run's record (counted, never raised)."""

    queued: int = 0
    sent: int = 0  # per channel (command, url) that succeeded
    failed: int = 0  # per channel that gave up
    retried: int = 0  # tries after a first failure
    dropped: int = 0  # the queue was full
    errors: list[str] = field(default_factory=list)  # the last few, newest last

    def to_json(self) -> dict[str, Any]:
        return {"queued": self.queued, "sent": self.sent, "failed": self.failed, "retried": self.retried,
                "dropped": self.dropped, "errors": list(self.errors)}


class Notifier:
    """The queue and its one worker thread, for one :class:`NotifyConfig`."""

    def __init__(self, cfg: NotifyConfig, clock: Any = time.time) -> None:
        self.cfg = cfg
        self.clock = clock
        self.wanted = frozenset(NotifyEvent(e) for e in cfg.events)
        self.channels = channels_for(cfg)
        self.run = RunIdentity(job_id=os.environ.get("SLURM_JOB_ID"), host=socket.gethostname())
        self.stats = NotifyStats()
        self._told: set[str] = set()
        self._queue: queue.Queue[dict[str, Any]] = queue.Queue(maxsize=cfg.queue_size)
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._work, name="supervise-notify", daemon=True)
        self._thread.start()
        atexit.register(self._drain_at_exit)

    def offer(self, event_name: str, fields: Mapping[str, Any]) -> None:
        """Called on the loop's thread: decide, then only enqueue."""
        if event_name == "run_start":
            self.run = RunIdentity(name=_text(fields.get("name")) or self.run.name,
                                   run_dir=_text(fields.get("run_dir")) or self.run.run_dir,
                                   job_id=_text(fields.get("job_id")) or self.run.job_id,
                                   host=_text(fields.get("host")) or self.run.host)
            return
        n = notification_for(event_name, fields)
        if n is None or n.event not in self.wanted or n.key in self._told:
            return
        self._told.add(n.key)
        payload = redact_value(build_payload(n, self.run, self.clock()))  # body, and the command's env
        try:
            self._queue.put_nowait(payload)
        except queue.Full:
            with self._lock:
                self.stats.dropped += 1
            log.warning("notification %s dropped: %d already waiting to be sent", n.event.value, self.cfg.queue_size)
            return
        with self._lock:
            self.stats.queued += 1

    def drain(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for everything queued to be sent or given up; True when it was."""
        end = time.monotonic() + max(timeout, 0.0)
        while self._queue.unfinished_tasks and time.monotonic() < end:
            time.sleep(0.01)
        return not self._queue.unfinished_tasks

    def _drain_at_exit(self) -> None:
        """The last notifications (run complete, stopped, cancelled) come just before the process
        exits: give them one try's time, bounded, whoever forgot to call :func:`drain`."""
        waiting = self._queue.unfinished_tasks
        if waiting:
            limit = min(self.cfg.timeout, EXIT_DRAIN_MAX_S)
            log.info("waiting up to %gs for %d notification(s) to be sent", limit, waiting)
            self.drain(limit)

    def snapshot(self) -> NotifyStats:
        """A copy of the counts, safe to read while the worker runs."""
        with self._lock:
            return NotifyStats(self.stats.queued, self.stats.sent, self.stats.failed, self.stats.retried,
                               self.stats.dropped, list(self.stats.errors))

    def _work(self) -> None:
        while True:
            payload = self._queue.get()
            try:
                self._send(payload)
            except Exception as exc:  # noqa: BLE001 - the worker must outlive any bug in one send
                self._record_failure(payload, "notifier", f"{type(exc).__name__}: {exc}")
            finally:
                self._queue.task_done()

    def _send(self, payload: dict[str, Any]) -> None:
        body = json.dumps(payload, default=str).encode()
        for channel in self.channels:
            try:
                self._with_retries(lambda: channel.send(body, payload))  # noqa: B023 - called at once
            except (SendFailed, RetryError) as exc:
                self._record_failure(payload, channel.name, str(exc))
            else:
                with self._lock:
                    self.stats.sent += 1

    def _with_retries(self, send: Any) -> None:
        def count_retry(_state: Any) -> None:
            with self._lock:
                self.stats.retried += 1

        retrying = Retrying(
            stop=stop_after_attempt(self.cfg.retries + 1),
            wait=wait_exponential(multiplier=self.cfg.backoff, max=MAX_BACKOFF_S),
            retry=retry_if_exception(lambda exc: isinstance(exc, SendFailed) and exc.retry),
            before_sleep=count_retry, reraise=True)
        retrying(send)

    def _record_failure(self, payload: Mapping[str, Any], channel: str, error: str) -> None:
        message = redact_text(f"{payload.get('event')} via {channel}: {error}")
        with self._lock:
            self.stats.failed += 1
            self.stats.errors = (self.stats.errors + [message])[-5:]
        log.warning("notification not sent (%s); the run goes on", message)


def _text(v: Any) -> str | None:
    return None if v is None or v == "" else str(v)


# ---------------------------------------------------------------------------------------------
# The entry points the run loop calls

_notifiers: dict[NotifyConfig, Notifier] = {}
_notifiers_lock = threading.Lock()


def notifier_for(cfg: NotifyConfig) -> Notifier:
    """The one notifier of this config in this process (created on first use)."""
    with _notifiers_lock:
        found = _notifiers.get(cfg)
        if found is None:
            found = _notifiers[cfg] = Notifier(cfg)
        return found


def on_event(cfg: NotifyConfig, event_name: str, fields: Mapping[str, Any]) -> None:
    """Offer one logged event (``run_start`` included: it names the run); ``event_name`` is an
    ``Ev`` or its value. Returns at once, never raises: deciding is a dict lookup, sending happens
    on the notifier's thread."""
    if not cfg.enabled:
        return
    try:
        name = event_name.value if isinstance(event_name, Enum) else str(event_name)
        notifier_for(cfg).offer(name, fields)
    except Exception as exc:  # noqa: BLE001 - a notification must never fail the run
        log.warning("notification skipped: %s: %s", type(exc).__name__, exc)


class NotifySink:
    """The run's sink (supervisor/sinks.py) for notifications: each recorded event goes to
    :func:`on_event`, which queues what ``cfg`` asks for and returns at once."""

    def __init__(self, cfg: NotifyConfig) -> None:
        self.cfg = cfg

    def accept(self, event: Event) -> None:
        on_event(self.cfg, event.event, event.fields)


def sink_for(cfg: NotifyConfig) -> NotifySink:
    """The run loop's event sink for ``cfg`` (``RunContext.sinks``)."""
    return NotifySink(cfg)


def drain(cfg: NotifyConfig, timeout: float) -> NotifyStats | None:
    """At the end of the run: wait up to ``timeout`` s for queued notifications; their counts.
    None when notifications are off. Never raises."""
    if not cfg.enabled:
        return None
    try:
        n = notifier_for(cfg)
        n.drain(timeout)
        return n.snapshot()
    except Exception as exc:  # noqa: BLE001
        log.warning("notification drain failed: %s: %s", type(exc).__name__, exc)
        return None
