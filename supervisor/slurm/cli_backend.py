"""Slurm through its command-line tools: works with every Slurm version.

All subprocesses go through one seam, :meth:`SlurmCli.run`: argv lists only, never a shell, a
timeout on every call, and retries with backoff (tenacity) for the failures a busy or restarting
controller produces. A command that hangs is killed at its timeout and counts as transient.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from ..errors import SlurmError
from .backend import RequeueResult
from .choice import BackendChoice
from .grace import ClusterGrace, grace_from
from .parse import (
    JobInfo,
    SlurmParseError,
    parse_fields,
    parse_json_state,
    parse_sbatch_job_id,
    parse_scontrol_job,
    parse_version,
)
from .requeue_policy import ALREADY_PENDING_MESSAGE, check_requeue
from .version import SlurmVersion

log = logging.getLogger("supervisor.slurm")

# The controller was busy, restarting or unreachable: the same command may work a moment later.
_TRANSIENT = re.compile(
    r"Socket timed out|Unable to contact slurm controller|Connection refused|Connection reset"
    r"|Zero Bytes were transmitted or received|backup controller in standby mode"
    r"|Resource temporarily unavailable|Communication connection failure|try again later",
    re.IGNORECASE,
)
# Failures where nothing reached the controller: safe to retry even a non-idempotent sbatch.
_NOT_SENT = re.compile(
    r"Unable to contact slurm controller|Connection refused|backup controller in standby mode", re.IGNORECASE
)
_NODE_NAME = re.compile(r"^[A-Za-z0-9._\-\[\]]+$")
_INVALID_JOB = "Invalid job id specified"


def slurm_error(argv: Sequence[str], message: str, returncode: int | None = None, stderr: str = "") -> SlurmError:
    """A :class:`SlurmError` that also carries the command's stderr (``err.stderr``)."""
    err = SlurmError(list(argv), message, returncode)
    err.stderr = stderr  # type: ignore[attr-defined]
    return err


def is_transient(err: BaseException, idempotent: bool = True) -> bool:
    """Worth retrying? A timeout or a busy/unreachable controller; for a non-idempotent command
    only when nothing can have reached the controller."""
    if not isinstance(err, SlurmError):
        return False
    stderr = getattr(err, "stderr", "") or ""
    if getattr(err, "timed_out", False):
        return idempotent
    return bool((_TRANSIENT if idempotent else _NOT_SENT).search(stderr))


class SlurmCli:
    """The CLI backend. ``env``: the environment for the commands (default: this process's);
    ``timeout``: seconds per command; ``attempts``: tries for transient failures; ``backoff``:
    first wait between tries (doubling, capped at ``max_backoff``)."""

    name = "cli"
    choice: BackendChoice | None = None  # why get_backend picked this backend (run_start records it)

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        timeout: float = 10.0,
        attempts: int = 3,
        backoff: float = 0.5,
        max_backoff: float = 4.0,
    ) -> None:
        self.env = dict(env) if env is not None else None
        self.timeout = timeout
        self.attempts = max(1, attempts)
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._version: SlurmVersion | None = None

    # ---- the one subprocess seam -------------------------------------------------------------
    def run(self, argv: Sequence[str], timeout: float | None = None, idempotent: bool = True) -> str:
        """Run a Slurm command; return its stdout. Raise :class:`SlurmError` (with ``.stderr``,
        ``.returncode``) once it failed for good."""
        argv = [str(a) for a in argv]
        limit = self.timeout if timeout is None else timeout
        retrying = Retrying(
            stop=stop_after_attempt(self.attempts),
            wait=wait_exponential(multiplier=self.backoff, min=self.backoff, max=self.max_backoff),
            retry=retry_if_exception(lambda e: is_transient(e, idempotent)),
            before_sleep=lambda state: log.warning(
                "slurm: %s failed (%s); retry %d/%d",
                argv[0], state.outcome.exception() if state.outcome else "?", state.attempt_number, self.attempts - 1,
            ),
            reraise=True,
        )
        try:
            return retrying(self._run_once, argv, limit)
        except SlurmError as err:
            if getattr(err, "timed_out", False) and self.attempts > 1 and idempotent:
                raise slurm_error(
                    argv,
                    f"timed out after {limit:g} s (attempt {self.attempts} of {self.attempts}); "
                    "is the Slurm controller down or overloaded?",
                    None,
                    getattr(err, "stderr", ""),
                ) from err
            raise

    def _run_once(self, argv: list[str], timeout: float) -> str:
        executable = self._which(argv)
        try:
            proc = subprocess.run(
                [executable, *argv[1:]],
                env=self.env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                encoding="utf-8",
                errors="replace",  # a job name in another encoding must not crash the supervisor
                timeout=timeout,
                shell=False,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            err = slurm_error(argv, f"timed out after {timeout:g} s (command killed)", None, stderr)
            err.timed_out = True  # type: ignore[attr-defined]
            raise err from exc
        except OSError as exc:
            raise slurm_error(argv, f"could not run {executable}: {exc.strerror or exc}") from exc
        if proc.returncode != 0:
            stderr = proc.stderr.strip()
            message = stderr.splitlines()[-1] if stderr else f"exited {proc.returncode} with no message"
            raise slurm_error(argv, message, proc.returncode, stderr)
        return proc.stdout

    def _which(self, argv: list[str]) -> str:
        path = (self.env if self.env is not None else os.environ).get("PATH", os.defpath)
        found = shutil.which(argv[0], path=path)
        if found is None:
            raise slurm_error(
                argv,
                f"'{argv[0]}' not found on PATH; this is not a Slurm node, or Slurm's client commands "
                "are not installed (run inside a Slurm job, or use --no-slurm)",
            )
        return found

    # ---- queries ---------------------------------------------------------------------------------
    def version(self) -> SlurmVersion:
        """The Slurm client tools' version, e.g. SlurmVersion(22, 5, 8) (a tuple; asked once)."""
        if self._version is None:
            argv = ["scontrol", "--version"]
            try:
                self._version = parse_version(self.run(argv))
            except SlurmParseError as exc:
                raise slurm_error(argv, str(exc)) from exc
        return self._version

    def job_info(self, job_id: int | str) -> JobInfo | None:
        """The job as ``scontrol show job -o`` shows it; None when Slurm no longer knows the id."""
        argv = ["scontrol", "show", "job", "-o", str(job_id)]
        try:
            text = self.run(argv)
        except SlurmError as err:
            if _INVALID_JOB in (getattr(err, "stderr", "") or ""):
                return None
            raise
        if not text.strip():
            return None
        try:
            info = parse_scontrol_job(text, job_id)
        except SlurmParseError as exc:
            raise slurm_error(argv, str(exc)) from exc
        if info.state == "COMPLETING":
            info = self._with_state_flags(info)
        return info

    def _with_state_flags(self, info: JobInfo) -> JobInfo:
        """A COMPLETING job's text hides why it is ending (24.11/26.05 show COMPLETING through a
        cancel's kill window); 23.02+ ``--json`` has the full state, e.g. CANCELLED+COMPLETING."""
        try:
            if not self.version().scontrol_json:
                return info
            argv = ["scontrol", "show", "job", "--json", str(info.job_id)]
            flags = parse_json_state(self.run(argv), info.job_id)
        except (SlurmError, SlurmParseError) as exc:
            log.warning("slurm: could not read the full state of job %s: %s", info.job_id, exc)
            return info
        return dataclasses.replace(info, state_flags=flags) if flags else info

    def node_state(self, node: str) -> str | None:
        """The node's State as ``scontrol show node`` prints it (``IDLE``, ``ALLOCATED``,
        ``DOWN+NOT_RESPONDING``, ``MIXED+DRAIN``...); None when Slurm does not know the node."""
        if not _NODE_NAME.match(node or ""):
            raise slurm_error(["scontrol", "show", "node", str(node)], f"not a node name: {node!r}")
        argv = ["scontrol", "show", "node", "-o", node]
        try:
            text = self.run(argv)
        except SlurmError as err:
            if "not found" in (getattr(err, "stderr", "") or "").lower():
                return None
            raise
        return parse_fields(text.splitlines()[0]).get("State") if text.strip() else None

    def preemption_grace(self, info: JobInfo) -> ClusterGrace | None:
        """The GraceTime Slurm would give this job if preempted (the partition's or the QOS's, by
        the preempt plugin); None when the cluster gives it none or it cannot be read."""
        config = self.run(["scontrol", "show", "config"])
        settings = {key.strip(): value.strip() for key, _, value in
                    (line.partition("=") for line in config.splitlines() if "=" in line)}
        plugin = settings.get("PreemptType", "").lower()
        partition_grace = qos_grace = partition_mode = qos_mode = None
        if plugin.endswith("partition_prio") and info.partition and _NODE_NAME.match(info.partition):
            text = self.run(["scontrol", "show", "partition", "-o", info.partition])
            fields = parse_fields(text.splitlines()[0]) if text.strip() else {}
            partition_grace, partition_mode = fields.get("GraceTime"), fields.get("PreemptMode")
        elif plugin.endswith("/qos") and info.qos and _NODE_NAME.match(info.qos):
            out = self.run(["sacctmgr", "-n", "-P", "show", "qos", info.qos, "format=GraceTime,PreemptMode"])
            row = next((line.strip() for line in out.splitlines() if line.strip()), "")
            qos_grace, _, qos_mode = row.partition("|")
        return grace_from(settings.get("PreemptType"), info.partition, partition_grace, info.qos, qos_grace,
                          preempt_mode=settings.get("PreemptMode"), partition_mode=partition_mode,
                          qos_mode=qos_mode)

    def qos_max_wall(self, qos: str) -> str | None:
        """The QOS's MaxWall as ``sacctmgr`` prints it (``01:00:00``); None when it has none or
        accounting does not know the QOS (then Slurm judges the job at submission)."""
        if not _NODE_NAME.match(qos or ""):
            raise slurm_error(["sacctmgr", "show", "qos", str(qos)], f"not a QOS name: {qos!r}")
        out = self.run(["sacctmgr", "-n", "-P", "show", "qos", qos, "format=MaxWall"])
        row = next((line.strip() for line in out.splitlines() if line.strip()), "")
        return row or None

    def queue_state(self, job_id: int | str) -> str | None:
        """JobState from squeue (e.g. RUNNING, PENDING, COMPLETED); None once Slurm forgot the job."""
        argv = ["squeue", "-h", "-t", "all", "-j", str(job_id), "-o", "%T"]
        try:
            out = self.run(argv)
        except SlurmError as err:
            if _INVALID_JOB in (getattr(err, "stderr", "") or ""):
                return None
            raise
        lines = [line.strip() for line in out.splitlines() if line.strip()]
        return lines[0] if lines else None

    # ---- actions ------------------------------------------------------------------------------------
    def requeue(
        self, job_id: int | str, expected_restarts: int | None = None, exclude: Sequence[str] = ()
    ) -> RequeueResult:
        """Requeue the job, idempotently: a job already pending again is reported, not failed.

        ``exclude``: nodes to add to the job's ExcNodeList once it is requeued (Slurm only lets a
        pending job's ExcNodeList change, and accepts it right after the requeue)."""
        job = str(job_id)
        check = check_requeue(self.job_info(job), expected_restarts)
        if not check.call_requeue and not check.already_requeued:
            return RequeueResult(job, requeued=False, already=False, reason=check.reason)
        requeued = False
        reason = check.reason
        if check.call_requeue:
            argv = ["scontrol", "requeue", job]
            try:
                self.run(argv)
                requeued, reason = True, f"requeued ({check.reason})"
            except SlurmError as err:
                stderr = getattr(err, "stderr", "") or ""
                after = check_requeue(self.job_info(job), expected_restarts)
                if not (after.already_requeued or ALREADY_PENDING_MESSAGE in stderr):
                    raise self._explain_requeue_error(argv, err) from err
                reason = f"already requeued (slurmctld: {stderr.strip() or after.reason})"
        result = RequeueResult(job, requeued=requeued, already=not requeued, reason=reason)
        if exclude:
            try:
                excluded = self.update_exclude(job, exclude)
                return RequeueResult(job, requeued, not requeued, reason, excluded=excluded)
            except SlurmError as err:
                return RequeueResult(job, requeued, not requeued, reason, exclude_error=str(err))
        return result

    def update_exclude(self, job_id: int | str, nodes: Sequence[str]) -> tuple[str, ...]:
        """Add ``nodes`` to the job's ExcNodeList (keeping what is there); return the new list.
        The job must be pending (e.g. just requeued): Slurm refuses the change for a running job."""
        job = str(job_id)
        bad = [n for n in nodes if not _NODE_NAME.match(n)]
        if bad:
            raise slurm_error(["scontrol", "update", f"JobId={job}"], f"not a node name: {bad[0]!r}")
        info = self.job_info(job)
        if info is None:
            raise slurm_error(["scontrol", "show", "job", job], f"job {job} no longer exists; cannot exclude nodes")
        merged = tuple(dict.fromkeys([*info.exc_node_names, *nodes]))
        argv = ["scontrol", "update", f"JobId={job}", f"ExcNodeList={','.join(merged)}"]
        try:
            self.run(argv)
        except SlurmError as err:
            if "no longer pending" in (getattr(err, "stderr", "") or ""):
                raise slurm_error(
                    argv,
                    f"job {job} is running: Slurm changes ExcNodeList only while a job is pending; "
                    "requeue it first (requeue(job_id, exclude=...))",
                    err.returncode,
                    getattr(err, "stderr", ""),
                ) from err
            raise
        return merged

    def submit(self, script_path: str | os.PathLike[str], extra_args: Sequence[str] = ()) -> int:
        """``sbatch --parsable [extra_args] script``; the new job id. Not retried once it may have
        reached the controller (a retry could submit twice)."""
        path = Path(script_path)
        if not path.is_file():
            raise slurm_error(["sbatch", str(path)], f"batch script {path} does not exist")
        argv = ["sbatch", "--parsable", *[str(a) for a in extra_args], str(path)]
        out = self.run(argv, idempotent=False)
        try:
            return parse_sbatch_job_id(out)
        except SlurmParseError as exc:
            raise slurm_error(argv, str(exc)) from exc

    def cancel(self, job_id: int | str) -> None:
        """``scancel`` (tests and explicit user commands only: the supervisor never cancels a job)."""
        self.run(["scancel", str(job_id)])

    def release(self, job_id: int | str) -> bool:
        """``scontrol release``: let a held job run again (a hold after MaxBatchRequeue, or a
        user hold). True when it was held and is released; False when it was not held."""
        job = str(job_id)
        info = self.job_info(job)
        if info is None or not info.is_held:
            return False
        self.run(["scontrol", "release", job])
        return True

    @staticmethod
    def _explain_requeue_error(argv: list[str], err: SlurmError) -> SlurmError:
        stderr = getattr(err, "stderr", "") or ""
        if "presently disabled" in stderr:
            return slurm_error(
                argv,
                f"job {argv[-1]} is not requeueable (Requeue=0): submit it with --requeue, "
                "or ask the admin for JobRequeue=1",
                err.returncode,
                stderr,
            )
        return err
