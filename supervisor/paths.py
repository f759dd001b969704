"""Where everything about one run lives. Pure path arithmetic, no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunPaths:
    """The run directory layout shared by every attempt and every requeue of one run."""

    run_dir: Path

    @property
    def supervisor_dir(self) -> Path:
        return self.run_dir / "supervisor"

    @property
    def events(self) -> Path:
        return self.supervisor_dir / "events.jsonl"

    @property
    def lock(self) -> Path:
        return self.supervisor_dir / "lock"

    @property
    def lock_owner(self) -> Path:
        """Who holds the lock (host, pid, job id): read by a second supervisor to name the holder."""
        return self.supervisor_dir / "lock.owner.json"

    @property
    def default_checkpoint_dir(self) -> Path:
        return self.run_dir / "checkpoints"

    @property
    def stop_file(self) -> Path:
        """Written on a stop notice; clients on a shared filesystem see it even without the channel."""
        return self.supervisor_dir / "stop.json"

    @property
    def submissions(self) -> Path:
        """``supervise submit``'s own record: one line per sbatch submission of this run."""
        return self.supervisor_dir / "submissions.jsonl"

    def attempt_log(self, attempt: int) -> Path:
        return self.supervisor_dir / f"attempt-{attempt}.log"

    def manifest(self, attempt: int) -> Path:
        return self.supervisor_dir / f"manifest-{attempt}.json"

    def stack_dump(self, attempt: int) -> Path:
        return self.supervisor_dir / f"stacks-{attempt}.txt"
