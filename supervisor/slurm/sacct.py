"""What ``sacct`` says about a job's runs, as typed records. Pure: text in, frozen records out.

The report asks ``sacct --duplicates --allocations --parsable2`` for the job ids a run's event log
and submissions record name (``supervisor/addons/accounting.py`` runs it). ``--duplicates`` matters:
every requeue of a job leaves its own accounting record under the same job id, and without the flag
``sacct`` shows only the newest one. Each record is one run of the batch script (or one wait in the
queue that never started).

Fields asked for, and where they exist (checked on the ``sacct`` binaries of the versions the test
clusters run: ``Restarts`` is in 24.11 and 26.05, not in 22.05, whose ``sacct`` refuses it with
``Invalid field requested: "Restarts"``; every other field is in all three):

    JobID JobIDRaw State Submit Start End Elapsed NodeList ExitCode Reason [Restarts]

The report asks for ``--delimiter`` :data:`DELIMITER` (the ASCII unit separator) rather than ``|``,
which ``--parsable2`` does not escape inside a value. The output is read by its header line, so a
field a version lacks is simply ``None``. The text is untrusted (a site's ``Reason`` or node names
can hold anything): every string is passed through :func:`supervisor.textsafe.printable` and cut to
a bounded length; lines past :data:`MAX_RECORDS` are ignored.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from ..textsafe import printable

FIELDS = ("JobID", "JobIDRaw", "State", "Submit", "Start", "End", "Elapsed", "NodeList", "ExitCode", "Reason",
          "Restarts")
FIELDS_WITHOUT_RESTARTS = tuple(f for f in FIELDS if f != "Restarts")  # Slurm 22.05
DELIMITER = "\x1f"
MAX_RECORDS = 500
MAX_TEXT = 200
_NO_VALUE = frozenset({"", "Unknown", "None", "None assigned", "N/A", "(null)"})
_ISO = "%Y-%m-%dT%H:%M:%S"
_ELAPSED = re.compile(r"^(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)(?:\.\d+)?$")
_DISABLED = "accounting storage is disabled"
_SACCT_PREFIX = re.compile(r"^sacct: (?:error|fatal): ")
_INVALID_FIELD = re.compile(r'Invalid field requested: "?([A-Za-z]+)"?')


class SacctStatus(Enum):
    """How the question to ``sacct`` went."""

    OK = "ok"
    MISSING = "missing"  # no sacct on PATH
    DISABLED = "disabled"  # AccountingStorageType=none: "Slurm accounting storage is disabled"
    TIMEOUT = "timeout"
    ERROR = "error"  # anything else sacct said (slurmdbd down, permission, unparsable output)


@dataclass(frozen=True)
class SlurmJobRecord:
    """One accounting record: one run of the job (a requeue starts a new record, same job id)."""

    job_id: str  # JobID as shown (an array task: 123_4)
    job_id_raw: str  # JobIDRaw: the number SLURM_JOB_ID holds
    state: str  # the state word: PREEMPTED, REQUEUED, CANCELLED, COMPLETED, RUNNING, PENDING...
    state_text: str  # as sacct wrote it ("CANCELLED by 1000")
    submit: float | None = None  # epoch seconds
    start: float | None = None
    end: float | None = None
    elapsed: float | None = None  # seconds
    nodes: str | None = None
    exit_code: str | None = None  # "code:signal", as sacct writes it
    reason: str | None = None
    restarts: int | None = None  # None where the version has no Restarts field

    @property
    def started(self) -> bool:
        """Slurm ran the batch script for this record (a wait in the queue has no start)."""
        return self.start is not None and self.state not in ("PENDING", "REQUEUE_HOLD", "REQUEUE_FED")


@dataclass(frozen=True)
class SacctAnswer:
    """What the report got from ``sacct``: records, or one line saying why there are none."""

    status: SacctStatus
    records: tuple[SlurmJobRecord, ...] = ()
    reason: str = ""
    fields: tuple[str, ...] = ()


def _text(value: str) -> str | None:
    value = value.strip()
    if value in _NO_VALUE:
        return None
    value = printable(value)
    return value if len(value) <= MAX_TEXT else value[: MAX_TEXT - 1] + "…"


def parse_time(value: str, local_to_epoch: Callable[[time.struct_time], float] = time.mktime) -> float | None:
    """Epoch seconds (what ``SLURM_TIME_FORMAT=%s`` prints) or sacct's default ``2026-12-02T04:41:30``,
    which is the local time of the machine running sacct; ``Unknown``/``None`` (not started, not
    ended) is None."""
    value = value.strip()
    if value in _NO_VALUE:
        return None
    if value.isdigit():
        return float(value)
    try:
        return float(local_to_epoch(time.strptime(value, _ISO)))
    except (ValueError, OverflowError):
        return None


def parse_elapsed(value: str) -> float | None:
    """``[D-][HH:]MM:SS`` to seconds."""
    m = _ELAPSED.match(value.strip())
    if not m:
        return None
    days, hours, minutes, seconds = (int(g) if g else 0 for g in m.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def _int(value: str) -> int | None:
    value = value.strip()
    return int(value) if value.isdigit() else None


def parse_sacct(text: str, delimiter: str = "|",
                local_to_epoch: Callable[[time.struct_time], float] = time.mktime) -> tuple[SlurmJobRecord, ...]:
    """Records of ``sacct --parsable2`` output with its header line (``JobID|JobIDRaw|State|...``;
    ``delimiter``: what ``--delimiter`` asked for). Step lines (``123.batch``) are skipped: the report
    wants one line per run of the job. Raises ValueError when there is no header naming JobIDRaw and State."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise ValueError("sacct printed nothing (not even its header)")
    header = [h.strip() for h in lines[0].split(delimiter)]
    if "JobIDRaw" not in header or "State" not in header:
        raise ValueError(f"sacct's first line is not the expected header: {printable(lines[0][:120])}")
    out: list[SlurmJobRecord] = []
    for line in lines[1: MAX_RECORDS + 1]:
        cells = line.split(delimiter)
        if len(cells) != len(header):
            continue  # a value holding the delimiter would shift the columns: not trusted
        row = dict(zip(header, cells))
        raw = _text(row.get("JobIDRaw", "")) or ""
        if not raw or "." in raw:
            continue
        state_text = _text(row.get("State", "")) or "UNKNOWN"
        out.append(SlurmJobRecord(
            job_id=_text(row.get("JobID", "")) or raw, job_id_raw=raw,
            state=state_text.split()[0].rstrip("+").upper(), state_text=state_text,
            submit=parse_time(row.get("Submit", ""), local_to_epoch),
            start=parse_time(row.get("Start", ""), local_to_epoch),
            end=parse_time(row.get("End", ""), local_to_epoch),
            elapsed=parse_elapsed(row.get("Elapsed", "")),
            nodes=_text(row.get("NodeList", "")), exit_code=_text(row.get("ExitCode", "")),
            reason=_text(row.get("Reason", "")), restarts=_int(row.get("Restarts", "")),
        ))
    return tuple(out)


def classify_failure(returncode: int | None, output: str) -> tuple[SacctStatus, str, str | None]:
    """(status, one-line reason, a refused field to drop and retry without, or None) for a sacct
    that exited non-zero. ``output``: its stderr and stdout together."""
    if _DISABLED in output.lower():
        return SacctStatus.DISABLED, "Slurm accounting storage is disabled on this cluster", None
    invalid = _INVALID_FIELD.search(output)
    if invalid:
        return SacctStatus.ERROR, f"sacct refused field {invalid.group(1)}", invalid.group(1)
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    # sacct's last word is its conclusion ("Problem talking to the database: Connection refused"),
    # a fatal line the cause ("Could not establish a configuration source").
    said = next((line for line in lines if "fatal:" in line), lines[-1] if lines else "")
    said = _SACCT_PREFIX.sub("", said)
    said = printable(said if len(said) <= MAX_TEXT else said[: MAX_TEXT - 1] + "…")
    return SacctStatus.ERROR, f"sacct failed (exit {returncode}): {said or 'no message'}", None


__all__ = ["DELIMITER", "FIELDS", "FIELDS_WITHOUT_RESTARTS", "SacctAnswer", "SacctStatus", "SlurmJobRecord",
           "classify_failure", "parse_elapsed", "parse_sacct", "parse_time"]
