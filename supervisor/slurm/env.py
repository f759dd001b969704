"""What Slurm tells a process about its job, through the environment. Pure: a mapping in, frozen data out.

Read once at start; never from the clock or the controller. Seen on 22.05.8: the batch shell has
SLURM_JOB_ID and SLURM_PROCID=0 but no SLURM_STEP_ID; every ``srun`` task has SLURM_STEP_ID, its own
SLURM_PROCID and SLURMD_NODENAME; SLURM_RESTART_COUNT appears only once the job was requeued (up to
26.05), so its absence means 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .parse import expand_hostlist

# SLURM_STEP_ID values of the pseudo-steps that are not an srun step: by name, and Slurm's reserved
# step ids (batch 0xfffffffb, extern 0xfffffffc, interactive 0xfffffffd, pending 0xfffffffe), which
# 26.05 exports to the batch script as a signed number (SLURM_STEP_ID=-5); 22.05 and 24.11 leave it unset.
_NOT_A_STEP = frozenset({"batch", "extern", "interactive", "4294967294", "4294967292", "4294967293"})
_RESERVED_STEP_IDS = 0xFFFFFFF0  # from here up (and any negative number): a pseudo-step, not an srun step


@dataclass(frozen=True)
class SlurmEnv:
    """The job as the environment describes it; every field None when not under Slurm."""

    job_id: str | None = None
    restart_count: int = 0
    step_id: str | None = None
    procid: int | None = None
    localid: int | None = None
    nodename: str | None = None
    nodelist: str | None = None
    ntasks: int | None = None
    partition: str | None = None
    cluster_name: str | None = None
    submit_dir: str | None = None
    array_job_id: str | None = None
    array_task_id: str | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> SlurmEnv:
        job_id = _get(environ, "SLURM_JOB_ID", "SLURM_JOBID")
        return cls(
            job_id=job_id,
            restart_count=_int(_get(environ, "SLURM_RESTART_COUNT")) or 0,
            step_id=_get(environ, "SLURM_STEP_ID", "SLURM_STEPID"),
            procid=_int(_get(environ, "SLURM_PROCID")),
            localid=_int(_get(environ, "SLURM_LOCALID")),
            nodename=_get(environ, "SLURMD_NODENAME"),
            nodelist=_get(environ, "SLURM_JOB_NODELIST", "SLURM_NODELIST"),
            ntasks=_int(_get(environ, "SLURM_NTASKS", "SLURM_NPROCS")),
            partition=_get(environ, "SLURM_JOB_PARTITION"),
            cluster_name=_get(environ, "SLURM_CLUSTER_NAME"),
            submit_dir=_get(environ, "SLURM_SUBMIT_DIR"),
            array_job_id=_get(environ, "SLURM_ARRAY_JOB_ID"),
            array_task_id=_get(environ, "SLURM_ARRAY_TASK_ID"),
        )

    @property
    def in_job(self) -> bool:
        """Running inside a Slurm allocation (batch shell, srun step or salloc shell)."""
        return self.job_id is not None

    @property
    def in_step(self) -> bool:
        """Inside an ``srun`` step: the only processes Slurm signals at grace start."""
        return self.step_id is not None and self.step_id not in _NOT_A_STEP and not _reserved_step(self.step_id)

    @property
    def is_batch_shell(self) -> bool:
        return self.in_job and not self.in_step

    @property
    def node_names(self) -> tuple[str, ...]:
        return expand_hostlist(self.nodelist or "")


def _get(environ: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        value = environ.get(name)
        if value is not None and value.strip() != "":
            return value.strip()
    return None


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def _reserved_step(step_id: str) -> bool:
    try:
        number = int(step_id)
    except ValueError:
        return False
    return number < 0 or number >= _RESERVED_STEP_IDS
