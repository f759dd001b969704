"""Classify how an attempt ended, from its exit status and the tail of its output (DESIGN.md §7),
and decide what to do next. Pure: text and numbers in, frozen dataclasses with a ``reason`` out.

The class comes from the **first** failure in the output, not the last: a watchdog abort after an
illegal memory access is an illegal memory access; ``task 0: Terminated`` after ``task 1:
Segmentation fault`` is a segfault; and a CUDA error in PyTorch is a Python exception with exit
status 1, so the text decides, never the exit code alone.

How the first failure is found (the table :data:`DEFAULT_PATTERNS` holds the evidence):

* Every pattern has a *priority*. ``VERDICT`` (0): the scheduler or the kernel says how the job
  ended (preemption, time limit, node failure, OOM kill, a person's scancel); it wins wherever it
  appears, because the allocation is gone whatever the training printed while it was being taken.
  ``CAUSE`` (1): a root cause (a CUDA error, a segfault, a Python exception). ``CONSEQUENCE`` (2):
  what a failure elsewhere leads to (NCCL watchdog timeouts, a peer's lost connection, torchrun's
  ``ChildFailedError`` summary). ``ECHO`` (3): a bare report that something died (``Terminated``,
  ``Killed``, ``Exited with exit code 1``). The lowest priority present decides; within it, the
  first line in the output wins.
* A *generic* pattern names only a signal or an abort (``terminate called after throwing``,
  ``Segmentation fault``, ``NCCL error``). A specific cause on the next lines of the same stream
  refines it (``what():  CUDA error: an illegal memory access``), and a generic line that comes
  after any cause or consequence is that failure's echo, not a new failure.
* A few causes *override* others wherever they appear: a device-side assert beats the illegal memory
  access it provokes; a full ``/dev/shm`` beats the bus error it raises; a GPU hardware fault (ECC,
  Xid, fallen off the bus) beats the CUDA and NCCL errors it causes.
* A Python traceback counts by its final exception line: the root cause of a chain is printed
  first. A traceback after which training went on (later step reports) was not fatal and is ignored.
* With no evidence in the text, the exit status decides (signal N, or 128+N when plausible).

Output is read line by line, with ``\\r`` progress-bar redraws split, ANSI colours removed, and
``srun --label`` / ``[rank3]:`` / ``[default0]:`` / ``mpirun --tag-output`` prefixes taken off (they
name the rank). The step is the last *global* step reported before the first error, read with the
shared patterns of :mod:`supervisor.progress` (a per-epoch progress bar is progress, not a step: None
rather than a wrong number). Work is linear in the input: each pattern carries literal ``needles``,
one ``str.find`` sweep per needle picks the few lines worth a regex; lines over 64 KiB are cut.
"""

from __future__ import annotations

import re
import signal as _signal
from bisect import bisect_right
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Mapping, Sequence, Union

from .config import DEFAULT_POLICY, ClassPolicy
from .progress import DEFAULT_STEP_PATTERNS, StepExtractor
from .states import Action, FailureClass

if TYPE_CHECKING:
    from .budget import AttemptRecord

__all__ = [
    "CAUSE", "CONSEQUENCE", "DEFAULT_PATTERNS", "DEFAULT_STEP_PATTERNS", "Decision", "ECHO", "Failure",
    "FailurePattern", "VERDICT", "classify", "decide", "parse_signal", "signal_class", "with_class",
]

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


def signal_name(signum: int) -> str:
    try:
        return _signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def parse_signal(text: str | int) -> int:
    """``SEGV``, ``SIGSEGV``, ``sigsegv`` or ``11`` to 11; ValueError names what is allowed."""
    if isinstance(text, int):
        value = text
    else:
        raw = text.strip()
        if raw.lstrip("-").isdigit():
            value = abs(int(raw))
        else:
            name = raw.upper()
            name = name if name.startswith("SIG") else "SIG" + name
            try:
                value = int(_signal.Signals[name])
            except KeyError:
                raise ValueError(f"unknown signal {text!r}; use a name like SEGV or SIGSEGV, or a number like 11") \
                    from None
    if not 1 <= value <= 64:
        raise ValueError(f"signal number {value} is out of range (1-64)")
    return value


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


# ---------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class Failure:
    """How an attempt ended: the class of its first failure, the policy's action, and the evidence."""

    cls: FailureClass
    action: Action
    evidence: tuple[str, ...] = ()  # the decisive line(s), cleaned
    context: tuple[str, ...] = ()  # a few lines around the first error
    step: int | None = None  # the last global step reported before the first error
    node: str | None = None
    rank: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    reason: str = ""


@dataclass(frozen=True)
class Decision:
    """What to do after a failure, and how long to wait first."""

    action: Action
    reason: str
    delay: float = 0.0  # seconds of backoff before a restart
    exclude_nodes: tuple[str, ...] = ()  # for a requeue: nodes to keep away from (policy.exclude_node)


# ---------------------------------------------------------------------------------------------
# Reading the text


_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_PREFIX = re.compile(
    r"^(?:\s{0,6}(?P<label>\d{1,6}): "  # srun --label
    r"|\[(?:rank|default)\s?(?P<rank>\d{1,6})\]:\s?"  # torchrun --tee / [rank3]: prefixes
    r"|\[\d+,(?P<mpi>\d+)\]<std(?:out|err)>:\s?"  # mpirun --tag-output
    r"|[\w.-]+: (?=\[rank\d))"  # pdsh host prefix before a rank prefix (DeepSpeed launcher)
)
_PREFIX_FIRST = frozenset("[ \t0123456789")
_TRACEBACK = re.compile(r"Traceback \(most recent call last\)")
_EXC_LINE = re.compile(
    r"^(?P<name>(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*)(?P<colon>:(?:\s.*)?)?$")
_EXC_SUFFIX = re.compile(r"(?:Error|Exception|Interrupt|Exit|Warning|Failure|Fault|Timeout|Failed|Iteration|Group)$")
_FRAME_START = ("File ", "│", "╭", "╰", "┃", "^", "~")
_NODE_PATTERNS = (
    re.compile(r"srun: error: (?P<node>[\w.\-]+): tasks? (?P<rank>\d+)"),
    re.compile(r"\bON (?P<node>[\w.\-]+) CANCELLED AT"),
    re.compile(r"Node failure on (?P<node>[\w.\-]+)"),
    re.compile(r"STEPD TERMINATED ON (?P<node>[\w.\-]+)"),
    re.compile(r"^(?P<node>[A-Za-z][\w.\-]*):\d+:\d+ \[\d+\] "),  # NCCL's host:pid:tid [dev] prefix
)
_SRUN_ECHO = re.compile(r": (?:Killed|Terminated)\b")  # srun lines for tasks killed because another failed
_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\)")
_RULE = re.compile(r"^\s*={8,}\s*$")
_FIELD = re.compile(r"^\s*(time|host|rank|exitcode|error_file|traceback)\s*:\s?(.*)$")


@dataclass
class _Line:
    idx: int
    raw: str  # colours removed, cut to MAX_LINE_CHARS, prefix kept
    text: str  # the prefix taken off
    stream: str  # which prefix it had ("" = none): tracebacks and refinements stay within a stream
    rank: int | None
    frame: bool = False  # inside a Python traceback (a frame or its source line)


@dataclass
class _Match:
    line: int  # index of the decisive line
    start: int  # index where the failure began (a traceback's first line)
    pattern: FailurePattern | None  # None for a plain Python exception or a synthesized summary
    cls: FailureClass
    priority: int
    generic: bool
    label: str
    extra: tuple[int, ...] = ()  # more evidence lines (a refinement, a torchrun summary)
    node: str | None = None
    rank: int | None = None
    overrides: frozenset[FailureClass] = frozenset()


def _split_lines(text: str) -> list[_Line]:
    lines: list[_Line] = []
    for physical in text.split("\n"):
        for segment in physical.split("\r") if "\r" in physical else (physical,):
            if len(segment) > MAX_LINE_CHARS:
                segment = segment[:MAX_LINE_CHARS]
            if "\x1b" in segment:
                segment = _ANSI.sub("", segment)
            if not segment.strip():
                continue
            body, stream, rank = segment, "", None
            maybe_prefixed = segment[:1] in _PREFIX_FIRST or ": [rank" in segment[:100]
            for _ in range(3 if maybe_prefixed else 0):
                m = _PREFIX.match(body)
                if m is None or m.end() == 0:
                    break
                if m.group("rank") is not None:
                    rank = int(m.group("rank"))
                elif m.group("mpi") is not None:
                    rank = int(m.group("mpi"))
                elif m.group("label") is not None and rank is None:
                    rank = int(m.group("label"))
                stream += m.group(0).strip()
                body = body[m.end():]
            lines.append(_Line(len(lines), segment.rstrip(), body.rstrip(), stream, rank))
    return lines


def _clean(text: str) -> str:
    text = " ".join(text.split()) if "\t" in text else text.strip()
    return text if len(text) <= EVIDENCE_CHARS else text[:EVIDENCE_CHARS - 1] + "…"


def _needle_union(patterns: Sequence[FailurePattern]) -> tuple[str, ...] | None:
    """Every needle of the table, or None when a pattern has none (then no line can be skipped)."""
    if not patterns or not all(p.needles for p in patterns):
        return None
    return tuple(sorted({n for p in patterns for n in p.needles}))


def _best_match(text: str, patterns: Sequence[FailurePattern],
                union: tuple[str, ...] | None) -> tuple[FailurePattern, FailureClass] | None:
    """The most decisive pattern on one line: specific before generic, then the lowest priority, then the
    table's order (generics by table order alone: the narrower ones come first)."""
    low = text.lower()
    if union is not None and not any(n in low for n in union):
        return None
    best: tuple[tuple[int, int, int], FailurePattern, FailureClass] | None = None
    for order, pat in enumerate(patterns):
        if pat.needles and not any(n in low for n in pat.needles):
            continue
        m = pat.regex.search(text)
        if m is None:
            continue
        cls = pat.resolve(m)
        if cls is None:
            continue
        key = (int(pat.generic), 0 if pat.generic else pat.priority, order)
        if best is None or key < best[0]:
            best = (key, pat, cls)
    return None if best is None else (best[1], best[2])


_DEFAULT_UNION = _needle_union(DEFAULT_PATTERNS)


@dataclass
class _Traceback:
    start: int
    prefix: str  # text before "Traceback" on its line (a logging prefix repeated on every line)
    lines: int = 0


def _exception_name(text: str) -> str | None:
    """The exception's name when ``text`` is a traceback's final line (``KeyError: 'x'``, ``AssertionError``)."""
    m = _EXC_LINE.match(text)
    if m is None:
        return None
    name = m.group("name")
    last = name.rsplit(".", 1)[-1]
    if not last[:1].isupper():
        return None
    # Python prints non-builtin exceptions with their module (``torch.OutOfMemoryError``); builtins and
    # most others end in Error/Exception/...: a bare ``INFO: saving`` from another writer is neither.
    if "." not in name and not _EXC_SUFFIX.search(last):
        return None
    if m.group("colon") is None and not _EXC_SUFFIX.search(last):
        return None
    return name


def _is_frame(body: str) -> bool:
    return not body.strip() or body[:1].isspace() or body.startswith(_FRAME_START)


def _traceback_prefix(text: str, at: int) -> str:
    """A logging prefix before ``Traceback`` is repeated on each line; box drawing (rich) is not a prefix."""
    prefix = text[:at]
    return prefix if any(ch.isalnum() for ch in prefix) else ""


def _candidate_lines(lines: list[_Line], union: tuple[str, ...] | None) -> set[int] | None:
    """Lines holding any needle, found by one C-level ``str.find`` sweep per needle over the whole text
    (most lines of a training log hold none, and per-line checks in Python cost more than the regexes)."""
    if union is None:
        return None
    lows = [line.text.lower() for line in lines]
    starts: list[int] = []
    pos = 0
    for low in lows:
        starts.append(pos)
        pos += len(low) + 1
    joined = "\n".join(lows)
    hits: set[int] = set()
    for needle in union:
        at = joined.find(needle)
        while at >= 0:
            idx = bisect_right(starts, at) - 1
            hits.add(idx)
            at = joined.find(needle, starts[idx + 1]) if idx + 1 < len(starts) else -1
    return hits


def _scan(lines: list[_Line], patterns: Sequence[FailurePattern], union: tuple[str, ...] | None) -> list[_Match]:
    """One pass: pattern matches per line, Python tracebacks per stream, torchrun summaries."""
    matches: list[_Match] = []
    candidates = _candidate_lines(lines, union)
    open_tb: dict[str, _Traceback] = {}
    skip_until = -1  # inside a torchrun ChildFailedError summary: only its root cause counts
    if lines and lines[0].text[:1].isspace() and any(ln.text.lstrip().startswith('File "') for ln in lines[:3]):
        open_tb[lines[0].stream] = _Traceback(0, "")  # the tail starts inside a traceback (header cut off)

    for line in lines:
        if line.idx <= skip_until:
            continue
        text = line.text
        tb = open_tb.get(line.stream)
        if tb is not None:
            body: str | None = text
            if tb.prefix:
                if text.startswith(tb.prefix):
                    body = text[len(tb.prefix):]
                elif tb.lines == 0:
                    tb.prefix = ""  # the prefix was on the header line only
                else:
                    body = None  # another writer's line in the middle: match it normally
            if body is not None:
                tb.lines += 1
                if tb.lines > TRACEBACK_MAX_LINES:
                    del open_tb[line.stream]
                elif _is_frame(body):
                    line.frame = True
                    continue
                else:
                    name = _exception_name(body.strip())
                    if name is not None:
                        del open_tb[line.stream]
                        known = candidates is None or line.idx in candidates
                        skip_until = _add_exception(lines, line, body, name, tb.start, patterns if known else (),
                                                    matches)
                        continue
        tb_at = _TRACEBACK.search(text)
        if tb_at is not None:
            open_tb[line.stream] = _Traceback(line.idx, _traceback_prefix(text, tb_at.start()))
            continue
        if candidates is not None and line.idx not in candidates:
            continue
        found = _best_match(text, patterns, None)
        if found is None:
            continue
        pat, cls = found
        matches.append(_Match(line.idx, line.idx, pat, cls, pat.priority, pat.generic, pat.label,
                              rank=line.rank, overrides=pat.overrides))
        if "ChildFailedError" in text:
            skip_until = _torchrun_summary(lines, line, matches)
    return matches


def _add_exception(lines: list[_Line], line: _Line, body: str, name: str, start: int,
                   patterns: Sequence[FailurePattern], matches: list[_Match]) -> int:
    """A traceback's final line: evidence by the table if a pattern knows it, else a Python exception."""
    found = _best_match(body, patterns, None)
    if found is None:
        cls = FC.CANCELLED if name.endswith("KeyboardInterrupt") else FC.PYTHON_EXCEPTION
        matches.append(_Match(line.idx, start, None, cls, CAUSE, False, f"Python exception {name}", rank=line.rank))
        return -1
    pat, cls = found
    matches.append(_Match(line.idx, start, pat, cls, pat.priority, pat.generic, pat.label,
                          rank=line.rank, overrides=pat.overrides))
    if "ChildFailedError" in body:
        return _torchrun_summary(lines, line, matches)
    return -1


def _summary_end(lines: list[_Line], start: int) -> int:
    """Index of the closing ``=====`` rule of a torchrun summary that starts at ``start``."""
    rules = 0
    for line in lines[start + 1:start + 400]:
        if _RULE.match(line.text):
            rules += 1
            if rules == 2:
                return line.idx
    return start


def _torchrun_summary(lines: list[_Line], line: _Line, matches: list[_Match]) -> int:
    """torchrun's ``ChildFailedError`` summary: replace its echo by the root cause it names (host,
    rank, exit code, traceback). Returns the index of the summary's last line (skipped after)."""
    end = _summary_end(lines, line.idx)
    head = next((p.idx for p in lines[line.idx + 1:end + 1] if _ROOT_CAUSE.search(p.text)), None)
    if head is None:
        return end
    fields: dict[str, tuple[int, str]] = {}
    tb_lines: list[_Line] = []
    for probe in lines[head + 1:end]:
        m = _FIELD.match(probe.text)
        if m is not None and m.group(1) not in fields:
            fields[m.group(1)] = (probe.idx, m.group(2).strip())
        elif "traceback" in fields and probe.text.strip():
            tb_lines.append(probe)
    code_m = re.match(r"(-?\d+)", fields.get("exitcode", (0, ""))[1])
    if code_m is None or int(code_m.group(1)) == 0:
        return end
    code = int(code_m.group(1))
    evidence = [fields["exitcode"][0]]
    if code < 0:
        cls = signal_class(-code)
        if "traceback" in fields:
            evidence.append(fields["traceback"][0])
    else:
        cls = FC.UNKNOWN  # the worker's own traceback, if printed, came earlier and is a cause
        if tb_lines:
            last = tb_lines[-1].text.strip()
            found = _best_match(last, DEFAULT_PATTERNS, None)
            if found is not None and not found[0].generic:
                cls = found[1]
            elif _exception_name(last):
                cls = FC.PYTHON_EXCEPTION
            evidence.append(tb_lines[-1].idx)
    host = fields.get("host", (0, ""))[1] or None
    rank_m = re.match(r"(\d+)", fields.get("rank", (0, ""))[1])
    if matches and matches[-1].line == line.idx:
        matches.pop()
    matches.append(_Match(evidence[0], head, None, cls, CONSEQUENCE, False, "torchrun summary: root cause",
                          extra=tuple(evidence[1:]), node=host, rank=int(rank_m.group(1)) if rank_m else None))
    return end


# ---------------------------------------------------------------------------------------------
# Choosing the first failure


def _refine(m: _Match, matches: list[_Match], pos: int, lines: list[_Line]) -> _Match:
    """A generic match takes the class of a specific cause on the next lines of the same stream."""
    stream = lines[m.line].stream
    limit = min(len(lines), m.line + 1 + REFINE_WINDOW * 8)  # other streams may interleave
    in_stream = {ln.idx for ln in lines[m.line + 1:limit] if ln.stream in (stream, "")}
    window = sorted(in_stream)[:REFINE_WINDOW]
    last = window[-1] if window else m.line
    for other in matches[pos + 1:]:
        if other.line > last:
            break
        if other.line == m.line or other.line not in in_stream:
            continue
        if other.generic or other.priority > CONSEQUENCE:
            continue
        return _Match(m.line, m.start, other.pattern, other.cls, other.priority, False, other.label,
                      extra=(other.line,) + other.extra, node=other.node or m.node, rank=m.rank,
                      overrides=other.overrides)
    return m


class _Steps:
    """The global step each line reports (shared patterns of supervisor.progress), computed once per line."""

    def __init__(self, lines: list[_Line], extractor: StepExtractor) -> None:
        self._lines, self._extractor = lines, extractor
        self._memo: dict[int, int | None] = {}

    def at(self, idx: int) -> int | None:
        if idx not in self._memo:
            line = self._lines[idx]
            self._memo[idx] = None if line.frame else self._extractor.extract(line.text)
        return self._memo[idx]

    def before(self, idx: int) -> int | None:
        """The last step reported on or before line ``idx``."""
        for i in range(min(idx, len(self._lines) - 1), -1, -1):
            step = self.at(i)
            if step is not None:
                return step
        return None

    def went_on_after(self, idx: int, floor: int | None) -> bool:
        """Two distinct later steps beyond ``floor``: training went on. (Ranks in lock step can each
        print one more step after a peer died, never two.)"""
        later: set[int] = set()
        for i in range(idx + 1, len(self._lines)):
            step = self.at(i)
            if step is not None and (floor is None or step > floor):
                later.add(step)
                if len(later) >= 2:
                    return True
        return False


def _choose(matches: list[_Match], lines: list[_Line], steps: _Steps) -> tuple[_Match | None, list[_Match]]:
    """The first failure, and the later ones set aside as its consequences."""
    if not matches:
        return None, []
    verdicts = [m for m in matches if m.priority == VERDICT]
    if verdicts:
        return verdicts[0], [m for m in matches if m is not verdicts[0]]

    candidates: list[_Match] = []
    seen_failure = False
    for pos, m in enumerate(matches):
        if m.generic:
            if seen_failure:
                continue  # the echo of a failure already seen (an abort after a watchdog timeout)
            m = _refine(m, matches, pos, lines)
        if m.cls == FC.PYTHON_EXCEPTION and m.pattern is None:
            if steps.went_on_after(m.line, steps.before(m.start)):
                continue  # a logged exception after which training went on: not what ended it
        candidates.append(m)
        if m.priority <= CONSEQUENCE:
            seen_failure = True
    if not candidates:
        return None, []
    top = min(c.priority for c in candidates)
    chosen = next(c for c in candidates if c.priority == top)
    for c in candidates:  # evidence that beats the chosen class wherever it appears
        if chosen.cls in c.overrides and c.priority <= CAUSE:
            chosen = c
            break
    return chosen, [c for c in candidates if c is not chosen]


# ---------------------------------------------------------------------------------------------
# classify


def _policy_action(cls: FailureClass, policy: Mapping[FailureClass, ClassPolicy] | None) -> Action:
    if cls == FC.COMPLETED:
        return Action.STOP  # nothing left to run; the run loop ends the run as complete
    table = policy if policy is not None else DEFAULT_POLICY
    return table.get(cls, DEFAULT_POLICY.get(cls, ClassPolicy())).action


def _locate(chosen: _Match, lines: list[_Line]) -> tuple[str | None, int | None]:
    node, rank = chosen.node, chosen.rank
    for idx in (chosen.line,) + chosen.extra:
        text = lines[idx].text
        for rx in _NODE_PATTERNS:
            m = rx.search(text)
            if m is None:
                continue
            node = node or m.group("node")
            if rank is None and "rank" in rx.groupindex and m.group("rank") is not None:
                rank = int(m.group("rank"))
    if rank is None:
        rank = lines[chosen.line].rank
    if node is None:  # srun names the node of each task that failed
        rx = _NODE_PATTERNS[0]
        own_failures: set[str] = set()
        for line in lines:
            m = rx.search(line.text)
            if m is None:
                continue
            if rank is not None and int(m.group("rank")) == rank:
                return m.group("node"), rank
            if not _SRUN_ECHO.search(line.text):
                own_failures.add(m.group("node"))
        if len(own_failures) == 1:  # one node reported a task's own failure: that is where it happened
            node = own_failures.pop()
    return node, rank


def _status_text(exit_code: int | None, sig: int | None) -> str:
    if sig is not None:
        return f"killed by {signal_name(sig)}"
    if exit_code is None:
        return "exit status unknown"
    return f"exit status {exit_code}"


def classify(
    exit_code: int | None,
    signal: int | None,
    output_tail: str,
    *,
    policy: Mapping[FailureClass, ClassPolicy] | None = None,
    step_regex: str | None = None,
    patterns: Sequence[FailurePattern] | None = None,
) -> Failure:
    """Classify an ended attempt from how it ended and the end of its output.

    ``exit_code``/``signal``: the child's status (``signal`` set when it died of one; ``exit_code`` may
    be None then, or unknown altogether). ``step_regex``: the user's step pattern (default: the
    shared patterns of :mod:`supervisor.progress`). ``patterns``: a replacement evidence table.
    Exit 0 is ``completed`` unless the scheduler's own message says the job was taken away.
    """
    if signal is None and exit_code is not None and exit_code < 0:  # subprocess's returncode -N
        exit_code, signal = None, -exit_code
    table = tuple(patterns) if patterns is not None else DEFAULT_PATTERNS
    union = _DEFAULT_UNION if patterns is None else _needle_union(table)
    text = output_tail or ""
    if len(text) > MAX_INPUT_CHARS:
        text = text[-MAX_INPUT_CHARS:]
    lines = _split_lines(text)
    extractor = StepExtractor(step_regex)
    matches = _scan(lines, table, union)
    steps = _Steps(lines, extractor)
    chosen, others = _choose(matches, lines, steps)
    sig, inferred = _signal_from_status(exit_code, signal)
    status = _status_text(exit_code, None if inferred else sig)

    def from_text(cls: FailureClass, reason: str, m: _Match) -> Failure:
        node, rank = _locate(m, lines)
        where = ", ".join(x for x in (f"node {node}" if node else "", f"rank {rank}" if rank is not None else "")
                          if x)
        lo = max(m.line - CONTEXT_BEFORE, 0)
        return Failure(cls, _policy_action(cls, policy),
                       evidence=tuple(_clean(lines[i].text) for i in sorted({m.line, *m.extra})),
                       context=tuple(_clean(ln.raw) for ln in lines[lo:m.line + CONTEXT_AFTER + 1]),
                       step=steps.before(m.start), node=node, rank=rank, exit_code=exit_code, signal=signal,
                       reason=reason.replace("{where}", f" ({where})" if where else ""))

    def from_status(cls: FailureClass, reason: str) -> Failure:
        evidence: tuple[str, ...] = ()
        if sig is not None and cls != FC.COMPLETED:
            evidence = (_status_text(None, sig) + (f" (exit status {exit_code})" if inferred else ""),)
        return Failure(cls, _policy_action(cls, policy), evidence=evidence,
                       step=steps.before(len(lines) - 1) if lines else None, exit_code=exit_code, signal=signal,
                       reason=reason)

    if exit_code == 0 and signal is None:
        if chosen is not None and chosen.priority == VERDICT and chosen.cls != FC.HOST_OOM:
            return from_text(chosen.cls, f"exit status 0, but {chosen.label}{{where}}: the allocation was taken away",
                             chosen)
        return from_status(FC.COMPLETED, "exit status 0: training finished")

    if chosen is not None and chosen.priority == ECHO and sig is not None and signal_class(sig) == FC.NATIVE_CRASH:
        # "Terminated" echoes next to a child that itself died of a fault: the fault is the cause.
        return from_status(FC.NATIVE_CRASH, f"{status}: {signal_name(sig)} is the cause; the output holds only "
                                            f"echoes ({chosen.label})")

    if chosen is not None:
        reason = f"first failure{{where}}: {chosen.label} ({_PRIORITY_NAMES[chosen.priority]}, line {chosen.line + 1})"
        also = sorted({o.cls.value for o in others if o.cls != chosen.cls})
        if also:
            reason += f"; also seen, taken as consequences: {', '.join(also)}"
        return from_text(chosen.cls, reason + f"; {status}", chosen)

    if sig is not None:
        how = f"exit status {exit_code} = 128+{sig} ({signal_name(sig)})" if inferred else status
        return from_status(signal_class(sig), f"{how} and no failure evidence in the output")
    if exit_code is None:
        return from_status(FC.UNKNOWN, "no exit status and no failure evidence in the output")
    return from_status(FC.UNKNOWN, f"exit status {exit_code} and no failure evidence in the output")


def with_class(failure: Failure, cls: FailureClass, reason: str,
               policy: Mapping[FailureClass, ClassPolicy] | None = None) -> Failure:
    """The same failure with a class the supervisor knows better (a stall it detected, a notice it got)."""
    return replace(failure, cls=cls, action=_policy_action(cls, policy), reason=reason)


# ---------------------------------------------------------------------------------------------
# decide


def _backoff(policy: ClassPolicy, consecutive: int) -> float:
    """Exponential backoff as tenacity computes it: ``backoff * 2**(n-1)``, capped at ``backoff_max``.
    (Imported here: classifying needs no tenacity, so ``classify`` also runs where only torch is.)"""
    from tenacity import RetryCallState, wait_exponential

    wait = wait_exponential(multiplier=policy.backoff, exp_base=2, min=0, max=policy.backoff_max)
    state = RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
    state.attempt_number = max(consecutive, 1)
    return float(wait(state))


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def decide(
    failure: Failure,
    history: Sequence[AttemptRecord],
    policy: Mapping[FailureClass, ClassPolicy] | None,
    now_allocation: str | None,
) -> Decision:
    """Restart, requeue or stop after ``failure``, by the class policy and the run's history.

    ``history``: the ledger of the *earlier* attempts, oldest first (``budget.ledger_from_events``
    without the attempt that produced ``failure``). The same class more than ``retries`` times in a
    row stops the run; a restart waits ``backoff * 2**(n-1)`` seconds (capped), n = how many times
    in a row. Attempts whose end is unknown (a killed supervisor) neither count nor break the streak.
    ``completed`` needs no decision: the run is over (this returns STOP with that reason).
    """
    cls = failure.cls
    if cls == FC.COMPLETED:
        return Decision(Action.STOP, "completed: training finished, nothing to restart")
    table = policy if policy is not None else DEFAULT_POLICY
    pol = table.get(cls, DEFAULT_POLICY.get(cls, ClassPolicy()))
    consecutive = 1
    for record in reversed(list(history)):
        rec_cls = getattr(record, "cls", None)
        if rec_cls is None:
            continue
        if FailureClass(rec_cls) != cls:
            break
        consecutive += 1
    in_alloc = ""
    if now_allocation is not None:
        same = sum(1 for r in history if getattr(r, "job_id", None) == now_allocation)
        in_alloc = f" (attempt {same + 1} of job {now_allocation})"
    evidence = f": {failure.evidence[0]}" if failure.evidence else ""
    if pol.action == Action.STOP:
        return Decision(Action.STOP, f"{cls.value}: policy says stop, a person must act{evidence}")
    restarts_allowed = pol.retries
    if consecutive > restarts_allowed:
        times = "once" if consecutive == 1 else f"{consecutive} times in a row"
        return Decision(Action.STOP, f"{cls.value} {times}; policy allows {restarts_allowed} "
                                     f"{pol.action.value}{'s' if restarts_allowed != 1 else ''}{evidence}")
    exclude: tuple[str, ...] = ()
    if pol.action == Action.REQUEUE:
        if pol.exclude_node and failure.node:
            exclude = (failure.node,)
        note = f", excluding {failure.node}" if exclude else ""
        return Decision(Action.REQUEUE, f"{cls.value} ({_ordinal(consecutive)} in a row, policy allows "
                                        f"{restarts_allowed}): requeue{note}{in_alloc}", 0.0, exclude)
    delay = _backoff(pol, consecutive)
    return Decision(Action.RESTART, f"{cls.value} ({_ordinal(consecutive)} in a row, policy allows "
                                    f"{restarts_allowed}): restart in place after {delay:g}s{in_alloc}", delay)

