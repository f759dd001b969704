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

One module per job: :mod:`.plan` reads the run and plans the rerun (its environment too),
:mod:`.parse` reads the output, :mod:`.judge` says what the rerun showed; they are pure (text and
events in, frozen dataclasses out). Only :mod:`.rerun` does I/O (:func:`run_bounded`, :func:`diagnose`).
"""

from __future__ import annotations

from .judge import (
    Diagnosis,
    RerunResult,
    judge_rerun,
    render,
)
from .parse import (
    KernelAssert,
    PythonFrame,
    SanitizerFinding,
    TracebackFinding,
    is_user_file,
    parse_kernel_asserts,
    parse_sanitizer,
    parse_tracebacks,
    pick_traceback,
    sanitizer_api_errors,
    sanitizer_refused,
)
from .plan import (
    CheckpointCandidate,
    DEFAULT_MAX_SECONDS,
    DIAGNOSABLE,
    DIAGNOSIS_EVENT,
    DiagnosisOutcome,
    DiagnosisPlan,
    EXIT_LOCATED,
    EXIT_NOT_LOCATED,
    FailureToDiagnose,
    MIN_EXTRA_STEPS,
    SANITIZER,
    SANITIZER_ARGS,
    SANITIZER_LINES,
    SANITIZER_SHARE,
    TAIL_LINES,
    TERM_GRACE,
    checkpoint_candidates,
    latest,
    pick_failure,
    plan_diagnosis,
    redirect_checkpoint_args,
    unused_path,
)
from .rerun import (
    choose_checkpoint,
    diagnose,
    dir_changes,
    find_sanitizer,
    run_bounded,
    snapshot_dir,
)

__all__ = [
    "CheckpointCandidate",
    "DEFAULT_MAX_SECONDS",
    "DIAGNOSABLE",
    "DIAGNOSIS_EVENT",
    "Diagnosis",
    "DiagnosisOutcome",
    "DiagnosisPlan",
    "EXIT_LOCATED",
    "EXIT_NOT_LOCATED",
    "FailureToDiagnose",
    "KernelAssert",
    "MIN_EXTRA_STEPS",
    "PythonFrame",
    "RerunResult",
    "SANITIZER",
    "SANITIZER_ARGS",
    "SANITIZER_LINES",
    "SANITIZER_SHARE",
    "SanitizerFinding",
    "TAIL_LINES",
    "TERM_GRACE",
    "TracebackFinding",
    "checkpoint_candidates",
    "choose_checkpoint",
    "diagnose",
    "dir_changes",
    "find_sanitizer",
    "is_user_file",
    "judge_rerun",
    "latest",
    "parse_kernel_asserts",
    "parse_sanitizer",
    "parse_tracebacks",
    "pick_failure",
    "pick_traceback",
    "plan_diagnosis",
    "redirect_checkpoint_args",
    "render",
    "run_bounded",
    "sanitizer_api_errors",
    "sanitizer_refused",
    "snapshot_dir",
    "unused_path",
]
