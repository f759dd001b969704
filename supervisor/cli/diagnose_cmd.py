"""``supervise diagnose RUN_DIR``: rerun a GPU failure where it can be located (supervisor.addons.diagnose)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..errors import UsageError
from ..redact import redact_text
from ..textsafe import printable
from .common import echo_json, handle_errors

EPILOG = """\b
Exit codes:
  0  the failure was reproduced and located (a kernel or a Python line named)
  1  not located: not reproduced within the bounds, failed differently, or
     nothing could be read from the output (the diagnosis is recorded anyway)
  2  usage: not a run directory, no GPU failure in its log (pass --attempt),
     a bad option; nothing was run

\b
The rerun never writes into the run's checkpoint directory: it resumes from a
checkpoint there (read only) and saves into DIR/checkpoints of its scratch
directory (default RUN_DIR/supervisor/diagnose-<attempt>-<time>). It is bounded
by --max-seconds and by a step count past the failure step.
"""


@click.command("diagnose", epilog=EPILOG)
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--attempt", type=click.IntRange(min=1), default=None,
              help="Rerun this attempt's failure [the first illegal memory access, device-side assert or "
                   "launch failure].")
@click.option("--max-seconds", type=click.FloatRange(min=1), default=900.0, show_default=True,
              help="Stop the rerun after this long (the sanitizer slows a training 10-100x).")
@click.option("--max-steps", type=click.IntRange(min=1), default=None,
              help="Stop the rerun this many steps past its checkpoint [to the failure step and as many again, "
                   "at least 20 more].")
@click.option("--scratch", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Scratch run directory for the rerun [RUN_DIR/supervisor/diagnose-<attempt>-<time>].")
@click.option("--sanitizer", default="auto", show_default=True, metavar="auto|off|PATH",
              help="compute-sanitizer to run the training under (memcheck): auto = from PATH when installed.")
@click.option("--cwd", "cwd", type=click.Path(path_type=Path, file_okay=False, exists=True), default=None,
              help="Directory to run the command in [the one the run recorded, else the current one].")
@click.option("--env", "env_items", multiple=True, metavar="NAME=VALUE",
              help="Set a variable in the rerun (repeatable) [the rerun runs in the environment the failed attempt "
                   "recorded; a credential the record holds redacted is taken from this shell].")
@click.option("--no-record", is_flag=True, help="Do not append the diagnosis event to the run's event log.")
@click.option("--dry-run", is_flag=True, help="Print what would be run, and run nothing.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON.")
@handle_errors
def diagnose_cmd(run_dir: Path, attempt: int | None, max_seconds: float, max_steps: int | None,
                 scratch: Path | None, sanitizer: str, cwd: Path | None, env_items: tuple[str, ...], no_record: bool,
                 dry_run: bool, as_json: bool) -> None:
    """After an illegal memory access or a device-side assert: rerun the training from the
    checkpoint saved before the failure with CUDA_LAUNCH_BLOCKING=1 (and under compute-sanitizer's
    memcheck when it is installed), bounded in steps and time, and name the kernel and the Python
    line that failed. The result is appended to the run's event log as a `diagnosis` event."""
    from ..addons.diagnose import diagnose, render

    overrides: dict[str, str] = {}
    for given in env_items:
        name, eq, value = given.partition("=")
        if not eq or not name or not name.replace("_", "a").isalnum() or name[0].isdigit():
            raise UsageError(f"--env {given!r}: expected NAME=VALUE with a variable name, e.g. --env TRIGGER=1")
        overrides[name] = value
    plan, diag = diagnose(run_dir, attempt=attempt, max_seconds=max_seconds, max_steps=max_steps, scratch=scratch,
                          sanitizer=sanitizer, cwd=str(cwd) if cwd else None, record=not no_record,
                          dry_run=dry_run, env_overrides=overrides)
    if diag is None:
        summary: dict[str, object] = {
            "attempt": plan.failure.attempt, "class": plan.failure.cls, "failure_step": plan.failure.step,
                   "checkpoint": plan.checkpoint, "checkpoint_step": plan.checkpoint_step,
                   "checkpoint_reason": plan.checkpoint_reason, "argv": list(plan.argv), "cwd": plan.cwd,
                   "scratch": plan.scratch, "stop_at_step": plan.stop_at_step, "max_seconds": plan.max_seconds,
                   "tools": list(plan.tools), "redirected": list(plan.redirected),
                   "environment": plan.environment.source if plan.environment else None,
                   "environment_from_shell": list(plan.environment.from_shell) if plan.environment else [],
                   "environment_unset": list(plan.environment.unset) if plan.environment else []}
        if as_json:
            echo_json(summary)
        else:
            for key, shown in summary.items():
                click.echo(printable(redact_text(f"{key}: {shown}")))
        return
    if as_json:
        echo_json(diag.to_dict())
    else:
        click.echo(render(diag))
    sys.exit(diag.exit_code_for_cli)


def register(group: click.Group) -> None:
    group.add_command(diagnose_cmd)
