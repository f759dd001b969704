"""The evidence table: which output lines mean which failure class, and at which priority.

How the table is used is described in :mod:`supervisor.failures` (the package docstring).
"""

from __future__ import annotations

import re
import signal as _signal
from dataclasses import dataclass
from typing import Callable, Union

from ..states import FailureClass

FC = FailureClass

VERDICT, CAUSE, CONSEQUENCE, ECHO = 0, 1, 2, 3
_PRIORITY_NAMES = {VERDICT: "verdict", CAUSE: "cause", CONSEQUENCE: "consequence", ECHO: "echo"}

MAX_LINE_CHARS = 64 * 1024  # longer lines are cut before any regex sees them
MAX_INPUT_CHARS = 8 * 1024 * 1024  # classify keeps only the end of a larger text
EVIDENCE_CHARS = 500  # one evidence line, as reported
REFINE_WINDOW = 12  # lines of the same stream in which a specific cause refines a generic one
TRACEBACK_MAX_LINES = 400  # a traceback with no exception line after this many lines is dropped
CONTEXT_BEFORE, CONTEXT_AFTER = 3, 6

# ---------------------------------------------------------------------------------------------
# Signals


_NATIVE_SIGNALS = frozenset({_signal.SIGSEGV, _signal.SIGBUS, _signal.SIGILL, _signal.SIGFPE, _signal.SIGABRT,
                             _signal.SIGSYS, _signal.SIGTRAP})
_OUTSIDE_SIGNALS = frozenset({_signal.SIGKILL, _signal.SIGTERM, _signal.SIGHUP, _signal.SIGQUIT,
                              _signal.SIGUSR1, _signal.SIGUSR2, _signal.SIGALRM, _signal.SIGXCPU,
                              _signal.SIGXFSZ, _signal.SIGPIPE})


def signal_class(signum: int) -> FailureClass:
    """The class a death by ``signum`` means when nothing else is known.

    Faults the process raises itself (SEGV, BUS, ILL, FPE, ABRT) are native crashes; signals sent from
    outside (KILL, TERM, HUP, ...) are ``killed``; SIGINT is a person's Ctrl-C.
    """
    if signum in _NATIVE_SIGNALS:
        return FC.NATIVE_CRASH
    if signum == _signal.SIGINT:
        return FC.CANCELLED
    if signum in _OUTSIDE_SIGNALS:
        return FC.KILLED
    return FC.UNKNOWN


def _signal_from_status(exit_code: int | None, sig: int | None) -> tuple[int | None, bool]:
    """(signal, inferred): the signal the child died of; from 128+N only when N is a real signal."""
    if sig is not None:
        return sig, False
    if exit_code is not None and exit_code < 0:  # Python's returncode convention
        return -exit_code, False
    if exit_code is not None and 129 <= exit_code <= 128 + 31:
        return exit_code - 128, True
    return None, False


# ---------------------------------------------------------------------------------------------
# The pattern table


Resolver = Callable[["re.Match[str]"], Union[FailureClass, None]]


@dataclass(frozen=True)
class FailurePattern:
    """One kind of evidence. ``cls`` is a class, or a function of the match (e.g. of a signal number)."""

    cls: FailureClass | Resolver
    regex: re.Pattern[str]
    priority: int
    label: str
    generic: bool = False  # names only a signal/abort: refined by a specific cause on the next lines
    overrides: frozenset[FailureClass] = frozenset()  # classes this evidence beats wherever it appears
    # Lower-case literals, one of which is in every line the regex matches: a C-level substring test
    # skips the regex on almost every line. Empty = always run the regex.
    needles: tuple[str, ...] = ()

    def resolve(self, match: "re.Match[str]") -> FailureClass | None:
        return self.cls if isinstance(self.cls, FailureClass) else self.cls(match)


def _by_signum(m: "re.Match[str]") -> FailureClass | None:
    return signal_class(int(m.group(1)))


def _by_exitcode(m: "re.Match[str]") -> FailureClass | None:
    code = int(m.group(1))
    if code < 0:
        return signal_class(-code)
    return FC.UNKNOWN if code else None


def _by_signame(m: "re.Match[str]") -> FailureClass | None:
    name = m.group(1).upper()
    try:
        return signal_class(int(_signal.Signals[name if name.startswith("SIG") else "SIG" + name]))
    except KeyError:
        return FC.NATIVE_CRASH


_SIGNAL_WORDS = {
    "segmentation fault": FC.NATIVE_CRASH, "bus error": FC.NATIVE_CRASH, "aborted": FC.NATIVE_CRASH,
    "illegal instruction": FC.NATIVE_CRASH, "floating point exception": FC.NATIVE_CRASH,
    "killed": FC.KILLED, "terminated": FC.KILLED,
}


def _by_signal_words(m: "re.Match[str]") -> FailureClass | None:
    return _SIGNAL_WORDS.get(m.group(1).strip().lower(), FC.NATIVE_CRASH)


# Xid numbers an application provokes (13 graphics engine exception, 31 MMU fault, 43 channel reset,
# 45 preemptive cleanup after another fault): not the GPU's fault. Every other Xid is hardware or driver.
_APP_XIDS = frozenset({13, 31, 43, 45, 68, 69})


def _by_xid(m: "re.Match[str]") -> FailureClass | None:
    return None if int(m.group(1)) in _APP_XIDS else FC.HARDWARE_FAULT


_GPU_HW_OVERRIDES = frozenset({FC.ILLEGAL_MEMORY_ACCESS, FC.CUDA_LAUNCH_FAILURE, FC.NCCL_ERROR, FC.NATIVE_CRASH,
                               FC.KILLED, FC.UNKNOWN})
_ASSERT_OVERRIDES = frozenset({FC.ILLEGAL_MEMORY_ACCESS, FC.CUDA_LAUNCH_FAILURE, FC.NCCL_ERROR, FC.NATIVE_CRASH,
                               FC.PYTHON_EXCEPTION, FC.KILLED, FC.UNKNOWN})
_SHM_OVERRIDES = frozenset({FC.NATIVE_CRASH, FC.PYTHON_EXCEPTION, FC.NCCL_ERROR, FC.KILLED, FC.UNKNOWN})

_SLURM_CANCEL = r"\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT \S+"
_SRUN_TASK = r"srun: error: \S+: tasks? [\d,\-\[\] ]+: "
_DATALOADER = r"DataLoader worker \(pids?\(?s?\)? [^)]*\)\)? "


def _p(cls: FailureClass | Resolver, regex: str, priority: int, label: str, needles: tuple[str, ...], *,
       ignore_case: bool = False, generic: bool = False,
       overrides: frozenset[FailureClass] = frozenset()) -> FailurePattern:
    return FailurePattern(cls, re.compile(regex, re.IGNORECASE if ignore_case else 0), priority, label,
                          generic=generic, overrides=overrides, needles=needles)


# Order matters only between patterns that match the same line (see _best_match).
DEFAULT_PATTERNS: tuple[FailurePattern, ...] = (
    # --- VERDICT: the scheduler or the kernel says how it ended -------------------------------------
    _p(FC.PREEMPTED, _SLURM_CANCEL + r" DUE TO (?:PREEMPTION|JOB REQUEUED)", VERDICT, "Slurm preempted the job",
       ("cancelled at",), ignore_case=True),
    _p(FC.TIME_LIMIT, _SLURM_CANCEL + r" DUE TO TIME LIMIT", VERDICT, "Slurm time limit", ("cancelled at",),
       ignore_case=True),
    _p(FC.NODE_FAILURE, _SLURM_CANCEL + r" DUE TO NODE FAIL", VERDICT, "Slurm node failure", ("cancelled at",),
       ignore_case=True),
    _p(FC.NODE_FAILURE, r"srun: error: Node failure on \S+", VERDICT, "srun: node failure", ("node failure on",)),
    _p(FC.CANCELLED, r"\*\*\* JOB \S+ ON \S+ CANCELLED AT \S+ \*\*\*", VERDICT, "the job was cancelled (scancel)",
       ("cancelled at",)),
    _p(FC.HOST_OOM, r"Detected \d+ oom[-_]kill event", VERDICT, "Slurm OOM kill", ("oom",), ignore_case=True),
    _p(FC.HOST_OOM, _SRUN_TASK + r"Out Of Memory", VERDICT, "srun: task out of memory", ("out of memory",)),
    _p(FC.HOST_OOM, r"(?:Memory cgroup )?out of memory: Kill(?:ed)? process", VERDICT, "kernel OOM killer",
       ("out of memory",), ignore_case=True),
    _p(FC.HOST_OOM, r"\binvoked oom-killer\b|\boom[-_]kill(?:er)?\b.*\b(?:event|killed|process)", VERDICT,
       "OOM killer", ("oom",), ignore_case=True),
    # --- CAUSE: device-side assert (a bad index or target; beats the memory errors it provokes) -----
    _p(FC.DEVICE_ASSERT, r"device-side assert triggered|cudaErrorAssert\b|CUDA_ERROR_ASSERT\b", CAUSE,
       "CUDA device-side assert", ("assert",), overrides=_ASSERT_OVERRIDES),
    _p(FC.DEVICE_ASSERT, r"\.cuh?:\d+:.*\bAssertion\b.*\bfailed", CAUSE, "CUDA kernel assertion", ("assert",),
       overrides=_ASSERT_OVERRIDES),
    _p(FC.DEVICE_ASSERT, r"block: \[\d+,\s*\d+,\s*\d+\], thread: \[\d+,\s*\d+,\s*\d+\].*Assertion", CAUSE,
       "CUDA kernel assertion", ("assert",), overrides=_ASSERT_OVERRIDES),
    # --- CAUSE: shared memory exhausted (beats the bus errors it raises) ----------------------------
    _p(FC.SHM_EXHAUSTED, r"insufficient shared memory|out of shared memory", CAUSE, "shared memory exhausted",
       ("shared memory",), ignore_case=True, overrides=_SHM_OVERRIDES),
    _p(FC.SHM_EXHAUSTED, r"/dev/shm\b.*(?:no space left|bus error|failed to extend|cannot allocate|unable to)"
                         r"|(?:no space left on device|bus error|failed to extend|cannot allocate memory).*?/dev/shm",
       CAUSE, "/dev/shm full", ("/dev/shm",), ignore_case=True, overrides=_SHM_OVERRIDES),
    _p(FC.SHM_EXHAUSTED, r"unable to (?:write to|open|mmap|allocate|resize|create)\b.*</?torch_"
                         r"|unable to allocate shared memory|error while creating shared memory segment"
                         r"|shm_open\S* .*(?:fail|no space)",
       CAUSE, "torch shared-memory file failed", ("unable to", "shared memory", "shm_open"), ignore_case=True,
       overrides=_SHM_OVERRIDES),
    # --- CAUSE: GPU and node hardware (GPU faults beat the CUDA/NCCL errors they cause) -------------
    _p(FC.HARDWARE_FAULT, r"uncorrectable ECC error|cudaErrorECCUncorrectable|CUDA_ERROR_ECC_UNCORRECTABLE"
                          r"|double bit error \(DBE\)",
       CAUSE, "uncorrectable ECC error", ("ecc", "dbe"), ignore_case=True, overrides=_GPU_HW_OVERRIDES),
    _p(_by_xid, r"\bXid\b\s*(?:\([^)]*\))?\s*:?\s*(\d+)", CAUSE, "NVIDIA Xid", ("xid",),
       overrides=_GPU_HW_OVERRIDES),
    _p(FC.HARDWARE_FAULT, r"fallen off the bus|GPU is lost|NVML_ERROR_GPU_IS_LOST", CAUSE, "GPU fell off the bus",
       ("fallen off", "gpu is lost", "gpu_is_lost"), ignore_case=True, overrides=_GPU_HW_OVERRIDES),
    _p(FC.HARDWARE_FAULT, r"uncorrectable NVLink error|cudaErrorNvlinkUncorrectable", CAUSE,
       "uncorrectable NVLink error", ("nvlink",), ignore_case=True, overrides=_GPU_HW_OVERRIDES),
    _p(FC.HARDWARE_FAULT, r"CUDA error: unknown error|cudaErrorUnknown\b|CUDA_ERROR_UNKNOWN\b", CAUSE,
       "CUDA unknown error (usually the GPU or driver)", ("unknown error", "cudaerrorunknown", "cuda_error_unknown")),
    _p(FC.HARDWARE_FAULT, r"system not yet initialized|cudaErrorSystemNotReady"
                          r"|CUDA-capable device\(s\) is/are busy or unavailable|cudaErrorDevicesUnavailable",
       CAUSE, "GPU unavailable on this node",
       ("not yet initialized", "systemnotready", "busy or unavailable", "devicesunavailable"), ignore_case=True),
    _p(FC.HARDWARE_FAULT, r"NET/IB\w*\s*:\s*Got completion from peer|transport retry count(?:er)? exceeded"
                          r"|IBV_WC_RETRY_EXC_ERR|local catastrophic error",
       CAUSE, "InfiniBand error", ("net/ib", "retry count", "ibv_wc_retry", "catastrophic"), ignore_case=True),
    # --- CAUSE: CUDA errors -------------------------------------------------------------------------
    _p(FC.CUDA_OOM, r"CUDA out of memory|(?<!java\.lang\.)\bOutOfMemoryError\b|CUDA error: out of memory"
                    r"|cudaErrorMemoryAllocation|CUDA_ERROR_OUT_OF_MEMORY|CUBLAS_STATUS_ALLOC_FAILED"
                    r"|Cuda failure '?out of memory|HIP out of memory|RESOURCE_EXHAUSTED: Out of memory"
                    r"|OOM when allocating tensor",
       CAUSE, "CUDA out of memory", ("out of memory", "out_of_memory", "outofmemoryerror", "memoryallocation",
                                     "alloc_failed", "resource_exhausted", "oom when allocating")),
    _p(FC.ILLEGAL_MEMORY_ACCESS, r"an illegal memory access was encountered|cudaErrorIllegalAddress"
                                 r"|CUDA_ERROR_ILLEGAL_ADDRESS",
       CAUSE, "CUDA illegal memory access", ("illegal memory access", "illegaladdress", "illegal_address"),
       ignore_case=True),
    _p(FC.CUDA_LAUNCH_FAILURE, r"unspecified launch failure|cudaErrorLaunchFailure|CUDA_ERROR_LAUNCH_FAILED"
                               r"|misaligned address|cudaErrorMisalignedAddress|an illegal instruction was encountered"
                               r"|cudaErrorIllegalInstruction|the launch timed out and was terminated"
                               r"|CUDA_ERROR_LAUNCH_TIMEOUT|CUBLAS_STATUS_EXECUTION_FAILED|hardware stack error"
                               r"|invalid program counter",
       CAUSE, "CUDA kernel launch failure",
       ("launch failure", "launchfailure", "launch_failed", "misaligned", "illegal instruction", "illegalinstruction",
        "launch timed out", "launch_timeout", "execution_failed", "hardware stack error", "program counter"),
       ignore_case=True),
    # --- CAUSE: host memory -------------------------------------------------------------------------
    _p(FC.HOST_OOM, r"(?<![A-Za-z])(?:_Array)?MemoryError\b|std::bad_alloc|Unable to allocate [\d.]+ \w?i?B for an"
                    r" array|DefaultCPUAllocator: (?:can't|not enough memory)|\[Errno 12\] Cannot allocate memory",
       CAUSE, "host memory exhausted",
       ("memoryerror", "bad_alloc", "for an array", "defaultcpuallocator", "cannot allocate memory")),
    # --- CAUSE: NCCL --------------------------------------------------------------------------------
    _p(FC.NCCL_ERROR, r"unhandled system error|ncclSystemError|ncclInternalError|ncclInvalidUsage"
                      r"|ncclInvalidArgument|internal error - please report this issue to the NCCL developers"
                      r"|invalid usage \(run with NCCL_DEBUG",
       CAUSE, "NCCL error", ("unhandled system error", "ncclsystemerror", "ncclinternalerror", "ncclinvalid",
                             "nccl developers", "invalid usage")),
    _p(FC.NCCL_ERROR, r"\bNCCL error\b|unhandled cuda error|ncclUnhandledCudaError|NCCL WARN Cuda failure", CAUSE,
       "NCCL error (refined by its 'Last error')",
       ("nccl error", "unhandled cuda error", "ncclunhandledcudaerror", "cuda failure"), ignore_case=True,
       generic=True),
    # --- DataLoader workers, Ctrl-C, submitit ---------------------------------------------------------
    _p(FC.KILLED, _DATALOADER + r"is killed by signal: Terminated", ECHO, "DataLoader worker terminated",
       ("dataloader worker",)),
    _p(_by_signal_words, _DATALOADER + r"is killed by signal: ([A-Za-z ]+)", CAUSE,
       "DataLoader worker killed by a signal", ("dataloader worker",)),
    _p(FC.UNKNOWN, _DATALOADER + r"exited unexpectedly", CONSEQUENCE, "DataLoader worker exited unexpectedly",
       ("dataloader worker",)),
    _p(FC.NATIVE_CRASH, r"Unexpected (?:segmentation fault|floating-point exception|bus error) encountered in worker",
       CAUSE, "DataLoader worker crashed", ("encountered in worker",)),
    _p(FC.CANCELLED, r"^KeyboardInterrupt\b|srun: (?:sending Ctrl-C|interrupt \(one more within"
                     r"|forcing job termination)",
       CAUSE, "interrupted (Ctrl-C)", ("keyboardinterrupt", "srun: ")),
    _p(FC.PREEMPTED, r"this job is preempted", CAUSE, "submitit: preempted", ("this job is preempted",)),
    _p(FC.TIME_LIMIT, r"this job is timed-out", CAUSE, "submitit: timed out", ("this job is timed-out",)),
    # --- CAUSE, generic: a signal or an abort, refined by what follows (narrowest first) ----------------
    _p(FC.HOST_OOM, r"terminate called after throwing an instance of 'std::bad_alloc'", CAUSE, "std::bad_alloc",
       ("bad_alloc",)),
    _p(FC.NCCL_ERROR, r"terminate called after throwing an instance of 'c10::Dist\w*Error'", CONSEQUENCE,
       "c10 distributed error", ("terminate called",), generic=True),
    _p(FC.NATIVE_CRASH, r"terminate called (?:after throwing an instance of|without an active|recursively)", CAUSE,
       "C++ terminate (SIGABRT)", ("terminate called",), generic=True),
    _p(_by_signame, r"Fatal Python error: (Segmentation fault|Bus error|Aborted|Illegal instruction"
                    r"|Floating point exception)",
       CAUSE, "Python fatal error", ("fatal python error",), generic=True),
    _p(FC.NATIVE_CRASH, r"Fatal Python error: ", CAUSE, "Python fatal error", ("fatal python error",), generic=True),
    _p(_by_signame, r"\*\*\* (SIG[A-Z]+) \(@[^)]*\) received by PID", CAUSE, "glog signal handler",
       ("received by pid",), generic=True),
    _p(FC.NATIVE_CRASH, r"\*\*\* Aborted at \d+ \(unix time\)", CAUSE, "glog abort", ("aborted at",), generic=True),
    _p(_by_signal_words, r"\b(Segmentation fault|Bus error|Illegal instruction|Floating point exception)\b", CAUSE,
       "native crash", ("segmentation fault", "bus error", "illegal instruction", "floating point exception"),
       generic=True),
    _p(_by_signal_words, r"(?:^|\d+ |" + _SRUN_TASK + r")(Aborted)\b", CAUSE, "SIGABRT", ("aborted",),
       generic=True),
    _p(FC.NATIVE_CRASH, r"double free or corruption|free\(\): invalid pointer|malloc\(\): "
                        r"|corrupted size vs\. prev_size|munmap_chunk\(\): invalid pointer|stack smashing detected",
       CAUSE, "glibc heap corruption",
       ("double free", "free():", "malloc():", "corrupted size", "munmap_chunk", "stack smashing"), generic=True),
    _p(FC.NATIVE_CRASH, r"Assertion [`'].*['`] failed", CAUSE, "C assertion (SIGABRT)", ("assertion",),
       generic=True),
    _p(_by_signum, r"Caught signal (\d+) \(", CAUSE, "signal handler report", ("caught signal",), generic=True),
    # --- CONSEQUENCE: what a failure elsewhere leads to ---------------------------------------------
    _p(FC.NCCL_ERROR, r"Watchdog caught collective operation timeout|watchdog got stuck"
                      r"|(?:Process group|NCCL) watchdog thread terminated with exception"
                      r"|Some NCCL operations have failed or timed out"
                      r"|To avoid data inconsistency, we are taking the entire process down"
                      r"|ncclRemoteError|remote process exited or there was a network error"
                      r"|NCCL communicator was aborted|Heartbeat monitor timed out"
                      r"|NET/Socket\s*:.*Connection closed by remote peer",
       CONSEQUENCE, "NCCL timeout or lost peer",
       ("watchdog", "some nccl operations", "avoid data inconsistency", "ncclremoteerror", "remote process exited",
        "communicator was aborted", "heartbeat monitor", "connection closed by remote peer")),
    _p(FC.NCCL_ERROR, r"(?:DistNetworkError|DistStoreError|TCPStore|c10d|gloo).*(?:Connection reset by peer"
                      r"|Connection closed by peer|Broken pipe|Connection refused|timed out)",
       CONSEQUENCE, "distributed peer lost", ("distnetworkerror", "diststoreerror", "tcpstore", "c10d", "gloo"),
       ignore_case=True),
    _p(_by_signum, r"Signal (\d+) \(SIG\w+\) received by PID", CONSEQUENCE, "torchrun: worker killed by a signal",
       ("received by pid",)),
    _p(_by_exitcode, r"^\s*exitcode\s*:\s*(-?\d+) \(pid", CONSEQUENCE, "torchrun: worker exit", ("exitcode",)),
    _p(FC.NODE_FAILURE, r"STEPD TERMINATED ON \S+ AT \S+ DUE TO JOB NOT ENDING WITH SIGNALS", CONSEQUENCE,
       "processes could not be killed (node is being drained)", ("stepd terminated",)),
    # --- ECHO: something died; the cause is elsewhere -----------------------------------------------
    _p(_by_exitcode, r"failed \(exitcode: (-?\d+)\) local_rank:", ECHO, "torchrun: worker failed", ("exitcode",)),
    _p(FC.UNKNOWN, r"\bChildFailedError\b", ECHO, "torchrun: a worker failed", ("childfailederror",)),
    _p(_by_signal_words, _SRUN_TASK + r"(Killed|Terminated)\b", ECHO, "srun: task killed", ("killed", "terminated")),
    _p(_by_signal_words, r"(?:^\s*|:\s+(?:line \d+:\s+)?\d+\s+)(Killed|Terminated)\b(?!\s+process)", ECHO,
       "shell: killed", ("killed", "terminated")),
    _p(_by_signum, r"SignalException: Process \d+ got signal: (\d+)", ECHO, "torchrun received a signal",
       ("signalexception",)),
    _p(FC.KILLED, r"Received SIGTERM|Bypassing SIGTERM", ECHO, "SIGTERM received", ("sigterm",)),
    _p(FC.UNKNOWN, _SRUN_TASK + r"Exited with exit code (\d+)", ECHO, "srun: task exited",
       ("exited with exit code",)),
    _p(FC.UNKNOWN, r"srun: Terminating (?:job step|StepId=)|" + _SLURM_CANCEL + r" DUE TO TASK FAILURE", ECHO,
       "srun ended the step after a task failed", ("srun: terminating", "task failure"), ignore_case=True),
    _p(FC.CANCELLED, r"\*\*\* STEP \S+ ON \S+ CANCELLED AT \S+ \*\*\*", ECHO, "the step was cancelled",
       ("cancelled at",)),
)


