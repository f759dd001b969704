"""Pure parsers for Slurm's text output. No I/O, no clock: text in, frozen data out.

Text is the one interface every Slurm version has (22.05's JSON is unfilterable and gets exit codes
wrong, docs/slurm-versions.md), so the supervisor reads ``scontrol show job -o``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .version import SlurmVersion, SlurmVersionError

# States after which the job will not run again by itself (it may still be requeued by hand).
FINISHED_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "PREEMPTED",
        "NODE_FAIL",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
        "SPECIAL_EXIT",
    }
)
# States in which the job waits to run (again). REQUEUED / REQUEUE_HOLD / REQUEUE_FED show while a
# requeued job is being cleaned up, before it turns PENDING.
WAITING_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SUSPENDED"})
ACTIVE_STATES = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SIGNALING", "STAGE_OUT", "RESIZING"})
# Reasons of a held job (Priority=0 until `scontrol release`).
HOLD_REASONS = frozenset({"JobHeldUser", "JobHeldAdmin", "JobHoldMaxRequeue", "launch_failed_requeued_held"})
# The hold Slurm applies after more than MaxBatchRequeue batch requeues, in the spellings scontrol
# and the docs use (lower-cased, spaces as underscores).
MAX_REQUEUE_HOLD_REASONS = frozenset(
    {"jobholdmaxrequeue", "launch_failed_requeued_held", "launch_failure_limit_exceeded_requeued_held"}
)

_NONE_WORDS = frozenset({"", "None", "Unknown", "(null)", "N/A", "n/a", "NONE"})
_KEY_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_:/]*=")
_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S"
_JOB_ID_RE = re.compile(r"^(\d+)(?:;\S+)?$")
_SUBMITTED_RE = re.compile(r"Submitted batch job (\d+)")


class SlurmParseError(ValueError):
    """Slurm printed something this parser does not understand; the message quotes it."""


@dataclass(frozen=True)
class JobInfo:
    """One job as ``scontrol show job`` describes it. Times are epoch seconds (local time), or None."""

    job_id: int
    state: str  # JobState, e.g. RUNNING, PENDING, COMPLETED, REQUEUED
    reason: str | None = None  # Reason, e.g. BeginTime, NonZeroExitCode; None when "None"
    name: str | None = None
    partition: str | None = None
    qos: str | None = None  # QOS: its GraceTime applies under PreemptType=preempt/qos
    restarts: int = 0  # Restarts: how many times the job was requeued
    requeue: bool = False  # Requeue=1: the job may be requeued
    batch_flag: int = 0  # BatchFlag: 1 for a batch job (grows on some requeue paths)
    exit_code: int | None = None  # ExitCode=<code>:<signal>
    exit_signal: int | None = None
    submit_time: float | None = None
    eligible_time: float | None = None
    start_time: float | None = None
    end_time: float | None = None  # during grace: PreemptTime + GraceTime, the deadline
    preempt_time: float | None = None  # set when the job was selected for preemption
    time_limit: int | None = None  # seconds; None when UNLIMITED / unset
    run_time: int | None = None  # seconds
    nodes: str | None = None  # NodeList as Slurm prints it, e.g. "n[1-2]"
    req_nodes: str | None = None  # ReqNodeList
    exc_nodes: str | None = None  # ExcNodeList
    num_nodes: int | None = None
    batch_host: str | None = None
    std_out: str | None = None
    std_err: str | None = None
    work_dir: str | None = None
    array_job_id: int | None = None
    array_task_id: int | None = None
    priority: int | None = None  # Priority; 0 while held
    # The full state where Slurm shows more than JobState's one word: ``scontrol show job --json``
    # (23.02+) gives e.g. ("CANCELLED", "COMPLETING") during a cancel's kill window, where the text
    # says only COMPLETING. Empty when only the text was read.
    state_flags: tuple[str, ...] = ()
    raw: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    @property
    def node_names(self) -> tuple[str, ...]:
        return expand_hostlist(self.nodes or "")

    @property
    def exc_node_names(self) -> tuple[str, ...]:
        return expand_hostlist(self.exc_nodes or "")

    @property
    def is_pending(self) -> bool:
        """Waiting to run (again): pending, or a requeue still being cleaned up."""
        return self.state in WAITING_STATES

    @property
    def is_running(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def is_finished(self) -> bool:
        return self.state in FINISHED_STATES

    @property
    def in_grace(self) -> bool:
        """Selected for preemption and still running: EndTime is the deadline to plan for."""
        return self.preempt_time is not None and self.is_running

    @property
    def grace_deadline(self) -> float | None:
        """EndTime while in grace (Slurm pulls it in to PreemptTime + GraceTime), else None."""
        return self.end_time if self.in_grace else None

    def has_state(self, name: str) -> bool:
        """JobState is ``name``, or the full state (``state_flags``) holds it."""
        return self.state == name or self.state.startswith(name + "+") or name in self.state_flags

    @property
    def is_cancelled(self) -> bool:
        """``scancel`` (by a person, or an admin). While the job's processes are still being killed
        (the kill window) the text of 24.11/26.05 says only JobState=COMPLETING; the cancel shows in
        the full state (``state_flags``, read from ``--json`` by the CLI backend then) and, once the
        job is gone, as JobState=CANCELLED (tests/data/slurm/<release>/cancel_*)."""
        return self.has_state("CANCELLED")

    @property
    def is_held(self) -> bool:
        """Pending and held: it will not start until someone runs ``scontrol release``."""
        return self.state in WAITING_STATES and (
            self.priority == 0 or (self.reason or "") in HOLD_REASONS or self.held_for_max_requeue
        )

    @property
    def held_for_max_requeue(self) -> bool:
        """Held by Slurm after more than MaxBatchRequeue batch requeues (``JobHoldMaxRequeue``;
        scontrol prints the reason as ``launch_failed_requeued_held``)."""
        reason = (self.reason or "").lower().replace(" ", "_")
        return reason in MAX_REQUEUE_HOLD_REASONS

    def seconds_left(self, now: float) -> float | None:
        """Seconds until EndTime (the time limit, or the grace deadline in grace); None if unknown."""
        return None if self.end_time is None else self.end_time - now


def parse_fields(line: str) -> dict[str, str]:
    """Split one ``-o`` line into its ``Key=Value`` fields.

    Values may hold spaces (JobName, Command, Comment) and ``=`` (TRES=cpu=2,node=1), so a new field
    starts only at a space followed by ``Key=``; anything else continues the previous value. (A
    value that itself holds `` word=`` after a space, e.g. JobName "a b=c", is ambiguous in Slurm's
    text and splits there.)
    """
    fields: dict[str, str] = {}
    key: str | None = None
    for token in line.strip().split(" "):
        match = _KEY_RE.match(token)
        if match:
            key = token[: match.end() - 1]
            fields[key] = token[match.end() :]
        elif key is not None:
            fields[key] = f"{fields[key]} {token}"
        elif token:
            raise SlurmParseError(f"scontrol output does not start with Key=Value: {line[:120]!r}")
    return {k: v.strip() for k, v in fields.items()}


def parse_scontrol_jobs(text: str) -> list[JobInfo]:
    """Every job in ``scontrol show job -o`` output (one line each; an array prints one per task)."""
    return [job_info_from_fields(parse_fields(line)) for line in text.splitlines() if line.strip()]


def parse_scontrol_job(text: str, job_id: int | str | None = None) -> JobInfo:
    """The job ``job_id`` (or the only/first job) in ``scontrol show job -o`` output."""
    jobs = parse_scontrol_jobs(text)
    if not jobs:
        raise SlurmParseError("scontrol printed no job")
    if job_id is not None:
        wanted = str(job_id)
        for job in jobs:
            if str(job.job_id) == wanted or _array_name(job) == wanted:
                return job
    return jobs[0]


def job_info_from_fields(fields: Mapping[str, str]) -> JobInfo:
    """Build a :class:`JobInfo` from parsed fields; unknown or missing fields become None."""
    if "JobId" not in fields or "JobState" not in fields:
        raise SlurmParseError(f"no JobId/JobState in scontrol output: {sorted(fields)[:12]}")
    exit_code, exit_signal = _exit_code(fields.get("ExitCode"))
    return JobInfo(
        job_id=_int(fields["JobId"], "JobId"),
        state=fields["JobState"].strip(),
        reason=_text(fields.get("Reason")),
        name=_text(fields.get("JobName")),
        partition=_text(fields.get("Partition")),
        qos=_text(fields.get("QOS")),
        restarts=_int_or_none(fields.get("Restarts")) or 0,
        requeue=fields.get("Requeue", "0").strip() == "1",
        batch_flag=_int_or_none(fields.get("BatchFlag")) or 0,
        exit_code=exit_code,
        exit_signal=exit_signal,
        submit_time=parse_time(fields.get("SubmitTime")),
        eligible_time=parse_time(fields.get("EligibleTime")),
        start_time=parse_time(fields.get("StartTime")),
        end_time=parse_time(fields.get("EndTime")),
        preempt_time=parse_time(fields.get("PreemptTime")),
        time_limit=parse_duration(fields.get("TimeLimit")),
        run_time=parse_duration(fields.get("RunTime")),
        nodes=_text(fields.get("NodeList")),
        req_nodes=_text(fields.get("ReqNodeList")),
        exc_nodes=_text(fields.get("ExcNodeList")),
        num_nodes=_int_or_none(fields.get("NumNodes", "").split("-")[0]),
        batch_host=_text(fields.get("BatchHost")),
        std_out=_text(fields.get("StdOut")),
        std_err=_text(fields.get("StdErr")),
        work_dir=_text(fields.get("WorkDir")),
        array_job_id=_int_or_none(fields.get("ArrayJobId")),
        array_task_id=_int_or_none(fields.get("ArrayTaskId")),
        priority=_int_or_none(fields.get("Priority")),
        raw=MappingProxyType(dict(fields)),
    )


def parse_time(value: str | None) -> float | None:
    """``2026-11-30T13:54:56`` (local time) to epoch seconds; None/Unknown/N/A to None."""
    if value is None or value.strip() in _NONE_WORDS:
        return None
    try:
        return float(time.mktime(time.strptime(value.strip(), _TIME_FORMAT)))
    except ValueError as exc:
        raise SlurmParseError(f"not a Slurm time (want YYYY-MM-DDTHH:MM:SS): {value!r}") from exc


def parse_duration(value: str | None) -> int | None:
    """``[D-]HH:MM:SS`` / ``MM:SS`` to seconds; UNLIMITED, NOT_SET, Partition_Limit to None."""
    if value is None:
        return None
    text = value.strip()
    if not text or text in _NONE_WORDS or not text[0].isdigit():
        return None
    days = 0
    if "-" in text:
        day_text, text = text.split("-", 1)
        days = int(day_text)
    parts = [int(p) for p in text.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    hours, minutes, seconds = parts[-3:]
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def parse_json_state(text: str, job_id: int | str | None = None) -> tuple[str, ...]:
    """The full job state from ``scontrol show job --json`` (23.02+): ``["CANCELLED", "COMPLETING"]``
    (data_parser v0.0.40+, a list) or ``"CANCELLED"`` / ``"CANCELLED+COMPLETING"`` (a string).
    Empty when the text holds no such job."""
    import json

    try:
        data = json.loads(text)
    except ValueError as exc:
        raise SlurmParseError(f"scontrol --json printed no JSON: {text.strip()[:120]!r}") from exc
    jobs = data.get("jobs") if isinstance(data, dict) else None
    for entry in jobs or []:
        if not isinstance(entry, dict):
            continue
        if job_id is not None and str(entry.get("job_id")) != str(job_id):
            continue
        value = entry.get("job_state")
        if isinstance(value, list):
            return tuple(str(v).upper() for v in value)
        if isinstance(value, str):
            return tuple(part.upper() for part in re.split(r"[+,\s]+", value) if part)
    return ()


def parse_sbatch_job_id(text: str) -> int:
    """The job id from ``sbatch --parsable`` (``123`` or ``123;cluster``) or plain sbatch output."""
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        match = _JOB_ID_RE.match(line) or _SUBMITTED_RE.search(line)
        if match:
            return int(match.group(1))
    raise SlurmParseError(f"no job id in sbatch output: {text.strip()[:200]!r}")


def parse_version(text: str) -> SlurmVersion:
    """``slurm 22.05.8`` / ``slurm-wlm 22.05.8`` / ``slurm 24.05.0-0rc1`` to a :class:`SlurmVersion`
    (a ``(major, minor, patch)`` tuple with capability properties). The parsing is
    :meth:`SlurmVersion.parse`, the only one; this raises the facade's :class:`SlurmParseError`."""
    try:
        return SlurmVersion.parse(text)
    except SlurmVersionError as exc:
        raise SlurmParseError(str(exc)) from exc


def expand_hostlist(hostlist: str) -> tuple[str, ...]:
    """``n[1-3,7],gpu05`` to ``("n1", "n2", "n3", "n7", "gpu05")``; keeps zero padding."""
    text = hostlist.strip()
    if text in _NONE_WORDS:
        return ()
    names: list[str] = []
    for part in _split_top_level(text):
        names.extend(_expand_one(part))
    return tuple(names)


def _split_top_level(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in (p.strip() for p in parts) if p]


def _expand_one(pattern: str) -> list[str]:
    open_at = pattern.find("[")
    if open_at < 0:
        return [pattern]
    close_at = pattern.find("]", open_at)
    if close_at < 0:
        raise SlurmParseError(f"unbalanced '[' in host list {pattern!r}")
    prefix, body, rest = pattern[:open_at], pattern[open_at + 1 : close_at], pattern[close_at + 1 :]
    tails = _expand_one(rest)
    out: list[str] = []
    for item in body.split(","):
        for number in _expand_range(item.strip(), pattern):
            out.extend(prefix + number + tail for tail in tails)
    return out


def _expand_range(item: str, pattern: str) -> list[str]:
    if "-" not in item:
        return [item]
    low, high = item.split("-", 1)
    if not (low.isdigit() and high.isdigit()) or int(high) < int(low):
        raise SlurmParseError(f"bad range {item!r} in host list {pattern!r}")
    width = len(low)
    return [str(n).zfill(width) for n in range(int(low), int(high) + 1)]


def _array_name(job: JobInfo) -> str | None:
    if job.array_job_id is None or job.array_task_id is None:
        return None
    return f"{job.array_job_id}_{job.array_task_id}"


def _text(value: str | None) -> str | None:
    if value is None or value.strip() in _NONE_WORDS:
        return None
    return value.strip()


def _int(value: str, key: str) -> int:
    try:
        return int(value.strip())
    except ValueError as exc:
        raise SlurmParseError(f"{key}={value!r} is not an integer") from exc


def _int_or_none(value: str | None) -> int | None:
    if value is None:
        return None
    text = value.strip()
    return int(text) if text.isdigit() else None


def _exit_code(value: str | None) -> tuple[int | None, int | None]:
    if not value or ":" not in value:
        return None, None
    code, signal = value.strip().split(":", 1)
    return _int_or_none(code), _int_or_none(signal)
