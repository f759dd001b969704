"""The GPU-check add-on (a hook of ``supervisor/run/hooks.py``): the repeatability check of
``supervisor/addons/health.py`` before an attempt, when ``preflight: [gpu]`` asks for it or a loss anomaly
since the node's GPUs were last checked does (``gpu_check.after_loss_anomaly``).

The run loop never imports this module; ``supervisor/cli/run_cmd.py`` wires it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..events import Ev
from .health import after_loss_anomaly, probe_args_for, run_check
from .manifest import find_child_python
from .nodes import NodeRecord, record_gpu_check
from ..progress import LossVerdict
from ..run.attempt import AttemptState
from ..run.context import RunContext
from ..run.hooks import AddOn, NodeFault

log = logging.getLogger("supervisor.run")

RecordNode = Callable[[RunContext, NodeRecord], None]  # where a checkable verdict is recorded (the node ledger)


class GpuPreflight(AddOn):
    """``record``: called with each verdict that could judge the node (``NodeHealth.note`` of
    ``supervisor/addons/node_health.py`` in a full run); None records nothing."""

    def __init__(self, record: RecordNode | None = None) -> None:
        self._record = record
        self._loss_kinds: list[str] = []  # loss anomalies since this node's GPUs were last checked

    def on_loss_anomaly(self, ctx: RunContext, state: AttemptState, verdict: LossVerdict, node: str) -> None:
        self._loss_kinds.append(verdict.kind)

    def before_attempt(self, ctx: RunContext, state: AttemptState) -> NodeFault | None:
        check = "gpu" in ctx.cfg.preflight
        if not check and self._loss_kinds:
            wanted = after_loss_anomaly(ctx.cfg.gpu_check, self._loss_kinds)
            if wanted.run:
                ctx.emit(Ev.WARNING, attempt=state.attempt, reason=wanted.reason)
                log.warning("%s", wanted.reason)
            check = wanted.run
        if not check:
            return None
        self._loss_kinds.clear()
        return self.check(ctx, state)

    def check(self, ctx: RunContext, state: AttemptState) -> NodeFault | None:
        """Bit-for-bit repeatability of conv2d/matmul on this node's GPUs, in a subprocess that imports
        torch with the child's interpreter. A failing GPU is a hardware fault: the node is returned, to
        requeue away from it. 'Cannot check' only warns."""
        python, _how = find_child_python(ctx.argv)
        checks = ctx.cfg.gpu_check
        verdict = run_check(checks.timeout, python=python, environ=dict(ctx.environ),
                            probe_args=probe_args_for(checks.repeats), fault_rate=checks.fault_rate)
        ctx.emit(Ev.PREFLIGHT, attempt=state.attempt, check="gpu", **verdict.to_dict())
        node = ctx.slurm_env.nodename or ctx.host
        if verdict.checkable and self._record is not None:
            self._record(ctx, record_gpu_check(node, verdict.ok, verdict.reason, ts=ctx.clock.now(),
                                               run_dir=str(ctx.layout.paths.run_dir), job_id=ctx.slurm_env.job_id,
                                               attempt=state.attempt))
        if verdict.ok or not verdict.checkable:
            if not verdict.ok:
                log.warning("GPU preflight could not judge this node: %s", verdict.reason)
            return None
        log.error("GPU preflight failed on %s: %s", node, verdict.reason)
        return NodeFault(node, f"GPU preflight failed: {verdict.reason}")
