"""The ``supervise`` command line. Commands stay thin: parse, call library code, render, map errors."""

from __future__ import annotations

import importlib

import click

from .. import __version__
from .common import OneErrorStyleGroup

# One module per command family; each defines ``register(group)``.
_COMMAND_MODULES = (
    "run_cmd",  # supervise run
    "config_cmd",  # supervise config show
    "checkpoint_cmds",  # supervise verify, supervise resume-point
    "failure_cmds",  # supervise classify, supervise audit
    "report_cmds",  # supervise report, supervise status
    "submit_cmd",  # supervise submit
    "gpu_cmd",  # supervise check-gpu
    "diagnose_cmd",  # supervise diagnose
    "nodes_cmd",  # supervise nodes
    "init_cmd",  # supervise init
    "demo_cmd",  # supervise demo
)

EXIT_CODES_HELP = """\b
Exit codes:
  0   success (training complete / all checks passed)
  1   a check failed (e.g. verify found a corrupt checkpoint)
  2   usage or config error; nothing was started
  3   another live supervisor holds the run directory
  4   stopped by policy (budget exhausted, crash loop, resume audit)
  5   submit: --time over the QOS's MaxWall; nothing was submitted
  75  not finished: handed back to Slurm / the resubmission loop
  130 supervise run: interrupted by a person (Ctrl-C, scancel)
  The child's own exit status is never passed through: it is in the last line
  and in the run_end event. User errors are one line: "supervise: error: ...".
"""


@click.group(cls=OneErrorStyleGroup, context_settings={"help_option_names": ["-h", "--help"]}, epilog=EXIT_CODES_HELP)
@click.version_option(__version__, prog_name="supervise")
@click.option("-v", "--verbose", count=True, help="More log detail on stderr (-vv for debug).")
@click.pass_context
def main(ctx: click.Context, verbose: int) -> None:
    """Supervise a PyTorch training on Slurm: restart after native crashes, resume from the newest
    valid checkpoint, arbitrate checkpoint saves against the preemption grace deadline, requeue,
    and keep a record for the post-mortem."""
    from .common import setup_logging

    setup_logging(verbose)
    ctx.ensure_object(dict)


for _name in _COMMAND_MODULES:
    try:
        _module = importlib.import_module(f"{__name__}.{_name}")
    except ModuleNotFoundError as _exc:  # a command family not built yet
        if _exc.name != f"{__name__}.{_name}":
            raise
        continue
    _module.register(main)
