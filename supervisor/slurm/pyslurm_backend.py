"""Slurm through pyslurm's C-API binding, for sites where a pyslurm built for their release is installed.

pyslurm builds only against the Slurm release it was made for (PyPI has 25.11 only;
docs/slurm-versions.md), so this module imports it lazily and :func:`load_pyslurm_explained` says
why it cannot be used. Uses the ``pyslurm.Job`` API (22.5.2+): ``Job.load``, ``Job.requeue``,
``Job.modify(JobSubmitDescription(excluded_nodes=...))``, ``Job.cancel``, ``Job.release`` and
``RPCError``; tested against the real 22.5.x and 24.11.x bindings on real 22.05 and 24.11
controllers, field by field against the CLI backend (tests/test_pyslurm_cluster.py). Submission
goes through ``sbatch`` (pyslurm cannot take sbatch's command-line options), and the configuration
reads (grace, node state) through the CLI, via :class:`~supervisor.slurm.cli_backend.SlurmCli`.
"""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from ..errors import SlurmError
from .backend import RequeueResult
from .choice import BackendChoice
from .cli_backend import SlurmCli, slurm_error
from .grace import ClusterGrace
from .parse import JobInfo, SlurmParseError, expand_hostlist, parse_version
from .requeue_policy import ALREADY_PENDING_MESSAGE, check_requeue
from .version import SlurmVersion

_INVALID_JOB = "Invalid job id"


def load_pyslurm(importer: Callable[[str], ModuleType] = importlib.import_module) -> ModuleType | None:
    """pyslurm if it imports against this host's libslurm and has the modern Job API, else None."""
    return load_pyslurm_explained(importer)[0]


def load_pyslurm_explained(
    importer: Callable[[str], ModuleType] = importlib.import_module,
) -> tuple[ModuleType | None, str | None]:
    """(pyslurm, None) when it can be used, else (None, why not) in one line."""
    if importer is importlib.import_module:
        exits = import_exits_the_process()
        if exits is not None:
            return None, exits
    try:
        module = importer("pyslurm")
    except Exception as exc:  # noqa: BLE001 (ImportError, or a libslurm symbol/version mismatch raised at import)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return None, f"import pyslurm failed ({type(exc).__name__}: {first[:200]})"
    if not all(hasattr(module, name) for name in ("Job", "JobSubmitDescription", "RPCError")):
        return None, "this pyslurm predates 22.5.2 (no pyslurm.Job API)"
    return module, None


def import_exits_the_process(timeout: float = 30.0) -> str | None:
    """Why importing pyslurm here would end this process, or None. libslurm reads slurm.conf when
    pyslurm is imported and, when it finds none (no SLURM_CONF, no /etc/slurm, no configless
    source), exits the whole process: seen with the real 22.05 build. So the first import is tried
    in a child process; pyslurm not installed (nothing to try) or already imported costs nothing."""
    if "pyslurm" in sys.modules:
        return None
    try:
        if importlib.util.find_spec("pyslurm") is None:
            return None
    except (ImportError, ValueError):
        return None
    try:
        proc = subprocess.run([sys.executable, "-c", "import pyslurm"], capture_output=True, text=True,
                              timeout=timeout, check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"a trial import of pyslurm did not finish ({exc})"
    if proc.returncode == 0:
        return None
    said = [line for line in proc.stderr.splitlines() if line.strip()]
    last = said[-1][:200] if said else "no message"
    return f"importing pyslurm ends the process here (exit {proc.returncode}: {last})"


def built_for(module: ModuleType) -> SlurmVersion | None:
    """The Slurm release pyslurm was compiled against: ``slurm_api_version()`` (the headers' version,
    e.g. (22, 5, 8)), else the major.minor of pyslurm's own version (22.5.3 -> 22.05)."""
    api = getattr(module, "slurm_api_version", None)
    try:
        if callable(api):
            return SlurmVersion.of(tuple(int(v) for v in api()))
    except Exception:  # noqa: BLE001 (a binding that cannot say: fall back to its package version)
        pass
    text = str(getattr(module, "__version__", "") or "")
    try:
        major, minor = SlurmVersion.parse(text)[:2]
    except ValueError:
        return None
    return SlurmVersion(major, minor, 0)


def controller_version_text(module: ModuleType) -> str:
    """The controller's SLURM_VERSION, asked over pyslurm's RPC (its configuration): the 24.11+ API
    ``slurmctld.Config.load().version``, else the older ``config().get()["version"]``."""
    slurmctld = getattr(module, "slurmctld", None)
    config_class = getattr(slurmctld, "Config", None)
    if config_class is not None and hasattr(config_class, "load"):
        version = getattr(config_class.load(), "version", None)  # 22.5.x has the class, not the field
        if version:
            return str(version)
    return str(module.config().get()["version"])


class PyslurmBackend:
    """The same interface as :class:`SlurmCli`, through pyslurm."""

    name = "pyslurm"
    choice: BackendChoice | None = None  # why get_backend picked this backend (run_start records it)

    def __init__(self, module: ModuleType, cli: SlurmCli | None = None) -> None:
        self._pyslurm = module
        self._cli = cli or SlurmCli()
        self._version: SlurmVersion | None = None

    def version(self) -> SlurmVersion:
        """The controller's Slurm version (asked once), e.g. SlurmVersion(22, 5, 8). Not pyslurm's own
        package version: 22.5.3 is the binding's release on the 22.05 branch, not Slurm's patch level."""
        if self._version is None:
            argv = ["pyslurm.config", "version"]
            try:
                text = self._call(argv, controller_version_text, self._pyslurm)
            except SlurmError:
                raise
            except Exception as exc:  # the older API raises ValueError with slurm_strerror's words
                raise slurm_error(argv, str(exc) or type(exc).__name__) from exc
            try:
                self._version = parse_version(text)
            except SlurmParseError as exc:
                raise slurm_error(argv, str(exc)) from exc
        return self._version

    def built_for(self) -> SlurmVersion | None:
        """The Slurm release this pyslurm was compiled against (see :func:`built_for`)."""
        return built_for(self._pyslurm)

    def node_state(self, node: str) -> str | None:
        return self._cli.node_state(node)  # used to check an exclude list's nodes: rare, the CLI is enough

    def job_info(self, job_id: int | str) -> JobInfo | None:
        argv = ["pyslurm.Job.load", str(job_id)]
        try:
            job = self._call(argv, self._pyslurm.Job.load, int(job_id))
        except SlurmError as err:
            if _INVALID_JOB in str(err):
                return None
            raise
        return job_info_from_pyslurm(job)

    def preemption_grace(self, info: JobInfo) -> ClusterGrace | None:
        return self._cli.preemption_grace(info)  # configuration, read once: the CLI is enough

    def queue_state(self, job_id: int | str) -> str | None:
        info = self.job_info(job_id)
        return None if info is None else info.state

    def requeue(
        self, job_id: int | str, expected_restarts: int | None = None, exclude: Sequence[str] = ()
    ) -> RequeueResult:
        job = str(job_id)
        check = check_requeue(self.job_info(job), expected_restarts)
        if not check.call_requeue and not check.already_requeued:
            return RequeueResult(job, requeued=False, already=False, reason=check.reason)
        requeued, reason = False, check.reason
        if check.call_requeue:
            try:
                self._call(["pyslurm.Job.requeue", job], self._pyslurm.Job(int(job)).requeue)
                requeued, reason = True, f"requeued ({check.reason})"
            except SlurmError as err:
                after = check_requeue(self.job_info(job), expected_restarts)
                if not (after.already_requeued or ALREADY_PENDING_MESSAGE in str(err)):
                    raise SlurmCli._explain_requeue_error(["pyslurm.Job.requeue", job], err) from err
                reason = f"already requeued (slurmctld: {err})"
        if exclude:
            try:
                excluded = self.update_exclude(job, exclude)
                return RequeueResult(job, requeued, not requeued, reason, excluded=excluded)
            except SlurmError as err:
                return RequeueResult(job, requeued, not requeued, reason, exclude_error=str(err))
        return RequeueResult(job, requeued, not requeued, reason)

    def update_exclude(self, job_id: int | str, nodes: Sequence[str]) -> tuple[str, ...]:
        job = str(job_id)
        info = self.job_info(job)
        if info is None:
            raise slurm_error(["pyslurm.Job.load", job], f"job {job} no longer exists; cannot exclude nodes")
        merged = tuple(dict.fromkeys([*info.exc_node_names, *nodes]))
        changes = self._pyslurm.JobSubmitDescription(excluded_nodes=list(merged))
        self._call(["pyslurm.Job.modify", job, f"excluded_nodes={','.join(merged)}"],
                   self._pyslurm.Job(int(job)).modify, changes)
        return merged

    def submit(self, script_path: str, extra_args: Sequence[str] = ()) -> int:
        return self._cli.submit(script_path, extra_args)

    def cancel(self, job_id: int | str) -> None:
        self._call(["pyslurm.Job.cancel", str(job_id)], self._pyslurm.Job(int(job_id)).cancel)

    def release(self, job_id: int | str) -> bool:
        info = self.job_info(job_id)
        if info is None or not info.is_held:
            return False
        self._call(["pyslurm.Job.release", str(job_id)], self._pyslurm.Job(int(job_id)).release)
        return True

    def _call(self, argv: list[str], func: Callable[..., Any], *args: Any) -> Any:
        """Run one pyslurm call; its RPCError becomes a SlurmError with the same words as the CLI's."""
        try:
            return func(*args)
        except self._pyslurm.RPCError as exc:
            message = str(getattr(exc, "msg", "") or exc)
            raise slurm_error(argv, message, getattr(exc, "errno", None), message) from exc


def job_info_from_pyslurm(job: Any, now: float | None = None) -> JobInfo:
    """Map a ``pyslurm.Job`` onto :class:`JobInfo` (pyslurm gives epoch ints and a time limit in minutes),
    as ``scontrol show job`` shows it: a job without a time limit whose end lies ahead has no known
    end (scontrol prints ``EndTime=Unknown``; pyslurm passes on the controller's placeholder, e.g.
    a pending requeued job's end in the year 2163)."""

    def get(name: str, default: Any = None) -> Any:
        value = getattr(job, name, default)
        return default if value is None else value

    def epoch(name: str) -> float | None:
        value = get(name)
        return float(value) if value else None

    def text(name: str) -> str | None:
        value = get(name)
        return str(value) if value not in (None, "", "None", "(null)") else None

    limit = get("time_limit")
    nodes = text("allocated_nodes")
    end_time = epoch("end_time")
    if limit is None and end_time is not None and end_time > (time.time() if now is None else now):
        end_time = None
    return JobInfo(
        job_id=int(get("id")),
        state=str(get("state", "UNKNOWN")),
        reason=text("state_reason"),
        name=text("name"),
        partition=text("partition"),
        qos=text("qos"),
        restarts=int(get("requeue_count", 0)),
        requeue=bool(get("is_requeueable", False)),
        batch_flag=int(bool(get("is_batch_job", False))),
        exit_code=get("exit_code"),
        exit_signal=get("exit_code_signal"),
        submit_time=epoch("submit_time"),
        eligible_time=epoch("eligible_time"),
        start_time=epoch("start_time"),
        end_time=end_time,
        preempt_time=epoch("preempt_time"),
        time_limit=int(limit) * 60 if isinstance(limit, (int, float)) else None,
        run_time=get("run_time"),
        nodes=nodes,
        req_nodes=text("required_nodes"),
        exc_nodes=text("excluded_nodes"),
        num_nodes=get("num_nodes") or (len(expand_hostlist(nodes)) if nodes else None),
        batch_host=text("batch_host"),
        std_out=text("standard_output"),
        std_err=text("standard_error"),
        work_dir=text("working_directory"),
        array_job_id=get("array_id"),
        array_task_id=get("array_task_id"),
        priority=get("priority"),
    )
