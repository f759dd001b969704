"""Accounting for the throwaway test cluster: a MariaDB server and a slurmdbd of its own.

tests/slurm_cluster.py starts it between munged and slurmctld when ``start_cluster(accounting=...)``
asks for it. Everything lives in the cluster's directory: the database's data directory
(``db/``), its socket, its log, slurmdbd.conf beside slurm.conf, slurmdbd's log and pid. Nothing
global is touched: MariaDB runs with ``--no-defaults`` (no /etc/mysql), on 127.0.0.1 and a free
port, as a plain child process (no system service); both daemons carry the cluster's marker, so
the cluster's stop ends them with the rest.

The database server is always the host's (Debian's ``mariadb-server``): slurmdbd reaches it over
TCP, so a root's slurmdbd (24.11, 26.05; run through tests/slurm_roots/enter.sh like the other
daemons) talks to it just as the host's 22.05 does. Each cluster gets a fresh data directory, so
each version's slurmdbd creates its own schema.

Once slurmdbd answers, ``sacctmgr`` creates the cluster, an account and the user, and the QOS the
tests use: ``extra`` (preemptible: its own GraceTime and PreemptMode) and ``normal`` with
``Preempt=extra``. The time each part took is kept in ``Accounting.timings`` and printed.
"""

from __future__ import annotations

import secrets
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slurm_cluster import Cluster

ACCOUNT = "research"
QOS_EXTRA = "extra"
QOS_NORMAL = "normal"
DB_NAME = "slurm_acct_db"
DB_USER = "slurm"
REQUIRED = ("mariadb-install-db", "mariadbd", "mariadb")


class AccountingError(RuntimeError):
    """The database or slurmdbd could not start; the message says which and where its log is."""


@dataclass(frozen=True)
class QosSetup:
    """How QOS ``extra`` is set up when the cluster starts (tests change it with ``sacctmgr``)."""

    grace_time: int = 5
    preempt_mode: str = "requeue"


@dataclass
class Accounting:
    """Ports and paths of one cluster's database and slurmdbd, and what starting them cost."""

    base: Path
    db_port: int
    dbd_port: int
    qos: QosSetup = field(default_factory=QosSetup)
    password: str = field(default_factory=lambda: secrets.token_hex(12))
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def data_dir(self) -> Path:
        return self.base / "db"

    @property
    def tmp_dir(self) -> Path:
        return self.base / "db-tmp"

    @property
    def socket(self) -> Path:
        return self.base / "run" / "mariadb.sock"

    def conf_lines(self) -> dict[str, str]:
        """The slurm.conf settings that put this cluster under accounting and QOS preemption."""
        return {
            "AccountingStorageType": "accounting_storage/slurmdbd",
            "AccountingStorageHost": "127.0.0.1",
            "AccountingStoragePort": str(self.dbd_port),
            # With auth/munge, the connections to slurmdbd take their munge socket from here, not AuthInfo.
            "AccountingStoragePass": str(self.base / "run" / "munge.sock"),
            "AccountingStorageEnforce": "associations,limits,qos",
            "PreemptType": "preempt/qos",
            "PreemptMode": "REQUEUE",
        }

    def slurmdbd_conf(self, host: str) -> str:
        base = self.base
        return f"""# slurmdbd of the throwaway test cluster (tests/slurm_accounting.py)
AuthType=auth/munge
AuthInfo=socket={base}/run/munge.sock
DbdHost={host}
DbdAddr=127.0.0.1
DbdPort={self.dbd_port}
SlurmUser=root
DebugLevel=info
LogFile={base}/log/slurmdbd.log
PidFile={base}/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={self.db_port}
StorageUser={DB_USER}
StoragePass={self.password}
StorageLoc={DB_NAME}
"""

    def to_state(self) -> dict:
        return {"db_port": self.db_port, "dbd_port": self.dbd_port, "timings": self.timings,
                "qos": {"grace_time": self.qos.grace_time, "preempt_mode": self.qos.preempt_mode}}


def missing_binaries() -> list[str]:
    import shutil

    return [n for n in REQUIRED if shutil.which(n) is None and not Path("/usr/sbin", n).exists()]


def start_accounting(cluster: Cluster, acct: Accounting, spawn: Callable[[str, list[str], bool], int],
                     wait_for: Callable[[Callable[[], bool], str], None]) -> None:
    """Start MariaDB, then slurmdbd, then create the cluster, account, user and QOS with sacctmgr.

    ``spawn(name, argv, in_root)`` starts a daemon the cluster will stop (recorded in its state);
    ``wait_for(predicate, what)`` polls until the predicate holds, failing with the logs."""
    missing = missing_binaries()
    if missing:
        raise AccountingError(f"MariaDB not installed (missing: {', '.join(missing)}); "
                              "install with `apt-get install -y mariadb-server`")
    t0 = time.monotonic()
    acct.data_dir.mkdir(parents=True, exist_ok=True)
    acct.tmp_dir.mkdir(parents=True, exist_ok=True)
    # --tmpdir: MariaDB's temporary tables stay in the cluster's directory too (a shared /tmp that
    # someone cleans under it makes mariadb-install-db fail).
    _run(["mariadb-install-db", "--no-defaults", f"--datadir={acct.data_dir}", "--user=root",
          "--auth-root-authentication-method=socket", "--skip-test-db", f"--tmpdir={acct.tmp_dir}"],
         "mariadb-install-db", acct.base)
    acct.timings["db_init_s"] = round(time.monotonic() - t0, 2)

    t1 = time.monotonic()
    spawn("mariadbd", [
        "/usr/sbin/mariadbd", "--no-defaults", f"--datadir={acct.data_dir}", f"--socket={acct.socket}",
        f"--port={acct.db_port}", "--bind-address=127.0.0.1", f"--tmpdir={acct.tmp_dir}", "--user=root", "--skip-name-resolve",
        f"--pid-file={acct.base / 'run' / 'mariadbd.pid'}", f"--log-error={acct.base / 'log' / 'mariadb.log'}",
        "--innodb-buffer-pool-size=64M", "--innodb-flush-log-at-trx-commit=0", "--skip-log-bin",
        "--innodb-lock-wait-timeout=900", "--max-allowed-packet=16M",
    ], False)
    wait_for(lambda: acct.socket.exists() and _sql(acct, "SELECT 1").returncode == 0, "MariaDB did not answer")
    grant = (f"CREATE USER '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{acct.password}'; "
             f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'127.0.0.1'; FLUSH PRIVILEGES;")
    proc = _sql(acct, grant)
    if proc.returncode != 0:
        raise AccountingError(f"could not create the database user: {proc.stderr.strip()}")
    acct.timings["db_start_s"] = round(time.monotonic() - t1, 2)

    t2 = time.monotonic()
    host = cluster.conf_path.read_text().split("SlurmctldHost=", 1)[1].split("(", 1)[0].strip()
    conf = cluster.conf_path.parent / "slurmdbd.conf"
    conf.write_text(acct.slurmdbd_conf(host))
    conf.chmod(0o600)
    spawn("slurmdbd", [cluster.install.binary("slurmdbd"), "-D"], True)
    wait_for(lambda: cluster.run(["sacctmgr", "-n", "-P", "show", "cluster"], check=False, timeout=10).returncode == 0,
             "slurmdbd did not answer `sacctmgr show cluster`")
    acct.timings["slurmdbd_start_s"] = round(time.monotonic() - t2, 2)

    t3 = time.monotonic()
    name = _cluster_name(cluster)
    qos = acct.qos
    for argv in (
        ["add", "cluster", name],
        ["add", "account", ACCOUNT, f"Cluster={name}", "Description=tests", "Organization=tests"],
        ["add", "qos", QOS_EXTRA, f"GraceTime={qos.grace_time}", f"PreemptMode={qos.preempt_mode}"],
        ["modify", "qos", "where", f"name={QOS_NORMAL}", "set", f"Preempt={QOS_EXTRA}"],
        ["add", "user", "root", f"Account={ACCOUNT}", f"Cluster={name}", f"QOS={QOS_NORMAL},{QOS_EXTRA}",
         f"DefaultQOS={QOS_NORMAL}", f"DefaultAccount={ACCOUNT}"],
    ):
        sacctmgr(cluster, *argv)
    acct.timings["sacctmgr_setup_s"] = round(time.monotonic() - t3, 2)
    acct.timings["total_s"] = round(time.monotonic() - t0, 2)


def sacctmgr(cluster: Cluster, *args: str) -> str:
    """``sacctmgr -i ARGS`` against this cluster's slurmdbd; its output (raises on failure)."""
    proc = cluster.run(["sacctmgr", "-i", *args], check=False, timeout=30)
    if proc.returncode != 0:
        said = (proc.stderr.strip() or proc.stdout.strip())[-1500:]
        raise AccountingError(f"sacctmgr {' '.join(args)} exited {proc.returncode}: {said}")
    return proc.stdout


def modify_qos(cluster: Cluster, name: str, **settings: str | int) -> None:
    """``sacctmgr modify qos NAME set K=V ...`` (slurmctld learns it from slurmdbd at once)."""
    sacctmgr(cluster, "modify", "qos", "where", f"name={name}", "set", *(f"{k}={v}" for k, v in settings.items()))


def _cluster_name(cluster: Cluster) -> str:
    for line in cluster.conf_path.read_text().splitlines():
        if line.startswith("ClusterName="):
            return line.split("=", 1)[1].strip()
    raise AccountingError(f"no ClusterName in {cluster.conf_path}")


def _sql(acct: Accounting, statement: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mariadb", "--no-defaults", f"--socket={acct.socket}", "-u", "root", "-e", statement],
                          capture_output=True, text=True, check=False, timeout=20)


def _run(argv: list[str], what: str, base: Path) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    if proc.returncode != 0:
        log = base / "log" / f"{what}.log"
        log.write_text(proc.stdout + proc.stderr)
        raise AccountingError(f"{what} exited {proc.returncode} (log: {log}): {proc.stderr.strip()[-800:]}")
