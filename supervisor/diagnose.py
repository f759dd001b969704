"""``supervise diagnose RUN_DIR``: find where a GPU failure really happened.

A CUDA error surfaces at whatever call happens to synchronise next, so the traceback of an illegal
memory access or a device-side assert usually points at an innocent line. Rerunning the training
with ``CUDA_LAUNCH_BLOCKING=1`` makes every kernel launch synchronous, so the error is raised by the
launch that caused it; under ``compute-sanitizer --tool memcheck`` (when it is on PATH) the
sanitizer also names the kernel and the kind of access ("Invalid __global__ write of size 4 bytes").

What it does, in order:

1. reads the run's event log: the first failure of a GPU class (``illegal_memory_access``,
   ``device_assert``, ``cuda_launch_failure``) or the attempt asked for, the checkpoints saved
   before it (``save_end``, ``resume_point``), the command (``run_start.argv``), the resume argument
   and environment recorded in the attempt's manifest;
2. chooses the newest checkpoint saved before the failure that still validates (read only, never
   unpickled, never moved);
3. reruns the command from it in a scratch run directory: the child's checkpoint directory
   (``SUPERVISOR_CHECKPOINT_DIR`` and any argument naming the run's checkpoint directory) points
   into the scratch directory, no control channel, bounded in steps and in seconds; the run's
   checkpoint directory is listed before and after, and any change is reported;
4. parses the output: the sanitizer's error records (access, kernel, source line), kernel
   assertion messages, and the Python traceback's last frame in the user's code;
5. appends a ``diagnosis`` event to the run's event log and prints it.

The parsing and the planning are pure functions (text and events in, frozen dataclasses out); only
:func:`run_bounded` and :func:`diagnose` do I/O.
"""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from .config import SupervisorConfig
from .errors import UsageError
from .events import Event, EventLog, read_events
from .paths import RunPaths
from .progress import StepExtractor
from .run.layout import RunLayout, child_plan
from .states import FailureClass

DIAGNOSIS_EVENT = "diagnosis"
DIAGNOSABLE = (FailureClass.ILLEGAL_MEMORY_ACCESS, FailureClass.DEVICE_ASSERT, FailureClass.CUDA_LAUNCH_FAILURE)
DEFAULT_MAX_SECONDS = 900.0  # a sanitizer slows a training 10-100x: bounded, never unbounded
MIN_EXTRA_STEPS = 20  # steps past the failure step the rerun may go before it counts as not reproduced
TERM_GRACE = 5.0  # seconds between SIGTERM and SIGKILL when a bound is reached
TAIL_LINES = 20000  # output lines kept in memory for parsing (the whole output is in the log file)
SANITIZER_LINES = 2000  # sanitizer record lines kept besides the tail
SANITIZER = "compute-sanitizer"
SANITIZER_ARGS = ("--tool", "memcheck", "--print-limit", "20")
SANITIZER_SHARE = 2 / 3  # of --max-seconds for the sanitizer run; the rest for a plain rerun if it is too slow

# Variables the rerun must not inherit: the control channel of a live run, its process marker.
_DROPPED_ENV = ("SUPERVISOR_CONTROL", "SUPERVISOR_KEY", "SUPERVISOR_TOKEN", "SUPERVISOR_PROCESS_TREE",
                "SUPERVISOR_CONTROL_HOST")

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
    resume point. Each path once."""
    found: dict[str, CheckpointCandidate] = {}
    for e in events:
        if e.ts > failure.ts:
            break
        path, step = e.get("path"), e.get("step")
        if not isinstance(path, str) or not path:
            continue
        step = step if isinstance(step, int) else None
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


def plan_diagnosis(events: Sequence[Event], failure: FailureToDiagnose, *, checkpoint: CheckpointCandidate | None,
                   checkpoint_reason: str, manifest: Mapping[str, Any] | None, environ: Mapping[str, str],
                   scratch: str, cwd: str | None, max_seconds: float, max_steps: int | None,
                   sanitizer: str | None) -> DiagnosisPlan:
    """The rerun of ``failure`` from ``checkpoint``: command, environment, bounds (pure)."""
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
    plan = child_plan(SupervisorConfig(resume_arg=resume_arg, resume_env=resume_env), command, environ, layout,
                      attempt=failure.attempt,
                      resume_path=resume_path, resume_step=resume_step, control_address="", control_key="")
    env = {k: v for k, v in plan.env.items() if k not in _DROPPED_ENV}
    determinism = (manifest or {}).get("determinism")
    if isinstance(determinism, Mapping):  # what the failed attempt ran with (CUDA_VISIBLE_DEVICES, NCCL_*...)
        env.update({str(k): str(v) for k, v in determinism.items() if isinstance(v, str)})
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
        redirected=tuple(redirected), step_regex=step_regex)


# ---------------------------------------------------------------------------------------------
# Reading the output (pure)

_SAN_PREFIX = re.compile(r"^=========(?:\s|$)")
_SAN_ERROR = re.compile(
    r"^=+\s+((?:Invalid|Misaligned|Out-of-range|Address|Hardware Exception|Illegal|Warp|Lane|Barrier|"
    r"Device-side|Cuda API|Malloc|Free|Uninitialized)\b.*)$")
_SAN_AT = re.compile(r"^=+\s+at\s+(.+?)\s*$")
_SAN_HIT = re.compile(r"^=+\s+(Program hit .+?)\s*$")
_SAN_SUMMARY = re.compile(r"^=+\s+ERROR SUMMARY:\s*(\d+) errors?")
_SAN_HOST_PY = re.compile(r"^=+\s+Host Frame:\s*(?P<func>\S+)\s+in\s+(?P<where>\S+\.py:\d+)\s*$")
_SAN_DETAIL = re.compile(r"^=+\s+((?:by thread|Address|and is|is misaligned|Access (?:at|to)).+?)\s*$")
_SAN_REFUSED = re.compile(r"Device not supported|not supported on this (?:device|platform)|"
                          r"unrecognised option|unrecognized option|Unable to|Could not (?:start|find)|"
                          r"Error: .*(?:initialize|initialise)",
                          re.IGNORECASE)
_HEX_OFFSET = re.compile(r"\+0x[0-9a-fA-F]+$")
_SOURCE = re.compile(r"^(\S+?\.(?:cu|cuh|cpp|cc|h|hpp|py|ptx)):(\d+)")
_KERNEL_ASSERT = re.compile(
    r"(?P<source>\S+\.cuh?):(?P<line>\d+):\s*(?P<func>[^:]*?):?\s*block:\s*\[[\d,\s]+\],\s*thread:\s*"
    r"\[[\d,\s]+\]\s*Assertion\s*[`'](?P<assertion>.*?)[`']\s*failed")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+?)\s*$')
_LIBRARY = re.compile(r"site-packages|dist-packages|^<frozen |/lib/python\d[\d.]*/(?!site-packages)|^<string>$")
_GPUISH = re.compile(r"CUDA|cuda|illegal memory|assert|Triton Error|driver status|cudaError|CUBLAS|CUDNN|NCCL")


@dataclass(frozen=True)
class SanitizerFinding:
    """One memcheck error record."""

    error: str  # "Invalid __global__ write of size 4 bytes"
    kernel: str | None  # the function the access was in
    source: str | None  # file:line when the kernel was built with line info
    details: tuple[str, ...]  # thread/block, address, how far from the nearest allocation
    launch_frames: tuple[str, ...] = ()  # Python frames of the host backtrace at launch, innermost first

    @property
    def launch_site(self) -> str | None:
        """The Python line that launched the kernel (``_ptx_store in train_plain.py:112``)."""
        return self.launch_frames[0] if self.launch_frames else None


@dataclass(frozen=True)
class KernelAssert:
    """A device-side assertion message (``IndexKernel.cu:92: ... Assertion `...` failed.``)."""

    source: str
    function: str
    assertion: str


@dataclass(frozen=True)
class PythonFrame:
    file: str
    line: int
    function: str
    code: str | None


@dataclass(frozen=True)
class TracebackFinding:
    """A Python traceback: its exception line and the frames in the user's code (innermost last)."""

    error: str
    frames: tuple[PythonFrame, ...]

    @property
    def user_frame(self) -> PythonFrame | None:
        return self.frames[-1] if self.frames else None


def _kernel_and_source(where: str) -> tuple[str | None, str | None]:
    """``oob_store+0x10``, ``0x170 in oob_store``, ``kern(float*)+0x1a0 in /src/k.cu:12`` ->
    (kernel, source)."""
    where = where.strip()
    old = re.match(r"^0x[0-9a-fA-F]+\s+in\s+(.+)$", where)
    if old:  # older format: "at 0x170 in file.cu:12:kernel(args)" or "at 0x170 in kernel"
        rest = old.group(1)
        src = _SOURCE.match(rest)
        if src:
            tail = rest[src.end():].lstrip(":")
            return (tail or None), f"{src.group(1)}:{src.group(2)}"
        return rest, None
    source = None
    head, sep, tail = where.rpartition(" in ")
    if sep and _SOURCE.match(tail):
        src = _SOURCE.match(tail)
        assert src is not None
        source, where = f"{src.group(1)}:{src.group(2)}", head
    return _HEX_OFFSET.sub("", where.strip()) or None, source


def parse_sanitizer(text: str) -> list[SanitizerFinding]:
    """The error records of compute-sanitizer's memcheck output, in order."""
    findings: list[SanitizerFinding] = []
    current: dict[str, Any] | None = None

    def close() -> None:
        nonlocal current
        if current is not None:
            findings.append(SanitizerFinding(current["error"], current["kernel"], current["source"],
                                             tuple(current["details"]), tuple(current["frames"])))
        current = None

    for raw in text.splitlines():
        line = raw.rstrip()
        if not _SAN_PREFIX.match(line):
            continue
        error = _SAN_ERROR.match(line)
        if error:
            close()
            current = {"error": error.group(1).strip(), "kernel": None, "source": None, "details": [], "frames": []}
            continue
        if current is None:
            continue
        at = _SAN_AT.match(line)
        if at and current["kernel"] is None:
            current["kernel"], current["source"] = _kernel_and_source(at.group(1))
            continue
        host = _SAN_HOST_PY.match(line)
        if host:
            if len(current["frames"]) < 6:
                current["frames"].append(f"{host.group('func')} in {host.group('where')}")
            continue
        detail = _SAN_DETAIL.match(line)
        if detail and len(current["details"]) < 6:
            current["details"].append(detail.group(1))
            continue
        if _SAN_HIT.match(line) or _SAN_SUMMARY.match(line):
            close()
    close()
    return findings


def sanitizer_api_errors(text: str) -> list[str]:
    """``Program hit cudaErrorIllegalAddress ... on CUDA API call to cudaStreamSynchronize`` lines."""
    return [m.group(1) for m in map(_SAN_HIT.match, text.splitlines()) if m][:10]


def sanitizer_refused(text: str) -> str | None:
    """The sanitizer's own complaint when it could not instrument the program (no error record)."""
    for line in text.splitlines():
        if _SAN_PREFIX.match(line) and _SAN_REFUSED.search(line):
            return line.lstrip("= ").strip()[:300]
    return None


def parse_kernel_asserts(text: str) -> list[KernelAssert]:
    found: list[KernelAssert] = []
    seen: set[tuple[str, str]] = set()
    for match in _KERNEL_ASSERT.finditer(text):
        key = (f"{match.group('source')}:{match.group('line')}", match.group("assertion"))
        if key in seen:
            continue
        seen.add(key)
        found.append(KernelAssert(source=key[0], function=match.group("func").strip(),
                                  assertion=match.group("assertion")))
        if len(found) >= 10:
            break
    return found


def is_user_file(path: str) -> bool:
    """A frame in the user's code, not in an installed package or the standard library."""
    return not _LIBRARY.search(path)


def parse_tracebacks(text: str) -> list[TracebackFinding]:
    """Every Python traceback in ``text``, in order (a chained exception prints its cause first)."""
    found: list[TracebackFinding] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() != "Traceback (most recent call last):":
            i += 1
            continue
        i += 1
        frames: list[PythonFrame] = []
        error = ""
        while i < len(lines):
            line = lines[i]
            frame = _FRAME.match(line)
            if frame:
                code = None
                if i + 1 < len(lines) and not _FRAME.match(lines[i + 1]) and lines[i + 1].startswith("    "):
                    candidate = lines[i + 1].strip()
                    if candidate and set(candidate) - set("^~ "):
                        code = candidate
                        i += 1
                if is_user_file(frame.group("file")):
                    frames.append(PythonFrame(frame.group("file"), int(frame.group("line")),
                                              frame.group("func"), code))
                i += 1
                continue
            if not line.strip() or line.startswith(" ") or set(line.strip()) <= set("^~ "):
                i += 1
                continue
            error = line.strip()
            i += 1
            break
        found.append(TracebackFinding(error=error[:500], frames=tuple(frames[-8:])))
    return found


def pick_traceback(tracebacks: Sequence[TracebackFinding]) -> TracebackFinding | None:
    """The root cause: the first traceback whose exception names the GPU, else the last one."""
    for tb in tracebacks:
        if _GPUISH.search(tb.error):
            return tb
    return tracebacks[-1] if tracebacks else None


# ---------------------------------------------------------------------------------------------
# The verdict (pure)


@dataclass(frozen=True)
class RerunResult:
    """How the bounded rerun ended (what :func:`run_bounded` observed)."""

    started: bool
    exit_code: int | None
    signal: int | None
    duration: float
    first_step: int | None
    last_step: int | None
    stopped_by: str | None  # "steps" | "time" when a bound ended it; None when it ended by itself
    output: str  # the tail of the output (and the sanitizer records)
    log_path: str
    start_error: str | None = None


@dataclass(frozen=True)
class Diagnosis:
    """What the rerun showed, next to the original failure."""

    outcome: DiagnosisOutcome
    located: bool
    reason: str
    attempt: int
    original_class: str
    original_step: int | None
    original_evidence: tuple[str, ...]
    checkpoint: str | None
    checkpoint_step: int | None
    rerun_class: str | None
    exit_code: int | None
    signal: int | None
    duration: float
    first_step: int | None
    last_step: int | None
    kernel: str | None
    access: str | None  # the sanitizer's error line, or the kernel assertion
    kernel_source: str | None
    launch_site: str | None  # the Python line that launched the kernel, from the sanitizer's host backtrace
    python_frame: PythonFrame | None
    python_stack: tuple[PythonFrame, ...]
    python_error: str | None
    sanitizer_findings: tuple[SanitizerFinding, ...]
    kernel_asserts: tuple[KernelAssert, ...]
    api_errors: tuple[str, ...]
    tools: tuple[str, ...]
    sanitizer_note: str | None
    scratch: str
    log_path: str
    argv: tuple[str, ...]
    redirected: tuple[str, ...]
    checkpoint_dir_changes: tuple[str, ...]

    @property
    def exit_code_for_cli(self) -> int:
        return EXIT_LOCATED if self.located else EXIT_NOT_LOCATED

    def to_event(self) -> dict[str, Any]:
        """The ``diagnosis`` event's fields (docs/node-health.md lists them)."""
        frame = self.python_frame
        return {
            "attempt": self.attempt, "class": self.original_class, "failure_step": self.original_step,
            "evidence": list(self.original_evidence[:3]), "outcome": self.outcome.value, "located": self.located,
            "reason": self.reason, "checkpoint": self.checkpoint, "checkpoint_step": self.checkpoint_step,
            "rerun_class": self.rerun_class, "exit_code": self.exit_code, "signal": self.signal,
            "duration": round(self.duration, 3), "first_step": self.first_step, "last_step": self.last_step,
            "kernel": self.kernel, "access": self.access, "kernel_source": self.kernel_source,
            "launch_site": self.launch_site,
            "python_file": frame.file if frame else None, "python_line": frame.line if frame else None,
            "python_function": frame.function if frame else None, "python_code": frame.code if frame else None,
            "python_stack": [f"{f.file}:{f.line} in {f.function}" for f in self.python_stack[-4:]],
            "python_error": self.python_error, "api_errors": list(self.api_errors[:3]), "tools": list(self.tools),
            "sanitizer_note": self.sanitizer_note, "scratch": self.scratch, "log": self.log_path,
            "argv": list(self.argv), "redirected": list(self.redirected),
            "checkpoint_dir_changes": list(self.checkpoint_dir_changes),
        }

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["outcome"] = self.outcome.value
        data["exit_code_for_cli"] = self.exit_code_for_cli
        return data


def judge_rerun(plan: DiagnosisPlan, result: RerunResult, *, sanitizer_note: str | None = None,
                checkpoint_dir_changes: Sequence[str] = (), tools: Sequence[str] | None = None,
                argv: Sequence[str] | None = None) -> Diagnosis:
    """Compare the rerun with the failure it was meant to reproduce, and say where it failed.
    ``tools``/``argv``: what the judged run really ran with, when not the plan's (a plain rerun
    after the sanitizer could not run)."""
    from .failures import classify

    text = result.output
    findings = tuple(parse_sanitizer(text))
    asserts = tuple(parse_kernel_asserts(text))
    tb = pick_traceback(parse_tracebacks(text))
    failure = plan.failure
    rerun_class: str | None = None
    if not result.started:
        outcome = DiagnosisOutcome.COULD_NOT_RUN
    elif result.stopped_by == "steps":
        outcome = DiagnosisOutcome.NOT_REPRODUCED
    elif result.stopped_by == "time":
        outcome = DiagnosisOutcome.BOUND_REACHED
    else:
        cls = classify(result.exit_code, result.signal, text, step_regex=plan.step_regex).cls
        rerun_class = cls.value
        if cls in DIAGNOSABLE or findings:
            outcome = DiagnosisOutcome.REPRODUCED
        elif cls is FailureClass.COMPLETED:
            outcome = DiagnosisOutcome.NOT_REPRODUCED
        else:
            outcome = DiagnosisOutcome.FAILED_OTHERWISE
    first = findings[0] if findings else None
    kernel = first.kernel if first else (asserts[0].function or asserts[0].source if asserts else None)
    access = first.error if first else (f"Assertion `{asserts[0].assertion}` failed" if asserts else None)
    source = first.source if first else (asserts[0].source if asserts else None)
    frame = tb.user_frame if tb else None
    launch = first.launch_site if first else None
    located = outcome is DiagnosisOutcome.REPRODUCED and (kernel is not None or frame is not None)
    where = []
    if kernel:
        where.append(f"kernel {kernel}" + (f" ({source})" if source else "") + (f": {access}" if access else ""))
    if launch:
        where.append(f"launched from {launch}")
    if frame:
        where.append(f"Python {frame.file}:{frame.line} in {frame.function}")
    start = (f"from {Path(plan.checkpoint).name} (step {plan.checkpoint_step})" if plan.checkpoint
             else "from the start (no checkpoint before the failure)")
    ran = f"steps {result.first_step}..{result.last_step}" if result.last_step is not None else "no step reported"
    if outcome is DiagnosisOutcome.COULD_NOT_RUN:
        reason = f"the rerun did not start: {result.start_error}"
    elif outcome is DiagnosisOutcome.REPRODUCED:
        reason = (f"reproduced {rerun_class or failure.cls} {start}, {ran}, under {', '.join(tools or plan.tools)}"
                  + (": " + "; ".join(where) if where else "; neither the kernel nor a Python line could be read "
                     "from the output"))
    elif outcome is DiagnosisOutcome.NOT_REPRODUCED:
        why = ("finished" if result.stopped_by is None else
               f"reached step {result.last_step}, past the failure step {failure.step}, and was stopped")
        reason = (f"not reproduced: the rerun {start} {why} without a GPU failure ({ran}); an intermittent "
                  "fault, or one that depends on state not in the checkpoint (a data order, another node)")
    elif outcome is DiagnosisOutcome.BOUND_REACHED:
        reason = (f"stopped at the time bound of {plan.max_seconds:.0f} s ({ran}, failure was at step "
                  f"{failure.step}) before the failure step: raise --max-seconds (the sanitizer is slow)")
    else:
        reason = (f"the rerun {start} failed differently: {rerun_class} ({ran})"
                  + (": " + "; ".join(where) if where else ""))
    if checkpoint_dir_changes:
        reason += f"; WARNING: the run's checkpoint directory changed during the rerun ({len(checkpoint_dir_changes)})"
    return Diagnosis(
        outcome=outcome, located=located, reason=reason, attempt=failure.attempt, original_class=failure.cls,
        original_step=failure.step, original_evidence=failure.evidence, checkpoint=plan.checkpoint,
        checkpoint_step=plan.checkpoint_step, rerun_class=rerun_class, exit_code=result.exit_code,
        signal=result.signal, duration=result.duration, first_step=result.first_step, last_step=result.last_step,
        kernel=kernel, access=access, kernel_source=source, launch_site=launch, python_frame=frame,
        python_stack=tb.frames if tb else (),
        python_error=tb.error if tb else None, sanitizer_findings=findings[:5], kernel_asserts=asserts[:5],
        api_errors=tuple(sanitizer_api_errors(text)), tools=tuple(tools or plan.tools), sanitizer_note=sanitizer_note,
        scratch=plan.scratch, log_path=result.log_path, argv=tuple(argv or plan.argv), redirected=plan.redirected,
        checkpoint_dir_changes=tuple(checkpoint_dir_changes))


def render(diag: Diagnosis) -> str:
    """The diagnosis for a person, next to the original failure."""
    lines = [f"original failure: attempt {diag.attempt}, {diag.original_class} at step {diag.original_step}"]
    if diag.original_evidence:
        lines.append(f"  {diag.original_evidence[0]}")
    start = f"{diag.checkpoint} (step {diag.checkpoint_step})" if diag.checkpoint else "the start (no checkpoint)"
    lines.append(f"rerun from {start} with {', '.join(diag.tools)}")
    lines.append(f"  {' '.join(diag.argv)[:400]}")
    for change in diag.redirected:
        lines.append(f"  checkpoint argument redirected: {change}")
    if diag.sanitizer_note:
        lines.append(f"  sanitizer: {diag.sanitizer_note}")
    took = f"{diag.duration:.1f} s"
    status = f"exit {diag.exit_code}" if diag.exit_code is not None else (
        f"signal {diag.signal}" if diag.signal is not None else "no exit status")
    lines.append(f"rerun ended: {diag.outcome.value} ({status}, {took}, steps {diag.first_step}..{diag.last_step})")
    if diag.kernel or diag.access:
        src = f" [{diag.kernel_source}]" if diag.kernel_source else ""
        lines.append(f"kernel: {diag.kernel or '?'}{src}  {diag.access or ''}".rstrip())
    for finding in diag.sanitizer_findings[:1]:
        for detail in finding.details[:3]:
            lines.append(f"  {detail}")
    if diag.launch_site:
        lines.append(f"launched from: {diag.launch_site}")
    for api in diag.api_errors[:1]:
        lines.append(f"  {api}")
    if diag.python_frame:
        f = diag.python_frame
        lines.append(f"python: {f.file}:{f.line} in {f.function}")
        if f.code:
            lines.append(f"  {f.code}")
    if diag.python_error:
        lines.append(f"  {diag.python_error}")
    for change in diag.checkpoint_dir_changes[:5]:
        lines.append(f"WARNING checkpoint directory changed: {change}")
    lines.append(f"log: {diag.log_path}")
    lines.append(("located: " if diag.located else "not located: ") + diag.reason)
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# I/O: choosing the checkpoint, running, recording


def choose_checkpoint(candidates: Sequence[CheckpointCandidate]) -> tuple[CheckpointCandidate | None, str]:
    """The newest candidate that exists and validates (read only: never unpickled, never moved)."""
    from .checkpoints import validate_checkpoint
    from .checkpoints.resume import is_usable

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
        with open(log_path, "ab") as log:
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
             dry_run: bool = False) -> tuple[DiagnosisPlan, Diagnosis | None]:
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
                          cwd=cwd, max_seconds=max_seconds, max_steps=max_steps, sanitizer=tool)
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
            tools, ran = ["CUDA_LAUNCH_BLOCKING=1"], list(plain_argv)
    changes = dir_changes(before, snapshot_dir(ckpt_dir)) if ckpt_dir else []
    diag = judge_rerun(plan, result, sanitizer_note=note, checkpoint_dir_changes=changes, tools=tools, argv=ran)
    if record:
        log = EventLog(paths.events)
        try:
            log.emit(DIAGNOSIS_EVENT, **diag.to_event())
        finally:
            log.close()
    return plan, diag
