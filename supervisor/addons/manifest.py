"""Provenance of one attempt: what code, config, software and hardware it ran on.

Written at attempt start so a post-mortem can tell whether attempts 1..n were one reproducible run
or several different ones glued together (a resume on other code, another torch, another GPU).
Everything here is best effort: a probe that fails or times out is recorded with its reason and
never stops the training. The supervisor never imports torch: the child's interpreter answers for
itself in a subprocess, with no GPU visible so it cannot create a CUDA context.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..config import SupervisorConfig
from ..private import OWNER_ONLY, write_atomic
from ..redact import redact_env, redact_value

MANIFEST_VERSION = 1
MANIFEST_MODE = OWNER_ONLY  # the attempt's environment is in it (docs/security.md)

# Environment variables that change numerics or scheduling of GPU work (NCCL_* are added by prefix).
DETERMINISM_VARS = (
    "CUBLAS_WORKSPACE_CONFIG",
    "PYTHONHASHSEED",
    "CUDA_LAUNCH_BLOCKING",
    "CUDA_VISIBLE_DEVICES",
    "TORCH_DETERMINISTIC",
    "NVIDIA_TF32_OVERRIDE",
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
    "OMP_NUM_THREADS",
)
DETERMINISM_PREFIXES = ("NCCL_",)

# Recorded with their values whatever their names: which devices the attempt saw and how they were
# driven decide whether a GPU fault reproduces (supervise diagnose reruns with them).
GPU_ENV_NAMES = frozenset({"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
                           "HIP_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "CUDA_LAUNCH_BLOCKING", "OMP_NUM_THREADS",
                           "CUDA_DEVICE_ORDER", "CUDA_MODULE_LOADING"})
GPU_ENV_PREFIXES = ("TORCH_", "NCCL_", "PYTORCH_", "CUBLAS_", "CUDNN_", "NVIDIA_", "TORCHINDUCTOR_", "TRITON_")
# Re-made by every attempt (and by diagnose): the control channel's key above all, never recorded.
_PER_ATTEMPT_PREFIX = "SUPERVISOR_"

_PYTHON_NAME = re.compile(r"^(python|pypy)(\d+(\.\d+)*)?[a-z]?$")
_PIP_TRAMPOLINE = re.compile(r"'''exec' \"?([^\"\s]+)")

# Runs in the child's interpreter. It must not initialise CUDA: torch.backends.cudnn.version() calls
# torch.cuda.is_available() and get_device_capability(), so the cuDNN version is read from the
# extension directly, and the probe runs with CUDA_VISIBLE_DEVICES="" as a second guard.
TORCH_PROBE = r"""
import json, platform, sys
out = {"python": platform.python_version(), "python_executable": sys.executable,
       "implementation": platform.python_implementation(), "torch": None, "cuda": None,
       "hip": None, "cudnn": None, "nccl": None, "torch_error": None}
try:
    import torch
except BaseException as exc:
    out["torch_error"] = (type(exc).__name__ + ": " + str(exc))[:300]
else:
    out["torch"] = str(torch.__version__)
    out["cuda"] = getattr(torch.version, "cuda", None)
    out["hip"] = getattr(torch.version, "hip", None)
    try:
        from torch._C import _cudnn
        out["cudnn"] = int(_cudnn.getVersionInt())
    except BaseException:
        pass
    try:
        if hasattr(torch._C, "_nccl_version"):
            v = int(torch._C._nccl_version())
            out["nccl"] = "%d.%d.%d" % (v >> 32, (v >> 16) & 65535, v & 65535)
    except BaseException:
        pass
    try:
        out["cuda_initialized"] = bool(torch.cuda.is_initialized())
    except BaseException:
        pass
print("SUPERVISOR_PROBE " + json.dumps(out))
"""


# ---------------------------------------------------------------------------------------------
# Pure helpers


def looks_like_python(arg: str) -> bool:
    """``python``, ``python3.11``, ``/opt/venv/bin/python3`` or ``pypy3``: an interpreter by its name."""
    return bool(_PYTHON_NAME.match(os.path.basename(arg)))


def _shebang_python(path: str, which: Callable[[str], str | None] = shutil.which) -> str | None:
    """The python named by a script's ``#!`` line (console scripts such as ``torchrun``), or None."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(1024)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    first, _, rest = head[2:].decode("utf-8", "replace").partition("\n")
    # pip writes a "#!/bin/sh" trampoline ('''exec' "/long/path/python" "$0" "$@") when the
    # interpreter path is too long for a "#!" line (deep virtualenvs on cluster filesystems).
    trampoline = _PIP_TRAMPOLINE.match(rest)
    if trampoline and looks_like_python(trampoline.group(1)):
        return trampoline.group(1)
    words = first.split()
    if not words:
        return None
    if os.path.basename(words[0]) == "env":  # "#!/usr/bin/env python3" or "env -S python3 -u"
        words = [w for w in words[1:] if not w.startswith("-")]
        return which(words[0]) if words and looks_like_python(words[0]) else None
    return words[0] if looks_like_python(words[0]) else None


def find_child_python(
    argv: Sequence[str], which: Callable[[str], str | None] = shutil.which
) -> tuple[str | None, str]:
    """The interpreter the training child will run, and how it was found.

    Wrappers (``srun``, ``env``, ``torchrun``, ``accelerate launch``) are walked through: the first
    argument that is a python, a console script whose ``#!`` names a python, or a ``.py`` script
    (run by this interpreter, ``sys.executable``) decides.
    """
    for arg in argv:
        if not arg or arg.startswith("-") or "=" in arg and not arg.startswith(("/", ".")):
            continue
        if looks_like_python(arg):
            found = arg if os.sep in arg else which(arg)
            return (found, f"argv names the interpreter {arg!r}") if found else (None, f"{arg!r} not on PATH")
        if arg.endswith(".py"):
            return sys.executable, f"argv runs the script {arg!r}; assuming this interpreter"
        resolved = arg if os.sep in arg else which(arg)
        if resolved and os.path.isfile(resolved):
            interp = _shebang_python(resolved, which)
            if interp:
                return interp, f"{arg!r} is a python console script"
    return None, "no python interpreter or .py script found in argv"


def find_code_dir(argv: Sequence[str], cwd: Path) -> Path:
    """The directory of the training script (first ``.py`` in argv), else the working directory."""
    for arg in argv:
        if arg.endswith(".py") and not arg.startswith("-"):
            script = Path(arg) if os.path.isabs(arg) else cwd / arg
            if script.parent.is_dir():
                return script.parent
    return cwd


def determinism_env(environ: Mapping[str, str]) -> dict[str, str | None]:
    """The determinism-relevant variables; the fixed names are always present (None = unset) so a
    variable set in one attempt and unset in the next shows up as drift."""
    out: dict[str, str | None] = {name: environ.get(name) for name in DETERMINISM_VARS}
    for name in sorted(environ):
        if name.startswith(DETERMINISM_PREFIXES):
            out[name] = environ[name]
    return out


def environment_record(environ: Mapping[str, str]) -> dict[str, Any]:
    """The attempt's environment as ``supervise diagnose`` reruns it: every variable except the
    supervisor's own per-attempt ones; credential-named values replaced by ``[REDACTED]`` (the name
    kept, so a rerun can say it took the current shell's value), token shapes in other values
    redacted; the GPU visibility and CUDA/NCCL/torch variables always kept as they were."""
    keep = {k: v for k, v in environ.items() if not k.startswith(_PER_ATTEMPT_PREFIX)}
    gpu = {k: v for k, v in keep.items() if k in GPU_ENV_NAMES or k.startswith(GPU_ENV_PREFIXES)}
    variables, redacted = redact_env({k: v for k, v in keep.items() if k not in gpu})
    variables.update(gpu)
    return {"variables": dict(sorted(variables.items())), "redacted": sorted(redacted)}


def parse_nvidia_smi(text: str) -> list[dict[str, str]]:
    """``name, driver_version, uuid`` CSV lines (no header) to dicts."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3 and parts[0]:
            gpus.append({"name": parts[0], "driver_version": parts[1], "uuid": parts[2]})
    return gpus


def parse_probe_output(stdout: str) -> dict[str, Any] | None:
    """The probe's JSON line; anything else (warnings printed on import) is ignored."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("SUPERVISOR_PROBE "):
            try:
                data = json.loads(line[len("SUPERVISOR_PROBE "):])
            except ValueError:
                return None
            return data if isinstance(data, dict) else None
    return None


# ---------------------------------------------------------------------------------------------
# Probes (I/O): each returns plain data and never raises


def _run(argv: list[str], timeout: float, **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run a probe in its own session; on timeout kill the whole group (a wrapper script's
    children too), so nothing is left holding the pipes."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            text=True, errors="replace", start_new_session=True, **kw)
    try:
        out, err = proc.communicate(timeout=max(timeout, 0.1))
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.communicate()
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[0][:300] if lines else ""


def probe_git(code_dir: Path, timeout: float) -> dict[str, Any]:
    """Commit and dirty flag of the repository holding the training code."""
    out: dict[str, Any] = {"dir": str(code_dir), "toplevel": None, "commit": None, "dirty": None, "reason": None}
    git = shutil.which("git")
    if git is None:
        out["reason"] = "git not found on PATH"
        return out
    deadline = time.monotonic() + timeout
    # GIT_OPTIONAL_LOCKS=0: "git status" must not take the index lock of a repo the user is editing.
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"}
    try:
        top = _run([git, "-C", str(code_dir), "rev-parse", "--show-toplevel"], timeout, env=env)
        if top.returncode != 0:
            out["reason"] = _first_line(top.stderr) or "not a git repository"
            return out
        out["toplevel"] = top.stdout.strip()
        head = _run([git, "-C", str(code_dir), "rev-parse", "--verify", "HEAD"],
                    deadline - time.monotonic(), env=env)
        if head.returncode != 0:
            out["reason"] = "repository has no commits"
            return out
        out["commit"] = head.stdout.strip()
        status = _run([git, "-C", str(code_dir), "status", "--porcelain", "--untracked-files=no"],
                      deadline - time.monotonic(), env=env)
        if status.returncode != 0:
            out["reason"] = "git status failed: " + _first_line(status.stderr)
            return out
        changed = [ln for ln in status.stdout.splitlines() if ln.strip()]
        out["dirty"] = bool(changed)
        out["changed_files"] = len(changed)
    except subprocess.TimeoutExpired:
        out["reason"] = f"git timed out after {timeout:.0f} s"
    except OSError as exc:
        out["reason"] = f"cannot run git: {exc.strerror}"
    return out


def probe_python(child_python: str | None, how: str, environ: Mapping[str, str], cwd: Path,
                 timeout: float) -> dict[str, Any]:
    """Python/torch/CUDA/cuDNN/NCCL versions as the child's interpreter reports them."""
    keys = ("python", "python_executable", "torch", "cuda", "hip", "cudnn", "nccl")
    out: dict[str, Any] = {k: None for k in keys}
    out.update(interpreter=child_python, found_by=how, reason=None)
    if child_python is None:
        out["reason"] = how
        return out
    env = dict(environ)
    env["CUDA_VISIBLE_DEVICES"] = ""  # no GPU visible: the probe cannot take a CUDA context
    env["HIP_VISIBLE_DEVICES"] = ""
    env.pop("PYTHONSTARTUP", None)
    try:
        proc = _run([child_python, "-c", TORCH_PROBE], timeout, env=env, cwd=str(cwd))
    except subprocess.TimeoutExpired:
        out["reason"] = f"probe timed out after {timeout:.0f} s"
        return out
    except OSError as exc:
        out["reason"] = f"cannot run {child_python}: {exc.strerror}"
        return out
    data = parse_probe_output(proc.stdout)
    if data is None:
        out["reason"] = f"probe exited {proc.returncode}: {_first_line(proc.stderr) or 'no output'}"
        return out
    out.update({k: data.get(k) for k in keys})
    out["cuda_initialized"] = data.get("cuda_initialized")
    if data.get("torch_error"):
        out["reason"] = f"torch not importable: {data['torch_error']}"
    return out


def probe_gpus(timeout: float, search_path: str | None = None) -> dict[str, Any]:
    """GPU names, UUIDs and the driver version from nvidia-smi; null with a reason when absent."""
    smi = shutil.which("nvidia-smi", path=search_path)
    if smi is None:
        return {"gpus": None, "driver": None, "reason": "nvidia-smi not found"}
    try:
        proc = _run([smi, "--query-gpu=name,driver_version,uuid", "--format=csv,noheader"], timeout)
    except subprocess.TimeoutExpired:
        return {"gpus": None, "driver": None, "reason": f"nvidia-smi timed out after {timeout:.0f} s"}
    except OSError as exc:
        return {"gpus": None, "driver": None, "reason": f"cannot run nvidia-smi: {exc.strerror}"}
    if proc.returncode != 0:
        reason = _first_line(proc.stdout) or _first_line(proc.stderr) or f"exit {proc.returncode}"
        return {"gpus": None, "driver": None, "reason": f"nvidia-smi failed: {reason}"}
    gpus = parse_nvidia_smi(proc.stdout)
    drivers = sorted({g["driver_version"] for g in gpus})
    return {"gpus": gpus, "driver": ",".join(drivers) or None, "reason": None}


def hash_files(paths: Sequence[str], cwd: Path) -> list[dict[str, Any]]:
    """sha256 of each training config file; a missing file is recorded, not an error."""
    out = []
    for name in paths:
        path = Path(name) if os.path.isabs(name) else cwd / name
        entry: dict[str, Any] = {"path": str(path), "sha256": None, "size": None, "missing": False}
        try:
            digest = hashlib.sha256()
            with open(path, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(chunk)
            entry["sha256"] = digest.hexdigest()
            entry["size"] = path.stat().st_size
        except FileNotFoundError:
            entry["missing"] = True
        except OSError as exc:
            entry["missing"] = True
            entry["error"] = exc.strerror or str(exc)
        out.append(entry)
    return out


# ---------------------------------------------------------------------------------------------
# The manifest


def collect_manifest(
    *,
    attempt: int,
    argv: list[str],
    config: SupervisorConfig,
    environ: Mapping[str, str],
    cwd: Path,
    child_python: str | None,
    run_dir: Path,
    timeout: float = 20,
) -> dict[str, Any]:
    """Everything §9 asks for, collected in bounded time (the slow probes run in parallel).

    ``child_python`` None means: find it from ``argv`` (see :func:`find_child_python`).
    """
    started = time.monotonic()
    deadline = started + timeout
    cwd = Path(cwd).absolute()
    search_path = environ.get("PATH", os.defpath)  # what the child's exec will search
    if not config.probe_software:
        child_python, how = None, "not probed (probe_software: false)"
    elif child_python is None:
        child_python, how = find_child_python(argv, lambda name: shutil.which(name, path=search_path))
    else:
        how = "given by the caller"
    code_dir = find_code_dir(argv, cwd)

    # Each probe gets a little less than the whole budget so that it ends (and says why) first.
    probe_timeout = max(timeout - min(1.0, timeout * 0.2), 0.1)
    pool = ThreadPoolExecutor(max_workers=3, thread_name_prefix="manifest")
    futures = {
        "git": pool.submit(probe_git, code_dir, probe_timeout),
        "software": pool.submit(probe_python, child_python, how, environ, cwd, probe_timeout),
        "gpu": pool.submit(probe_gpus, probe_timeout, search_path),
    }
    empty: dict[str, dict[str, Any]] = {
        "git": {"dir": str(code_dir), "toplevel": None, "commit": None, "dirty": None},
        "software": {k: None for k in ("python", "python_executable", "torch", "cuda", "hip", "cudnn", "nccl")},
        "gpu": {"gpus": None, "driver": None}}
    # Cheap parts while the probes run.
    manifest: dict[str, Any] = {
        "manifest_version": MANIFEST_VERSION,
        "attempt": attempt,
        "created": time.time(),
        "argv": list(argv),
        "cwd": str(cwd),
        "run_dir": str(run_dir),
        "config_hash": config.config_hash(),
        "config": config.to_dict(),
        "config_files": hash_files(config.config_files, cwd),
        "hosts": {"hostname": socket.gethostname(), "nodelist": environ.get("SLURM_JOB_NODELIST")},
        "slurm": {k: environ[k] for k in sorted(environ) if k.startswith("SLURM_")},
        "determinism": determinism_env(environ),
        "environment": environment_record(environ),
    }
    timed_out = []
    for name, fut in futures.items():
        try:
            manifest[name] = fut.result(timeout=max(deadline - time.monotonic(), 0.01))
        except FutureTimeout:
            timed_out.append(name)
            manifest[name] = dict(empty[name], reason=f"no answer within {timeout:.0f} s")
        except Exception as exc:  # a probe bug must never stop an attempt
            manifest[name] = dict(empty[name], reason=f"probe failed: {type(exc).__name__}: {exc}")
    pool.shutdown(wait=False)
    manifest["collection"] = {"seconds": round(time.monotonic() - started, 3), "timed_out": timed_out}
    return manifest


def write_manifest(path: Path, manifest: Mapping[str, Any]) -> None:
    """Atomic write (a reader, or a killed supervisor, never sees half a manifest), credentials
    redacted (argv, config, environment), owner only: it holds the attempt's environment."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    clean = redact_value(dict(manifest))
    write_atomic(path, (json.dumps(clean, indent=2, sort_keys=False, default=str) + "\n").encode(), MANIFEST_MODE)


def read_manifest(path: Path) -> dict[str, Any] | None:
    """A manifest, or None when missing or unreadable (reports go on without it)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
