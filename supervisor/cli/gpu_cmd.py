"""``supervise check-gpu``: the GPU health preflight, by hand (the run loop uses ``preflight: [gpu]``)."""

from __future__ import annotations

import os
import socket
import sys
import time

import click

from ..errors import UsageError
from ..addons.health import (
    DEFAULT_FAULT_RATE,
    DEFAULT_REPEATS,
    DEFAULT_TIMEOUT,
    GpuReport,
    GpuVerdict,
    probe_args_for,
    repeats_for_power,
    run_check,
)
from .common import echo_json, handle_errors

EPILOG = """\b
Exit codes:
  0  healthy: every check gave bitwise identical results on every GPU
  1  unhealthy: a result differed, a CUDA error, uncorrectable ECC errors, or the check hung
  2  cannot check: no torch, no CUDA device, GPU memory taken by another process;
     or a bad option (one line names it)

\b
Detection power: a GPU that gets a fraction p of calls wrong passes n repeats
with probability (1-p)^n. The output states 1-(1-p)^n for --fault-rate p and
how many repeats 99 % needs; --power Q picks the repeats for you.
"""


def _gpu_line(gpu: GpuReport) -> str:
    facts = [f"GPU {gpu.index}", gpu.name or "?"]
    if gpu.driver:
        facts.append(f"driver {gpu.driver}")
    if gpu.clock_sm_mhz is not None:
        top = f"/{gpu.clock_max_sm_mhz}" if gpu.clock_max_sm_mhz is not None else ""
        facts.append(f"SM {gpu.clock_sm_mhz}{top} MHz")
    if gpu.clock_mem_mhz is not None:
        facts.append(f"mem {gpu.clock_mem_mhz} MHz")
    if gpu.temperature_c is not None:
        facts.append(f"{gpu.temperature_c} C")
    if gpu.ecc_uncorrected is not None:
        facts.append(f"ECC uncorrected {gpu.ecc_uncorrected}")
    return "  ".join(facts)


def render(verdict: GpuVerdict) -> str:
    lines = []
    for gpu in verdict.gpus:
        lines.append(_gpu_line(gpu))
        for check in gpu.checks:
            if check.error:
                state = f"ERROR {check.error.splitlines()[0][:160]}"
            elif check.ok:
                state = "ok"
            else:
                state = f"MISMATCH in {check.mismatches} runs, max |diff| {check.max_abs_diff:.3g}"
            took = f"{check.seconds:.2f} s" if check.seconds is not None else ""
            lines.append(f"  {check.name:<24} {check.runs:>4} runs  {took:>8}  {state}")
    if verdict.power is not None:
        lines.append(f"power: {verdict.power.text}")
    word = "healthy" if verdict.ok else ("UNHEALTHY" if verdict.checkable else "cannot check")
    lines.append(f"{word}: {verdict.reason}")
    return "\n".join(lines)


@click.command("check-gpu", epilog=EPILOG)
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON.")
@click.option("--timeout", type=click.FloatRange(min=1), default=DEFAULT_TIMEOUT, show_default=True,
              help="Seconds before the check counts as hung and is killed.")
@click.option("--python", "python", metavar="PATH",
              help="Python interpreter that has torch [the one running supervise].")
@click.option("--gpu", "indices", type=click.IntRange(min=0), multiple=True,
              help="Check only this CUDA device index (repeatable) [all visible].")
@click.option("--repeats", type=click.IntRange(min=2), default=None,
              help=f"Runs of each check, each compared bit for bit with the first [{DEFAULT_REPEATS}].")
@click.option("--fault-rate", type=click.FloatRange(min=0, max=1, min_open=True, max_open=True),
              default=DEFAULT_FAULT_RATE, show_default=True,
              help="The per-call fault rate the detection power is stated for.")
@click.option("--power", "target_power", type=click.FloatRange(min=0, max=1, min_open=True, max_open=True),
              default=None, help="Run as many repeats as detecting --fault-rate with this probability needs "
                                 "(e.g. 0.99); instead of --repeats.")
@click.option("--record", is_flag=True,
              help="Add the verdict to the node health ledger (supervise nodes) under this node's name.")
@handle_errors
def check_gpu(as_json: bool, timeout: float, python: str | None, indices: tuple[int, ...], repeats: int | None,
              fault_rate: float, target_power: float | None, record: bool) -> None:
    """Check that every visible GPU computes repeatably: the same deterministic conv2d (including a
    large image with 1 and 4 output channels) and matmuls are run many times in a subprocess and
    compared bit for bit with the first result; nvidia-smi's uncorrectable ECC count is read too.
    The output states the chance that the check would catch an intermittent fault. The supervisor
    itself never loads CUDA."""
    if repeats is not None and target_power is not None:
        raise UsageError("give --repeats or --power, not both (--power picks the repeats)")
    if target_power is not None:
        repeats = repeats_for_power(fault_rate, target_power)
    verdict = run_check(timeout, python=python, probe_args=probe_args_for(repeats or DEFAULT_REPEATS, indices),
                        fault_rate=fault_rate)
    if record:
        _record(verdict)
    if as_json:
        echo_json(verdict.to_dict())
    else:
        click.echo(render(verdict))
    sys.exit(verdict.exit_code)


def _record(verdict: GpuVerdict) -> None:
    """A verdict that judged the GPU goes into the node ledger; 'cannot check' says nothing about it."""
    from ..config import load_config
    from ..addons.nodes import NodeLedger, node_ledger_path, record_gpu_check

    if not verdict.checkable:
        click.echo("supervise: not recorded in the node ledger: the GPU could not be checked", err=True)
        return
    cfg = load_config().nodes
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    path = node_ledger_path(cfg)
    entry = record_gpu_check(node, verdict.ok, verdict.reason, ts=time.time(), job_id=os.environ.get("SLURM_JOB_ID"))
    if not NodeLedger(path, cfg.max_bytes).append(entry):
        click.echo(f"supervise: warning: could not record the verdict in {path}", err=True)


def register(group: click.Group) -> None:
    group.add_command(check_gpu)
