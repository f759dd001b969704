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


class OneErrorStyleGroup(click.Group):
    """The ``supervise`` group: click's own command-line errors (unknown option, bad value, missing
    argument) come out as every other user error does, ``supervise: error: ...`` on one line with
    the exit code click gives them (2 for usage), instead of click's four-line ``Usage:``/``Error:``."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            result = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as exc:  # bare `supervise` / `supervise config`: the help
            exc.show()
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            fail(_with_help_hint(exc), exc.exit_code)
        except SupervisorError as exc:  # a command without @handle_errors: still one line, never a traceback
            fail(str(exc), exc.exit_code)
        except (click.exceptions.Abort, KeyboardInterrupt, EOFError):
            click.echo("supervise: interrupted", err=True)
            sys.exit(130)
        sys.exit(result if isinstance(result, int) else 0)  # an int here is a click Exit's code (--help: 0)


def _with_help_hint(exc: click.ClickException) -> str:
    """Click's message, plus where to read more when the mistake is in a command line."""
    message = exc.format_message()
    ctx = getattr(exc, "ctx", None)
    if isinstance(exc, click.UsageError) and ctx is not None:
        return f"{message} (see '{ctx.command_path} --help')"
    return message


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))
