"""The evidence table: which output lines mean which failure class, and at which priority.

How the table is used is described in :mod:`supervisor.failures` (the package docstring). Every
pattern carries lower-case ``needles`` (one of them is in every line it matches) and keeps its gaps
short and bounded (``.{0,N}``), so a 64 KiB line costs a few regex steps per needle hit, never a
quadratic scan.
"""

from __future__ import annotations

import re
import signal as _signal
from collections.abc import Callable
from dataclasses import dataclass

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


def launcher_signal_class(signum: int) -> FailureClass:
    """The class of one child's death by ``signum`` as the process that launched it reports it
    (torchrun's agent, mpirun, DeepSpeed's launcher, ``mp.spawn``, a DataLoader's main process).

    The launcher outlived the child, so a SIGKILL was aimed at that one process. Slurm (KillWait,
    scancel), the supervisor and a stall kill all kill the whole process group, launcher included,
    which then reports nothing; what kills one worker of a training is the kernel's OOM killer (it
    picks the largest process), or rarely a person's ``kill -9`` of one pid. So a SIGKILL reported by
    a launcher is ``host_oom``; a bare SIGKILL (exit 137, a shell's ``Killed``) stays ``killed``.
    """
    if signum == _signal.SIGKILL:
        return FC.HOST_OOM
    return signal_class(signum)


def _signal_from_status(exit_code: int | None, sig: int | None) -> tuple[int | None, bool]:
    """(signal, inferred): the signal the child died of; from 128+N only when N is a real signal."""
    if sig is not None:
        return sig, False
    if exit_code is not None and exit_code < 0:  # Python's returncode convention
        return -exit_code, False
    if exit_code is not None and 129 <= exit_code <= 128 + 31:
        return exit_code - 128, True
    return None, False


def _signum(name: str) -> int | None:
    """A signal number from ``SIGKILL``/``KILL``/``Signals.SIGKILL``/``9``."""
    name = name.strip().rsplit(".", 1)[-1].upper()
    if name.isdigit():
        return int(name)
    try:
        return int(_signal.Signals[name if name.startswith("SIG") else "SIG" + name])
    except KeyError:
        return None


# ---------------------------------------------------------------------------------------------
# The pattern table


Resolver = Callable[["re.Match[str]"], FailureClass | None]


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
    # Evidence a training can survive (a link flap NCCL rides out, a plugin that falls back to
    # sockets): it counts only when training did not go on after it (as a logged Python exception).
    transient: bool = False
    # A better label when the resolver gives this class (a launcher's SIGKILL is the OOM killer).
    class_labels: tuple[tuple[FailureClass, str], ...] = ()
    # A launcher's report of how one child died (torchrun, mpirun, ...): it says how and where, not
    # why, so after a generic line (``Segmentation fault``) it only adds the rank and node.
    child_report: bool = False
    # A survivor's reaction to a peer that went away (connection reset, remote process exited, a
    # collective timed out): not a cause when the launcher names another rank that died first.
    peer_reaction: bool = False

    def resolve(self, match: re.Match[str]) -> FailureClass | None:
        return self.cls if isinstance(self.cls, FailureClass) else self.cls(match)

    def label_for(self, cls: FailureClass) -> str:
        """The label a person reads for this evidence resolved to ``cls``."""
        return next((text for c, text in self.class_labels if c == cls), self.label)


def _by_signum(m: re.Match[str]) -> FailureClass | None:
    return signal_class(int(m.group(1)))


def _by_signame(m: re.Match[str]) -> FailureClass | None:
    num = _signum(m.group(1))
    return FC.NATIVE_CRASH if num is None else signal_class(num)


def _by_launcher_code(m: re.Match[str]) -> FailureClass | None:
    """A launcher's report of a child's status: ``-N`` = died of signal N, ``N > 0`` = exited N."""
    code = int(m.group("code"))
    if code < 0:
        return launcher_signal_class(-code)
    return FC.UNKNOWN if code else None


def _by_launcher_signal(m: re.Match[str]) -> FailureClass | None:
    num = _signum(m.group("sig"))
    return None if num is None else launcher_signal_class(num)


_SIGNAL_WORDS = {
    "segmentation fault": FC.NATIVE_CRASH, "bus error": FC.NATIVE_CRASH, "aborted": FC.NATIVE_CRASH,
    "illegal instruction": FC.NATIVE_CRASH, "floating point exception": FC.NATIVE_CRASH,
    "killed": FC.KILLED, "terminated": FC.KILLED,
}


def _by_signal_words(m: re.Match[str]) -> FailureClass | None:
    return _SIGNAL_WORDS.get(m.group(1).strip().lower(), FC.NATIVE_CRASH)


def _by_slurm_signal(m: re.Match[str]) -> FailureClass | None:
    """A signal Slurm sent the step, by strsignal name (``Terminated``): from outside, so ``killed``
    (``Interrupt``: a person's ``scancel --signal=INT``)."""
    return FC.CANCELLED if m.group(1).lower() in ("interrupt", "sigint", "int") else FC.KILLED


def _by_worker_signal_words(m: re.Match[str]) -> FailureClass | None:
    """A DataLoader worker's death as its main process reports it (``Killed`` = the OOM killer)."""
    word = m.group(1).strip().lower()
    return FC.HOST_OOM if word == "killed" else _SIGNAL_WORDS.get(word, FC.NATIVE_CRASH)


# Xid numbers an application provokes (13 graphics engine exception, 31 MMU fault, 43 channel reset,
# 45 preemptive cleanup after another fault): not the GPU's fault. Every other Xid is hardware or driver.
_APP_XIDS = frozenset({13, 31, 43, 45, 68, 69})


def _by_xid(m: re.Match[str]) -> FailureClass | None:
    return None if int(m.group(1)) in _APP_XIDS else FC.HARDWARE_FAULT


_GPU_HW_OVERRIDES = frozenset({FC.ILLEGAL_MEMORY_ACCESS, FC.CUDA_LAUNCH_FAILURE, FC.NCCL_ERROR, FC.INTERCONNECT,
                               FC.NATIVE_CRASH, FC.KILLED, FC.UNKNOWN})
_ASSERT_OVERRIDES = frozenset({FC.ILLEGAL_MEMORY_ACCESS, FC.CUDA_LAUNCH_FAILURE, FC.NCCL_ERROR, FC.NATIVE_CRASH,
                               FC.PYTHON_EXCEPTION, FC.KILLED, FC.UNKNOWN})
_SHM_OVERRIDES = frozenset({FC.NATIVE_CRASH, FC.PYTHON_EXCEPTION, FC.NCCL_ERROR, FC.KILLED, FC.UNKNOWN})

_SLURM_CANCEL = r"\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT \S+"
_SRUN_TASK = r"srun: error: \S+: tasks? [\d,\-\[\] ]+: "
_DATALOADER = r"DataLoader worker \(pids?\(?s?\)? [^)]*\)\)? "

# What a person reads when a launcher reports one child SIGKILLed (see launcher_signal_class).
_OOM_KILLED_CHILD = ("SIGKILLed while its launcher ran on: the kernel's OOM killer (Slurm, the supervisor and "
                     "a stall kill take the launcher too)")
TORCHRUN_SUMMARY_LABEL = "torchrun summary: root cause"
TORCHRUN_SUMMARY_OOM_LABEL = f"torchrun summary: the root-cause worker was {_OOM_KILLED_CHILD}"


def _p(cls: FailureClass | Resolver, regex: str, priority: int, label: str, needles: tuple[str, ...], *,
       ignore_case: bool = False, generic: bool = False, transient: bool = False,
       overrides: frozenset[FailureClass] = frozenset(), oom_label: str | None = None,
       peer_reaction: bool = False) -> FailurePattern:
    """One row; ``oom_label`` marks a launcher's report of a child's death (its SIGKILL is host_oom)."""
    return FailurePattern(cls, re.compile(regex, re.IGNORECASE if ignore_case else 0), priority, label,
                          generic=generic, overrides=overrides, needles=needles, transient=transient,
                          class_labels=((FC.HOST_OOM, oom_label),) if oom_label else (),
                          child_report=oom_label is not None, peer_reaction=peer_reaction)


# Order matters only between patterns that match the same line (see scan._best_match).
DEFAULT_PATTERNS: tuple[FailurePattern, ...] = (
    # --- VERDICT: the scheduler or the kernel says how it ended -------------------------------------
    _p(FC.PREEMPTED, _SLURM_CANCEL + r" DUE TO PREEMPTION", VERDICT,
       "Slurm preempted the job (a higher-priority job took its nodes)", ("cancelled at",), ignore_case=True),
    _p(FC.PREEMPTED, _SLURM_CANCEL + r" DUE TO JOB REQUEUE", VERDICT,
       "Slurm requeued the running job (scontrol requeue or a preemption): it comes back", ("cancelled at",),
       ignore_case=True),
    _p(FC.TIME_LIMIT, _SLURM_CANCEL + r" DUE TO TIME LIMIT", VERDICT, "Slurm cancelled the job at its time limit",
       ("cancelled at",), ignore_case=True),
    _p(FC.NODE_FAILURE, _SLURM_CANCEL + r" DUE TO NODE FAIL", VERDICT, "Slurm cancelled the job: a node failed",
       ("cancelled at",), ignore_case=True),
    _p(FC.NODE_FAILURE, r"srun: error: Node failure on \S+", VERDICT, "srun: a node of the step failed",
       ("node failure on",)),
    _p(FC.CANCELLED, r"\*\*\* JOB \S+ ON \S+ CANCELLED AT \S+ \*\*\*", VERDICT,
       "Slurm cancelled the job (scancel by a person or an administrator)", ("cancelled at",)),
    _p(FC.HOST_OOM, r"Detected \d+ oom[-_]kill event", VERDICT, "Slurm: the kernel's OOM killer killed a task",
       ("oom",), ignore_case=True),
    _p(FC.HOST_OOM, _SRUN_TASK + r"Out Of Memory", VERDICT, "srun: a task ran out of host memory (OOM kill)",
       ("out of memory",)),
    _p(FC.HOST_OOM, r"(?:Memory cgroup )?out of memory: Kill(?:ed)? process", VERDICT,
       "the kernel's OOM killer killed a process", ("out of memory",), ignore_case=True),
    _p(FC.HOST_OOM, r"\binvoked oom-killer\b|\boom[-_]kill(?:er)?\b.{0,200}\b(?:event|killed|process)", VERDICT,
       "the kernel's OOM killer", ("oom",), ignore_case=True),
    _p(FC.HOST_OOM, r"slurmstepd\S*: (?:error: )?Exceeded (?:job|step) memory limit", VERDICT,
       "Slurm: the step exceeded its memory limit", ("exceeded",)),
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
    # --- CAUSE: GPU and node hardware (GPU faults beat the CUDA/NCCL/network errors they cause) ------
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
    # --- CAUSE: the interconnect (InfiniBand/RoCE verbs, libfabric EFA/CXI, UCX) ----------------------
    # A transport that failed under NCCL or MPI: the fabric, a NIC or a link, not the training code.
    # NCCL's own "remote process exited or there was a network error" names no cause (a peer that
    # died looks the same) and stays nccl_error below; its "Last error:" line, matched here, decides.
    _p(FC.INTERCONNECT, r"\bGot completion (?:from peer \S+ )?with (?:error|status)\b", CAUSE,
       "InfiniBand/RoCE completion error (NCCL NET/IB)", ("got completion",)),
    _p(FC.INTERCONNECT, r"\bGot async event\b|\basync fatal event\b", CAUSE,
       "InfiniBand/RoCE async event (NCCL NET/IB: port error, catastrophic error)", ("async event", "async fatal"),
       transient=True),
    _p(FC.INTERCONNECT, r"transport retry count(?:er)? exceeded|\bIBV_WC_(?!SUCCESS\b)[A-Z_]+_ERR\b"
                        r"|local catastrophic error|\bdetected in ncclIb\w+",
       CAUSE, "InfiniBand/RoCE transport error",
       ("retry count", "ibv_wc_", "catastrophic", "detected in ncclib"), ignore_case=True),
    _p(FC.INTERCONNECT, r"\bCall to ibv_\w+ failed|\bibv_\w+(?:\(\))? failed\b", CAUSE,
       "InfiniBand verbs call failed", ("ibv_",), transient=True),
    _p(FC.INTERCONNECT, r"\bUCX\s+(?:ERROR|FATAL)\b.{0,80}?(?:Endpoint timeout|[Rr]emote (?:access|operation) error"
                        r"|Connection reset by remote peer|[Rr]emote access error)",
       CAUSE, "UCX transport error", ("ucx",)),
    _p(FC.INTERCONNECT, r"NET/OFI\b.{0,80}?(?:completed with error|\bfi_\w+ failed|[Uu]nexpected status"
                        r"|[Cc]ouldn't open|[Uu]nable to (?:post|register|open|create))",
       CAUSE, "libfabric error (NCCL NET/OFI: EFA, CXI)", ("net/ofi",), transient=True),
    _p(FC.INTERCONNECT, r"libfabric:[\d:]*:(?:efa|cxi|verbs)\b.{0,200}?(?:\bprov_err\b|\bRC_[A-Z][A-Z_]{4,}\b)",
       CAUSE, "libfabric provider error (EFA, CXI)", ("libfabric",)),
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
    _p(_by_worker_signal_words, _DATALOADER + r"is killed by signal: ([A-Za-z ]+)", CAUSE,
       "DataLoader worker killed by a signal", ("dataloader worker",),
       oom_label=f"a DataLoader worker was {_OOM_KILLED_CHILD}"),
    _p(FC.UNKNOWN, _DATALOADER + r"exited unexpectedly", CONSEQUENCE, "DataLoader worker exited unexpectedly",
       ("dataloader worker",)),
    _p(FC.NATIVE_CRASH, r"Unexpected (?:segmentation fault|floating-point exception|bus error) encountered in worker",
       CAUSE, "DataLoader worker crashed", ("encountered in worker",)),
    _p(FC.CANCELLED, r"^KeyboardInterrupt\b|srun: (?:sending Ctrl-C|interrupt \(one more within)", CAUSE,
       "interrupted (Ctrl-C)", ("keyboardinterrupt", "srun: ")),
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
        "communicator was aborted", "heartbeat monitor", "connection closed by remote peer"), peer_reaction=True),
    _p(FC.NCCL_ERROR, r"(?:DistNetworkError|DistStoreError|TCPStore|c10d|gloo).*(?:Connection reset by peer"
                      r"|Connection closed by peer|Broken pipe|Connection refused|timed out)",
       CONSEQUENCE, "distributed peer lost", ("distnetworkerror", "diststoreerror", "tcpstore", "c10d", "gloo"),
       ignore_case=True, peer_reaction=True),
    # Launchers reporting how one child died (the child's own output, if any, is a cause elsewhere).
    _p(_by_launcher_signal, r"Signal (?P<sig>\d+) \(SIG\w+\) received by PID", CONSEQUENCE,
       "torchrun: a worker died of a signal", ("received by pid",),
       oom_label=f"torchrun: a worker was {_OOM_KILLED_CHILD}"),
    _p(_by_launcher_code, r"^\s*exitcode\s*:\s*(?P<code>-?\d+) \(pid", CONSEQUENCE, "torchrun: worker exit",
       ("exitcode",), oom_label=f"torchrun: a worker was {_OOM_KILLED_CHILD}"),
    _p(_by_launcher_signal, r"(?:mpirun|mpiexec|prterun) noticed that process rank \d+ with PID \S+ on node \S+"
                            r" exited on signal (?P<sig>\d+)",
       CONSEQUENCE, "mpirun: a rank died of a signal", ("noticed that process rank",),
       oom_label=f"mpirun: a rank was {_OOM_KILLED_CHILD}"),
    _p(_by_launcher_signal, r"ProcessExitedException: process \d+ terminated with signal (?P<sig>SIG[A-Z]+)",
       CONSEQUENCE, "torch.multiprocessing.spawn: a process died of a signal", ("terminated with signal",),
       oom_label=f"mp.spawn: a process was {_OOM_KILLED_CHILD}"),
    _p(_by_launcher_signal, r"died with <Signals\.(?P<sig>SIG[A-Z]+): \d+>", CONSEQUENCE,
       "launcher: a child died of a signal", ("died with <signals.",),
       oom_label=f"launcher: a child was {_OOM_KILLED_CHILD}"),
    _p(_by_launcher_code, r"\bexits with return code = (?P<code>-?\d+)", CONSEQUENCE,
       "DeepSpeed launcher: a rank exited", ("exits with return code",),
       oom_label=f"DeepSpeed launcher: a rank was {_OOM_KILLED_CHILD}"),
    _p(_by_slurm_signal, r"\*\*\* STEP \S+ ON \S+ CANCELLED AT \S+ DUE TO SIGNAL (\w+)", CONSEQUENCE,
       "Slurm signalled the step (a preemption or time-limit warning, or scancel --signal)", ("cancelled at",),
       ignore_case=True),
    _p(FC.NODE_FAILURE, r"STEPD TERMINATED ON \S+ AT \S+ DUE TO JOB NOT ENDING WITH SIGNALS", CONSEQUENCE,
       "processes could not be killed (node is being drained)", ("stepd terminated",)),
    # --- ECHO: something died; the cause is elsewhere -----------------------------------------------
    _p(_by_launcher_code, r"failed \(exitcode: (?P<code>-?\d+)\) local_rank:", ECHO, "torchrun: worker failed",
       ("exitcode",), oom_label=f"torchrun: a worker was {_OOM_KILLED_CHILD}"),
    _p(FC.UNKNOWN, r"\bChildFailedError\b", ECHO, "torchrun: a worker failed", ("childfailederror",)),
    _p(FC.UNKNOWN, r"\bRendezvousClosedError\b", ECHO,
       "torchrun: the rendezvous was closed (another node's agent failed, finished or was stopped)",
       ("rendezvousclosederror",)),
    _p(_by_signal_words, _SRUN_TASK + r"(Killed|Terminated)\b", ECHO,
       "srun: a task was killed from outside (Slurm, a person, or srun after another task failed)",
       ("killed", "terminated")),
    _p(_by_signal_words, r"(?:^\s*|:\s+(?:line \d+:\s+)?\d+\s+)(Killed|Terminated)\b(?!\s+process)", ECHO,
       "the shell reports the process killed from outside (no OOM evidence in the output)",
       ("killed", "terminated")),
    _p(_by_signum, r"SignalException: Process \d+ got signal: (\d+)", ECHO,
       "torchrun's agent was sent a signal", ("signalexception",)),
    _p(_by_signame, r"Received (?:Signals\.)?(\w+) death signal, shutting down workers", ECHO,
       "torchrun's agent was sent a signal and stopped its workers", ("death signal",)),
    _p(FC.KILLED, r"Received SIGTERM|Bypassing SIGTERM", ECHO, "SIGTERM received", ("sigterm",)),
    _p(FC.UNKNOWN, _SRUN_TASK + r"Exited with exit code (\d+)", ECHO, "srun: a task exited with an error",
       ("exited with exit code",)),
    _p(FC.UNKNOWN, r"srun: Terminating (?:job step|StepId=)|" + _SLURM_CANCEL + r" DUE TO TASK FAILURE", ECHO,
       "srun ended the step because one of its tasks failed", ("srun: terminating", "task failure"),
       ignore_case=True),
    _p(FC.UNKNOWN, r"(?:mpirun|mpiexec) detected that one or more processes exited with non-zero status", ECHO,
       "mpirun ended the job because a rank failed", ("detected that one or more processes",)),
    _p(FC.KILLED, r"srun: forcing job termination", ECHO,
       "srun was sent SIGTERM/SIGHUP (scancel, a time limit, a preemption or a closed terminal) and killed its "
       "tasks", ("forcing job termination",)),
    _p(FC.KILLED, r"srun: Job step aborted: Waiting up to \d+ seconds", ECHO,
       "srun was told the job is ending (cancelled, time limit, preemption or node failure)", ("job step aborted",)),
    _p(FC.KILLED, r"srun: Force Terminated (?:job|StepId=|step)", ECHO,
       "srun force-terminated its tasks: the job was ended while srun was being signalled", ("force terminated",)),
    _p(FC.CANCELLED, r"\*\*\* STEP \S+ ON \S+ CANCELLED AT \S+ \*\*\*", ECHO,
       "Slurm cancelled the step (scancel, or srun ending it after a task failed)", ("cancelled at",)),
)


# ---------------------------------------------------------------------------------------------
# Completion markers


@dataclass(frozen=True)
class CompletionMarker:
    """A line only a training that finished all its steps prints (read in classify: a kill after
    it, with nothing failing in between, is teardown, not a crash)."""

    regex: re.Pattern[str]
    label: str
    needles: tuple[str, ...]


COMPLETION_MARKERS: tuple[CompletionMarker, ...] = (
    CompletionMarker(re.compile(r"Local worker group finished \((?:WorkerState\.)?SUCCEEDED\)"
                                r"|\bworker group successfully finished\b"),
                     "torchrun: the local worker group SUCCEEDED", ("worker group",)),
    CompletionMarker(re.compile(r"`Trainer\.fit` stopped: `max_(?:steps|epochs)=\d+` reached"),
                     "Lightning: `Trainer.fit` stopped at max_steps/max_epochs", ("trainer.fit",)),
    CompletionMarker(re.compile(r"\bTraining completed\. Do not forget to share your model"
                                r"|^\s*Training completed\.\s*$"),
                     "Hugging Face Trainer: training completed", ("training completed",)),
    CompletionMarker(re.compile(r"""['"]train_runtime['"]\s*:\s*[\d.]+"""),
                     "Hugging Face Trainer: the final train metrics (train_runtime)", ("train_runtime",)),
)
