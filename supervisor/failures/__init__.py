"""Classify how an attempt ended, from its exit status and the tail of its output.
Pure: text and numbers in, frozen dataclasses with a ``reason`` out.

The class comes from the **first** failure in the output, not the last: a watchdog abort after an
illegal memory access is an illegal memory access; ``task 0: Terminated`` after ``task 1:
Segmentation fault`` is a segfault; and a CUDA error in PyTorch is a Python exception with exit
status 1, so the text decides, never the exit code alone.

How the first failure is found (the table :data:`DEFAULT_PATTERNS` holds the evidence):

* Every pattern has a *priority*. ``VERDICT`` (0): the scheduler or the kernel says how the job
  ended (preemption, time limit, node failure, OOM kill, a person's scancel); it wins wherever it
  appears, because the allocation is gone whatever the training printed while it was being taken.
  But a preemption, time limit or node failure counts only when Slurm confirms it (``slurm=``, a
  :class:`SlurmEvidence` built from the notice and the job record): any program can print Slurm's
  line, so unconfirmed it is set aside and recorded as ``Failure.text_claim``.
  ``CAUSE`` (1): a root cause (a CUDA error, a segfault, a Python exception, a network error).
  ``CONSEQUENCE`` (2): what a failure elsewhere leads to (NCCL watchdog timeouts, a peer's lost
  connection, a launcher's report of how one worker died: torchrun's ``ChildFailedError`` summary,
  ``mpirun noticed that process rank 3 ... exited on signal 11``). ``ECHO`` (3): a bare report that
  something died or was stopped (``Terminated``, ``Killed``, ``Exited with exit code 1``, torchrun's
  agent ``Received 15 death signal``, srun's ``Force Terminated``). The lowest priority present
  decides; within it, the first line in the output wins. So a rank or an agent that was stopped
  because a sibling crashed takes the sibling's class: its own end is an echo.
* A *generic* pattern names only a signal or an abort (``terminate called after throwing``,
  ``Segmentation fault``, ``NCCL error``). A specific cause on the next lines of the same stream
  refines it (``what():  CUDA error: an illegal memory access``), and a generic line that comes
  after any cause or consequence is that failure's echo, not a new failure.
* A few causes *override* others wherever they appear: a device-side assert beats the illegal memory
  access it provokes; a full ``/dev/shm`` beats the bus error it raises; a GPU hardware fault (ECC,
  Xid, fallen off the bus) beats the CUDA, NCCL and network errors it causes. And a worker that
  torchrun's summary names as the first to fail, dead of SIGSEGV/SIGBUS/SIGILL/SIGFPE, beats another
  rank's ``Connection reset by peer`` or NCCL lost-peer/timeout error (both ranks named), printed
  earlier only because the survivor noticed first; a fabric error (InfiniBand, UCX, EFA) still wins.
* A Python traceback counts by its final exception line: the root cause of a chain is printed
  first. A traceback after which training went on (later step reports) was not fatal and is ignored;
  so is *transient* evidence (an InfiniBand port flap, a network plugin that fell back to sockets).
* With no evidence in the text, the exit status decides (signal N, or 128+N when plausible).

Some classes need care:

* ``host_oom``: the kernel's or Slurm's OOM messages, a ``MemoryError``, or one worker SIGKILLed
  while the launcher that started it ran on to report it (torchrun's ``exitcode: -9``, mpirun's
  ``exited on signal 9``, a DataLoader worker ``killed by signal: Killed``): Slurm, the supervisor
  and a stall kill take the whole process group, launcher included, so only the OOM killer kills
  one worker (:func:`launcher_signal_class`). A bare SIGKILL (exit 137, a shell's ``Killed``) with
  no such evidence stays ``killed``.
* ``interconnect``: InfiniBand/RoCE verbs errors, libfabric (EFA, CXI) and UCX transport errors.
  NCCL's ``remote process exited or there was a network error`` alone stays ``nccl_error`` (a peer
  that died looks the same); its ``Last error:`` line, when it names the network, decides.
* ``completed`` after a kill: a child killed from outside (or of unknown status) after the training
  printed that it finished (torchrun's worker group SUCCEEDED, Lightning's ``max_steps`` reached,
  the Hugging Face Trainer's ``Training completed.``/``train_runtime``), with nothing but the kill's
  own echoes after that line, is a kill at teardown, not a crash to restart.

Output is read line by line, with ``\\r`` progress-bar redraws split, ANSI colours removed, and
``srun --label`` / ``[rank3]:`` / ``[default0]:`` / ``mpirun --tag-output`` prefixes taken off (they
name the rank). The step is the last *global* step reported before the first error, read with the
shared patterns of :mod:`supervisor.progress` (a per-epoch progress bar is progress, not a step: None
rather than a wrong number). Work is linear in the input: each pattern carries literal ``needles``,
one ``str.find`` sweep per needle picks the few lines worth a regex; lines over 64 KiB are cut and
input over 8 MiB keeps its end.

Modules: :mod:`.classes` (the one table of every class's traits: default policy, node fault, node
ledger, budgets), :mod:`.patterns` (the evidence table, the completion markers and the signal classes),
:mod:`.scan` (reading the text, choosing the first failure), :mod:`.classifier` (the result),
:mod:`.evidence` (what Slurm says: a preemption, time limit or node failure printed in the text
counts only when the scheduler confirms it; node evidence only within the job's allocation). A
:class:`Failure` says what happened, never what to do: that is decided once, in
:mod:`supervisor.run.judge`, through :mod:`supervisor.policy`. This package imports only ``states``,
``signals`` and ``progress``: no policy, no config, no budget.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..signals import parse_signal, signal_name
    from .classifier import Failure, classify, with_class
    from .evidence import SCHEDULER_CLASSES, NodeEvidence, SlurmEvidence, confirmed, evidence_node
    from .patterns import (
        CAUSE,
        COMPLETION_MARKERS,
        CONSEQUENCE,
        DEFAULT_PATTERNS,
        ECHO,
        VERDICT,
        CompletionMarker,
        FailurePattern,
        launcher_signal_class,
        signal_class,
    )

# Loaded on first use (PEP 562): the policy, the ledgers and the config import the table in
# ``.classes``, and that must not compile the classifier's patterns in every ``supervise`` command.
# (No submodule shares a name with what it exports, so ``failures.classify`` is always the function.)
_HOME = {
    **dict.fromkeys(("parse_signal", "signal_name"), "..signals"),
    **dict.fromkeys(("Failure", "classify", "with_class"), ".classifier"),
    **dict.fromkeys(("SCHEDULER_CLASSES", "NodeEvidence", "SlurmEvidence", "confirmed", "evidence_node"),
                    ".evidence"),
    **dict.fromkeys(("CAUSE", "COMPLETION_MARKERS", "CONSEQUENCE", "DEFAULT_PATTERNS", "ECHO", "VERDICT",
                     "CompletionMarker", "FailurePattern", "launcher_signal_class", "signal_class"), ".patterns"),
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(home, __name__)
    for other, where in _HOME.items():
        if where == home:
            globals()[other] = getattr(module, other)
    return globals()[name]


__all__ = [
    "CAUSE",
    "COMPLETION_MARKERS",
    "CONSEQUENCE",
    "DEFAULT_PATTERNS",
    "ECHO",
    "VERDICT",
    "CompletionMarker",
    "Failure",
    "FailurePattern",
    "NodeEvidence",
    "SCHEDULER_CLASSES",
    "SlurmEvidence",
    "confirmed",
    "evidence_node",
    "classify",
    "launcher_signal_class",
    "parse_signal",
    "signal_class",
    "signal_name",
    "with_class",
]
