"""Reading a run directory for the report and the status view: the I/O edge of ``supervisor.addons.report``.

Only the run directory (and the checkpoint directory it names) is read, so a report works after the
job is gone and on another machine. Nothing here writes, renames or executes anything: checkpoints
are inspected by the pure-Python validator, never unpickled.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
from collections.abc import Mapping
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ...checkpoints.naming import is_manifest_name
from ...config import BudgetConfig, SupervisorConfig
from ...errors import UsageError
from ...events import Event, read_events
from ...paths import RunPaths
from ...redact import redact_text, redact_value
from ...textsafe import printable, printable_value
from ...slurm.sacct import SacctAnswer
from .accounting import accounting_view, run_job_ids
from .model import CheckpointRow, QuarantineFile, Report, fold

QUARANTINE_PREFIX = "CORRUPT_"
MAX_SIDECAR_BYTES = 1 << 20
MAX_MANIFEST_BYTES = 256 << 20  # ~400,000 records; a bigger one is left unread (its files are still listed)
_MANIFEST_NAME = re.compile(r"^manifest-(\d+)\.json$")


def resolve_run_dir(path: Path) -> RunPaths:
    """Accept the run directory, its ``supervisor/`` folder or the ``events.jsonl`` itself; anything
    else is a usage error naming what is missing."""
    path = Path(path)
    if path.is_file() and path.name == "events.jsonl" and path.parent.name == "supervisor":
        path = path.parent.parent
    elif path.name == "supervisor" and (path / "events.jsonl").is_file():
        path = path.parent
    if not path.exists():
        raise UsageError(f"run directory {path} does not exist; give the --run-dir that "
                         "'supervise run' used (default ./runs/<name>)")
    paths = RunPaths(path)
    if not paths.events.is_file():
        raise UsageError(f"{path} is not a run directory (no supervisor/events.jsonl); give the "
                         "--run-dir that 'supervise run' used (default ./runs/<name>)")
    return paths


def read_manifests(paths: RunPaths) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    try:
        names = os.listdir(paths.supervisor_dir)
    except OSError:
        return out
    for name in names:
        match = _MANIFEST_NAME.match(name)
        if not match:
            continue
        try:
            data = json.loads((paths.supervisor_dir / name).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            out[int(match.group(1))] = data
    return out


def checkpoint_dir_for(paths: RunPaths, recorded: str | None, recorded_run_dir: str | None) -> Path:
    """The checkpoint dir named in ``run_start``. When the run directory was moved or copied (a
    report on another machine), a checkpoint dir that lived inside the old run dir is re-rooted."""
    if not recorded:
        return paths.default_checkpoint_dir
    ckpt = Path(recorded)
    if not ckpt.is_absolute():
        ckpt = paths.run_dir / ckpt
    if ckpt.exists() or not recorded_run_dir:
        return ckpt
    try:
        inside = Path(recorded).relative_to(Path(recorded_run_dir))
    except ValueError:
        return ckpt
    moved = paths.run_dir / inside
    return moved if moved.exists() else ckpt


def _tree_size(path: Path) -> int | None:
    """Bytes of regular files under ``path`` without following symlinks (DCP / DeepSpeed dirs)."""
    total = 0
    try:
        for root, _dirs, files in os.walk(path, followlinks=False):
            for name in files:
                try:
                    st = os.lstat(os.path.join(root, name))
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    total += st.st_size
    except OSError:
        return None
    return total


def _entry_size(path: Path) -> int | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if stat.S_ISDIR(st.st_mode):
        return _tree_size(path)
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def _read_sidecar(path: Path) -> dict[str, Any] | None:
    """A quarantine sidecar: only a regular file (never through a symlink), small, JSON object."""
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_SIDECAR_BYTES:
            return None
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def list_quarantined(ckpt_dir: Path) -> list[QuarantineFile]:
    """``CORRUPT_*`` entries (files or dirs) with their ``.json`` sidecars."""
    try:
        names = sorted(os.listdir(ckpt_dir))
    except OSError:
        return []
    out = []
    present = set(names)
    from_manifests: dict[str, dict[str, Any]] = {}
    for name in names:
        if is_manifest_name(name):
            from_manifests.update(_read_manifest(ckpt_dir / name))
    for name in names:
        if not name.startswith(QUARANTINE_PREFIX) or is_manifest_name(name):
            continue
        if name.endswith(".json") and name[: -len(".json")] in present:
            continue  # a sidecar
        sidecar = _read_sidecar(ckpt_dir / f"{name}.json") or from_manifests.get(name)
        out.append(QuarantineFile(name=name, size=_entry_size(ckpt_dir / name), sidecar=sidecar))
    return out


def _read_manifest(path: Path) -> dict[str, dict[str, Any]]:
    """A batch manifest (supervisor/checkpoints/quarantine.py): one sidecar per line, by the name the
    file was moved to. Regular files only, bounded; a line that is not a sidecar is skipped."""
    out: dict[str, dict[str, Any]] = {}
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_MANIFEST_BYTES:
            return out
        with open(path, "rb") as handle:
            for raw in handle:
                try:
                    data = json.loads(raw)
                except ValueError:
                    continue
                dest = data.get("quarantined_as") if isinstance(data, dict) else None
                if isinstance(dest, str):
                    out[os.path.basename(dest)] = data
    except OSError:
        return out
    return out


def _value(v: Any) -> Any:
    return v.value if hasattr(v, "value") else v


def scan_checkpoints(ckpt_dir: Path, warnings: list[str]) -> list[CheckpointRow]:
    """The health table: ``supervisor.checkpoints.scan`` (L0-L3, no CRC pass) when it is installed;
    else the entries listed unchecked, with a warning."""
    try:
        from ...checkpoints import scan_checkpoints as scan
    except ImportError:
        scan = None
    rows: list[CheckpointRow] = []
    if scan is not None:
        try:
            for r in scan(ckpt_dir, deep=False):
                path = Path(str(getattr(r, "path", "")))
                if path.name.startswith(QUARANTINE_PREFIX):
                    continue
                try:
                    shown = str(path.relative_to(ckpt_dir))
                except ValueError:
                    shown = path.name
                rows.append(CheckpointRow(
                    file=shown, size=getattr(r, "size", None), verdict=_value(getattr(r, "verdict", None)),
                    step=getattr(r, "step", None), format=_value(getattr(r, "format", None)),
                    level=_value(getattr(r, "level", None)), reason=getattr(r, "reason", None)))
            return sorted(rows, key=lambda c: (c.step is None, c.step or 0, c.file))
        except Exception as exc:  # noqa: BLE001 - the report must come out even when validation trips on a file
            warnings.append(f"checkpoint validation failed ({type(exc).__name__}: {exc}); "
                            "files listed unchecked")
            rows = []
    else:
        warnings.append("checkpoint validator unavailable (supervisor.checkpoints.scan): "
                        "files listed unchecked")
    from ...checkpoints.naming import is_ignored_name, step_from_name
    try:
        names = sorted(os.listdir(ckpt_dir))
    except OSError:
        return []
    for name in names:
        if is_ignored_name(name):
            continue
        rows.append(CheckpointRow(file=name, size=_entry_size(ckpt_dir / name), verdict=None,
                                  step=step_from_name(name)))
    return sorted(rows, key=lambda c: (c.step is None, c.step or 0, c.file))


def budget_config_from(manifests: Mapping[int, Mapping[str, Any]]) -> BudgetConfig | None:
    """The budget the run was judged by: from the newest manifest's effective config."""
    for n in sorted(manifests, reverse=True):
        config = manifests[n].get("config")
        data = config.get("budget") if isinstance(config, Mapping) else None
        if isinstance(data, Mapping):
            known = {k: v for k, v in data.items() if k in BudgetConfig.__dataclass_fields__}
            try:
                return BudgetConfig(**known)
            except TypeError:
                return None
    return None


SacctQuery = Callable[[Sequence[str]], SacctAnswer]


def build_report(run_dir: Path, *, config: SupervisorConfig | None = None,
                 check_checkpoints: bool = True, accounting: bool | SacctQuery = False) -> Report:
    """Read the run directory and fold it. ``config`` overrides the budget recorded in the manifests.
    ``accounting``: also ask Slurm's accounting for the run's jobs (True: ``sacct`` here; a callable:
    that query instead, for tests); False leaves :attr:`Report.accounting` None."""
    rep = _build_report(run_dir, config=config, check_checkpoints=check_checkpoints)
    if accounting is False:
        return rep
    return with_accounting(rep, resolve_run_dir(run_dir), None if accounting is True else accounting)


def with_accounting(rep: Report, paths: RunPaths, query: SacctQuery | None) -> Report:
    """``rep`` with Slurm's history of the jobs its event log and submissions record name, asked
    now (see docs/report.md, "Slurm's own history"). Never raises: what went wrong is one line."""
    from ..resubmit import read_submissions, submissions_path
    from ..accounting import query_sacct

    ids = run_job_ids(rep.run.jobs, read_submissions(submissions_path(paths.run_dir)))
    answer = (query or query_sacct)(ids) if ids else None
    return replace(rep, accounting=accounting_view(answer, rep.run.jobs, ids))


def skipped_accounting(rep: Report, paths: RunPaths) -> Report:
    """``rep`` saying the history was not asked for (``--no-accounting``)."""
    from ..resubmit import read_submissions, submissions_path

    ids = run_job_ids(rep.run.jobs, read_submissions(submissions_path(paths.run_dir)))
    return replace(rep, accounting=accounting_view(None, rep.run.jobs, ids))


def _build_report(run_dir: Path, *, config: SupervisorConfig | None, check_checkpoints: bool) -> Report:
    paths = resolve_run_dir(run_dir)
    try:
        read = read_events(paths.events)
    except OSError as exc:
        raise UsageError(f"cannot read {paths.events} ({exc.strerror})") from None
    manifests = read_manifests(paths)
    warnings: list[str] = []
    start = next((e for e in reversed(read.events) if e.event == "run_start"), None)
    checkpoints = None
    quarantined: list[QuarantineFile] = []
    if check_checkpoints:
        ckpt_dir = checkpoint_dir_for(paths, start.get("checkpoint_dir") if start else None,
                                      start.get("run_dir") if start else None)
        if ckpt_dir.is_dir():
            checkpoints = scan_checkpoints(ckpt_dir, warnings)
            quarantined = list_quarantined(ckpt_dir)
        else:
            warnings.append(f"checkpoint directory {ckpt_dir} does not exist here: no health table")
    budget = config.budget if config is not None else budget_config_from(manifests)
    # Past the I/O, everything the renderers show is made safe once, here: credentials an older
    # version recorded are redacted, control characters (a checkpoint named with ESC or a newline,
    # evidence lines) escaped, so no renderer (text, markdown, html, json, status) prints them raw.
    events = [Event(safe_text(e.event), e.ts, safe_value(e.fields), e.version) for e in read.events]
    if checkpoints is not None:
        checkpoints = [replace(c, file=safe_text(c.file), reason=safe_text(c.reason) if c.reason else c.reason)
                       for c in checkpoints]
    quarantined = [replace(q, name=safe_text(q.name), sidecar=safe_value(q.sidecar) if q.sidecar else q.sidecar)
                   for q in quarantined]
    return fold(events, {n: safe_value(m) for n, m in manifests.items()}, checkpoints=checkpoints,
                quarantine_files=quarantined, budget_config=budget, bad_lines=read.bad_lines,
                versions=read.versions, warnings=[safe_text(w) for w in warnings])


def safe_text(text: str) -> str:
    """A string fit to show: credentials redacted, control characters escaped."""
    return printable(redact_text(text))


def safe_value(value: Any) -> Any:
    """Nested data fit to show (see :func:`safe_text`)."""
    return printable_value(redact_value(value))


# ---------------------------------------------------------------------------------------------
# Liveness for ``supervise status``


@dataclass(frozen=True)
class Liveness:
    alive: bool | None  # None = cannot tell from here (another host)
    owner: Mapping[str, Any] | None
    reason: str


def _process_start_epoch(pid: int) -> float | None:
    """When ``pid`` started (Linux /proc), to tell a live supervisor from a reused pid."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22 overall: starttime in clock ticks since boot
        with open("/proc/stat") as fh:
            btime = next(int(line.split()[1]) for line in fh if line.startswith("btime"))
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def check_alive(paths: RunPaths, hostname: str | None = None) -> Liveness:
    """Read ``lock.owner.json``; on the same host, check that its pid is the supervisor that wrote it."""
    try:
        owner = json.loads(paths.lock_owner.read_text())
    except (OSError, ValueError):
        owner = None
    if not isinstance(owner, dict):
        return Liveness(False, None, "no supervisor holds the run directory (no lock.owner.json)")
    host = str(owner.get("host") or "")
    pid = owner.get("pid")
    here = hostname or socket.gethostname()
    if host != here:
        return Liveness(None, owner, f"held by pid {pid} on host {host or '?'}: cannot check from {here}")
    if not isinstance(pid, int) or pid <= 0:
        return Liveness(None, owner, "lock.owner.json names no pid")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return Liveness(False, owner, f"pid {pid} is gone (the supervisor died without cleaning up)")
    except PermissionError:
        pass  # exists, owned by someone else
    started = owner.get("started")
    began = _process_start_epoch(pid)
    if isinstance(started, (int, float)) and began is not None and began > started + 5:
        return Liveness(False, owner, f"pid {pid} now belongs to another process (reused)")
    return Liveness(True, owner, f"supervisor pid {pid} is running on {host}")
