"""Every failure class's traits in one table, :data:`CLASSES`: what the run does about it by default,
whose fault it is, what the node health ledger counts it as, how the run's ledger and budgets treat
it, and the line that says what it is. Everything else that depends on a class reads it from here:

* ``policy.DEFAULT_POLICY`` (action, retries, exclude_node);
* ``preemption`` (a requeue for a ``hardware_requeue`` class is the node's fault);
* ``config.NodesConfig`` (the defaults of ``nodes.hardware`` / ``nodes.suspect``, from ``node_kind``);
* ``ledger.NOT_FAILURES`` / ``SCHEDULER_ENDS`` / ``RESULTS_CHECK_CLASSES`` (from ``ends`` and
  ``results_check``), and through them the budgets, the report and the metrics;
* ``failures.evidence.SCHEDULER_CLASSES`` / ``CLAIM_WORDS`` (from ``slurm_claim``);
* ``diagnose.plan.DIAGNOSABLE`` (from ``diagnosable``).

``tests/test_failure_classes.py`` checks that no second list of classes with a trait exists and
that the derived views agree with the table; docs/extending/failure-class.md says how to add one.

A classified failure carries no action: the classifier says what happened (the class and its
evidence), and ``run/judge.py`` decides once what to do, from this table through the policy.

Stdlib and :mod:`supervisor.states` only, so every layer can import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Literal

from ..states import Action, FailureClass

FC = FailureClass
NodeKind = Literal["hardware", "suspect"]


class Ending(str, Enum):
    """Who ended the attempt, for the run's ledger: only a ``FAILURE`` is the run's own to answer for
    (it counts against the restart budgets and is a crash in the report)."""

    DONE = "done"  # the training finished
    SCHEDULER = "scheduler"  # Slurm took the allocation away; the run comes back by a requeue
    PERSON = "person"  # a person stopped it; respect it
    FAILURE = "failure"


@dataclass(frozen=True)
class ClassTraits:
    """One failure class.

    ``action``/``retries``/``exclude_node``: the default policy (``policy:`` in the config overrides
    them). ``hardware_requeue``: a requeue for it is the node's fault (``preemption.decide_requeue``).
    ``node_kind``: what the node ledger's defaults count it as (``nodes.hardware`` excludes a node,
    ``nodes.suspect`` only flags it; None: neither). ``ends``: who ended the attempt (see
    :class:`Ending`). ``results_check``: the numbers the training produced are suspect after it.
    ``slurm_claim``: only Slurm can confirm it (a line printed in the output is a claim, in these
    words); None for the classes the output alone can show. ``diagnosable``: a rerun under a
    sanitizer can find its cause (``supervise diagnose``). ``summary``: what it is, in one line.
    """

    action: Action
    retries: int = 3
    exclude_node: bool = False
    hardware_requeue: bool = False
    node_kind: NodeKind | None = None
    ends: Ending = Ending.FAILURE
    results_check: bool = False
    slurm_claim: str | None = None
    diagnosable: bool = False
    summary: str = ""

    @property
    def answerable(self) -> bool:
        """A failure the run answers for (not completion, the scheduler or a person)."""
        return self.ends is Ending.FAILURE

    @property
    def scheduler_end(self) -> bool:
        """The scheduler ended it and the run comes back by a requeue."""
        return self.ends is Ending.SCHEDULER


R, Q, S = Action.RESTART, Action.REQUEUE, Action.STOP

CLASSES: Mapping[FailureClass, ClassTraits] = {
    FC.COMPLETED: ClassTraits(S, ends=Ending.DONE, summary="exit 0: the training finished"),
    # Transient native or GPU-kernel faults: a restart in place usually gets past them.
    FC.NATIVE_CRASH: ClassTraits(R, summary="SIGSEGV / SIGBUS / SIGILL / SIGFPE / SIGABRT"),
    FC.ILLEGAL_MEMORY_ACCESS: ClassTraits(R, node_kind="suspect", results_check=True, diagnosable=True,
                                          summary="CUDA illegal memory access"),
    FC.CUDA_LAUNCH_FAILURE: ClassTraits(R, node_kind="suspect", results_check=True, diagnosable=True,
                                        summary="unspecified launch failure, misaligned address"),
    FC.NCCL_ERROR: ClassTraits(R, node_kind="suspect", summary="NCCL errors and watchdog timeouts"),
    FC.HANG: ClassTraits(R, 2, node_kind="suspect", summary="no progress for stall_timeout; killed by the supervisor"),
    # The node or its hardware is at fault: come back elsewhere.
    FC.HARDWARE_FAULT: ClassTraits(Q, 2, exclude_node=True, hardware_requeue=True, node_kind="hardware",
                                   results_check=True, summary="ECC, Xid, CUDA unknown error, fallen off the bus"),
    FC.INTERCONNECT: ClassTraits(Q, 2, exclude_node=True, hardware_requeue=True, node_kind="hardware",
                                 summary="InfiniBand/RoCE, libfabric (EFA, CXI), UCX transport errors: the fabric"),
    # A full /dev/shm: the node's set-up, so the requeue goes elsewhere; but not counted against the
    # node in the shared ledger (another job's files may have filled it).
    FC.SHM_EXHAUSTED: ClassTraits(Q, 2, exclude_node=True, hardware_requeue=True,
                                  summary="SIGBUS / bus error from a full /dev/shm"),
    FC.NODE_FAILURE: ClassTraits(Q, 2, exclude_node=True, hardware_requeue=True, node_kind="hardware",
                                 slurm_claim="node failure", summary="Slurm says the node failed"),
    # A person must act: restarting reproduces it.
    FC.DEVICE_ASSERT: ClassTraits(S, 0, results_check=True, diagnosable=True, summary="a device-side assert"),
    FC.CUDA_OOM: ClassTraits(S, 0, summary="CUDA out of memory"),
    FC.HOST_OOM: ClassTraits(S, 0, summary="the kernel's OOM killer"),
    FC.PYTHON_EXCEPTION: ClassTraits(S, 0, summary="an uncaught Python exception"),
    # The scheduler took the allocation away, or a person ended the job.
    FC.PREEMPTED: ClassTraits(Q, 1000, ends=Ending.SCHEDULER, slurm_claim="preemption",
                              summary="Slurm preempted the job"),
    FC.TIME_LIMIT: ClassTraits(Q, 1000, ends=Ending.SCHEDULER, slurm_claim="time limit",
                               summary="the job reached its time limit"),
    FC.CANCELLED: ClassTraits(S, 0, ends=Ending.PERSON, summary="scancel / Ctrl-C by a person: respect it"),
    FC.KILLED: ClassTraits(R, 1, summary="SIGKILL from an unknown source"),
    FC.UNKNOWN: ClassTraits(R, 1, summary="nothing recognised"),
}


def classes_where(**wanted: object) -> frozenset[FailureClass]:
    """The classes whose traits have every given value, e.g. ``classes_where(hardware_requeue=True)``."""
    return frozenset(c for c, t in CLASSES.items() if all(getattr(t, k) == v for k, v in wanted.items()))


def node_kinds(kind: NodeKind) -> tuple[str, ...]:
    """The class names the node ledger counts as ``kind`` by default, in table order."""
    return tuple(c.value for c, t in CLASSES.items() if t.node_kind == kind)


def claim_words() -> dict[FailureClass, str]:
    """The classes only Slurm can confirm, and the words for a claim of one printed in the output."""
    return {c: t.slurm_claim for c, t in CLASSES.items() if t.slurm_claim is not None}
