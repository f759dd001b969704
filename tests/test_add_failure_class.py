"""Adding a failure class touches only the files docs/extending/failure-class.md names.

An enum cannot grow at run time, so the test does what a person would: it copies the package, adds
``nvlink_error`` to the files the doc names (a ``FailureClass`` member, one table row, one pattern,
one line of the docs' class table) and no other, and runs the real path in a fresh interpreter on
the copy: classified from a log line, judged with its default policy and with a user's override,
recorded in the run's ledger as a crash, counted by the node ledger's defaults and the requeue as
the node's fault. The checks of tests/test_failure_classes.py that a row changes (the derived
views, the docs' tables) run against the copy as well."""

from __future__ import annotations

import filecmp
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "extending" / "failure-class.md"

# The recipe, as text edits: file -> (a line already there, the same line with the class added).
_ROW = ('    FC.NVLINK_ERROR: ClassTraits(Q, 2, exclude_node=True, hardware_requeue=True, node_kind="hardware",\n'
        '                                 summary="NVLink errors between the GPUs of a node"),\n')
_PATTERN = '    _p(FC.NVLINK_ERROR, r"NVLink error(?: detected)?: link \\d+", CAUSE, "an NVLink error", ("nvlink",)),\n'
_NODES = "  hardware: [hardware_fault, interconnect, node_failure, gpu_check, slow_node]\n"
EDITS = {
    "supervisor/states.py": ('    UNKNOWN = "unknown"\n', '    UNKNOWN = "unknown"\n    NVLINK_ERROR = "nvlink_error"\n'),
    "supervisor/failures/classes.py": ('    FC.UNKNOWN: ClassTraits(R, 1, summary="nothing recognised"),\n',
                                       '    FC.UNKNOWN: ClassTraits(R, 1, summary="nothing recognised"),\n' + _ROW),
    "supervisor/failures/patterns.py": ("DEFAULT_PATTERNS: tuple[FailurePattern, ...] = (\n",
                                        "DEFAULT_PATTERNS: tuple[FailurePattern, ...] = (\n" + _PATTERN),
    "docs/policy.md": ("| `killed`, `unknown` | restart | 1 |\n",
                       "| `killed`, `unknown` | restart | 1 |\n| `nvlink_error` | requeue, excluding the node | 2 |\n"),
    # node_kind="hardware": the node ledger's default list that the docs show names it too.
    "docs/node-health.md": (_NODES, _NODES.replace("node_failure, ", "node_failure, nvlink_error, ")),
}

SCRIPT = r'''
import importlib.util, sys
from supervisor.states import Action, FailureClass as FC, RunOutcome
NEW = FC("nvlink_error")

# Classified from the output: what happened, with its evidence and where.
from supervisor.failures import classify
log = ("step 41\nstep 42\n[rank3]: NVLink error detected: link 2 of GPU 3 is down\n"
       "srun: error: n7: task 3: Exited with exit code 1\n")
failure = classify(1, None, log)
assert failure.cls is NEW, failure.reason
assert failure.step == 42 and failure.node == "n7" and "NVLink error" in failure.evidence[0], failure

# Recorded in the run's ledger as the loop writes it: a crash the budgets count.
from supervisor.events import Ev, Event
from supervisor.ledger import is_crash, ledger_from_events
events = [Event(Ev.ATTEMPT_START.value, 1.0, {"attempt": 1, "job_id": "900"}),
          Event(Ev.ATTEMPT_END.value, 9.0, {"attempt": 1, "class": "nvlink_error", "last_step": 42})]
records = ledger_from_events(events)
assert records[-1].cls is NEW and is_crash(NEW)

# Judged once, with its row's default policy: requeue, away from the node.
from supervisor.config import BudgetConfig, load_config
from supervisor.policy import DEFAULT_POLICY
from supervisor.run.judge import AttemptFacts, judge_attempt
verdict = judge_attempt(failure, AttemptFacts(), records[:-1], records, DEFAULT_POLICY, BudgetConfig(), "900", 1)
assert verdict.outcome is RunOutcome.REQUEUE and verdict.action is Action.REQUEUE, verdict.reason
assert verdict.decision.exclude_nodes == ("n7",) and "nvlink_error" in verdict.reason, verdict.decision
# ... and with a user's policy for it, which the config accepts by the class's name.
cfg = load_config(environ={}, sets=("policy.nvlink_error.action=stop",))
stopped = judge_attempt(failure, AttemptFacts(), records[:-1], records, cfg.policy, cfg.budget, "900", 1)
assert stopped.outcome is RunOutcome.STOPPED and stopped.stopped_by == "policy.nvlink_error.action", stopped

# The node's fault: the requeue says so, and the shared node ledger's defaults exclude the node.
from supervisor.config import NodesConfig
from supervisor.addons.nodes import exclusions, record_failure
from supervisor.preemption import decide_requeue
requeue = decide_requeue(child_outcome=NEW, in_slurm=True, job_requeueable=True, slurm_version="23.02",
                         notice=None, already_requeued=False, policy="auto", requeue_on_time_limit=False,
                         exclude_nodes=("n7",))
assert requeue.do and requeue.reason.startswith("nvlink_error on n7"), requeue.reason
nodes = NodesConfig()
assert "nvlink_error" in nodes.hardware
out = exclusions([record_failure("n7", "nvlink_error", ts=t) for t in (100.0, 200.0)], 300.0, nodes)
assert [e.node for e in out] == ["n7"], out

# The table's checks that a row changes hold with the new row: the derived views and both docs tables.
spec = importlib.util.spec_from_file_location("classes_checks", "tests/test_failure_classes.py")
checks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(checks)
for name in ("test_every_class_has_one_row_with_a_summary", "test_the_derived_views_agree_with_the_table",
             "test_the_docs_class_table_says_what_the_table_says",
             "test_the_node_ledger_docs_show_the_defaults_the_table_gives"):
    getattr(checks, name)()
print("ok")
'''


def _files_the_doc_names() -> set[str]:
    text = DOC.read_text()
    section = text.split("## Files to touch", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^- `([^`]+)`", section, flags=re.MULTILINE))


def _changed(a: Path, b: Path, rel: str = "") -> set[str]:
    cmp = filecmp.dircmp(a, b, ignore=["__pycache__"])
    out = {f"{rel}{n}" for n in cmp.left_only + cmp.right_only + cmp.diff_files}
    for sub in cmp.common_dirs:
        out |= _changed(a / sub, b / sub, f"{rel}{sub}/")
    return out


def test_a_new_class_needs_only_the_files_the_doc_names(tmp_path: Path) -> None:
    assert _files_the_doc_names() == set(EDITS)
    shutil.copytree(ROOT / "supervisor", tmp_path / "supervisor")  # with its bytecode: a faster start
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    (tmp_path / "tests").mkdir()
    shutil.copy2(ROOT / "tests" / "test_failure_classes.py", tmp_path / "tests" / "test_failure_classes.py")
    for rel, (before, after) in EDITS.items():
        path = tmp_path / rel
        text = path.read_text()
        assert text.count(before) == 1, f"{rel}: the recipe's anchor moved: {before!r}"
        path.write_text(text.replace(before, after))

    changed = {f"{top}/{rel}" for top in ("supervisor", "docs") for rel in _changed(ROOT / top, tmp_path / top)}
    assert changed == set(EDITS)

    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.strip() == "ok"
