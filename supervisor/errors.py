"""One rooted exception tree. Each error carries its facts; the CLI maps ``exit_code`` to the
process status, so a user mistake becomes one clear line and a documented code, never a traceback.
"""

from __future__ import annotations


class ExitCode:
    """Documented process exit codes of ``supervise`` (README "Exit codes")."""

    OK = 0
    FAILED = 1  # a check failed (verify found a bad checkpoint, report found problems)
    USAGE = 2  # bad command line, config, or input path
    LOCKED = 3  # another live supervisor holds the run directory
    STOPPED = 4  # run stopped by policy: budget exhausted, crash loop, resume audit failed
    QOS_LIMIT = 5  # submit: the job asks for what its QOS never allows (wall time over MaxWall)
    REQUEUE = 75  # EX_TEMPFAIL: training not finished, handed back to Slurm / the resubmission loop


class SupervisorError(Exception):
    """Base of every error the supervisor raises on purpose."""

    exit_code = ExitCode.FAILED


class UsageError(SupervisorError):
    """The user asked for something that cannot work: bad flag, missing command, bad path."""

    exit_code = ExitCode.USAGE


class QosLimitError(UsageError):
    """The job can never run under its QOS (e.g. ``--time`` over the QOS's MaxWall): refused before
    the first submission, so nothing waits in the queue forever."""

    exit_code = ExitCode.QOS_LIMIT


class ConfigError(UsageError):
    """A config key or value is wrong; the message names the key, the value and what is allowed."""

    def __init__(self, key: str, value: object, allowed: str, source: str = "") -> None:
        self.key, self.value, self.allowed, self.source = key, value, allowed, source
        where = f" (from {source})" if source else ""
        super().__init__(f"config key '{key}'{where}: got {value!r}; {allowed}")


class RunLockedError(SupervisorError):
    """A second supervisor tried to take a run directory that a live one holds."""

    exit_code = ExitCode.LOCKED


class SlurmError(SupervisorError):
    """A Slurm command failed, hung, or is missing."""

    def __init__(self, argv: list[str], message: str, returncode: int | None = None, stderr: str = "",
                 timed_out: bool = False) -> None:
        self.argv, self.returncode, self.stderr, self.timed_out = argv, returncode, stderr, timed_out
        super().__init__(f"{' '.join(argv)}: {message}")
