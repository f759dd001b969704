"""Stop notices, the deadline they carry and save arbitration (requeues: supervisor/slurm/requeue_policy.py).

Everything here is pure: plain data in, a frozen dataclass with a ``reason`` out; ``now`` is always
passed in. The run loop (``supervisor.run``) gathers the facts (signals, ``scontrol show job``,
the event log, the control channel) and carries the decisions out.

Facts this rests on (docs/slurm-versions.md, verified on Slurm 22.05.8):

* During grace ``scontrol show job`` shows ``PreemptTime=t0`` and ``EndTime=t0+GraceTime``. EndTime is
  the deadline to plan for: the real kill lands between EndTime and EndTime+30 s (the controller's
  sweep), then SIGKILL after ``max(KillWait, 5)`` s. So EndTime is a safe lower bound.
* A time-limit warning (``--signal=B:USR1@N``) is another clock: the deadline is the job's EndTime,
  and the signal may come up to 60 s earlier than N seconds before it.
* A job that exits during grace is, on 22.05-23.11, simply finished and not requeued (24.05+ requeues
  it); a time limit is never requeued by Slurm. So the requeue must often be explicit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Literal, Sequence

from .slurm.grace import ClusterGrace
from .slurm.requeue_policy import HARDWARE_CLASSES, RequeueDecision, RequeueFacts, requeue_decision
from .slurm.version import version_or_none
from .states import FailureClass, SaveDecision

# Slurm sends a --signal warning "up to 60 seconds earlier than specified" (sbatch.1, §2).
WARNING_EARLY_S = 60.0
# An EndTime this close to the notice counts as "the time limit is what is ending the job".
_TIME_LIMIT_SLACK_S = 1.0
DEFAULT_UNKNOWN_SAVE_S = 60.0
DEFAULT_WINDOW = 20  # saves of the history that count: the model (and so the save) may change
_MIN_FOR_P90 = 5  # fewer samples than this: use the max, a p90 of 3 numbers is the max anyway

NoticeSource = Literal["signal", "poll", "client", "time_limit"]
DeadlineSource = Literal["slurm_end_time", "default_grace", "cluster_grace", "time_limit_warning"]
GUESSED_DEADLINES = frozenset({"default_grace", "cluster_grace"})  # not read from the job record: refine

_NOTICE_SOURCES = ("signal", "poll", "client", "time_limit")
_HARDWARE = HARDWARE_CLASSES  # supervisor/failures/classes.py, as the requeue decision uses it


# ---------------------------------------------------------------------------------------------
# Notices and deadlines


@dataclass(frozen=True)
class Notice:
    """The allocation is ending: how we heard, when, and the deadline we plan for.

    ``source``: ``signal`` (a configured signal reached the supervisor), ``poll`` (``scontrol``
    showed a PreemptTime), ``client`` (a training rank reported the signal it got), or
    ``time_limit`` (the ``--signal=...@N`` time-limit warning, or the time limit itself).
    """

    source: str
    signal: str | None
    received_at: float
    deadline: float | None
    preempt_time: float | None
    grace: float | None  # seconds from the notice to the deadline
    job_state: str | None = None  # JobState seen with the notice (CANCELLED = a person's scancel)

    def __post_init__(self) -> None:
        if self.source not in _NOTICE_SOURCES:
            raise ValueError(f"notice source {self.source!r}; allowed: {', '.join(_NOTICE_SOURCES)}")

    @property
    def failure_class(self) -> FailureClass:
        """What ended the attempt, as far as the notice tells: preemption, time limit, or a cancel.

        A notice with no PreemptTime and no time-limit sign (Slurm unreachable, a local run) is
        treated as a preemption: the allocation is going away and the run must come back.
        """
        if (self.job_state or "").upper().startswith("CANCELLED") and self.preempt_time is None:
            return FailureClass.CANCELLED
        if self.preempt_time is not None:
            return FailureClass.PREEMPTED
        if self.source == "time_limit":
            return FailureClass.TIME_LIMIT
        return FailureClass.PREEMPTED

    def to_event(self) -> dict[str, Any]:
        """Fields of the ``notice`` event."""
        return {"source": self.source, "signal": self.signal, "deadline": self.deadline,
                "preempt_time": self.preempt_time, "grace": self.grace, "job_state": self.job_state,
                "class": self.failure_class.value}


@dataclass(frozen=True)
class Deadline:
    """When the child must be gone, where that number came from, and why."""

    at: float
    source: DeadlineSource
    reason: str
    past: bool = False  # the real deadline had already passed when the notice arrived

    def seconds_left(self, now: float) -> float:
        return self.at - now


def _epoch(value: Any) -> float | None:
    """JobInfo times may be epoch floats or datetimes; None, 0 and NaN mean unknown."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if out > 0 and math.isfinite(out) else None


def deadline_for(
    notice_at: float,
    job: Any,
    default_grace: float,
    *,
    signal_name: str | None = None,
    time_limit_warning: float | None = None,
    horizon: float | None = None,
    cluster_grace: ClusterGrace | None = None,
) -> Deadline:
    """The deadline to plan for after a stop notice received at ``notice_at``.

    ``job`` is a JobInfo-like object (``preempt_time``, ``end_time`` in epoch seconds) or None when
    Slurm is not reachable or this is not a Slurm job. ``time_limit_warning`` is the N of
    ``--signal=...@N``: pass it only when this notice is that warning. ``horizon`` is how far ahead
    an EndTime still counts as "the end this notice is about" when no PreemptTime is shown (default:
    the longer of the default grace and the warning, plus the 60 s Slurm may send a warning early).
    ``cluster_grace`` is the GraceTime the cluster's configuration gives this job (slurm/grace.py):
    when Slurm's record does not show the deadline yet, the plan uses it where it is shorter than
    the default grace (``source`` "cluster_grace"), so a slow controller cannot stretch the plan.
    """
    sig = f"SIG{signal_name.upper().removeprefix('SIG')}" if signal_name else "the notice"
    preempt_time = _epoch(getattr(job, "preempt_time", None)) if job is not None else None
    end_time = _epoch(getattr(job, "end_time", None)) if job is not None else None
    guess: DeadlineSource = "default_grace"
    basis = f"the default grace {default_grace:.1f} s"
    fallback = notice_at + default_grace
    if cluster_grace is not None and cluster_grace.seconds < default_grace:
        guess, basis = "cluster_grace", f"the {cluster_grace.source} of {cluster_grace.seconds:.0f} s"
        fallback = notice_at + cluster_grace.seconds

    if preempt_time is not None:
        if end_time is None:
            return Deadline(fallback, guess,
                            f"preempted (PreemptTime {preempt_time:.0f}) but Slurm shows no EndTime; "
                            f"planning with {basis} after {sig}")
        if end_time <= notice_at:
            return Deadline(notice_at, "slurm_end_time",
                            f"preempted at {preempt_time:.0f}; the grace deadline EndTime {end_time:.0f} "
                            f"had already passed {notice_at - end_time:.1f} s before {sig} arrived: "
                            "stop now (the kill lands within ~30 s of EndTime)", past=True)
        return Deadline(end_time, "slurm_end_time",
                        f"preempted at {preempt_time:.0f} with {end_time - preempt_time:.0f} s grace: "
                        f"deadline EndTime {end_time:.0f}, {end_time - notice_at:.1f} s after {sig}")

    if horizon is None:
        horizon = max(default_grace, time_limit_warning or 0.0) + WARNING_EARLY_S
    if end_time is not None and notice_at < end_time <= notice_at + horizon:
        what = "time-limit warning" if time_limit_warning is not None else "no PreemptTime shown"
        return Deadline(end_time, "slurm_end_time",
                        f"{what}: the job's EndTime {end_time:.0f} is {end_time - notice_at:.1f} s after "
                        f"{sig}; planning for it")
    if time_limit_warning is not None and end_time is None:
        return Deadline(notice_at + time_limit_warning, "time_limit_warning",
                        f"time-limit warning {sig} with no EndTime known: deadline {time_limit_warning:.0f} s "
                        "after it (a lower bound: Slurm may warn up to 60 s early)")
    if end_time is None:
        why = "no Slurm job record" if job is None else "Slurm shows neither PreemptTime nor EndTime"
    elif end_time <= notice_at:
        why = (f"the job's EndTime {end_time:.0f} passed {notice_at - end_time:.1f} s before {sig} "
               "(the time limit itself: only KillWait is left)")
    else:
        why = f"the job's EndTime is {end_time - notice_at:.0f} s away, too far to be what {sig} is about"
    return Deadline(fallback, guess, f"{why}; planning with {basis}")


def notice_for(
    source: NoticeSource,
    received_at: float,
    job: Any,
    default_grace: float,
    *,
    signal_name: str | None = None,
    time_limit_signal: str | None = None,
    time_limit_warning: float | None = None,
    cluster_grace: ClusterGrace | None = None,
) -> tuple[Notice, Deadline]:
    """Build the notice and its deadline in one step, telling a time limit from a preemption.

    A PreemptTime means preemption whatever the signal (with ``preempt_send_user_signal`` the
    time-limit signal is also what preemption sends). Otherwise the notice is a time limit when the
    signal is ``time_limit_signal`` (the ``--signal`` one) or when the job's EndTime has been reached.
    """
    preempt_time = _epoch(getattr(job, "preempt_time", None)) if job is not None else None
    end_time = _epoch(getattr(job, "end_time", None)) if job is not None else None
    state = getattr(job, "state", None) if job is not None else None

    def norm(name: str | None) -> str | None:
        return name.upper().removeprefix("SIG") if name else None

    is_warning = (preempt_time is None and time_limit_signal is not None
                  and norm(signal_name) == norm(time_limit_signal))
    limit_reached = preempt_time is None and end_time is not None and end_time <= received_at + _TIME_LIMIT_SLACK_S
    if preempt_time is None and (is_warning or limit_reached or str(state or "").upper() == "TIMEOUT"):
        source = "time_limit"
    # The time-limit warning's deadline is the job's EndTime however early it comes (Slurm may send
    # it up to a minute before the N of --signal=...@N, and the N itself is often not configured here).
    deadline = deadline_for(received_at, job, default_grace, signal_name=signal_name,
                            time_limit_warning=time_limit_warning if is_warning else None,
                            horizon=math.inf if is_warning else None,
                            cluster_grace=None if source == "time_limit" else cluster_grace)
    grace = None
    if preempt_time is not None and end_time is not None:
        grace = max(end_time - preempt_time, 0.0)
    notice = Notice(source=source, signal=norm(signal_name), received_at=received_at, deadline=deadline.at,
                    preempt_time=preempt_time, grace=grace if grace is not None else deadline.at - received_at,
                    job_state=str(state) if state else None)
    return notice, deadline


# ---------------------------------------------------------------------------------------------
# Save durations


@dataclass(frozen=True)
class Estimate:
    """Expected seconds for a save (or what is left of one), and what the number rests on."""

    seconds: float
    basis: str  # e.g. "p90 of 7 saves", "guess: no save history (unknown_save_s=60.0)"
    samples: int
    guess: bool = False  # no history behind it: a configured default


@dataclass(frozen=True)
class InFlightSave:
    """A save that has begun and not ended: from a client's ``save_begin`` or a watched file."""

    path: str
    step: int | None
    started_at: float
    bytes_so_far: int | None = None  # watch mode: size of the growing file
    source: str = "client"  # client | watch


@dataclass(frozen=True)
class SaveSample:
    duration: float
    bytes: int | None
    ts: float | None = None


def _field(ev: Any, key: str) -> Any:
    if isinstance(ev, dict):
        return ev.get(key)
    getter = getattr(ev, "get", None)
    return getter(key) if callable(getter) else None


def _name(ev: Any) -> str | None:
    return ev.get("event") if isinstance(ev, dict) else getattr(ev, "event", None)


def _nearest_rank(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


def _human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000.0
    return f"{n:.1f} TB"  # pragma: no cover


def save_sample(ev: Any) -> SaveSample | None:
    """The sample a ``save_end`` event gives: successful saves with a positive duration only.

    Failed saves do not predict a good one, and a duration of 0 is "not measured" (a watched save
    first seen complete), not "instant".
    """
    if _name(ev) != "save_end" or _field(ev, "ok") is not True:
        return None
    duration = _field(ev, "duration")
    if isinstance(duration, bool) or not isinstance(duration, (int, float)):
        return None
    if not (math.isfinite(duration) and duration > 0):
        return None
    nbytes = _field(ev, "bytes")
    nbytes = nbytes if isinstance(nbytes, int) and not isinstance(nbytes, bool) and nbytes > 0 else None
    ts = ev.get("ts") if isinstance(ev, dict) else getattr(ev, "ts", None)
    return SaveSample(float(duration), nbytes, ts)


class SaveHistory:
    """Durations (and sizes) of the run's successful saves, to predict the next one.

    Robust on purpose: the p90 of the last ``window`` durations (the max below 5 samples), because
    an optimistic estimate turns a "block" into a torn checkpoint at the kill. With no history the
    estimate is ``unknown_save_s`` and says it is a guess.
    """

    def __init__(self, samples: Iterable[SaveSample] = (), *, unknown_save_s: float = DEFAULT_UNKNOWN_SAVE_S,
                 window: int = DEFAULT_WINDOW) -> None:
        if unknown_save_s <= 0 or window < 1:
            raise ValueError("unknown_save_s must be > 0 and window >= 1")
        self.samples: tuple[SaveSample, ...] = tuple(samples)[-window:]
        self.unknown_save_s = float(unknown_save_s)
        self.window = window

    @classmethod
    def from_events(cls, events: Iterable[Any], *, unknown_save_s: float = DEFAULT_UNKNOWN_SAVE_S,
                    window: int = DEFAULT_WINDOW) -> "SaveHistory":
        """Successful ``save_end`` events with a positive duration, oldest first (:func:`save_sample`)."""
        samples = [sample for sample in map(save_sample, events) if sample is not None]
        return cls(samples, unknown_save_s=unknown_save_s, window=window)

    def with_event(self, event: Any) -> "SaveHistory":
        """This history with one more event applied: the loop keeps the history up to date as it
        records saves, so a notice is arbitrated without reading the event log (its cost stays flat
        however long the run has been going)."""
        sample = save_sample(event)
        if sample is None:
            return self
        return SaveHistory((*self.samples, sample), unknown_save_s=self.unknown_save_s, window=self.window)

    def __len__(self) -> int:
        return len(self.samples)

    def _guess(self, what: str = "") -> Estimate:
        return Estimate(self.unknown_save_s, f"guess: no save history{what} (unknown_save_s={self.unknown_save_s:.1f})",
                        0, guess=True)

    def _duration_estimate(self) -> Estimate:
        durations = [s.duration for s in self.samples]
        n = len(durations)
        if n >= _MIN_FOR_P90:
            return Estimate(_nearest_rank(durations, 0.9), f"p90 of {n} saves", n)
        return Estimate(max(durations), f"max of {n} save{'s' if n > 1 else ''}", n)

    def typical_bytes(self) -> int | None:
        """Median size of the recent saves that reported one."""
        sizes = sorted(s.bytes for s in self.samples if s.bytes)
        return sizes[len(sizes) // 2] if sizes else None

    def expected_duration(self, bytes: int | None = None) -> Estimate:  # noqa: A002 - the event field's name
        """Expected duration of a whole save; scaled by size when ``bytes`` and past sizes are known.

        The size-scaled figure uses a slow throughput (p10 of bytes/s; the min below 5 samples), so
        a bigger save than usual is expected to take proportionally longer, never less.
        """
        if not self.samples:
            return self._guess()
        if bytes is not None and bytes > 0:
            rates = [s.bytes / s.duration for s in self.samples if s.bytes]
            if rates:
                n = len(rates)
                slow = _nearest_rank(rates, 0.1) if n >= _MIN_FOR_P90 else min(rates)
                label = "p10" if n >= _MIN_FOR_P90 else "slowest"
                return Estimate(bytes / slow, f"{_human_bytes(bytes)} at the {label} rate of {n} saves "
                                f"({_human_bytes(slow)}/s)", n)
        return self._duration_estimate()

    def expected_remaining(self, in_flight: InFlightSave, now: float) -> Estimate:
        """Expected seconds until ``in_flight`` ends.

        With the bytes written so far (b of a typical B, after e seconds) the progress rate says
        e*(B-b)/b more; it is blended with the history's "total minus elapsed", trusting progress more
        as the save advances. A save already longer than the history's estimate is expected to need
        another full estimate (or its progress rate, when known).
        """
        elapsed = max(now - in_flight.started_at, 0.0)
        if not self.samples:
            guess = self._guess()
            left = guess.seconds - elapsed if guess.seconds > elapsed else guess.seconds
            return Estimate(left, f"{guess.basis}, {elapsed:.1f} s in", 0, guess=True)
        hist = self._duration_estimate()
        b, B = in_flight.bytes_so_far, self.typical_bytes()
        if b and B and elapsed > 0 and b < B:
            fraction = b / B
            by_rate = elapsed * (B - b) / b
            rate_basis = (f"{fraction:.0%} of a typical {_human_bytes(B)} written in {elapsed:.1f} s "
                          f"-> {by_rate:.1f} s more at that rate")
            if hist.seconds <= elapsed:  # history has nothing left to say: trust the rate
                return Estimate(by_rate, f"{rate_basis} (already past the {hist.basis}: {hist.seconds:.1f} s)",
                                hist.samples)
            by_hist = hist.seconds - elapsed
            blended = fraction * by_rate + (1 - fraction) * by_hist
            return Estimate(blended, f"{rate_basis}, blended {fraction:.0%}:{1 - fraction:.0%} with the "
                            f"{hist.basis} ({by_hist:.1f} s more)", hist.samples)
        if hist.seconds > elapsed:
            return Estimate(hist.seconds - elapsed, f"{hist.basis}: {hist.seconds:.1f} s in all, "
                            f"{elapsed:.1f} s in", hist.samples)
        more = f"; {_human_bytes(b)} written, more than the typical {_human_bytes(B)}" if b and B else ""
        return Estimate(hist.seconds, f"overrunning: {elapsed:.1f} s in, longer than the {hist.basis} "
                        f"({hist.seconds:.1f} s){more}; assuming as long again", hist.samples)


# ---------------------------------------------------------------------------------------------
# Arbitration


@dataclass(frozen=True)
class Arbitration:
    """What to do with saves now that the allocation is ending, with every number behind it."""

    decision: SaveDecision
    reason: str
    now: float
    deadline: float
    margin: float
    remaining_s: float  # deadline - now
    budget_s: float  # deadline - margin - now: the time a save may still use
    expected_s: float | None  # the save's expected (remaining) seconds
    basis: str | None
    samples: int = 0
    guess: bool = False
    save_elapsed_s: float | None = None
    save_path: str | None = None
    save_step: int | None = None

    @property
    def keep_blocking(self) -> bool:
        return self.decision is SaveDecision.BLOCK

    def to_event(self) -> dict[str, Any]:
        """Fields of the ``arbitration`` event (docs/architecture.md), plus the estimate's basis."""
        return {"decision": self.decision.value, "reason": self.reason, "now": self.now,
                "deadline": self.deadline, "margin": self.margin, "expected_save_s": self.expected_s,
                "save_in_flight": self.save_path, "budget_s": round(self.budget_s, 3),
                "basis": self.basis, "samples": self.samples, "guess": self.guess,
                "save_elapsed_s": self.save_elapsed_s, "save_step": self.save_step}


def _what(save: InFlightSave) -> str:
    return f"save of step={save.step}" if save.step is not None else f"save of {save.path}"


def _window(deadline: float, margin: float, now: float) -> str:
    return f"deadline in {deadline - now:.1f} s - margin {margin:.1f} s"


def arbitrate(
    now: float,
    deadline: float,
    margin: float,
    in_flight: InFlightSave | None,
    history: SaveHistory,
    *,
    emergency_save_allowed: bool,
    client_connected: bool,
    zero_code: bool,
    step_time_s: float | None = None,
    steps_since_save: int | None = None,
) -> Arbitration:
    """Decide between block, abort, emergency save and stop-now when a stop notice arrives.

    * save in flight, expected to end by ``deadline - margin`` -> BLOCK (let it finish, then stop);
    * save in flight that cannot end in time -> ABORT (the atomic protocol keeps the previous
      checkpoint; in zero-code mode the abort is kill-and-quarantine). When the estimate is only a
      guess (no history) the loop blocks until ``deadline - margin`` and aborts there instead:
      killing a save nothing says is slow would lose it for no reason;
    * no save in flight, one fits, a client is connected and emergency saves are allowed
      -> EMERGENCY_SAVE (``step_time_s``: time for the client to reach its next step boundary);
    * otherwise STOP_NOW. Finishing exactly at ``deadline - margin`` counts as in time.
    """
    budget = deadline - margin - now
    common: dict[str, Any] = dict(now=now, deadline=deadline, margin=margin, remaining_s=deadline - now,
                                  budget_s=budget)

    if in_flight is not None:
        est = history.expected_remaining(in_flight, now)
        elapsed = max(now - in_flight.started_at, 0.0)
        head = (f"{_what(in_flight)} in flight for {elapsed:.1f} s; expected {est.seconds:.1f} s more "
                f"({est.basis}); {_window(deadline, margin, now)}")
        abort_how = ("kill the child and quarantine the partial file" if zero_code
                     else "tell the writer to abort; the previous checkpoint stays intact")
        if budget <= 0:
            decision, tail = SaveDecision.ABORT, f"deadline - margin already passed -> abort ({abort_how})"
        elif est.seconds <= budget:
            decision, tail = SaveDecision.BLOCK, "-> block: let it finish, then stop"
        elif est.guess:
            decision, tail = SaveDecision.BLOCK, ("-> block: no history to say it cannot finish; abort at "
                                                  "deadline - margin if it is still running")
        else:
            decision, tail = SaveDecision.ABORT, f"it cannot finish in {budget:.1f} s -> abort ({abort_how})"
        return Arbitration(decision, f"{head} {tail}", expected_s=est.seconds, basis=est.basis,
                           samples=est.samples, guess=est.guess, save_elapsed_s=elapsed,
                           save_path=in_flight.path, save_step=in_flight.step, **common)

    est = history.expected_duration()
    needed = est.seconds + (step_time_s or 0.0)
    step_part = f" + {step_time_s:.1f} s to the next step" if step_time_s else ""
    need = f"a save needs {needed:.1f} s ({est.basis}{step_part})"
    window = _window(deadline, margin, now)
    if not emergency_save_allowed:
        why = "emergency saves are off (preemption.emergency_save=false)"
    elif zero_code or not client_connected:
        why = "no client connected (zero-code mode): nobody to ask for a save"
    elif steps_since_save == 0:
        why = "no step since the last durable checkpoint: nothing to save"
    elif budget <= 0:
        why = "deadline - margin already passed"
    elif needed <= budget:
        return Arbitration(SaveDecision.EMERGENCY_SAVE,
                           f"no save in flight; {need}; {window} -> emergency save, then stop"
                           + (" (the estimate is a guess)" if est.guess else ""),
                           expected_s=needed, basis=est.basis, samples=est.samples, guess=est.guess, **common)
    else:
        why = f"it does not fit in {budget:.1f} s"
    return Arbitration(SaveDecision.STOP_NOW, f"no save in flight; {need}; {window}; {why} -> stop now",
                       expected_s=needed, basis=est.basis, samples=est.samples, guess=est.guess, **common)


def after_block(
    now: float,
    deadline: float,
    margin: float,
    save_started_at: float,
    expected: Estimate | float | None,
    *,
    in_flight: InFlightSave | None = None,
) -> Arbitration:
    """While blocking on a save: keep blocking, or switch to ABORT.

    ``expected`` is the fresh estimate of what is left (``history.expected_remaining(save, now)``);
    with it the loop aborts as soon as the save is known to overrun ``deadline - margin``, leaving the
    rest of the grace to a clean stop and the requeue. ``deadline - margin`` itself is the hard line.
    A guessed estimate (no history) never aborts early.
    """
    if isinstance(expected, bool):
        expected = None
    elif isinstance(expected, (int, float)):
        expected = Estimate(float(expected), "given", 0)
    budget = deadline - margin - now
    elapsed = max(now - save_started_at, 0.0)
    what = _what(in_flight) if in_flight is not None else "save"
    common: dict[str, Any] = dict(
                  now=now, deadline=deadline, margin=margin, remaining_s=deadline - now, budget_s=budget,
                  expected_s=expected.seconds if expected else None, basis=expected.basis if expected else None,
                  samples=expected.samples if expected else 0, guess=expected.guess if expected else False,
                  save_elapsed_s=elapsed, save_path=in_flight.path if in_flight else None,
                  save_step=in_flight.step if in_flight else None)
    if budget <= 0:
        return Arbitration(SaveDecision.ABORT, f"blocked on the {what} for {elapsed:.1f} s; it is still running "
                           f"at deadline - margin ({_window(deadline, margin, now)}) -> abort", **common)
    if expected is not None and not expected.guess and expected.seconds > budget:
        return Arbitration(SaveDecision.ABORT, f"blocked on the {what} for {elapsed:.1f} s; it overruns: "
                           f"{expected.seconds:.1f} s more ({expected.basis}) but only {budget:.1f} s left "
                           f"before deadline - margin -> abort", **common)
    more = f"; expected {expected.seconds:.1f} s more" if expected is not None else ""
    return Arbitration(SaveDecision.BLOCK, f"blocked on the {what} for {elapsed:.1f} s{more}; "
                       f"{budget:.1f} s left before deadline - margin -> keep blocking", **common)


# ---------------------------------------------------------------------------------------------
# Requeue: decided in supervisor/slurm/requeue_policy.py; this keeps the keyword form callers of this module use.


def decide_requeue(
    *,
    child_outcome: FailureClass | str,
    in_slurm: bool,
    job_requeueable: bool | None,
    slurm_version: Any,
    notice: Notice | None,
    already_requeued: bool,
    policy: str,
    requeue_on_time_limit: bool,
    exclude_nodes: Sequence[str] = (),
    job_state: str | None = None,
) -> RequeueDecision:
    """:func:`supervisor.slurm.requeue_policy.requeue_decision`, with the notice as a caller holds it."""
    return requeue_decision(RequeueFacts(
        child_outcome=child_outcome, in_slurm=in_slurm, job_requeueable=job_requeueable,
        slurm_version=version_or_none(slurm_version), notice_class=notice.failure_class if notice else None,
        already_requeued=already_requeued, policy=policy, requeue_on_time_limit=requeue_on_time_limit,
        exclude_nodes=tuple(exclude_nodes), job_state=job_state))
