"""Restart policy: what each failure class gets (restart, requeue or stop), how often, and the
backoff before a restart. Pure: a failure and the run's ledger in, a frozen :class:`Decision` out.

The per-class table is config (``policy:`` in YAML); this module holds its defaults and the rule
that applies it. Nothing here reads files, sleeps, or talks to Slurm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

from .states import Action, FailureClass

if TYPE_CHECKING:
    from .budget import AttemptRecord
    from .failures import Failure

FC = FailureClass


@dataclass(frozen=True)
class ClassPolicy:
    """What to do after one failure class: the action, how often in a row, and the backoff."""

    action: Action = Action.STOP
    retries: int = 3  # consecutive restarts of this class before the run stops
    backoff: float = 2.0  # first delay before a restart, seconds; doubles each time
    backoff_max: float = 60.0
    exclude_node: bool = False  # on requeue, keep away from the node where it happened


def _p(action: Action, retries: int = 3, exclude_node: bool = False) -> ClassPolicy:
    return ClassPolicy(action=action, retries=retries, exclude_node=exclude_node)


DEFAULT_POLICY: dict[FailureClass, ClassPolicy] = {
    FailureClass.NATIVE_CRASH: _p(Action.RESTART),
    FailureClass.ILLEGAL_MEMORY_ACCESS: _p(Action.RESTART),
    FailureClass.CUDA_LAUNCH_FAILURE: _p(Action.RESTART),
    FailureClass.NCCL_ERROR: _p(Action.RESTART),
    FailureClass.HANG: _p(Action.RESTART, 2),
    FailureClass.HARDWARE_FAULT: _p(Action.REQUEUE, 2, exclude_node=True),
    FailureClass.INTERCONNECT: _p(Action.REQUEUE, 2, exclude_node=True),
    FailureClass.SHM_EXHAUSTED: _p(Action.REQUEUE, 2, exclude_node=True),
    FailureClass.NODE_FAILURE: _p(Action.REQUEUE, 2, exclude_node=True),
    FailureClass.DEVICE_ASSERT: _p(Action.STOP, 0),
    FailureClass.CUDA_OOM: _p(Action.STOP, 0),
    FailureClass.HOST_OOM: _p(Action.STOP, 0),
    FailureClass.PYTHON_EXCEPTION: _p(Action.STOP, 0),
    FailureClass.PREEMPTED: _p(Action.REQUEUE, 1000),
    FailureClass.TIME_LIMIT: _p(Action.REQUEUE, 1000),
    FailureClass.CANCELLED: _p(Action.STOP, 0),
    FailureClass.KILLED: _p(Action.RESTART, 1),
    FailureClass.UNKNOWN: _p(Action.RESTART, 1),
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


def decide(
    failure: Failure,
    history: Sequence[AttemptRecord],
    policy: Mapping[FailureClass, ClassPolicy] | None,
    now_allocation: str | None,
) -> Decision:
    """Restart, requeue or stop after ``failure``, by the class policy and the run's history.

    ``history``: the ledger of the *earlier* attempts, oldest first (``budget.ledger_from_events``
    without the attempt that produced ``failure``). The same class more than ``retries`` times in a
    row stops the run; a restart waits ``backoff * 2**(n-1)`` seconds (capped), n = how many times
    in a row. Attempts whose end is unknown (a killed supervisor) neither count nor break the streak.
    ``completed`` needs no decision: the run is over (this returns STOP with that reason).
    """
    cls = failure.cls
    if cls == FC.COMPLETED:
        return Decision(Action.STOP, "completed: training finished, nothing to restart")
    pol = policy_for(cls, policy)
    consecutive = 1
    for record in reversed(list(history)):
        rec_cls = getattr(record, "cls", None)
        if rec_cls is None:
            continue
        if FailureClass(rec_cls) != cls:
            break
        consecutive += 1
    in_alloc = ""
    if now_allocation is not None:
        same = sum(1 for r in history if getattr(r, "job_id", None) == now_allocation)
        in_alloc = f" (attempt {same + 1} of job {now_allocation})"
    evidence = f": {failure.evidence[0]}" if failure.evidence else ""
    if pol.action == Action.STOP:
        return Decision(Action.STOP, f"{cls.value}: policy says stop, a person must act{evidence}")
    restarts_allowed = pol.retries
    if consecutive > restarts_allowed:
        times = "once" if consecutive == 1 else f"{consecutive} times in a row"
        return Decision(Action.STOP, f"{cls.value} {times}; policy allows {restarts_allowed} "
                                     f"{pol.action.value}{'s' if restarts_allowed != 1 else ''}{evidence}")
    exclude: tuple[str, ...] = ()
    if pol.action == Action.REQUEUE:
        if pol.exclude_node and failure.node:
            exclude = (failure.node,)
        note = f", excluding {failure.node}" if exclude else ""
        return Decision(Action.REQUEUE, f"{cls.value} ({_ordinal(consecutive)} in a row, policy allows "
                                        f"{restarts_allowed}): requeue{note}{in_alloc}", 0.0, exclude)
    delay = _backoff(pol, consecutive)
    return Decision(Action.RESTART, f"{cls.value} ({_ordinal(consecutive)} in a row, policy allows "
                                    f"{restarts_allowed}): restart in place after {delay:g}s{in_alloc}", delay)

