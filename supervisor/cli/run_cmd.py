"""``supervise run [OPTIONS] -- CMD [ARGS...]``: the sbatch entrypoint."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..config import load_config
from ..errors import UsageError
from .checkpoint_cmds import parse_safe_globals, safe_global_option
from .common import handle_errors

if TYPE_CHECKING:
    from ..run.hooks import AddOn


@click.command("run", context_settings={"ignore_unknown_options": False})
@click.option("--config", "config_file", type=click.Path(path_type=Path), help="YAML config file.")
@click.option("--run-dir", help="Run directory shared by every attempt and requeue [./runs/NAME].")
@click.option("--name", help="Run name [the training script's name].")
@click.option("--checkpoint-dir", help="Checkpoint directory to validate and resume from [RUN_DIR/checkpoints].")
@click.option("--resume-arg", help="Appended to the command when resuming: '--ckpt_path {path}', "
              "'+trainer.ckpt_path={path}', or a fixed flag such as '--init_from=resume' ({path}, {dir}, {step}; "
              "split like a shell command; docs/resume.md).")
@click.option("--resume-env", "resume_env", multiple=True, metavar="NAME=VALUE",
              help="Set in the child's environment when resuming, e.g. RESUME_FROM={path} (repeatable).")
@click.option("--step-regex", help="Regex with one group capturing the step in the child's output.")
@click.option("--stall-timeout", type=float, help="Seconds without progress before the child is killed as hung.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Override any config key (dotted).")
@click.option("--quiet", is_flag=True, help="Do not copy the child's output to the console.")
@safe_global_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@handle_errors
def run(config_file: Path | None, run_dir: str | None, name: str | None, checkpoint_dir: str | None,
        resume_arg: str | None, resume_env: tuple[str, ...], step_regex: str | None,
        stall_timeout: float | None, sets: tuple[str, ...], quiet: bool, safe_globals: tuple[str, ...],
        command: tuple[str, ...]) -> None:
    """Run CMD as a supervised child: restart it after native crashes, resume it from the newest
    valid checkpoint, handle preemption notices, and record everything in RUN_DIR/supervisor/.

    \b
    Example:
      srun supervise run --run-dir $SCRATCH/runs/exp1 -- python train.py --lr 3e-4

    \b
    Exit codes (supervise's own, never the child's: its status is named beside,
    "the child exited N", and in run_end's child_exit_code):
      0 training complete; 2 usage or config error, nothing started; 3 another
      supervisor holds RUN_DIR; 4 stopped by policy (budget, crash loop, resume
      audit, a class whose policy is stop); 75 handed back to Slurm (requeue);
      130 interrupted by a person.
    """
    if not command:
        raise UsageError("missing the training command after '--' (e.g. supervise run -- python train.py)")
    cfg = load_config(config_file, sets=sets, cli={
        "run_dir": run_dir, "name": name, "checkpoint_dir": checkpoint_dir,
        "resume_arg": resume_arg, "resume_env": list(resume_env) or None, "step_regex": step_regex,
        "stall_timeout": stall_timeout,
    })
    extra = parse_safe_globals(safe_globals)
    if extra:  # added to checkpoint.safe_globals from the config file, not instead of them
        merged = tuple(dict.fromkeys((*cfg.checkpoint.safe_globals, *extra)))
        cfg = replace(cfg, checkpoint=replace(cfg.checkpoint, safe_globals=merged))
    from ..addons.metrics.sink import metrics_sink
    from ..addons.notify import sink_for
    from ..run.loop import Runner

    # The composition root: the run loop imports no add-on and no sink; they are given to it here.
    runner = Runner(cfg, list(command), echo=not quiet, sinks=[sink_for(cfg.notify)], add_ons=standard_add_ons())
    sink = metrics_sink(cfg.metrics, runner.paths.run_dir, runner.ctx.layout.name, runner.ctx.host)
    if sink is not None:
        # fed by RunContext.emit (supervisor/sinks.py), seeded with the run's history when the loop reads it
        runner.ctx.sinks.append(sink)
    result = runner.run()
    sys.exit(result.exit_code)


def standard_add_ons() -> list[AddOn]:
    """The add-ons of a full ``supervise run``, reached through the hooks of supervisor/run/hooks.py:
    the manifest (first: teardown lets its probes land before the others), the GPU preflight
    (recording its verdicts in the node ledger) and the node-health ledger with the slow-node finder."""
    from ..addons.gpu_preflight import GpuPreflight
    from ..addons.node_health import NodeHealth
    from ..addons.provenance import ManifestWriter

    nodes = NodeHealth()
    return [ManifestWriter(), GpuPreflight(record=nodes.note), nodes]


def register(group: click.Group) -> None:
    group.add_command(run)
