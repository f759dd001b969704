"""pyslurm for a test cluster: build (or reuse) it and ask both backends through tests/pyslurm_probe.py.

pyslurm exists for two of the test clusters' releases (tests/vendor/pyslurm/README.md): 22.05 (the
host) and 24.11 (its Debian root). 26.05 has none upstream, so nothing here runs there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from slurm_cluster import REPO, Cluster, ClusterError

BUILD_SCRIPT = REPO / "tests" / "vendor" / "pyslurm" / "build.sh"
PROBE = REPO / "tests" / "pyslurm_probe.py"
PYSLURM_RELEASES = ("22.05", "24.11")  # releases with a vendored pyslurm source


def build_pyslurm(label: str) -> str:
    """The PYTHONPATH entry holding pyslurm for Slurm ``label``, as that cluster's processes see it
    (built on the first call; a cached build takes about a second)."""
    proc = subprocess.run(["bash", str(BUILD_SCRIPT), label], capture_output=True, text=True, check=False,
                          timeout=1800, env={**os.environ, "PYTHON": sys.executable})
    if proc.returncode != 0:
        raise ClusterError(f"building pyslurm for Slurm {label} failed:\n{proc.stderr[-3000:]}")
    return proc.stdout.strip().splitlines()[-1]


def probe_env(cluster: Cluster, site: str) -> dict[str, str]:
    """The cluster's environment with the repository and that pyslurm on PYTHONPATH."""
    return {**cluster.env, "PYTHONPATH": os.pathsep.join([str(REPO), site])}


def probe(cluster: Cluster, site: str, *ops: list[Any], timeout: float = 120.0) -> list[Any]:
    """Run the operations in one probe process inside the cluster's install; one answer each
    (``{"ok": value}`` or ``{"error": message}``)."""
    argv = [*cluster.install.prefix(), sys.executable, str(PROBE), json.dumps(list(ops))]
    proc = subprocess.run(argv, env=probe_env(cluster, site), capture_output=True, text=True, check=False,
                          timeout=timeout, cwd=REPO)
    if proc.returncode != 0:
        raise AssertionError(f"pyslurm_probe exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    answers = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(answers) == len(ops), proc.stdout + proc.stderr
    return answers


def ok(answer: dict[str, Any]) -> Any:
    assert "ok" in answer, f"the probe's call failed: {answer.get('error')}"
    return answer["ok"]


def site_path_on_host(cluster: Cluster, site: str) -> Path:
    """Where that PYTHONPATH entry is on the host (inside the root for a root's pyslurm)."""
    return Path(site) if cluster.install.root is None else cluster.install.root / site.lstrip("/")
