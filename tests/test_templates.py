"""The sbatch templates: they render, they are valid bash, and no value can run code.

The rendered scripts are executed here by real bash with stand-ins for ``srun`` (drops its options,
runs the rest) and ``supervise`` (records its argv): no Slurm cluster is started in this file. The
real submission of each template is an integration test on the cluster (sbatch_templates/README.md).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from supervisor.addons import templates
from supervisor.errors import UsageError

REPO = Path(__file__).resolve().parent.parent
NEEDS = {"time_limit": {"time": "4:00:00"}}

HOSTILE = [
    "python", "-c", "import sys; print(sys.argv)",
    "two words", "it's", '"double"', "$(touch {canary}_dollar)", "`touch {canary}_backtick`",
    "line1\nline2; touch {canary}_newline", "; touch {canary}_semicolon", "$HOME", "*", "--lr=1e-3",
    "{job_name}", "${RUN_DIR}", "", "\\",
]


def _values(name: str, **extra):
    values = dict(run_dir="/tmp/run", command=["python", "train.py"], **NEEDS.get(name, {}))
    values.update(extra)
    return values


def _fakes(tmp_path: Path) -> Path:
    """srun and supervise stand-ins on a PATH of their own."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    srun.write_text('#!/bin/bash\nwhile [ $# -gt 0 ] && [[ "$1" == -* ]]; do shift; done\nexec "$@"\n')
    sup = bin_dir / "supervise"
    sup.write_text('#!/bin/bash\nprintf \'%s\\0\' "$@" > "$ARGV_OUT"\n')
    for p in (srun, sup):
        p.chmod(0o755)
    return bin_dir


def _run_rendered(script: str, tmp_path: Path, bin_dir: Path) -> list[str]:
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    out = tmp_path / "argv.bin"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERVISE_", "SLURM"))}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", ARGV_OUT=str(out),
               SLURM_JOB_ID="77", SLURM_CPUS_ON_NODE="4", SLURM_JOB_NUM_NODES="1", SLURM_NODEID="0")
    proc = subprocess.run(["bash", str(path)], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=20)
    assert proc.returncode == 0, proc.stderr
    return out.read_bytes().decode().split("\0")[:-1]


def _directives(script: str) -> list[str]:
    return [line for line in script.splitlines() if line.startswith("#SBATCH")]


@pytest.mark.parametrize("name", templates.available())
def test_every_template_renders_to_valid_bash_with_directives_first(name: str) -> None:
    script = templates.render(name, **_values(name))
    check = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    assert check.returncode == 0, check.stderr
    assert "{" + "run_dir}" not in script and "{command}" not in script
    # sbatch stops reading #SBATCH lines at the first command: they must all come before it.
    first_command = next(i for i, line in enumerate(script.splitlines())
                         if line.strip() and not line.startswith("#"))
    assert all(i < first_command for i, line in enumerate(script.splitlines()) if line.startswith("#SBATCH"))
    assert "#SBATCH --output=%x-%j.out" in script


@pytest.mark.parametrize("name", templates.available())
def test_hostile_training_arguments_arrive_verbatim_and_run_nothing(name: str, tmp_path: Path) -> None:
    canary = str(tmp_path / "pwned")
    hostile = [a.format(canary=canary) if "{canary}" in a else a for a in HOSTILE]
    hostile_dir = str(tmp_path / "run dir $(touch {}_rundir) 'q'".format(canary))
    script = templates.render(name, **_values(name, command=hostile, run_dir=hostile_dir,
                                              supervise=str(_fakes(tmp_path) / "supervise")))
    argv = _run_rendered(script, tmp_path, tmp_path / "bin")
    assert argv[0] == "run" and "--" in argv
    assert argv[-len(hostile):] == hostile  # every argument intact, in order
    run_dir = argv[argv.index("--run-dir") + 1]
    assert run_dir in (hostile_dir, f"{hostile_dir}/node-0")
    assert not list(tmp_path.glob("pwned*")), "a value was executed by the shell"


def test_quoting_is_visible_in_the_script() -> None:
    script = templates.render("single_node", run_dir="/tmp/r", command=["python", "-c", "$(rm -rf /)"])
    assert "'$(rm -rf /)'" in script


def test_multi_node_layouts_launch_what_the_readme_says(tmp_path: Path) -> None:
    bin_dir = _fakes(tmp_path)
    sup = str(bin_dir / "supervise")
    batch = _run_rendered(templates.render("multi_node", run_dir="/r", command=["python", "t.py"], supervise=sup),
                          tmp_path, bin_dir)
    # (a) one supervisor; the ranks are an srun step it starts as its child.
    assert batch == ["run", "--run-dir", "/r", "--", "srun", "--kill-on-bad-exit=1", "--cpus-per-task=1",
                     "python", "t.py"]
    per_node = _run_rendered(templates.render("multi_node_per_node", run_dir="/r", command=["torchrun", "t.py"],
                                              supervise=sup), tmp_path, bin_dir)
    # (b) a supervisor per node, each with its own run directory.
    assert per_node == ["run", "--run-dir", "/r/node-0", "--", "torchrun", "t.py"]


def test_optional_values_drop_their_line() -> None:
    bare = templates.render("single_node", run_dir="/r", command=["x"])
    assert not re.search(r"#SBATCH --(qos|partition|gpus-per-node|time|cpus-per-task)=", bare)
    assert "SUPERVISE_CONFIG" not in bare and "SUPERVISE_CHECKPOINT_DIR" not in bare
    full = templates.render("single_node", run_dir="/r", command=["x"], qos="high", partition="extra,own",
                            gpus_per_node="h100:4", time="2-00:00:00", cpus_per_task=16, config="/c/s.yaml",
                            checkpoint_dir="/scratch/ck", extra_sbatch=["--constraint=h100", "--mail-type=END"])
    for line in ("#SBATCH --qos=high", "#SBATCH --partition=extra,own", "#SBATCH --gpus-per-node=h100:4",
                 "#SBATCH --time=2-00:00:00", "#SBATCH --cpus-per-task=16", "#SBATCH --constraint=h100",
                 "#SBATCH --mail-type=END", "export SUPERVISE_CONFIG=/c/s.yaml",
                 "export SUPERVISE_CHECKPOINT_DIR=/scratch/ck"):
        assert line in full.splitlines()


def test_preemptible_and_time_limit_ask_for_requeue_append_and_a_warning() -> None:
    pre = _directives(templates.render("preemptible", **_values("preemptible", partition="extra")))
    assert {"#SBATCH --requeue", "#SBATCH --open-mode=append", "#SBATCH --signal=B:USR1@120",
            "#SBATCH --partition=extra"} <= set(pre)
    tl = _directives(templates.render("time_limit", **_values("time_limit")))
    assert {"#SBATCH --requeue", "#SBATCH --open-mode=append", "#SBATCH --signal=B:USR1@300",
            "#SBATCH --time=4:00:00"} <= set(tl)
    usr2 = _directives(templates.render("time_limit", **_values("time_limit", warn_signal="SIGUSR2", warn_seconds=600)))
    assert "#SBATCH --signal=B:USR2@600" in usr2
    none = _directives(templates.render("preemptible", **_values("preemptible", warn_signal="")))
    assert not any("--signal" in line for line in none)


@pytest.mark.parametrize("name,values,message", [
    ("single_node", dict(job_name="x\n#SBATCH --uid=0"), "job_name"),
    ("single_node", dict(job_name="two words"), "job_name"),
    ("single_node", dict(partition="extra; rm"), "partition"),
    ("single_node", dict(output="out file.log"), "output"),
    ("single_node", dict(time="forever"), "time"),
    ("single_node", dict(gpus_per_node="4 --uid=0"), "gpus_per_node"),
    ("single_node", dict(cpus_per_task=0), "cpus_per_task"),
    ("multi_node", dict(nodes="two"), "nodes"),
    ("single_node", dict(extra_sbatch=["--constraint=h100\n--uid=0"]), "extra_sbatch"),
    ("single_node", dict(extra_sbatch=["echo hi"]), "extra_sbatch"),
    ("single_node", dict(command="python train.py"), "split it yourself"),
    ("single_node", dict(command=[]), "non-empty list"),
    ("single_node", dict(command=["python", "a\x00b"]), "NUL"),
    ("single_node", dict(run_dir="/tmp/a\nb"), "control characters"),
    ("single_node", dict(run_dir=""), "required"),
    ("preemptible", dict(warn_signal="KILL"), "warn_signal"),
    ("preemptible", dict(warn_seconds=70000), "warn_seconds"),
    ("time_limit", dict(time=""), "required by the 'time_limit' template"),
])
def test_bad_values_are_refused_with_the_name(name, values, message) -> None:
    with pytest.raises(UsageError, match=re.escape(message)):
        templates.render(name, **_values(name, **values))


def test_unknown_and_unused_values_and_templates_are_refused() -> None:
    with pytest.raises(UsageError, match="unknown template value 'gpus'"):
        templates.render("single_node", **_values("single_node", gpus=4))
    with pytest.raises(UsageError, match=r"'single_node' has no \{nodes\}"):
        templates.render("single_node", **_values("single_node", nodes=2))
    with pytest.raises(UsageError, match="unknown sbatch template 'multinode'; available: multi_node"):
        templates.render("multinode", run_dir="/r", command=["x"])
    with pytest.raises(UsageError, match=r"unknown placeholder\(s\) \{account\}"):
        templates.render_text("#SBATCH --account={account}\n", {})


def test_numbers_may_come_as_text_from_a_command_line() -> None:
    script = templates.render("multi_node", **_values("multi_node", nodes="4", ntasks_per_node="8"))
    assert "#SBATCH --nodes=4" in script and "#SBATCH --ntasks-per-node=8" in script


def test_every_placeholder_is_documented_in_the_readme() -> None:
    readme = (REPO / "sbatch_templates" / "README.md").read_text()
    for name in templates.available():
        assert f"`{name}.sbatch`" in readme, name
        for placeholder in templates.placeholders(name):
            assert f"`{{{placeholder}}}`" in readme, placeholder
