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
import secrets
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

from .private import OWNER_ONLY, append_fd, write_atomic

# The launcher shim (``python -S -c _SHIM PPID SHIELD WATCH_FD MARKER CMD...``), run in the child's new
# session before it becomes the training command:
#   1. PDEATHSIG=SIGKILL for itself, and exit if the supervisor is already gone;
#   2. fork the watchdog (below), unless WATCH_FD is -1;
#   3. set the SHIELD signals (comma-separated numbers) to SIG_IGN: an ignored disposition survives
#      exec and fork, so the command and its subprocesses ignore them until they install handlers;
#   4. export MARKER as $SUPERVISOR_PROCESS_TREE (inherited by the whole tree) and exec the command.
# The watchdog stays in the training's process group (so the group id cannot be reused while it
# lives), ignores every signal it can, holds nothing open but the read end of a pipe whose write end
# only the supervisor holds, and blocks reading it: no CPU while the training runs. A byte on the pipe
# means "released" (the attempt ended normally): it exits. End of file without that byte means the
# supervisor died, by any means: it SIGKILLs every process carrying MARKER in its environment (those
# that left the group with setsid) and then its own process group, itself included.
_SHIM = r"""
import ctypes, os, signal, sys
ppid, shield, watch_fd, marker = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
cmd = sys.argv[5:]
try:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL
except Exception:
    libc = None
if os.getppid() != ppid:
    os._exit(137)


def kill_marked(needle, me):
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open("/proc/%s/environ" % name, "rb") as fh:
                found = needle in fh.read()
            if found:
                os.kill(int(name), signal.SIGKILL)
        except Exception:
            pass


def watchdog(fd):
    for sig in signal.valid_signals():
        if sig not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
            try:
                signal.signal(sig, signal.SIG_IGN)
            except (OSError, ValueError, RuntimeError):
                pass
    null = os.open(os.devnull, os.O_RDWR)
    for target in (0, 1, 2):
        os.dup2(null, target)
    os.closerange(3, fd)
    os.closerange(fd + 1, 65536)
    os.chdir("/")
    if libc is not None:
        try:
            libc.prctl(15, b"supervise-watch", 0, 0, 0)  # PR_SET_NAME
        except Exception:
            pass
    while True:
        try:
            data = os.read(fd, 64)
        except InterruptedError:
            continue
        except OSError:
            data = b""
        if data:
            os._exit(0)  # released: the attempt ended under a live supervisor
        break
    needle = ("SUPERVISOR_PROCESS_TREE=%s" % marker).encode()
    for _ in range(3):  # processes that left the group may fork while we look
        kill_marked(needle, os.getpid())
    os.killpg(0, signal.SIGKILL)
    os._exit(0)


if watch_fd >= 0:
    try:
        pid = os.fork()
    except OSError:
        pid = -1
    if pid == 0:
        try:
            watchdog(watch_fd)
        finally:
            os._exit(0)
    os.close(watch_fd)
for number in shield.split(","):
    if number:
        signal.signal(int(number), signal.SIG_IGN)
os.environ["SUPERVISOR_PROCESS_TREE"] = marker
try:
    os.execvp(cmd[0], cmd)
except OSError as exc:
    sys.stderr.write("supervise: cannot start %r: %s\n" % (cmd[0], exc.strerror))
    os._exit(127)
"""
LOG_MODE = OWNER_ONLY  # the training's raw output (unredacted): its owner alone (docs/security.md)
TREE_ENV = "SUPERVISOR_PROCESS_TREE"  # set by the shim in the child's environment: the tree's marker
READ_BYTES = 1 << 20  # one read of the child's output takes up to this much (the pipe holds PIPE_BYTES)
PIPE_BYTES = 1 << 20  # Linux's default limit for an unprivileged F_SETPIPE_SZ (/proc/sys/fs/pipe-max-size)
_RELEASE = b"R"  # written to the watchdog's pipe at a normal end: "exit quietly"
_PR_SET_CHILD_SUBREAPER = 36
_subreaper: bool | None = None


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux ``PR_SET_CHILD_SUBREAPER``).

    Why: the watchdog and the training's stragglers outlive the training's main process; orphans
    normally go to PID 1, which in a container without an init never reaps them (zombies). As their
    reaper, :meth:`Child.finish` collects them. Idempotent; False where the kernel refuses."""
    global _subreaper
    if _subreaper is None:
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            _subreaper = libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
        except (OSError, AttributeError):
            _subreaper = False
    return _subreaper


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
    # Signals the child starts with ignored (SIG_IGN survives exec). Under srun, Slurm sends SIGTERM
    # to every process of the step at a preemption notice: shielded, an unchanged training script
    # lives on until the supervisor, which decides, ends it. A script that installs its own handler
    # replaces SIG_IGN and receives the signal as before.
    shield_signals: tuple[int, ...] = ()
    # Fork a watchdog that SIGKILLs the child's process group (and the processes that left it) when
    # the supervisor dies by any means, SIGKILL included. Costs one idle process per attempt.
    watchdog: bool = True


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

    def extend(self, items: list[Line], skipped: int = 0) -> int:
        """Append ``items`` in order; the oldest lines beyond ``maxlen`` are evicted (and counted).
        ``skipped``: lines older than ``items`` that the caller did not even build because they
        would have been evicted at once (counted as queued and dropped). Returns how many went."""
        with self._lock:
            evicted = max(len(self._items) + len(items) - self.maxlen, 0) + skipped
            self.dropped += evicted
            self.queued += len(items) + skipped
            self._items.extend(items)
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
        self._watch_w = -1  # write end of the watchdog's pipe: closing it without a byte kills the tree
        self.tree_marker = ""

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
        fd = append_fd(spec.log_path, LOG_MODE, cloexec=False)
        self._log = open(fd, "ab", buffering=0)  # noqa: SIM115 - closed by finish()
        watch_r = -1
        if spec.watchdog:
            become_subreaper()
            watch_r, self._watch_w = os.pipe()  # both ends close-on-exec; watch_r is passed on below
        self.tree_marker = secrets.token_hex(16)
        shield = ",".join(str(int(s)) for s in spec.shield_signals)
        shim = [sys.executable, "-S", "-c", _SHIM, str(os.getpid()), shield, str(watch_r), self.tree_marker]
        self._started_at = time.monotonic()
        try:
            self._proc = subprocess.Popen(
                shim + list(spec.argv),
                env=dict(spec.env),
                cwd=spec.cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                close_fds=True,
                pass_fds=(watch_r,) if watch_r >= 0 else (),
            )
        except BaseException:
            self._release_watchdog()
            raise
        finally:
            if watch_r >= 0:
                os.close(watch_r)  # only the child's watchdog keeps the read end
        for stream, name, echo_fd in ((self._proc.stdout, "stdout", 1), (self._proc.stderr, "stderr", 2)):
            t = threading.Thread(target=self._pump, args=(stream, name, echo_fd), daemon=True,
                                 name=f"child-{name}")
            t.start()
            self._readers.append(t)

    def _pump(self, stream: BinaryIO, name: str, echo_fd: int) -> None:
        """Copy raw chunks to the console and log unchanged; split lines (bounded) for analysis.

        Why in bulk: a training printing as fast as it can (600k+ lines/s) must not wait on this
        thread. Each read takes whatever the (enlarged) pipe holds; the console, the log and the
        tail get it in one write each, and the lines are split, decoded and queued with C-level
        calls (``bytes.split``, ``deque.extend``), never one Python step per line."""
        partial = bytearray()  # the start of a line whose end has not arrived yet (at most max_line_bytes)
        overflow = False  # that line is longer than max_line_bytes: the rest of it is cut for analysis
        limit = self.spec.max_line_bytes
        fd = stream.fileno()
        _enlarge_pipe(fd)
        while True:
            try:
                chunk = os.read(fd, READ_BYTES)
            except OSError:
                break
            if not chunk:
                break
            if self.spec.echo:
                _write_all(echo_fd, chunk)
            with self._log_lock:
                try:
                    if self._log:
                        self._log.write(chunk)
                except OSError:
                    pass
            self.tail.add(chunk)
            # A carriage return ends a line too: tqdm redraws its bar with '\r', and each redraw is
            # fresh progress for the analysis (the log keeps the raw bytes).
            lines = chunk.replace(b"\r", b"\n").split(b"\n") if b"\r" in chunk else chunk.split(b"\n")
            rest = lines.pop()  # after the last line end: the start of the next line (or b"")
            if lines:
                if partial or overflow:  # the first line ends the one begun in an earlier read
                    if not overflow:
                        room = limit - len(partial)
                        overflow = len(lines[0]) > room
                        partial += lines[0][:room]
                    lines[0] = bytes(partial)
                    if overflow:
                        self._count_cut(1)
                    partial.clear()
                    overflow = False
                if max(map(len, lines)) > limit:
                    lines = self._cut(lines, limit)
                self._queue_lines(name, lines)
            if not overflow:
                room = limit - len(partial)
                partial += rest[:room]
                overflow = len(rest) > room
        if partial:
            if overflow:
                self._count_cut(1)
            self._queue_lines(name, [bytes(partial)])
        try:
            stream.close()
        except OSError:
            pass

    def _cut(self, lines: list[bytes], limit: int) -> list[bytes]:
        """Lines longer than ``limit`` cut to it for analysis (counted); the log keeps them whole."""
        self._count_cut(sum(1 for line in lines if len(line) > limit))
        return [line[:limit] for line in lines]

    def _count_cut(self, count: int) -> None:
        if not count:
            return
        with self._cut_lock:
            self._cut_lines += count

    def _queue_lines(self, name: str, lines: list[bytes]) -> None:
        """Decode and queue the non-empty lines of one read, in order, in one step. Of a read
        holding more lines than the queue, only the newest are built: the others would be
        evicted at once (they are counted as dropped, as the queue would)."""
        kept = list(filter(None, lines))
        room = self.lines.maxlen
        skipped = max(len(kept) - room, 0)
        if skipped:
            kept = kept[skipped:]
        if not kept:
            return
        now = time.time()
        text = b"\n".join(kept).decode("utf-8", errors="replace")
        self.lines.extend([(now, name, line) for line in text.split("\n")], skipped=skipped)

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

    def catches(self, sig: int) -> bool | None:
        """Whether the child's main process has installed a handler for ``sig`` (Linux: the SigCgt
        mask of /proc/PID/status); None when it cannot be told (gone, not Linux). A shielded child
        that returns False ignores ``sig``: end it with SIGKILL. One that returns True (the
        client's install(), Lightning, torchrun) asked for it: it can be sent ``sig`` to leave."""
        if self._proc is None or self.poll() is not None:
            return None
        try:
            with open(f"/proc/{self._proc.pid}/status") as fh:
                for line in fh:
                    if line.startswith("SigCgt:"):
                        return bool(int(line.split()[1], 16) >> (int(sig) - 1) & 1)
        except (OSError, ValueError, IndexError):
            return None
        return None

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
        """After the exit: reap stragglers of the group, drain the readers, close the log, release
        the watchdog (it exits instead of killing) and reap it."""
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
        self._release_watchdog()
        self._reap_group()

    def _release_watchdog(self) -> None:
        fd, self._watch_w = self._watch_w, -1
        if fd < 0:
            return
        try:
            os.write(fd, _RELEASE)
        except OSError:
            pass  # the watchdog is gone already (the group was SIGKILLed): nothing to release
        finally:
            os.close(fd)

    def _reap_group(self, timeout: float = 1.0) -> None:
        """Collect the group's members that became our children (we are their subreaper): the
        released watchdog, and stragglers once dead. Never touches other children of ours."""
        if self._proc is None or self.poll() is None:
            return
        deadline = time.monotonic() + timeout
        while True:
            try:
                reaped = os.waitid(os.P_PGID, self._proc.pid, os.WEXITED | os.WNOHANG)
            except ChildProcessError:
                return  # none left
            except OSError:
                return
            if reaped is None:  # members remain, none has exited yet
                if time.monotonic() >= deadline:
                    return
                time.sleep(0.01)

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
                write_atomic(out_path, (res.stdout + res.stderr).encode("utf-8", "replace"), OWNER_ONLY)
                return f"py-spy dump written to {out_path}"
            except (OSError, subprocess.SubprocessError) as exc:
                note = f"py-spy failed ({exc}); "
        else:
            note = ""
        self.signal_group(dump_signal)
        time.sleep(0.5)  # faulthandler writes to the child's stderr, which lands in the attempt log
        return note + f"faulthandler dump requested with signal {signal.Signals(dump_signal).name}; see the attempt log"


def _enlarge_pipe(fd: int) -> None:
    """Give the child's pipe room for ``PIPE_BYTES`` (Linux ``F_SETPIPE_SZ``): a writer printing as
    fast as it can then never waits while this reader waits for the GIL. Best effort."""
    try:
        import fcntl

        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_BYTES)
    except (OSError, ValueError, ImportError):
        pass


def _write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` (a pipe or terminal may take part of it); give up quietly on an error."""
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except InterruptedError:
            continue
        except OSError:
            return
        view = view[written:]


def resolve_command(argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """The executable ``argv[0]`` resolves to, or None when it does not exist / is not executable."""
    cmd = argv[0]
    if os.sep in cmd:
        return cmd if os.path.isfile(cmd) and os.access(cmd, os.X_OK) else None
    return shutil.which(cmd, path=env.get("PATH"))
