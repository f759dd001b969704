"""What ``supervise init`` writes: command-line flags in, a ready sbatch script (text) out. Pure.

The CLI (supervisor/cli/init_cmd.py) only parses and writes; this module decides which template,
which values, and how a wrong flag is named. The rendering and its safety rules (quoting, checked
``#SBATCH`` values) are supervisor/addons/templates.py's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from . import templates
from ..errors import UsageError

DEFAULT_TEMPLATE = "preemptible"

# One line per template for ``supervise init --list``. A template without a line here is still
# listed (with its file's second line), so a new template is never unreachable.
SUMMARIES: dict[str, str] = {
    "single_node": "one node; the supervisor in a job step (plain, no requeue or warning set up)",
    "preemptible": "one node on a preemptible partition/QOS: --requeue, appended log, time-limit warning",
    "time_limit": "one node, longer than the time limit: warning -> save -> requeue -> resume (needs --time)",
    "multi_node": "N nodes, ONE supervisor; the ranks are an srun step it restarts together",
    "multi_node_per_node": "N nodes, one supervisor per node (for elastic launchers such as torchrun)",
}

# The placeholder each named flag fills, and how an error names it.
FLAG_OF: dict[str, str] = {
    "job_name": "--job-name",
    "partition": "--partition",
    "qos": "--qos",
    "nodes": "--nodes",
    "gpus_per_node": "--gpus",
    "time": "--time",
    "run_dir": "--run-dir",
    "supervise": "--supervise",
    "command": "the training command (after --)",
}


@dataclass(frozen=True)
class InitScript:
    """The script ``supervise init`` writes, and why it looks as it does."""

    template: str
    text: str
    reason: str


def summary(name: str) -> str:
    """The one-line description of template ``name``."""
    if name in SUMMARIES:
        return SUMMARIES[name]
    lines = templates.template_text(name).splitlines()
    return lines[1].lstrip("# ").strip() if len(lines) > 1 else ""


def listing() -> list[str]:
    """``supervise init --list``: one line per template, the default marked."""
    names = templates.available()
    width = max(len(n) for n in names) if names else 0
    return [f"{n:<{width}}  {summary(n)}{'  [default]' if n == DEFAULT_TEMPLATE else ''}" for n in names]


def parse_vars(pairs: Sequence[str]) -> dict[str, Any]:
    """``--var NAME=VALUE`` pairs; ``extra_sbatch`` may repeat (one ``#SBATCH`` line each)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        name = name.strip()
        if not sep or not name:
            raise UsageError(f"--var {pair!r}: expected NAME=VALUE, e.g. --var cpus_per_task=8")
        if name not in templates.PLACEHOLDERS or name == "command":
            known = ", ".join(n for n in templates.PLACEHOLDERS if n != "command")
            raise UsageError(f"--var {name}: not a template value; known: {known}")
        if name == "extra_sbatch":
            out.setdefault(name, []).append(value)
        elif name in out:
            raise UsageError(f"--var {name} given twice; give it once")
        else:
            out[name] = value
    return out


def build(template: str | None, flags: Mapping[str, Any], var_pairs: Sequence[str] = ()) -> InitScript:
    """The script for ``template`` (default :data:`DEFAULT_TEMPLATE`) with the flags given (``None``
    = not given: the template's default) and ``--var`` pairs. Raises :class:`UsageError` naming the
    flag as the user wrote it."""
    name = template or DEFAULT_TEMPLATE
    names = templates.available()
    if name.removesuffix(".sbatch") not in names:
        raise UsageError(f"--template {name!r}: no such template; available: {', '.join(names)} "
                         "(supervise init --list)")
    name = name.removesuffix(".sbatch")
    takes = templates.placeholders_in(templates.template_text(name))
    values = {k: v for k, v in flags.items() if v is not None and not (k == "command" and not v)}
    if not values.get("command"):
        raise UsageError("no training command: put it after --, e.g. supervise init -o job.sbatch -- "
                         "python train.py --lr 3e-4")
    for key, value in parse_vars(var_pairs).items():
        if key in values:
            raise UsageError(f"--var {key} and {FLAG_OF.get(key, key)} both given; give one")
        values[key] = value
    for key in values:
        if key not in takes:
            raise UsageError(_not_taken(name, key))
    values.setdefault("run_dir", f"runs/{values.get('job_name') or templates.PLACEHOLDERS['job_name'].default}")
    try:
        text = templates.render(name, **values)
    except templates.TemplateValueError as exc:
        flag = FLAG_OF.get(exc.name, "--var " + exc.name)
        got = "missing" if templates.is_empty(exc.value) else f"got {exc.value!r}"
        raise UsageError(f"{flag}: {got}; {exc.allowed}") from None
    chosen = "given" if template else "the default"
    return InitScript(name, text, f"template {name} ({chosen}): {summary(name)}")


def _not_taken(template: str, key: str) -> str:
    """Why a value cannot go into ``template``, and which templates take it."""
    flag = FLAG_OF.get(key, f"--var {key}")
    others = [n for n in templates.available() if key in templates.placeholders_in(templates.template_text(n))]
    where = f"; it goes into: {', '.join(others)} (--template NAME)" if others else ""
    if key == "nodes":
        where = "; for several nodes use --template multi_node or multi_node_per_node"
    return f"{flag}: the {template} template has no place for it{where}"
