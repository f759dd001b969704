"""``supervise verify`` and ``supervise resume-point``: the checkpoint ladder from the shell.

Exit codes: 0 all checkpoints valid / a resume point exists; 1 a checkpoint is not valid / no
resume point (including a directory without checkpoints); 2 usage errors (a path that does not
exist or cannot be read, a resume-point argument that is not a directory).
"""

from __future__ import annotations

import os
import re
import stat
import sys
from typing import Any

import click

from ..errors import ExitCode, UsageError
from ..textsafe import printable
from .common import echo_json, handle_errors


def _require_readable(path: str, *, want_dir: bool = False) -> None:
    if not os.path.lexists(path):
        raise UsageError(f"{path}: no such file or directory")
    if os.path.islink(path) and not os.path.exists(path):
        return  # a dangling link is a finding (corrupt), not a usage error
    if want_dir and not os.path.isdir(path):
        raise UsageError(f"{path}: not a directory (give the directory that holds the checkpoints)")
    if os.path.isdir(path):
        if not os.access(path, os.R_OK | os.X_OK):
            raise UsageError(f"{path}: directory not readable (permission denied)")
        return
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            return  # a FIFO, socket or device: never opened; the validator reports it
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        os.close(fd)
    except PermissionError:
        raise UsageError(f"{path}: not readable (permission denied)") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot open ({exc.strerror or exc})") from None


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_safe_globals(values: tuple[str, ...]) -> tuple[str, ...]:
    """Check each ``MODULE:NAME`` (``mypkg.config:TrainConfig``); a bad one is a usage error. The
    same rule as ``checkpoint.safe_globals`` in the config file."""
    out = []
    for value in values:
        module, sep, name = value.strip().partition(":")
        if not sep or not all(_IDENT.fullmatch(part) for part in (*module.split("."), *name.split("."))):
            raise UsageError(f"--safe-global {value!r}: give MODULE:NAME, e.g. mypkg.config:TrainConfig "
                             "(use __main__:Cfg for a class defined in the training script itself)")
        out.append(value.strip())
    return tuple(out)


def safe_global_option(func: Any) -> Any:
    """``--safe-global MODULE:NAME`` (repeatable), shared by run, verify and resume-point."""
    return click.option(
        "--safe-global", "safe_globals", multiple=True, metavar="MODULE:NAME",
        help="Trust this pickled class as if it were on the allowlist (like torch's add_safe_globals); "
             "repeatable. Trust is a note: untrusted whole files are still resume points unless "
             "checkpoint.require_trusted is set. A code-execution primitive (os.system...) is never trusted.",
    )(func)


def _expand(path: str) -> list[str]:
    """A directory that is not itself a checkpoint but holds some stands for its checkpoints."""
    from ..checkpoints import formats as F
    from ..checkpoints.naming import has_checkpoint_suffix, parse_name
    from ..checkpoints.scan import list_candidates

    if not os.path.isdir(path) or os.path.islink(path):
        return [path]
    info = parse_name(os.path.basename(os.path.normpath(path)))
    if info.step is not None or info.is_last or info.index is not None or has_checkpoint_suffix(info.name):
        return [path]
    if F.detect_dir(path) != F.DIRECTORY:
        return [path]
    inside = list_candidates(path)
    return inside or [path]


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{n} B"


def _row(report: Any) -> str:
    step = report.step_described  # "240 (key iter_num)": the step and where it came from
    return (f"{report.verdict.value:<12} {report.format:<19} L{report.level}  {_size(report.size):>9}  "
            f"step {step:<8} {printable(report.path)}\n    {verdicts(report)}\n    {printable(report.reason)}")


def verdicts(report: Any) -> str:
    """Both verdicts on one line: ``valid (whole) · untrusted: names __main__.Cfg`` (the names a
    pickle holds are the file's words: escaped)."""
    integrity = "valid (whole)" if report.ok else report.verdict.value.replace("_", " ")
    return printable(f"{integrity} · {report.trust_note.describe()}")


@click.command("verify")
@click.argument("paths", nargs=-1, required=True)
@click.option("--deep", is_flag=True, help="Also CRC-check every byte (L4): reads the whole file.")
@safe_global_option
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array, one object per checkpoint.")
@handle_errors
def verify(paths: tuple[str, ...], deep: bool, safe_globals: tuple[str, ...], as_json: bool) -> None:
    """Validate checkpoint files or directories without loading them (never unpickles).

    One row per checkpoint: verdict, format, level reached (L0 stat .. L4 CRC), size, step; then
    both verdicts (integrity: whole or not; trust: which globals its pickles name) and the reason.
    A directory that is not a checkpoint itself is expanded to the checkpoints in it.
    Exit 0 when every checkpoint is valid (whole, whatever its trust), 1 when any is not, 2 for a
    missing or unreadable path."""
    from ..checkpoints.validate import validate

    extra = parse_safe_globals(safe_globals)
    for path in paths:
        _require_readable(path)
    reports = []
    for path in paths:
        for item in _expand(path):
            try:
                reports.append(validate(item, deep, extra_safe=extra))
            except FileNotFoundError:
                raise UsageError(f"{item}: vanished while checking") from None
    if as_json:
        echo_json([{**r.to_dict(), "path": r.path} for r in reports])
    else:
        for report in reports:
            click.echo(_row(report))
    if not all(r.ok for r in reports):
        sys.exit(ExitCode.FAILED)


@click.command("resume-point")
@click.argument("ckpt_dir")
@click.option("--quarantine", is_flag=True, help="Rename torn checkpoints to CORRUPT_<name>.<tag> (never deletes).")
@click.option("--deep", is_flag=True, help="CRC-check (L4) the chosen checkpoint; fall back while it is damaged.")
@click.option("--tag", default=None, help="Quarantine tag (default: $SLURM_JOB_ID or local-<UTC time>).")
@click.option("--settle", default=2.0, show_default=True, type=click.FloatRange(min=0),
              help="Seconds: a torn checkpoint modified more recently is treated as still being written.")
@click.option("--no-writers", is_flag=True,
              help="Nothing is writing into the directory now (the run is stopped): a torn file is torn, "
                   "whatever its age, and is quarantined with --quarantine.")
@safe_global_option
@click.option("--require-trusted", is_flag=True,
              help="Skip whole checkpoints whose pickles name globals outside the allowlist and --safe-global "
                   "(they are left untouched), like checkpoint.require_trusted.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@handle_errors
def resume_point(ckpt_dir: str, quarantine: bool, deep: bool, tag: str | None, settle: float,
                 no_writers: bool, safe_globals: tuple[str, ...], require_trusted: bool, as_json: bool) -> None:
    """Choose the checkpoint to resume from: the newest valid one by the step in its name.

    Lists every candidate with its verdict. Exit 0 when a resume point exists, 1 when none does
    (including a directory without checkpoints), 2 for a missing or unreadable directory. With
    --quarantine on a read-only filesystem the failure is reported and nothing is lost."""
    from ..checkpoints.scan import find_resume_point

    _require_readable(ckpt_dir, want_dir=True)
    result = find_resume_point(ckpt_dir, quarantine=quarantine, quarantine_tag=tag, deep_confirm=deep,
                               quiet_s=settle, writers_alive=not no_writers,
                               extra_safe_globals=parse_safe_globals(safe_globals),
                               require_trusted=require_trusted)
    if as_json:
        echo_json(result.to_dict())
    else:
        _print_resume(result)
    if not result.found:
        sys.exit(ExitCode.FAILED)


def _print_resume(result: Any) -> None:
    if result.reports:
        click.echo(f"candidates in {printable(result.ckpt_dir)} (newest first by step):")
        for report in result.reports:
            step = report.step_described
            click.echo(f"  {report.verdict.value:<12} step {step:<8} L{report.level}  {printable(report.name)}\n"
                       f"      {verdicts(report)}\n      {printable(report.reason)}")
    if result.found:
        source = getattr(result.chosen, "step_source", None)
        step = "unknown" if result.step is None else f"{result.step}, from {source}" if source else result.step
        click.echo(f"resume point: {printable(result.path)} (step {printable(str(step))})\n"
                   f"  reason: {printable(result.reason)}\n  trust: {printable(str(result.trust))}")
    else:
        click.echo(f"resume point: none: {printable(result.reason)} in {printable(result.ckpt_dir)}")
    for record in result.quarantined:
        if record.ok:
            note = f" ({printable(record.error)})" if record.error else ""
            click.echo(f"quarantined: {printable(record.path)} -> {printable(record.dest)}{note}")
        else:
            click.echo(f"quarantine failed: {printable(record.path)}: {printable(record.error)}", err=True)


def register(group: click.Group) -> None:
    group.add_command(verify)
    group.add_command(resume_point)
