"""Shared fixtures. The Slurm ones start the throwaway cluster (tests/slurm_cluster.py) once per session.

Rule: with ``CI`` set (CI=true), a cluster that cannot start FAILS every test that needs it; outside
CI those tests are skipped with the reason. Any test that uses ``slurm_cluster`` (directly or through
``slurm_job_dir``) is marked ``slurm`` automatically.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # so tests can `import slurm_cluster`

import slurm_cluster as cluster_lib  # noqa: E402

SLURM_FIXTURES = frozenset({"slurm_cluster", "slurm_job_dir"})


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if SLURM_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slurm)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[cluster_lib.Cluster]:
    """A running two-node cluster (n1, n2; partitions ``extra`` preemptible, ``own`` preempting).

    Use ``cluster.env`` for every Slurm command and ``cluster.run_job(script_text, *sbatch_args)``
    to run a job to its end (-> JobResult: job_id, info, output). Set SLURM_TEST_KEEP=1 to keep the
    cluster directory (logs, state) after the session.
    """
    keep = os.environ.get("SLURM_TEST_KEEP", "") not in ("", "0")
    try:
        cluster = cluster_lib.start_cluster(owner_pid=os.getpid(), die_with_owner=True)
    except cluster_lib.ClusterError as exc:
        message = f"the Slurm test cluster could not start: {exc}"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    try:
        yield cluster
    finally:
        cluster.stop(keep=keep)


@pytest.fixture
def slurm_job_dir(slurm_cluster: cluster_lib.Cluster, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A fresh directory the test's jobs can write to (under the cluster's shared dir). After the
    test, jobs it left behind are cancelled so the next test starts on idle nodes."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)[:80]
    path = slurm_cluster.shared_dir / name
    path.mkdir(parents=True, exist_ok=True)
    try:
        yield path
    finally:
        slurm_cluster.cancel_all()
        try:
            slurm_cluster.wait_idle(timeout=20)
        except cluster_lib.ClusterError:
            pass  # the next test's own waits will say what is wrong
