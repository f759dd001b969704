"""A throwaway two-node Slurm cluster on this one host, for the tests and for a person.

Everything lives in one directory of its own: a munge key and a munged on its own socket, a
slurm.conf with free ports picked at start, slurmctld and two slurmd (``n1``, ``n2``), their state,
spool, pid and log files. Nothing global is touched: no /etc/slurm, no system munged, no systemd;
commands reach this cluster only through ``Cluster.env`` (``SLURM_CONF`` points at our slurm.conf).
Recipe: docs/design.md, docs/slurm-versions.md

A person::

    python tests/slurm_cluster.py start [--dir DIR] [--grace 10]   # prints the export line
    python tests/slurm_cluster.py status [--dir DIR]
    python tests/slurm_cluster.py stop [--dir DIR] [--keep]

Tests: ``start_cluster(base_dir) -> Cluster`` (conftest.py wraps it in a session fixture).
Runs as root (SlurmUser=root), as in CI.

Other Slurm versions: ``start_cluster(install=root_install("24.11"))`` runs the same recipe with the
daemons of a Debian root (tests/slurm_roots/build.sh builds it; trixie gives 24.11, sid 26.05).
Every daemon and every client command then runs inside that root through tests/slurm_roots/enter.sh
(a private mount namespace + chroot; the repository, the temp dir and this Python are bound at the
same paths, so paths and ``sys.executable`` mean the same inside and out). ``Cluster.env`` puts
shims of the client commands (sbatch, scontrol, squeue, scancel, sinfo, sacct, srun, ...) first on
PATH, so ``cluster.run(["sbatch", ...])``, ``SlurmCli(env=cluster.env)`` and any subprocess given
``env=cluster.env`` reach the root's commands; a job submitted that way runs inside the root, and
its own ``scontrol`` (the supervisor's) is the root's too. The host's own Slurm needs none of this.

A person::

    python tests/slurm_cluster.py start --slurm 24.11      # builds the root first when needed
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import itertools
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from slurm_accounting import Accounting, QosSetup, start_accounting
from supervisor.slurm import SlurmVersion
from supervisor.slurm.parse import (
    FINISHED_STATES,
    JobInfo,
    parse_sbatch_job_id,
    parse_scontrol_job,
    parse_version,
)

REPO = Path(__file__).resolve().parent.parent
ROOTS_DIR_ENV = "SLURM_TEST_ROOTS"  # where tests/slurm_roots/build.sh keeps its roots
DEFAULT_ROOTS_DIR = Path("/var/cache/slurm-supervisor/roots")
BUILD_SCRIPT = REPO / "tests" / "slurm_roots" / "build.sh"
ENTER_SCRIPT = REPO / "tests" / "slurm_roots" / "enter.sh"
ROOT_VERSIONS = {"24.11": "trixie", "26.05": "sid"}  # what build.sh knows how to build
CLIENT_COMMANDS = ("sbatch", "srun", "salloc", "scontrol", "squeue", "scancel", "sinfo", "sacct", "sstat",
                   "sprio", "sshare", "sdiag", "sattach", "strigger", "sacctmgr")

DIR_PREFIX = "slurm-test-cluster-"  # fixture dirs: <tmp>/slurm-test-cluster-XXXX (owner pid recorded)
MANUAL_DIR_NAME = "slurm-test-cluster"  # default dir of the command line; never auto-cleaned
MARKER_ENV = "SLURM_TEST_CLUSTER_DIR"  # set in every daemon's environment; slurmstepd inherits it
NODES = ("n1", "n2")
CPUS_PER_NODE = 2  # declared, not detected (config_overrides): one --exclusive job fills a node
DEFAULT_GRACE = 10
DEFAULT_CRED_EXPIRE = 10  # also the BeginTime wait of a requeued job (+1 s); Slurm's minimum is 5
REQUIRED_BINARIES = ("munged", "slurmctld", "slurmd", "scontrol", "sbatch", "srun", "squeue", "scancel", "sinfo")


class ClusterError(RuntimeError):
    """The test cluster could not start or answer; the message says what and where the logs are."""


@dataclass(frozen=True)
class SlurmInstall:
    """Where one Slurm version's binaries live: the host's own (``root`` None), or a Debian root
    entered through tests/slurm_roots/enter.sh with ``binds`` (host paths seen at the same path
    inside)."""

    root: Path | None = None
    binds: tuple[str, ...] = ()

    @property
    def is_host(self) -> bool:
        return self.root is None

    def prefix(self) -> list[str]:
        """What goes before a command to run it with this install's Slurm (empty on the host)."""
        if self.root is None:
            return []
        return [str(ENTER_SCRIPT), str(self.root), *self.binds, "--"]

    def binary(self, name: str) -> str:
        """The path of a Slurm/munge program as the command sees it (inside the root for a root)."""
        if self.root is None:
            return _binary(name)
        for folder in ("/usr/sbin", "/usr/bin", "/sbin", "/bin"):
            if (self.root / folder.lstrip("/") / name).exists():
                return f"{folder}/{name}"
        raise ClusterError(f"{name} not found in the Slurm root {self.root}; rebuild it: {BUILD_SCRIPT}")

    def missing(self) -> list[str]:
        if self.root is None:
            return missing_binaries()
        return [n for n in REQUIRED_BINARIES
                if not any((self.root / d / n).exists() for d in ("usr/sbin", "usr/bin", "sbin", "bin"))]

    def to_state(self) -> dict:
        return {"root": str(self.root) if self.root else None, "binds": list(self.binds)}

    @classmethod
    def from_state(cls, state: dict) -> SlurmInstall:
        root = state.get("root")
        return cls(Path(root), tuple(state.get("binds") or ())) if root else cls()


HOST = SlurmInstall()


def roots_dir() -> Path:
    return Path(os.environ.get(ROOTS_DIR_ENV, "").strip() or DEFAULT_ROOTS_DIR)


def default_binds() -> tuple[str, ...]:
    """Host paths a root must see at the same path: the repository (tests, children, examples,
    the editable install), the temp dir (cluster dirs, pytest's tmp_path) and this interpreter's
    prefix (its stdlib and site-packages: torch included), plus $SLURM_TEST_ROOT_BINDS."""
    wanted = [str(REPO), tempfile.gettempdir(), sys.prefix, sys.base_prefix]
    wanted += [p for p in os.environ.get("SLURM_TEST_ROOT_BINDS", "").split(os.pathsep) if p.strip()]
    binds: list[str] = []
    for path in sorted({str(Path(p).resolve()) for p in wanted}, key=len):
        if path in ("/", "/usr", "/etc", "/var", "/lib", "/bin", "/sbin", "/proc", "/dev", "/sys"):
            raise ClusterError(
                f"cannot bind {path} into a Slurm root (it is the root's own); run the tests with an "
                "interpreter that lives outside /usr (pyenv, /usr/local, /opt, conda)"
            )
        if not any(path == b or path.startswith(b + "/") for b in binds):
            binds.append(path)
    return tuple(binds)


def root_install(version: str, build: bool = True, base: Path | None = None) -> SlurmInstall:
    """The Debian root holding Slurm ``version`` (e.g. "24.11"); built first (cached: seconds when
    it exists) unless ``build`` is False."""
    if version not in ROOT_VERSIONS:
        known = ", ".join(sorted(ROOT_VERSIONS))
        raise ClusterError(f"no Slurm root recipe for {version} (known: {known}; the host has its own)")
    root = (base or roots_dir()) / version
    if build:
        proc = subprocess.run(["bash", str(BUILD_SCRIPT), version, str(root)], capture_output=True, text=True, check=False,
                              timeout=3600)
        if proc.returncode != 0:
            raise ClusterError(f"building the Slurm {version} root failed:\n{proc.stderr[-3000:]}")
    if not (root / ".slurm-root.json").exists():
        raise ClusterError(f"no complete Slurm {version} root at {root}; build it: {BUILD_SCRIPT} {version}")
    return SlurmInstall(root, default_binds())


def host_version_label() -> str | None:
    """``22.05`` for the host's own Slurm, None when it is not installed."""
    try:
        major, minor, _ = installed_version(HOST)
    except (ClusterError, OSError, subprocess.SubprocessError, ValueError):
        return None
    return f"{major}.{minor:02d}"


def install_for(label: str) -> SlurmInstall:
    """``host``, the host's version (``22.05``), or a root version (``24.11``, ``26.05``)."""
    if label in ("host", host_version_label()):
        return HOST
    return root_install(label)


@dataclass(frozen=True)
class JobResult:
    """A finished job: its final state as scontrol shows it, and its output file's text."""

    job_id: int
    info: JobInfo
    output: str


def _clean_environ(base: dict[str, str]) -> dict[str, str]:
    """The caller's environment without any Slurm job variables: running the tests from inside a
    real Slurm job must not make our sbatch/srun think they are inside that job."""
    prefixes = ("SLURM_", "SLURMD_", "SBATCH_", "SRUN_", "SALLOC_", "SQUEUE_", "SCONTROL_", "SINFO_")
    return {k: v for k, v in base.items() if not k.startswith(prefixes) and k != MARKER_ENV}


class Cluster:
    """A running throwaway cluster rooted at ``base_dir``."""

    def __init__(self, base_dir: Path, install: SlurmInstall | None = None) -> None:
        self.base_dir = Path(base_dir).resolve()
        self.conf_path = self.base_dir / "etc" / "slurm.conf"
        self.shared_dir = self.base_dir / "shared"  # jobs and tests may write here
        self.log_dir = self.base_dir / "log"
        self.shim_dir = self.base_dir / "bin"
        self.nodes = NODES
        self.install = install if install is not None else SlurmInstall.from_state(self.read_state())
        self.env: dict[str, str] = _clean_environ(dict(os.environ))
        self.env["SLURM_CONF"] = str(self.conf_path)
        if not self.install.is_host:
            self.env["PATH"] = f"{self.shim_dir}{os.pathsep}{self.env.get('PATH', os.defpath)}"
            self.env["SLURM_ROOT_SHIMS"] = str(self.shim_dir)
        self._script_numbers = itertools.count(1)

    # ---- state file -------------------------------------------------------------------------
    @property
    def state_file(self) -> Path:
        return self.base_dir / "cluster.json"

    def read_state(self) -> dict:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}

    @property
    def grace_time(self) -> int:
        return int(self.read_state().get("grace_time", DEFAULT_GRACE))

    @property
    def version(self) -> SlurmVersion:
        """The Slurm version of this cluster's daemons and commands, e.g. SlurmVersion(24, 11, 5):
        a tuple with the capability properties the supervisor uses (requeues_on_exit_during_grace...)."""
        recorded = self.read_state().get("slurm_version")
        return SlurmVersion.of(recorded) if recorded else installed_version(self.install)  # type: ignore[return-value]

    @property
    def label(self) -> str:
        """``22.05`` / ``24.11`` / ``26.05``: the version as test ids name it."""
        major, minor, _ = self.version
        return f"{major}.{minor:02d}"

    # ---- commands ----------------------------------------------------------------------------
    def run(
        self, argv: Sequence[str], timeout: float = 20.0, check: bool = True, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this cluster (argv list, never a shell), with this
        cluster's version of the command (inside its root when it has one)."""
        proc = subprocess.run([str(a) for a in argv], env=self.env, capture_output=True, text=True, check=False,
                              timeout=timeout, cwd=cwd)
        if check and proc.returncode != 0:
            said = proc.stderr.strip() or proc.stdout.strip()
            raise ClusterError(f"{' '.join(map(str, argv))} exited {proc.returncode}: {said}")
        return proc

    command = run  # the older name

    def scontrol(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.command(["scontrol", *args], check=check)

    def sbatch(self, script: str | Path, *args: str, cwd: Path | None = None) -> int:
        """Submit ``script`` (a path, or the text of a script, written under the cluster dir)."""
        path = self._script_path(script)
        proc = self.command(["sbatch", "--parsable", *args, str(path)], cwd=cwd or self.shared_dir)
        return parse_sbatch_job_id(proc.stdout)

    def job_info(self, job_id: int | str) -> dict[str, str] | None:
        """The raw ``Key=Value`` fields of ``scontrol show job -o``; None once the job is gone."""
        info = self.job(job_id)
        return None if info is None else dict(info.raw)

    def job_text(self, job_id: int | str) -> str | None:
        """The exact ``scontrol show job -o`` text (for captured test data), None once gone."""
        proc = self.scontrol("show", "job", "-o", str(job_id), check=False)
        if proc.returncode != 0:
            if "Invalid job id" in proc.stderr:
                return None
            raise ClusterError(f"scontrol show job {job_id}: {proc.stderr.strip()}")
        return proc.stdout

    def job(self, job_id: int | str) -> JobInfo | None:
        """The parsed job (``info.raw`` holds every field); None once the job is gone."""
        text = self.job_text(job_id)
        return None if text is None else parse_scontrol_job(text, job_id)

    def wait_state(
        self, job_id: int | str, states: str | Sequence[str], timeout: float = 60.0, min_restarts: int = 0
    ) -> JobInfo:
        """Poll until the job's JobState is one of ``states`` (and Restarts >= min_restarts)."""
        wanted = {states} if isinstance(states, str) else set(states)
        deadline = time.monotonic() + timeout
        last: JobInfo | None = None
        while True:
            last = self.job(job_id)
            if last is not None and last.state in wanted and last.restarts >= min_restarts:
                return last
            if time.monotonic() > deadline:
                seen = "gone" if last is None else f"{last.state} reason={last.reason} restarts={last.restarts}"
                raise ClusterError(f"job {job_id} not in {sorted(wanted)} after {timeout:.0f}s (last: {seen})")
            time.sleep(0.2)

    def wait_finished(self, job_id: int | str, timeout: float = 60.0) -> JobInfo:
        return self.wait_state(job_id, FINISHED_STATES, timeout)

    def run_job(
        self, script: str | Path, *args: str, timeout: float = 60.0, cwd: Path | None = None, min_restarts: int = 0
    ) -> JobResult:
        """Submit, wait until the job has finished for good (after at least ``min_restarts``
        requeues), return its final info and output (StdOut; use --open-mode=append to keep
        the output of every run of a requeued job)."""
        job_id = self.sbatch(script, *args, cwd=cwd)
        info = self.wait_state(job_id, FINISHED_STATES, timeout, min_restarts=min_restarts)
        output = Path(info.std_out).read_text(errors="replace") if info.std_out and Path(info.std_out).exists() else ""
        return JobResult(job_id, info, output)

    def preempt(self, node: str, seconds: float = 1, output: str = "/dev/null") -> int:
        """Preempt whatever runs on ``node``: a short exclusive job in the high-priority partition
        ``own``. The victim (partition ``extra``, which must fill the node: --exclusive) gets
        GraceTime, its steps SIGTERM at once."""
        return self.sbatch(f"sleep {seconds}\n", "-p", "own", "-N1", "--exclusive", "-w", node, "-o", output)

    def set_grace(self, seconds: int) -> None:
        """Change GraceTime of the preemptible partition ``extra`` (takes effect for new preemptions)."""
        self.scontrol("update", "PartitionName=extra", f"GraceTime={int(seconds)}")
        state = self.read_state()
        state["grace_time"] = int(seconds)
        _write_json(self.state_file, state)

    @contextlib.contextmanager
    def grace(self, seconds: int) -> Iterator[None]:
        """GraceTime=seconds for the duration of a ``with`` block, then back to what it was."""
        before = self.grace_time
        self.set_grace(seconds)
        try:
            yield
        finally:
            self.set_grace(before)

    def resume_node(self, node: str, timeout: float = 60.0) -> None:
        """Bring a node set DOWN/DRAIN back (RESUME is refused while it still has a job completing)."""
        deadline = time.monotonic() + timeout
        while True:
            proc = self.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
            state = self.node_states().get(node, "")
            if state in ("idle", "alloc", "mix"):
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"node {node} did not come back: {state} ({proc.stderr.strip()})")
            time.sleep(0.3)

    def node_states(self) -> dict[str, str]:
        proc = self.command(["sinfo", "-h", "-N", "-o", "%N %t"], check=False, timeout=10)
        states: dict[str, str] = {}
        for line in proc.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2:
                states[parts[0]] = parts[1]
        return states

    def queued_jobs(self) -> list[str]:
        proc = self.command(["squeue", "-h", "-o", "%i %T"], check=False, timeout=10)
        return [line for line in proc.stdout.splitlines() if line.strip()]

    def cancel_all(self) -> None:
        """Cancel every job of this cluster (tests only: the product never cancels)."""
        proc = self.command(["squeue", "-h", "-o", "%i"], check=False, timeout=10)
        ids = [line.strip() for line in proc.stdout.splitlines() if line.strip()]
        if ids:
            self.command(["scancel", *ids], check=False, timeout=10)

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Wait until no job is queued or running and both nodes are idle."""
        deadline = time.monotonic() + timeout
        while True:
            states = self.node_states()
            jobs = self.queued_jobs()
            if not jobs and states and all(s == "idle" for s in states.values()) and set(states) == set(self.nodes):
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"cluster not idle after {timeout:.0f}s: nodes={states} jobs={jobs}")
            time.sleep(0.2)

    def alive(self) -> bool:
        pids = self.read_state().get("pids", {})
        return bool(pids) and all(_is_ours(pid, self.base_dir) for pid in pids.values())

    def log_tail(self, lines: int = 15) -> str:
        out = []
        for path in sorted(self.log_dir.glob("*.log")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {path}\n" + "\n".join(text))
        return "\n".join(out)

    def stop(self, keep: bool = False) -> None:
        """Cancel jobs, stop the daemons, kill anything left that belongs to this cluster, and
        remove the directory unless ``keep``."""
        stop_cluster_dir(self.base_dir, keep=keep)

    def _script_path(self, script: str | Path) -> Path:
        if isinstance(script, Path):
            return script
        if "\n" not in script and Path(script).is_file():
            return Path(script)
        number = next(self._script_numbers)  # atomic under the GIL: threads never share a file
        scripts = self.base_dir / "scripts"
        scripts.mkdir(exist_ok=True)
        path = scripts / f"job-{os.getpid()}-{number}.sh"
        text = script if script.startswith("#!") else "#!/bin/bash\n" + script
        path.write_text(text)
        path.chmod(0o755)
        return path


# ---- start ---------------------------------------------------------------------------------------
def missing_binaries() -> list[str]:
    return [name for name in REQUIRED_BINARIES if shutil.which(name) is None and not Path("/usr/sbin", name).exists()]


def start_cluster(
    base_dir: Path | str | None = None,
    grace_time: int = DEFAULT_GRACE,
    cred_expire: int = DEFAULT_CRED_EXPIRE,
    owner_pid: int | None = None,
    die_with_owner: bool = False,
    timeout: float = 30.0,
    install: SlurmInstall = HOST,
    accounting: QosSetup | None = None,
) -> Cluster:
    """Start munged, slurmctld and two slurmd in ``base_dir`` (a fresh temp dir when None) and wait
    until both nodes are idle. ``owner_pid``: the process whose death makes the cluster stale (a
    later start cleans it up); ``die_with_owner``: the daemons get SIGTERM when the caller dies;
    ``install``: the host's Slurm, or a root's (:func:`root_install`); ``accounting``: also a
    MariaDB and a slurmdbd, QOS preemption (``preempt/qos``) with QOS ``extra`` set up so
    (tests/slurm_accounting.py)."""
    missing = install.missing()
    if missing:
        where = "" if install.is_host else f" in the root {install.root}"
        raise ClusterError(
            f"Slurm/munge not installed{where} (missing: {', '.join(missing)}); install with "
            + ("`apt-get install -y slurm-wlm munge`" if install.is_host else f"{BUILD_SCRIPT}")
        )
    if os.geteuid() != 0:
        raise ClusterError("the test cluster runs its daemons as root (SlurmUser=root); run the tests as root")
    clean_stale_clusters()
    if base_dir is None:
        base_dir = Path(tempfile.mkdtemp(prefix=DIR_PREFIX))
    base = Path(base_dir).resolve()
    last_error: ClusterError | None = None
    for _ in range(3):  # a port picked as free may be taken by someone else before we bind it
        if base.exists() and (base / "cluster.json").exists():
            stop_cluster_dir(base, keep=True)
        try:
            return _start_once(base, grace_time, cred_expire, owner_pid, die_with_owner, timeout, install,
                               accounting)
        except ClusterError as exc:
            last_error = exc
            if "Address already in use" not in str(exc):
                break
    stop_cluster_dir(base, keep=True)
    raise last_error  # type: ignore[misc]


def _start_once(
    base: Path, grace_time: int, cred_expire: int, owner_pid: int | None, die_with_owner: bool, timeout: float,
    install: SlurmInstall = HOST,
    accounting: QosSetup | None = None,
) -> Cluster:
    for sub in ("etc", "state", "log", "run", "shared", "scripts", *(f"spool-{n}" for n in NODES)):
        (base / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(base, 0o755)
    os.chmod(base / "shared", 0o1777)
    cluster = Cluster(base, install)
    if not install.is_host:
        write_shims(cluster.shim_dir, install)
    key = base / "etc" / "munge.key"
    if not key.exists():
        key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    ports = _free_ports(1 + len(NODES) + (2 if accounting else 0))
    acct = Accounting(base, ports.pop(), ports.pop(), accounting) if accounting else None
    version = installed_version(install)
    conf = render_slurm_conf(base, ports, grace_time=grace_time, cred_expire=cred_expire, version=version,
                             overrides=acct.conf_lines() if acct else None)
    cluster.conf_path.write_text(conf)
    (base / "etc" / "plugstack.conf").write_text("")
    if version.has_cgroup_plugin_disabled:  # no cgroups here; CgroupPlugin=disabled exists from 24.05
        (base / "etc" / "cgroup.conf").write_text("CgroupPlugin=disabled\nIgnoreSystemd=yes\n")
    state = {
        "base_dir": str(base),
        "owner_pid": owner_pid,
        "owner_start": _proc_start_time(owner_pid) if owner_pid else None,
        "ports": ports,
        "slurm_version": list(version),
        "grace_time": grace_time,
        "cred_expire": cred_expire,
        **install.to_state(),
        "pids": {},
    }
    _write_json(cluster.state_file, state)
    daemon_env = dict(cluster.env)
    daemon_env[MARKER_ENV] = str(base)
    sock = base / "run" / "munge.sock"
    commands = {
        "munged": [
            install.binary("munged"), "-F", "--force", f"--socket={sock}", f"--key-file={key}",
            f"--pid-file={base / 'run' / 'munged.pid'}", f"--log-file={base / 'log' / 'munged.log'}",
            f"--seed-file={base / 'run' / 'munged.seed'}",
        ],
        "slurmctld": [install.binary("slurmctld"), "-D", "-c", "-i", "-f", str(cluster.conf_path)],
        **{f"slurmd-{n}": [install.binary("slurmd"), "-D", "-N", n, "-f", str(cluster.conf_path)] for n in NODES},
    }
    deadline = time.monotonic() + timeout + (120 if acct else 0)  # a database's first start: tens of seconds

    def spawn(name: str, argv: list[str], in_root: bool) -> int:
        state["pids"][name] = _spawn((install.prefix() if in_root else []) + argv, daemon_env,
                                     base / "log" / f"{name}.stderr", die_with_owner)
        _write_json(cluster.state_file, state)
        return state["pids"][name]

    try:
        for name, argv in commands.items():
            if name == "slurmctld" and acct is not None:
                start_accounting(cluster, acct, spawn, lambda ok, what: _wait_for(ok, deadline, what, cluster))
                state["accounting"] = acct.to_state()
                _write_json(cluster.state_file, state)
            state["pids"][name] = _spawn(install.prefix() + argv, daemon_env, base / "log" / f"{name}.stderr", die_with_owner)
            _write_json(cluster.state_file, state)
            if name == "munged":
                _wait_for(lambda: sock.exists(), deadline, "munged did not create its socket", cluster)
            elif name == "slurmctld":
                _wait_for(lambda: cluster.command(["scontrol", "ping"], check=False, timeout=5).returncode == 0,
                          deadline, "slurmctld did not answer `scontrol ping`", cluster)
        _wait_for(lambda: _all_idle(cluster), deadline, "nodes n1, n2 did not become idle", cluster)
    except BaseException:
        stop_cluster_dir(base, keep=True)
        raise
    return cluster


def installed_version(install: SlurmInstall = HOST) -> SlurmVersion:
    """The installed slurmctld's version (``slurmctld -V`` needs no config)."""
    proc = subprocess.run([*install.prefix(), install.binary("slurmctld"), "-V"], capture_output=True, text=True,
                          check=False,
                          timeout=20)
    return parse_version(proc.stdout + proc.stderr)


def write_shims(shim_dir: Path, install: SlurmInstall) -> None:
    """One tiny script per client command, running the root's command through enter.sh."""
    shim_dir.mkdir(parents=True, exist_ok=True)
    for name in CLIENT_COMMANDS:
        try:
            inside = install.binary(name)
        except ClusterError:
            continue
        words = " ".join(shlex.quote(w) for w in [*install.prefix(), inside])
        path = shim_dir / name
        path.write_text(f'#!/bin/sh\n# {name} of {install.root}\nexec {words} "$@"\n')
        path.chmod(0o755)


def render_slurm_conf(
    base: Path, ports: Sequence[int], grace_time: int, cred_expire: int,
    version: SlurmVersion | tuple[int, int, int] = (22, 5, 8), overrides: Mapping[str, str] | None = None,
) -> str:
    """The slurm.conf of the throwaway cluster, verified on 22.05.8, 24.11.5 and 26.05.5; the lines
    that change with the release are picked by SlurmVersion capabilities (docs/slurm-versions.md).
    ``overrides``: ``Key=value`` lines that replace the recipe's (accounting, QOS preemption)."""
    host = socket.gethostname().split(".")[0]
    version = SlurmVersion.of(version)
    task_plugin = "TaskPlugin=task/none" if version.has_task_none_plugin else "# TaskPlugin: task/none is gone from 23.11"
    requeue_delay = f",requeue_delay={int(cred_expire)}" if version.requeue_delay_setting else ""
    extra = (
        f"PartitionName=extra Nodes=ALL Default=YES PriorityTier=1 PreemptMode=REQUEUE GraceTime={int(grace_time)}"
        " MaxTime=INFINITE State=UP"
    )
    ctld_port, *node_ports = ports
    node_lines = "\n".join(
        f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs={CPUS_PER_NODE} State=UNKNOWN"
        for name, port in zip(NODES, node_ports)
    )
    text = f"""# Throwaway test cluster written by tests/slurm_cluster.py; safe to delete with its directory.
ClusterName=sstest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={base}/run/munge.sock,cred_expire={int(cred_expire)}
StateSaveLocation={base}/state
SlurmdSpoolDir={base}/spool-%n
SlurmctldPidFile={base}/run/slurmctld.pid
SlurmdPidFile={base}/run/slurmd-%n.pid
SlurmctldLogFile={base}/log/slurmctld.log
SlurmdLogFile={base}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig={base}/etc/plugstack.conf
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
{task_plugin}
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=1{requeue_delay}
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
KillWait=5
MinJobAge=300
InactiveLimit=0
JobRequeue=1
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
{node_lines}
{extra}
PartitionName=own Nodes=ALL Default=NO PriorityTier=10 PreemptMode=OFF MaxTime=INFINITE State=UP
"""
    for key, value in (overrides or {}).items():
        lines = text.splitlines()
        found = [i for i, line in enumerate(lines) if line.startswith(f"{key}=")]
        if found:
            lines[found[0]] = f"{key}={value}"
        else:  # a setting the recipe leaves to Slurm's default: with the other global lines
            lines.insert(2, f"{key}={value}")
        text = "\n".join(lines) + "\n"
    return text


def _all_idle(cluster: Cluster) -> bool:
    states = cluster.node_states()
    return set(states) == set(NODES) and all(s == "idle" for s in states.values())


def _wait_for(predicate, deadline: float, what: str, cluster: Cluster) -> None:
    while True:
        dead = [n for n, pid in cluster.read_state().get("pids", {}).items() if not _pid_alive(pid)]
        if dead:
            raise ClusterError(f"{what}: {', '.join(dead)} exited\n{_failure_context(cluster)}")
        try:
            if predicate():
                return
        except (subprocess.TimeoutExpired, OSError):
            pass
        if time.monotonic() > deadline:
            raise ClusterError(f"{what} in time\n{_failure_context(cluster)}")
        time.sleep(0.1)


def _failure_context(cluster: Cluster) -> str:
    stderr = []
    for path in sorted(cluster.log_dir.glob("*.stderr")):
        text = path.read_text(errors="replace").strip()
        if text:
            stderr.append(f"--- {path}\n{text[-1500:]}")
    return "\n".join(stderr + [cluster.log_tail()])


def _spawn(argv: list[str], env: dict[str, str], stderr_path: Path, die_with_owner: bool) -> int:
    with open(stderr_path, "ab") as err:
        proc = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=err,
            stderr=err,
            start_new_session=True,  # a Ctrl-C in the terminal must not hit the daemons mid-teardown
            preexec_fn=_set_parent_death_signal if die_with_owner else None,  # noqa: PLW1509 (tests start no threads)
        )
    return proc.pid


def _set_parent_death_signal() -> None:
    """In the child before exec: get SIGTERM when the starting process dies (Linux only)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _binary(name: str) -> str:
    found = shutil.which(name) or (str(Path("/usr/sbin", name)) if Path("/usr/sbin", name).exists() else None)
    if found is None:
        raise ClusterError(f"{name} not found; install with `apt-get install -y slurm-wlm munge`")
    return found


def _free_ports(count: int) -> list[int]:
    """Ports the kernel says are free now (bound together so they differ)."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


# ---- stop / cleanup ------------------------------------------------------------------------------
def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (our own un-reaped child) counts as dead
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def _proc_start_time(pid: int | None) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _environ_has_marker(pid: int, base: Path) -> bool:
    try:
        data = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{MARKER_ENV}={base}".encode() in data.split(b"\0")


def _is_ours(pid: int | None, base: Path) -> bool:
    return bool(pid) and _pid_alive(pid) and _environ_has_marker(int(pid), base)


def _own_ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return pids


def _marked_processes(base: Path) -> list[int]:
    """Every process carrying this cluster's marker: daemons, slurmstepd, what they started."""
    spare = _own_ancestors()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) not in spare and _environ_has_marker(int(entry.name), base):
            found.append(int(entry.name))
    return found


def _signal_pids(pids: Sequence[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _wait_gone(pids: Sequence[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    left = [p for p in pids if _pid_alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        for pid in left:  # reap our own children so they do not linger as zombies
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)
        left = [p for p in left if _pid_alive(p)]
    return left


def stop_cluster_dir(base: Path | str, keep: bool = False) -> None:
    """Stop the cluster rooted at ``base`` (whoever started it) and remove the dir unless ``keep``."""
    base = Path(base).resolve()
    cluster = Cluster(base)
    state = cluster.read_state()
    pids = {name: pid for name, pid in state.get("pids", {}).items() if _is_ours(pid, base)}
    if "slurmctld" in pids and cluster.conf_path.exists():
        # Ask Slurm first, so job processes get their TERM from their own slurmstepd.
        with contextlib.suppress(Exception):
            cluster.cancel_all()
            deadline = time.monotonic() + 8
            while cluster.queued_jobs() and time.monotonic() < deadline:
                time.sleep(0.2)
    order = [n for n in pids if n.startswith("slurmd-")] + [
        n for n in ("slurmctld", "slurmdbd", "mariadbd", "munged") if n in pids]
    _signal_pids([pids[n] for n in order], signal.SIGTERM)
    left = _wait_gone([pids[n] for n in order], 10)
    _signal_pids(left, signal.SIGKILL)
    _wait_gone(left, 5)
    stragglers = _marked_processes(base)  # slurmstepd and job processes that outlived their slurmd
    _signal_pids(stragglers, signal.SIGKILL)
    _wait_gone(stragglers, 5)
    if state:
        state["pids"] = {}
        state["kept"] = keep  # stopped and kept for a person (SLURM_TEST_KEEP): no later clean-up removes it
        with contextlib.suppress(OSError):
            _write_json(cluster.state_file, state)
    if not keep:
        shutil.rmtree(base, ignore_errors=True)


def clean_stale_clusters(tmp_root: Path | None = None) -> list[Path]:
    """Stop and remove fixture clusters whose owner process is gone (a crashed earlier session).
    A cluster started from the command line (no owner) or owned by a live process is left alone."""
    root = Path(tmp_root or tempfile.gettempdir())
    cleaned = []
    for base in sorted(root.glob(DIR_PREFIX + "*")):
        state = Cluster(base).read_state()
        owner = state.get("owner_pid")
        if not state or owner is None or (state.get("kept") and not state.get("pids")):
            continue
        if _pid_alive(owner) and _proc_start_time(owner) == state.get("owner_start"):
            continue
        stop_cluster_dir(base)
        cleaned.append(base)
    return cleaned


# ---- command line ----------------------------------------------------------------------------------
def _main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Throwaway two-node Slurm test cluster on this host.")
    parser.add_argument("action", choices=("start", "stop", "status"))
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / MANUAL_DIR_NAME)
    parser.add_argument("--grace", type=int, default=DEFAULT_GRACE, help="GraceTime of partition extra (s)")
    parser.add_argument("--keep", action="store_true", help="stop: keep the directory (logs, state)")
    parser.add_argument("--slurm", default="host",
                        help=f"start: host (default) or a root's version ({', '.join(sorted(ROOT_VERSIONS))})")
    args = parser.parse_args(argv)
    base = args.dir.resolve()
    if args.action == "start":
        if Cluster(base).alive():
            print(f"already running in {base}\n{_export_line(Cluster(base))}")
            return 0
        try:
            cluster = start_cluster(base, grace_time=args.grace, install=install_for(args.slurm))
        except ClusterError as exc:
            print(f"slurm_cluster: could not start: {exc}", file=sys.stderr)
            return 1
        print(f"Slurm {cluster.label} cluster up in {base} (nodes {', '.join(NODES)}; partitions extra, own)")
        print(_export_line(cluster))
        return 0
    if args.action == "stop":
        stop_cluster_dir(base, keep=args.keep)
        print(f"stopped {base}" + (" (kept)" if args.keep else " (removed)"))
        return 0
    cluster = Cluster(base)
    if not cluster.alive():
        print(f"not running ({base})")
        return 1
    print(f"Slurm {cluster.label} running in {base}: nodes {cluster.node_states()} jobs {cluster.queued_jobs()}")
    print(_export_line(cluster))
    return 0


def _export_line(cluster: Cluster) -> str:
    if cluster.install.is_host:
        return f"export SLURM_CONF={cluster.conf_path}"
    return f"export SLURM_CONF={cluster.conf_path} PATH={cluster.shim_dir}:$PATH SLURM_ROOT_SHIMS={cluster.shim_dir}"


if __name__ == "__main__":
    sys.exit(_main())
