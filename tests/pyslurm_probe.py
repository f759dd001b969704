"""Ask the same questions of both Slurm backends, from inside a test cluster's environment.

pyslurm must run where its libslurm is: on the host for 22.05, inside the Debian root for 24.11
(tests/vendor/pyslurm/README.md). So the tests do not import it; they run this script through the
cluster's install prefix with the built pyslurm on PYTHONPATH (tests/pyslurm_cluster.py) and read
one JSON answer per operation on stdout:

    python tests/pyslurm_probe.py '[["info", 12], ["requeue", "pyslurm", 12, 0, ["n1"]]]'

Operations: ``info JOB`` / ``grace JOB`` / ``stop_cause JOB SIGNAL`` / ``version`` (both backends
each), ``choice`` (what ``auto`` picks and why), ``requeue BACKEND JOB EXPECTED EXCLUDE``,
``update_exclude BACKEND JOB NODES``, ``cancel BACKEND JOB``, ``release BACKEND JOB``,
``submit BACKEND SCRIPT ARGS``, ``time_info BACKEND JOB N`` (N timed reads, in seconds),
``time_requeue BACKEND JOBS N`` (N timed requeues, each of whichever of JOBS is running then).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from typing import Any

from supervisor.errors import SlurmError
from supervisor.slurm import get_backend, stop_cause
from supervisor.slurm.parse import JobInfo

BACKENDS = ("cli", "pyslurm")


def info_fields(info: JobInfo | None) -> dict[str, Any] | None:
    """Every JobInfo field but ``raw`` (scontrol's text only), and the properties the supervisor reads."""
    if info is None:
        return None
    fields = {f.name: getattr(info, f.name) for f in dataclasses.fields(info) if f.name != "raw"}
    fields["state_flags"] = list(info.state_flags)
    for name in ("node_names", "exc_node_names", "in_grace", "grace_deadline", "is_held", "is_pending",
                 "is_running", "is_finished", "is_cancelled", "held_for_max_requeue"):
        value = getattr(info, name, None)
        fields[name] = list(value) if isinstance(value, tuple) else value
    return fields


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: _jsonable(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "value") and hasattr(value, "name"):  # an Enum
        return value.name
    return value


def run_op(backends: dict[str, Any], op: list[Any]) -> Any:
    kind, args = op[0], op[1:]
    if kind == "info":
        return {name: info_fields(b.job_info(args[0])) for name, b in backends.items()}
    if kind == "grace":
        return {name: _jsonable(b.preemption_grace(b.job_info(args[0]))) for name, b in backends.items()}
    if kind == "version":
        return {name: list(b.version()) for name, b in backends.items()}
    if kind == "choice":
        chosen = get_backend("auto")
        return {"name": chosen.name, "reason": chosen.choice.reason}
    if kind == "stop_cause":
        now = time.time()
        out = {}
        for name, b in backends.items():
            verdict = stop_cause(b.job_info(args[0]), now, args[1], version=b.version())
            out[name] = {"cause": verdict.cause.name, "reason": verdict.reason}
        return out
    backend = backends[args[0]]
    if kind == "requeue":
        return _jsonable(backend.requeue(args[1], expected_restarts=args[2], exclude=args[3]))
    if kind == "update_exclude":
        return list(backend.update_exclude(args[1], args[2]))
    if kind == "cancel":
        return backend.cancel(args[1])
    if kind == "release":
        return backend.release(args[1])
    if kind == "submit":
        return backend.submit(args[1], args[2])
    if kind == "time_info":
        return [_timed(backend.job_info, args[1]) for _ in range(int(args[2]))]
    if kind == "time_requeue":
        return _time_requeues(backend, args[1], int(args[2]))
    raise SystemExit(f"pyslurm_probe: unknown operation {kind!r}")


def _timed(func: Any, *args: Any) -> float:
    started = time.perf_counter()
    func(*args)
    return time.perf_counter() - started


def _time_requeues(backend: Any, jobs: list[int], count: int, timeout: float = 600.0) -> dict[str, list]:
    """Requeue whichever of ``jobs`` runs, until ``count`` requeues were timed (the whole
    ``requeue()``: its job-record read, the request and the check, as the supervisor calls it).
    A job seen running whose requeue Slurm answers "already pending" (it was between two states)
    is not timed; its reason is returned beside the times."""
    seconds: list[float] = []
    skipped: list[str] = []
    deadline = time.monotonic() + timeout
    while len(seconds) < count and time.monotonic() < deadline:
        for job in jobs:
            info = backend.job_info(job)
            if info is not None and info.is_running and len(seconds) < count:
                started = time.perf_counter()
                result = backend.requeue(job, expected_restarts=info.restarts)
                took = time.perf_counter() - started
                if result.requeued:
                    seconds.append(took)
                else:
                    skipped.append(result.reason)
        time.sleep(0.2)
    return {"seconds": seconds, "not_requeued": skipped}


def main(argv: list[str]) -> int:
    ops = json.loads(argv[1])
    backends = {name: get_backend(name) for name in BACKENDS}
    for op in ops:
        try:
            answer: Any = {"ok": run_op(backends, op)}
        except SlurmError as err:
            answer = {"error": str(err)}
        print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
