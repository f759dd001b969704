"""Restart policy: what each failure class gets (restart, requeue or stop), how often, and the
backoff before a restart. Pure: a failure and the run's ledger in, a frozen :class:`Decision` out.

The per-class table is config (``policy:`` in YAML); this module holds its defaults and the rule
that applies it. Nothing here reads files, sleeps, or talks to Slurm.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .failures.classes import CLASSES
from .ledger import (
    AttemptRecord,
    durable_end,
    made_progress,
    progress_by_attempt,
    start_step,
)
from .states import Action, FailureClass

if TYPE_CHECKING:
    from .failures import Failure

FC = FailureClass


@dataclass(frozen=True)
class ClassPolicy:
    """What to do after one failure class: the action, how often in a row without progress, and the
    backoff. A failure after durable progress starts the count again (docs/policy.md)."""

    action: Action = Action.STOP
    retries: int = 3  # failures of this class in a row *without durable progress* before the run stops
    backoff: float = 2.0  # first delay before a restart, seconds; doubles each time
    backoff_max: float = 60.0
    exclude_node: bool = False  # on requeue, keep away from the node where it happened


def _p(action: Action, retries: int = 3, exclude_node: bool = False) -> ClassPolicy:
    return ClassPolicy(action=action, retries=retries, exclude_node=exclude_node)


# Derived from the one table of class traits (supervisor/failures/classes.py).
DEFAULT_POLICY: dict[FailureClass, ClassPolicy] = {
    cls: _p(t.action, t.retries, exclude_node=t.exclude_node) for cls, t in CLASSES.items() if cls is not FC.COMPLETED
}


def action_for(cls: FailureClass, policy: Mapping[FailureClass, ClassPolicy] | None = None) -> Action:
    """The action the policy table gives ``cls`` (defaults for classes the table leaves out)."""
    if cls == FC.COMPLETED:
        return Action.STOP  # nothing left to run; the run loop ends the run as complete
    return policy_for(cls, policy).action


def policy_for(cls: FailureClass, policy: Mapping[FailureClass, ClassPolicy] | None = None) -> ClassPolicy:
    """One class's policy: the table's entry, else the default, else stop."""
    table = policy if policy is not None else DEFAULT_POLICY
    return table.get(cls, DEFAULT_POLICY.get(cls, ClassPolicy()))


@dataclass(frozen=True)
class Decision:
    """What to do after a failure, and how long to wait first."""

    action: Action
    reason: str
    delay: float = 0.0  # seconds of backoff before a restart
    exclude_nodes: tuple[str, ...] = ()  # for a requeue: nodes to keep away from (policy.exclude_node)
    stopped_by: str | None = None  # a STOP: the policy key behind it (``policy.<class>.retries`` / ``.action``)
    in_a_row: int = 0  # failures of this class in a row without durable progress, this one included


def _backoff(policy: ClassPolicy, consecutive: int) -> float:
    """Exponential backoff as tenacity computes it: ``backoff * 2**(n-1)``, capped at ``backoff_max``.
    (Imported here: classifying needs no tenacity, so ``classify`` also runs where only torch is.)"""
    from tenacity import RetryCallState, wait_exponential

    wait = wait_exponential(multiplier=policy.backoff, exp_base=2, min=0, max=policy.backoff_max)
    state = RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
    state.attempt_number = max(consecutive, 1)
    return float(wait(state))


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


@dataclass(frozen=True)
class Streak:
    """How many failures of one class came in a row without durable progress, and from where."""

    count: int
    resume_steps: tuple[int | None, ...]  # where each attempt that made no progress started, newest first
    reset_by: AttemptRecord | None = None  # the attempt whose progress started the streak, if any


def failures_in_a_row(cls: FailureClass, history: Sequence[AttemptRecord], current: AttemptRecord | None,
                      min_progress: int = 1) -> Streak:
    """Failures of ``cls`` in a row without durable progress, the one that just happened included.

    Walking back from the newest attempt: each failure of ``cls`` counts; an attempt that made
    durable progress (at least ``min_progress`` steps saved past its resume point and resumed from)
    counts if it is of ``cls`` and ends the walk, since everything before it was followed by
    progress; another class ends it too (a different problem). Attempts whose end is unknown (a
    killed supervisor) neither count nor end it unless they made progress. Unknown progress is no
    progress: without steps the count is the plain "in a row" count.
    """
    records = [*history, current] if current is not None else list(history)
    progress = progress_by_attempt(records)  # the current attempt's: up to its newest good save
    count = 1
    if current is not None and made_progress(progress[-1], min_progress):
        return Streak(1, (), current)
    starts: list[int | None] = [start_step(current) if current is not None else None]
    earlier = records[:-1] if current is not None else records
    for record, made in zip(reversed(earlier), reversed(progress[:len(earlier)])):
        moved = made_progress(made, min_progress)
        if record.cls is None:
            if moved:
                return Streak(count, tuple(starts), record)
            continue
        if record.cls != cls:
            break
        count += 1
        if moved:
            return Streak(count, tuple(starts), record)
        starts.append(start_step(record))
    return Streak(count, tuple(starts))


def decide(
    failure: Failure,
    history: Sequence[AttemptRecord],
    policy: Mapping[FailureClass, ClassPolicy] | None,
    now_allocation: str | None,
    *,
    current: AttemptRecord | None = None,
    min_progress: int = 1,
) -> Decision:
    """Restart, requeue or stop after ``failure``, by the class policy and the run's progress.

    ``history``: the ledger of the *earlier* attempts, oldest first; ``current``: the ledger record
    of the attempt that produced ``failure`` (``ledger_from_events(...)[-1]``), which says whether it
    made durable progress; ``min_progress``: ``budget.min_durable_progress``. More than ``retries``
    failures of the class in a row *without durable progress* stop the run (a crash loop); a failure
    after progress starts the count again, so a crash every few thousand steps is carried to the end
    and only the budgets (:func:`supervisor.budget.judge`) bound it. A restart waits
    ``backoff * 2**(n-1)`` seconds (capped), n = the count. ``completed`` needs no decision: the run
    is over (this returns STOP with that reason).
    """
    cls = failure.cls
    if cls == FC.COMPLETED:
        return Decision(Action.STOP, "completed: training finished, nothing to restart")
    pol = policy_for(cls, policy)
    streak = failures_in_a_row(cls, history, current, min_progress)
    n = streak.count
    in_alloc = ""
    if now_allocation is not None:
        same = sum(1 for r in history if r.job_id == now_allocation)
        in_alloc = f" (attempt {same + 1} of job {now_allocation})"
    evidence = f": {failure.evidence[0]}" if failure.evidence else ""
    if pol.action == Action.STOP:
        return Decision(Action.STOP, f"{cls.value}: policy says stop, a person must act{evidence}",
                        stopped_by=f"policy.{cls.value}.action", in_a_row=n)
    allowed = pol.retries
    what = f"{pol.action.value}{'s' if allowed != 1 else ''}"
    if n > allowed:
        times = "once" if n == 1 else f"{n} times in a row"
        starts = {s for s in streak.resume_steps if s is not None}
        where = f", every time from step {starts.pop()}" if len(starts) == 1 and len(streak.resume_steps) > 1 else ""
        return Decision(Action.STOP, f"{cls.value} {times}; policy allows {allowed} {what} in a row without "
                                     f"durable progress{where} (policy.{cls.value}.retries){evidence}",
                        stopped_by=f"policy.{cls.value}.retries", in_a_row=n)
    count = f"{_ordinal(n)} in a row without durable progress, policy allows {allowed}"
    if current is not None and streak.reset_by is current:
        saved = durable_end(current, None)
        count = (f"after durable progress: attempt {current.attempt} saved up to step {saved} from step "
                 f"{start_step(current)}, so the count starts again at 1; policy allows {allowed} in a row "
                 "without progress")
    exclude: tuple[str, ...] = ()
    if pol.action == Action.REQUEUE:
        if pol.exclude_node and failure.node:
            exclude = (failure.node,)
        note = f", excluding {failure.node}" if exclude else ""
        return Decision(Action.REQUEUE, f"{cls.value} ({count}): requeue{note}{in_alloc}", 0.0, exclude,
                        in_a_row=n)
    delay = _backoff(pol, n)
    return Decision(Action.RESTART, f"{cls.value} ({count}): restart in place after {delay:g}s{in_alloc}", delay,
                    in_a_row=n)
