"""``supervise submit SCRIPT.sbatch [OPTIONS] [-- SBATCH_ARGS...]``: the resubmission loop."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..config import load_config
from ..errors import QosLimitError, SlurmError, UsageError
from .common import echo_json, handle_errors


@click.command("submit")
@click.argument("script", type=click.Path(path_type=Path, dir_okay=False))
@click.argument("sbatch_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--max-submissions", type=click.IntRange(min=1), default=10, show_default=True,
              help="Jobs to submit at most, the first one included.")
@click.option("--run-dir", type=click.Path(path_type=Path, file_okay=False),
              help="The run directory the script's `supervise run` uses [parsed from the script's --run-dir].")
@click.option("--poll", type=click.FloatRange(min=0.1), default=15.0, show_default=True,
              help="Seconds between job queries.")
@click.option("--config", "config_file", type=click.Path(path_type=Path),
              help="YAML config whose budget limits apply across jobs [$SUPERVISE_CONFIG].")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override a config key, e.g. budget.max_total_restarts=20.")
@click.option("--json", "as_json", is_flag=True, help="Print a final JSON object on stdout.")
@handle_errors
def submit(script: Path, sbatch_args: tuple[str, ...], max_submissions: int, run_dir: Path | None,
           poll: float, config_file: Path | None, sets: tuple[str, ...], as_json: bool) -> None:
    """Submit SCRIPT with sbatch, follow the job, and submit it again after a preemption or a time
    limit ended the allocation without finishing the training (for clusters that cancel preempted
    jobs instead of requeueing them). A job that Slurm requeues is followed, not resubmitted; a job
    is never cancelled: Ctrl-C stops following and leaves it in the queue.

    \b
    Stops when the run's event log says complete (exit 0), when the supervisor or a budget stopped
    the run (exit 4), or after --max-submissions jobs or a job that failed without a recorded end
    (exit 1). Every submission is appended to RUN_DIR/supervisor/submissions.jsonl.

    \b
    A QOS limit (MaxSubmitJobsPerUser, MaxJobsPerUser) that refuses or holds a submission is waited
    out, and said so; a --time over the QOS's MaxWall is refused before any submission (exit 5).

    \b
    Example:
      supervise submit train.sbatch --max-submissions 20 -- --partition=extra
    """
    from ..addons.resubmit import SubmitLoop, job_workdir, run_dir_from_script
    from ..slurm import get_backend

    try:
        text = script.read_text(errors="replace")
    except OSError as exc:
        raise UsageError(f"cannot read the batch script {script}: {exc.strerror or exc}") from None
    workdir = job_workdir(text, sbatch_args, Path.cwd())
    if run_dir is None:
        run_dir = run_dir_from_script(text, workdir)
    elif not run_dir.is_absolute():
        run_dir = Path.cwd() / run_dir
    cfg = load_config(config_file, sets=sets)
    backend = get_backend()
    check_qos_wall_time(text, sbatch_args, backend)
    loop = SubmitLoop(script.resolve(), sbatch_args, run_dir, backend, cfg.budget,
                      max_submissions=max_submissions, poll=poll, nodes=cfg.nodes)
    result = loop.run()
    if result.outcome in ("interrupted", "slurm_error") or result.exit_code != 0:
        click.echo(f"supervise submit: {result.outcome}: {result.reason}", err=True)
    if as_json:
        echo_json(result.to_json())
    sys.exit(result.exit_code)


def check_qos_wall_time(text: str, sbatch_args: tuple[str, ...], backend: object) -> None:
    """Refuse, before the first submission, a --time that the job's QOS's MaxWall never allows
    (docs/qos.md). Only a QOS named on the command line or in the script is checked; when
    accounting cannot be asked, Slurm judges the job at submission as before."""
    from ..slurm.qos_limits import check_wall_time, job_option

    qos = job_option(text, sbatch_args, "-q", "--qos")
    wall = job_option(text, sbatch_args, "-t", "--time")
    probe = getattr(backend, "qos_max_wall", None) or getattr(getattr(backend, "_cli", None), "qos_max_wall", None)
    if not qos or not wall or not callable(probe):
        return
    try:
        max_wall = probe(qos)
    except SlurmError as exc:
        click.echo(f"supervise submit: cannot read MaxWall of QOS {qos} ({exc}); Slurm will judge --time={wall}",
                   err=True)
        return
    verdict = check_wall_time(wall, qos, max_wall)
    if not verdict.ok:
        raise QosLimitError(verdict.reason)


def register(group: click.Group) -> None:
    group.add_command(submit)
