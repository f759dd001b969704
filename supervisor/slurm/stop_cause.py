"""Why is this job being stopped? A person's cancel, a preemption, the time limit, a node failure,
or a requeue someone already made. Pure: the job record, the clock and the signal in; a verdict out.

The run loop calls :func:`stop_cause` when a notice signal reaches the supervisor (``signal_name``
set) and again after the child has exited (``signal_name`` None, or the signal that was noticed),
with the job record read right then (``SlurmBackend.job_info``). What each Slurm version shows
during each kind of stop was captured from real clusters (tests/data/slurm/<release>/) and is
checked by tests/test_slurm_facade.py; docs/slurm-versions.md has the table.

Evidence, strongest first:

1. A cancel: ``scancel`` (or ``scancel -s KILL``) by a person or an admin. During the kill window
   the text of every version says only JobState=COMPLETING; 24.11/26.05 ``--json`` says
   CANCELLED+COMPLETING (``JobInfo.state_flags``, read by the CLI backend for a COMPLETING job);
   22.05 has no ``--json``, and there the COMPLETING record ended long before its time limit with
   no PreemptTime and no requeue. Afterwards JobState=CANCELLED everywhere. A cancel is final:
   never requeue it, on any version.
2. JobState=NODE_FAIL, or a node-failure reason: a node of the job died; Slurm requeues a
   requeueable batch job by itself.
3. JobState=TIMEOUT: the time limit was reached (the final SIGTERM of the limit).
4. JobState PREEMPTED (PreemptMode=CANCEL), or a PreemptTime: preemption.
5. Pending/requeued again (JobState REQUEUED/PENDING, or Restarts above the count this run
   started with): someone already requeued the job (Slurm at grace expiry, a person's
   ``scontrol requeue``, or this supervisor earlier): it will run again; never requeue twice.
6. The time-limit warning signal (``--signal=B:USR1@N``): the time limit is coming.
7. EndTime reached with no PreemptTime: the time limit.
8. Any other signal while Slurm shows the job RUNNING with time left and no PreemptTime: not
   Slurm's doing, so a person's ``scancel --signal=...`` or ``kill``: final. But the signal of a
   preemption can arrive before the record shows PreemptTime (seen on 22.05 and 24.11: tens of
   milliseconds, longer on a busy controller): ``recheck_after`` asks the caller to read the job
   once more before acting on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from .parse import JobInfo
from .requeue_policy import already_requeued, node_failure_requeue, preempted_exit
from .version import SlurmVersion

# Reasons Slurm gives a job whose node failed (scontrol's Reason; the first two are the usual ones).
NODE_FAILURE_REASONS = frozenset({"NodeDown", "NodeFail", "Node_Fail", "NodeNotResponding", "BadNodes"})
TIME_LIMIT_SLACK_S = 5.0  # EndTime this close (or past) with no PreemptTime: the time limit
RECHECK_S = 1.0  # how long to wait before re-reading a record whose verdict might still change


class StopCause(str, Enum):
    """What is ending the job (or the attempt). The values are what the event log records."""

    PREEMPTED = "preempted"
    TIME_LIMIT = "time_limit"
    CANCELLED_BY_PERSON = "cancelled_by_person"
    NODE_FAILURE = "node_failure"
    REQUEUED = "requeued"  # already requeued (by Slurm, a person, or us): it will run again
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class StopVerdict:
    """The cause, in words, and what follows from it.

    ``final``: the run must not come back: never requeue (a person's cancel or signal).
    ``slurm_requeues``: will Slurm requeue the job by itself once it exits now? True / False, or
    None when that depends on what Slurm does not show (version unknown, no record).
    ``recheck_after``: the record may not show everything yet; read it again after this many
    seconds before acting on a ``final`` verdict (None: settled).
    ``fields``: the facts the verdict used, for the event log.
    """

    cause: StopCause
    reason: str
    final: bool = False
    slurm_requeues: bool | None = None
    recheck_after: float | None = None
    fields: dict[str, Any] | None = None

    @property
    def may_requeue(self) -> bool:
        """The supervisor may ask for a requeue (policy permitting): nothing forbids coming back
        and nobody has requeued the job already."""
        return not self.final and self.cause is not StopCause.REQUEUED and self.slurm_requeues is not True

    def to_event(self) -> dict[str, Any]:
        return {"cause": self.cause.value, "reason": self.reason, "final": self.final,
                "slurm_requeues": self.slurm_requeues, "recheck_after": self.recheck_after,
                **(self.fields or {})}


def stop_cause(
    info: JobInfo | None,
    now: float,
    signal_name: str | None = None,
    *,
    version: SlurmVersion | tuple[int, ...] | str | None = None,
    time_limit_signal: str | None = "USR1",
    expected_restarts: int | None = None,
    node_states: Mapping[str, str | None] | None = None,
) -> StopVerdict:
    """Tell a person's cancel from a preemption, a time limit, a node failure and a requeue.

    ``info``: the job as ``scontrol show job`` shows it now (None: unknown to Slurm, or Slurm could
    not be asked). ``now``: epoch seconds (the same clock as the record's times). ``signal_name``:
    the notice signal that reached the supervisor (``TERM``/``SIGTERM``/``USR1``...), None after a
    child exit with no signal. ``version``: the Slurm version (what Slurm does next depends on it).
    ``time_limit_signal``: the ``--signal=B:SIG@N`` signal (config ``preemption.time_limit_signal``).
    ``expected_restarts``: SLURM_RESTART_COUNT this run started with (a higher Restarts on the
    controller means the job was requeued meanwhile). ``node_states``: ``{node: State}`` of this
    supervisor's node (and any other of the job's nodes) read now (``SlurmCli.node_state``): a
    node requeue leaves the record looking like any other requeue (PENDING, Restarts+1, NodeList
    cleared), so the node's own DOWN/FAIL state is what tells a node failure.
    """
    sig = _norm(signal_name)
    limit_sig = _norm(time_limit_signal)
    ver = SlurmVersion.of(version)
    if info is None:
        return StopVerdict(StopCause.UNKNOWN, "no job record (not a Slurm job, or Slurm could not be asked)",
                           fields={"signal": sig})
    facts: dict[str, Any] = {
        "job_state": info.state, "job_reason": info.reason, "preempt_time": info.preempt_time,
        "end_time": info.end_time, "restarts": info.restarts, "batch_flag": info.batch_flag, "signal": sig,
    }
    left = info.seconds_left(now)
    facts["seconds_left"] = None if left is None else round(left, 1)
    state = info.state.upper()
    reason = info.reason or ""

    if info.is_cancelled:
        return StopVerdict(StopCause.CANCELLED_BY_PERSON,
                           f"JobState={info.state}: scancel by a person (or an admin); a cancel is final, "
                           "never requeued", final=True, slurm_requeues=False, fields=facts)
    failed_nodes = sorted(n for n, st in (node_states or {}).items() if _node_failed(st))
    if failed_nodes:
        facts["failed_nodes"] = failed_nodes
    if info.has_state("NODE_FAIL") or reason in NODE_FAILURE_REASONS or failed_nodes:
        return StopVerdict(StopCause.NODE_FAILURE,
                           f"JobState={info.state} Reason={reason or 'None'}"
                           + (f", node {', '.join(failed_nodes)} {node_states[failed_nodes[0]]}"  # type: ignore[index]
                              if failed_nodes else "")
                           + ": a node of the job failed; "
                           + ("Slurm requeues a requeueable batch job by itself" if info.requeue
                              else "the job is not requeueable"),
                           slurm_requeues=node_failure_requeue(info.requeue, info.batch_flag, info.is_pending),
                           fields=facts)
    if info.has_state("TIMEOUT") or reason == "TimeLimit":
        return StopVerdict(StopCause.TIME_LIMIT, f"JobState={info.state} Reason={reason or 'None'}: the job "
                           "reached its time limit; Slurm never requeues that", slurm_requeues=False, fields=facts)
    if info.has_state("PREEMPTED"):
        return StopVerdict(StopCause.PREEMPTED, "JobState=PREEMPTED: preempted and ended (PreemptMode=CANCEL, "
                           "or the record of a run Slurm already requeued)", slurm_requeues=False, fields=facts)
    if already_requeued(info.is_pending, info.restarts, expected_restarts):
        held = " and HELD: it runs again only after `scontrol release`" if info.is_held else ""
        return StopVerdict(StopCause.REQUEUED,
                           f"already requeued (JobState={info.state}, Reason={reason or 'None'}, "
                           f"Restarts={info.restarts}{'' if expected_restarts is None else f' > {expected_restarts}'})"
                           f"{held}: it will run again; a requeue is asked for once, never twice",
                           slurm_requeues=True, fields={**facts, "held": info.is_held})
    if info.preempt_time is not None:
        will = preempted_exit(ver, info.requeue)
        return StopVerdict(StopCause.PREEMPTED, f"PreemptTime set (JobState={info.state}): preempted; {will.reason}",
                           slurm_requeues=will.requeues, fields=facts)
    if state == "COMPLETING" and info.end_time is None:
        return StopVerdict(StopCause.REQUEUED, "JobState=COMPLETING with EndTime cleared and no PreemptTime: the "
                           "job is being requeued (scontrol requeue); it will run again", slurm_requeues=True,
                           fields=facts)
    if state == "COMPLETING" and _ended_early(info, now):
        return StopVerdict(StopCause.CANCELLED_BY_PERSON,
                           f"JobState=COMPLETING, ended at EndTime {_ago(left)} before its time limit, no PreemptTime, "
                           "not requeued: the job is being cancelled (scancel; the text says CANCELLED only once the "
                           "kill is over, and 22.05 has no --json to show it sooner): final, never requeued",
                           final=True, slurm_requeues=False, fields=facts)
    if sig is not None and limit_sig is not None and sig == limit_sig:
        when = "EndTime unknown" if left is None else f"{left:.0f} s before EndTime"
        return StopVerdict(StopCause.TIME_LIMIT, f"SIG{sig}, the time-limit warning signal, {when}: the time "
                           "limit is coming (Slurm never requeues a job that ran out of time)",
                           slurm_requeues=False, fields=facts)
    if left is not None and info.time_limit is not None and left <= TIME_LIMIT_SLACK_S and info.is_running:
        return StopVerdict(StopCause.TIME_LIMIT, f"EndTime reached ({-left:.0f} s ago) with no PreemptTime: the "
                           "time limit", slurm_requeues=False, fields=facts)
    if sig is not None and info.is_running:
        when = "no EndTime" if left is None else f"{left:.0f} s before EndTime"
        return StopVerdict(StopCause.CANCELLED_BY_PERSON,
                           f"SIG{sig} while JobState={info.state} with no PreemptTime, {when}: not sent by Slurm's "
                           "preemption or time limit, so a person's `scancel --signal` or `kill`: final, never "
                           "requeued", final=True, slurm_requeues=False, recheck_after=RECHECK_S, fields=facts)
    if sig is None and info.is_running:
        return StopVerdict(StopCause.UNKNOWN, f"JobState={info.state}, no PreemptTime, time left: nothing from "
                           "Slurm is ending the job (the child's own exit decides)", slurm_requeues=False,
                           fields=facts)
    return StopVerdict(StopCause.UNKNOWN, f"JobState={info.state} Reason={reason or 'None'}: no known stop cause",
                       fields=facts)


def _ended_early(info: JobInfo, now: float) -> bool:
    """EndTime is now (or past) and well before the time limit would have ended the job."""
    if info.end_time is None or info.end_time > now + TIME_LIMIT_SLACK_S:
        return False
    if info.time_limit is None or info.start_time is None:
        return True
    return info.end_time < info.start_time + info.time_limit - TIME_LIMIT_SLACK_S


def _ago(left: float | None) -> str:
    return "unknown" if left is None else f"{max(-left, 0.0):.0f} s ago,"


def _node_failed(state: str | None) -> bool:
    words = set((state or "").upper().replace("*", "").split("+"))
    return bool(words & {"DOWN", "FAIL", "FAILING", "NOT_RESPONDING"})


def _norm(name: str | None) -> str | None:
    if not name:
        return None
    text = str(name).strip().upper()
    return text.removeprefix("SIG")
