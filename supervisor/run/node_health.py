"""The run's share of the node health ledger (``supervisor/nodes.py``): what it records about the
nodes it ran on, and which nodes the ledger says to keep away from on a requeue."""

from __future__ import annotations

import logging
from typing import Any

from ..events import Ev
from ..failures import evidence_node
from ..nodes import NodeLedger, current_exclusions, node_ledger_path, record_failure
from ..states import FailureClass
from .attempt import AttemptState
from .context import RunContext
from .stop import CauseKind

log = logging.getLogger("supervisor.run")


def note_failure(ctx: RunContext, state: AttemptState, failure: Any, cls: FailureClass, reason: str) -> None:
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
    ctx.note_node(record_failure(target.node, cls.value, ts=ctx.clock.now(),
                                 run_dir=str(ctx.layout.paths.run_dir), job_id=ctx.slurm_env.job_id,
                                 attempt=state.attempt, evidence=evidence))


def with_node_ledger_exclusions(ctx: RunContext, state: AttemptState, exclude: tuple[str, ...]) -> tuple[str, ...]:
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
