"""``supervise init [OPTIONS] -- CMD...``: write a ready sbatch script from a template."""

from __future__ import annotations

import os
from pathlib import Path

import click

from ..errors import UsageError
from .common import handle_errors

SCRIPT_MODE = 0o644  # an sbatch script like one written by hand (the umask may narrow it)


@click.command("init", context_settings={"allow_interspersed_args": False})
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.option("--template", "-t", metavar="NAME", help="Template to start from (--list shows them) [preemptible].")
@click.option("--list", "list_only", is_flag=True, help="List the templates, one line each, and exit.")
@click.option("-o", "--output", "out", type=click.Path(path_type=Path, dir_okay=False),
              help="Write the script to FILE instead of stdout.")
@click.option("--force", is_flag=True, help="Overwrite FILE when it exists.")
@click.option("--job-name", help="#SBATCH --job-name [train].")
@click.option("--nodes", type=click.IntRange(min=1), help="#SBATCH --nodes (multi-node templates).")
@click.option("--gpus", metavar="G", help="GPUs per node: 4 or h100:4 (#SBATCH --gpus-per-node).")
@click.option("--partition", metavar="P", help="#SBATCH --partition (one name or a comma-separated list).")
@click.option("--qos", metavar="Q", help="#SBATCH --qos.")
@click.option("--time", "time_limit", metavar="T", help="#SBATCH --time: 90, 4:00:00 or 2-00:00:00.")
@click.option("--run-dir", help="The supervisor's run directory [runs/JOB_NAME, relative to where sbatch runs].")
@click.option("--supervise", "supervise_bin", metavar="PATH", help="The supervise executable the job runs [supervise].")
@click.option("--var", "var_pairs", multiple=True, metavar="NAME=VALUE",
              help="Any other template value (repeatable): cpus_per_task=8, extra_sbatch=--account=proj, "
                   "warn_seconds=300, ... (sbatch_templates/README.md lists them).")
@handle_errors
def init(command: tuple[str, ...], template: str | None, list_only: bool, out: Path | None, force: bool,
         job_name: str | None, nodes: int | None, gpus: str | None, partition: str | None, qos: str | None,
         time_limit: str | None, run_dir: str | None, supervise_bin: str | None, var_pairs: tuple[str, ...]) -> None:
    """Write a ready sbatch script that runs CMD under the supervisor.

    \b
    Examples:
      supervise init --list
      supervise init --partition extra --gpus 4 --time 2-00:00:00 -o job.sbatch -- python train.py
      supervise init -t multi_node --nodes 4 --gpus 8 --var ntasks_per_node=8 -- python train.py
    Then: sbatch job.sbatch
    """
    from ..addons import sbatch_init

    if list_only:
        for line in sbatch_init.listing():
            click.echo(line)
        return
    flags = {"job_name": job_name, "nodes": nodes, "gpus_per_node": gpus, "partition": partition, "qos": qos,
             "time": time_limit, "run_dir": run_dir, "supervise": supervise_bin, "command": list(command)}
    script = sbatch_init.build(template, flags, var_pairs)
    if out is None:
        click.echo(script.text, nl=False)
        return
    _write(out, script.text, force)
    click.echo(f"supervise init: wrote {out} ({script.reason}); submit it with: sbatch {out}", err=True)


def _write(path: Path, text: str, force: bool) -> None:
    """Create ``path``; an existing file is replaced only with ``force`` (never silently)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
    try:
        fd = os.open(path, flags, SCRIPT_MODE)
    except FileExistsError:
        raise UsageError(f"{path} exists; pass --force to overwrite it, or pick another -o FILE") from None
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def register(group: click.Group) -> None:
    group.add_command(init)
