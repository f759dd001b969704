"""Training side of the supervisor channel. Stdlib only: import it from train.py with or without a
supervisor, with or without torch.

    from supervisor import client
    client.install()                          # own SIGTERM: record it, never die mid-save
    start = client.resume_path()              # None when starting fresh
    for step in range(first, total):
        ...
        client.heartbeat(step, loss=loss_value)
        if client.should_stop() or client.save_requested():
            client.save(state, f"ckpt/step-{step}.pt", step)   # atomic write, reported
        if client.should_stop():
            break
    else:
        client.done(total)                    # finished: the exit that follows is completion

Contract: the client never crashes or slows training. Without ``SUPERVISOR_CONTROL``
every call is a cheap no-op and ``resume_path()`` is None. When the channel fails (the supervisor is
gone) sends become no-ops after ONE warning line on stderr, while :func:`should_stop` keeps working
from signals and from the stop file ``$SUPERVISOR_RUN_DIR/supervisor/stop.json``. Sockets are
non-blocking UDP; :func:`heartbeat` costs a clock read and a comparison except when a datagram is due
(at most every :data:`HEARTBEAT_INTERVAL` s on rank 0). Metric values that are tensors are only
converted (a device sync) when a datagram is actually sent; pass Python floats where you have them.

Stop file format (written atomically by the supervisor, removed at attempt start): a JSON object
``{"reason": str, "deadline": epoch s or null, "attempt": int}``; a file naming an earlier attempt
is stale and ignored.
"""

from __future__ import annotations

import atexit
import errno
import faulthandler
import json
import os
import signal
import socket
import stat
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from .control_wire import (
    KEY_ENV,
    LEGACY_KEY_ENV,
    MAX_DATAGRAM,
    SUPERVISOR_KINDS,
    Kind,
    Rejected,
    SeqTracker,
    decode,
    new_sender_id,
    parse_address,
    seal,
    valid_step,
)

if TYPE_CHECKING:  # annotations only: the client stays stdlib-only at run time
    from types import TracebackType

    from typing_extensions import Self

__all__ = [
    "STACK_DUMP_SIGNAL",
    "abort_requested",
    "attempt",
    "checkpoint_dir",
    "done",
    "enabled",
    "heartbeat",
    "install",
    "log_restart_metrics",
    "report_determinism",
    "resume_path",
    "resume_step",
    "restart_metrics",
    "resumed",
    "save",
    "save_deadline",
    "save_requested",
    "saving",
    "should_stop",
    "stop_deadline",
    "stop_reason",
    "update_last",
]

HEARTBEAT_INTERVAL = 0.2  # s between heartbeat datagrams from rank 0
OTHER_RANK_INTERVAL = 2.0  # s between heartbeats from other ranks: liveness, not the step rate
NONFINITE_MIN_GAP = 0.02  # s; a metric turning NaN/inf is sent at once, but never faster than this
HELLO_INTERVAL = 10.0  # s; hello is repeated so a lost datagram only delays broadcasts
DRAIN_INTERVAL = 0.01  # s between non-blocking reads of supervisor messages
# After a notice signal, how long save_requested() waits for the supervisor's verdict (save now, or
# just stop). Slurm signals the training process and the supervisor at the same moment; without
# this wait the child would race the supervisor's decision and leave without its emergency save.
VERDICT_WAIT = 1.0
STOP_FILE_INTERVAL = 1.0  # s between stats of the stop file (it may sit on a shared filesystem)
NOTICE_SIGNALS_ENV = "SUPERVISOR_NOTICE_SIGNALS"  # e.g. "TERM,USR1": default for install()

#: Signal the supervisor sends to ask for a Python stack dump of every thread (on stall). SIGURG,
#: because its default action is "ignore": sent to a process that never called :func:`install`
#: (a shell, a launcher, zero-code training) it does nothing, unlike USR1/USR2 which kill. The dump
#: goes to stderr, hence into the attempt log. Caveat: a Go runtime loaded in-process uses SIGURG
#: for goroutine preemption; do not call install() in such a process.
STACK_DUMP_SIGNAL: signal.Signals | None = getattr(signal, "SIGURG", None)

_monotonic = time.monotonic


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(str(text).strip())
    except (TypeError, ValueError):
        return None


def _rank_from(environ: Mapping[str, str]) -> int:
    """Global rank: torchrun's RANK, else srun's SLURM_PROCID, else LOCAL_RANK, else 0."""
    for name in ("RANK", "SLURM_PROCID", "LOCAL_RANK"):
        value = _int_or_none(environ.get(name))
        if value is not None:
            return value
    return 0


def _as_number(value: Any) -> float | None:
    """A metric as a JSON number. Tensors and numpy scalars convert through ``float()``."""
    if value.__class__ is float or value.__class__ is int:
        return value
    detach = getattr(value, "detach", None)  # a tensor that requires grad warns on float()
    if callable(detach):
        try:
            value = detach()
        except Exception:  # noqa: BLE001 - a metric must never break training
            return None
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):
        return None


def _size_of(path: str) -> int | None:
    """Bytes of a file, or the sum over a directory's files (symlinks not followed)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        return st.st_size
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def _same_save(asked: str | None, path: str | None) -> bool:
    """Whether an abort naming ``asked`` concerns ``path``: the same file, or one is the other's temp
    file (``.<name>.tmp-<pid>-<rand>`` beside it, as the atomic writer and save watcher name them)."""
    if asked is None or path is None:
        return True
    a, p = os.path.abspath(asked), os.path.abspath(str(path))
    if a == p:
        return True
    if os.path.dirname(a) != os.path.dirname(p):
        return False
    a_name, p_name = os.path.basename(a).lstrip("."), os.path.basename(p).lstrip(".")
    return a_name.startswith(p_name + ".") or p_name.startswith(a_name + ".")


def _signal_number(name: str | int) -> signal.Signals:
    if isinstance(name, int):
        return signal.Signals(name)
    text = str(name).strip().upper()
    return signal.Signals[text if text.startswith("SIG") else "SIG" + text]


class _Client:
    """Per-process state behind the module functions. Built lazily from the environment."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.pid = os.getpid()
        self.rank = _rank_from(environ)
        self.attempt = _int_or_none(environ.get("SUPERVISOR_ATTEMPT"))
        self.resume_path = environ.get("SUPERVISOR_RESUME_FROM") or None
        self.resume_step = _int_or_none(environ.get("SUPERVISOR_RESUME_STEP")) if self.resume_path else None
        self.checkpoint_dir = environ.get("SUPERVISOR_CHECKPOINT_DIR") or None
        self.address = environ.get("SUPERVISOR_CONTROL") or ""
        # The per-run key authenticates every datagram and never travels. $SUPERVISOR_TOKEN is the
        # name run loops of protocol 1 exported it under.
        self.key = environ.get(KEY_ENV) or environ.get(LEGACY_KEY_ENV) or ""
        self.sender_id = new_sender_id()
        self._seq = 0
        self._supervisor_seq = SeqTracker(capacity=4)
        self.rejected = 0  # datagrams to our reply port that were not the supervisor's (or replays)
        self.notice_signals = environ.get(NOTICE_SIGNALS_ENV, "")
        run_dir = environ.get("SUPERVISOR_RUN_DIR") or ""
        self.stop_file = os.path.join(run_dir, "supervisor", "stop.json") if run_dir else None
        try:
            self.host = socket.gethostname()
        except OSError:
            self.host = ""

        # What the supervisor (or a signal, or the stop file) asked for.
        self.stop_reason: str | None = None
        self.stop_deadline: float | None = None
        self.save_requested = False
        self.verdict_seen = False  # a stop / save_now message from the supervisor arrived
        self._verdict_waited = False
        self.save_deadline: float | None = None
        self.abort: tuple[str | None, str | None] | None = None  # (path, reason)
        self.signals_seen: list[tuple[int, float]] = []  # bounded: at most one entry per signal

        # Channel state.
        self.sending = False
        self._send: socket.socket | None = None
        self._recv: socket.socket | None = None
        self._warned = False
        self._interval = HEARTBEAT_INTERVAL if self.rank == 0 else OTHER_RANK_INTERVAL
        self._pending: tuple[Any, Mapping[str, Any] | None] | None = None
        self._next_heartbeat = 0.0
        self._last_heartbeat = -1e9
        self._last_nonfinite = False
        self._next_hello = 0.0
        self._next_drain = 0.0
        self._next_file_check = 0.0
        self._stop_file_seen: tuple[int, int] | None = None
        self.dropped_sends = 0

        # Signal handling.
        self._previous: dict[int, Any] = {}
        self._saving_depth = 0
        self._deferred: list[int] = []
        self.installed = False

        if self.address:
            self._open_channel()

    # channel ---------------------------------------------------------------------------------

    def _open_channel(self) -> None:
        if not self.key:
            self._warn(f"SUPERVISOR_CONTROL={self.address} but {KEY_ENV} is empty; channel off")
            return
        try:
            host, port = parse_address(self.address)
            send = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            recv = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                # Connected, so a vanished supervisor shows up as ECONNREFUSED on a later send.
                send.connect((host, port))
                send.setblocking(False)
                # Listen only on the address our datagrams leave from: the supervisor replies there.
                recv.bind((send.getsockname()[0], 0))
                recv.setblocking(False)
            except OSError:
                send.close()
                recv.close()
                raise
        except (OSError, ValueError) as exc:
            self._warn(f"cannot open the control channel {self.address!r} ({exc}); channel off")
            return
        self._send, self._recv = send, recv
        self.sending = True
        self._send_hello(_monotonic())
        atexit.register(self._at_exit)

    def _send_hello(self, now: float) -> None:
        if self._recv is not None:
            self._send_message(Kind.HELLO, {"reply_port": self._recv.getsockname()[1]})
        self._next_hello = now + HELLO_INTERVAL

    def _warn(self, message: str) -> None:
        """One line on stderr, once per process: the client must not spam the attempt log."""
        if self._warned:
            return
        self._warned = True
        try:
            sys.stderr.write(f"[supervisor.client] warning: {message}\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001, S110 - a closed stderr must not stop training
            pass

    def _degrade(self, reason: str) -> None:
        self.sending = False
        for sock in (self._send, self._recv):
            if sock is not None:
                try:
                    sock.close()
                except OSError:
                    pass
        self._send = self._recv = None
        self._pending = None
        self._warn(f"control channel {self.address} is gone ({reason}); training carries on without "
                   "it (stop notices still come from signals and the stop file)")

    def _seal(self, kind: Kind, fields: dict[str, Any]) -> bytes:
        self._seq += 1
        return seal(kind, self.key, self.sender_id, self._seq, 0, rank=self.rank, pid=self.pid, host=self.host,
                    attempt=self.attempt, **fields)

    def _send_message(self, kind: Kind, fields: dict[str, Any]) -> None:
        sock = self._send
        if sock is None or not self.sending:
            return
        try:
            data = self._seal(kind, fields)
        except (TypeError, ValueError):
            self.dropped_sends += 1
            return
        if len(data) > MAX_DATAGRAM:
            slim = self._shrink(kind, fields)
            if slim is None:
                self.dropped_sends += 1
                return
            data = slim
        try:
            sock.send(data)
        except (BlockingIOError, InterruptedError):
            self.dropped_sends += 1  # the kernel queue is full: drop, never wait
        except OSError as exc:
            if exc.errno == errno.ENOBUFS:  # transient
                self.dropped_sends += 1
            else:
                self._degrade(f"{type(exc).__name__}: {exc}")

    def _shrink(self, kind: Kind, fields: dict[str, Any]) -> bytes | None:
        """An oversized message loses its bulky optional parts (metrics, long setting values)."""
        slim = dict(fields)
        slim.pop("metrics", None)
        if isinstance(slim.get("settings"), dict):
            slim["settings"] = {str(k)[:100]: str(v)[:200] for k, v in list(slim["settings"].items())[:20]}
        data = self._seal(kind, slim)
        return data if len(data) <= MAX_DATAGRAM else None

    # heartbeats ------------------------------------------------------------------------------

    def heartbeat(self, step: Any, metrics: Mapping[str, Any] | None) -> None:
        if not self.sending:
            return
        now = _monotonic()
        self._pending = (step, metrics)
        nonfinite = False
        if metrics:
            for value in metrics.values():
                # inf - inf and nan - nan are nan. Only floats (and numpy floats) are checked here:
                # a tensor would need a device sync; it is converted when a datagram is sent.
                if isinstance(value, float) and value - value != 0.0:
                    nonfinite = True
                    break
        if now >= self._next_heartbeat or (
                nonfinite and not self._last_nonfinite and now - self._last_heartbeat >= NONFINITE_MIN_GAP):
            self._flush_heartbeat(now)
        self._last_nonfinite = nonfinite

    def _flush_heartbeat(self, now: float) -> None:
        pending, self._pending = self._pending, None
        self._next_heartbeat = now + self._interval
        self._last_heartbeat = now
        if pending is None:
            return
        step, metrics = pending
        value = _step_or_none(step)
        if value is None:
            self.dropped_sends += 1  # not a step the supervisor would accept (negative, >= 2**53)
            return
        fields: dict[str, Any] = {"step": value}
        if metrics:
            fields["metrics"] = {str(k): _as_number(v) for k, v in metrics.items()}
        self._send_message(Kind.HEARTBEAT, fields)
        if now >= self._next_hello:
            self._send_hello(now)

    def flush(self) -> None:
        """Send the latest heartbeat now (before a save, at resume, at exit)."""
        if self._pending is not None and self.sending:
            self._flush_heartbeat(_monotonic())

    def _at_exit(self) -> None:
        # At interpreter exit a gone supervisor is expected (it may have stopped us): no warning.
        self._warned = True
        try:
            self.flush()
        except Exception:  # noqa: BLE001, S110 - never fail an interpreter exit
            pass

    # what the supervisor asked ---------------------------------------------------------------

    def refresh(self) -> None:
        """Read supervisor messages and the stop file, each at most at its interval."""
        now = _monotonic()
        if self._recv is not None and now >= self._next_drain:
            self._next_drain = now + DRAIN_INTERVAL
            self._drain()
        if self._pending is not None and now >= self._next_heartbeat:
            self._flush_heartbeat(now)  # training stopped calling heartbeat(): report the latest step
        if self.stop_file is not None and now >= self._next_file_check:
            self._next_file_check = now + STOP_FILE_INTERVAL
            self._check_stop_file()

    def drain_now(self) -> None:
        if self._recv is not None:
            self._drain()

    def _drain(self) -> None:
        sock = self._recv
        for _ in range(64):  # bounded: a flood of datagrams cannot stall a training step
            if sock is None:
                return
            try:
                data = sock.recv(MAX_DATAGRAM + 1)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            try:
                datagram = decode(data, self.key, SUPERVISOR_KINDS)
            except Rejected:
                self.rejected += 1
                continue
            if datagram.recipient != self.sender_id or not self._supervisor_seq.accept(datagram.sender,
                                                                                      datagram.seq):
                self.rejected += 1  # meant for another client (or attempt), or a replay
                continue
            self._apply(datagram.kind, datagram.record)

    def await_verdict(self, timeout: float) -> None:
        """Block up to ``timeout`` for the supervisor's answer to a notice (once per process)."""
        if self._verdict_waited or self.verdict_seen or self._recv is None or not self.sending:
            return
        self._verdict_waited = True
        import select

        deadline = _monotonic() + timeout
        while not self.verdict_seen:
            left = deadline - _monotonic()
            if left <= 0:
                return
            try:
                ready, _, _ = select.select([self._recv], [], [], left)
            except (OSError, ValueError):
                return
            if ready:
                self._drain()

    def _apply(self, kind: Kind, record: Mapping[str, Any]) -> None:
        if kind in (Kind.STOP, Kind.SAVE_NOW):
            self.verdict_seen = True
        if kind is Kind.STOP:
            self._note_stop(record.get("reason") or "supervisor asked to stop", record.get("deadline"))
        elif kind is Kind.SAVE_NOW:
            self.save_requested = True
            self.save_deadline = record.get("deadline")
        elif kind is Kind.ABORT_SAVE:
            self.abort = (record.get("path"), record.get("reason"))

    def _note_stop(self, reason: str, deadline: float | None) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
        if deadline is not None:
            self.stop_deadline = float(deadline)

    def _check_stop_file(self) -> None:
        try:
            st = os.stat(self.stop_file)  # type: ignore[arg-type]
        except OSError:
            return
        seen = (st.st_mtime_ns, st.st_size)
        if seen == self._stop_file_seen:
            return
        self._stop_file_seen = seen
        try:
            with open(self.stop_file, "rb") as fh:  # type: ignore[arg-type]
                record = json.loads(fh.read(MAX_DATAGRAM))
        except (OSError, ValueError):
            record = {}
        if not isinstance(record, dict):
            record = {}
        file_attempt = record.get("attempt")
        if isinstance(file_attempt, int) and self.attempt is not None and file_attempt < self.attempt:
            return  # left over from an earlier attempt
        deadline = record.get("deadline")
        deadline = deadline if isinstance(deadline, (int, float)) and not isinstance(deadline, bool) else None
        reason = record.get("reason")
        reason = reason if isinstance(reason, str) else "stop file"
        self._note_stop(reason, deadline)

    # signals ---------------------------------------------------------------------------------

    def on_signal(self, signum: int, frame: Any) -> None:
        """Record the notice; chain to the previous handler, but never while a save is in flight."""
        if not any(s == signum for s, _ in self.signals_seen):
            self.signals_seen.append((signum, time.time()))
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = str(signum)
        self._note_stop(f"signal {name}", None)
        previous = self._previous.get(signum)
        if callable(previous):
            if self._saving_depth > 0:
                if signum not in self._deferred:
                    self._deferred.append(signum)
            else:
                previous(signum, frame)

    def install(self, signals: Iterable[str | int] | None) -> bool:
        if threading.current_thread() is not threading.main_thread():
            return False
        if isinstance(signals, (str, int)):
            signals = [signals]
        names: list[str | int]
        if signals is None:
            names = [s for s in self.notice_signals.replace(",", " ").split() if s] or ["TERM"]
        else:
            names = list(signals)
        for name in names:
            try:
                signum = _signal_number(name)
            except (KeyError, ValueError):
                self._warn(f"install(): unknown signal {name!r} ignored")
                continue
            current = signal.getsignal(signum)
            if current == self.on_signal:
                continue  # installed already
            self._previous[signum] = current
            signal.signal(signum, self.on_signal)
        if STACK_DUMP_SIGNAL is not None and not self.installed:
            target: Any = sys.stderr if sys.stderr is not None and _has_fileno(sys.stderr) else 2
            try:
                faulthandler.register(STACK_DUMP_SIGNAL, file=target, all_threads=True, chain=False)
            except (ValueError, OSError, RuntimeError):
                pass
        self.installed = True
        return True

    def run_deferred(self) -> None:
        deferred, self._deferred = self._deferred, []
        for signum in deferred:
            previous = self._previous.get(signum)
            if callable(previous):
                previous(signum, None)


def _has_fileno(stream: Any) -> bool:
    try:
        stream.fileno()
        return True
    except Exception:  # noqa: BLE001 - io.UnsupportedOperation, AttributeError, ValueError
        return False


class _Saving:
    """``with saving(step, path):`` reports save_begin/save_end and defers chained signal handlers."""

    __slots__ = ("_client", "_path", "_started", "_step")

    def __init__(self, client: _Client, step: int | None, path: Any) -> None:
        self._client, self._step, self._path = client, step, os.fspath(path)
        self._started = 0.0

    def __enter__(self) -> Self:
        c = self._client
        c._saving_depth += 1
        if c.sending:
            c.flush()
            c._send_message(Kind.SAVE_BEGIN, {"step": _step_or_none(self._step), "path": self._path})
        self._started = _monotonic()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        c = self._client
        duration = _monotonic() - self._started
        ok = exc_type is None
        try:
            if c.sending:
                c._send_message(Kind.SAVE_END, {"step": _step_or_none(self._step), "path": self._path,
                                                "bytes": _size_of(self._path) if ok else None,
                                                "duration": round(duration, 6), "ok": ok})
        finally:
            c._saving_depth -= 1
            c.drain_now()  # read what arrived during the save before clearing what it answered
            if ok:
                c.save_requested = False
            c.abort = None
            if c._saving_depth == 0 and c._deferred:
                c.run_deferred()  # may raise (a chained handler that exits): after the save, by design
        return False


def _step_or_none(step: Any) -> int | None:
    """``step`` as an int the supervisor accepts (0 <= step < 2**53), else None."""
    try:
        value = None if step is None else int(step)
    except (TypeError, ValueError, RuntimeError, OverflowError):  # OverflowError: int(float("inf"))
        return None
    return value if valid_step(value) else None


# ---------------------------------------------------------------------------------------------
# The module API, backed by one lazily built client per process.

_CLIENT: _Client | None = None
_LOCK = threading.Lock()


def _client() -> _Client:
    global _CLIENT
    client = _CLIENT
    if client is None:
        with _LOCK:
            if _CLIENT is None:
                _CLIENT = _Client(os.environ)
            client = _CLIENT
    return client


def _forget_after_fork() -> None:
    """A forked child (a DataLoader worker) builds its own client: sockets and pid are per process."""
    global _CLIENT
    _CLIENT = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def enabled() -> bool:
    """Whether a supervisor channel is configured and still working."""
    return _client().sending


def resume_path() -> str | None:
    """The checkpoint the supervisor chose to resume from; None when starting fresh."""
    return _client().resume_path


def resume_step() -> int | None:
    """The step of :func:`resume_path`, when the supervisor knows it."""
    return _client().resume_step


def checkpoint_dir() -> str | None:
    """The checkpoint directory the supervisor watches (``SUPERVISOR_CHECKPOINT_DIR``)."""
    return _client().checkpoint_dir


def attempt() -> int | None:
    """This attempt's number (1-based across the run), or None without a supervisor."""
    return _client().attempt


def heartbeat(step: int, **metrics: float) -> None:
    """Report progress. Call it every step: datagrams are throttled, the latest step always wins.
    ``loss=`` is watched for NaN/spikes and shown by ``supervise status``; ``max_steps=`` (the step
    training ends at) gives that view its ETA."""
    (_CLIENT or _client()).heartbeat(step, metrics)


def saving(step: int | None, path: str | os.PathLike[str]) -> _Saving:
    """Context manager around a checkpoint write: reports begin/end (bytes, duration, ok) and keeps
    a chained SIGTERM handler from running until the write is done."""
    return _Saving(_CLIENT or _client(), step, path)


def save(obj: Any, path: str | os.PathLike[str], step: int | None) -> None:
    """``torch.save`` atomically (temp file, fsync, rename) inside :func:`saving`."""
    from .checkpoints.atomic import atomic_torch_save

    with saving(step, path):
        atomic_torch_save(obj, path)


def update_last(step_path: str | os.PathLike[str], last_path: str | os.PathLike[str]) -> Any:
    """Point ``last`` at a finished step checkpoint atomically (never a symlink torch.save writes through)."""
    from .checkpoints.atomic import update_last as _update_last

    return _update_last(step_path, last_path)


def should_stop() -> bool:
    """True once a stop was asked: supervisor ``stop``, a recorded notice signal, or the stop file."""
    client = _CLIENT or _client()
    client.refresh()
    return client.stop_reason is not None


def stop_deadline() -> float | None:
    """Epoch seconds by which the process must be gone, when known."""
    client = _client()
    client.refresh()
    return client.stop_deadline


def stop_reason() -> str | None:
    client = _client()
    client.refresh()
    return client.stop_reason


def save_requested() -> bool:
    """The supervisor asked for an emergency save (cleared when a save completes).

    After a notice signal with a live supervisor, waits (once, up to ``VERDICT_WAIT`` s) for its
    verdict, so the answer reflects the grace-deadline arbitration rather than a race with it.
    """
    client = _CLIENT or _client()
    client.refresh()
    if client.stop_reason is not None and not client.verdict_seen:
        client.await_verdict(VERDICT_WAIT)
    return client.save_requested


def save_deadline() -> float | None:
    """Epoch seconds by which the requested emergency save must be done, when known."""
    client = _client()
    client.refresh()
    return client.save_deadline


def abort_requested(path: str | os.PathLike[str] | None = None) -> bool:
    """The supervisor asked to abandon the save in flight (of ``path``, when given)."""
    client = _client()
    client.refresh()
    if client.abort is None:
        return False
    return _same_save(client.abort[0], None if path is None else os.fspath(path))


def resumed(step: int) -> None:
    """Tell the supervisor the step training actually resumed at (checked against the resume point)."""
    client = _client()
    if client.sending:
        client.flush()
        value = _step_or_none(step)
        if value is not None:
            client._send_message(Kind.RESUMED, {"step": value})


def done(step: int | None = None) -> None:
    """Tell the supervisor training has finished all its steps, so that the exit that follows is
    read as completion (an exit 0 after a stop request is not)."""
    client = _client()
    if client.sending:
        client.flush()
        client._send_message(Kind.DONE, {"step": _step_or_none(step)})


def report_determinism(**settings: Any) -> None:
    """Send the determinism settings in effect (recorded in the attempt's manifest)."""
    client = _client()
    if client.sending:
        client._send_message(Kind.DETERMINISM, {"settings": dict(settings)})


def install(signals: Iterable[str | int] | None = None) -> bool:
    """Own the notice signals in this process: record them instead of dying, chain to a previous
    Python handler (deferred while a save is in flight), and register :data:`STACK_DUMP_SIGNAL`
    for stack dumps. ``signals`` defaults to ``$SUPERVISOR_NOTICE_SIGNALS`` or ``("TERM",)``.
    Effective only in the main thread (returns False elsewhere); calling it again is harmless."""
    return _client().install(signals)


# Restart metrics (docs/metrics.md) live in their own module; ``client.restart_metrics`` stays the name users call.
from .client_metrics import log_restart_metrics, restart_metrics  # noqa: E402

