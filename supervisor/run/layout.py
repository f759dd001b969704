"""Where a run lives and what its child is given: pure functions of the config, argv and environment.

The child gets the control channel's address and key, the resume point, and the run's
directories in ``SUPERVISOR_*`` variables (docs/architecture.md lists them). Its notice signals
(SIGTERM, SIGUSR1 by default) start *ignored*: under ``srun`` Slurm signals every process of the
step at once, and an unchanged script would die mid-save at the first SIGTERM whatever the
supervisor decided. An ignored disposition survives ``exec`` and Python keeps it, so the
supervisor, not Slurm's first signal, decides when the child ends. A script that installs its own
handler (the client's ``install()``, Lightning's SLURM plugin, torchrun's agent) replaces the
ignore and gets the signal exactly as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from ..config import SupervisorConfig
from ..paths import RunPaths
from ..signals import signal_number


@dataclass(frozen=True)
class RunLayout:
    name: str
    paths: RunPaths
    ckpt_dir: Path


def default_run_name(argv: Sequence[str], environ: Mapping[str, str]) -> str:
    """A stable name for the run directory: the training script's stem, else the command's name."""
    for i, arg in enumerate(argv):
        if arg.endswith(".py"):
            return Path(arg).stem
        if arg == "-m" and i + 1 < len(argv):
            return argv[i + 1].rsplit(".", 1)[-1]
    return environ.get("SLURM_JOB_NAME") or (Path(argv[0]).name if argv else "run")


def layout_for(cfg: SupervisorConfig, argv: Sequence[str], environ: Mapping[str, str], cwd: Path) -> RunLayout:
    """The run directory (``--run-dir``, else ``./runs/<name>``) and the checkpoint directory
    (``--checkpoint-dir``, else ``<run>/checkpoints``); relative paths are taken from ``cwd``."""
    name = cfg.name or default_run_name(argv, environ)
    run_dir = Path(cfg.run_dir) if cfg.run_dir else cwd / "runs" / name
    if not run_dir.is_absolute():
        run_dir = cwd / run_dir
    paths = RunPaths(run_dir)
    ckpt = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else paths.default_checkpoint_dir
    return RunLayout(name, paths, ckpt if ckpt.is_absolute() else cwd / ckpt)


@dataclass(frozen=True)
class ChildPlan:
    """What one attempt's child is started with."""

    argv: tuple[str, ...]
    env: dict[str, str]
    shield_signals: tuple[int, ...]


def child_plan(cfg: SupervisorConfig, argv: Sequence[str], environ: Mapping[str, str], layout: RunLayout, *,
               attempt: int, resume_path: str | None, resume_step: int | None, control_address: str,
               control_key: str) -> ChildPlan:
    """argv with ``resume_arg`` appended when resuming; the environment with the ``SUPERVISOR_*``
    variables; the notice signals to start ignored."""
    args = list(argv)
    if cfg.resume_arg and resume_path:
        args += [part.replace("{path}", resume_path).replace("{step}", "" if resume_step is None else str(resume_step))
                 for part in cfg.resume_arg.split()]
    env = dict(environ)
    env.update({
        "SUPERVISOR_CONTROL": control_address,
        "SUPERVISOR_KEY": control_key,  # authenticates datagrams; never sent on the wire
        "SUPERVISOR_RUN_DIR": str(layout.paths.run_dir),
        "SUPERVISOR_ATTEMPT": str(attempt),
        "SUPERVISOR_RESUME_FROM": resume_path or "",
        "SUPERVISOR_RESUME_STEP": "" if resume_step is None else str(resume_step),
        "SUPERVISOR_CHECKPOINT_DIR": str(layout.ckpt_dir),
        "SUPERVISOR_NOTICE_SIGNALS": ",".join(cfg.preemption.signals),
        "PYTHONUNBUFFERED": env.get("PYTHONUNBUFFERED", "1"),
    })
    shield = tuple(sorted({signal_number(s) for s in cfg.preemption.signals})) if cfg.preemption.shield_child else ()
    return ChildPlan(tuple(args), env, shield)
