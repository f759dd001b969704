"""Where a recorded event goes besides the event log: the sinks registered on the run.

The run loop hands every event it records to :func:`deliver` (one place: ``RunContext.emit`` in
``supervisor/run/context.py``); what a sink does with it (the metrics files of
``supervisor/metrics/``, say) is none of the loop's business, so the loop imports no sink. A sink
must return at once (hand slow work to a thread of its own) and must not raise; :func:`deliver`
swallows and logs what one raises anyway, so a broken sink never takes the run down.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Protocol, runtime_checkable

from .events import Event

log = logging.getLogger("supervisor.sinks")

__all__ = ["Sink", "deliver"]


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
