"""The enums of the supervisor's state spaces, one each. Stdlib only; a leaf module.

The ``str`` mixin lets values go into the JSON event log and YAML config unchanged.
"""

from __future__ import annotations

from enum import Enum


class FailureClass(str, Enum):
    """How an attempt ended, judged from the first failure in its output. What each class is and
    what it gets (policy, node ledger, budgets) is its row in ``supervisor/failures/classes.py``."""

    COMPLETED = "completed"
    NATIVE_CRASH = "native_crash"
    ILLEGAL_MEMORY_ACCESS = "illegal_memory_access"
    CUDA_LAUNCH_FAILURE = "cuda_launch_failure"
    NCCL_ERROR = "nccl_error"
    HANG = "hang"
    HARDWARE_FAULT = "hardware_fault"
    INTERCONNECT = "interconnect"
    SHM_EXHAUSTED = "shm_exhausted"
    NODE_FAILURE = "node_failure"
    DEVICE_ASSERT = "device_assert"
    CUDA_OOM = "cuda_oom"
    HOST_OOM = "host_oom"
    PYTHON_EXCEPTION = "python_exception"
    PREEMPTED = "preempted"
    TIME_LIMIT = "time_limit"
    CANCELLED = "cancelled"
    KILLED = "killed"
    UNKNOWN = "unknown"


class Action(str, Enum):
    """What to do after an attempt ends. Exactly these three (issue 4)."""

    RESTART = "restart"  # relaunch the child in place, in the same allocation
    REQUEUE = "requeue"  # give the allocation back; come back through Slurm or the resubmission loop
    STOP = "stop"  # a human must act


class RunOutcome(str, Enum):
    """How ``supervise run`` ended; mapped to an exit code in the CLI."""

    COMPLETE = "complete"
    STOPPED = "stopped"  # policy or budget said stop
    FAILED = "failed"  # ran once, child failed, no restart configured
    REQUEUE = "requeue"  # handed over to Slurm / resubmission
    INTERRUPTED = "interrupted"  # the user interrupted the supervisor


class SaveDecision(str, Enum):
    """Arbitration of a stop notice against checkpoint saves."""

    BLOCK = "block"  # let the in-flight save finish, then stop
    ABORT = "abort"  # stop the writer now; the previous checkpoint stays intact
    EMERGENCY_SAVE = "emergency_save"  # ask for one save, then stop
    STOP_NOW = "stop_now"


class Verdict(str, Enum):
    """A checkpoint's validation verdict."""

    VALID = "valid"
    CORRUPT = "corrupt"  # torn, truncated, CRC mismatch: quarantine
    UNVERIFIABLE = "unverifiable"  # cannot be proven either way (all-zero CRCs, unknown format)
    IN_PROGRESS = "in_progress"  # still being written; neither use nor quarantine


class SubmitAction(str, Enum):
    """What ``supervise submit`` does after a job of the run has ended for good (issue 6)."""

    RESUBMIT = "resubmit"  # the run is not finished and nothing forbids it: submit the script again
    DONE = "done"  # training is complete
    STOP = "stop"  # policy, a budget, a person, a failure or the submission limit says stop
