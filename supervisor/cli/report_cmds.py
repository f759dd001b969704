"""``supervise report RUN_DIR`` (the post-mortem) and ``supervise status RUN_DIR`` (the live view)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from ..config import load_config
from ..errors import ExitCode, UsageError
from .common import echo_json, handle_errors


@click.command("report")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON.")
@click.option("--markdown", "as_markdown", is_flag=True, help="Markdown, for pasting into an issue.")
@click.option("--plot", "plot_file", type=click.Path(path_type=Path, dir_okay=False),
              help="Also draw step over wall-clock time to FILE.png (needs matplotlib).")
@click.option("--no-checkpoints", is_flag=True, help="Skip the checkpoint health scan.")
@click.option("--config", "config_file", type=click.Path(path_type=Path),
              help="Judge the step budget by this config instead of the one recorded in the run.")
@handle_errors
def report(run_dir: Path, as_json: bool, as_markdown: bool, plot_file: Path | None, no_checkpoints: bool,
           config_file: Path | None) -> None:
    """Post-mortem of a run: attempts and their first failures, steps lost, the step-budget verdict,
    checkpoint health, quarantined files, and drift between attempts (other code, torch, GPU...).

    Reads only RUN_DIR (works after the job is gone). Exits 1 when the report lists problems
    (budget exceeded, drift, corrupt checkpoints, resume audit failed, run stopped), else 0.
    """
    from ..report import build_report
    from ..report.render import render_markdown, render_text

    if as_json and as_markdown:
        raise UsageError("choose one of --json and --markdown")
    if plot_file is not None and not plot_file.parent.is_dir():
        raise UsageError(f"--plot {plot_file}: directory {plot_file.parent} does not exist")
    config = load_config(config_file) if config_file is not None else None
    rep = build_report(run_dir, config=config, check_checkpoints=not no_checkpoints)
    plot_counts = None
    plot_error = None
    if plot_file is not None:
        from ..report.plot import PlotUnavailable, plot_report

        try:
            plot_counts = plot_report(rep, plot_file)
        except PlotUnavailable as exc:
            plot_error = exc
    if as_json:
        data = rep.to_json()
        if plot_counts is not None:
            data["plot"] = {"path": str(plot_file), "markers": plot_counts}
        echo_json(data)
    elif as_markdown:
        click.echo(render_markdown(rep), nl=False)
    else:
        click.echo(render_text(rep), nl=False)
    if plot_error is not None:
        click.echo(f"supervise: error: {plot_error}", err=True)
        sys.exit(ExitCode.USAGE)
    if plot_counts is not None and not as_json:
        click.echo(f"plot written to {plot_file}", err=True)
    sys.exit(ExitCode.FAILED if rep.run.problems else ExitCode.OK)


@click.command("status")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON.")
@handle_errors
def status(run_dir: Path, as_json: bool) -> None:
    """One screen on a running or finished run: alive?, current attempt, step and rate, last
    checkpoint, restarts, steps lost so far, last failure."""
    from ..report import build_report, check_alive, resolve_run_dir, summarize_status
    from ..report.render import render_status

    paths = resolve_run_dir(run_dir)
    rep = build_report(paths.run_dir, check_checkpoints=False)
    live = check_alive(paths)
    view = summarize_status(rep, live.alive, live.reason, live.owner, now=time.time())
    if as_json:
        echo_json(view.to_json())
    else:
        click.echo(render_status(view), nl=False)


def register(group: click.Group) -> None:
    group.add_command(report)
    group.add_command(status)
