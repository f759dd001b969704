"""Every failure class's traits in one table: the default restart policy, whether a requeue treats it
as the node's fault, what the node health ledger counts it as, and how the ledger and the budgets
treat it. ``policy.DEFAULT_POLICY``, ``preemption`` (hardware requeues), ``ledger.NOT_FAILURES``,
``ledger.SCHEDULER_ENDS`` and ``ledger.RESULTS_CHECK_CLASSES`` are derived from it, and
``tests/test_class_traits.py`` checks the node ledger's defaults (``config.NodesConfig``) and the
classifier's patterns against it.

A leaf (it imports only :mod:`supervisor.states`): the decisions import it, and it lives outside
``failures/`` because that package's ``__init__`` imports the classifier, which imports ``policy``.
Adding a failure class: docs/architecture.md, "How to add".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .states import Action, FailureClass

FC = FailureClass
NodeKind = Literal["hardware", "suspect"]


@dataclass(frozen=True)
class ClassTraits:
    """One failure class. ``action``/``retries``/``exclude_node``: the default policy (``policy:``
    in the config overrides them). ``hardware_requeue``: a requeue for it is the node's fault
    (``preemption.decide_requeue``). ``node_kind``: what the node ledger's defaults count it as
    (``nodes.hardware`` excludes a node, ``nodes.suspect`` only flags it; None: neither).
    ``answerable``: a failure the run answers for (not completion, the scheduler or a person).
    ``scheduler_end``: the run comes back by a requeue. ``results_check``: the numbers the
    training produced are suspect after it."""

    action: Action
    retries: int = 3
    exclude_node: bool = False
    hardware_requeue: bool = False
    node_kind: NodeKind | None = None
    answerable: bool = True
    scheduler_end: bool = False
    results_check: bool = False
    summary: str = ""


R, Q, S = Action.RESTART, Action.REQUEUE, Action.STOP

CLASSES: dict[FailureClass, ClassTraits] = {
    FC.COMPLETED: ClassTraits(S, answerable=False, summary="exit 0: training finished"),
    FC.NATIVE_CRASH: ClassTraits(R, summary="SIGSEGV / SIGBUS / SIGILL / SIGFPE / SIGABRT"),
    FC.ILLEGAL_MEMORY_ACCESS: ClassTraits(R, node_kind="suspect", results_check=True,
                                          summary="CUDA illegal memory access"),
    FC.CUDA_LAUNCH_FAILURE: ClassTraits(R, node_kind="suspect", results_check=True,
                                        summary="unspecified launch failure, misaligned address"),
    FC.NCCL_ERROR: ClassTraits(R, node_kind="suspect", summary="NCCL errors and watchdog timeouts"),
    FC.HANG: ClassTraits(R, 2, node_kind="suspect", summary="no progress for stall_timeout"),
    FC.HARDWARE_FAULT: ClassTraits(Q, 2, exclude_node=True, hardware_requeue=True, node_kind="hardware",
                                   results_check=True, summary="ECC, Xid, CUDA unknown error, fallen off the bus"),
    FC.INTERCONNECT: ClassTraits(Q, 2, exclude_node=True, hardware_requeue=True, node_kind="hardware",
                                 summary="InfiniBand/RoCE, libfabric, UCX transport errors"),
    # A full /dev/shm: the node's set-up, so the requeue goes elsewhere; but not counted against the
    # node in the shared ledger (another job's files may have filled it).
    FC.SHM_EXHAUSTED: ClassTraits(Q, 2, exclude_node=True, hardware_requeue=True,
                                  summary="SIGBUS / bus error from a full /dev/shm"),
    FC.NODE_FAILURE: ClassTraits(Q, 2, exclude_node=True, hardware_requeue=True, node_kind="hardware",
                                 summary="Slurm says the node failed"),
    FC.DEVICE_ASSERT: ClassTraits(S, 0, results_check=True, summary="a device-side assert"),
    FC.CUDA_OOM: ClassTraits(S, 0, summary="CUDA out of memory"),
    FC.HOST_OOM: ClassTraits(S, 0, summary="the kernel's OOM killer"),
    FC.PYTHON_EXCEPTION: ClassTraits(S, 0, summary="an uncaught Python exception"),
    FC.PREEMPTED: ClassTraits(Q, 1000, answerable=False, scheduler_end=True, summary="Slurm preempted the job"),
    FC.TIME_LIMIT: ClassTraits(Q, 1000, answerable=False, scheduler_end=True, summary="the job's time limit"),
    FC.CANCELLED: ClassTraits(S, 0, answerable=False, summary="scancel / Ctrl-C by a person"),
    FC.KILLED: ClassTraits(R, 1, summary="SIGKILL from an unknown source"),
    FC.UNKNOWN: ClassTraits(R, 1, summary="nothing recognised"),
}


def traits(cls: FailureClass) -> ClassTraits:
    return CLASSES[cls]


def classes_where(**wanted: object) -> frozenset[FailureClass]:
    """The classes whose traits have every given value, e.g. ``classes_where(hardware_requeue=True)``."""
    return frozenset(c for c, t in CLASSES.items() if all(getattr(t, k) == v for k, v in wanted.items()))


def node_kinds(kind: NodeKind) -> tuple[str, ...]:
    """The class names the node ledger counts as ``kind`` by default, in table order."""
    return tuple(c.value for c, t in CLASSES.items() if t.node_kind == kind)
