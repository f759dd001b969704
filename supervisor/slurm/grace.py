"""The preemption grace this job will get, read from the cluster's configuration before any notice.

Slurm signals a preempted job's steps at the start of its grace period, and its job record shows
``PreemptTime``/``EndTime`` a moment later: tens of milliseconds on an idle controller, seconds on
a busy one (a preemption storm is exactly when slurmctld is busiest). A notice that arrives before
the record shows the deadline used to be planned with ``preemption.default_grace`` (30 s); with a
4 s grace that plan let a 10 s save run into the kill.

The grace is a configuration value, known long before the notice: which one applies depends on the
preempt plugin (docs/slurm-versions.md, "Where the grace comes from"):

* ``PreemptType=preempt/partition_prio``: the job's partition's ``GraceTime``;
* ``PreemptType=preempt/qos``: the job's QOS's ``GraceTime`` (from the accounting database);
* ``preempt/none``: no preemption, so no grace to learn.

:func:`grace_from` is the pure decision; the backends read the three values.
"""

from __future__ import annotations

from dataclasses import dataclass

from .parse import parse_duration


@dataclass(frozen=True)
class ClusterGrace:
    """The grace Slurm would give this job if it were preempted now, and where it was read."""

    seconds: float
    source: str  # e.g. "partition extra GraceTime", "QOS scavenger GraceTime"


def grace_from(preempt_type: str | None, partition: str | None, partition_grace: str | None,
               qos: str | None, qos_grace: str | None, *, preempt_mode: str | None = None,
               partition_mode: str | None = None, qos_mode: str | None = None) -> ClusterGrace | None:
    """Which configured GraceTime applies to the job; None when there is none to plan with.

    ``partition_grace`` is the partition's ``GraceTime`` as ``scontrol show partition`` prints it
    (seconds), ``qos_grace`` the QOS's as ``sacctmgr`` prints it (``[D-]HH:MM:SS`` or seconds). The
    modes are the cluster's ``PreemptMode`` and the partition's or QOS's own (which win when set;
    sacctmgr prints ``cluster`` for a QOS that has none: the cluster's then applies).

    None also when the job's preemption gives no grace period: ``PreemptMode`` OFF (nothing is
    preempted: a SIGTERM is a person's or the time limit's), SUSPEND (SIGTSTP, no grace), or a
    GraceTime of 0 (Slurm's default: the kill follows after KillWait, and the job record shows the
    moment at once, so the record decides as before).
    """
    plugin = (preempt_type or "").strip().lower()
    if plugin.endswith("partition_prio"):
        seconds, mode, source = _seconds(partition_grace), partition_mode, f"partition {partition} GraceTime"
    elif plugin.endswith("/qos"):
        seconds, mode, source = _seconds(qos_grace), qos_mode, f"QOS {qos} GraceTime"
    else:
        return None
    own = (mode or "").strip()
    if own.upper() == "CLUSTER":  # sacctmgr's word for a QOS without its own PreemptMode
        own = ""
    effective = own or (preempt_mode or "").strip()
    words = {w.strip().upper() for w in effective.replace(",", " ").split()}
    if words & {"OFF", "SUSPEND"}:
        return None
    if seconds is None or seconds <= 0:
        return None
    return ClusterGrace(seconds, source)


def _seconds(text: str | None) -> float | None:
    if text is None or not text.strip():
        return None
    value = text.strip()
    if value.isdigit():
        return float(value)
    try:
        parsed = parse_duration(value)
    except ValueError:
        return None
    return float(parsed) if parsed is not None else None
