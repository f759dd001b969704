"""``supervise init``: every template reachable from the command line, a script that is valid bash
and runs the command given, no file overwritten by accident, and one line with exit 2 for bad input.

Submitting what it writes is tests/test_templates_cluster.py's job (every template, on Slurm); the
quoting of hostile values is tests/test_templates.py's (the same renderer).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from supervisor.addons import templates
from supervisor.cli import main
from supervisor.errors import ExitCode

NEEDS = {"time_limit": ["--time", "4:00:00"], "multi_node": ["--nodes", "2"], "multi_node_per_node": ["--nodes", "2"]}


def init(*args: str):
    return CliRunner().invoke(main, ["init", *args], prog_name="supervise")


def test_list_shows_every_template_once_on_one_line_each() -> None:
    result = init("--list")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines] == templates.available()
    assert all(len(line.split()) > 3 for line in lines)  # a description, not just the name
    assert sum("[default]" in line for line in lines) == 1


@pytest.mark.parametrize("name", templates.available())
def test_every_template_is_written_as_valid_bash_that_runs_the_command(name: str, tmp_path: Path) -> None:
    out = tmp_path / "job.sbatch"
    result = init("-t", name, "--partition", "extra", *NEEDS.get(name, []), "-o", str(out),
                  "--", "python", "train.py", "--lr", "3e-4")
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert text.startswith("#!/bin/bash\n") and "#SBATCH --partition=extra\n" in text
    assert "python train.py --lr 3e-4" in text and "{" + "command}" not in text
    assert subprocess.run(["bash", "-n", str(out)], capture_output=True).returncode == 0
    assert f"sbatch {out}" in result.stderr  # says what to do next


def test_default_is_the_preemptible_template_on_stdout() -> None:
    result = init("--", "python", "train.py")
    assert result.exit_code == 0, result.output
    assert result.stdout == templates.render("preemptible", run_dir="runs/train", command=["python", "train.py"])


def test_an_existing_file_is_kept_unless_force(tmp_path: Path) -> None:
    out = tmp_path / "job.sbatch"
    out.write_text("my own script\n")
    result = init("-o", str(out), "--", "python", "train.py")
    assert result.exit_code == ExitCode.USAGE
    assert out.read_text() == "my own script\n"
    assert result.stderr.strip().splitlines() == [
        f"supervise: error: {out} exists; pass --force to overwrite it, or pick another -o FILE"]
    assert init("-o", str(out), "--force", "--", "python", "train.py").exit_code == 0
    assert "python train.py" in out.read_text()


@pytest.mark.parametrize("args, names", [
    (["--", ], "no training command"),
    (["-t", "nope", "--", "x"], "--template 'nope'"),
    (["--nodes", "2", "--", "x"], "--nodes"),
    (["--nodes", "0", "-t", "multi_node", "--", "x"], "--nodes"),
    (["--gpus", "4; rm -rf /", "--", "x"], "--gpus"),
    (["--time", "tomorrow", "--", "x"], "--time"),
    (["-t", "time_limit", "--", "x"], "--time: missing"),
    (["--partition", "a\n#SBATCH --uid=0", "--", "x"], "--partition"),
    (["--var", "cpus_per_task", "--", "x"], "expected NAME=VALUE"),
    (["--var", "colour=red", "--", "x"], "--var colour"),
    (["--var", "qos=a", "--qos", "b", "--", "x"], "--var qos and --qos"),
    (["--no-such-flag", "--", "x"], "--no-such-flag"),
])
def test_bad_input_is_one_line_naming_the_flag_and_exit_2(args: list[str], names: str, tmp_path: Path) -> None:
    out = tmp_path / "job.sbatch"
    result = init("-o", str(out), *args)
    assert result.exit_code == ExitCode.USAGE, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("supervise: error: ") and names in lines[0], result.stderr
    assert not out.exists()


def test_the_installed_command_exits_2_without_a_traceback(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "supervisor", "init", "--nodes", "3", "--", "python", "t.py"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == ExitCode.USAGE and proc.stdout == ""
    assert proc.stderr.startswith("supervise: error: --nodes") and "Traceback" not in proc.stderr
