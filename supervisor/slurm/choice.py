"""Which Slurm backend ``auto`` picks, and why: a pure decision over what was found at start.

pyslurm is a binding compiled against one Slurm release; its calls speak that release's RPC
protocol. It is picked only when it imports here and the release it was built for has the
controller's major.minor; everything else uses the CLI, which works with every release
(docs/slurm-versions.md has the pyslurm row per release, docs/benchmarks.md the measured cost of each).
"""

from __future__ import annotations

from dataclasses import dataclass

from .version import SlurmVersion


@dataclass(frozen=True)
class BackendChoice:
    """The backend a run uses (``cli`` / ``pyslurm``) and the reason, as ``run_start`` records it."""

    name: str
    reason: str


def choose_backend(
    prefer: str,
    pyslurm_problem: str | None,
    built_for: SlurmVersion | None,
    controller: SlurmVersion | None,
    controller_problem: str | None = None,
) -> BackendChoice:
    """``prefer``: ``auto`` / ``cli`` / ``pyslurm``. ``pyslurm_problem``: why pyslurm cannot be
    imported (None when it imports). ``built_for``: the Slurm release pyslurm was compiled against;
    ``controller``: the controller's release (None with ``controller_problem`` when it could not
    be asked through pyslurm). A forced ``pyslurm`` is chosen whatever the versions say (the
    caller raises when it does not import)."""
    if prefer == "cli":
        return BackendChoice("cli", "asked for the CLI backend")
    if pyslurm_problem is not None:
        return BackendChoice("cli", f"pyslurm cannot be used here: {pyslurm_problem}")
    if prefer == "pyslurm":
        return BackendChoice("pyslurm", "asked for the pyslurm backend")
    if built_for is None:
        return BackendChoice("cli", "pyslurm imports but does not say which Slurm release it was built for")
    if controller is None:
        return BackendChoice("cli", f"pyslurm (built for Slurm {built_for.release}) could not ask the controller "
                                    f"its version: {controller_problem or 'no answer'}")
    if built_for[:2] != controller[:2]:
        return BackendChoice("cli", f"pyslurm was built for Slurm {built_for.release} but the controller runs "
                                    f"{controller}: only a matching release is used")
    return BackendChoice("pyslurm",
                         f"pyslurm built for Slurm {built_for.release} matches the controller ({controller})")
