"""One table of failure-class traits (supervisor/failures/classes.py): every class has a row, no
other module keeps its own list of classes with a trait, what is derived from the table agrees with
it (and with what the run did before the table), the docs' class table says what the table says,
and a classified failure carries no action: judge decides it from the table through the policy.

The tests take no fixtures: tests/test_add_failure_class.py runs them against a copy of the package
with a class added."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "supervisor"

# Where naming several classes together is not a trait of theirs: the classifier's own rules for
# which evidence beats which (patterns.py: a device assert beats the illegal memory access it
# provokes) and which echoes of a kill may follow a finished training (scan.py).
CLASSIFIER_RULES = {"supervisor/failures/patterns.py", "supervisor/failures/scan.py"}


def test_every_class_has_one_row_with_a_summary() -> None:
    from supervisor.failures.classes import CLASSES
    from supervisor.states import FailureClass as FC

    assert set(CLASSES) == set(FC)
    assert all(t.summary for t in CLASSES.values())


def _names_a_class(node: ast.AST, names: set[str], values: set[str]) -> bool:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return node.value.id in ("FC", "FailureClass") and node.attr in names
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in values


def test_no_module_but_the_table_lists_classes() -> None:
    # A tuple, list or set of two or more classes (or their names), or a dict keyed by them, is a
    # trait kept in a second place: it drifts from the table (shm_exhausted once excluded the node
    # in one file and was not hardware in another). Read it from supervisor/failures/classes.py.
    from supervisor.states import FailureClass as FC

    names, values = {c.name for c in FC}, {c.value for c in FC}
    mention = re.compile(r"\b(?:FC|FailureClass)\.(?:%s)\b|[\"'](?:%s)[\"']" % ("|".join(names), "|".join(values)))
    found = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        text = path.read_text()
        if rel in CLASSIFIER_RULES or rel == "supervisor/failures/classes.py" or len(mention.findall(text)) < 2:
            continue  # a file that names fewer than two classes cannot list them
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                members = list(node.elts)
            elif isinstance(node, ast.Dict):
                members = [k for k in node.keys if k is not None]
            else:
                continue
            if sum(_names_a_class(m, names, values) for m in members) >= 2:
                found.append(f"{rel}:{node.lineno}")
    assert not found, "classes listed outside supervisor/failures/classes.py:\n" + "\n".join(found)


def test_the_derived_views_agree_with_the_table() -> None:
    from supervisor.config import NodesConfig
    from supervisor.addons.diagnose.plan import DIAGNOSABLE
    from supervisor.failures.classes import CLASSES, Ending, classes_where, node_kinds
    from supervisor.failures.evidence import CLAIM_WORDS, SCHEDULER_CLASSES
    from supervisor.failures.patterns import DEFAULT_PATTERNS
    from supervisor.ledger import NOT_FAILURES, RESULTS_CHECK_CLASSES, SCHEDULER_ENDS, is_crash
    from supervisor.addons.metrics.render import _NOT_FAILURES
    from supervisor.policy import DEFAULT_POLICY
    from supervisor.preemption import _HARDWARE
    from supervisor.addons.report.charts import _END_KIND
    from supervisor.states import FailureClass as FC

    for cls, t in CLASSES.items():
        if cls is not FC.COMPLETED:
            p = DEFAULT_POLICY[cls]
            assert (p.action, p.retries, p.exclude_node) == (t.action, t.retries, t.exclude_node), cls
        assert (cls in _HARDWARE) == t.hardware_requeue, cls
        assert (cls in NOT_FAILURES) == (t.ends is not Ending.FAILURE) == (not is_crash(cls)), cls
        assert (cls.value in _NOT_FAILURES) == (cls in NOT_FAILURES), cls
        assert (cls in SCHEDULER_ENDS) == (t.ends is Ending.SCHEDULER), cls
        assert (cls in RESULTS_CHECK_CLASSES) == t.results_check, cls
        assert (cls in SCHEDULER_CLASSES) == (t.slurm_claim is not None) and CLAIM_WORDS.get(cls) == t.slurm_claim
        assert (cls in DIAGNOSABLE) == t.diagnosable, cls
        assert _END_KIND.get(cls.value, "fail") == {Ending.DONE: "ok", Ending.SCHEDULER: "sched",
                                                    Ending.PERSON: "person"}.get(t.ends, "fail"), cls
    assert FC.COMPLETED not in DEFAULT_POLICY
    # The node ledger's defaults: the table's classes by node_kind, then the kinds of record that
    # are not classes (gpu_check, slow_node, loss_anomaly).
    nodes = NodesConfig()
    assert nodes.hardware == (*node_kinds("hardware"), "gpu_check", "slow_node")
    assert nodes.suspect == (*node_kinds("suspect"), "loss_anomaly")
    assert {p.cls for p in DEFAULT_PATTERNS if isinstance(p.cls, FC)} <= set(CLASSES)
    assert classes_where(scheduler_end=True) <= classes_where(answerable=False)


def test_the_table_keeps_what_the_run_did_before_it() -> None:
    from supervisor.config import NodesConfig
    from supervisor.ledger import NOT_FAILURES, RESULTS_CHECK_CLASSES, SCHEDULER_ENDS
    from supervisor.policy import DEFAULT_POLICY
    from supervisor.preemption import _HARDWARE
    from supervisor.states import Action, FailureClass as FC

    assert NOT_FAILURES == {FC.COMPLETED, FC.PREEMPTED, FC.TIME_LIMIT, FC.CANCELLED}
    assert SCHEDULER_ENDS == {FC.PREEMPTED, FC.TIME_LIMIT}
    assert RESULTS_CHECK_CLASSES == {FC.ILLEGAL_MEMORY_ACCESS, FC.CUDA_LAUNCH_FAILURE, FC.DEVICE_ASSERT,
                                     FC.HARDWARE_FAULT}
    assert {FC.HARDWARE_FAULT, FC.SHM_EXHAUSTED, FC.NODE_FAILURE, FC.INTERCONNECT} <= _HARDWARE
    assert {c for c, p in DEFAULT_POLICY.items() if p.action is Action.REQUEUE and p.exclude_node} == _HARDWARE
    assert {c: p.retries for c, p in DEFAULT_POLICY.items() if p.action is Action.STOP} == {
        FC.DEVICE_ASSERT: 0, FC.CUDA_OOM: 0, FC.HOST_OOM: 0, FC.PYTHON_EXCEPTION: 0, FC.CANCELLED: 0}
    nodes = NodesConfig()
    assert nodes.hardware[:3] == ("hardware_fault", "interconnect", "node_failure")
    assert nodes.suspect[:4] == ("illegal_memory_access", "cuda_launch_failure", "nccl_error", "hang")
    # A full /dev/shm: requeued elsewhere, but never held against the node in the shared ledger.
    assert FC.SHM_EXHAUSTED in _HARDWARE and "shm_exhausted" not in nodes.hardware + nodes.suspect


def _policy_doc_rows() -> dict[str, tuple[str, int, bool]]:
    """docs/policy.md's table of per-class defaults: class -> (action, retries, excluding the node)."""
    text = (ROOT / "docs" / "policy.md").read_text()
    table = text.split("The per-class defaults", 1)[1].split("\n\n", 2)[1]
    rows: dict[str, tuple[str, int, bool]] = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        retries = re.match(r"\d+", cells[2])
        assert retries is not None, line
        for name in re.findall(r"`([a-z_]+)`", cells[0]):
            assert name not in rows, f"{name} twice in docs/policy.md"
            rows[name] = (cells[1].split(",")[0].split()[0], int(retries.group()), "excluding the node" in cells[1])
    return rows


def test_the_docs_class_table_says_what_the_table_says() -> None:
    from supervisor.failures.classes import CLASSES
    from supervisor.states import FailureClass as FC

    expected = {c.value: (t.action.value, t.retries, t.exclude_node) for c, t in CLASSES.items()
                if c is not FC.COMPLETED}
    assert _policy_doc_rows() == expected


def test_the_node_ledger_docs_show_the_defaults_the_table_gives() -> None:
    from supervisor.config import NodesConfig

    text = (ROOT / "docs" / "node-health.md").read_text()
    shown = {key: tuple(re.findall(r"[a-z_]+", found)) for key, found in
             re.findall(r"^  (hardware|suspect): \[([^\]]*)\]$", text, flags=re.MULTILINE)}
    nodes = NodesConfig()
    assert shown == {"hardware": nodes.hardware, "suspect": nodes.suspect}


def test_a_classified_failure_carries_no_action_and_judge_decides_it_by_the_policy() -> None:
    from supervisor.config import BudgetConfig
    from supervisor.failures import Failure, classify
    from supervisor.policy import DEFAULT_POLICY, ClassPolicy
    from supervisor.run.judge import AttemptFacts, judge_attempt
    from supervisor.states import Action, FailureClass as FC, RunOutcome

    assert "action" not in {f.name for f in dataclasses.fields(Failure)}
    failure = classify(None, 11, "step 3\nSegmentation fault (core dumped)\n")
    assert failure.cls is FC.NATIVE_CRASH
    default = judge_attempt(failure, AttemptFacts(), [], [], DEFAULT_POLICY, BudgetConfig(), None, 139)
    assert default.outcome is None and default.action is Action.RESTART  # the row's default: restart
    mine = {**DEFAULT_POLICY, FC.NATIVE_CRASH: ClassPolicy(action=Action.STOP, retries=0)}
    stopped = judge_attempt(failure, AttemptFacts(), [], [], mine, BudgetConfig(), None, 139)
    assert stopped.outcome is RunOutcome.STOPPED and stopped.stopped_by == "policy.native_crash.action"
