"""The I/O of ``supervise diagnose``: choosing the checkpoint, running the bounded rerun, recording."""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ...errors import UsageError
from ...events import EventLog, read_events
from ...paths import RunPaths
from ...private import OWNER_ONLY, append_fd
from ...progress import StepExtractor
from .judge import Diagnosis, RerunResult, judge_rerun
from .parse import parse_sanitizer, sanitizer_refused
from .plan import (
    DEFAULT_MAX_SECONDS,
    DIAGNOSIS_EVENT,
    SANITIZER,
    SANITIZER_ARGS,
    SANITIZER_LINES,
    SANITIZER_SHARE,
    TAIL_LINES,
    TERM_GRACE,
    CheckpointCandidate,
    DiagnosisPlan,
    checkpoint_candidates,
    latest,
    pick_failure,
    plan_diagnosis,
    unused_path,
)


def choose_checkpoint(candidates: Sequence[CheckpointCandidate]) -> tuple[CheckpointCandidate | None, str]:
    """The newest candidate that exists and validates (read only: never unpickled, never moved)."""
    from ...checkpoints import validate_checkpoint
    from ...checkpoints.resume import is_usable

    rejected: list[str] = []
    for cand in candidates:
        try:
            report = validate_checkpoint(cand.path, writers_alive=True)
        except FileNotFoundError:
            rejected.append(f"{Path(cand.path).name}: gone")
            continue
        except OSError as exc:
            rejected.append(f"{Path(cand.path).name}: {exc.strerror or exc}")
            continue
        if is_usable(report):
            note = f" (skipped {'; '.join(rejected)})" if rejected else ""
            return cand, f"newest checkpoint saved before the failure that validates ({cand.source}){note}"
        rejected.append(f"{Path(cand.path).name}: {report.verdict.value} ({report.reason})")
    if candidates:
        return None, f"no usable checkpoint before the failure ({'; '.join(rejected)}): from the start"
    return None, "no checkpoint was saved before the failure: from the start"


def snapshot_dir(path: str) -> dict[str, tuple[int, int, int]]:
    """name -> (inode, size, mtime_ns) of a directory's entries (not followed into subdirectories)."""
    out: dict[str, tuple[int, int, int]] = {}
    try:
        with os.scandir(path) as it:
            for entry in it:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                out[entry.name] = (st.st_ino, st.st_size, st.st_mtime_ns)
    except OSError:
        pass
    return out


def dir_changes(before: Mapping[str, tuple[int, int, int]], after: Mapping[str, tuple[int, int, int]]) -> list[str]:
    changes = [f"new {n}" for n in sorted(set(after) - set(before))]
    changes += [f"removed {n}" for n in sorted(set(before) - set(after))]
    changes += [f"modified {n}" for n in sorted(set(before) & set(after)) if before[n] != after[n]]
    return changes


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except OSError:
            return
        try:
            proc.wait(TERM_GRACE)
            return
        except subprocess.TimeoutExpired:
            continue


def run_bounded(argv: Sequence[str], env: Mapping[str, str], cwd: str, log_path: Path, *, max_seconds: float,
                stop_at_step: int | None, step_regex: str | None = None) -> RerunResult:
    """Run ``argv`` in its own process group, output to ``log_path``; stop it (SIGTERM, then SIGKILL)
    at ``max_seconds`` or once it reports ``stop_at_step``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        proc = subprocess.Popen(list(argv), cwd=cwd, env=dict(env), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError as exc:
        return RerunResult(False, None, None, 0.0, None, None, None, "", str(log_path),
                           start_error=f"cannot start {argv[0]!r}: {exc.strerror or exc}")
    extractor = StepExtractor(step_regex)
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    sanitizer_lines: list[str] = []
    steps: list[int] = []
    stopped: list[str] = []
    lock = threading.Lock()

    def reader() -> None:
        assert proc.stdout is not None
        with open(append_fd(log_path, OWNER_ONLY), "ab") as log:  # raw output: its owner alone
            for raw in proc.stdout:
                log.write(raw)
                line = raw.decode("utf-8", "replace").rstrip("\n")
                with lock:
                    tail.append(line)
                    if line.startswith("=========") and len(sanitizer_lines) < SANITIZER_LINES:
                        sanitizer_lines.append(line)
                    step = extractor.extract(line)
                    if step is not None:
                        steps.append(step)
                        if stop_at_step is not None and step >= stop_at_step and not stopped:
                            stopped.append("steps")

    thread = threading.Thread(target=reader, daemon=True, name="diagnose-output")
    thread.start()
    deadline = started + max_seconds
    while proc.poll() is None:
        with lock:
            by_steps = bool(stopped)
        if by_steps:
            _kill_group(proc)
            break
        if time.monotonic() >= deadline:
            with lock:
                stopped.append("time")
            _kill_group(proc)
            break
        time.sleep(0.05)
    proc.wait()
    thread.join(10)
    duration = time.monotonic() - started
    code = proc.returncode
    with lock:
        lines = list(tail)
        in_tail = set(lines)
        san = [s for s in sanitizer_lines if s not in in_tail]
        first = min(steps) if steps else None
        last = max(steps) if steps else None
        stopped_by = stopped[0] if stopped else None
    output = "\n".join(san + lines)
    return RerunResult(True, code if code is not None and code >= 0 else None,
                       -code if code is not None and code < 0 else None, duration, first, last, stopped_by,
                       output, str(log_path))


def find_sanitizer(mode: str, environ: Mapping[str, str]) -> str | None:
    """``auto``: compute-sanitizer from PATH (or CUDA_HOME/bin) when installed; ``off``: none; else a path."""
    if mode == "off":
        return None
    if mode != "auto":
        return mode
    found = shutil.which(SANITIZER, path=environ.get("PATH"))
    if found:
        return found
    for home in (environ.get("CUDA_HOME"), environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and os.access(os.path.join(home, "bin", SANITIZER), os.X_OK):
            return os.path.join(home, "bin", SANITIZER)
    return None


def _read_manifest(paths: RunPaths, attempt: int) -> dict[str, Any] | None:
    for n in (attempt, attempt - 1, 1):
        try:
            data = json.loads(paths.manifest(n).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            return data
    return None


def diagnose(run_dir: Path, *, attempt: int | None = None, max_seconds: float = DEFAULT_MAX_SECONDS,
             max_steps: int | None = None, scratch: Path | None = None, sanitizer: str = "auto",
             cwd: str | None = None, environ: Mapping[str, str] | None = None, record: bool = True,
             dry_run: bool = False, env_overrides: Mapping[str, str] | None = None
             ) -> tuple[DiagnosisPlan, Diagnosis | None]:
    """Plan and run the diagnosis of ``run_dir``; append the ``diagnosis`` event unless ``record``
    is False. ``dry_run``: plan only. Raises :class:`UsageError` for what a person must fix."""
    environ = dict(os.environ if environ is None else environ)
    if max_seconds <= 0:
        raise UsageError("--max-seconds must be > 0: the rerun is always bounded")
    paths = RunPaths(Path(run_dir))
    if not paths.events.exists():
        raise UsageError(f"{run_dir} is not a run directory (no {paths.events.relative_to(run_dir)})")
    try:
        events = read_events(paths.events).events
    except OSError as exc:
        raise UsageError(f"cannot read {paths.events}: {exc.strerror or exc}") from None
    failure = pick_failure(events, attempt)
    candidate, why = choose_checkpoint(checkpoint_candidates(events, failure))
    run_start = latest(events, "run_start")
    ckpt_dir = str((run_start.get("checkpoint_dir") if run_start else "") or "")
    if scratch is None:
        scratch = unused_path(paths.supervisor_dir / f"diagnose-{failure.attempt}-{time.strftime('%Y%m%d-%H%M%S')}",
                              claim=not dry_run)
    scratch = scratch.absolute()
    if ckpt_dir and (scratch == Path(ckpt_dir) or Path(ckpt_dir) in scratch.parents):
        scratch = Path(tempfile.mkdtemp(prefix="supervise-diagnose-"))  # never inside the checkpoints
    tool = find_sanitizer(sanitizer, environ)
    plan = plan_diagnosis(events, failure, checkpoint=candidate, checkpoint_reason=why,
                          manifest=_read_manifest(paths, failure.attempt), environ=environ, scratch=str(scratch),
                          cwd=cwd, max_seconds=max_seconds, max_steps=max_steps, sanitizer=tool,
                          env_overrides=env_overrides)
    if dry_run:
        return plan, None
    (scratch / "checkpoints").mkdir(parents=True, exist_ok=True)
    before = snapshot_dir(ckpt_dir) if ckpt_dir else {}
    t0 = time.monotonic()
    first_share = max_seconds * SANITIZER_SHARE if tool else max_seconds
    result = run_bounded(plan.argv, plan.env, plan.cwd, scratch / "supervisor" / "diagnose.log",
                         max_seconds=first_share, stop_at_step=plan.stop_at_step, step_regex=plan.step_regex)
    note = None
    tools = list(plan.tools)
    ran = list(plan.argv)
    ran_env: Mapping[str, str] = plan.env
    if tool and result.started and not parse_sanitizer(result.output):
        refused = sanitizer_refused(result.output)
        if refused and result.last_step is None:
            # The sanitizer could not instrument this GPU (some virtualised ones): rerun without it.
            note = f"compute-sanitizer could not run here ({refused}); reran with CUDA_LAUNCH_BLOCKING=1 alone"
        elif result.stopped_by == "time":
            note = (f"the compute-sanitizer run reached its share of the time bound ({first_share:.0f} s) at step "
                    f"{result.last_step}; reran with CUDA_LAUNCH_BLOCKING=1 alone")
        remaining = max_seconds - (time.monotonic() - t0)
        if note is not None and remaining > 1:
            plain_argv = plan.argv[1 + len(SANITIZER_ARGS):]
            env = {k: v for k, v in plan.env.items() if k != "PYTORCH_NO_CUDA_MEMORY_CACHING"}
            result = run_bounded(plain_argv, env, plan.cwd, scratch / "supervisor" / "diagnose-plain.log",
                                 max_seconds=remaining, stop_at_step=plan.stop_at_step, step_regex=plan.step_regex)
            tools, ran, ran_env = ["CUDA_LAUNCH_BLOCKING=1"], list(plain_argv), env
    changes = dir_changes(before, snapshot_dir(ckpt_dir)) if ckpt_dir else []
    diag = judge_rerun(plan, result, sanitizer_note=note, checkpoint_dir_changes=changes, tools=tools, argv=ran,
                       env=ran_env)
    if record:
        log = EventLog(paths.events)
        try:
            log.emit(DIAGNOSIS_EVENT, **diag.to_event())
        finally:
            log.close()
    return plan, diag
