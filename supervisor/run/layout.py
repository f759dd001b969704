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

import shlex
from dataclasses import dataclass
from pathlib import Path, PurePath
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
    """What one attempt's child is started with. ``resume_note``: how the resume point was handed
    over (or why a template could not be filled), for the event log."""

    argv: tuple[str, ...]
    env: dict[str, str]
    shield_signals: tuple[int, ...]
    resume_note: str | None = None


def resume_values(resume_path: str, resume_step: int | None) -> dict[str, str | None]:
    """What the placeholders stand for: ``{path}`` the resume point (a file, or a directory for a
    sharded or HF-style checkpoint), ``{dir}`` the directory that holds it, ``{step}`` its step
    (None when unknown)."""
    return {"{path}": resume_path, "{dir}": str(PurePath(resume_path).parent),
            "{step}": None if resume_step is None else str(resume_step)}


def fill_template(template: str, values: Mapping[str, str | None]) -> str | None:
    """``template`` with its placeholders replaced; None when one it names has no value. The
    values are inserted as they are: never split, never unquoted."""
    out = template
    for key, value in values.items():
        if key in out:
            if value is None:
                return None
            out = out.replace(key, value)
    return out


def resume_args(template: str, resume_path: str, resume_step: int | None) -> tuple[list[str], str | None]:
    """``resume_arg`` as argv elements: the template is split like a shell would (``shlex``: quotes
    group, ``+trainer.ckpt_path={path}`` is one element), *then* each element is filled in, so a
    path with spaces, ``=`` or quotes stays exactly one element. A template with no placeholder is a
    fixed flag (``--init_from=resume``, ``trainer.resume=true``) given only when resuming. Returns
    the elements and, when a placeholder has no value (``{step}`` of a checkpoint whose step is
    unknown), nothing and the reason."""
    values = resume_values(resume_path, resume_step)
    out: list[str] = []
    for part in shlex.split(template):
        filled = fill_template(part, values)
        if filled is None:
            return [], (f"resume_arg {template!r} not given: the step of {resume_path} is unknown "
                        "(set checkpoint.step_from, or use {path})")
        out.append(filled)
    return out, None


def resume_environment(items: Sequence[str], resume_path: str,
                       resume_step: int | None) -> tuple[dict[str, str], list[str]]:
    """``resume_env`` (``NAME=TEMPLATE`` items) filled in; items whose placeholder has no value are
    left out and named in the second part."""
    values = resume_values(resume_path, resume_step)
    env: dict[str, str] = {}
    skipped: list[str] = []
    for item in items:
        name, _, template = item.partition("=")
        filled = fill_template(template, values)
        if filled is None:
            skipped.append(name)
        else:
            env[name] = filled
    return env, skipped


def child_plan(cfg: SupervisorConfig, argv: Sequence[str], environ: Mapping[str, str], layout: RunLayout, *,
               attempt: int, resume_path: str | None, resume_step: int | None, control_address: str,
               control_key: str) -> ChildPlan:
    """argv with ``resume_arg`` appended and ``resume_env`` set when resuming (there is a resume
    point); the environment with the ``SUPERVISOR_*`` variables; the notice signals to start ignored."""
    args = list(argv)
    notes: list[str] = []
    resume_env: dict[str, str] = {}
    if resume_path:
        if cfg.resume_arg:
            extra, problem = resume_args(cfg.resume_arg, resume_path, resume_step)
            args += extra
            notes.append(problem or f"resume_arg appended: {shlex.join(extra)}")
        if cfg.resume_env:
            resume_env, skipped = resume_environment(cfg.resume_env, resume_path, resume_step)
            if resume_env:
                notes.append("resume_env set: " + ", ".join(sorted(resume_env)))
            if skipped:
                notes.append(f"resume_env {', '.join(skipped)} not set: the step of {resume_path} is unknown")
    env = dict(environ)
    env.update(resume_env)
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
    return ChildPlan(tuple(args), env, shield, "; ".join(notes) or None)
