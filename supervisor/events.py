"""Append-only JSONL event log: every decision, one JSON object per line (DESIGN.md §3, §9).

Reports and audits are folds over this log, so it is the single source of truth for what happened.
Each record has ``ts`` (epoch seconds), ``event`` (a name from :class:`Ev`), ``v`` (format version)
and flat fields. Readers tolerate a truncated last line (a killed supervisor) and garbage lines.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Iterable, Iterator

FORMAT_VERSION = 1


class Ev(str, Enum):
    """Event names. The ``str`` mixin lets values go into JSON unchanged."""

    RUN_START = "run_start"
    RUN_END = "run_end"
    ATTEMPT_START = "attempt_start"
    ATTEMPT_END = "attempt_end"
    RESUME_POINT = "resume_point"  # chosen before an attempt: path, step, candidates
    QUARANTINE = "quarantine"  # a torn checkpoint renamed aside
    PROGRESS = "progress"  # sampled step reports (not every step)
    RESUMED = "resumed"  # first step the child reported after starting
    RESUME_MISMATCH = "resume_mismatch"  # child started elsewhere than the resume point
    SAVE_BEGIN = "save_begin"
    SAVE_END = "save_end"
    SAVE_ABORTED = "save_aborted"
    FAILURE = "failure"  # the classified end of an attempt, with first-failure evidence
    DECISION = "decision"  # restart / requeue / stop, with its reason
    BUDGET = "budget"  # a budget verdict
    NOTICE = "notice"  # stop notice: signal, poll, time limit
    ARBITRATION = "arbitration"  # block / abort / emergency save / stop now, with the numbers
    REQUEUE = "requeue"
    STALL = "stall"
    SLOWDOWN = "slowdown"
    LOSS_ANOMALY = "loss_anomaly"
    CONTROL_DROPPED = "control_dropped"  # messages without the token, malformed, oversized
    PREFLIGHT = "preflight"
    DETERMINISM = "determinism"  # what the client reports of torch determinism settings
    WARNING = "warning"


@dataclass(frozen=True)
class Event:
    """One record of the log."""

    event: str
    ts: float
    fields: dict[str, Any] = field(default_factory=dict)
    version: int = FORMAT_VERSION

    def to_json(self) -> str:
        record = {"ts": round(self.ts, 6), "event": self.event, "v": FORMAT_VERSION}
        record.update(self.fields)
        return json.dumps(record, sort_keys=False, default=str, separators=(",", ":"))

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)


def parse_line(line: str) -> Event | None:
    """One line to an Event, or None for a line that is not a valid record (torn, garbage)."""
    line = line.strip()
    if not line:
        return None
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("event"), str):
        return None
    ts = record.pop("ts", None)
    name = record.pop("event")
    version = record.pop("v", 0)
    if not isinstance(ts, (int, float)):
        return None
    return Event(name, float(ts), record, version if isinstance(version, int) else 0)


@dataclass
class ReadResult:
    events: list[Event]
    bad_lines: int
    versions: set[int]


def read_events(path: Path) -> ReadResult:
    """Read every valid record; count the lines that are not (a torn tail is normal after a kill)."""
    events: list[Event] = []
    bad = 0
    versions: set[int] = set()
    with open(path, "rb") as fh:
        for raw in fh:
            text = raw.decode("utf-8", errors="replace")
            ev = parse_line(text)
            if ev is None:
                if text.strip():
                    bad += 1
                continue
            versions.add(ev.version)
            events.append(ev)
    return ReadResult(events, bad, versions)


class EventLog:
    """Appends events to ``events.jsonl``; one ``write`` per record so concurrent readers see whole lines.

    ``durable=True`` events are fsynced (run and attempt boundaries, failures, quarantines): those are
    what a post-mortem needs after a node dies.
    """

    DURABLE = {
        Ev.RUN_START, Ev.RUN_END, Ev.ATTEMPT_START, Ev.ATTEMPT_END, Ev.FAILURE, Ev.QUARANTINE,
        Ev.DECISION, Ev.REQUEUE, Ev.NOTICE, Ev.ARBITRATION, Ev.RESUME_POINT, Ev.SAVE_END,
    }

    def __init__(self, path: Path, clock=time.time) -> None:
        self.path = path
        self._clock = clock
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        # A killed supervisor may have left a torn last line: start on a fresh line.
        try:
            size = os.fstat(self._fd).st_size
            if size:
                with open(path, "rb") as fh:
                    fh.seek(size - 1)
                    if fh.read(1) != b"\n":
                        os.write(self._fd, b"\n")
        except OSError:
            pass

    def emit(self, event: Ev | str, **fields: Any) -> Event:
        name = event.value if isinstance(event, Ev) else str(event)
        ev = Event(name, self._clock(), fields)
        data = (ev.to_json() + "\n").encode()
        try:
            os.write(self._fd, data)
            if event in self.DURABLE:
                os.fsync(self._fd)
        except OSError:
            # A full or vanished disk must not kill the supervisor; the console still has the log.
            pass
        return ev

    def close(self) -> None:
        try:
            os.close(self._fd)
        except OSError:
            pass

    def __enter__(self) -> "EventLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def iter_kind(events: Iterable[Event], *names: Ev | str) -> Iterator[Event]:
    wanted = {n.value if isinstance(n, Ev) else n for n in names}
    return (e for e in events if e.event in wanted)
