"""Provenance of an attempt, collected for real: a git repository, the child's interpreter, files."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.config import load_config
from supervisor.addons.manifest import (
    collect_manifest,
    determinism_env,
    find_child_python,
    parse_nvidia_smi,
    probe_git,
    read_manifest,
    write_manifest,
)

GIT_ID = ["-c", "user.name=t", "-c", "user.email=t@example.org"]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *GIT_ID, *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    (code / "scripts").mkdir(parents=True)
    (code / "scripts" / "train.py").write_text("print('train')\n")
    git(code, "init", "-q")
    git(code, "add", ".")
    git(code, "commit", "-q", "-m", "first")
    return code


def _bin_dir(tmp_path: Path, scripts: dict[str, str]) -> Path:
    """A PATH directory holding the given executables (and symlinks to git and this python)."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    for name, text in scripts.items():
        path = bindir / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return bindir


def test_manifest_records_git_commit_dirty_flag_and_torch_of_the_child(repo: Path, tmp_path: Path) -> None:
    cfg = load_config(environ={}, sets=("config_files=[train.yaml, missing.yaml]",))
    (repo / "train.yaml").write_text("lr: 0.001\n")
    # The script lives in a subfolder and the run starts elsewhere: the repo is found from the script.
    argv = [sys.executable, str(repo / "scripts" / "train.py"), "--lr", "1e-3"]
    env = dict(os.environ, SLURM_JOB_ID="1234", SLURM_JOB_NODELIST="n[1-2]", NCCL_DEBUG="INFO",
               CUBLAS_WORKSPACE_CONFIG=":4096:8")
    m = collect_manifest(attempt=2, argv=argv, config=cfg, environ=env, cwd=repo, child_python=None,
                         run_dir=tmp_path / "run")
    assert m["attempt"] == 2 and m["argv"] == argv
    assert m["git"]["commit"] == git(repo, "rev-parse", "HEAD") and m["git"]["dirty"] is False
    assert m["git"]["toplevel"] == str(repo.resolve())
    sw = m["software"]
    assert sw["torch"] == importlib.metadata.version("torch")
    assert sw["python"] == ".".join(map(str, sys.version_info[:3]))
    assert sw["cuda_initialized"] is False  # the probe never takes a GPU context
    assert m["config_hash"] == cfg.config_hash() and m["config"]["config_files"] == ["train.yaml", "missing.yaml"]
    files = {Path(f["path"]).name: f for f in m["config_files"]}
    assert files["train.yaml"]["sha256"] == hashlib.sha256(b"lr: 0.001\n").hexdigest()
    assert files["missing.yaml"]["missing"] is True and files["missing.yaml"]["sha256"] is None
    assert m["slurm"]["SLURM_JOB_ID"] == "1234" and m["hosts"]["nodelist"] == "n[1-2]"
    assert m["determinism"]["NCCL_DEBUG"] == "INFO"
    assert m["determinism"]["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


def test_uncommitted_change_is_dirty_untracked_file_is_not(repo: Path) -> None:
    (repo / "notes.txt").write_text("untracked\n")
    assert probe_git(repo / "scripts", 10)["dirty"] is False
    (repo / "scripts" / "train.py").write_text("print('changed')\n")
    result = probe_git(repo / "scripts", 10)
    assert result["dirty"] is True and result["changed_files"] == 1
    assert not (repo / ".git" / "index.lock").exists()


def test_not_a_repository_is_null_with_a_reason(tmp_path: Path) -> None:
    result = probe_git(tmp_path, 10)
    assert result["commit"] is None and result["dirty"] is None
    assert "not a git repository" in result["reason"]


def test_repository_without_commits(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    result = probe_git(tmp_path, 10)
    assert result["commit"] is None and result["reason"] == "repository has no commits"


def test_missing_nvidia_smi_is_null_not_an_error(tmp_path: Path) -> None:
    bindir = _bin_dir(tmp_path, {})
    m = collect_manifest(attempt=1, argv=["true"], config=load_config(environ={}),
                         environ={"PATH": str(bindir)}, cwd=tmp_path, child_python=None, run_dir=tmp_path)
    assert m["gpu"] == {"gpus": None, "driver": None, "reason": "nvidia-smi not found"}


def test_gpus_and_driver_from_nvidia_smi(tmp_path: Path) -> None:
    # No GPU here: a script answering like nvidia-smi (its CSV format) stands in for the real one.
    smi = ("#!/bin/sh\n"
           "echo 'NVIDIA H100 80GB HBM3, 550.54.15, GPU-1a2b'\n"
           "echo 'NVIDIA H100 80GB HBM3, 550.54.15, GPU-3c4d'\n")
    bindir = _bin_dir(tmp_path, {"nvidia-smi": smi})
    m = collect_manifest(attempt=1, argv=["true"], config=load_config(environ={}),
                         environ={"PATH": str(bindir)}, cwd=tmp_path, child_python=None, run_dir=tmp_path)
    assert m["gpu"]["driver"] == "550.54.15"
    assert [g["uuid"] for g in m["gpu"]["gpus"]] == ["GPU-1a2b", "GPU-3c4d"]


def test_failing_nvidia_smi_is_recorded(tmp_path: Path) -> None:
    smi = "#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'\nexit 9\n"
    bindir = _bin_dir(tmp_path, {"nvidia-smi": smi})
    m = collect_manifest(attempt=1, argv=["true"], config=load_config(environ={}),
                         environ={"PATH": str(bindir)}, cwd=tmp_path, child_python=None, run_dir=tmp_path)
    assert m["gpu"]["gpus"] is None and "could not communicate" in m["gpu"]["reason"]


def test_slow_child_interpreter_times_out_without_failing_the_manifest(tmp_path: Path) -> None:
    slow = _bin_dir(tmp_path, {"python3": "#!/bin/sh\nexec sleep 30\n"}) / "python3"
    m = collect_manifest(attempt=1, argv=[str(slow), "train.py"], config=load_config(environ={}),
                         environ={"PATH": "/usr/bin:/bin"}, cwd=tmp_path, child_python=None,
                         run_dir=tmp_path, timeout=1.0)
    assert m["software"]["torch"] is None and "timed out" in m["software"]["reason"]
    assert m["config_hash"]  # the rest was still collected


def test_child_without_torch_is_recorded(tmp_path: Path) -> None:
    # "python -S" cannot see site-packages: the same interpreter, without torch.
    no_site = _bin_dir(tmp_path, {"python3": f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n"}) / "python3"
    m = collect_manifest(attempt=1, argv=[str(no_site), "train.py"], config=load_config(environ={}),
                         environ={"PATH": "/usr/bin:/bin"}, cwd=tmp_path, child_python=None, run_dir=tmp_path)
    assert m["software"]["python"] is not None and m["software"]["torch"] is None
    assert "torch not importable" in m["software"]["reason"]


def test_find_child_python_walks_through_launchers(tmp_path: Path) -> None:
    bindir = _bin_dir(tmp_path, {
        "torchrun": f"#!{sys.executable}\nimport sys\n",
        "deep-launcher": "#!/bin/sh\n'''exec' \"/very/long/venv/bin/python3.11\" \"$0\" \"$@\"\n' '''\n",
        "srun": "#!/bin/sh\nexec \"$@\"\n",
    })

    def which(name: str) -> str | None:
        import shutil

        return shutil.which(name, path=f"{bindir}{os.pathsep}/usr/bin{os.pathsep}/bin")

    assert find_child_python(["srun", "-n", "2", "torchrun", "--nproc_per_node=2", "t.py"], which)[0] == sys.executable
    assert find_child_python(["deep-launcher", "t.py"], which)[0] == "/very/long/venv/bin/python3.11"
    assert find_child_python(["env", "OMP_NUM_THREADS=4", "/opt/py/bin/python3", "t.py"], which)[0] == "/opt/py/bin/python3"
    assert find_child_python(["srun", "t.py"], which)[0] == sys.executable
    assert find_child_python(["bash", "run.sh"], which) == (None, "no python interpreter or .py script found in argv")


def test_parse_nvidia_smi_and_determinism_env() -> None:
    assert parse_nvidia_smi("A100, 535.1, GPU-x\n\n") == [{"name": "A100", "driver_version": "535.1", "uuid": "GPU-x"}]
    env = determinism_env({"NCCL_ALGO": "Ring", "PATH": "/bin", "PYTHONHASHSEED": "0"})
    assert env["NCCL_ALGO"] == "Ring" and env["PYTHONHASHSEED"] == "0" and "PATH" not in env
    assert env["CUBLAS_WORKSPACE_CONFIG"] is None  # unset is recorded, so set-vs-unset shows as drift


def test_write_manifest_is_atomic_and_readable(tmp_path: Path) -> None:
    path = tmp_path / "supervisor" / "manifest-3.json"
    write_manifest(path, {"attempt": 3, "odd": Path("/x")})
    assert json.loads(path.read_text()) == {"attempt": 3, "odd": "/x"}
    assert read_manifest(path) == {"attempt": 3, "odd": "/x"}
    assert sorted(p.name for p in path.parent.iterdir()) == ["manifest-3.json"]  # no temp left behind
    (tmp_path / "torn.json").write_text('{"attempt": ')
    assert read_manifest(tmp_path / "torn.json") is None
