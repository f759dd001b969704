"""Slurm's history of a run beside the supervisor's: pure matching of accounting records to sessions.

A *session* is one ``run_start`` in the event log: one supervisor process, started by one run of the
batch script (:class:`Session`, which ``JobRow`` in ``model.py`` is, with the job id and
``SLURM_RESTART_COUNT`` it logged). An
accounting *record* is one run of a job as Slurm counted it (``sacct --duplicates``: a requeue gives
the same job id a new record). Each started record should have exactly one session and each session
of a Slurm job one record; where not, the report says which and why:

* ``slurm_only``: Slurm ran the job (it has a start) but no supervisor of this run logged a session
  in it: the script's ``supervise run --run-dir`` pointed elsewhere, the job died before the
  supervisor started (a node failure at launch, a prolog error), or the log lost lines;
* ``supervisor_only``: the log has a session in a job (and restart count) that accounting has no
  record of: records purged or archived, another cluster's database, or not yet written.

A record matches the session that started inside its [Start, End] window (with :data:`SLACK` for
clocks that disagree); where two windows fit, the restart count decides, and where none fits (a
record without times, clocks far apart), the restart count alone. ``Restarts`` is read from sacct
where the version has it (24.11 on), else a record's restart count is its place among the job's
started records, oldest first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from ...slurm.sacct import SacctAnswer, SacctStatus, SlurmJobRecord

SLACK = 120.0  # seconds of clock disagreement between the nodes and the accounting database


class Session(Protocol):
    """What matching reads of one supervisor session (``report.model.JobRow``). A protocol, so that
    this module does not import the model that imports it."""

    @property
    def session(self) -> int: ...
    @property
    def job_id(self) -> str | None: ...
    @property
    def restart_count(self) -> int | None: ...
    @property
    def start(self) -> float | None: ...
    @property
    def attempts(self) -> tuple[int, ...]: ...


class Agreement(Enum):
    """How one line of the history compares with the event log."""

    MATCHED = "matched"  # a run Slurm counted, and the supervisor's session in it
    SLURM_ONLY = "slurm_only"
    SUPERVISOR_ONLY = "supervisor_only"
    NOT_STARTED = "not_started"  # a record that never ran (a wait in the queue, cancelled pending): no session due


class AccountingState(Enum):
    """Whether the report has Slurm's history, and if not, why."""

    GATHERED = "gathered"
    UNAVAILABLE = "unavailable"  # sacct missing, accounting disabled, timeout, error: the note says which
    SKIPPED = "skipped"  # --no-accounting
    NOT_SLURM = "not_slurm"  # the event log names no Slurm job


@dataclass(frozen=True)
class HistoryRow:
    """One line of the history: an accounting record, a session without one, or both."""

    job_id: str
    restart: int | None  # Slurm's restart count of this run (sacct Restarts, else the record's place)
    agreement: Agreement
    state: str | None = None  # as sacct wrote it
    start: float | None = None
    end: float | None = None
    elapsed: float | None = None
    nodes: str | None = None
    exit_code: str | None = None
    reason: str | None = None
    sessions: tuple[int, ...] = ()  # the supervisor's sessions (1-based, as in run.jobs)
    attempts: tuple[int, ...] = ()  # the supervisor's attempts in those sessions
    session_start: float | None = None  # when the (first) session began, by the supervisor's clock
    note: str = ""  # why it disagrees; empty when it agrees


@dataclass(frozen=True)
class AccountingView:
    """The report's accounting section: the history with its disagreements, or one line why not."""

    state: AccountingState
    reason: str = ""
    job_ids: tuple[str, ...] = ()
    sacct_fields: tuple[str, ...] = ()
    rows: tuple[HistoryRow, ...] = ()

    @property
    def disagreements(self) -> tuple[HistoryRow, ...]:
        return tuple(r for r in self.rows if r.agreement in (Agreement.SLURM_ONLY, Agreement.SUPERVISOR_ONLY))

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state.value, "reason": self.reason, "job_ids": list(self.job_ids),
                "sacct_fields": list(self.sacct_fields),
                "history": [_row_json(r) for r in self.rows],
                "disagreements": [_row_json(r) for r in self.disagreements]}


def _row_json(row: HistoryRow) -> dict[str, Any]:
    out = {k: getattr(row, k) for k in HistoryRow.__dataclass_fields__}
    out["agreement"] = row.agreement.value
    out["sessions"], out["attempts"] = list(row.sessions), list(row.attempts)
    return out


# ---------------------------------------------------------------------------------------------
# Which jobs to ask about


def run_job_ids(sessions: Iterable[Session], submissions: Iterable[Mapping[str, Any]] = ()) -> tuple[str, ...]:
    """Job ids of the run, oldest first: those its sessions logged (``run_start``: requeues keep the
    id) and those ``supervise submit`` recorded in ``submissions.jsonl`` (a resubmission is a new job
    id, and a job whose supervisor never started is only there)."""
    ids: list[str] = []
    for s in sessions:
        if s.job_id:
            ids.append(str(s.job_id))
    for sub in submissions:
        job = sub.get("job_id")
        if isinstance(job, (int, str)) and not isinstance(job, bool) and str(job).strip():
            ids.append(str(job).strip())
    return tuple(dict.fromkeys(ids))


# ---------------------------------------------------------------------------------------------
# Matching


def _restart_numbers(records: Sequence[SlurmJobRecord]) -> dict[int, int]:
    """index in ``records`` -> restart count: sacct's own where it has one, else the place of the
    record among its job's started records (by start time)."""
    out: dict[int, int] = {}
    by_job: dict[str, list[int]] = {}
    for i, r in enumerate(records):
        if r.restarts is not None:
            out[i] = r.restarts
        elif r.started:
            by_job.setdefault(r.job_id_raw, []).append(i)
    for idx in by_job.values():
        for n, i in enumerate(sorted(idx, key=lambda i: (records[i].start or 0.0, records[i].submit or 0.0))):
            out[i] = n
    return out


def _inside(record: SlurmJobRecord, ts: float | None, slack: float) -> bool:
    if ts is None or record.start is None:
        return False
    end = record.end if record.end is not None else float("inf")
    return record.start - slack <= ts <= end + slack


def _pick(candidates: list[int], records: Sequence[SlurmJobRecord], restarts: Mapping[int, int],
          session: Session, slack: float) -> int | None:
    """The record of ``candidates`` (one job's started records) this session ran in."""
    window = [i for i in candidates if _inside(records[i], session.start, slack)]
    same = [i for i in candidates if session.restart_count is not None and restarts.get(i) == session.restart_count]
    if len(window) == 1:
        return window[0]
    both = [i for i in window if i in same]
    if both:
        return both[0]
    if window:
        return min(window, key=lambda i: abs((records[i].start or 0.0) - (session.start or 0.0)))
    return same[0] if same else None


def compare(sessions: Sequence[Session], records: Sequence[SlurmJobRecord], *,
            slack: float = SLACK) -> tuple[HistoryRow, ...]:
    """Slurm's records and the supervisor's sessions side by side, each line saying whether they
    agree. Sessions without a job id (a run outside Slurm) are not compared."""
    restarts = _restart_numbers(records)
    matched: dict[int, list[Session]] = {}
    orphans: list[tuple[Session, str]] = []
    for s in sessions:
        if not s.job_id:
            continue
        job = str(s.job_id)
        mine = [i for i, r in enumerate(records) if job in (r.job_id_raw, r.job_id)]
        started = [i for i in mine if records[i].started]
        pick = _pick(started, records, restarts, s, slack)
        if pick is not None:
            matched.setdefault(pick, []).append(s)
        elif not mine:
            orphans.append((s, f"accounting has no record of job {job} (purged or archived, another "
                               "cluster's database, or not written yet)"))
        else:
            orphans.append((s, f"accounting has {len(started)} run(s) of job {job}, none at restart "
                               f"{s.restart_count if s.restart_count is not None else '?'} or around "
                               "the session's start"))
    rows: list[HistoryRow] = []
    for i, r in enumerate(records):
        got = matched.get(i, [])
        if got:
            agreement, note = Agreement.MATCHED, ""
        elif r.started:
            agreement = Agreement.SLURM_ONLY
            note = (f"Slurm ran job {r.job_id} ({r.state_text}) but the event log has no session in it: the "
                    "supervisor never started there (its --run-dir is another directory, or the job died "
                    "before it started), or the log lost its lines")
        else:
            agreement, note = Agreement.NOT_STARTED, ""
        rows.append(HistoryRow(
            job_id=r.job_id, restart=restarts.get(i), agreement=agreement, state=r.state_text, start=r.start,
            end=r.end, elapsed=r.elapsed, nodes=r.nodes, exit_code=r.exit_code, reason=r.reason,
            sessions=tuple(s.session for s in got), attempts=tuple(a for s in got for a in s.attempts),
            session_start=got[0].start if got else None, note=note))
    for s, note in orphans:
        rows.append(HistoryRow(job_id=str(s.job_id), restart=s.restart_count, agreement=Agreement.SUPERVISOR_ONLY,
                               sessions=(s.session,), attempts=tuple(s.attempts), session_start=s.start,
                               note=note))
    rows.sort(key=lambda r: (_first_ts(r), r.job_id, r.restart if r.restart is not None else -1))
    return tuple(rows)


def _first_ts(row: HistoryRow) -> float:
    for ts in (row.start, row.session_start, row.end):
        if ts is not None:
            return ts
    return float("inf")


def accounting_view(answer: SacctAnswer | None, sessions: Sequence[Session], job_ids: Sequence[str]) -> AccountingView:
    """The section for the report: ``answer`` None means the history was not asked for."""
    ids = tuple(job_ids)
    if not ids:
        return AccountingView(AccountingState.NOT_SLURM, "the event log names no Slurm job: nothing to ask sacct")
    if answer is None:
        return AccountingView(AccountingState.SKIPPED, "not asked (--no-accounting)", ids)
    if answer.status is not SacctStatus.OK:
        return AccountingView(AccountingState.UNAVAILABLE, answer.reason, ids)
    if not answer.records:  # nothing to compare with: not a disagreement about any one run
        return AccountingView(AccountingState.UNAVAILABLE,
                              f"sacct has no record of job(s) {', '.join(ids[:10])}{' ...' if len(ids) > 10 else ''} "
                              "(purged, another cluster's database, or not visible to this user)", ids, answer.fields)
    return AccountingView(AccountingState.GATHERED, "", ids, answer.fields, compare(sessions, answer.records))


__all__ = ["AccountingState", "AccountingView", "Agreement", "HistoryRow", "SLACK", "accounting_view", "compare",
           "run_job_ids"]
