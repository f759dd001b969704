"""Shared fixtures. The Slurm ones start the throwaway cluster (tests/slurm_cluster.py) once per session.

Rule: with ``CI`` set (CI=true), a cluster that cannot start FAILS every test that needs it; outside
CI those tests are skipped with the reason. Any test that uses ``slurm_cluster`` (directly or through
``slurm_job_dir``) is marked ``slurm`` automatically.

Versions: every such test runs once per Slurm version picked by ``--slurm=...`` or
``$SLURM_TEST_VERSIONS`` (comma list: the host's own version, e.g. ``22.05``, or ``host``; ``24.11``;
``26.05``; ``all``), default the host's only. The version is in the test id:
``test_x[slurm-24.11]``. A root version runs its cluster, its client commands and its jobs inside a
Debian root (tests/slurm_roots/; built on first use, cached after). Tests stay version-agnostic:
``slurm_cluster.run(["sbatch", ...])``, ``slurm_cluster.env`` for any subprocess, and
``slurm_cluster.version`` / ``slurm_version`` where behaviour really differs.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # so tests can `import slurm_cluster`

import slurm_cluster as cluster_lib

# Every supervisor a test starts (and every job it submits: sbatch passes the environment on) writes
# node health to a ledger of this test session, never to the user's own (~/.cache): a test's
# deliberate GPU failure must not get a real node excluded, nor one test's nodes another's.
_LEDGER_DIR = Path(os.environ.get("PYTEST_NODES_LEDGER_DIR") or f"/tmp/supervise-test-ledger-{os.getpid()}")
os.environ.setdefault("SUPERVISE_NODES__LEDGER", str(_LEDGER_DIR / "nodes.jsonl"))
# The manifest's software probe starts the child's interpreter and imports torch at every attempt
# (1-5 s of CPU, and a short run waits for it before exiting): hundreds of test runs would pay it
# for nothing. The tests of the probe itself turn it back on (SUPERVISE_PROBE_SOFTWARE=true).
os.environ.setdefault("SUPERVISE_PROBE_SOFTWARE", "false")
# pytest-xdist sets COLUMNS=80 in its workers (for its own output); the text the tests read must be
# laid out as in a plain run (no COLUMNS: 100 columns into a pipe), whichever way pytest was started.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)

SLURM_FIXTURES = frozenset({"slurm_cluster", "slurm_job_dir", "slurm_version"})
# Not SUPERVISE_*: the supervisor reads every SUPERVISE_* variable as a config key (and refuses
# unknown ones), and jobs inherit the test's environment. SLURM_* is kept out of jobs by Cluster.env.
VERSIONS_ENV = "SLURM_TEST_VERSIONS"


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--slurm", action="store", default=None, metavar="VERSIONS",
        help=f"Slurm versions for the slurm-marked tests, comma-separated: the host's (e.g. 22.05, or 'host'), "
             f"{', '.join(sorted(cluster_lib.ROOT_VERSIONS))}, or 'all' (default: ${VERSIONS_ENV}, else the host's)",
    )


def slurm_versions(config: pytest.Config) -> list[str]:
    """The version labels to run the Slurm tests on, in order, without duplicates."""
    cached = getattr(config, "_slurm_versions", None)
    if cached is not None:
        return cached
    host = cluster_lib.host_version_label() or "host"
    text = config.getoption("--slurm") or os.environ.get(VERSIONS_ENV, "")
    labels: list[str] = []
    for item in (part.strip() for part in text.split(",")):
        if item == "all":
            wanted = [host, *sorted(cluster_lib.ROOT_VERSIONS)]
        elif item in ("", "host"):
            wanted = [host] if item == "host" else []
        elif item == host or item in cluster_lib.ROOT_VERSIONS:
            wanted = [item]
        else:
            raise pytest.UsageError(
                f"{VERSIONS_ENV}/--slurm: unknown Slurm version {item!r}; use the host's ({host}), "
                f"{', '.join(sorted(cluster_lib.ROOT_VERSIONS))}, host or all"
            )
        labels += [w for w in wanted if w not in labels]
    config._slurm_versions = labels or [host]  # type: ignore[attr-defined]
    return config._slurm_versions  # type: ignore[attr-defined]


def pytest_report_header(config: pytest.Config) -> str:
    return f"slurm versions for slurm-marked tests: {', '.join(slurm_versions(config))}"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "slurm_version" in metafunc.fixturenames:
        labels = slurm_versions(metafunc.config)
        metafunc.parametrize("slurm_version", labels, ids=[f"slurm-{v}" for v in labels], scope="session",
                             indirect=True)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups below
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if SLURM_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slurm)
        item.add_marker(pytest.mark.xdist_group(_worker_group(item)))


def _worker_group(item: pytest.Item) -> str:
    """Which tests must share a worker under ``pytest -n N --dist loadgroup`` (what CI runs).

    Every Slurm-marked test of one version goes to one worker: the session's cluster is started once
    per worker, and one cluster per version at a time is what these tests are written for (their
    jobs wait on each other's nodes). Every other test stays with the rest of its file, so a file's
    module-scoped fixtures (a whole supervised run, a built model) are made once, not once per worker.
    Without xdist the marker is inert.
    """
    if item.get_closest_marker("slurm") is not None:
        callspec = getattr(item, "callspec", None)
        version = callspec.params.get("slurm_version", "host") if callspec is not None else "host"
        return f"slurm-{version}"
    return item.nodeid.split("::", 1)[0].replace("/", ".")


@pytest.fixture(scope="session")
def slurm_version(request: pytest.FixtureRequest) -> str:
    """The Slurm version label this test runs against (``22.05``, ``24.11``, ``26.05``)."""
    return request.param


@pytest.fixture(scope="session")
def slurm_cluster(slurm_version: str) -> Iterator[cluster_lib.Cluster]:
    """A running two-node cluster (n1, n2; partitions ``extra`` preemptible, ``own`` preempting) of
    Slurm ``slurm_version``; one at a time (pytest groups the tests by version).

    Use ``cluster.run([...])`` / ``cluster.env`` for every Slurm command and
    ``cluster.run_job(script_text, *sbatch_args)`` to run a job to its end (-> JobResult: job_id,
    info, output). Set SLURM_TEST_KEEP=1 to keep the cluster directory (logs, state) after the session.
    """
    keep = os.environ.get("SLURM_TEST_KEEP", "") not in ("", "0")
    try:
        install = cluster_lib.install_for(slurm_version)
        cluster = cluster_lib.start_cluster(owner_pid=os.getpid(), die_with_owner=True, install=install)
    except cluster_lib.ClusterError as exc:
        message = f"the Slurm {slurm_version} test cluster could not start: {exc}"
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


@pytest.fixture(autouse=True)
def _supervisor_logger_as_it_was() -> Iterator[None]:
    """A CLI command run in-process (click's CliRunner) points the ``supervisor`` logger at its own
    stderr handler and stops propagation (supervisor/cli/common.py); restored after each test, so a
    later test's ``caplog`` sees the records whatever ran before it on the same worker."""
    logger = logging.getLogger("supervisor")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved

