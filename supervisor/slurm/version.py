"""Which Slurm release this is, and what that release does: capabilities, not assumptions.

The supervisor learns the version once (``scontrol --version``: ``slurm 24.11.5`` / ``slurm-wlm
22.05.8``) and asks these properties instead of comparing numbers at the call site. Each property
names the behaviour it stands for and how it was established; docs/slurm-versions.md has the table
and the test behind each row. Pure: text in, frozen data out.

The one version parser is :meth:`SlurmVersion.parse` (text, strict); :meth:`SlurmVersion.of` takes
whatever a caller holds and :func:`version_or_none` is the lenient reading of events and records.
Everything else (``slurm.parse.parse_version``, the backends, the requeue decision) goes through them.

``SlurmVersion`` is a tuple ``(major, minor, patch)``, so it still compares with plain tuples
(``version >= (24, 5)``) and slices (``version[:2]``) wherever a tuple was used before.
"""

from __future__ import annotations

import re
from typing import NamedTuple

_VERSION_RE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")

DEFAULT_MAX_BATCH_REQUEUE = 5  # slurm.conf MaxBatchRequeue default (hard-coded 5 before it was a setting)


class SlurmVersionError(ValueError):
    """The text holds no Slurm version; the message quotes it."""


class SlurmVersion(NamedTuple):
    """A Slurm release, e.g. ``SlurmVersion(24, 11, 5)``; ``str()`` gives ``24.11.5``."""

    major: int
    minor: int
    patch: int = 0

    @classmethod
    def parse(cls, text: str) -> SlurmVersion:
        """``slurm 22.05.8`` / ``slurm-wlm 24.11.5`` / ``slurm 24.05.0-0rc1`` / ``24.11``."""
        match = _VERSION_RE.search(text or "")
        if not match:
            raise SlurmVersionError(f"no Slurm version in {str(text).strip()[:120]!r}")
        return cls(int(match.group(1)), int(match.group(2)), int(match.group(3) or 0))

    @classmethod
    def of(cls, value: SlurmVersion | tuple[int, ...] | str | None) -> SlurmVersion | None:
        """Whatever a caller holds (a tuple, a list from JSON, text, None) as a SlurmVersion."""
        if value is None:
            return None
        if isinstance(value, SlurmVersion):
            return value
        if isinstance(value, str):
            return cls.parse(value)
        parts = [int(v) for v in value]
        while len(parts) < 3:
            parts.append(0)
        return cls(*parts[:3])

    def __str__(self) -> str:
        return f"{self.major}.{self.minor:02d}.{self.patch}"

    @property
    def release(self) -> str:
        """``24.11``: the major release, the unit Slurm's behaviour changes by."""
        return f"{self.major}.{self.minor:02d}"

    # ---- preemption and requeue -------------------------------------------------------------
    @property
    def requeues_on_exit_during_grace(self) -> bool:
        """A preempted job that exits before its GraceTime ends is requeued by Slurm itself
        (PreemptMode=REQUEUE, requeueable job). 22.05-23.11: the job simply ends (COMPLETED /
        FAILED) and only an explicit ``scontrol requeue`` brings it back. From 24.05 (Slurm commit
        a689104d15, "Treat jobs completing after being signalled for GraceTime as preempted").
        Tested: test_versions_cluster.py::test_exit_during_grace_is_requeued_exactly_once."""
        return self >= (24, 5)

    @property
    def grace_exit_ends_as_preempted(self) -> bool:
        """A job that exits during its grace is handled by PreemptMode whatever its exit status:
        requeued when requeueable, else it ends PREEMPTED (exit code 0). 22.05-23.11: it ends
        COMPLETED/FAILED with its own exit code. Seen on 24.11.5 and 26.05.5 (test_submit.py::
        test_preempted_no_requeue_job_is_resubmitted_...: PREEMPTED/0 there, FAILED/75 on 22.05)."""
        return self >= (24, 5)

    @property
    def grace_exit_counts_toward_max_batch_requeue(self) -> bool:
        """That 24.05+ requeue goes through the "batch job completed, requeue it" path, which
        bumps BatchFlag; after more than MaxBatchRequeue (default 5) of them the job is held
        (Reason JobHoldMaxRequeue). Grace-expiry requeues and ``scontrol requeue`` do not count.
        Tested: test_versions_cluster.py::test_many_graceful_preemptions_of_one_job."""
        return self.requeues_on_exit_during_grace

    @property
    def holds_after_max_batch_requeue(self) -> bool:
        """Graceful preemptions can end in a held job (JobHoldMaxRequeue) that never runs again
        until ``scontrol release``: only where exits during grace are requeued by Slurm."""
        return self.grace_exit_counts_toward_max_batch_requeue

    @property
    def may_requeue_again_after_grace_expiry(self) -> bool:
        """After a job was requeued at grace expiry (or by ``scontrol requeue`` while in grace),
        its next run may be requeued once more when it ends, even after a clean exit 0: the
        grace-preempt mark set at preemption is only cleared on the exit-during-grace path.
        Seen on 24.11.5 (one extra run, Restarts=2 for a job preempted once), not on 26.05.5
        (Restarts=1); 24.05-25.11 other than 24.11.5 are assumed affected (the mark exists from
        24.05) and not tested here. A run must therefore treat "already complete" as complete
        again, at once. Tested: test_slurm_cluster.py::test_preempted_step_gets_sigterm_..."""
        return (24, 5) <= self < (26, 5)

    @property
    def requeue_delay_setting(self) -> bool:
        """``SchedulerParameters=requeue_delay=`` sets the BeginTime wait of a requeued job
        (25.11+); before, it is the credential lifetime ``AuthInfo=cred_expire`` (default 120 s)."""
        return self >= (25, 11)

    @property
    def restart_count_always_set(self) -> bool:
        """SLURM_RESTART_COUNT is in the job's environment on the first run too (0) only from
        26.11; up to 26.05 it appears once the job was requeued: read it as ``${...:-0}``."""
        return self >= (26, 11)

    # ---- output formats ------------------------------------------------------------------------
    @property
    def scontrol_json(self) -> bool:
        """``scontrol show job --json`` exists (23.02+); the supervisor still reads ``-o`` text."""
        return self >= (23, 2)

    @property
    def sacct_json_exit_codes_correct(self) -> bool:
        """``sacct --json`` reports exit codes of normal exits correctly only from 23.11."""
        return self >= (23, 11)

    # ---- the test cluster's configuration --------------------------------------------------------
    @property
    def has_task_none_plugin(self) -> bool:
        """``TaskPlugin=task/none`` exists up to 23.02 (gone from 23.11)."""
        return self < (23, 11)

    @property
    def has_cgroup_plugin_disabled(self) -> bool:
        """``cgroup.conf: CgroupPlugin=disabled`` exists from 24.05."""
        return self >= (24, 5)


def version_or_none(value: object) -> SlurmVersion | None:
    """The one lenient reading, for values from events and job records: ``(22, 5, 8)``, ``[24, 11]``,
    ``"22.05.8"``, ``"slurm 24.05.1"`` -> a SlurmVersion; anything that holds no version -> None."""
    if value is None or isinstance(value, bool):
        return None
    try:
        if isinstance(value, (str, tuple, list)):
            return SlurmVersion.of(value) if value else None  # type: ignore[arg-type]
    except (SlurmVersionError, TypeError, ValueError):
        return None
    return None
