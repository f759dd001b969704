"""The training child: start it in its own session, tee its output, keep a bounded tail, stop it.

Why a launcher shim: ``PR_SET_PDEATHSIG`` must be set inside the child before it execs the training
command, so that a SIGKILLed supervisor never leaves an orphan training process holding GPUs. Doing
that with ``preexec_fn`` is unsafe once the supervisor has threads, so a tiny stdlib-only Python shim
(``python -S -c``) sets it, checks the parent is still alive, and ``execvp``s the real command.
"""

from __future__ import annotations

import collections
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

# Set PDEATHSIG=SIGKILL, make sure the supervisor did not die before that, then become the command.
_SHIM = r"""
import ctypes, os, sys
ppid = int(sys.argv[1])
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL
except Exception:
    pass
if os.getppid() != ppid:
    os._exit(137)
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as exc:
    sys.stderr.write("supervise: cannot start %r: %s\n" % (sys.argv[2], exc.strerror))
    os._exit(127)
"""


@dataclass(frozen=True)
class ChildSpec:
    """The blueprint of one attempt's child."""

    argv: Sequence[str]
    env: Mapping[str, str]
    log_path: Path
    cwd: Path | None = None
    tail_bytes: int = 262144
    max_line_bytes: int = 65536
    line_queue_size: int = 20000
    echo: bool = True  # copy the child's output to our own stdout/stderr unchanged


@dataclass(frozen=True)
class ChildExit:
    """How the child ended. ``signal`` is set when it died of a signal (exit_code is then None)."""

    exit_code: int | None
    signal: int | None
    duration: float

    @property
    def status(self) -> int:
        """Shell-style status: the exit code, or 128+N for a signal."""
        if self.signal is not None:
            return 128 + self.signal
        return self.exit_code if self.exit_code is not None else 1

    @property
    def signal_name(self) -> str | None:
        if self.signal is None:
            return None
        try:
            return signal.Signals(self.signal).name
        except ValueError:
            return f"SIG{self.signal}"


class OutputTail:
    """A bounded in-memory copy of the end of the output, for classification after the exit."""

    def __init__(self, max_bytes: int) -> None:
        self._max = max_bytes
        self._chunks: collections.deque[bytes] = collections.deque()
        self._size = 0
        self._lock = threading.Lock()

    def add(self, data: bytes) -> None:
        if len(data) > self._max:
            data = data[-self._max:]
        with self._lock:
            self._chunks.append(data)
            self._size += len(data)
            while self._size - len(self._chunks[0]) >= self._max:
                self._size -= len(self._chunks.popleft())

    def text(self) -> str:
        with self._lock:
            data = b"".join(self._chunks)
        return data[-self._max:].decode("utf-8", errors="replace")


@dataclass
class LineStats:
    queued: int = 0
    dropped: int = 0  # oldest lines evicted because the main loop fell behind (still logged)
    cut: int = 0  # lines longer than max_line_bytes (cut for analysis, kept whole in the log)


Line = tuple[float, str, str]  # (epoch seconds read, "stdout" | "stderr", text)


class LineQueue:
    """The bounded hand-over of output lines from the reader threads to the run loop.

    When the loop falls behind (a burst of 60,000 ``step N`` lines in a second) the OLDEST lines
    are dropped, never the newest: the loop must always see the latest step, and an old line is
    worth less than a new one. Every line still reaches the console and the attempt log unchanged;
    only the analysis skips. ``dropped`` counts what was evicted.
    """

    def __init__(self, maxlen: int) -> None:
        if maxlen < 1:
            raise ValueError("LineQueue needs room for at least one line")
        self._items: collections.deque[Line] = collections.deque(maxlen=maxlen)
        self._lock = threading.Lock()
        self.maxlen = maxlen
        self.queued = 0
        self.dropped = 0

    def put(self, item: Line) -> bool:
        """Append ``item``; returns True when the oldest line was evicted to make room."""
        with self._lock:
            evicted = len(self._items) == self.maxlen
            if evicted:
                self.dropped += 1
            self.queued += 1
            self._items.append(item)  # a full deque with maxlen drops from the left
        return evicted

    def put_nowait(self, item: Line) -> None:
        """``queue.Queue`` spelling of :meth:`put` (never raises ``queue.Full``)."""
        self.put(item)

    def get_nowait(self) -> Line:
        """The oldest queued line; raises ``queue.Empty`` when there is none (``queue.Queue`` API)."""
        with self._lock:
            if not self._items:
                raise queue.Empty
            return self._items.popleft()

    def drain(self, max_items: int) -> list[Line]:
        """Up to ``max_items`` of the oldest queued lines, in order, without blocking."""
        with self._lock:
            count = min(max_items, len(self._items))
            return [self._items.popleft() for _ in range(count)]

    def qsize(self) -> int:
        with self._lock:
            return len(self._items)

    def __len__(self) -> int:
        return self.qsize()

    def empty(self) -> bool:
        return self.qsize() == 0


class Child:
    """A running training child. Verbs: start, poll, signal_group, stop, wait."""

    def __init__(self, spec: ChildSpec) -> None:
        self.spec = spec
        self.lines = LineQueue(spec.line_queue_size)
        self.tail = OutputTail(spec.tail_bytes)
        self._cut_lines = 0
        self._cut_lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._readers: list[threading.Thread] = []
        self._log: BinaryIO | None = None
        self._log_lock = threading.Lock()
        self._started_at = 0.0
        self._exit: ChildExit | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def line_stats(self) -> LineStats:
        """What happened to the output lines on their way to the analysis (a snapshot)."""
        with self._cut_lock:
            cut = self._cut_lines
        return LineStats(queued=self.lines.queued, dropped=self.lines.dropped, cut=cut)

    def start(self) -> None:
        spec = self.spec
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(spec.log_path, "ab", buffering=0)  # noqa: SIM115 - closed by finish()
        shim = [sys.executable, "-S", "-c", _SHIM, str(os.getpid())]
        self._started_at = time.monotonic()
        self._proc = subprocess.Popen(
            shim + list(spec.argv),
            env=dict(spec.env),
            cwd=spec.cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
        )
        for stream, name, echo_fd in ((self._proc.stdout, "stdout", 1), (self._proc.stderr, "stderr", 2)):
            t = threading.Thread(target=self._pump, args=(stream, name, echo_fd), daemon=True,
                                 name=f"child-{name}")
            t.start()
            self._readers.append(t)

    def _pump(self, stream: BinaryIO, name: str, echo_fd: int) -> None:
        """Copy raw chunks to the console and log unchanged; split lines (bounded) for analysis."""
        partial = bytearray()
        overflow = False
        limit = self.spec.max_line_bytes
        fd = stream.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            if self.spec.echo:
                try:
                    os.write(echo_fd, chunk)
                except OSError:
                    pass
            with self._log_lock:
                try:
                    if self._log:
                        self._log.write(chunk)
                except OSError:
                    pass
            self.tail.add(chunk)
            start = 0
            while True:
                # A carriage return ends a line too: tqdm redraws its bar with '\r', and each redraw
                # is fresh progress for the analysis (the log keeps the raw bytes).
                nl = _next_line_end(chunk, start)
                piece = chunk[start:] if nl < 0 else chunk[start:nl]
                if not overflow:
                    room = limit - len(partial)
                    partial += piece[:room]
                    if len(piece) > room:
                        overflow = True
                        with self._cut_lock:
                            self._cut_lines += 1
                if nl < 0:
                    break
                self._queue_line(name, bytes(partial))
                partial.clear()
                overflow = False
                start = nl + 1
        if partial:
            self._queue_line(name, bytes(partial))
        try:
            stream.close()
        except OSError:
            pass

    def _queue_line(self, name: str, data: bytes) -> None:
        if not data:
            return
        self.lines.put((time.time(), name, data.decode("utf-8", errors="replace")))

    def poll(self) -> ChildExit | None:
        """The exit once the child's main process has ended, else None. Never blocks."""
        if self._exit is not None:
            return self._exit
        assert self._proc is not None
        rc = self._proc.poll()
        if rc is None:
            return None
        duration = time.monotonic() - self._started_at
        self._exit = ChildExit(rc if rc >= 0 else None, -rc if rc < 0 else None, duration)
        return self._exit

    def signal_group(self, sig: int) -> bool:
        """Send ``sig`` to the child's whole process group (its workers too)."""
        if self._proc is None:
            return False
        try:
            os.killpg(self._proc.pid, sig)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def stop(self, term_timeout: float) -> ChildExit:
        """SIGTERM the group, wait up to ``term_timeout``, then SIGKILL the group."""
        if self.poll() is None:
            self.signal_group(signal.SIGTERM)
            deadline = time.monotonic() + max(term_timeout, 0.0)
            while self.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
        if self.poll() is None:
            self.signal_group(signal.SIGKILL)
        return self.wait()

    def kill(self) -> ChildExit:
        self.signal_group(signal.SIGKILL)
        return self.wait()

    def wait(self, timeout: float | None = None) -> ChildExit:
        assert self._proc is not None
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        exit_ = self.poll()
        if exit_ is None:
            raise TimeoutError("child still running")
        return exit_

    def finish(self, reader_timeout: float = 5.0) -> None:
        """After the exit: reap stragglers of the group, drain the readers, close the log."""
        # Grandchildren (data-loader workers, srun helpers) may still hold the pipes open.
        if any(t.is_alive() for t in self._readers):
            time.sleep(0.05)
            if any(t.is_alive() for t in self._readers):
                self.signal_group(signal.SIGKILL)
        for t in self._readers:
            t.join(reader_timeout)
        with self._log_lock:
            if self._log:
                self._log.close()
                self._log = None

    def dump_stacks(self, out_path: Path, dump_signal: int) -> str:
        """Record the child's Python stacks: py-spy when installed, else ask the client's faulthandler."""
        pid = self.pid
        if pid is None:
            return "no child"
        pyspy = shutil.which("py-spy")
        if pyspy:
            try:
                res = subprocess.run([pyspy, "dump", "--pid", str(pid)], check=False, capture_output=True,
                                     text=True, timeout=20)
                out_path.write_text(res.stdout + res.stderr)
                return f"py-spy dump written to {out_path}"
            except (OSError, subprocess.SubprocessError) as exc:
                note = f"py-spy failed ({exc}); "
        else:
            note = ""
        self.signal_group(dump_signal)
        time.sleep(0.5)  # faulthandler writes to the child's stderr, which lands in the attempt log
        return note + f"faulthandler dump requested with signal {signal.Signals(dump_signal).name}; see the attempt log"


def _next_line_end(chunk: bytes, start: int) -> int:
    n = chunk.find(b"\n", start)
    r = chunk.find(b"\r", start, n if n >= 0 else len(chunk))
    return r if r >= 0 else n


def resolve_command(argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """The executable ``argv[0]`` resolves to, or None when it does not exist / is not executable."""
    cmd = argv[0]
    if os.sep in cmd:
        return cmd if os.path.isfile(cmd) and os.access(cmd, os.X_OK) else None
    return shutil.which(cmd, path=env.get("PATH"))
