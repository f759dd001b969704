"""``supervise check-gpu``: the GPU health preflight, by hand (the run loop uses ``preflight: [gpu]``)."""

from __future__ import annotations

import sys

import click

from ..health import DEFAULT_TIMEOUT, GpuReport, GpuVerdict, run_check
from .common import echo_json, handle_errors

EPILOG = """\b
Exit codes:
  0  healthy: every check gave bitwise identical results on every GPU
  1  unhealthy: a result differed, a CUDA error, uncorrectable ECC errors, or the check hung
  2  cannot check: no torch, no CUDA device, GPU memory taken by another process
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
            lines.append(f"  {check.name:<20} {check.runs:>4} runs  {took:>8}  {state}")
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
@handle_errors
def check_gpu(as_json: bool, timeout: float, python: str | None, indices: tuple[int, ...]) -> None:
    """Check that every visible GPU computes repeatably: the same deterministic conv2d and matmuls
    are run many times in a subprocess and compared bit for bit with the first result; nvidia-smi's
    uncorrectable ECC count is read too. The supervisor itself never loads CUDA."""
    probe_args: list[str] = []
    for index in indices:
        probe_args += ["--index", str(index)]
    verdict = run_check(timeout, python=python, probe_args=probe_args)
    if as_json:
        echo_json(verdict.to_dict())
    else:
        click.echo(render(verdict))
    sys.exit(verdict.exit_code)


def register(group: click.Group) -> None:
    group.add_command(check_gpu)
