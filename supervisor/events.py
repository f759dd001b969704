"""Append-only JSONL event log: every decision, one JSON object per line (the
event table is in docs/architecture.md).

Reports and audits are folds over this log, so it is the single source of truth for what happened.
Each record has ``ts`` (epoch seconds), ``event`` (a name from :class:`Ev`), ``v`` (format version)
and flat fields.

Writing (:class:`EventLog`) never raises into the run loop: a record is written whole, with one
``write`` on an ``O_APPEND`` descriptor, or not at all. When the disk refuses it (full, quota, I/O
error) the record waits in a small in-memory backlog and the log is re-aligned on a fresh line; when
space returns the backlog is written in order and an ``event_log_gap`` record says what was delayed
and what was lost. A run directory deleted or moved mid-run is re-created and the log copied into
it; the run's own history stays readable through the open descriptor (:meth:`EventLog.read`).

Reading (:func:`read_events`) tolerates a truncated last line (a killed supervisor), garbage lines
and records whose known fields have the wrong type (``"attempt": "x"``): they are skipped and
counted, so every consumer gets well-typed events.
"""

from __future__ import annotations

import collections
import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from .private import GROUP_READ, append_fd
from .redact import redact_value

if TYPE_CHECKING:  # annotations only
    from typing_extensions import Self

FORMAT_VERSION = 1
LOG_MODE = GROUP_READ  # argv and output excerpts, redacted: owner and group (docs/security.md)
BACKLOG = 256  # records kept in memory while the disk refuses them
MAX_STEP = 2**53  # the control channel's bound on steps (supervisor.control.MAX_STEP)
_MAX_INT = 2**63


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
    STOP_CAUSE = "stop_cause"  # why Slurm (or a person) ended the attempt, read from the job record
    STALL = "stall"
    SLOWDOWN = "slowdown"
    LOSS_ANOMALY = "loss_anomaly"
    CONTROL_DROPPED = "control_dropped"  # datagrams forged, replayed, malformed, oversized, flooded
    PREFLIGHT = "preflight"
    DETERMINISM = "determinism"  # what the client reports of torch determinism settings
    WARNING = "warning"
    EVENT_LOG_GAP = "event_log_gap"  # the log could not be written for a while: delayed, lost, why
    SLOW_NODE = "slow_node"  # a node whose ranks step slower than the other nodes' (supervisor.addons.slownode)
    DIAGNOSIS = "diagnosis"  # supervise diagnose: where a GPU failure really happened (supervisor.addons.diagnose)
    RESUMABILITY = "resumability"  # can this run resume? said at the first save (supervisor.resumability)
    SAVE_ELSEWHERE = "save_elsewhere"  # the output says a checkpoint was saved outside the watched directory


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


# ---------------------------------------------------------------------------------------------
# Reading


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_step(value: Any) -> bool:
    return _is_int(value) and 0 <= value < MAX_STEP


def _is_count(value: Any) -> bool:
    return _is_int(value) and -_MAX_INT < value < _MAX_INT


def _is_number(value: Any) -> bool:
    """A float (NaN and infinities included: a NaN loss is a fact) or an int a float can hold."""
    if isinstance(value, float):
        return True
    return _is_int(value) and abs(value) < 2**1000


# The envelope and the fields consumers compute with: a record whose value has another type (or is
# out of range) is skipped and counted, never handed on. ``None`` is allowed for every optional one.
_FIELD_CHECKS: dict[str, Callable[[Any], bool]] = {
    "attempt": lambda v: _is_int(v) and 0 <= v < 2**31,
    "attempts": lambda v: _is_int(v) and 0 <= v < 2**31,
    "step": _is_step, "first_step": _is_step, "last_step": _is_step, "last_durable_step": _is_step,
    "resume_step": _is_step, "expected_step": _is_step, "got_step": _is_step,
    "steps_lost": _is_count, "exit_code": _is_count, "bytes": _is_count, "pid": _is_count,
    "restart_count": _is_count, "count": _is_count,
    "duration": _is_number, "wall_lost": _is_number, "rate": _is_number, "deadline": _is_number,
    "delay": _is_number, "idle_s": _is_number,
    "ok": lambda v: isinstance(v, bool),
    "class": lambda v: isinstance(v, str), "action": lambda v: isinstance(v, str) or v is None,
    "outcome": lambda v: isinstance(v, str), "reason": lambda v: isinstance(v, str),
    "path": lambda v: isinstance(v, str), "source": lambda v: isinstance(v, str),
}


def record_problem(record: dict[str, Any]) -> str | None:
    """Why a decoded line is not a well-typed record, or None when it is."""
    event = record.get("event")
    if not isinstance(event, str) or not event:
        return "event must be a non-empty string"
    ts = record.get("ts")
    if not (isinstance(ts, (int, float)) and not isinstance(ts, bool) and math.isfinite(ts)):
        return "ts must be a finite number"
    version = record.get("v", 0)
    if not _is_int(version):
        return "v must be an integer"
    for name, check in _FIELD_CHECKS.items():
        value = record.get(name)
        if value is not None and not check(value):
            return f"{name} has the wrong type or is out of range: {str(value)[:40]!r}"
    return None


def parse_line(line: str) -> Event | None:
    """One line to an Event, or None for a line that is not a valid, well-typed record."""
    line = line.strip()
    if not line:
        return None
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):  # ValueError: also integers of more than 4300 digits
        return None
    if not isinstance(record, dict) or record_problem(record) is not None:
        return None
    ts = record.pop("ts")
    name = record.pop("event")
    version = record.pop("v", 0)
    return Event(name, float(ts), record, version)


@dataclass
class ReadResult:
    events: list[Event]
    bad_lines: int  # lines that are not valid records: garbage, torn, or wrong field types
    versions: set[int]
    bad_fields: int = 0  # of bad_lines: JSON records skipped because a known field had the wrong type


def _read_lines(lines: Iterable[bytes]) -> ReadResult:
    events: list[Event] = []
    bad = bad_fields = 0
    versions: set[int] = set()
    for raw in lines:
        text = raw.decode("utf-8", errors="replace")
        ev = parse_line(text)
        if ev is None:
            if text.strip():
                bad += 1
                if _json_object(text):
                    bad_fields += 1
            continue
        versions.add(ev.version)
        events.append(ev)
    return ReadResult(events, bad, versions, bad_fields)


def _json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except (ValueError, RecursionError):
        return False


def read_events(path: Path) -> ReadResult:
    """Read every valid record; count the lines that are not (a torn tail is normal after a kill).
    Raises OSError when the file cannot be read (callers name the path)."""
    with open(path, "rb") as fh:
        return _read_lines(fh)


# ---------------------------------------------------------------------------------------------
# Writing


def _short_error(exc: OSError) -> str:
    return f"{exc.strerror or exc}" + (f" (errno {exc.errno})" if exc.errno else "")


class EventLog:
    """Appends events to ``events.jsonl``: one ``write`` per record on an ``O_APPEND`` descriptor, so
    concurrent readers see whole lines. Never raises into the run loop (see the module docstring).

    ``DURABLE`` events are fsynced (run and attempt boundaries, failures, quarantines): those are
    what a post-mortem needs after a node dies.
    """

    DURABLE = frozenset({
        Ev.RUN_START, Ev.RUN_END, Ev.ATTEMPT_START, Ev.ATTEMPT_END, Ev.FAILURE, Ev.QUARANTINE,
        Ev.DECISION, Ev.REQUEUE, Ev.NOTICE, Ev.ARBITRATION, Ev.RESUME_POINT, Ev.SAVE_END, Ev.EVENT_LOG_GAP,
    })

    def __init__(self, path: Path, clock: Callable[[], float] = time.time, backlog: int = BACKLOG,
                 stderr: TextIO | None = None) -> None:
        self.path = Path(path)
        self._clock = clock
        self._stderr = stderr
        self._lock = threading.Lock()
        self._fd = -1
        self._identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the file we append to
        self._backlog: collections.deque[tuple[bytes, bool]] = collections.deque()
        self._backlog_max = max(backlog, 1)
        self._needs_newline = False  # a short write left a torn line: start the next on a fresh one
        self._failing_since: float | None = None
        self._failure: str | None = None
        self._delayed = 0  # records that waited in the backlog during the current gap
        self._lost = 0  # records evicted from the full backlog during the current gap
        self.lost_total = 0
        self._warned: set[str] = set()
        self._open()
        if self._fd >= 0:
            self._start_on_a_fresh_line()

    # descriptor ------------------------------------------------------------------------------

    def _open(self) -> bool:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = append_fd(self.path, LOG_MODE)
            st = os.fstat(fd)
        except OSError as exc:
            self._failure = f"cannot open it: {_short_error(exc)}"
            self._warn("open", f"cannot open the event log {self.path} ({_short_error(exc)}); "
                               f"keeping up to {self._backlog_max} events in memory")
            return False
        if self._fd >= 0:
            try:
                os.close(self._fd)
            except OSError:
                pass
        self._fd, self._identity = fd, (st.st_dev, st.st_ino)
        return True

    def _start_on_a_fresh_line(self) -> None:
        """A killed supervisor may have left a torn last line."""
        try:
            size = os.fstat(self._fd).st_size
            if size and os.pread(self._read_fd(), 1, size - 1) != b"\n":
                self._needs_newline = True
        except OSError:
            pass

    def _read_fd(self) -> int:
        """A readable descriptor of the same file (ours is write-only): through /proc where the path
        may be gone, else the path."""
        for candidate in (f"/proc/self/fd/{self._fd}", str(self.path)):
            try:
                fd = os.open(candidate, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) == self._identity:
                return fd
            os.close(fd)
        raise FileNotFoundError(f"no readable view of {self.path}")

    def _path_still_ours(self) -> bool:
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self._identity

    def _recreate(self) -> None:
        """The path no longer names our file (the run directory was deleted or moved): write a copy
        of what we have at the path and append there from now on."""
        history = self._snapshot_bytes()
        old_identity = self._identity
        if not self._open():
            return
        if self._identity == old_identity:
            return
        if history:
            if not history.endswith(b"\n"):
                history += b"\n"
            try:
                written = os.write(self._fd, history)
                if written != len(history):
                    self._needs_newline = True
            except OSError:
                pass
        self._warn("recreated", f"the event log {self.path} vanished (run directory deleted or moved); "
                                "re-created it with the history so far")

    def _snapshot_bytes(self) -> bytes:
        if self._fd < 0:
            return b""
        try:
            fd = self._read_fd()
        except OSError:
            return b""
        try:
            chunks = []
            offset = 0
            while True:
                chunk = os.pread(fd, 1 << 20, offset)
                if not chunk:
                    break
                chunks.append(chunk)
                offset += len(chunk)
            return b"".join(chunks)
        except OSError:
            return b""
        finally:
            os.close(fd)

    # writing ---------------------------------------------------------------------------------

    def emit(self, event: Ev | str, **fields: Any) -> Event:
        """Record ``event`` now. Returns the Event whether or not the disk took it."""
        name = event.value if isinstance(event, Ev) else str(event)
        ev = Event(name, self._clock(), redact_value(fields))  # no credential reaches the file
        try:
            data = (ev.to_json() + "\n").encode("utf-8", "backslashreplace")
        except (TypeError, ValueError, RecursionError):  # a circular or NaN-keyed value: keep what we can
            data = (Event(name, ev.ts, {"unserializable_fields": repr(fields)[:4000]}).to_json() + "\n").encode()
        durable = name in _DURABLE_NAMES
        with self._lock:
            try:
                self._append(data, durable)
            except Exception as exc:  # noqa: BLE001 - the log must never take the supervisor down
                self._warn("bug", f"event log write failed unexpectedly: {type(exc).__name__}: {exc}")
        return ev

    def _append(self, data: bytes, durable: bool) -> None:
        if self._fd < 0 or not self._path_still_ours():
            self._recreate()
        if self._backlog and self._fd >= 0:
            self._flush_backlog()  # what waits goes first; the gap record closes it
        if self._backlog or self._fd < 0:  # still refused: wait behind the others, in order
            if self._failing_since is None:
                self._begin_gap(self._failure or "the event log is not open")
            self._keep(data, durable)
            return
        error = self._write_line(data, durable)
        if error is not None:
            self._begin_gap(error)
            self._keep(data, durable)

    def _write_line(self, data: bytes, durable: bool) -> str | None:
        """Write one whole line; None when it landed, else what went wrong."""
        if self._fd < 0:
            return self._failure or "the event log is not open"
        try:
            if self._needs_newline:
                if os.write(self._fd, b"\n") != 1:
                    return "short write of a newline"
                self._needs_newline = False
            written = os.write(self._fd, data)
        except OSError as exc:
            return _short_error(exc)
        if written != len(data):
            # A torn line is on disk now (readers skip it). Re-align so the next record starts on a
            # fresh line instead of being glued onto it.
            self._needs_newline = True
            try:
                if os.write(self._fd, b"\n") == 1:
                    self._needs_newline = False
            except OSError:
                pass
            return f"short write ({written} of {len(data)} bytes): disk full?"
        if durable:
            try:
                os.fsync(self._fd)
            except OSError as exc:
                self._warn("fsync", f"fsync of the event log failed ({_short_error(exc)})")
        return None

    def _keep(self, data: bytes, durable: bool) -> None:
        if len(self._backlog) >= self._backlog_max:
            evict = next((i for i, (_d, is_durable) in enumerate(self._backlog) if not is_durable), 0)
            del self._backlog[evict]
            self._lost += 1
            self.lost_total += 1
        self._backlog.append((data, durable))
        self._delayed += 1

    def _begin_gap(self, error: str) -> None:
        if self._failing_since is None:
            self._failing_since = self._clock()
            self._delayed = self._lost = 0
        self._failure = error
        self._warn("gap", f"cannot write the event log {self.path} ({error}); keeping up to "
                          f"{self._backlog_max} events in memory until it can")

    def _flush_backlog(self) -> None:
        while self._backlog:
            data, durable = self._backlog[0]
            error = self._write_line(data, durable)
            if error is not None:
                self._begin_gap(error)
                return
            self._backlog.popleft()
        if self._failing_since is not None:
            gap = Event(Ev.EVENT_LOG_GAP.value, self._clock(), {
                "since": round(self._failing_since, 6), "delayed": self._delayed - self._lost,
                "lost": self._lost, "error": self._failure,
                "reason": f"the event log could not be written from {self._failing_since:.0f} "
                          f"({self._failure}); {self._delayed - self._lost} events written late, "
                          f"{self._lost} lost"})
            if self._write_line((gap.to_json() + "\n").encode(), True) is None:
                self._failing_since, self._failure = None, None
                self._warned.discard("gap")

    def flush(self) -> bool:
        """Try to write the backlog now; True when nothing is waiting."""
        with self._lock:
            if self._backlog:
                try:
                    if self._fd < 0 or not self._path_still_ours():
                        self._recreate()
                    self._flush_backlog()
                except Exception:  # noqa: BLE001, S110 - never raise into the loop
                    pass
            return not self._backlog

    @property
    def pending(self) -> int:
        """Events waiting in memory for the disk."""
        return len(self._backlog)

    # reading back ----------------------------------------------------------------------------

    def read(self) -> ReadResult:
        """This run's log as the loop should see it: what is on disk (through the open descriptor,
        even if the path was deleted) plus what still waits in memory. Never raises."""
        with self._lock:
            data = self._snapshot_bytes()
            if not data:
                try:
                    data = self.path.read_bytes()
                except OSError:
                    data = b""
            waiting = [d for d, _ in self._backlog]
        return _read_lines([*data.splitlines(keepends=True), *waiting])

    # ---------------------------------------------------------------------------------------------

    def _warn(self, key: str, message: str) -> None:
        """One line on stderr per kind of trouble: the console still has the story."""
        if key in self._warned:
            return
        self._warned.add(key)
        stream = self._stderr if self._stderr is not None else sys.stderr
        try:
            stream.write(f"supervise: warning: {message}\n")
            stream.flush()
        except Exception:  # noqa: BLE001, S110 - a closed stderr must not stop the supervisor
            pass

    def close(self) -> None:
        self.flush()
        with self._lock:
            if self._fd >= 0:
                try:
                    os.close(self._fd)
                except OSError:
                    pass
                self._fd = -1

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_DURABLE_NAMES = frozenset(e.value for e in EventLog.DURABLE)


def iter_kind(events: Iterable[Event], *names: Ev | str) -> Iterator[Event]:
    wanted = {n.value if isinstance(n, Ev) else n for n in names}
    return (e for e in events if e.event in wanted)
