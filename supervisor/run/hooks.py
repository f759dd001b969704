"""Where the run loop reaches its add-ons: the hook points it calls, and nothing else.

The core (``supervisor/run/``, the decisions, checkpoints, the Slurm facade) never imports an add-on
(the GPU check, the node ledger and slow-node finder, the manifest; ``tests/test_layering.py``
checks it). It calls the hooks below at the moments it knows of; an add-on implements the ones it
needs by subclassing :class:`AddOn` (the rest stay no-ops), and the composition root
(``supervisor/cli/run_cmd.py``) hands the run its add-ons. Without any, the loop runs as it is:
no preflight, no manifest, no node records, no slow-node verdicts. Events go the other way, to the
sinks of ``supervisor/sinks.py``; a hook is for what the loop must ask or wait for.

Every hook runs on the loop's thread: it returns at once (slow work on a thread of its own, joined,
bounded, in :meth:`AddOn.at_teardown`). :class:`AddOns` calls each add-on in turn and logs, never
propagates, what one raises: an add-on is advice and never takes the run down.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from ..failures import Failure
from ..progress import LossVerdict
from ..states import FailureClass
from .attempt import AttemptState
from .context import RunContext

log = logging.getLogger("supervisor.run")

__all__ = ["AddOn", "AddOns", "Heartbeat", "NodeFault"]


@dataclass(frozen=True)
class NodeFault:
    """An add-on's finding that the attempt must not run (or go on running) on ``node``: the loop
    keeps the node out of the requeue and stops with ``reason``."""

    node: str
    reason: str


@dataclass(frozen=True)
class Heartbeat:
    """One rank's heartbeat as the control channel delivered it (authenticated, step in range)."""

    rank: int | None
    host: str | None
    step: int
    at: float  # when it was received, on the run's clock
    step_time: float | None  # the rank's own seconds per step, when it reports one


class AddOn(Protocol):
    """The hooks the run loop calls. Subclass it and override what the add-on needs."""

    def before_attempt(self, ctx: RunContext, state: AttemptState) -> NodeFault | None:
        """Before the child starts (resume point chosen, history audited): a fault found on this
        node sends the job elsewhere (a hardware-fault requeue) instead of launching."""
        return None

    def on_launch(self, ctx: RunContext, state: AttemptState, argv: Sequence[str]) -> None:
        """The attempt's child started with ``argv``."""
        return None

    def on_heartbeat(self, ctx: RunContext, state: AttemptState, beat: Heartbeat) -> None:
        """A rank's heartbeat arrived."""
        return None

    def node_to_leave(self, ctx: RunContext, state: AttemptState, now: float) -> NodeFault | None:
        """Asked at each tick of a running, healthy attempt: a node the training should leave now
        (a slow node). The loop requeues without it when ``slow_node.action`` is ``requeue``."""
        return None

    def on_loss_anomaly(self, ctx: RunContext, state: AttemptState, verdict: LossVerdict, node: str) -> None:
        """The loss went NaN/inf or spiked on ``node`` (already recorded as a ``loss_anomaly`` event)."""
        return None

    def on_failure_recorded(self, ctx: RunContext, state: AttemptState, failure: Failure, cls: FailureClass,
                            reason: str) -> None:
        """The attempt failed and its ``failure`` event is written: ``cls`` is the class the verdict
        settled on, ``failure`` what the output showed."""
        return None

    def nodes_to_exclude(self, ctx: RunContext, state: AttemptState, exclude: tuple[str, ...]) -> tuple[str, ...]:
        """At a requeue inside a Slurm job: the nodes to keep the next job away from, given those the
        loop already names (returned unchanged, or with more)."""
        return exclude

    def at_teardown(self, noticed: bool) -> None:
        """The run is ending: let background work land, bounded (``noticed``: a stop notice came,
        the grace deadline wins, wait a second at most)."""
        return None


T = TypeVar("T")


class AddOns(AddOn):
    """The run's add-ons as one: each hook called on every add-on in order; a value-returning hook
    gives the first fault found (or threads ``exclude`` through all). What an add-on raises is logged
    and skipped."""

    def __init__(self, add_ons: Sequence[AddOn] = ()) -> None:
        self.add_ons: tuple[AddOn, ...] = tuple(add_ons)

    @staticmethod
    def _guarded(add_on: AddOn, hook: str, call: Callable[[AddOn], T], default: T) -> T:
        try:
            return call(add_on)
        except Exception as exc:  # noqa: BLE001 - an add-on is advice; the run goes on
            log.warning("add-on %s failed in %s: %s: %s", type(add_on).__name__, hook, type(exc).__name__, exc)
            return default

    def _each(self, hook: str, call: Callable[[AddOn], None]) -> None:
        for add_on in self.add_ons:
            self._guarded(add_on, hook, call, None)

    def _first_fault(self, hook: str, call: Callable[[AddOn], NodeFault | None]) -> NodeFault | None:
        for add_on in self.add_ons:
            fault = self._guarded(add_on, hook, call, None)
            if fault is not None:
                return fault
        return None

    def before_attempt(self, ctx: RunContext, state: AttemptState) -> NodeFault | None:
        return self._first_fault("before_attempt", lambda a: a.before_attempt(ctx, state))

    def on_launch(self, ctx: RunContext, state: AttemptState, argv: Sequence[str]) -> None:
        self._each("on_launch", lambda a: a.on_launch(ctx, state, argv))

    def on_heartbeat(self, ctx: RunContext, state: AttemptState, beat: Heartbeat) -> None:
        self._each("on_heartbeat", lambda a: a.on_heartbeat(ctx, state, beat))

    def node_to_leave(self, ctx: RunContext, state: AttemptState, now: float) -> NodeFault | None:
        return self._first_fault("node_to_leave", lambda a: a.node_to_leave(ctx, state, now))

    def on_loss_anomaly(self, ctx: RunContext, state: AttemptState, verdict: LossVerdict, node: str) -> None:
        self._each("on_loss_anomaly", lambda a: a.on_loss_anomaly(ctx, state, verdict, node))

    def on_failure_recorded(self, ctx: RunContext, state: AttemptState, failure: Failure, cls: FailureClass,
                            reason: str) -> None:
        self._each("on_failure_recorded", lambda a: a.on_failure_recorded(ctx, state, failure, cls, reason))

    def nodes_to_exclude(self, ctx: RunContext, state: AttemptState, exclude: tuple[str, ...]) -> tuple[str, ...]:
        for add_on in self.add_ons:
            exclude = self._guarded(add_on, "nodes_to_exclude", _ask_exclusions(ctx, state, exclude), exclude)
        return exclude

    def at_teardown(self, noticed: bool) -> None:
        self._each("at_teardown", lambda a: a.at_teardown(noticed))


def _ask_exclusions(ctx: RunContext, state: AttemptState,
                    exclude: tuple[str, ...]) -> Callable[[AddOn], tuple[str, ...]]:
    return lambda add_on: tuple(add_on.nodes_to_exclude(ctx, state, exclude))
