"""Where a recorded event goes besides the event log: the sinks registered on the run.

The run loop hands every event it records to :func:`deliver` (one place: ``RunContext.emit`` in
``supervisor/run/context.py``); what a sink does with it (the metrics files of
``supervisor/addons/metrics/``, say) is none of the loop's business, so the loop imports no sink. A sink
must return at once (hand slow work to a thread of its own) and must not raise; :func:`deliver`
swallows and logs what one raises anyway, so a broken sink never takes the run down.

A sink that counts the run's earlier jobs too (the metrics writer) implements
:class:`HistorySink`: the loop hands it the events it read once at its start, before it records
anything (:func:`seed`, from ``RunContext.begin``), so no sink reads the log file again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

from .events import Event

log = logging.getLogger("supervisor.sinks")

__all__ = ["HistorySink", "Sink", "deliver", "seed"]


@runtime_checkable
class Sink(Protocol):
    """Receives each event as the event log recorded it (redacted, with its timestamp)."""

    def accept(self, event: Event) -> None:
        """Called on the run loop's thread for every recorded event: return at once, never raise."""


def deliver(sinks: Iterable[Sink], event: Event) -> None:
    """Hand ``event`` to every sink; a sink that raises is logged and skipped, never propagated."""
    for sink in sinks:
        try:
            sink.accept(event)
        except Exception as exc:  # noqa: BLE001 - a sink is advice; the run goes on
            log.warning("event sink %s failed on %s: %s", type(sink).__name__, event.event, exc)


@runtime_checkable
class HistorySink(Protocol):
    """A sink that also counts the run's events from before this job."""

    def seed(self, history: Sequence[Event]) -> None:
        """Called once, before the first :meth:`Sink.accept`, with the events the run read at its start
        (the log as the run's ledger was folded from it): return at once, never raise, do not mutate."""


def seed(sinks: Iterable[object], history: Sequence[Event]) -> None:
    """Hand the run's history to every sink that wants it; one that raises is logged and skipped."""
    for sink in sinks:
        if not isinstance(sink, HistorySink):
            continue
        try:
            sink.seed(history)
        except Exception as exc:  # noqa: BLE001 - a sink is advice; the run goes on
            log.warning("event sink %s failed on the run's history: %s", type(sink).__name__, exc)
