"""The seams of the run loop: what it receives instead of reaching for the world itself.

The loop needs a clock that can also wait (woken early by signals), a way to start a child and
watch it, the control channel, and a view of Slurm. Each is a small Protocol here with its real
implementation beside it; ``tests/fakes.py`` implements the same Protocols with a fake clock, so
loop behaviour is tested in milliseconds and deterministically.

The Slurm view never blocks the loop: queries run on a worker thread with a timeout, and the loop
reads the newest answer (or plans with the defaults when there is none yet). A slurmctld that does
not answer must never delay acting on a notice.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from ..child import Child, ChildExit, ChildSpec
from ..signals import ReceivedSignal, SignalInbox
from ..slurm.grace import ClusterGrace
from ..slurm.version import SlurmVersion

log = logging.getLogger("supervisor.run")


class Clock(Protocol):
    def now(self) -> float: ...


class Waker(Protocol):
    """Signals the supervisor received, and the loop's only way to wait (a signal ends the wait)."""

    def drain(self) -> list[ReceivedSignal]: ...

    def wait(self, timeout: float) -> None: ...


class ChildHandle(Protocol):
    """One running attempt of the training."""

    @property
    def pid(self) -> int | None: ...

    def poll(self) -> ChildExit | None: ...

    def signal_group(self, sig: int) -> bool: ...

    def drain_lines(self, max_lines: int) -> list[str]: ...

    def tail_text(self) -> str: ...

    def lines_not_analysed(self) -> tuple[int, int]: ...  # (dropped, cut)

    def finish(self) -> None: ...

    def dump_stacks(self, out_path: Path, dump_signal: int) -> str: ...


ChildStarter = Callable[[ChildSpec], ChildHandle]


class Channel(Protocol):
    """The control channel's server side (``supervisor.control.ControlServer``)."""

    @property
    def address(self) -> str: ...

    def poll(self, max_messages: int = 1024) -> list[Any]: ...

    def broadcast(self, kind: Any, **fields: Any) -> int: ...


class SlurmView(Protocol):
    """What the loop asks Slurm, never blocking: answers arrive later through :meth:`job_info`."""

    def request_job_info(self) -> None: ...

    def job_info(self) -> Any | None: ...  # the newest JobInfo answered, or None

    def job_info_now(self, timeout: float) -> Any | None: ...  # after the child ended: wait a bounded time

    def version(self) -> SlurmVersion | None: ...

    def grace(self) -> ClusterGrace | None: ...  # the configured GraceTime, once it has been read

    def node_known(self, node: str) -> bool: ...

    def requeue(self, expected_restarts: int | None, exclude: Sequence[str]) -> Any: ...


# ------------------------------------------------------------------------------------------ real ones


class SupervisorClock:
    """Epoch seconds that never jump: the wall clock read once, advanced by the monotonic clock.

    Every timeout of the supervisor (stall, backoff, TERM -> KILL, the grace deadline) runs on it,
    so a clock step on the node (NTP, a VM resumed) neither kills a healthy child as hung nor
    stretches a 3 s backoff into hours. Slurm's EndTime is compared against it as epoch seconds.
    """

    def __init__(self) -> None:
        self._wall0, self._mono0 = time.time(), time.monotonic()

    def __call__(self) -> float:
        return self._wall0 + (time.monotonic() - self._mono0)

    def now(self) -> float:
        return self()


class ProcessChild:
    """:class:`supervisor.child.Child` seen through :class:`ChildHandle`."""

    def __init__(self, spec: ChildSpec) -> None:
        self._child = Child(spec)
        self.read_times: list[float] = []  # of the lines the last drain_lines returned
        self._child.start()

    @property
    def pid(self) -> int | None:
        return self._child.pid

    @property
    def tree_marker(self) -> str:
        """The marker every process of the child's tree carries (see :mod:`supervisor.openfiles`)."""
        return self._child.tree_marker

    def poll(self) -> ChildExit | None:
        return self._child.poll()

    def signal_group(self, sig: int) -> bool:
        return self._child.signal_group(sig)

    def drain_lines(self, max_lines: int) -> list[str]:
        """The queued lines, oldest first; ``read_times`` then holds when each was read (wall clock)."""
        lines = self._child.lines
        drain = getattr(lines, "drain", None)
        items: list[Any] = []
        if drain is not None:
            items = drain(max_lines)
        else:
            for _ in range(max_lines):
                try:
                    items.append(lines.get_nowait())
                except queue.Empty:
                    break
        self.read_times = [item[0] for item in items]
        return [item[-1] for item in items]

    def tail_text(self) -> str:
        return self._child.tail.text()

    def lines_not_analysed(self) -> tuple[int, int]:
        return self._child.line_stats.dropped, self._child.line_stats.cut

    def finish(self) -> None:
        self._child.finish()

    def dump_stacks(self, out_path: Path, dump_signal: int) -> str:
        return self._child.dump_stacks(out_path, dump_signal)

    def catches(self, sig: int) -> bool | None:
        return self._child.catches(sig)

    def stop(self, term_timeout: float) -> None:
        self._child.stop(term_timeout)


def start_process(spec: ChildSpec) -> ChildHandle:
    return ProcessChild(spec)


class InboxWaker:
    """:class:`supervisor.signals.SignalInbox` as the loop's :class:`Waker`."""

    def __init__(self, inbox: SignalInbox) -> None:
        self._inbox = inbox

    def drain(self) -> list[ReceivedSignal]:
        return self._inbox.drain()

    def wait(self, timeout: float) -> None:
        self._inbox.wait(timeout)


GRACE_TRIES = 5  # reads of the configured grace before the default grace is kept for the run
VERSION_WAIT_S = 3.0  # the first ask for the Slurm version waits at most this long
BACKEND_WAIT_S = 10.0  # run_start waits at most this long to say which backend (a trial import of pyslurm)


@dataclass
class _Answer:
    info: Any | None
    at: float


class BackgroundSlurm:
    """Job-record queries on a worker thread, so a hung ``scontrol`` never holds the loop.

    ``request_job_info`` queues a query unless one is under way; ``job_info`` returns the newest
    answer. ``backend_factory`` is called on the worker thread the first time (a local run never
    creates a backend at all).
    """

    def __init__(self, job_id: str | None, backend_factory: Callable[[], Any], query_timeout: float = 10.0) -> None:
        self.job_id = job_id
        self._factory = backend_factory
        self._backend: Any = None
        self._timeout = query_timeout
        self._lock = threading.Lock()
        self._latest: _Answer | None = None
        self._busy = threading.Event()
        self._done = threading.Event()
        self._version: SlurmVersion | None = None
        self._grace: ClusterGrace | None = None
        self._grace_known = False  # answered (a grace, or "none applies")
        self._grace_tries = 0
        self._grace_reading = False  # one read at a time, however many record queries overlap it
        self._version_thread: threading.Thread | None = None
        self._backend_lock = threading.Lock()  # one backend, however many worker threads ask first

    def _get_backend(self) -> Any:
        with self._backend_lock:
            if self._backend is None:
                self._backend = self._factory()
            return self._backend

    def backend_choice(self, timeout: float = BACKEND_WAIT_S) -> Any | None:
        """Which backend this run uses and why (``slurm.BackendChoice``), for ``run_start``: the
        backend is made on a worker thread, waited for at most ``timeout`` seconds (None after
        that, or in a local run, which never makes one)."""
        if not self.job_id:
            return None
        box: dict[str, Any] = {}

        def make() -> None:
            try:
                box["choice"] = getattr(self._get_backend(), "choice", None)
            except Exception as exc:  # the first query will say it again, with its retries
                log.warning("cannot set up the Slurm backend: %s", exc)

        thread = threading.Thread(target=make, daemon=True, name="slurm-backend")
        thread.start()
        thread.join(timeout)
        return box.get("choice")

    def _query(self) -> None:
        try:
            info = self._get_backend().job_info(self.job_id)
        except Exception as exc:  # Slurm unreachable: the loop plans with the default grace
            log.warning("cannot read the Slurm job record: %s", exc)
            info = None
        with self._lock:
            if info is not None:
                self._latest = _Answer(info, time.monotonic())
        self._busy.clear()
        self._done.set()
        if info is not None:
            self._learn_grace(info)

    def _learn_grace(self, info: Any) -> None:
        """After a job record, until Slurm has answered (at most GRACE_TRIES tries): the GraceTime
        a preemption would give (slurm/grace.py), so a notice that outruns the job record is still
        planned right. Runs on the query thread after its answer is out, so it never delays a job
        record; a later query that overlaps a read in progress leaves it alone."""
        with self._lock:
            if self._grace_known or self._grace_reading or self._grace_tries >= GRACE_TRIES:
                return
            self._grace_tries += 1
            self._grace_reading = True
        try:
            probe = getattr(self._get_backend(), "preemption_grace", None)
            grace = probe(info) if callable(probe) else None
        except Exception as exc:  # a busy controller: the next record's query tries again
            log.info("cannot read the preemption grace from the Slurm configuration: %s", exc)
            with self._lock:
                self._grace_reading = False
            return
        with self._lock:
            self._grace, self._grace_known, self._grace_reading = grace, True, False
        if grace is not None:
            log.info("slurm: a preemption would give %.0f s of grace (%s)", grace.seconds, grace.source)

    def grace(self) -> ClusterGrace | None:
        with self._lock:
            return self._grace

    def request_job_info(self) -> None:
        if not self.job_id or self._busy.is_set():
            return
        self._busy.set()
        self._done.clear()
        threading.Thread(target=self._query, daemon=True, name="slurm-query").start()

    def job_info(self) -> Any | None:
        with self._lock:
            return self._latest.info if self._latest else None

    def job_info_now(self, timeout: float) -> Any | None:
        """A fresh answer, waiting at most ``timeout`` seconds (the child has already ended)."""
        if not self.job_id:
            return None
        self.request_job_info()
        self._done.wait(timeout)
        return self.job_info()

    def version(self, timeout: float = VERSION_WAIT_S) -> SlurmVersion | None:
        """The Slurm version, asked once on a worker thread: a hanging ``scontrol --version`` holds
        the caller at most ``timeout`` seconds the first time and never again (None meanwhile)."""
        if self._version is not None or not self.job_id:
            return self._version
        with self._lock:
            asking = self._version_thread
            if asking is None or (not asking.is_alive() and self._version is None):
                asking = threading.Thread(target=self._ask_version, daemon=True, name="slurm-version")
                self._version_thread = asking
                asking.start()
                wait = timeout
            else:
                wait = 0.0
        asking.join(wait)
        return self._version

    def _ask_version(self) -> None:
        try:
            self._version = SlurmVersion.of(self._get_backend().version())
        except Exception:
            pass

    def node_known(self, node: str, timeout: float = 5.0) -> bool:
        """Slurm knows this node (the ledger is shared by runs on every cluster of the user: an
        unknown node in --exclude makes Slurm refuse the job). Unknown or no answer: False."""
        box: dict[str, Any] = {}

        def work() -> None:
            try:
                probe = getattr(self._get_backend(), "node_state", None)
                box["state"] = probe(node) if callable(probe) else None
            except Exception:
                box["state"] = None

        thread = threading.Thread(target=work, daemon=True, name="slurm-node")
        thread.start()
        thread.join(timeout)
        return box.get("state") is not None

    def requeue(self, expected_restarts: int | None, exclude: Sequence[str], timeout: float = 20.0) -> Any:
        """Ask for the requeue, waiting at most ``timeout`` seconds: after a notice the allocation
        ends soon, and a hung controller must not hold the supervisor past it."""
        box: dict[str, Any] = {}

        def work() -> None:
            try:
                box["result"] = self._get_backend().requeue(self.job_id, expected_restarts=expected_restarts,
                                                            exclude=list(exclude))
            except Exception as exc:
                box["error"] = exc

        thread = threading.Thread(target=work, daemon=True, name="slurm-requeue")
        thread.start()
        thread.join(timeout)
        if "error" in box:
            raise box["error"]
        if "result" not in box:
            raise TimeoutError(f"scontrol requeue did not answer within {timeout:g} s")
        return box["result"]
