"""Shared CLI plumbing: logging to stderr, error-to-exit-code mapping, JSON output."""

from __future__ import annotations

import functools
import json
import logging
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from ..errors import ExitCode, SupervisorError
from ..redact import redact_text
from ..textsafe import printable

F = TypeVar("F", bound=Callable[..., Any])
log = logging.getLogger("supervisor")
# The date too: a Slurm job's log spans days (requeues, multi-day trainings), and a time alone repeats.
LOG_TIME_FORMAT = "%Y-%m-%d %H:%M:%S"


def setup_logging(verbose: int) -> None:
    level = logging.WARNING - 10 * min(verbose, 2) if verbose else logging.INFO
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[supervise %(asctime)s] %(message)s", LOG_TIME_FORMAT))
    handler.addFilter(_redact_record)  # stderr lands in Slurm's output file, often readable by all
    root = logging.getLogger("supervisor")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


def _redact_record(record: logging.LogRecord) -> bool:
    """A log line says the command it started, the failure it saw: credentials out, controls escaped."""
    try:
        message = record.getMessage()
    except Exception:  # noqa: BLE001 - a bad format string is logging's problem to report, not ours
        return True
    record.msg, record.args = printable(redact_text(message)), None
    return True


def fail(message: str, code: int = ExitCode.USAGE) -> None:
    """One line on stderr naming the problem, then exit with a documented code. The message is
    escaped: a path or name in it with a newline or ESC can neither forge a line nor drive the terminal."""
    click.echo(f"supervise: error: {printable(message)}", err=True)
    sys.exit(code)


def handle_errors(func: F) -> F:
    """Turn :class:`SupervisorError` into one line and its exit code; never a traceback for a user mistake."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except SupervisorError as exc:
            fail(str(exc), exc.exit_code)
        except KeyboardInterrupt:
            click.echo("supervise: interrupted", err=True)
            sys.exit(130)

    return wrapper  # type: ignore[return-value]


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))
