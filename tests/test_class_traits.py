"""One table of failure-class traits (supervisor/class_traits.py): every class has a row, what is
derived from it is what the run did before the table, and the places that still hold their own list
(the node ledger's defaults in config.py, the classifier's patterns) agree with it."""

from __future__ import annotations

from supervisor.class_traits import CLASSES, classes_where, node_kinds
from supervisor.config import NodesConfig
from supervisor.failures.patterns import DEFAULT_PATTERNS
from supervisor.ledger import NOT_FAILURES, RESULTS_CHECK_CLASSES, SCHEDULER_ENDS
from supervisor.policy import DEFAULT_POLICY
from supervisor.preemption import _HARDWARE
from supervisor.states import Action, FailureClass as FC


def test_every_class_has_one_row() -> None:
    assert set(CLASSES) == set(FC)


def test_the_derived_sets_are_what_the_run_used_before_the_table() -> None:
    assert NOT_FAILURES == {FC.COMPLETED, FC.PREEMPTED, FC.TIME_LIMIT, FC.CANCELLED}
    assert SCHEDULER_ENDS == {FC.PREEMPTED, FC.TIME_LIMIT}
    assert RESULTS_CHECK_CLASSES == {FC.ILLEGAL_MEMORY_ACCESS, FC.CUDA_LAUNCH_FAILURE, FC.DEVICE_ASSERT,
                                     FC.HARDWARE_FAULT}
    assert _HARDWARE == {FC.HARDWARE_FAULT, FC.SHM_EXHAUSTED, FC.NODE_FAILURE, FC.INTERCONNECT}
    requeued_elsewhere = {c for c, p in DEFAULT_POLICY.items() if p.action is Action.REQUEUE and p.exclude_node}
    assert requeued_elsewhere == _HARDWARE  # a class requeued as the node's fault also avoids the node
    assert {c: (p.action, p.retries) for c, p in DEFAULT_POLICY.items() if p.action is Action.STOP} == {
        FC.DEVICE_ASSERT: (Action.STOP, 0), FC.CUDA_OOM: (Action.STOP, 0), FC.HOST_OOM: (Action.STOP, 0),
        FC.PYTHON_EXCEPTION: (Action.STOP, 0), FC.CANCELLED: (Action.STOP, 0)}


def test_the_node_ledger_defaults_count_the_classes_the_table_says() -> None:
    # config.py keeps its own tuples (other kinds of record sit beside the classes: gpu_check,
    # slow_node, loss_anomaly); the classes among them must be the table's.
    names = {c.value for c in FC}
    nodes = NodesConfig()
    assert tuple(k for k in nodes.hardware if k in names) == node_kinds("hardware")
    assert tuple(k for k in nodes.suspect if k in names) == node_kinds("suspect")
    assert FC.SHM_EXHAUSTED.value not in nodes.hardware  # requeued elsewhere, never held against the node


def test_every_class_a_pattern_names_has_a_row_and_scheduler_ends_are_not_failures() -> None:
    named = {p.cls for p in DEFAULT_PATTERNS if isinstance(p.cls, FC)}
    assert named <= set(CLASSES)
    assert classes_where(scheduler_end=True) <= classes_where(answerable=False)
