"""``supervise nodes``: the nodes the ledger holds evidence against (supervisor.addons.nodes)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from ..config import load_config
from ..errors import ExitCode, UsageError
from ..textsafe import printable
from .common import echo_json, handle_errors

EPILOG = """\b
Exit codes:
  0  no suspect node (with --exclude-list or --clear: done)
  1  at least one suspect node (listed with its evidence)
  2  usage or config error, or the ledger cannot be read (one line says why)

\b
The ledger is shared by all your runs: nodes.ledger in the config, or
$SUPERVISE_NODES__LEDGER, else ~/.cache/slurm-supervisor/nodes.jsonl.
In an sbatch wrapper:  sbatch --exclude="$(supervise nodes --exclude-list)" job.sbatch
"""


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


@click.command("nodes", epilog=EPILOG)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON.")
@click.option("--ledger", "ledger_file", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="The ledger file [nodes.ledger, else ~/.cache/slurm-supervisor/nodes.jsonl].")
@click.option("--config", "config_file", type=click.Path(path_type=Path), default=None,
              help="Supervisor config with the nodes: policy [defaults < SUPERVISE_* < this].")
@click.option("--exclude-list", is_flag=True,
              help="Print only the nodes excluded now, comma-separated (for sbatch --exclude).")
@click.option("--clear", "clear_node", metavar="NODE", default=None,
              help="Record that NODE was repaired: its earlier evidence no longer counts.")
@click.option("--reason", default="cleared by a person", show_default=True, help="Why, for --clear.")
@handle_errors
def nodes(as_json: bool, ledger_file: Path | None, config_file: Path | None, exclude_list: bool,
          clear_node: str | None, reason: str) -> None:
    """Nodes with evidence against them in the node health ledger (GPU checks that failed, hardware
    faults, slow nodes, loss anomalies, repeated GPU errors), the evidence, and which of them the
    run loop excludes on a requeue now (nodes.exclude_after hardware records in nodes.window)."""
    from ..addons.nodes import NodeLedger, exclusions, node_ledger_path, record_cleared, suspects

    cfg = load_config(config_file).nodes
    path = ledger_file or node_ledger_path(cfg)
    ledger = NodeLedger(path, cfg.max_bytes)
    now = time.time()
    if clear_node is not None:
        if not clear_node.strip():
            raise UsageError("--clear needs a node name")
        if not ledger.append(record_cleared(clear_node.strip(), reason, ts=now)):
            raise UsageError(f"cannot write the node ledger {path} (see the warning above)")
        click.echo(f"cleared {clear_node.strip()}: earlier evidence in {path} no longer counts")
        return
    try:
        read = ledger.read()
    except OSError as exc:
        raise UsageError(f"cannot read the node ledger {path}: {exc.strerror or exc}") from None
    excluded = exclusions(read.records, now, cfg)
    if exclude_list:
        click.echo(",".join(x.node for x in excluded))
        return
    found = suspects(read.records, now, cfg)
    by_node = {x.node: x for x in excluded}
    if as_json:
        echo_json({
            "ledger": str(path), "records": len(read.records), "bad_lines": read.bad_lines, "now": now,
            "suspects": [{"node": s.node, "reason": s.reason, "hardware_count": s.hardware_count,
                          "excluded_until": by_node[s.node].until if s.node in by_node else None,
                          "evidence": [{"ts": e.ts, "what": e.what, "detail": e.detail, "run_dir": e.run_dir,
                                        "job_id": e.job_id, "hardware": e.hardware} for e in s.evidence]}
                         for s in found],
            "exclusions": [{"node": x.node, "reason": x.reason, "until": x.until} for x in excluded],
        })
    else:
        if not found:
            click.echo(f"no suspect node in {path} ({len(read.records)} records)")
        else:
            click.echo(f"{len(found)} suspect node(s) in {path} ({len(read.records)} records):")
        for s in found:
            state = f"EXCLUDED until {_when(by_node[s.node].until)}" if s.node in by_node else "suspect"
            click.echo(printable(f"{s.node}  {state}: {s.reason}"))
            for e in s.evidence[-8:]:
                where = ", ".join(p for p in (f"job {e.job_id}" if e.job_id else "",
                                              f"run {e.run_dir}" if e.run_dir else "") if p)
                detail = (e.detail or "").splitlines()[0][:160] if e.detail else ""
                click.echo(printable(f"  {_when(e.ts)}  {e.what:<22} {detail}" + (f"  ({where})" if where else "")))
            if len(s.evidence) > 8:
                click.echo(f"  ... and {len(s.evidence) - 8} earlier record(s)")
        if read.bad_lines:
            click.echo(f"({read.bad_lines} unreadable line(s) skipped)", err=True)
    sys.exit(ExitCode.FAILED if found else ExitCode.OK)


def register(group: click.Group) -> None:
    group.add_command(nodes)
