"""One error style for every user mistake (issue 26): click's own command-line errors (unknown
option or command, missing argument, bad value) come out like supervise's, one line
``supervise: error: ...`` with exit 2, naming the problem and where the help is; never click's
four-line ``Usage:`` / ``Error:`` block, never a traceback."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from supervisor.cli import main
from supervisor.errors import ExitCode


@pytest.mark.parametrize("args, names, help_of", [
    (["run", "--no-such-option", "--", "true"], "No such option '--no-such-option'", "supervise run"),
    (["verify"], "Missing argument", "supervise verify"),
    (["status", "/tmp", "--interval", "soon"], "'soon' is not a valid float", "supervise status"),
    (["no-such-command"], "No such command 'no-such-command'", "supervise"),
    (["config", "show", "--set"], "'--set' requires an argument", None),  # click gives no context here
    (["classify", "/nonexistent/log"], "/nonexistent/log", None),  # supervise's own error, same style
])
def test_a_command_line_mistake_is_one_line_with_exit_2(args: list[str], names: str, help_of: str | None) -> None:
    result = CliRunner().invoke(main, args, prog_name="supervise")
    assert result.exit_code == ExitCode.USAGE, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("supervise: error: "), result.stderr
    assert names in lines[0]
    if help_of:
        assert lines[0].endswith(f"(see '{help_of} --help')")
    assert result.stdout == ""


def test_help_and_version_still_exit_0() -> None:
    for args in (["--help"], ["init", "--help"], ["--version"]):
        result = CliRunner().invoke(main, args, prog_name="supervise")
        assert result.exit_code == 0 and result.stdout and not result.stderr, (args, result.output)
