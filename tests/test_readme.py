"""The README runs as written: every Python, shell and YAML snippet of README.md is extracted and
checked here, or by the test file its marker names.

Each code block carries an HTML comment on the line before it, ``<!-- readme-test: HOW -->``,
saying how it is tested (an unmarked block fails :func:`test_every_snippet_says_how_it_is_tested`):

* ``run``: run as written by bash, in an empty directory, with ``supervise`` being this checkout;
* ``supervised``: a Python script, run as ``supervise run -- python train.py``, then resumed by a
  second run from the first one's checkpoints;
* ``config``: a YAML config that ``supervise config show --config`` accepts;
* ``completion``: sourced by bash, then asked to complete a subcommand and an option;
* ``install``: ``pip install -e "..." && CMD``, the newcomer lines. pip needs the network, so the
  line is checked instead: it pins no torch (pip keeps an installed one: asked of pip itself, offline),
  ``.ci/run`` runs the same pip command, and CMD is what tests/test_demo.py or CI runs;
* ``tests/NAME.py``: that test file runs the snippet (it must read README.md).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, events_named, supervise_env

README = REPO / "README.md"
CODE_LANGS = {"python", "py", "bash", "sh", "shell", "console", "yaml", "yml"}
HOWS = {"run", "supervised", "config", "completion", "install"}
_BLOCK = re.compile(r"(?:<!-- readme-test: (?P<how>[^>]*?) -->\n)?^```(?P<lang>[\w-]*)\n(?P<body>.*?)^```", re.S | re.M)


def snippets() -> list[tuple[str, str, str]]:
    """(how, language, body) of every fenced block with a language; how is '' when unmarked."""
    return [((m["how"] or "").strip(), m["lang"], m["body"]) for m in _BLOCK.finditer(README.read_text())
            if m["lang"]]


def marked(how: str) -> list[str]:
    bodies = [body for h, _, body in snippets() if h == how]
    assert bodies, f"README.md has no snippet marked readme-test: {how}"
    return bodies


def test_every_snippet_says_how_it_is_tested() -> None:
    found = snippets()
    assert len(found) >= 8
    for how, lang, body in found:
        assert lang in CODE_LANGS, f"unknown snippet language {lang!r}: {body[:80]!r}"
        assert how, f"README snippet without a <!-- readme-test: HOW --> marker: {body[:80]!r}"
        if how.startswith("tests/"):
            test_file = REPO / how
            assert test_file.is_file() and "README" in test_file.read_text(), how
        else:
            assert how in HOWS, f"unknown readme-test marker {how!r}"


@pytest.fixture()
def shell_env(tmp_path: Path) -> dict[str, str]:
    """PATH with ``supervise`` (this checkout) and ``python3``/``python`` (this interpreter) first."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "supervise").write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m supervisor "$@"\n')
    (bin_dir / "supervise").chmod(0o755)
    for name in ("python3", "python"):
        (bin_dir / name).symlink_to(sys.executable)
    env = supervise_env({"HOME": str(tmp_path / "home")})
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    return env


def test_shell_snippets_run_as_written(tmp_path: Path, shell_env: dict[str, str]) -> None:
    for i, body in enumerate(marked("run")):
        cwd = tmp_path / f"snippet-{i}"
        cwd.mkdir()
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", body], cwd=cwd, env=shell_env,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, (body, proc.stderr)
        if "supervise init" in body:  # what the README says it writes, it wrote
            out = shlex.split(body)[shlex.split(body).index("-o") + 1]
            assert (cwd / out).read_text().startswith("#!/bin/bash\n")


def test_completion_snippet_completes_a_subcommand_and_an_option(shell_env: dict[str, str]) -> None:
    """Bash's own completion machinery: the README's line defines the function that Tab calls,
    and that function, given the words typed so far, offers the subcommand and the option."""
    (snippet,) = marked("completion")
    script = snippet + r'''
func=$(complete -p supervise | sed -n 's/.*-F \([^ ]*\) .*/\1/p')
complete_words() {  # as bash calls it on Tab: the command, the word being completed, the one before
    COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 )); COMPREPLY=()
    "$func" supervise "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
    printf '%s\n' "${COMPREPLY[@]}"
}
echo "== subcommand"; complete_words supervise ini
echo "== option"; complete_words supervise init --tem
'''
    proc = subprocess.run(["bash", "--norc", "-c", script], env=shell_env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    sub, opt = proc.stdout.split("== option\n")
    assert sub.split("\n")[1:] == ["init", ""], proc.stdout
    assert opt.split() == ["--template"], proc.stdout


def test_config_snippet_is_accepted(tmp_path: Path) -> None:
    (body,) = marked("config")
    (tmp_path / "supervise.yaml").write_text(body)
    proc = subprocess.run([sys.executable, "-m", "supervisor", "config", "show", "--json", "--config",
                           str(tmp_path / "supervise.yaml")], env=supervise_env(), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    cfg = json.loads(proc.stdout)["config"]
    assert cfg["budget"]["max_total_restarts"] == 30 and cfg["resume_arg"] == "--ckpt_path {path}"


def test_client_snippet_trains_saves_and_resumes_under_the_supervisor(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    (body,) = marked("supervised")
    script = tmp_path / "train.py"
    script.write_text(body)

    def supervised(run_dir: Path, *args: str) -> None:
        proc = subprocess.run([sys.executable, "-m", "supervisor", "run", "--run-dir", str(run_dir), *args,
                               "--", sys.executable, str(script)], env=supervise_env(), cwd=tmp_path,
                              capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert [e["outcome"] for e in events_named(run_dir, "run_end")] == ["complete"]

    first = tmp_path / "first"
    supervised(first)
    saves = [(e["step"], e["ok"]) for e in events_named(first, "save_end")]
    assert saves == [(100, True), (200, True), (300, True)], saves
    # A second run on the first one's checkpoints resumes at the newest (the load branch runs).
    second = tmp_path / "second"
    supervised(second, "--checkpoint-dir", str(first / "checkpoints"))
    resumed = events_named(second, "resumed")
    assert resumed and resumed[0]["ok"] and resumed[0]["step"] == 300, resumed
    # (Alone, without a supervisor, every client call is a no-op: tests/test_client.py.)


def _install_lines() -> list[tuple[str, str]]:
    """(pip command, the command after &&) of each install snippet."""
    out = []
    for body in marked("install"):
        (line,) = body.strip().splitlines()
        pip, _, then = line.partition(" && ")
        out.append((pip, then))
    return out


def test_install_lines_keep_an_installed_torch_and_match_ci() -> None:
    lines = _install_lines()
    assert [then for _, then in lines] == ["supervise demo", "python3 -m pytest -q"]
    ci = (REPO / ".ci" / "run").read_text()
    for pip, _ in lines:
        words = shlex.split(pip)
        assert words[:3] == ["pip", "install", "-e"] and len(words) == 4 and words[3].startswith(".["), pip
        assert "torch==" not in pip  # a pin would replace the torch a user has (a CUDA build, say)
    # CI installs with the README's own test line (after installing its torch, as a user would have one).
    test_pip = lines[1][0]
    assert test_pip.replace("pip install", "pip install -q") in ci, "README's test install line is not .ci/run's"
    assert "python3 -m pytest -q" in ci
    # The demo line's command is what tests/test_demo.py runs.
    assert '"demo"' in (REPO / "tests" / "test_demo.py").read_text()
    # The extras ask for a torch at least as new as something, never a particular one.
    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.search(r'^torch = \["torch>=[\d.]+"\]$', pyproject, re.M), "the torch extra must be a lower bound"


def test_pip_keeps_the_installed_torch(tmp_path: Path) -> None:
    """pip itself, offline: resolving the demo's install line needs nothing but this project."""
    pytest.importorskip("torch")
    pip, _ = _install_lines()[0]
    spec = shlex.split(pip)[3]
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-build-isolation",
                           "--report", str(tmp_path / "report.json"), "-q", "-e", spec], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0 and "setuptools" in proc.stderr:
        pytest.skip(f"pip cannot build this project offline here: {proc.stderr.strip()[-200:]}")
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert [item["metadata"]["name"] for item in report["install"]] == ["slurm-supervisor"]
