"""The metrics writer: an event sink (``supervisor/sinks.py``) that keeps the run's metrics files up
to date from a thread of its own.

``accept`` only queues the event, so the run loop never waits for a disk, with two exceptions where
waiting is the point: a ``resume_point`` (written right before a launch: the training reads the
snapshot at its start and must find itself counted) and a ``run_end`` (the process exits next).
Both waits are bounded. The history of earlier jobs of the run is never read from the file here:
the run loop reads the log once at its start (the source of its in-memory ledger) and hands those
events to :meth:`MetricsSink.seed` (``RunContext.begin``, ``supervisor/sinks.py``), before it
records anything; they are folded on the writer's thread, and every event after that comes through
``accept``, so nothing is counted twice.

Files (paths in ``metrics.*`` of the config, relative to the run directory):

* ``supervisor/metrics.json``: the snapshot the training side reads (always, while metrics are on);
* ``metrics.prometheus_file``: the Prometheus text exposition, replaced atomically (temp + rename);
* ``metrics.otel_file``: OpenTelemetry-style JSON lines, one appended per event of ``OTEL_EVENTS``.

All are created owner read-write, group read (``supervisor/private.py``), like the event log.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ...config import MetricsConfig
from ...events import Ev, Event
from ...private import GROUP_READ, append_fd, write_atomic
from .model import EventWindow, RunMetrics, run_metrics
from .render import OTEL_EVENTS, otel_record, otel_resource, prometheus_text, snapshot_json

log = logging.getLogger("supervisor.addons.metrics")

__all__ = ["MetricsSink", "SNAPSHOT_NAME", "metrics_sink"]

SNAPSHOT_NAME = "metrics.json"  # in <run>/supervisor/: what supervisor.client.restart_metrics() reads
FILE_MODE = GROUP_READ
WAIT_BEFORE_LAUNCH_S = 5.0  # at a resume point: the files are current before the child starts
WAIT_AT_RUN_END_S = 2.0  # at run_end: the last numbers reach the files before the process exits
_WAITS = {Ev.RESUME_POINT.value: WAIT_BEFORE_LAUNCH_S, Ev.RUN_END.value: WAIT_AT_RUN_END_S}
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")


def file_name_part(name: str) -> str:
    """The run's name as it may appear in a file name (``{name}`` in the paths)."""
    return _UNSAFE_NAME.sub("_", name)[:100] or "run"


@dataclass(frozen=True)
class _History:
    """The run's events before this job, queued for the writer's thread ahead of the first event."""

    events: Sequence[Event]


class MetricsSink:
    """Receives the run's events and writes the metrics files (see the module docstring)."""

    def __init__(self, cfg: MetricsConfig, run_dir: Path, name: str, host: str) -> None:
        self.run_dir = Path(run_dir)
        self.name = name
        self.snapshot_path = self.run_dir / "supervisor" / SNAPSHOT_NAME
        self.prometheus_path = self._resolve(cfg.prometheus_file) if "prometheus" in cfg.formats else None
        self.otel_path = self._resolve(cfg.otel_file) if "otel" in cfg.formats else None
        self._resource = otel_resource(name, str(self.run_dir), host)
        self._window = EventWindow()
        self._cond = threading.Condition()
        self._pending: collections.deque[Event | _History] = collections.deque()
        self._received = 0  # events accepted
        self._done = 0  # events written out
        self._otel_fd = -1
        self._last_written: tuple[str, str] | None = None
        self._warned: set[str] = set()
        self._thread = threading.Thread(target=self._work, name="supervise-metrics", daemon=True)
        self._thread.start()

    def _resolve(self, template: str) -> Path:
        path = Path(os.path.expanduser(template.replace("{name}", file_name_part(self.name))))
        return path if path.is_absolute() else self.run_dir / path

    # the run loop's side ------------------------------------------------------------------------

    def accept(self, event: Event) -> None:
        """Queue the event; at a resume point or the run's end, wait (bounded) until it is written."""
        with self._cond:
            self._pending.append(event)
            self._received += 1
            ticket = self._received
            self._cond.notify_all()
            wait = _WAITS.get(event.event)
            if wait is not None:
                self._cond.wait_for(lambda: self._done >= ticket, timeout=wait)

    def seed(self, history: Sequence[Event]) -> None:
        """The run's events before this job, as the run loop read them once at its start (and folded
        into its ledger): counted on the writer's thread, never read from the file again. Returns at
        once; the list is not copied (the loop keeps no other use for it)."""
        with self._cond:
            self._pending.append(_History(history))
            self._cond.notify_all()

    def flush(self, timeout: float = WAIT_AT_RUN_END_S) -> bool:
        """Wait until every accepted event is written; False when the time ran out."""
        with self._cond:
            ticket = self._received
            return self._cond.wait_for(lambda: self._done >= ticket, timeout=timeout)

    # the writer's thread --------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._pending))
                items = list(self._pending)
                self._pending.clear()
            batch: list[Event] = []
            for item in items:
                if isinstance(item, _History):  # seeded before the first event: in order
                    self._fold_history(item.events)
                else:
                    batch.append(item)
            if batch:
                try:
                    self._write(batch)
                except Exception as exc:  # noqa: BLE001 - metrics are advice; the writer goes on
                    self._warn("bug", f"metrics writer failed: {type(exc).__name__}: {exc}")
            with self._cond:
                self._done += len(batch)
                self._cond.notify_all()

    def _fold_history(self, events: Sequence[Event]) -> None:
        try:
            for event in events:
                self._window.add(event)  # the window keeps what the fold needs (model.EventWindow)
        except Exception as exc:  # noqa: BLE001 - counted from now on instead
            self._warn("history", f"metrics: cannot count the run's earlier events ({exc}); counting from now")

    def _write(self, batch: list[Event]) -> None:
        lines: list[bytes] = []
        for event in batch:
            self._window.add(event)
            if self.otel_path is not None and event.event in OTEL_EVENTS:
                record = otel_record(event, run_metrics(self._window.events, self._window.saves), self._resource)
                if record is not None:
                    lines.append((json.dumps(record, separators=(",", ":"), default=str) + "\n").encode())
        metrics = run_metrics(self._window.events, self._window.saves)
        self._write_files(metrics)
        for line in lines:
            self._append_otel(line)
        if any(e.event == Ev.RUN_END.value for e in batch):
            self._close_otel()

    def _write_files(self, metrics: RunMetrics) -> None:
        snapshot = snapshot_json(metrics, self.name)
        text = prometheus_text(metrics, self.name) if self.prometheus_path is not None else ""
        if self._last_written == (snapshot, text):
            return
        self._atomic(self.snapshot_path, snapshot)
        if self.prometheus_path is not None:
            self._atomic(self.prometheus_path, text)
        self._last_written = (snapshot, text)

    def _atomic(self, path: Path, text: str) -> None:
        try:
            write_atomic(path, text.encode(), FILE_MODE, durable=False)  # atomic; fsync is not worth its time here
        except OSError as exc:
            self._warn(str(path), f"cannot write the metrics file {path} ({exc.strerror or exc}); "
                                  "check the directory exists and is writable (metrics.* in the config)")

    def _append_otel(self, line: bytes) -> None:
        assert self.otel_path is not None
        try:
            if self._otel_fd < 0:
                self._otel_fd = append_fd(self.otel_path, FILE_MODE)
            os.write(self._otel_fd, line)  # one write per record on O_APPEND: readers see whole lines
        except OSError as exc:
            self._warn(str(self.otel_path), f"cannot append to {self.otel_path} ({exc.strerror or exc}); "
                                            "check the directory exists and is writable (metrics.otel_file)")

    def _close_otel(self) -> None:
        if self._otel_fd >= 0:
            try:
                os.close(self._otel_fd)
            except OSError:
                pass
            self._otel_fd = -1

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("%s", message)


def metrics_sink(cfg: MetricsConfig, run_dir: Path, name: str, host: str) -> MetricsSink | None:
    """The sink for this run, or None when metrics are off (``metrics.enabled: false``)."""
    if not cfg.enabled:
        return None
    return MetricsSink(cfg, run_dir, name, host)
