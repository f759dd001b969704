"""The resubmission loop behind ``supervise submit`` (issue 6).

For clusters that cancel preempted jobs instead of requeueing them, and for allocations that end
(time limits), someone has to submit the script again until training is complete. This module:

* decides, purely, what to do once a job of the run has ended for good (:func:`decide_next`, in
  supervisor/slurm/requeue_policy.py with the other requeue decisions):
  resubmit while the run is neither complete nor stopped by policy/budget; done when the event log
  says ``complete``; stop on ``stopped``/``failed``, an exhausted budget, a person's cancel, or the
  submission limit;
* reads the run directory's event log (owned by the live supervisor of the run: read only, never
  written) for the job's ``run_end`` and for the progress line;
* keeps its own append-only record, ``<run>/supervisor/submissions.jsonl``, one line per submission;
* follows a job that Slurm requeues (same id, Restarts+1, PENDING again) instead of resubmitting it,
  and never cancels a job: a pending job's queue age is worth keeping.

The decision functions are pure; :class:`SubmitLoop` is the imperative shell (Slurm, files, clock).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..budget import BudgetVerdict, judge
from ..config import BudgetConfig
from ..errors import ExitCode, SlurmError, UsageError
from ..events import Ev, Event, read_events
from ..ledger import ledger_from_events
from ..paths import RunPaths
from ..private import GROUP_READ, append_fd
from ..redact import redact_value
from ..slurm import JobInfo
from ..slurm.qos_limits import limit_of_pending_reason, limit_of_sbatch_error, wait_for_limit
from ..slurm.requeue_policy import decide_next  # with every other requeue decision
from ..states import SubmitAction

log = logging.getLogger("supervisor.submit")

SUBMISSIONS_FILE = "submissions.jsonl"
INTERRUPTED_EXIT = 130


def judge_for_resubmission(events: Sequence[Event], budget: BudgetConfig) -> BudgetVerdict:
    """The run's budgets, judged for a new job: the ledger is shared with the in-job restarts, but
    a resubmitted job is a new allocation, so the per-allocation restart limit does not apply."""
    records = ledger_from_events(events)
    return judge(records, replace(budget, max_restarts_per_allocation=None), None)


# ---------------------------------------------------------------------------------------------
# Reading the run directory (read-only: the event log belongs to the run's live supervisor)


def job_scope(events: Sequence[Event], job_id: int | str, restarts: int) -> list[Event]:
    """The events of one run of a job: from its last ``run_start`` naming ``job_id`` at restart
    count ``restarts`` to the end of the log. Empty when its supervisor never started."""
    wanted = str(job_id)
    start = None
    for i, ev in enumerate(events):
        if ev.event != Ev.RUN_START.value or str(ev.get("job_id")) != wanted:
            continue
        count = ev.get("restart_count")
        if (int(count) if isinstance(count, int) or str(count or "").isdigit() else 0) == restarts:
            start = i
    return [] if start is None else list(events[start:])


def last_run_end(scope: Iterable[Event]) -> dict[str, Any] | None:
    ends = [ev for ev in scope if ev.event == Ev.RUN_END.value]
    return dict(ends[-1].fields) if ends else None


def excluded_nodes(scope: Iterable[Event]) -> tuple[str, ...]:
    """Nodes the supervisor wanted excluded when it handed the run back (a hardware fault)."""
    nodes: list[str] = []
    for ev in scope:
        if ev.event == Ev.REQUEUE.value and isinstance(ev.get("exclude"), list):
            nodes += [str(n) for n in ev.get("exclude") if n]
    return tuple(dict.fromkeys(nodes))


@dataclass(frozen=True)
class ProgressView:
    """Where the run stands, from its event log: for the progress line."""

    attempt: int | None
    step: int | None
    steps_lost: int


def progress_view(events: Sequence[Event]) -> ProgressView:
    records = ledger_from_events(events)
    if not records:
        return ProgressView(None, None, 0)
    step = max((r.last_step for r in records if r.last_step is not None), default=None)
    lost = sum(r.steps_lost for r in records if r.steps_lost is not None)
    return ProgressView(records[-1].attempt, step, lost)


def progress_line(job: JobInfo, view: ProgressView, submission: int, max_submissions: int) -> str:
    state = job.state + (f" ({job.reason})" if job.reason and job.state != "RUNNING" else "")
    parts = [f"job {job.job_id} [submission {submission}/{max_submissions}] {state}",
             f"restarts {job.restarts}",
             f"attempt {view.attempt if view.attempt is not None else '-'}",
             f"step {view.step if view.step is not None else '-'}",
             f"steps lost {view.steps_lost}"]
    return " | ".join(parts)


# ---------------------------------------------------------------------------------------------
# The run directory from the script


_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")
_ASSIGN_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)


def _commands(text: str) -> list[list[str]]:
    """The script's simple commands as word lists (shell quoting, comments, ``\\`` continuations and
    quoted arguments that span lines, as a rendered ``python -c`` program does)."""
    out: list[list[str]] = []
    pending: list[str] = []
    for line in text.splitlines():
        if pending:
            pending.append(line)
        else:
            pending = [line]
        joined = "\n".join(pending)
        if joined.endswith("\\") and not joined.endswith("\\\\"):
            pending = [joined[:-1] + " "]
            continue
        try:
            words = shlex.split(joined, comments=True)
        except ValueError:  # an open quote: the command goes on on the next line
            continue
        pending = []
        if words:
            out.append(words)
    for line in pending:  # a quote never closed: read what can be read line by line
        try:
            out.append(shlex.split(line, comments=True))
        except ValueError:
            pass
    return out


def _words(line: str) -> list[str]:
    try:
        return shlex.split(line, comments=True)
    except ValueError:  # unbalanced quotes: not a line we can read
        return []


def _expand(value: str, variables: Mapping[str, str | None]) -> str | None:
    """``$RUN_DIR/x`` with the script's own plain assignments; None when anything is unknown."""
    missing = False

    def sub(match: re.Match[str]) -> str:
        nonlocal missing
        known = variables.get(match.group(1) or match.group(2))
        if known is None:
            missing = True
            return ""
        return known

    out = _VAR_RE.sub(sub, value)
    if missing or "$" in out or "`" in out:
        return None
    return out


def run_dir_from_script(text: str, base: Path) -> Path:
    """The ``--run-dir`` the script passes to ``supervise run``, resolved against ``base`` (the
    job's working directory). Follows plain assignments (``RUN_DIR=/x``, as the templates write);
    anything that needs the job's environment cannot be known here: a clear error asks for
    ``--run-dir``."""
    variables: dict[str, str | None] = {}
    found: list[str] = []
    unresolved: list[str] = []
    for words in _commands(text):
        if words[:1] == ["export"]:
            words = words[1:]
        while words and _ASSIGN_RE.match(words[0]):  # NAME=value [NAME=value ...] [command]
            name, value = _ASSIGN_RE.match(words[0]).groups()  # type: ignore[union-attr]
            variables[name] = _expand(value, variables)
            words = words[1:]
        for i, word in enumerate(words):
            raw = None
            if word == "--run-dir" and i + 1 < len(words):
                raw = words[i + 1]
            elif word.startswith("--run-dir="):
                raw = word.split("=", 1)[1]
            if raw is None:
                continue
            value = _expand(raw, variables)
            (found if value else unresolved).append(value or raw)
    if not found and not unresolved and variables.get("SUPERVISE_RUN_DIR"):
        found.append(variables["SUPERVISE_RUN_DIR"])  # type: ignore[arg-type]
    if unresolved and not found:
        raise UsageError(f"the script passes --run-dir {unresolved[0]}, which depends on the job's environment; "
                         "pass the run directory with --run-dir")
    if not found:
        raise UsageError("cannot tell the run directory: the script passes no --run-dir to `supervise run`; "
                         "pass it with --run-dir (supervise submit reads the run's outcome there)")
    if len(set(found)) > 1:
        raise UsageError(f"the script passes several run directories ({', '.join(sorted(set(found)))}); "
                         "pass the one to follow with --run-dir")
    path = Path(os.path.expanduser(found[0]))
    return path if path.is_absolute() else base / path


def _chdir_in(words: Sequence[str]) -> str | None:
    chdir = None
    for i, word in enumerate(words):
        if word in ("-D", "--chdir") and i + 1 < len(words):
            chdir = words[i + 1]
        elif word.startswith("--chdir="):
            chdir = word.split("=", 1)[1]
        elif word.startswith("-D") and len(word) > 2:
            chdir = word[2:]
    return chdir


def job_workdir(text: str, sbatch_args: Sequence[str], cwd: Path) -> Path:
    """Where the job runs: ``--chdir`` from the command line, else from ``#SBATCH``, else ``cwd``."""
    chdir = _chdir_in(sbatch_args)
    if chdir is None:
        for line in text.splitlines():
            if line.startswith("#SBATCH"):
                found = _chdir_in(_words(line[len("#SBATCH"):]))
                chdir = found if found is not None else chdir
    if chdir is None:
        return cwd
    path = Path(os.path.expanduser(chdir))
    return path if path.is_absolute() else cwd / path


def sbatch_args_with_exclude(args: Sequence[str], nodes: Sequence[str]) -> list[str]:
    """``args`` with ``nodes`` added to the job's excluded nodes (merged with any -x/--exclude)."""
    if not nodes:
        return list(args)
    out: list[str] = []
    excluded: list[str] = []
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if arg in ("-x", "--exclude") and i + 1 < len(args):
            excluded += args[i + 1].split(",")
            skip = True
        elif arg.startswith("--exclude="):
            excluded += arg.split("=", 1)[1].split(",")
        elif arg.startswith("-x") and len(arg) > 2:
            excluded += arg[2:].split(",")
        else:
            out.append(arg)
    merged = [n for n in dict.fromkeys([*excluded, *nodes]) if n]
    return [*out, f"--exclude={','.join(merged)}"]


# ---------------------------------------------------------------------------------------------
# The submissions record


def submissions_path(run_dir: Path) -> Path:
    return RunPaths(run_dir).supervisor_dir / SUBMISSIONS_FILE


def append_submission(path: Path, record: Mapping[str, Any]) -> None:
    """One line per submission, appended and fsynced (a lost line would hide a job from the record)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(redact_value(dict(record)), default=str, separators=(",", ":")) + "\n").encode()
    fd = append_fd(path, GROUP_READ)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_submissions(path: Path) -> list[dict[str, Any]]:
    out = []
    try:
        lines = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


# ---------------------------------------------------------------------------------------------
# The loop (imperative shell)


@dataclass
class Submission:
    """One job this loop submitted, and how it ended."""

    job_id: int
    reason: str
    final_state: str | None = None
    restarts: int = 0
    exit_code: int | None = None
    decision: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "reason": self.reason, "final_state": self.final_state,
                "restarts": self.restarts, "exit_code": self.exit_code, "decision": self.decision}


@dataclass(frozen=True)
class SubmitResult:
    outcome: str  # complete | stopped | failed | cancelled | gave_up | interrupted | slurm_error
    exit_code: int
    reason: str
    run_dir: Path
    script: Path
    submissions: tuple[Submission, ...] = field(default_factory=tuple)
    limit_waits: int = 0  # times a QOS limit held a submission or a pending job back (waited out)

    def to_json(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "exit_code": self.exit_code, "reason": self.reason,
                "run_dir": str(self.run_dir), "script": str(self.script),
                "submissions": [s.to_json() for s in self.submissions], "limit_waits": self.limit_waits}


class SubmitLoop:
    """Submit ``script``, follow each job to its end, and resubmit while :func:`decide_next` says so.

    ``backend``: the Slurm facade (``submit``, ``job_info``; its CLI backend retries transient
    failures). ``slurm_patience``: seconds of consecutive failed job queries tolerated (a
    restarting controller) before giving up with the error. Never cancels a job.

    A QOS limit (slurm/qos_limits.py) is waited out: an sbatch refused by one is tried again, a job
    pending on one is looked at less and less often (``poll`` doubled up to ``limit_wait_cap``,
    by default 8 polls and at most 5 minutes);
    either is said in the log, never counted as a submission, a failure or a reason to give up.
    """

    def __init__(
        self,
        script: Path,
        sbatch_args: Sequence[str],
        run_dir: Path,
        backend: Any,
        budget: BudgetConfig,
        *,
        max_submissions: int = 10,
        poll: float = 15.0,
        settle: float = 1.0,
        event_wait: float = 3.0,
        slurm_patience: float = 120.0,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        nodes: Any = None,
        environ: Mapping[str, str] | None = None,
        limit_wait_cap: float | None = None,
    ) -> None:
        if max_submissions < 1:
            raise UsageError(f"--max-submissions: got {max_submissions}; at least 1")
        self.script = script
        self.sbatch_args = list(sbatch_args)
        self.paths = RunPaths(run_dir)
        self.backend = backend
        self.budget = budget
        self.max_submissions = max_submissions
        self.poll = poll
        self.settle = settle
        self.event_wait = event_wait
        self.slurm_patience = slurm_patience
        self.clock = clock
        self.sleep = sleep
        self.submissions: list[Submission] = []
        self.excluded: tuple[str, ...] = ()
        self.nodes = nodes  # config.NodesConfig: the node health ledger shared by the user's runs
        self.environ = environ
        # a QOS limit is looked at again after poll, 2 poll, 4 poll ... at most 8 polls (and 5 min) apart
        self.limit_wait_cap = max(poll, limit_wait_cap if limit_wait_cap is not None else min(300.0, 8 * poll))
        self.limit_waits = 0  # how often a QOS limit held the run back (submissions and pending polls)

    def _node_ledger_exclusions(self) -> list[Any]:
        """Nodes the ledger holds enough hardware evidence against (``nodes.exclude_after``)."""
        if self.nodes is None:
            return []
        from .nodes import NodeLedger, current_exclusions, node_ledger_path

        node_ledger = NodeLedger(node_ledger_path(self.nodes, self.environ), self.nodes.max_bytes)
        found, problem = current_exclusions(node_ledger, self.clock(), self.nodes)
        if problem:
            log.warning("%s", problem)
        probe = getattr(self.backend, "node_state", None)
        kept = []
        for item in found:  # the ledger is the user's, across clusters: only nodes this cluster has
            try:
                if not callable(probe) or probe(item.node) is not None:
                    kept.append(item)
            except Exception:
                continue
        return kept

    # ---- public -------------------------------------------------------------------------------
    def run(self) -> SubmitResult:
        reason = "first submission"
        current: Submission | None = None
        submitting = False
        try:
            while True:
                submitting = True
                current = self._submit(reason)
                submitting = False
                final = self._follow(current)
                scope = job_scope(self._events(), current.job_id, final.restarts)
                run_end = last_run_end(scope) or self._wait_for_run_end(current.job_id, final.restarts)
                events = self._events()
                self.excluded = tuple(dict.fromkeys([*self.excluded, *excluded_nodes(scope)]))
                verdict = judge_for_resubmission(events, self.budget)
                step = decide_next(final, run_end, len(self.submissions), self.max_submissions, verdict)
                current.final_state, current.restarts = final.state, final.restarts
                current.exit_code, current.decision = final.exit_code, step.action.value
                log.info("%s", step.reason)
                if step.action != SubmitAction.RESUBMIT:
                    return self._result(step.outcome, step.exit_code, step.reason)
                reason = step.reason
        except KeyboardInterrupt:
            return self._result("interrupted", INTERRUPTED_EXIT, self._left_alone(None if submitting else current))
        except SlurmError as err:
            if submitting:
                where = (f"; nothing was resubmitted ({len(self.submissions)} job(s) submitted so far)"
                         if self.submissions else "")
                return self._result("slurm_error", ExitCode.FAILED, f"sbatch failed: {err}{where}")
            assert current is not None
            return self._result("slurm_error", ExitCode.FAILED,
                                f"Slurm: {err}; job {current.job_id} is left alone (check it with: "
                                f"squeue -j {current.job_id})")

    # ---- steps ----------------------------------------------------------------------------------
    def _submit(self, reason: str) -> Submission:
        from_node_ledger = [x for x in self._node_ledger_exclusions() if x.node not in self.excluded]
        for item in from_node_ledger:
            log.warning("excluding %s: %s", item.node, item.reason)
        args = sbatch_args_with_exclude(self.sbatch_args, (*self.excluded, *(x.node for x in from_node_ledger)))
        tries = 0
        while True:
            try:
                job_id = self.backend.submit(str(self.script), args)
                break
            except SlurmError as err:
                limit = limit_of_sbatch_error(f"{getattr(err, 'stderr', '') or ''} {err}")
                if limit is None:
                    raise
                wait = wait_for_limit(limit, tries, self.poll, self.limit_wait_cap, what="the submission")
                log.warning("sbatch refused: %s; %s", err, wait.reason)
                self.limit_waits += 1
                tries += 1
                self.sleep(wait.seconds)
        submission = Submission(job_id, reason)
        self.submissions.append(submission)
        append_submission(submissions_path(self.paths.run_dir), {
            "ts": round(self.clock(), 3), "job_id": job_id, "script": str(self.script), "reason": reason,
            "submission": len(self.submissions), "sbatch_args": args, "host": socket.gethostname(),
            "excluded_by_ledger": [{"node": x.node, "reason": x.reason} for x in from_node_ledger],
        })
        log.info("submitted job %s (submission %d of at most %d): %s", job_id, len(self.submissions),
                 self.max_submissions, reason)
        return submission

    def _follow(self, submission: Submission) -> JobInfo:
        """Poll the job until it has ended for good; log a progress line whenever it changes.
        A requeue by Slurm (same id, Restarts+1) is followed, never resubmitted."""
        job_id = submission.job_id
        shown = None
        restarts = 0
        warned_hold = False
        limit_tries = 0
        seen_final: JobInfo | None = None
        failing_since: float | None = None
        while True:
            try:
                info: JobInfo | None = self.backend.job_info(job_id)
                failing_since = None
            except SlurmError as err:
                now = self.clock()
                failing_since = now if failing_since is None else failing_since
                if now - failing_since > self.slurm_patience:
                    raise
                log.warning("cannot read job %s (%s); trying again in %.0f s", job_id, err, self.poll)
                self.sleep(self.poll)
                continue
            if info is None:  # purged from the controller (MinJobAge) between two polls
                return seen_final or JobInfo(job_id=int(job_id), state="UNKNOWN", restarts=restarts)
            submission.final_state, submission.restarts = info.state, info.restarts
            if info.restarts > restarts:
                log.info("job %s was requeued (restart %d): following it, not resubmitting", job_id, info.restarts)
                restarts = info.restarts
            if info.held_for_max_requeue and callable(getattr(self.backend, "release", None)):
                # Slurm's own hold after MaxBatchRequeue requeues of a job that left during its grace
                # (24.05+): the training made progress each time, so it is released, and said so.
                log.warning("job %s is held by Slurm after %d requeues (%s): releasing it", job_id, info.restarts,
                            info.reason)
                try:
                    self.backend.release(job_id)
                except SlurmError as err:
                    log.warning("could not release job %s: %s (scontrol release %s)", job_id, err, job_id)
            elif info.is_pending and re.search(r"hold|held", info.reason or "", re.IGNORECASE) and not warned_hold:
                warned_hold = True
                log.warning("job %s is held (%s): it will not start until someone releases it "
                            "(scontrol release %s); still following it", job_id, info.reason, job_id)
            line = progress_line(info, progress_view(self._events()), len(self.submissions), self.max_submissions)
            if line != shown:
                log.info("%s", line)
                shown = line
            limit = limit_of_pending_reason(info.reason) if info.is_pending else None
            if limit is not None:
                wait = wait_for_limit(limit, limit_tries, self.poll, self.limit_wait_cap, what=f"job {job_id}")
                if limit_tries == 0 or wait.seconds < self.limit_wait_cap:
                    log.warning("%s (Slurm: %s)", wait.reason, info.reason)
                self.limit_waits += 1
                limit_tries += 1
                self.sleep(wait.seconds)
                continue
            limit_tries = 0
            if info.is_finished:
                # A requeue may pass through states that look final: believe it when seen twice.
                if seen_final is not None and seen_final.restarts == info.restarts:
                    return info
                seen_final = info
                self.sleep(self.settle)
                continue
            seen_final = None
            self.sleep(self.poll)

    def _wait_for_run_end(self, job_id: int, restarts: int) -> dict[str, Any] | None:
        """The job has ended but its run_end is not visible yet (a shared filesystem may lag)."""
        deadline = self.clock() + self.event_wait
        while self.clock() < deadline:
            self.sleep(min(0.5, self.event_wait))
            found = last_run_end(job_scope(self._events(), job_id, restarts))
            if found is not None:
                return found
        return None

    def _events(self) -> list[Event]:
        try:
            return read_events(self.paths.events).events
        except FileNotFoundError:
            return []
        except OSError as exc:
            log.warning("cannot read %s: %s", self.paths.events, exc)
            return []

    def _left_alone(self, current: Submission | None) -> str:
        if current is None:
            return ("interrupted while submitting: if sbatch got through, the job is queued and left alone "
                    "(check with: squeue --me)")
        state = f" ({current.final_state})" if current.final_state else ""
        return (f"stopped following job {current.job_id}{state}; the job is left alone, not cancelled (it keeps "
                f"its place in the queue); check it with: squeue -j {current.job_id}")

    def _result(self, outcome: str, code: int, reason: str) -> SubmitResult:
        return SubmitResult(outcome, code, reason, self.paths.run_dir, self.script, tuple(self.submissions),
                            self.limit_waits)
