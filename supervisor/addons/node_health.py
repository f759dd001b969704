"""The node-health add-on (hooks of ``supervisor/run/hooks.py``): the run's share of the node health
ledger (``supervisor/addons/nodes.py``) and the slow-node finder (``supervisor/addons/slownode.py``).

It records what the run learns about the nodes it ran on (failures of hardware or suspect classes,
loss anomalies, slow nodes, and, through :meth:`NodeHealth.note`, the GPU check's verdicts), names
a node slower than its peers, and at a requeue adds the nodes the ledger holds enough hardware
evidence against. The ledger is opened on first use and written on background threads, joined
(bounded) at teardown. The run loop never imports this module; ``supervisor/cli/run_cmd.py`` wires it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from ..events import Ev
from ..failures import Failure, evidence_node
from .nodes import NodeLedger, NodeRecord, current_exclusions, node_ledger_path, record_failure, record_loss_anomaly
from .nodes import record_slow_node
from ..progress import LossVerdict
from .slownode import SlowNodeTracker
from ..states import FailureClass
from ..run.attempt import AttemptState
from ..run.context import RunContext
from ..run.hooks import AddOn, Heartbeat, NodeFault
from ..run.stop import CauseKind

log = logging.getLogger("supervisor.run")

WAIT_AT_TEARDOWN_S = 5.0  # ledger records still being written when the run ends
WAIT_AFTER_NOTICE_S = 1.0  # ... when a stop notice came: the grace deadline wins


class NodeHealth(AddOn):
    """See the module docstring. One per run."""

    def __init__(self) -> None:
        self._ledger: NodeLedger | None = None
        self._writes: list[threading.Thread] = []
        self._slow: SlowNodeTracker | None = None  # the attempt in progress's finder (slow_node.action not off)
        self._slow_attempt: int | None = None

    # ------------------------------------------------------------------ the ledger

    def note(self, ctx: RunContext, record: NodeRecord) -> None:
        """Add a record to the node health ledger, on a background thread (never waits, never raises)."""
        try:
            if self._ledger is None:
                self._ledger = NodeLedger(node_ledger_path(ctx.cfg.nodes, ctx.environ), ctx.cfg.nodes.max_bytes)
            self._writes = [t for t in self._writes if t.is_alive()]
            self._writes.append(self._ledger.append_in_background(record))
        except Exception as exc:  # noqa: BLE001 - the ledger is advice
            log.warning("node ledger: %s", exc)

    def at_teardown(self, noticed: bool) -> None:
        end = time.monotonic() + (WAIT_AFTER_NOTICE_S if noticed else WAIT_AT_TEARDOWN_S)
        for thread in self._writes:
            thread.join(max(end - time.monotonic(), 0.0))

    def on_failure_recorded(self, ctx: RunContext, state: AttemptState, failure: Failure, cls: FailureClass,
                            reason: str) -> None:
        """A failure of a hardware or suspect class counts against the node it happened on: the node
        the output named when it is one of this job's nodes, else this node; a name from outside the
        allocation is ignored, and said so (supervisor/failures/evidence.py)."""
        nodes = ctx.cfg.nodes
        if state.stop.is_(CauseKind.REQUEUE) or (cls.value not in nodes.hardware and cls.value not in nodes.suspect):
            return
        allocation = (*ctx.slurm_env.node_names, *state.peers.nodes)
        if ctx.slurm_env.nodename is None:  # a local run: this host is the allocation
            allocation = (*allocation, ctx.host)
        target = evidence_node(failure.node, ctx.slurm_env.nodename or ctx.host, allocation)
        if target.node is None:
            ctx.emit(Ev.WARNING, attempt=state.attempt, reason=f"no node evidence recorded: {target.reason}",
                     node=target.ignored, allocation=list(allocation))
            log.warning("%s", target.reason)
            return
        evidence = failure.evidence[0] if failure.evidence and cls is failure.cls else reason
        self.note(ctx, record_failure(target.node, cls.value, ts=ctx.clock.now(),
                                      run_dir=str(ctx.layout.paths.run_dir), job_id=ctx.slurm_env.job_id,
                                      attempt=state.attempt, evidence=evidence))

    def on_loss_anomaly(self, ctx: RunContext, state: AttemptState, verdict: LossVerdict, node: str) -> None:
        self.note(ctx, record_loss_anomaly(node, verdict.kind, verdict.reason, ts=ctx.clock.now(),
                                           run_dir=str(ctx.layout.paths.run_dir), job_id=ctx.slurm_env.job_id,
                                           attempt=state.attempt))

    def nodes_to_exclude(self, ctx: RunContext, state: AttemptState, exclude: tuple[str, ...]) -> tuple[str, ...]:
        """``exclude`` plus the nodes the ledger holds enough hardware evidence against, from every run,
        that this cluster has (the ledger is the user's, across clusters); each added node is said in a
        warning with its reason."""
        ledger = NodeLedger(node_ledger_path(ctx.cfg.nodes, ctx.environ), ctx.cfg.nodes.max_bytes)
        found, problem = current_exclusions(ledger, ctx.clock.now(), ctx.cfg.nodes)
        if problem:
            log.warning("%s", problem)
        known = getattr(ctx.slurm, "node_known", None)
        found = [item for item in found if item.node in exclude or not callable(known) or known(item.node)]
        for item in found:
            if item.node not in exclude:
                ctx.emit(Ev.WARNING, attempt=state.attempt, reason=f"excluding {item.node}: {item.reason}",
                         node=item.node, until=item.until)
        return tuple(sorted(set(exclude) | {item.node for item in found}))

    # ------------------------------------------------------------------ the slow-node finder

    def on_launch(self, ctx: RunContext, state: AttemptState, argv: Sequence[str]) -> None:
        """Each attempt starts with a fresh finder (its ranks and nodes are new)."""
        self._slow_attempt = state.attempt
        self._slow = SlowNodeTracker(ctx.cfg.slow_node) if ctx.cfg.slow_node.action != "off" else None

    def on_heartbeat(self, ctx: RunContext, state: AttemptState, beat: Heartbeat) -> None:
        if self._slow is not None and self._slow_attempt == state.attempt:
            self._slow.observe(beat.rank, beat.host, beat.step, beat.at, step_time=beat.step_time)

    def node_to_leave(self, ctx: RunContext, state: AttemptState, now: float) -> NodeFault | None:
        """A node whose ranks step slower than the other nodes': named in the event log and the node
        ledger, and returned (the loop requeues without it when slow_node.action is requeue)."""
        if self._slow is None or self._slow_attempt != state.attempt:
            return None
        found = self._slow.verdict(now)
        if found is None:
            return None
        ctx.emit(Ev.SLOW_NODE, attempt=state.attempt, action=ctx.cfg.slow_node.action, **found.to_event())
        log.warning("slow node: %s", found.reason)
        self.note(ctx, record_slow_node(found.node, found.reason, ts=ctx.clock.now(),
                                        run_dir=str(ctx.layout.paths.run_dir), job_id=ctx.slurm_env.job_id,
                                        attempt=state.attempt))
        return NodeFault(found.node, found.reason)
