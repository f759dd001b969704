"""``supervise report RUN_DIR`` (the post-mortem) and ``supervise status RUN_DIR`` (the live view)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..config import load_config
from ..errors import ExitCode, SupervisorError, UsageError
from ..private import GROUP_READ, write_atomic
from ..redact import redact_text
from .common import echo_json, handle_errors

if TYPE_CHECKING:  # the report package is imported when a report command runs, not at CLI start
    from ..addons.report.status import StatusView


@click.command("report")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON.")
@click.option("--markdown", "as_markdown", is_flag=True, help="Markdown, for pasting into an issue.")
@click.option("--plot", "plot_file", type=click.Path(path_type=Path, dir_okay=False),
              help="Also draw step over wall-clock time to FILE.png (needs matplotlib).")
@click.option("--html", "html_file", type=click.Path(path_type=Path, dir_okay=False),
              help="Also write the report as one self-contained page to FILE.html (no script, nothing loaded "
                   "from the network: open it offline or attach it to an issue).")
@click.option("--no-checkpoints", is_flag=True, help="Skip the checkpoint health scan.")
@click.option("--no-accounting", is_flag=True,
              help="Do not ask Slurm's accounting (sacct) for the jobs' history; the report then reads RUN_DIR only.")
@click.option("--config", "config_file", type=click.Path(path_type=Path),
              help="Judge the step budget by this config instead of the one recorded in the run.")
@handle_errors
def report(run_dir: Path, as_json: bool, as_markdown: bool, plot_file: Path | None, html_file: Path | None,
           no_checkpoints: bool, no_accounting: bool, config_file: Path | None) -> None:
    """Post-mortem of a run: attempts and their first failures, steps lost, the step-budget verdict,
    checkpoint health, quarantined files, and drift between attempts (other code, torch, GPU...).

    Reads RUN_DIR (works after the job is gone) and, where sacct answers, Slurm's own history of the
    run's jobs (every requeue and resubmission) to set beside the attempts; --no-accounting skips it.
    Exits 1 when the report lists problems (budget exceeded, drift, corrupt checkpoints, resume audit
    failed, run stopped), else 0; the accounting history never changes the exit code.
    """
    from ..addons.report import build_report, resolve_run_dir
    from ..addons.report.load import skipped_accounting
    from ..addons.report.render import render_markdown, render_text
    from ..addons.report.textfit import columns

    if as_json and as_markdown:
        raise UsageError("choose one of --json and --markdown")
    if plot_file is not None and not plot_file.parent.is_dir():
        raise UsageError(f"--plot {plot_file}: directory {plot_file.parent} does not exist")
    if html_file is not None and not html_file.parent.is_dir():
        raise UsageError(f"--html {html_file}: directory {html_file.parent} does not exist")
    config = load_config(config_file) if config_file is not None else None
    rep = build_report(run_dir, config=config, check_checkpoints=not no_checkpoints, accounting=not no_accounting)
    if no_accounting:
        rep = skipped_accounting(rep, resolve_run_dir(run_dir))
    if html_file is not None:
        from ..addons.report.html import render_html

        _write_atomically(html_file, render_html(rep))
    plot_counts = None
    plot_error = None
    if plot_file is not None:
        from ..addons.report.plot import PlotUnavailable, plot_report

        try:
            plot_counts = plot_report(rep, plot_file)
        except PlotUnavailable as exc:
            plot_error = exc
    if as_json:
        data = rep.to_json()
        if plot_counts is not None:
            data["plot"] = {"path": str(plot_file), "markers": plot_counts}
        if html_file is not None:
            data["html"] = {"path": str(html_file)}
        echo_json(data)
    elif as_markdown:
        click.echo(render_markdown(rep), nl=False)
    else:
        click.echo(render_text(rep, columns()), nl=False)
    if plot_error is not None:
        click.echo(f"supervise: error: {plot_error}", err=True)
        sys.exit(ExitCode.USAGE)
    if plot_counts is not None and not as_json:
        click.echo(f"plot written to {plot_file}", err=True)
    if html_file is not None and not as_json:
        click.echo(f"html report written to {html_file}", err=True)
    sys.exit(ExitCode.FAILED if rep.run.problems else ExitCode.OK)


def _write_atomically(path: Path, text: str) -> None:
    """Write next to ``path`` and rename, so a reader never opens half a page."""
    try:
        write_atomic(path, redact_text(text).encode("utf-8"), GROUP_READ, durable=False)
    except OSError as exc:
        raise UsageError(f"cannot write {path} ({exc.strerror})") from None


WATCH_HELP = """\b
With --watch the view is redrawn every --interval seconds until Ctrl-C
(or SIGTERM), which quits cleanly with exit 0: Ctrl-C is how a watch ends,
not an error. On a terminal it is redrawn in place; to a file or a pipe
each refresh is one line. A run that has ended is still watched (the view
says so), since a requeued or restarted run writes on. With --json, --watch
prints one JSON object per refresh (JSON Lines). The text fits COLUMNS
(else the terminal, else 100 columns).
"""


@click.command("status", epilog=WATCH_HELP)
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON.")
@click.option("--watch", is_flag=True, help="Keep the view up to date until Ctrl-C (exit 0).")
@click.option("--interval", type=click.FloatRange(min=0.05), default=2.0, show_default=True,
              help="Seconds between refreshes with --watch.")
@handle_errors
def status(run_dir: Path, as_json: bool, watch: bool, interval: float) -> None:
    """One screen on a running or finished run: alive?, current attempt, step, loss, rate and ETA,
    last checkpoint, what a preemption now would cost, time left to the grace deadline during a stop
    notice, restarts, steps lost so far, last failure."""
    from ..addons.report import resolve_run_dir
    from ..addons.report.render import render_status
    from ..addons.report.textfit import columns

    paths = resolve_run_dir(run_dir)
    if not watch:
        view = _status_view(paths.run_dir)
        if as_json:
            echo_json(view.to_json())
        else:
            click.echo(render_status(view, columns()), nl=False)
        return
    # Ctrl-C ends the watch even when the shell that started it ignored SIGINT (a background job);
    # SIGTERM (`timeout`, a closing tmux pane) ends it the same way.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        _watch(paths.run_dir, interval, as_json)
    except KeyboardInterrupt:
        if not as_json:
            click.echo("")
        sys.exit(ExitCode.OK)
    except BrokenPipeError:  # `supervise status --watch | head`: the reader left, which is fine
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(ExitCode.OK)


def _status_view(run_dir: Path) -> StatusView:
    from ..addons.report import build_report, check_alive, resolve_run_dir, summarize_status
    from ..addons.report.load import safe_text, safe_value

    paths = resolve_run_dir(run_dir)
    rep = build_report(paths.run_dir, check_checkpoints=False)
    live = check_alive(paths)
    return summarize_status(rep, live.alive, safe_text(live.reason), safe_value(live.owner), now=time.time())


# A TTY frame overwrites the last one in place: cursor home, each line cleared to its end, the rest
# of the screen cleared below the frame. Never the whole screen: that blanks it between frames (flicker).
CURSOR_HOME = "\x1b[H"
CLEAR_TO_EOL = "\x1b[K"
CLEAR_BELOW = "\x1b[J"


def tty_frame(text: str) -> str:
    """``text`` drawn over the previous frame without blanking the screen first."""
    return CURSOR_HOME + "".join(line + CLEAR_TO_EOL + "\n" for line in text.splitlines()) + CLEAR_BELOW


def _watch(run_dir: Path, interval: float, as_json: bool) -> None:
    """Redraw until interrupted: in place on a terminal, one line per refresh to a file or pipe.
    A refresh that cannot read the run (moved, being rewritten) shows why and tries again at the
    next tick; only Ctrl-C ends the watch."""
    from ..addons.report.render import render_status, status_line
    from ..addons.report.textfit import columns

    tty = sys.stdout.isatty()
    while True:
        stamp = time.strftime("%H:%M:%S")
        try:
            view: StatusView | None = _status_view(run_dir)
            problem = None
        except SupervisorError as exc:
            view, problem = None, str(exc)
        if as_json:
            data = view.to_json() if view is not None else {"error": problem}
            click.echo(json.dumps({"refreshed": time.time(), **data}, default=str))
        elif not tty:
            when = time.strftime("%Y-%m-%d %H:%M:%S")
            click.echo(status_line(view, when) if view is not None else f"{when} cannot read the run: {problem}")
        else:
            head = f"supervise status --watch: refreshed {stamp}, every {interval:g}s; Ctrl-C quits"
            if view is not None and view.state == "requeued":
                head += "\nhanded back to Slurm: the view goes on when the job starts again"
            elif view is not None and view.state != "running" and view.outcome is not None:
                head += f"\nrun ended ({view.outcome}): nothing changes unless the run is started again"
            width = columns()
            body = render_status(view, width) if view is not None else f"cannot read the run: {problem}\n"
            click.echo(tty_frame(head + "\n\n" + body), nl=False)
        sys.stdout.flush()
        time.sleep(interval)


def register(group: click.Group) -> None:
    group.add_command(report)
    group.add_command(status)
