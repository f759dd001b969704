"""The post-mortem as data: a pure fold of the event log and the attempt manifests.

``fold`` takes what was read from the run directory (events in file order, manifests, the checkpoint
scan, the quarantined files) and returns a frozen :class:`Report`. No I/O and no clock here, so the
same log always gives the same report, on any machine, long after the job is gone.

File order, not timestamps, orders events: one supervisor writes at a time, while clocks of the
nodes that successive requeues land on may disagree.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ...budget import run_verdict
from ...config import BudgetConfig
from ...events import FORMAT_VERSION, Event
from ...fields import as_float, as_int, as_str
from ...ledger import (
    NOT_FAILURES,
    SCHEDULER_ENDS,
    AttemptRecord,
    ResultsCheck,
    final_run_end,
    ledger_from_events,
    loss_anomalies,
    results_check,
)
from ...signals import signal_name
from ...states import Action, RunOutcome, Verdict
from .accounting import AccountingView
from .drift import DriftItem, find_drift

# The ledger's definitions, as the strings the report shows: one definition of "not a failure".
NOT_A_FAILURE = frozenset(c.value for c in NOT_FAILURES)
STOPPED_BY_SCHEDULER = frozenset(c.value for c in SCHEDULER_ENDS)


# ---------------------------------------------------------------------------------------------
# The report's parts


@dataclass(frozen=True)
class AttemptRow:
    """One launch of the child: where, from what, how far, how it ended, and what it cost."""

    attempt: int
    job_id: str | None = None
    restart_count: int | None = None
    host: str | None = None
    nodes: tuple[str, ...] = ()
    pid: int | None = None
    start: float | None = None
    end: float | None = None
    duration: float | None = None
    resume_path: str | None = None
    resume_step: int | None = None
    first_step: int | None = None
    last_step: int | None = None
    last_durable_step: int | None = None
    last_rate: float | None = None  # steps/s in the newest progress event
    last_progress_ts: float | None = None
    last_loss: float | None = None  # the loss in the newest progress event that carried one
    max_step: int | None = None  # the step the training ends at (its client's report, else the config's)
    saves_ok: int = 0
    saves_failed: int = 0
    exit_code: int | None = None
    signal: str | None = None
    end_class: str | None = None  # "class" in JSON
    action: str | None = None
    evidence: str | None = None  # the first line of the first failure
    evidence_lines: tuple[str, ...] = ()  # every evidence line of the first failure (bounded)
    context_lines: tuple[str, ...] = ()  # the output around it, as the failure event kept it (bounded)
    evidence_step: int | None = None
    failure_node: str | None = None
    failure_reason: str | None = None
    decision: str | None = None  # the reason given for restart / requeue / stop
    steps_lost: int | None = None
    steps_lost_at_least: bool = False  # the last step is the last one printed: at least this many were lost
    wall_lost: float | None = None
    ended: bool = False  # an attempt_end was logged
    notice: bool = False  # a stop notice arrived during the attempt
    resume_mismatch: str | None = None  # the audit's reason, when the child started elsewhere

    @property
    def failed(self) -> bool:
        return self.end_class is not None and self.end_class not in NOT_A_FAILURE

    @property
    def preempted(self) -> bool:
        return self.notice or self.end_class in STOPPED_BY_SCHEDULER


@dataclass(frozen=True)
class JobRow:
    """One supervisor session (one ``run_start``): usually one Slurm allocation or requeue of it."""

    session: int
    job_id: str | None
    restart_count: int | None
    host: str | None
    start: float | None
    attempts: tuple[int, ...]
    ended_by: str | None  # run_end outcome of this session, None when it has none


@dataclass(frozen=True)
class RunInfo:
    name: str | None = None
    run_dir: str | None = None
    checkpoint_dir: str | None = None
    outcome: str | None = None  # RunOutcome of the last run_end; None = running or killed
    exit_code: int | None = None
    reason: str | None = None
    start: float | None = None
    end: float | None = None
    duration: float | None = None
    attempts: int = 0
    restarts: int = 0  # relaunches inside one session
    requeues: int = 0  # sessions after the first
    final_step: int | None = None
    steps_lost: int = 0
    steps_lost_at_least: bool = False  # some losses are lower bounds (zero-code: steps from the output)
    wall_lost: float = 0.0
    jobs: tuple[JobRow, ...] = ()
    config_hashes: tuple[str, ...] = ()
    manifests: tuple[int, ...] = ()  # attempts with a provenance manifest (drift is checked among them)
    format_versions: tuple[int, ...] = ()
    problems: tuple[str, ...] = ()  # what a human should look at; non-empty = exit 1
    results_check: ResultsCheck | None = None  # failures that can corrupt results silently, if any


@dataclass(frozen=True)
class VerdictView:
    """The run's verdict, the one ``supervise audit`` prints too (``budget.run_verdict``): what the
    ``run_end`` says when the run stopped, else the budgets judged over the ledger."""

    ok: bool | None
    budget: str | None  # the budget or policy key that stopped (or would stop) the run
    reason: str
    numbers: Mapping[str, Any]
    source: str  # "judge" | "run_end" | "log" (the last budget event, when no attempt is known)


@dataclass(frozen=True)
class CheckpointRow:
    file: str
    size: int | None
    verdict: str | None  # a Verdict value; None = not checked (validator unavailable)
    step: int | None
    format: str | None = None
    level: int | str | None = None  # validation ladder level (0..4) reached or failed
    reason: str | None = None


@dataclass(frozen=True)
class QuarantineFile:
    """A ``CORRUPT_*`` entry found on disk, with its sidecar when readable (input to the fold)."""

    name: str
    size: int | None
    sidecar: Mapping[str, Any] | None


@dataclass(frozen=True)
class QuarantineRow:
    file: str  # the CORRUPT_* name
    original: str | None
    size: int | None
    reason: str | None
    level: int | str | None
    format: str | None
    step: int | None
    attempt: int | None
    ts: float | None
    on_disk: bool
    sidecar: bool


@dataclass(frozen=True)
class StepPoint:
    """(wall-clock, step) of one attempt, for the plot."""

    attempt: int
    ts: float
    step: int
    kind: str  # start | progress | save | end


@dataclass(frozen=True)
class EventsSummary:
    counts: Mapping[str, int]
    notices: tuple[Mapping[str, Any], ...] = ()
    requeues: tuple[Mapping[str, Any], ...] = ()
    arbitrations: tuple[Mapping[str, Any], ...] = ()
    decisions: tuple[Mapping[str, Any], ...] = ()
    stalls: tuple[Mapping[str, Any], ...] = ()
    slowdowns: tuple[Mapping[str, Any], ...] = ()
    loss_anomalies: tuple[Mapping[str, Any], ...] = ()
    resume_mismatches: tuple[Mapping[str, Any], ...] = ()
    save_aborted: tuple[Mapping[str, Any], ...] = ()
    warnings: tuple[Mapping[str, Any], ...] = ()  # warning events written by the supervisor
    control_dropped: int = 0
    control_dropped_by_reason: Mapping[str, int] = field(default_factory=dict)
    last_checkpoint: Mapping[str, Any] | None = None  # the newest save_end with ok


@dataclass(frozen=True)
class Report:
    run: RunInfo
    attempts: tuple[AttemptRow, ...]
    verdict: VerdictView | None
    checkpoints: tuple[CheckpointRow, ...] | None  # None = not scanned
    quarantined: tuple[QuarantineRow, ...]
    drift: tuple[DriftItem, ...]
    events_summary: EventsSummary
    warnings: tuple[str, ...]
    series: tuple[StepPoint, ...] = ()  # for the plot; not part of the JSON
    accounting: AccountingView | None = None  # Slurm's history (report/accounting.py); None = not asked

    def to_json(self) -> dict[str, Any]:
        """Machine output with stable top-level keys."""
        return {
            "run": _plain(self.run),
            "attempts": [_attempt_json(a) for a in self.attempts],
            "verdict": _plain(self.verdict),
            "checkpoints": _plain(self.checkpoints),
            "quarantined": _plain(self.quarantined),
            "drift": _plain(self.drift),
            "events_summary": _plain(self.events_summary),
            "warnings": list(self.warnings),
            "accounting": self.accounting.to_json() if self.accounting is not None else None,
        }


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Enum) and isinstance(value.value, (str, int)):
        return value.value
    return value


def _attempt_json(row: AttemptRow) -> dict[str, Any]:
    out: dict[str, Any] = _plain(row)
    out["class"] = out.pop("end_class")
    return out


# ---------------------------------------------------------------------------------------------
# Tolerant field readers: the log may come from another version or be hand-edited










def _evidence_line(v: Any) -> str | None:
    if isinstance(v, str):
        return v.strip() or None
    if isinstance(v, (list, tuple)):
        for line in v:
            if isinstance(line, str) and line.strip():
                return line.strip()
    return None


# The report is shared as a file: evidence is kept whole enough to read, never unbounded.
MAX_EVIDENCE_LINES = 40
MAX_EVIDENCE_CHARS = 1000


def _lines(v: Any) -> tuple[str, ...]:
    """Non-empty lines of an evidence/context field (a string or a list), each cut to a readable length."""
    items = v.splitlines() if isinstance(v, str) else v if isinstance(v, (list, tuple)) else ()
    out = []
    for line in items:
        if isinstance(line, str) and line.strip():
            text = line.rstrip()
            out.append(text if len(text) <= MAX_EVIDENCE_CHARS else text[: MAX_EVIDENCE_CHARS - 1] + "…")
        if len(out) == MAX_EVIDENCE_LINES:
            break
    return tuple(out)


def _record(ev: Event, attempt: int | None) -> dict[str, Any]:
    out: dict[str, Any] = {"ts": ev.ts}
    if attempt is not None:
        out["attempt"] = attempt
    out.update(ev.fields)
    return out


# ---------------------------------------------------------------------------------------------
# The fold


@dataclass
class _Acc:
    """Mutable accumulator for one attempt while folding; frozen into an AttemptRow at the end."""

    attempt: int
    session: int
    fields: dict[str, Any] = field(default_factory=dict)
    steps: list[tuple[float, int, str]] = field(default_factory=list)
    durable: int | None = None
    durable_ts: float | None = None
    saves_ok: int = 0
    saves_failed: int = 0
    first_reported: int | None = None
    last_rate: float | None = None
    last_progress_ts: float | None = None
    last_loss: float | None = None
    max_step: int | None = None
    notice: bool = False
    failure: dict[str, Any] | None = None
    decision: str | None = None
    mismatch: str | None = None
    determinism: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Session:
    """One ``run_start`` (one supervisor process: an allocation, or a requeue of it)."""

    fields: dict[str, Any]
    ts: float
    attempts: list[int] = field(default_factory=list)
    ended_by: str | None = None


# Events listed as they are in the summary (the attempt they belong to added).
_LISTED = {"requeue": "requeues", "arbitration": "arbitrations", "stall": "stalls", "slowdown": "slowdowns",
           "loss_anomaly": "loss_anomalies", "save_aborted": "save_aborted", "warning": "warnings",
           "budget": "budget", "quarantine": "quarantine", "resume_point": "resume_point",
           "decision": "decisions", "notice": "notices", "resume_mismatch": "resume_mismatches",
           "slow_node": "warnings", "diagnosis": "warnings"}


class _Walk:
    """One pass over the events in file order; each event name has its handler."""

    def __init__(self) -> None:
        self.accs: dict[int, _Acc] = {}
        self.sessions: list[_Session] = []
        self.counts: dict[str, int] = {}
        self.listed: dict[str, list[dict[str, Any]]] = {k: [] for k in _LISTED.values()}
        self.dropped = 0
        self.dropped_by: dict[str, int] = {}
        self.run_start: dict[str, Any] = {}
        self.run_end: dict[str, Any] | None = None
        self.current: int | None = None  # the attempt events without an "attempt" field belong to
        self.last_save: dict[str, Any] | None = None

    def acc(self, n: int | None) -> _Acc | None:
        if n is None:
            return None
        if n not in self.accs:  # an attempt whose attempt_start was lost, or not yet written
            self.accs[n] = _Acc(n, max(len(self.sessions) - 1, 0))
        return self.accs[n]

    def feed(self, ev: Event) -> None:
        self.counts[ev.event] = self.counts.get(ev.event, 0) + 1
        handler = getattr(self, f"on_{ev.event}", None)
        if ev.event in ("run_start", "run_end", "attempt_start", "control_dropped"):
            handler(ev)  # type: ignore[misc]
            return
        n = as_int(ev.get("attempt"))
        acc = self.acc(n if n is not None else self.current)
        if ev.event in _LISTED:
            self.listed[_LISTED[ev.event]].append(_record(ev, acc.attempt if acc else None))
        if handler is not None and acc is not None:
            handler(ev, acc)

    # -- run and attempt boundaries

    def on_run_start(self, ev: Event) -> None:
        self.sessions.append(_Session(dict(ev.fields), ev.ts))
        self.run_start.update({k: v for k, v in ev.fields.items() if v is not None})
        self.run_start.setdefault("ts", ev.ts)  # the run began with its first session
        self.current = None

    def on_run_end(self, ev: Event) -> None:
        self.run_end = dict(ev.fields, ts=ev.ts)
        if self.sessions:
            self.sessions[-1].ended_by = as_str(ev.get("outcome"))

    def on_attempt_start(self, ev: Event) -> None:
        n = as_int(ev.get("attempt"))
        if n is None:
            return
        self.current = n
        if not self.sessions:
            self.sessions.append(_Session({}, ev.ts))
        acc = self.acc(n)
        assert acc is not None
        acc.session = len(self.sessions) - 1
        self.sessions[-1].attempts.append(n)
        acc.fields.update({k: v for k, v in ev.fields.items() if v is not None})
        acc.fields["start"] = ev.ts
        start_step = as_int(ev.get("resume_step"))
        if start_step is not None:
            acc.steps.append((ev.ts, start_step, "start"))

    def on_attempt_end(self, ev: Event, acc: _Acc) -> None:
        acc.fields.update({f"end_{k}": v for k, v in ev.fields.items()})
        acc.fields["end"] = ev.ts
        acc.fields["ended"] = True
        last = as_int(ev.get("last_step"))
        if last is not None:
            acc.steps.append((ev.ts, last, "end"))

    def on_control_dropped(self, ev: Event) -> None:
        count = as_int(ev.get("count")) or 0
        self.dropped += count
        by = ev.get("by_reason")
        if isinstance(by, Mapping):
            for k, v in by.items():
                self.dropped_by[str(k)] = self.dropped_by.get(str(k), 0) + (as_int(v) or 0)
        elif ev.get("reason"):
            key = str(ev.get("reason"))
            self.dropped_by[key] = self.dropped_by.get(key, 0) + count

    # -- inside an attempt

    def on_resume_point(self, ev: Event, acc: _Acc) -> None:
        acc.fields.setdefault("resume_path", ev.get("path"))
        acc.fields.setdefault("resume_step", ev.get("step"))

    def on_progress(self, ev: Event, acc: _Acc) -> None:
        step = as_int(ev.get("step"))
        if step is not None:
            acc.steps.append((ev.ts, step, "progress"))
            acc.last_rate = as_float(ev.get("rate"))
            acc.last_progress_ts = ev.ts
            loss, max_step = as_float(ev.get("loss")), as_int(ev.get("max_step"))
            acc.last_loss = loss if loss is not None and math.isfinite(loss) else acc.last_loss
            acc.max_step = max_step if max_step is not None and max_step > 0 else acc.max_step

    def on_resumed(self, ev: Event, acc: _Acc) -> None:
        step = as_int(ev.get("step"))
        if acc.first_reported is None and step is not None:
            acc.first_reported = step
            acc.steps.append((ev.ts, step, "progress"))

    def on_resume_mismatch(self, ev: Event, acc: _Acc) -> None:
        acc.mismatch = as_str(ev.get("reason")) or (
            f"expected step {ev.get('expected_step')}, child started at {ev.get('got_step')}")

    def on_save_end(self, ev: Event, acc: _Acc) -> None:
        if ev.get("ok", True) is False:
            acc.saves_failed += 1
            return
        acc.saves_ok += 1
        self.last_save = _record(ev, acc.attempt)
        step = as_int(ev.get("step"))
        if step is not None:
            acc.steps.append((ev.ts, step, "save"))
            if acc.durable is None or step >= acc.durable:
                acc.durable, acc.durable_ts = step, ev.ts

    def on_failure(self, ev: Event, acc: _Acc) -> None:
        if acc.failure is None:  # the first one: later ones are consequences
            acc.failure = dict(ev.fields)

    def on_decision(self, ev: Event, acc: _Acc) -> None:
        acc.decision = as_str(ev.get("reason"))

    def on_notice(self, ev: Event, acc: _Acc) -> None:
        acc.notice = True

    def on_determinism(self, ev: Event, acc: _Acc) -> None:
        settings = ev.get("settings")
        acc.determinism.update(settings if isinstance(settings, Mapping)
                               else {k: v for k, v in ev.fields.items() if k != "attempt"})


def fold(
    events: Sequence[Event],
    manifests: Mapping[int, Mapping[str, Any]],
    *,
    checkpoints: Sequence[CheckpointRow] | None = None,
    quarantine_files: Sequence[QuarantineFile] = (),
    budget_config: BudgetConfig | None = None,
    bad_lines: int = 0,
    versions: Iterable[int] = (),
    warnings: Sequence[str] = (),
) -> Report:
    """Fold the event log (file order) and the manifests into a :class:`Report`."""
    warn: list[str] = list(warnings)
    versions = tuple(versions)
    if bad_lines:
        warn.append(f"{bad_lines} line(s) of events.jsonl are not valid records (garbage, or a torn "
                    "last line from a killed supervisor); they were skipped")
    other = sorted(v for v in set(versions) if v != FORMAT_VERSION)
    if other:
        warn.append(f"events.jsonl has format version(s) {', '.join(map(str, other))}; this supervise "
                    f"reads version {FORMAT_VERSION}: fields it does not know are ignored, the report "
                    "may be incomplete")
    if not events:
        warn.append("the event log is empty: no supervisor has written to this run yet")
    elif not any(e.event == "run_start" for e in events):
        warn.append("no run_start event: the start of the log is missing")

    walk = _Walk()
    for ev in events:
        walk.feed(ev)
    said = [ev for ev in events if ev.event == "resumability"]
    if said and said[-1].get("ok") is False:  # the newest statement wins (a later save may have fixed it)
        warn.append(f"attempt {said[-1].get('attempt')}: {said[-1].get('reason') or 'this run cannot resume'}")
    records = ledger_from_events(events)  # the one fold of the log into attempts
    budget = budget_config or BudgetConfig()

    running = final_run_end(events) is None
    rows = []
    for i, record in enumerate(records):
        live = running and i == len(records) - 1
        row = _attempt_row(record, walk.accs.get(record.attempt), walk.sessions)
        if not row.ended and not live:
            warn.append(f"attempt {record.attempt} has no attempt_end (the supervisor was killed?): its end, "
                        "class and losses are unknown or derived from the last events seen")
        rows.append(row)
    attempts = tuple(rows)

    missing = [a.attempt for a in attempts if a.attempt not in manifests]
    if missing:
        warn.append(f"no manifest for attempt(s) {', '.join(map(str, missing))}: provenance and "
                    "drift are not checked for them")
    order = sorted(walk.accs)
    client_det = {n: walk.accs[n].determinism for n in order if walk.accs[n].determinism}
    late = sorted(n for n, det in client_det.items() if det.get("applied_after_cuda_init") is True)
    if late:
        warn.append(f"attempt(s) {', '.join(map(str, late))}: determinism settings were applied after CUDA "
                    "was initialised; CUBLAS_WORKSPACE_CONFIG may not have taken effect")

    drift = find_drift(manifests, client_det)
    verdict = _verdict(events, records, walk.listed["budget"], budget)
    check = results_check(records, loss_anomalies(events), budget.results_check_crash_free_steps)
    quarantined = _quarantine_rows(walk.listed["quarantine"], quarantine_files)
    # An earlier session's run_end (a requeue) is not the outcome of a run that went on since.
    run = _run_info(walk.run_start, None if running else walk.run_end, walk.sessions, attempts, versions,
                    manifests)
    listed = {k: tuple(v) for k, v in walk.listed.items() if k not in ("budget", "quarantine", "resume_point")}
    summary = EventsSummary(counts=dict(sorted(walk.counts.items())), control_dropped=walk.dropped,
                            control_dropped_by_reason=walk.dropped_by, last_checkpoint=walk.last_save,
                            **listed)
    problems = _problems(run, attempts, verdict, checkpoints, drift, summary, check)
    run = dataclasses.replace(run, problems=tuple(problems), results_check=check)
    series = tuple(StepPoint(n, ts, step, kind) for n in order for ts, step, kind in walk.accs[n].steps)
    return Report(run=run, attempts=attempts, verdict=verdict,
                  checkpoints=None if checkpoints is None else tuple(checkpoints),
                  quarantined=quarantined, drift=drift, events_summary=summary,
                  warnings=tuple(warn), series=series)


def _attempt_row(record: AttemptRecord, acc: _Acc | None, sessions: list[_Session]) -> AttemptRow:
    """The ledger's record of one attempt (steps, losses, class: the numbers audit and the budgets
    use too) with what only the report shows (host, pid, rate, saves, notices)."""
    acc = acc if acc is not None else _Acc(record.attempt, max(len(sessions) - 1, 0))
    f = acc.fields
    sess = sessions[acc.session].fields if acc.session < len(sessions) else {}
    fail = acc.failure or {}
    duration = as_float(f.get("end_duration"))
    if duration is None and record.start is not None and record.end is not None:
        duration = max(record.end - record.start, 0.0)
    action = record.action.value if record.action else as_str(f.get("end_action")) or as_str(fail.get("action"))
    session = sessions[acc.session] if acc.session < len(sessions) else None
    if (record.end is not None and session is not None and session.attempts[-1:] == [record.attempt]
            and session.ended_by in (RunOutcome.STOPPED.value, RunOutcome.FAILED.value)):
        # The failure event carries what the class's policy said (restart) before a budget stopped
        # the run; nothing was restarted after the last attempt of a stopped run: its action is stop.
        action = Action.STOP.value
    return AttemptRow(
        attempt=record.attempt,
        job_id=record.job_id or as_str(sess.get("job_id")),
        restart_count=record.restart_count if record.restart_count is not None else as_int(sess.get("restart_count")),
        host=as_str(f.get("host")) or as_str(sess.get("host")),
        nodes=record.nodes,
        pid=as_int(f.get("pid")),
        start=record.start, end=record.end, duration=duration,
        resume_path=record.resume_path, resume_step=record.resume_step,
        first_step=record.first_step, last_step=record.last_step, last_durable_step=record.last_durable_step,
        last_rate=acc.last_rate, last_progress_ts=acc.last_progress_ts, last_loss=acc.last_loss,
        max_step=acc.max_step,
        saves_ok=acc.saves_ok, saves_failed=acc.saves_failed,
        exit_code=record.exit_code,
        signal=signal_name(record.signal) if record.signal is not None else None,
        end_class=record.cls.value if record.cls else as_str(f.get("end_class")) or as_str(fail.get("class")),
        action=action,
        evidence=_evidence_line(record.evidence),
        evidence_lines=_lines(record.evidence or fail.get("evidence")),
        context_lines=_lines(fail.get("context")),
        evidence_step=record.failure_step,
        failure_node=record.failure_node,
        failure_reason=record.failure_reason,
        decision=acc.decision,
        steps_lost=record.steps_lost, steps_lost_at_least=record.steps_lost_at_least, wall_lost=record.wall_lost,
        ended=record.end is not None, notice=acc.notice, resume_mismatch=acc.mismatch,
    )


def _run_info(run_start: Mapping[str, Any], run_end: Mapping[str, Any] | None,
              sessions: list[_Session], attempts: tuple[AttemptRow, ...],
              versions: Iterable[int], manifests: Mapping[int, Mapping[str, Any]]) -> RunInfo:
    jobs = tuple(
        JobRow(session=i + 1, job_id=as_str(s.fields.get("job_id")),
               restart_count=as_int(s.fields.get("restart_count")),
               host=as_str(s.fields.get("host")), start=s.ts, attempts=tuple(s.attempts), ended_by=s.ended_by)
        for i, s in enumerate(sessions))
    restarts = sum(max(len(j.attempts) - 1, 0) for j in jobs)
    starts = [a.start for a in attempts if a.start is not None]
    start = as_float(run_start.get("ts")) if run_start.get("ts") is not None else (min(starts) if starts else None)
    end = as_float(run_end.get("ts")) if run_end else None
    steps = [a.last_step for a in attempts if a.last_step is not None]
    if run_end and as_int(run_end.get("last_step")) is not None:
        steps.append(as_int(run_end.get("last_step")))  # type: ignore[arg-type]
    hashes: list[str] = []
    for n in sorted(manifests):
        h = manifests[n].get("config_hash")
        if isinstance(h, str) and h not in hashes:
            hashes.append(h)
    if not hashes and isinstance(run_start.get("config_hash"), str):
        hashes.append(run_start["config_hash"])
    return RunInfo(
        name=as_str(run_start.get("name")),
        run_dir=as_str(run_start.get("run_dir")),
        checkpoint_dir=as_str(run_start.get("checkpoint_dir")),
        outcome=as_str(run_end.get("outcome")) if run_end else None,
        exit_code=as_int(run_end.get("exit_code")) if run_end else None,
        reason=as_str(run_end.get("reason")) if run_end else None,
        start=start, end=end,
        duration=(end - start) if start is not None and end is not None else None,
        attempts=len(attempts), restarts=restarts, requeues=max(len(jobs) - 1, 0),
        final_step=max(steps) if steps else None,
        steps_lost=sum(a.steps_lost or 0 for a in attempts),
        steps_lost_at_least=any(a.steps_lost_at_least for a in attempts),
        wall_lost=round(sum(a.wall_lost or 0.0 for a in attempts), 3),
        jobs=jobs, config_hashes=tuple(hashes), manifests=tuple(sorted(manifests)),
        format_versions=tuple(sorted(set(versions))),
    )


def _verdict(events: Sequence[Event], records: Sequence[AttemptRecord], logged: list[dict[str, Any]],
             budget: BudgetConfig) -> VerdictView | None:
    """``budget.run_verdict``, the verdict ``supervise audit`` gives too; without any attempt, the
    last ``budget`` event the supervisor logged (if any)."""
    if records:
        v = run_verdict(events, budget, records=records)
        return VerdictView(ok=v.ok, budget=v.budget, reason=v.reason, numbers=dict(v.numbers), source=v.source)
    if logged:
        last = logged[-1]
        ok = last.get("ok")
        return VerdictView(ok=ok if isinstance(ok, bool) else None, budget=as_str(last.get("budget")),
                           reason=str(last.get("reason") or ""),
                           numbers=dict(last["numbers"]) if isinstance(last.get("numbers"), Mapping) else {},
                           source="log")
    return None


def _level(v: Any) -> int | str | None:
    return v if isinstance(v, (int, str)) and not isinstance(v, bool) else None


def _quarantine_rows(logged: list[dict[str, Any]], files: Sequence[QuarantineFile]) -> tuple[QuarantineRow, ...]:
    """Quarantine events joined with the ``CORRUPT_*`` entries still on disk (by file name); entries
    without an event (another tool, a lost log line) are listed from their sidecar."""
    on_disk = {f.name: f for f in files}
    rows: list[QuarantineRow] = []
    seen: set[str] = set()

    def first(*values: Any) -> Any:
        return next((v for v in values if v is not None and v != ""), None)

    for q in logged:
        if q.get("ok") is False:
            continue  # the rename failed: nothing was quarantined (the event says why)
        dest = as_str(q.get("dest"))
        name = dest.rsplit("/", 1)[-1] if dest else None
        f = on_disk.get(name) if name else None
        side = dict(f.sidecar) if f and f.sidecar else {}
        rows.append(QuarantineRow(
            file=name or "?", original=as_str(first(q.get("path"), side.get("original_path"), side.get("path"))),
            size=f.size if f else as_int(first(q.get("size"), side.get("size"))),
            reason=as_str(first(q.get("reason"), side.get("reason"))),
            level=_level(first(q.get("level"), side.get("level"))),
            format=as_str(first(q.get("format"), side.get("format"))),
            step=as_int(first(q.get("step"), side.get("step"))),
            attempt=as_int(q.get("attempt")), ts=as_float(q.get("ts")),
            on_disk=f is not None, sidecar=bool(side)))
        if name:
            seen.add(name)
    for f in files:
        if f.name in seen:
            continue
        side = dict(f.sidecar) if f.sidecar else {}
        rows.append(QuarantineRow(
            file=f.name, original=as_str(first(side.get("original_path"), side.get("path"))), size=f.size,
            reason=as_str(side.get("reason")), level=_level(side.get("level")), format=as_str(side.get("format")),
            step=as_int(side.get("step")), attempt=as_int(side.get("attempt")),
            ts=as_float(first(side.get("time"), side.get("ts"))), on_disk=True, sidecar=bool(side)))
    return tuple(rows)


def _problems(run: RunInfo, attempts: tuple[AttemptRow, ...], verdict: VerdictView | None,
              checkpoints: Sequence[CheckpointRow] | None, drift: tuple[DriftItem, ...],
              summary: EventsSummary, check: ResultsCheck | None) -> list[str]:
    """What a human should look at. Preemptions and requeues are normal and not listed."""
    out: list[str] = []
    if run.outcome in (RunOutcome.STOPPED.value, RunOutcome.FAILED.value):
        out.append(f"run {run.outcome}: {run.reason or 'no reason logged'}")
    if verdict is not None and verdict.ok is False and verdict.source != "run_end":  # else listed just above
        out.append(f"step budget exceeded ({verdict.budget}): {verdict.reason}")
    if check is not None and not check.settled:
        out.append(check.reason)
    for a in attempts:
        if a.resume_mismatch:
            out.append(f"attempt {a.attempt} did not resume where it should: {a.resume_mismatch}")
    if checkpoints:
        bad = [c.file for c in checkpoints if c.verdict == Verdict.CORRUPT.value]
        if bad:
            out.append(f"{len(bad)} corrupt checkpoint(s) in the checkpoint directory: {', '.join(bad[:5])}")
    changed = sorted({d.what for d in drift if d.breaks_reproducibility})
    if changed:
        out.append("attempts ran on different " + ", ".join(changed) + ": not one reproducible run")
    if summary.stalls:
        out.append(f"{len(summary.stalls)} stall(s): training stopped making progress")
    if summary.loss_anomalies:
        out.append(f"{len(summary.loss_anomalies)} loss anomal(ies) (nan/inf/spike)")
    return out
