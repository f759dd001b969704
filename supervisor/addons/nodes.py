"""The node health ledger: what every run of a user learned about the nodes it ran on.

One run sees a node once or twice; a bad node shows itself across runs (a GPU check that failed
last week, a slowdown yesterday, two hardware faults today). The ledger is a JSONL file on a path
all of a user's jobs share (``nodes.ledger``, default ``~/.cache/slurm-supervisor/nodes.jsonl``),
one record a line: failures by class, GPU check results, slow nodes, loss anomalies, and a person's
``cleared`` (the node was repaired), each with time, node, run directory and job id.

Writing (:class:`NodeLedger`): append-only, one whole line per ``write`` on an ``O_APPEND``
descriptor, under a ``filelock`` so that writers on several nodes (on a shared filesystem) never
interleave and rotation never loses a line. Bounded: past ``max_bytes`` the file is renamed to
``<file>.1`` (the older one dropped) and a new one started, so the ledger never holds more than
twice that. A write that fails is logged and dropped: the ledger is advice, never a reason for a
run to stop.

Reading is tolerant (a torn or foreign line is skipped and counted). The queries are pure:
:func:`suspects` (nodes with evidence against them, and the evidence) and :func:`exclusions` (nodes
to keep away from on the next requeue or resubmission, each with its reason and an expiry).
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any

from ..config import NodesConfig
from ..private import OWNER_ONLY, append_fd, tighten
from ..redact import redact_text

log = logging.getLogger("supervisor.addons.nodes")

LEDGER_VERSION = 1
DEFAULT_LEDGER = Path("~/.cache/slurm-supervisor/nodes.jsonl")
LOCK_TIMEOUT = 10.0  # seconds to wait for the ledger's lock; then the line is written without it
MAX_LINE = 4096  # bytes of one record; longer details are cut
MAX_RECORDS = 200000  # records read at most (newest kept)


class NodeEventKind(str, Enum):
    """What a ledger record reports. Failures carry their class in ``label``."""

    FAILURE = "failure"  # an attempt ended with a failure on this node (label: its class)
    GPU_CHECK = "gpu_check"  # the GPU repeatability check ran here (ok: passed)
    SLOW_NODE = "slow_node"  # this node's ranks stepped slower than their peers
    LOSS_ANOMALY = "loss_anomaly"  # NaN/inf loss or a spike while training on this node
    CLEARED = "cleared"  # a person said the node is fixed: earlier evidence no longer counts


@dataclass(frozen=True)
class NodeRecord:
    """One line of the ledger."""

    ts: float
    node: str
    kind: NodeEventKind
    ok: bool = False  # True only for evidence in the node's favour (a passed GPU check)
    label: str | None = None  # failure class; nan/inf/spike for a loss anomaly
    run_dir: str | None = None
    job_id: str | None = None
    attempt: int | None = None
    detail: str | None = None  # one line: the evidence or the reason

    @property
    def evidence_label(self) -> str:
        """What the policy tables name: the failure class, else the kind (``gpu_check``, ...)."""
        if self.kind is NodeEventKind.FAILURE and self.label:
            return self.label
        return self.kind.value

    @property
    def against(self) -> bool:
        """Whether the record is evidence against the node."""
        return not self.ok and self.kind is not NodeEventKind.CLEARED

    def to_json(self) -> str:
        data = {k: v for k, v in asdict(self).items() if v is not None}
        data["kind"] = self.kind.value
        data["v"] = LEDGER_VERSION
        line = json.dumps(data, separators=(",", ":"), default=str)
        if len(line.encode()) > MAX_LINE and self.detail:
            cut = max(len(self.detail) - (len(line.encode()) - MAX_LINE) - 16, 0)
            return NodeRecord(**{**asdict(self), "detail": self.detail[:cut] + " [cut]"}).to_json()
        return line


def parse_record(line: str) -> NodeRecord | None:
    """A ledger line as a record, or None for anything else (torn, foreign, wrong types)."""
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    ts, node, kind = data.get("ts"), data.get("node"), data.get("kind")
    if not (isinstance(ts, (int, float)) and not isinstance(ts, bool) and math.isfinite(ts)):
        return None
    if not isinstance(node, str) or not node or not isinstance(kind, str):
        return None
    try:
        event_kind = NodeEventKind(kind)
    except ValueError:
        return None
    attempt = data.get("attempt")

    def text(key: str) -> str | None:
        value = data.get(key)
        return str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else None

    return NodeRecord(ts=float(ts), node=node, kind=event_kind, ok=data.get("ok") is True, label=text("label"),
                      run_dir=text("run_dir"), job_id=text("job_id"),
                      attempt=attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else None,
                      detail=text("detail"))


def node_ledger_path(cfg: NodesConfig | None = None, environ: Mapping[str, str] | None = None) -> Path:
    """``nodes.ledger`` (also ``$SUPERVISE_NODES__LEDGER``, like every config key), else the default
    under the home directory. ``~`` and variables in it are expanded."""
    environ = os.environ if environ is None else environ
    raw = (cfg.ledger if cfg is not None and cfg.ledger else None) or environ.get("SUPERVISE_NODES__LEDGER")
    path = Path(raw) if raw else DEFAULT_LEDGER
    text = os.path.expandvars(str(path))
    if text.startswith("~"):
        home = environ.get("HOME") or os.path.expanduser("~")
        text = home + text[1:]
    return Path(text)


@dataclass(frozen=True)
class NodeLedgerRead:
    records: list[NodeRecord]
    bad_lines: int


class NodeLedger:
    """The ledger file: append a record (locked, one write), read them all (tolerant)."""

    def __init__(self, path: Path, max_bytes: int = NodesConfig().max_bytes) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self.rotated_path = self.path.with_name(self.path.name + ".1")

    def append(self, record: NodeRecord) -> bool:
        """Write one record; True when it landed. Never raises (the ledger is advice)."""
        record = replace(record, detail=redact_text(record.detail) if record.detail else record.detail,
                         label=redact_text(record.label) if record.label else record.label)
        data = (record.to_json() + "\n").encode("utf-8", "backslashreplace")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            log.warning("node ledger %s: cannot create its directory (%s)", self.path, exc.strerror or exc)
            return False
        from filelock import FileLock, Timeout

        lock = FileLock(str(self.lock_path), timeout=LOCK_TIMEOUT, mode=OWNER_ONLY)
        try:
            with lock:
                self._rotate_if_full(len(data))
                return self._write(data)
        except Timeout:
            # A writer stuck holding the lock (a hung NFS client) must not cost the evidence: one
            # O_APPEND write of a whole line does not interleave with others on a local filesystem.
            log.warning("node ledger %s: lock busy for %.0f s; appending without it", self.path, LOCK_TIMEOUT)
            return self._write(data)
        except OSError as exc:
            log.warning("node ledger %s: cannot lock it (%s)", self.path, exc.strerror or exc)
            return False

    def append_in_background(self, record: NodeRecord) -> threading.Thread:
        """:meth:`append` on a daemon thread: the run loop never waits for a lock or a slow shared
        filesystem. ``join()`` the thread to wait for it (at teardown, bounded)."""
        thread = threading.Thread(target=self.append, args=(record,), daemon=True, name="node-ledger")
        thread.start()
        return thread

    def _rotate_if_full(self, incoming: int) -> None:
        try:
            size = self.path.stat().st_size
        except OSError:
            return
        if size + incoming <= self.max_bytes:
            return
        try:
            os.replace(self.path, self.rotated_path)
        except OSError as exc:
            log.warning("node ledger %s: cannot rotate it (%s)", self.path, exc.strerror or exc)

    def _write(self, data: bytes) -> bool:
        try:
            fd = append_fd(self.path, OWNER_ONLY)  # per user, and tightened when it pre-exists wider
        except OSError as exc:
            log.warning("node ledger %s: cannot open it (%s)", self.path, exc.strerror or exc)
            return False
        try:
            written = os.write(fd, data)
            if written != len(data):
                os.write(fd, b"\n")  # a torn line is skipped by readers; keep the next one whole
                return False
            return True
        except OSError as exc:
            log.warning("node ledger %s: write failed (%s)", self.path, exc.strerror or exc)
            return False
        finally:
            os.close(fd)

    def read(self) -> NodeLedgerRead:
        """Every record of the rotated and the current file, oldest first. A missing ledger is empty;
        an unreadable one raises OSError (the caller names the path)."""
        records: list[NodeRecord] = []
        bad = 0
        for path in (self.rotated_path, self.path):
            try:
                with open(path, "rb") as fh:
                    _tighten_if_ours(fh.fileno())
                    for raw in fh:
                        rec = parse_record(raw.decode("utf-8", "replace"))
                        if rec is None:
                            bad += bool(raw.strip())
                        else:
                            records.append(rec)
            except FileNotFoundError:
                continue
        if len(records) > MAX_RECORDS:
            records = records[-MAX_RECORDS:]
        records.sort(key=lambda r: r.ts)
        return NodeLedgerRead(records, bad)


def _tighten_if_ours(fd: int) -> None:
    """A ledger an earlier version left readable by others becomes the owner's alone when it is
    read too, not only at the next write (a run without failures writes nothing)."""
    try:
        if os.fstat(fd).st_uid == os.getuid():
            tighten(fd, OWNER_ONLY)
    except OSError:
        pass


def current_exclusions(ledger: NodeLedger, now: float, policy: NodesConfig,
                       timeout: float = 2.0) -> tuple[list[Exclusion], str | None]:
    """:func:`exclusions` of the ledger as it is now, read on a thread bounded by ``timeout``
    seconds (a requeue may be racing a grace deadline; a hung shared filesystem must not cost it).
    Returns (exclusions, why none could be read or None)."""
    box: list[Any] = []

    def work() -> None:
        try:
            box.append(exclusions(ledger.read().records, now, policy))
        except Exception as exc:  # noqa: BLE001 - an unreadable ledger excludes nothing
            box.append(exc)

    thread = threading.Thread(target=work, daemon=True, name="node-ledger-read")
    thread.start()
    thread.join(timeout)
    if not box:
        return [], f"the node ledger {ledger.path} did not answer within {timeout:g} s"
    if isinstance(box[0], Exception):
        return [], f"cannot read the node ledger {ledger.path}: {box[0]}"
    return box[0], None


# ---------------------------------------------------------------------------------------------
# Making records (pure)


def record_failure(node: str, cls: str, *, ts: float, run_dir: str | None = None, job_id: str | None = None,
                   attempt: int | None = None, evidence: str | None = None) -> NodeRecord:
    return NodeRecord(ts=ts, node=node, kind=NodeEventKind.FAILURE, label=cls, run_dir=run_dir, job_id=job_id,
                      attempt=attempt, detail=evidence)


def record_gpu_check(node: str, ok: bool, reason: str, *, ts: float, run_dir: str | None = None,
                     job_id: str | None = None, attempt: int | None = None) -> NodeRecord:
    return NodeRecord(ts=ts, node=node, kind=NodeEventKind.GPU_CHECK, ok=ok, label="passed" if ok else "failed",
                      run_dir=run_dir, job_id=job_id, attempt=attempt, detail=reason)


def record_slow_node(node: str, reason: str, *, ts: float, run_dir: str | None = None, job_id: str | None = None,
                     attempt: int | None = None) -> NodeRecord:
    return NodeRecord(ts=ts, node=node, kind=NodeEventKind.SLOW_NODE, run_dir=run_dir, job_id=job_id,
                      attempt=attempt, detail=reason)


def record_loss_anomaly(node: str, kind: str, reason: str, *, ts: float, run_dir: str | None = None,
                        job_id: str | None = None, attempt: int | None = None) -> NodeRecord:
    return NodeRecord(ts=ts, node=node, kind=NodeEventKind.LOSS_ANOMALY, label=kind, run_dir=run_dir,
                      job_id=job_id, attempt=attempt, detail=reason)


def record_cleared(node: str, reason: str, *, ts: float) -> NodeRecord:
    return NodeRecord(ts=ts, node=node, kind=NodeEventKind.CLEARED, ok=True, detail=reason)


# ---------------------------------------------------------------------------------------------
# The queries (pure)


@dataclass(frozen=True)
class Evidence:
    """One record held against a node, as the report and ``supervise nodes`` show it."""

    ts: float
    what: str  # the evidence label: failure class, gpu_check, slow_node, loss_anomaly
    detail: str | None
    run_dir: str | None
    job_id: str | None
    hardware: bool  # counts towards an exclusion


@dataclass(frozen=True)
class Suspect:
    node: str
    evidence: tuple[Evidence, ...]  # newest last
    hardware_count: int
    reason: str


@dataclass(frozen=True)
class Exclusion:
    node: str
    reason: str
    until: float  # epoch seconds; the exclusion no longer applies after this


def _evidence_by_node(records: Iterable[NodeRecord], now: float, policy: NodesConfig) -> dict[str, list[Evidence]]:
    """Records against each node within the window, after its last ``cleared`` record."""
    counted = set(policy.hardware) | set(policy.suspect)
    by_node: dict[str, list[Evidence]] = {}
    for rec in sorted(records, key=lambda r: r.ts):
        if rec.kind is NodeEventKind.CLEARED:
            by_node.pop(rec.node, None)
            continue
        if not rec.against or rec.ts > now or now - rec.ts > policy.window:
            continue
        label = rec.evidence_label
        if label not in counted:
            continue
        by_node.setdefault(rec.node, []).append(Evidence(
            ts=rec.ts, what=label, detail=rec.detail, run_dir=rec.run_dir, job_id=rec.job_id,
            hardware=label in policy.hardware))
    return by_node


def _summary(evidence: Sequence[Evidence]) -> str:
    counts: dict[str, int] = {}
    for ev in evidence:
        counts[ev.what] = counts.get(ev.what, 0) + 1
    return ", ".join(f"{n} x {what}" for what, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _days(seconds: float) -> str:
    return f"{seconds / 86400:g} d" if seconds >= 86400 else f"{seconds / 3600:g} h"


def suspects(records: Iterable[NodeRecord], now: float, policy: NodesConfig) -> list[Suspect]:
    """Nodes with evidence against them in the window: any hardware record, or ``suspect_after``
    records of the listed kinds. Most hardware evidence first."""
    out = []
    for node, evidence in _evidence_by_node(records, now, policy).items():
        hardware = sum(ev.hardware for ev in evidence)
        if hardware == 0 and len(evidence) < policy.suspect_after:
            continue
        reason = f"{_summary(evidence)} in the last {_days(policy.window)}"
        if hardware and policy.exclude_after and hardware >= policy.exclude_after:
            reason += f" ({hardware} hardware records: excluded, nodes.exclude_after={policy.exclude_after})"
        out.append(Suspect(node=node, evidence=tuple(evidence), hardware_count=hardware, reason=reason))
    return sorted(out, key=lambda s: (-s.hardware_count, -len(s.evidence), s.node))


def exclusions(records: Iterable[NodeRecord], now: float, policy: NodesConfig) -> list[Exclusion]:
    """Nodes to keep away from on the next requeue or resubmission: ``exclude_after`` hardware
    records within the window, for ``exclude_for`` seconds after the last one. ``exclude_after`` 0:
    never."""
    if policy.exclude_after <= 0:
        return []
    out = []
    for node, evidence in _evidence_by_node(records, now, policy).items():
        hardware = [ev for ev in evidence if ev.hardware]
        if len(hardware) < policy.exclude_after:
            continue
        until = hardware[-1].ts + policy.exclude_for
        if until <= now:
            continue
        reason = (f"{_summary(hardware)} in the last {_days(policy.window)} (nodes.exclude_after="
                  f"{policy.exclude_after}); excluded until {time.strftime('%Y-%m-%d %H:%M', time.localtime(until))}")
        out.append(Exclusion(node=node, reason=reason, until=until))
    return sorted(out, key=lambda e: e.node)
