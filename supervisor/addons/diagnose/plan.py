"""Reading the run and planning the rerun (pure): which failure, from which checkpoint, with
which command, environment and bounds."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from ...config import SupervisorConfig
from ...errors import UsageError
from ...events import Event
from ...failures.classes import classes_where
from ...paths import RunPaths
from ...redact import REDACTED
from ...run.layout import RunLayout, child_plan
from .environment import DROPPED_ENV, RerunEnvironment, rerun_environment


DIAGNOSIS_EVENT = "diagnosis"
DIAGNOSABLE = tuple(sorted(classes_where(diagnosable=True)))  # supervisor/failures/classes.py
DEFAULT_MAX_SECONDS = 900.0  # a sanitizer slows a training 10-100x: bounded, never unbounded
MIN_EXTRA_STEPS = 20  # steps past the failure step the rerun may go before it counts as not reproduced
TERM_GRACE = 5.0  # seconds between SIGTERM and SIGKILL when a bound is reached
TAIL_LINES = 20000  # output lines kept in memory for parsing (the whole output is in the log file)
SANITIZER_LINES = 2000  # sanitizer record lines kept besides the tail
SANITIZER = "compute-sanitizer"
SANITIZER_ARGS = ("--tool", "memcheck", "--print-limit", "20")
SANITIZER_SHARE = 2 / 3  # of --max-seconds for the sanitizer run; the rest for a plain rerun if it is too slow


EXIT_LOCATED = 0
EXIT_NOT_LOCATED = 1


class DiagnosisOutcome(str, Enum):
    """How the rerun ended, against the failure it was meant to reproduce."""

    REPRODUCED = "reproduced"  # it failed again with a GPU failure
    FAILED_OTHERWISE = "failed_otherwise"  # it failed, but not with a GPU failure
    NOT_REPRODUCED = "not_reproduced"  # it ran past the failure step (or finished) without failing
    BOUND_REACHED = "bound_reached"  # stopped at the time bound before reaching the failure step
    COULD_NOT_RUN = "could_not_run"  # the command did not start


# ---------------------------------------------------------------------------------------------
# Reading the run (pure)


@dataclass(frozen=True)
class FailureToDiagnose:
    attempt: int
    cls: str
    step: int | None  # the last step reported before the failure
    ts: float
    evidence: tuple[str, ...]
    node: str | None


@dataclass(frozen=True)
class CheckpointCandidate:
    path: str
    step: int | None
    source: str  # save_end | resume_point


def pick_failure(events: Sequence[Event], attempt: int | None = None) -> FailureToDiagnose:
    """The failure to rerun: that of ``attempt``, else the first of a GPU class. Raises
    :class:`UsageError` naming what the log holds when there is none."""
    failures = [e for e in events if e.event == "failure" and isinstance(e.get("attempt"), int)]
    if attempt is not None:
        chosen = [e for e in failures if e.get("attempt") == attempt]
        if not chosen:
            have = ", ".join(f"attempt {e.get('attempt')}: {e.get('class')}" for e in failures) or "none"
            raise UsageError(f"no failure of attempt {attempt} in the event log (failures: {have})")
    else:
        chosen = [e for e in failures if e.get("class") in {c.value for c in DIAGNOSABLE}]
        if not chosen:
            have = ", ".join(f"attempt {e.get('attempt')}: {e.get('class')}" for e in failures) or "none"
            raise UsageError("no illegal memory access, device-side assert or launch failure in the event log "
                             f"(failures: {have}); pass --attempt N to rerun another failure")
    first = chosen[0]
    step = first.get("step")
    return FailureToDiagnose(attempt=int(first.get("attempt")), cls=str(first.get("class")),
                             step=step if isinstance(step, int) else None, ts=first.ts,
                             evidence=tuple(str(x) for x in first.get("evidence") or () if isinstance(x, str)),
                             node=first.get("node") if isinstance(first.get("node"), str) else None)


def checkpoint_candidates(events: Sequence[Event], failure: FailureToDiagnose) -> list[CheckpointCandidate]:
    """Checkpoints known to have landed before the failure, newest step first: successful saves
    recorded before it (at or below its step when that is known) and the failed attempt's own
    resume point. Each path once. A save the failed attempt finished just before it died may be
    recorded only by the rescan after its exit, after the failure event: it counts when its step is
    known and at or below the failure's."""
    found: dict[str, CheckpointCandidate] = {}
    for e in events:
        path, step = e.get("path"), e.get("step")
        if not isinstance(path, str) or not path:
            continue
        step = step if isinstance(step, int) else None
        if e.ts > failure.ts:
            rescanned = (e.event == "save_end" and e.get("ok") is True and e.get("attempt") == failure.attempt
                         and step is not None and failure.step is not None and step <= failure.step)
            if rescanned:
                found[path] = CheckpointCandidate(path, step, "save_end")
            continue
        if e.event == "save_end" and e.get("ok") is True:
            if failure.step is not None and step is not None and step > failure.step:
                continue
            found[path] = CheckpointCandidate(path, step, "save_end")
        elif e.event == "resume_point" and e.get("attempt") == failure.attempt:
            found.setdefault(path, CheckpointCandidate(path, step, "resume_point"))
    return sorted(found.values(), key=lambda c: (c.step is not None, c.step or 0), reverse=True)


def latest(events: Sequence[Event], name: str, **match: Any) -> Event | None:
    for e in reversed(events):
        if e.event == name and all(e.get(k) == v for k, v in match.items()):
            return e
    return None


def unused_path(path: Path, *, claim: bool = False) -> Path:
    """``path``, or ``path-2``, ``path-3``...: two diagnoses started in the same second never share
    a scratch directory (the second would read the first's checkpoints and log). ``claim`` creates
    it (mkdir is atomic: of two diagnoses racing for a name, one gets the next)."""
    candidate, n = path, 2
    while True:
        if claim:
            try:
                candidate.mkdir(parents=True)
                return candidate
            except FileExistsError:
                pass
        elif not candidate.exists():
            return candidate
        candidate, n = path.with_name(f"{path.name}-{n}"), n + 1


def redirect_checkpoint_args(argv: Sequence[str], ckpt_dir: str, scratch_ckpt: str,
                             keep: Iterable[str] = (), cwd: str = "/") -> tuple[list[str], list[str]]:
    """argv with every argument that names the run's checkpoint directory (``DIR``, ``--opt=DIR``,
    or a path inside it that the rerun might write; relative ones from ``cwd``) pointed at the
    scratch one instead; the paths in ``keep`` (the checkpoint to resume from: read, never written)
    stay. Returns (argv, what changed)."""
    root = os.path.normpath(os.path.join(cwd, ckpt_dir))
    kept = {os.path.normpath(os.path.join(cwd, k)) for k in keep}
    out: list[str] = []
    changed: list[str] = []

    def redirect(value: str) -> str | None:
        norm = os.path.normpath(os.path.join(cwd, value)) if value else value
        if not value or norm in kept:
            return None
        if norm == root:
            return scratch_ckpt
        if norm.startswith(root + os.sep):
            return os.path.join(scratch_ckpt, os.path.relpath(norm, root))
        return None

    for arg in argv:
        prefix, value = "", arg
        if arg.startswith("-") and "=" in arg:
            prefix, _, value = arg.partition("=")
            prefix += "="
        new = redirect(value)
        if new is None:
            out.append(arg)
        else:
            out.append(prefix + new)
            changed.append(f"{arg} -> {prefix + new}")
    return out, changed


@dataclass(frozen=True)
class DiagnosisPlan:
    """Everything the rerun needs, decided before anything runs."""

    failure: FailureToDiagnose
    checkpoint: str | None  # None: no checkpoint before the failure, the rerun starts fresh
    checkpoint_step: int | None
    checkpoint_reason: str
    argv: tuple[str, ...]  # what runs, the sanitizer prefix included
    command: tuple[str, ...]  # the training command alone
    env: dict[str, str] = field(repr=False)
    cwd: str
    scratch: str
    ckpt_dir: str  # the run's checkpoint directory (never written)
    max_seconds: float
    stop_at_step: int | None  # the rerun is stopped once it reports this step
    sanitizer: str | None  # the compute-sanitizer executable, None when not used
    tools: tuple[str, ...]
    redirected: tuple[str, ...]
    step_regex: str | None
    environment: RerunEnvironment | None = None  # where env came from (None: built by hand, as in tests)
    redacted_args: tuple[str, ...] = ()  # arguments whose value the record holds only as [REDACTED]


def plan_diagnosis(events: Sequence[Event], failure: FailureToDiagnose, *, checkpoint: CheckpointCandidate | None,
                   checkpoint_reason: str, manifest: Mapping[str, Any] | None, environ: Mapping[str, str],
                   scratch: str, cwd: str | None, max_seconds: float, max_steps: int | None,
                   sanitizer: str | None, env_overrides: Mapping[str, str] | None = None) -> DiagnosisPlan:
    """The rerun of ``failure`` from ``checkpoint``: command, environment (the attempt's recorded
    one, see :mod:`.environment`; ``env_overrides`` on top), bounds (pure)."""
    run_start = latest(events, "run_start")
    if run_start is None or not isinstance(run_start.get("argv"), list) or not run_start.get("argv"):
        raise UsageError("the event log has no run_start with the command; cannot rerun the training")
    command = [str(a) for a in run_start.get("argv")]
    ckpt_dir = str(run_start.get("checkpoint_dir") or "")
    config = (manifest or {}).get("config") if isinstance((manifest or {}).get("config"), Mapping) else {}
    assert isinstance(config, Mapping)
    resume_arg = config.get("resume_arg") if isinstance(config.get("resume_arg"), str) else None
    step_regex = config.get("step_regex") if isinstance(config.get("step_regex"), str) else None
    scratch_paths = RunPaths(Path(scratch))
    scratch_ckpt = str(Path(scratch) / "checkpoints")
    layout = RunLayout(name="diagnose", paths=scratch_paths, ckpt_dir=Path(scratch_ckpt))
    resume_path = checkpoint.path if checkpoint else None
    resume_step = checkpoint.step if checkpoint else None
    manifest_cwd = (manifest or {}).get("cwd")
    run_cwd = cwd or (manifest_cwd if isinstance(manifest_cwd, str) else os.getcwd())
    redirected: list[str] = []
    if ckpt_dir:
        command, redirected = redirect_checkpoint_args(command, ckpt_dir, scratch_ckpt,
                                                       keep=[resume_path] if resume_path else [], cwd=run_cwd)
    env_items = config.get("resume_env")
    resume_env = tuple(str(x) for x in env_items) if isinstance(env_items, (list, tuple)) else ()
    renv = rerun_environment(manifest, environ, env_overrides)
    plan = child_plan(SupervisorConfig(resume_arg=resume_arg, resume_env=resume_env), command, renv.env, layout,
                      attempt=failure.attempt,
                      resume_path=resume_path, resume_step=resume_step, control_address="", control_key="")
    env = {k: v for k, v in plan.env.items() if k not in DROPPED_ENV}
    env["CUDA_LAUNCH_BLOCKING"] = "1"
    tools = ["CUDA_LAUNCH_BLOCKING=1"]
    argv = list(plan.argv)
    if sanitizer:
        # Without the caching allocator every tensor is its own allocation, so memcheck also sees an
        # access that runs past a tensor into memory the allocator had cached.
        env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
        argv = [sanitizer, *SANITIZER_ARGS, *argv]
        tools.append("compute-sanitizer --tool memcheck")
    start = resume_step if resume_step is not None else 0
    stop_at: int | None = None
    if max_steps is not None:
        stop_at = start + max_steps
    elif failure.step is not None:
        to_failure = max(failure.step - start, 0)
        stop_at = start + to_failure + max(MIN_EXTRA_STEPS, to_failure)
    return DiagnosisPlan(
        failure=failure, checkpoint=resume_path, checkpoint_step=resume_step, checkpoint_reason=checkpoint_reason,
        argv=tuple(argv), command=tuple(plan.argv), env=env,
        cwd=run_cwd, scratch=scratch,
        ckpt_dir=ckpt_dir, max_seconds=max_seconds, stop_at_step=stop_at, sanitizer=sanitizer, tools=tuple(tools),
        redirected=tuple(redirected), step_regex=step_regex, environment=renv,
        redacted_args=tuple(a if a != REDACTED or i == 0 else command[i - 1]
                            for i, a in enumerate(command) if REDACTED in a))
