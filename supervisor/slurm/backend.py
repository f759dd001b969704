"""The interface every Slurm backend offers the supervisor (CLI or pyslurm), and what requeue returns."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from .grace import ClusterGrace
from .parse import JobInfo
from .version import SlurmVersion


@dataclass(frozen=True)
class RequeueResult:
    """The outcome of asking for a requeue; ``ok`` when the job will run again."""

    job_id: str
    requeued: bool  # this call requeued the job
    already: bool  # it was already waiting to run again (Slurm or an earlier call requeued it)
    reason: str
    excluded: tuple[str, ...] = ()  # the job's ExcNodeList after this call, when nodes were excluded
    exclude_error: str | None = None  # the requeue worked but excluding the nodes did not

    @property
    def ok(self) -> bool:
        return self.requeued or self.already


@runtime_checkable
class SlurmBackend(Protocol):
    """What the supervisor needs from Slurm. Errors are :class:`supervisor.errors.SlurmError`."""

    name: str

    def version(self) -> SlurmVersion: ...  # a (major, minor, patch) tuple with capability properties

    def job_info(self, job_id: int | str) -> JobInfo | None: ...

    def requeue(
        self, job_id: int | str, expected_restarts: int | None = None, exclude: Sequence[str] = ()
    ) -> RequeueResult: ...

    def update_exclude(self, job_id: int | str, nodes: Sequence[str]) -> tuple[str, ...]: ...

    def submit(self, script_path: str, extra_args: Sequence[str] = ()) -> int: ...

    def cancel(self, job_id: int | str) -> None: ...

    def release(self, job_id: int | str) -> bool: ...  # scontrol release of a held job; False if not held

    def queue_state(self, job_id: int | str) -> str | None: ...

    def preemption_grace(self, info: JobInfo) -> ClusterGrace | None: ...  # the configured GraceTime
