"""Test doubles for the run loop's seams (supervisor/run/seams.py): a fake clock that only moves
when the loop waits, a waker that delivers scripted signals at scripted times, a child that follows
a script (lines, control messages, saves, an exit) and reacts to the signals it is sent, a
control channel, and a Slurm view with scripted job records.

With them ``Runner`` runs deterministically in milliseconds: every timeout (grace deadline,
backoff, stall, TERM -> KILL) is exercised exactly, without real processes or sleeping. What is
faked: the processes, the signals, UDP and Slurm. What is real: the event log, the run lock, the
checkpoint scan and every decision.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from supervisor.child import ChildExit, ChildSpec
from supervisor.signals import ReceivedSignal
from supervisor.slurm.parse import JobInfo


class FakeClock:
    def __init__(self, start: float = 1_000_000.0) -> None:
        self.t = start
        self.start = start

    def now(self) -> float:
        return self.t

    def elapsed(self) -> float:
        return round(self.t - self.start, 6)


class FakeWaker:
    """Waiting advances the fake clock; scripted signals arrive at their times (seconds from start)."""

    def __init__(self, clock: FakeClock, signals: list[tuple[float, int]] | None = None) -> None:
        self.clock = clock
        self.pending = sorted(signals or [])
        self.delivered: list[ReceivedSignal] = []

    def send(self, at: float, signum: int) -> None:
        self.pending = sorted([*self.pending, (at, signum)])

    def wait(self, timeout: float) -> None:
        target = self.clock.t + max(timeout, 0.0)
        if self.pending and self.clock.start + self.pending[0][0] < target:
            target = max(self.clock.start + self.pending[0][0], self.clock.t)
        self.clock.t = target

    def drain(self) -> list[ReceivedSignal]:
        out = []
        while self.pending and self.clock.start + self.pending[0][0] <= self.clock.t:
            _, signum = self.pending.pop(0)
            out.append(ReceivedSignal(signum, self.clock.t))
        self.delivered += out
        return out


@dataclass
class Msg:
    """A control message as ``ControlServer.poll`` returns it."""

    kind: str
    fields: dict[str, Any]
    attempt: int | None = None
    rank: int | None = 0
    host: str | None = "node1"
    sender: tuple[str, int] = ("127.0.0.1", 40000)


class FakeChannel:
    address = "udp://127.0.0.1:1"

    def __init__(self) -> None:
        self.inbox: list[Msg] = []
        self.sent: list[tuple[float, str, dict[str, Any]]] = []
        self.clock: FakeClock | None = None
        self.flood = False

    def poll(self, max_messages: int = 1024) -> list[Msg]:
        out, self.inbox = self.inbox[:max_messages], self.inbox[max_messages:]
        return out

    def broadcast(self, kind: Any, **fields: Any) -> int:
        self.sent.append((self.clock.now() if self.clock else 0.0, str(getattr(kind, "value", kind)), fields))
        return 1

    def flooded(self, now: float, window: float = 60.0) -> bool:
        return self.flood

    def kinds(self) -> list[str]:
        return [k for _, k, _ in self.sent]


# A script step: (seconds after the attempt started, action). Actions:
#   ("line", "step 5")                          a line of output
#   ("msg", "heartbeat", {"step": 5})           a control message from rank 0
#   ("write", "name", b"bytes")                 write a file into the checkpoint directory
#   ("exit", code) / ("die", signum)            the main process ends
Step = tuple


@dataclass
class ChildScript:
    steps: list[Step]
    # what the child does when its group gets a signal: "die", "ignore", or ("exit", code, after_s)
    on_signal: dict[int, Any] = field(default_factory=dict)


class FakeChild:
    def __init__(self, spec: ChildSpec, script: ChildScript, clock: FakeClock, channel: FakeChannel,
                 ckpt_dir: Path, attempt: int) -> None:
        self.spec, self.script, self.clock, self.channel = spec, script, clock, channel
        self.ckpt_dir, self.attempt = ckpt_dir, attempt
        self.started = clock.now()
        self.todo = sorted(script.steps, key=lambda s: s[0])
        self.lines: list[str] = []
        self.tail = ""
        self.exit: ChildExit | None = None
        self.signals: list[tuple[float, int]] = []
        self.dumped = False
        self.pid = 4242

    def _advance(self) -> None:
        now = self.clock.now()
        while self.exit is None and self.todo and self.started + self.todo[0][0] <= now:
            at, action, *args = self.todo.pop(0)
            if action == "line":
                self.lines.append(args[0])
                self.tail += args[0] + "\n"
            elif action == "msg":
                fields = dict(args[1])
                self.channel.inbox.append(Msg(args[0], fields, attempt=self.attempt))
            elif action == "write":
                (self.ckpt_dir / args[0]).write_bytes(args[1])
            elif action == "exit":
                self._end(args[0], None, at)
            elif action == "die":
                self._end(None, args[0], at)

    def _end(self, code: int | None, sig: int | None, at: float) -> None:
        if self.exit is None:
            self.exit = ChildExit(code, sig, round(self.clock.now() - self.started, 6))

    # ChildHandle
    def poll(self) -> ChildExit | None:
        self._advance()
        return self.exit

    def signal_group(self, sig: int) -> bool:
        self._advance()
        self.signals.append((round(self.clock.now() - self.clock.start, 6), sig))
        if self.exit is not None:
            return False
        shielded = sig in getattr(self.spec, "shield_signals", ())
        reaction = self.script.on_signal.get(sig, "ignore" if shielded else "die")
        if sig == signal.SIGKILL:
            reaction = "die"
        if reaction == "die":
            self._end(None, sig, 0)
        elif isinstance(reaction, tuple) and reaction[0] == "exit":
            rel = self.clock.now() - self.started + reaction[2]
            self.todo = sorted([*self.todo, (rel, "exit", reaction[1])], key=lambda s: s[0])
        return True

    def drain_lines(self, max_lines: int) -> list[str]:
        self._advance()
        out, self.lines = self.lines[:max_lines], self.lines[max_lines:]
        return out

    def tail_text(self) -> str:
        return self.tail

    def lines_not_analysed(self) -> tuple[int, int]:
        return 0, 0

    def finish(self) -> None:
        pass

    def dump_stacks(self, out_path: Path, dump_signal: int) -> str:
        self.dumped = True
        return "fake dump"


class FakeStarter:
    """Starts one scripted child per attempt (the last script repeats)."""

    def __init__(self, scripts: list[ChildScript], clock: FakeClock, channel: FakeChannel, ckpt_dir: Path) -> None:
        self.scripts, self.clock, self.channel, self.ckpt_dir = scripts, clock, channel, ckpt_dir
        self.children: list[FakeChild] = []

    def __call__(self, spec: ChildSpec) -> FakeChild:
        script = self.scripts[min(len(self.children), len(self.scripts) - 1)]
        attempt = int(spec.env.get("SUPERVISOR_ATTEMPT", "1"))
        child = FakeChild(spec, script, self.clock, self.channel, self.ckpt_dir, attempt)
        self.children.append(child)
        return child


def Job(state: str = "RUNNING", preempt_time: float | None = None, end_time: float | None = None,
        requeue: bool = True, restarts: int = 0, time_limit: int | None = 3600) -> JobInfo:
    """A scripted Slurm job record: the facade's own ``JobInfo``, as ``scontrol show job`` parses."""
    return JobInfo(job_id=1, state=state, requeue=requeue, batch_flag=1, restarts=restarts,
                   preempt_time=preempt_time, end_time=end_time, start_time=999_000.0, time_limit=time_limit)


class FakeSlurm:
    """``job_info`` answers with ``records`` (a function of the fake time); ``answers=False`` is a
    slurmctld that never answers."""

    def __init__(self, clock: FakeClock, record: Callable[[float], JobInfo | None] | None = None,
                 answers: bool = True, version: tuple[int, ...] = (22, 5, 8)) -> None:
        self.clock, self.record, self.answers, self._version = clock, record, answers, version
        self.requeues: list[tuple[float, tuple[str, ...]]] = []
        self.queries = 0
        self.cluster_grace: Any = None  # a supervisor.slurm.grace.ClusterGrace the config would show

    def request_job_info(self) -> None:
        self.queries += 1

    def job_info(self) -> JobInfo | None:
        if not self.answers or self.record is None:
            return None
        return self.record(self.clock.now() - self.clock.start)

    def job_info_now(self, timeout: float) -> JobInfo | None:
        if not self.answers:
            self.clock.t += timeout
            return None
        return self.job_info()

    def version(self) -> tuple[int, ...] | None:
        return self._version

    def grace(self) -> Any:
        return self.cluster_grace

    def node_known(self, node: str) -> bool:
        return node in ("n1", "n2")

    def requeue(self, expected_restarts: int | None, exclude: Any) -> Any:
        self.requeues.append((self.clock.now() - self.clock.start, tuple(exclude)))

        @dataclass
        class _R:
            ok: bool = True
            reason: str = "requeued"
        return _R()
