"""What every part of the run loop shares: the config, the layout, the seams and the event log."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..config import SupervisorConfig
from ..events import Ev, Event, EventLog, parse_line
from ..ledger import Ledger
from ..preemption import SaveHistory
from ..redact import redact_value
from ..signals import signal_number
from ..sinks import Sink, deliver
from ..slurm import SlurmEnv
from .layout import RunLayout
from .seams import Channel, ChildStarter, Clock, SlurmView, Waker

log = logging.getLogger("supervisor.run")

# An add-on's view of the run (supervisor/sinks.py): each event as it is recorded, on the loop's
# thread. The composition root (supervisor/cli/run_cmd.py) registers them: notify and the metrics
# writer; the loop imports neither.
EventSink = Sink


@dataclass
class RunContext:
    cfg: SupervisorConfig
    argv: list[str]
    environ: Mapping[str, str]
    layout: RunLayout
    slurm_env: SlurmEnv
    clock: Clock
    waker: Waker
    start_child: ChildStarter
    slurm: SlurmView
    channel: Channel | None = None
    control_key: str = ""
    events: EventLog | None = None
    echo: bool = True
    host: str = "localhost"
    lock: Any = None  # the run lock (supervisor.lock.RunLock), checked while the child runs
    noticed: bool = False  # a stop notice arrived in this job: exit quickly, the deadline wins
    interrupts: int = 0
    notice_signals: frozenset[int] = field(default_factory=frozenset)
    stall: Any = None  # supervisor.stall.StallTimeout for the whole run (what it learned survives restarts)
    node_ledger: Any = None  # supervisor.nodes.NodeLedger, opened on first use
    node_ledger_writes: list[Any] = field(default_factory=list)  # background appends, joined (bounded) at teardown
    # The run's save durations, seeded from the log once at start and kept up to date by emit(): a
    # notice is arbitrated from memory, never by re-reading a log that grows with the run's age.
    save_history: SaveHistory | None = None
    # The log as a projection: the run's events folded as each is recorded (seeded from the log read
    # once at start), so attempt start and end read the ledger and the saves from memory.
    history: Ledger | None = None
    cwd: Any = None  # the child's working directory (pathlib.Path): relative paths in its output start there
    resumability_said: Any = None  # (ok, missing) of the last resumability statement (run/resumable.py)
    # Whatever else wants each recorded event (supervisor/sinks.py): the CLI registers notify and
    # the metrics writer here, so the loop imports neither.
    sinks: list[Sink] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.notice_signals:
            self.notice_signals = frozenset(signal_number(s) for s in self.cfg.preemption.signals)

    def emit(self, event: Ev, **fields: Any) -> None:
        """Record an event. The log must never take the loop down: a failure is logged, not raised.
        The sinks (notify, metrics) are told of it even then, with the event as it would have been
        recorded (redacted, timestamped)."""
        if self.events is None:
            return
        try:
            recorded = self.events.emit(event, **fields)
        except Exception as exc:  # a full disk or a deleted run dir must not orphan the child
            log.error("could not record %s: %s", event.value, exc)
            recorded = Event(event.value, time.time(), redact_value(fields))
        else:
            if event is Ev.SAVE_END and self.save_history is not None:
                self.save_history = self.save_history.with_event(recorded)
            if self.history is not None:
                self._project(recorded)
        deliver(self.sinks, recorded)  # the one fan-out point to the registered sinks; never raises

    def _project(self, recorded: Event) -> None:
        """Fold the event into the in-memory ledger as a reader of the file will see it (JSON types,
        the validity check), not as passed. Never raises: the projection must not take the loop down."""
        assert self.history is not None
        try:
            as_read = parse_line(recorded.to_json())
        except (TypeError, ValueError, RecursionError) as exc:
            log.error("could not fold %s into the ledger: %s", recorded.event, exc)
            return
        if as_read is not None:
            self.history.apply(as_read)

    def note_node(self, record: Any) -> None:
        """Add a record to the node health ledger, on a background thread (never waits, never raises)."""
        try:
            if self.node_ledger is None:
                from ..nodes import NodeLedger, node_ledger_path

                self.node_ledger = NodeLedger(node_ledger_path(self.cfg.nodes, self.environ), self.cfg.nodes.max_bytes)
            self.node_ledger_writes = [t for t in self.node_ledger_writes if t.is_alive()]
            self.node_ledger_writes.append(self.node_ledger.append_in_background(record))
        except Exception as exc:  # noqa: BLE001 - the node ledger is advice
            log.warning("node ledger: %s", exc)

    def seed_save_history(self, events: list[Any]) -> None:
        """Start the in-memory save history and ledger from the log read once at run start."""
        self.save_history = SaveHistory.from_events(events, unknown_save_s=self.cfg.preemption.unknown_save_s)
        self.history = Ledger.of(events)

    def ledger_now(self) -> Ledger:
        """The run's ledger without reading the log (seeded here if the run start did not)."""
        if self.history is None:
            self.seed_save_history(self.read_events())
        assert self.history is not None
        return self.history

    def save_events(self) -> list[Event]:
        """The run's ``save_end`` and ``save_elsewhere`` events so far, from memory."""
        return self.ledger_now().saves

    def current_save_history(self) -> SaveHistory:
        """The save history without reading the log (seeded here if the run start did not)."""
        if self.save_history is None:
            self.seed_save_history(self.read_events())
        assert self.save_history is not None
        return self.save_history

    def read_events(self) -> list[Any]:
        """The run's events so far, through the open log (events still waiting out a full disk
        included); never raises."""
        if self.events is not None:
            try:
                return list(self.events.read().events)
            except Exception as exc:
                log.error("could not read the event log: %s", exc)
                return []
        from ..events import read_events

        try:
            return list(read_events(self.layout.paths.events).events)
        except OSError:
            return []

    def broadcast(self, kind: str, **fields: Any) -> None:
        if self.channel is None:
            return
        try:
            self.channel.broadcast(kind, **fields)
        except Exception as exc:  # the channel is advisory
            log.debug("broadcast %s failed: %s", kind, exc)
