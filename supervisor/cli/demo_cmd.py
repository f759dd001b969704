"""``supervise demo``: the embedded local demo (no cluster, tiny CPU training)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from ..errors import UsageError
from .common import handle_errors


@click.command("demo")
@click.option("--run-dir", type=click.Path(path_type=Path), help="Where to put the demo run [./runs/demo-TIME].")
@click.option("--steps", type=click.IntRange(80, 100000), default=100, show_default=True)
@handle_errors
def demo(run_dir: Path | None, steps: int) -> None:
    """Run a tiny CPU training under the supervisor with a real segfault and a preemption, then
    show the report: restart, emergency save, requeue, quarantine of a torn last.ckpt, resume."""
    import importlib.util

    # The demo's training child needs torch; look for it without importing it here (slow, and the
    # supervisor side never imports torch).
    if importlib.util.find_spec("torch") is None:
        raise UsageError("the demo trains with PyTorch: pip install 'slurm-supervisor[torch]'")
    from ..demo.orchestrate import run_demo

    run_dir = (run_dir or Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")).resolve()
    if (run_dir / "supervisor" / "events.jsonl").exists():
        raise UsageError(f"{run_dir} already holds a run; pass a new --run-dir")

    def say(text: str) -> None:
        click.secho(f"==> {text}", fg="cyan", err=True)

    code = run_demo(run_dir, say, steps)
    say("the post-mortem: supervise report " + str(run_dir))
    from . import main

    try:
        main.main(["report", str(run_dir)], standalone_mode=False)
    except SystemExit:
        pass
    sys.exit(code)


def register(group: click.Group) -> None:
    group.add_command(demo)
