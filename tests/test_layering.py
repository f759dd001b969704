"""Import layering, read from the source (AST), so the design the folder layout shows stays true.

* The training side (``client``, ``control_wire`` (the channel's wire format), ``integrations``, ``determinism``,
  ``checkpoints/atomic``, ``sharded``) runs inside the user's training process: it imports only the standard
  library, itself, and (lazily) the framework it serves. Never click, yaml, tenacity, filelock.
* The supervisor's modules form layers: leaves < decisions < adapters < run < cli. A module may
  import its own layer or lower ones, never higher (imports under ``if TYPE_CHECKING:`` excepted).
* No import cycles between modules at import time, nor with every import a type checker follows
  (those under ``if TYPE_CHECKING:`` and lazy ones too), the packages above a module included. A
  module importing from its own package (``from . import notice``) is how packages work in both.
"""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "supervisor"

TRAINING_SIDE = {"supervisor.client", "supervisor.client_metrics", "supervisor.control_wire", "supervisor.determinism", "supervisor.checkpoints.atomic",
                 "supervisor.integrations", "supervisor.integrations.lightning", "supervisor.integrations.hf",
                 "supervisor.sharded", "supervisor.commit_marker", "supervisor.integrations.dcp",
                 "supervisor.integrations.deepspeed"}
FRAMEWORKS = {"torch", "numpy", "lightning", "lightning_fabric", "pytorch_lightning", "transformers", "accelerate"}

LEAVES, DECISIONS, ADAPTERS, RUN, CLI = range(5)
LAYER_NAMES = ["leaves", "decisions", "adapters", "run", "cli"]

# Modules not listed default to ADAPTERS (they do I/O); the lists name the exceptions.
LEAF_MODULES = {
    "supervisor", "supervisor.states", "supervisor.errors", "supervisor.paths", "supervisor.signals",
    "supervisor.events", "supervisor.event_records", "supervisor.progress", "supervisor.fields", "supervisor.control_wire", "supervisor.checkpoints.fsio",
    "supervisor.slurm.version",
    "supervisor.checkpoints.naming", "supervisor.checkpoints.formats.kinds", "supervisor.checkpoints.formats.base",
    "supervisor.checkpoints.formats.registry", "supervisor.checkpoints.outcome",
    "supervisor.checkpoints.limits", "supervisor.checkpoints.allowlist", "supervisor.checkpoints.trust",
    "supervisor.slurm.env",
    "supervisor.slurm.parse", "supervisor.client", "supervisor.client_metrics", "supervisor.determinism", "supervisor.checkpoints.atomic",
    "supervisor.sharded", "supervisor.commit_marker", "supervisor.redact", "supervisor.textsafe",
    "supervisor.private", "supervisor.sinks", "supervisor.failures.classes",
}
DECISION_MODULES = {
    "supervisor.config", "supervisor.config_values",  # the policy and budget tables the decisions are parameterised by
    "supervisor.policy", "supervisor.budget", "supervisor.ledger", "supervisor.preemption", "supervisor.resumability",
    "supervisor.failures", "supervisor.failures.patterns", "supervisor.failures.scan", "supervisor.failures.classifier",
    "supervisor.failures.evidence",
    "supervisor.checkpoints.resume", "supervisor.slurm.requeue_policy", "supervisor.slurm.stop_cause", "supervisor.slurm.grace",
    "supervisor.stall", "supervisor.addons.slownode", "supervisor.run.stop", "supervisor.run.judge", "supervisor.run.layout", "supervisor.addons.report.model",
    "supervisor.addons.report.drift", "supervisor.addons.report.accounting", "supervisor.slurm.sacct",
    "supervisor.addons.metrics.model", "supervisor.addons.metrics.render",
}


# Add-ons that implement the run's hook points (supervisor/run/hooks.py): they sit at the run's layer.
RUN_ADD_ONS = {"supervisor.addons.node_health", "supervisor.addons.gpu_preflight", "supervisor.addons.provenance"}


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(name: str) -> int:
    if name in ("supervisor.cli", "supervisor.__main__") or name.startswith("supervisor.cli."):
        return CLI
    if name.startswith("supervisor.run") or name in RUN_ADD_ONS:
        return RUN if name not in DECISION_MODULES else DECISIONS
    if name in LEAF_MODULES or name.startswith("supervisor.integrations"):
        return LEAVES
    if name in DECISION_MODULES:
        return DECISIONS
    return ADAPTERS


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


@functools.lru_cache(maxsize=None)  # each file parsed once per session (the tests below share it)
def imports_of(path: Path, *, top_level_only: bool = False, type_checking: bool = False) -> frozenset[str]:
    """Absolute module names this file imports (relative imports resolved); ``type_checking``: those
    under ``if TYPE_CHECKING:`` too."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text())
    found: set[str] = set()

    def visit(node: ast.AST, nested: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child) and not type_checking:
                continue
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if top_level_only and inner:
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[: len(base) - (child.level - 1)]
                    mod = ".".join(base + ([child.module] if child.module else []))
                else:
                    mod = child.module or ""
                found.add(mod)
                for alias in child.names:  # "from . import client" names a module
                    candidate = f"{mod}.{alias.name}"
                    if _exists(candidate):
                        found.add(candidate)
            visit(child, inner)

    visit(tree, False)
    return frozenset(found)


def _exists(module: str) -> bool:
    rel = Path(*module.split("."))
    return (PKG.parent / rel).with_suffix(".py").exists() or (PKG.parent / rel / "__init__.py").exists()


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in PKG.rglob("*.py") if "sbatch_templates" not in p.parts}


def test_training_side_imports_only_the_stdlib_and_its_framework() -> None:
    bad = []
    for name, path in all_modules().items():
        if name not in TRAINING_SIDE:
            continue
        for imp in imports_of(path):
            top = imp.split(".")[0]
            if top == "supervisor":
                if imp not in TRAINING_SIDE and imp != "supervisor":
                    bad.append(f"{name} imports {imp}")
            elif top not in sys.stdlib_module_names and top not in FRAMEWORKS and top != "__future__":
                bad.append(f"{name} imports {imp} (not stdlib)")
    assert not bad, "training-side modules must stay stdlib-only:\n" + "\n".join(bad)


def test_layers_import_only_downwards() -> None:
    bad = []
    for name, path in all_modules().items():
        mine = layer_of(name)
        for imp in imports_of(path):
            if not imp.startswith("supervisor") or not _exists(imp):
                continue
            theirs = layer_of(imp)
            if theirs > mine and imp != "supervisor":
                bad.append(f"{name} ({LAYER_NAMES[mine]}) imports {imp} ({LAYER_NAMES[theirs]})")
    assert not bad, "imports that go up a layer:\n" + "\n".join(sorted(bad))


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    # A package's __init__ importing its own submodules is how packages work, not a cycle.
    for name in graph:
        graph[name] = {i for i in graph[name] if not name.startswith(i + ".")}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}

    def dfs(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt] if nxt in stack else [node, nxt])
            elif nxt not in state:
                dfs(nxt, stack + [nxt])
        state[node] = 2

    for start in sorted(graph):
        if start not in state:
            dfs(start, [start])
    return cycles


def test_no_import_cycles_at_import_time() -> None:
    graph = {name: {i for i in imports_of(path, top_level_only=True) if i.startswith("supervisor") and _exists(i)
                    and i != name}
             for name, path in all_modules().items()}
    cycles = _cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def _with_packages(module: str) -> set[str]:
    """``module`` and the packages above it (importing a.b.c runs a/__init__ and a/b/__init__)."""
    parts = module.split(".")
    return {".".join(parts[:k]) for k in range(2, len(parts) + 1)}


def test_no_import_cycles_for_the_type_checker() -> None:
    # Every import counts here: those under TYPE_CHECKING, lazy ones, and the packages above the
    # module imported (importing a.b.c runs a/b/__init__). The classifier (supervisor/failures/
    # classifier.py) once imported policy, which imported failures under TYPE_CHECKING: no cycle at
    # import time, one for mypy. (mypy also counts a module importing its own package: run/monitor's
    # ``from . import notice`` closes run/__init__ -> run.loop -> run.monitor -> run; not read here.)
    graph = {name: {p for i in imports_of(path, type_checking=True) if i.startswith("supervisor") and _exists(i)
                    for p in _with_packages(i) if p != name}
             for name, path in all_modules().items()}
    cycles = _cycles(graph)
    assert not cycles, "import cycles (type-check imports included):\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_type_checker_graph_reads_type_checking_imports() -> None:
    policy = all_modules()["supervisor.policy"]  # it names Failure under TYPE_CHECKING only
    assert "supervisor.failures" in imports_of(policy, type_checking=True)
    assert "supervisor.failures" not in imports_of(policy)


# ------------------------------------------------------------------------------ core and add-ons
# The core: the run loop, the decisions, checkpoints, the Slurm facade and the leaves. The add-ons
# (docs/architecture.md, "Core and add-ons") are features the core must run without: the report,
# diagnose, the GPU check, the node ledger and slow-node finder, submit and its templates, notify,
# metrics, the manifest, the demo and the training-side integrations. The CLI and the training side
# are neither. The core reaches an add-on only through a hook (supervisor/run/hooks.py) or a sink
# (supervisor/sinks.py) that the composition root (supervisor/cli/run_cmd.py) wires.
ADD_ONS = ("supervisor.addons", "supervisor.integrations", "supervisor.demo")  # the add-ons' packages

# Where the core still reaches an add-on, each to be inverted with a hook (supervisor/run/hooks.py)
# or a sink (supervisor/sinks.py): the add-on implements it, the composition root (cli/run_cmd.py)
# wires it, the core calls what it was given. Empty: the list may only shrink, and a new edge fails.
KNOWN_CORE_TO_ADD_ON: dict[tuple[str, str], str] = {}


def is_add_on(name: str) -> bool:
    return any(name == a or name.startswith(a + ".") for a in ADD_ONS)


def is_core(name: str) -> bool:
    return not (is_add_on(name) or name in TRAINING_SIDE or name == "supervisor.__main__"
                or name == "supervisor.cli" or name.startswith("supervisor.cli."))


def core_to_add_on_edges() -> set[tuple[str, str]]:
    """(core module, add-on it imports), lazy (function-level) imports included."""
    return {(name, imp) for name, path in all_modules().items() if is_core(name)
            for imp in imports_of(path) if imp.startswith("supervisor") and _exists(imp) and is_add_on(imp)}


def test_the_core_never_imports_an_add_on_lazy_imports_included() -> None:
    edges = core_to_add_on_edges()
    new = sorted(f"{a} imports {b}" for a, b in edges - KNOWN_CORE_TO_ADD_ON.keys())
    gone = sorted(f"{a} -> {b}" for a, b in KNOWN_CORE_TO_ADD_ON.keys() - edges)
    assert not new, "the core imports an add-on (invert it with a hook or a sink):\n" + "\n".join(new)
    assert not gone, "inverted: remove from KNOWN_CORE_TO_ADD_ON:\n" + "\n".join(gone)


def test_lazy_imports_are_read() -> None:
    # A function-level import is an import: supervisor/cli/run_cmd.py reaches notify and the add-ons
    # only inside its functions, and those edges must be seen (a core module doing the same would fail).
    run_cmd = all_modules()["supervisor.cli.run_cmd"]
    for add_on in ("supervisor.addons.notify", "supervisor.addons.node_health", "supervisor.addons.gpu_preflight"):
        assert add_on in imports_of(run_cmd) and add_on not in imports_of(run_cmd, top_level_only=True)
        assert is_add_on(add_on)
    assert all(is_core(m) for m in ("supervisor.run.loop", "supervisor.run.stop", "supervisor.checkpoints.resume",
                                    "supervisor.slurm.requeue_policy", "supervisor.stall"))


def test_no_module_over_800_lines() -> None:
    # One job per module: a file past 800 lines has grown a second one (docs/architecture.md).
    long = sorted(f"{path.relative_to(PKG.parent)}: {n} lines" for path in PKG.rglob("*.py")
                  if (n := len(path.read_text(encoding="utf-8").splitlines())) > 800)
    assert not long, "split these by job:\n" + "\n".join(long)
