"""The Slurm facade: what the job's environment says, what the controller says, and requeue.

    from supervisor.slurm import SlurmEnv, get_backend, needs_explicit_requeue
    env = SlurmEnv.from_environ(os.environ)
    slurm = get_backend()                 # pyslurm where it imports and matches the controller, else the CLI
    slurm.choice                          # BackendChoice(name, reason): what run_start records
    info = slurm.job_info(env.job_id)     # JobInfo | None; info.grace_deadline during grace
    version = slurm.version()             # SlurmVersion: .requeues_on_exit_during_grace, ...
    verdict = stop_cause(info, time.time(), "TERM", version=version, expected_restarts=env.restart_count)
    verdict.cause                         # StopCause.PREEMPTED / TIME_LIMIT / CANCELLED_BY_PERSON / ...
    slurm.requeue(env.job_id, expected_restarts=env.restart_count, exclude=[env.nodename])
    slurm.release(env.job_id)             # a job held after MaxBatchRequeue (info.held_for_max_requeue)

Backends raise :class:`supervisor.errors.SlurmError` (``argv``, ``returncode``, ``stderr``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from ..errors import SlurmError
from .backend import RequeueResult, SlurmBackend
from .cli_backend import SlurmCli
from .env import SlurmEnv
from .parse import (
    JobInfo,
    expand_hostlist,
    parse_sbatch_job_id,
    parse_scontrol_job,
    parse_version,
)
from .choice import BackendChoice, choose_backend
from .pyslurm_backend import PyslurmBackend, built_for, load_pyslurm, load_pyslurm_explained
from .requeue_policy import RequeueNeed, needs_explicit_requeue, requeue_need
from .stop_cause import StopCause, StopVerdict, stop_cause
from .version import SlurmVersion, SlurmVersionError

BACKEND_CHOICES = ("auto", "cli", "pyslurm")

__all__ = [
    "BACKEND_CHOICES",
    "BackendChoice",
    "JobInfo",
    "PyslurmBackend",
    "RequeueNeed",
    "RequeueResult",
    "SlurmBackend",
    "SlurmCli",
    "SlurmEnv",
    "SlurmVersion",
    "SlurmVersionError",
    "StopCause",
    "StopVerdict",
    "choose_backend",
    "expand_hostlist",
    "get_backend",
    "load_pyslurm",
    "needs_explicit_requeue",
    "parse_sbatch_job_id",
    "parse_scontrol_job",
    "parse_version",
    "requeue_need",
    "stop_cause",
]


def get_backend(
    prefer: str = "auto",
    env: Mapping[str, str] | None = None,
    importer: Callable[[str], ModuleType] = importlib.import_module,
    **cli_options: Any,
) -> SlurmBackend:
    """The Slurm backend to use: ``auto`` = pyslurm when it imports here **and** was built for the
    controller's major.minor (asked over pyslurm itself), else the CLI; ``cli`` / ``pyslurm`` force
    one (``pyslurm`` raises when it does not import). The backend's ``choice`` attribute holds the
    :class:`BackendChoice` (name and reason). ``env`` and ``cli_options`` (timeout, attempts,
    backoff) configure the CLI backend, which the pyslurm backend also uses for sbatch and the
    configuration reads."""
    if prefer not in BACKEND_CHOICES:
        choices = ", ".join(BACKEND_CHOICES)
        raise SlurmError(["get_backend", prefer], f"unknown Slurm backend {prefer!r}; use one of {choices}")
    cli = SlurmCli(env=env, **cli_options)
    if prefer == "cli":
        return _with_choice(cli, choose_backend(prefer, None, None, None))
    module, problem = load_pyslurm_explained(importer)
    if module is None:
        if prefer == "pyslurm":
            raise SlurmError(
                ["import", "pyslurm"],
                f"pyslurm is not importable here ({problem}; it must be built for this Slurm release, "
                "PyPI has 25.11 only); use the CLI backend",
            )
        return _with_choice(cli, choose_backend(prefer, problem, None, None))
    backend = PyslurmBackend(module, cli)
    controller, controller_problem = None, None
    if prefer == "auto":
        try:
            controller = backend.version()
        except SlurmError as err:
            controller_problem = str(err)
    choice = choose_backend(prefer, None, built_for(module), controller, controller_problem)
    return _with_choice(backend if choice.name == "pyslurm" else cli, choice)


def _with_choice(backend: Any, choice: BackendChoice) -> Any:
    backend.choice = choice
    return backend
