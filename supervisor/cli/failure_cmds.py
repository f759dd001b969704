"""``supervise classify LOGFILE`` and ``supervise audit RUN_DIR``: the failure classifier and the
step-budget audit on a log or a run directory, for post-mortems and for scripts (``--json``).

Exit codes: classify exits 0 whenever it could read the log, whatever the class (an empty log is
classified from the exit status alone, ``unknown`` without one, with a note on stderr); 2 for bad
input (unreadable or binary file, ``--exit-code`` with ``--signal``). audit exits 0 when the run is
within its budgets and every resume matched, 1 when a budget is exhausted or a resume audit failed,
2 when RUN_DIR is not a run directory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from ..errors import ExitCode, UsageError
from ..failures.evidence import SCHEDULER_CLASSES
from ..textsafe import printable
from .common import echo_json, handle_errors, log

DEFAULT_TAIL_MB = 2.0  # classify reads at most this much from the end of the log
_BINARY_SAMPLE = 64 * 1024


def _read_tail(path: Path, max_bytes: int) -> tuple[str, int, bool]:
    """(text, file size, truncated): the last ``max_bytes`` of the file, decoded leniently."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            if size > max_bytes:
                fh.seek(size - max_bytes)
            data = fh.read(max_bytes)
    except IsADirectoryError:
        raise UsageError(f"{path} is a directory; give the path of a log file") from None
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    sample = data[-_BINARY_SAMPLE:]
    if sample:
        nul = sample.count(0)
        text_sample = sample.decode("utf-8", errors="replace")
        bad = text_sample.count("\ufffd")
        if nul > len(sample) * 0.05 or bad > len(text_sample) * 0.3:
            raise UsageError(f"{path} looks like a binary file, not a text log "
                             f"({nul} NUL bytes in the last {len(sample)}); give the training's output log")
    text = data.decode("utf-8", errors="replace").replace("\x00", "")
    truncated = size > max_bytes
    if truncated:  # the first line is probably cut in the middle
        newline = text.find("\n")
        text = text[newline + 1:] if newline >= 0 else text
    return text, size, truncated


def _failure_json(failure: Any) -> dict[str, Any]:
    from ..policy import action_for

    return {
        "class": failure.cls.value, "action": action_for(failure.cls).value, "evidence": list(failure.evidence),
        "step": failure.step, "node": failure.node, "rank": failure.rank, "exit_code": failure.exit_code,
        "signal": failure.signal, "reason": failure.reason, "context": list(failure.context),
        "text_claim": failure.text_claim,
    }


@click.command("classify")
@click.argument("logfile", type=click.Path(path_type=Path))
@click.option("--exit-code", "exit_code", type=int, default=None,
              help="How the child exited (a negative value -N means killed by signal N).")
@click.option("--signal", "signal_text", default=None, metavar="NAME",
              help="The signal that killed the child: SEGV, SIGSEGV or 11.")
@click.option("--tail-mb", type=click.FloatRange(min=0.01, max=1024), default=DEFAULT_TAIL_MB, show_default=True,
              help="Read only this many MB from the end of the log.")
@click.option("--slurm-says", "slurm_says", type=click.Choice(sorted(c.value for c in SCHEDULER_CLASSES)),
              default=None, help="What Slurm's job record says ended the job (sacct State PREEMPTED, TIMEOUT, "
                                 "NODE_FAIL). Without it, such a cause printed in the log is evidence only.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@handle_errors
def classify_cmd(logfile: Path, exit_code: int | None, signal_text: str | None, tail_mb: float,
                 slurm_says: str | None, as_json: bool) -> None:
    """Classify how a training ended from its log (and its exit status, if known).

    Prints the failure class, the action the default policy takes, the step and the evidence: the
    first failure in the log, not the last. Without --exit-code/--signal the text alone decides,
    except for a preemption, time limit or node failure: only Slurm says those (--slurm-says); a
    log that merely prints one is classified by the rest of its evidence, and the claim is shown.

    \b
    Exit codes: 0 classified (whatever the class; an empty log is classified from the exit status
    alone, "unknown" without one); 2 unreadable or binary file, or --exit-code with --signal.
    """
    from ..failures import classify, confirmed, parse_signal
    from ..policy import policy_for
    from ..states import Action, FailureClass

    if exit_code is not None and signal_text is not None:
        raise UsageError("give --exit-code or --signal, not both: a process either exited or was killed")
    signum = None
    if signal_text is not None:
        try:
            signum = parse_signal(signal_text)
        except ValueError as exc:
            raise UsageError(f"--signal: {exc}") from None
    if exit_code is not None and not -64 <= exit_code <= 255:
        raise UsageError(f"--exit-code {exit_code}: expected 0-255 (or -N for a signal)")
    text, size, truncated = _read_tail(logfile, int(tail_mb * 1024 * 1024))
    if not text.strip():
        log.warning("note: %s is empty; classifying from the exit status alone", logfile)
    elif truncated:
        log.info("read the last %.1f MB of %s (%d bytes)", tail_mb, logfile, size)
    failure = classify(exit_code, signum, text, slurm=confirmed(FailureClass(slurm_says)) if slurm_says else None)
    if as_json:
        echo_json({"log": str(logfile), **_failure_json(failure)})
        return
    default = policy_for(failure.cls)  # the default policy's answer: the class alone decides nothing
    action = default.action.value
    if failure.cls == FailureClass.COMPLETED:
        action = "none: training finished, nothing to restart"
    elif default.action == Action.REQUEUE and failure.node and default.exclude_node:
        action += f", excluding node {failure.node}"
    click.echo(f"class:    {failure.cls.value}")
    click.echo(f"action:   {action}")
    if failure.step is not None:
        click.echo(f"step:     {failure.step}")
    where = [f"node {failure.node}" if failure.node else "", f"rank {failure.rank}" if failure.rank is not None else ""]
    if any(where):
        click.echo(f"where:    {', '.join(w for w in where if w)}")
    click.echo(f"reason:   {printable(failure.reason)}")
    if failure.text_claim:
        click.echo(f"text claim: {printable(failure.text_claim)}")
    if failure.evidence:
        click.echo("evidence:")
        for line in failure.evidence:
            click.echo(f"  {printable(line)}")


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.0f}s" if value >= 10 else f"{value:.1f}s"
    return str(value)


def _table(rows: list[list[str]], headers: list[str]) -> str:
    """Aligned, and fitted to COLUMNS (else the terminal, else 100): wide cells wrap, none is cut."""
    from ..addons.report.textfit import columns, fit_table

    return "\n".join(fit_table(headers, rows, columns(), indent=""))


def _results_check_json(check: Any) -> dict[str, Any] | None:
    if check is None:
        return None
    return {"events": [{"attempt": e.attempt, "what": e.what, "step": e.step, "evidence": e.evidence}
                       for e in check.events],
            "crash_free_steps": check.crash_free_steps, "crash_free_needed": check.crash_free_needed,
            "settled": check.settled, "reason": check.reason}


@click.command("audit")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--config", "config_file", type=click.Path(path_type=Path), default=None,
              help="YAML config whose budget to judge by (default: the budget recorded in the run's newest "
                   "manifest, else built-in defaults and SUPERVISE_* env).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@handle_errors
def audit_cmd(run_dir: Path, config_file: Path | None, as_json: bool) -> None:
    """The step-budget audit of a run: per-attempt ledger, resume checks and the run's verdict (the
    same verdict `supervise report` gives). A run that stopped shows what stopped it; a run still
    going is judged by the budgets now. Losses marked ≥ are lower bounds (steps read from the output).

    \b
    Exit codes: 0 within budget (or complete) and every resume matched its checkpoint; 1 the run
    stopped, a budget is exhausted or a resume audit failed; 2 RUN_DIR is not a run directory, or a
    bad --config.
    """
    from ..budget import audit_resume, run_verdict
    from ..config import load_config
    from ..events import read_events
    from ..ledger import (
        ledger_from_events,
        loss_anomalies,
        records_to_json,
        results_check,
    )
    from ..paths import RunPaths
    from ..addons.report.load import budget_config_from, read_manifests
    from ..addons.report.render import fmt_lost, verdict_line

    paths = RunPaths(run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir} is not a directory; give a run directory (it holds supervisor/events.jsonl)")
    if not paths.events.is_file():
        raise UsageError(f"{run_dir} is not a run directory: no {paths.events.relative_to(run_dir)}")
    if not os.access(paths.events, os.R_OK):
        raise UsageError(f"cannot read {paths.events}: permission denied")
    recorded = budget_config_from(read_manifests(paths)) if config_file is None else None
    budget = recorded or load_config(config_file).budget
    try:
        read = read_events(paths.events)
    except OSError as exc:
        raise UsageError(f"cannot read {paths.events}: {exc.strerror or exc}") from None
    if read.bad_lines:
        log.warning("%d line(s) of %s are not valid events (a torn last line after a kill is normal)",
                    read.bad_lines, paths.events)
    records = ledger_from_events(read.events)
    verdict = run_verdict(read.events, budget, records=records)
    check = results_check(records, loss_anomalies(read.events), budget.results_check_crash_free_steps)
    audits = [audit_resume(r.resume_step, r.first_step, r.resume_path) for r in records]
    resume_ok = all(a.ok for a in audits)

    if as_json:
        attempts = records_to_json(records)
        for item, a in zip(attempts, audits):
            item["resume_audit"] = {"ok": a.ok, "reason": a.reason}
        echo_json({"run_dir": str(run_dir), "attempts": attempts,
                   "verdict": {"ok": verdict.ok, "budget": verdict.budget, "reason": verdict.reason,
                               "numbers": verdict.numbers, "source": verdict.source, "outcome": verdict.outcome},
                   "results_check": _results_check_json(check), "resume_ok": resume_ok,
                   "bad_lines": read.bad_lines})
    else:
        if not records:
            click.echo(f"{run_dir}: no attempts recorded yet")
        else:
            rows = []
            for r, a in zip(records, audits):
                rows.append([str(r.attempt), _fmt(r.job_id) + (f"/{r.restart_count}" if r.restart_count else ""),
                             ",".join(r.nodes) or "-", _fmt(r.resume_step), _fmt(r.first_step) + ("" if a.ok else "!"),
                             _fmt(r.last_step), _fmt(r.last_durable_step),
                             fmt_lost(r.steps_lost, r.steps_lost_at_least),
                             _fmt(r.wall_lost), r.status, _fmt(r.action.value if r.action else None),
                             printable(r.evidence[0][:60]) if r.evidence else ""])
            click.echo(_table(rows, ["attempt", "job", "nodes", "resume", "first", "last", "durable", "lost",
                                     "wall lost", "class", "action", "evidence"]))
            for r, a in zip(records, audits):
                if not a.ok:
                    click.echo(f"resume audit FAILED for attempt {r.attempt}: {printable(a.reason)}")
        if check is not None:
            click.echo(check.reason)
        click.echo(("verdict: " if verdict.source == "run_end" else "budget: ")
                   + verdict_line(verdict.ok, verdict.budget, verdict.reason, verdict.source))
    if not verdict.ok or not resume_ok:
        raise SystemExit(ExitCode.FAILED)


def register(group: click.Group) -> None:
    group.add_command(classify_cmd)
    group.add_command(audit_cmd)
