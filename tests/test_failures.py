"""Failure classification (supervisor.failures.classifier) and restart decisions (supervisor.policy.decide).

The log fixtures under tests/data/logs/ are real logs quoted in public issues (listed with their
source in tests/data/logs/SOURCES.md), real output from our own GPU runs (``h200_real_*``), or modelled
on the formats of real public reports (PyTorch, NCCL, torchrun/torchelastic, Slurm, DataLoader,
faulthandler, glibc, UCX): multi-rank interleaving, ``srun --label`` and ``[rankN]:`` prefixes, tqdm
``\\r`` redraws, ANSI colours. The crashers under tests/crashers/ are real child processes that crash in
real ways; their real output and status are classified. Short texts in the unit tests below are
quoted from those logs or built from their line formats, to pin one ordering each.
"""

from __future__ import annotations

import json
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.budget import AttemptRecord
from supervisor.config import DEFAULT_POLICY, ClassPolicy
from supervisor.failures import (
    SCHEDULER_CLASSES,
    confirmed,
    DEFAULT_PATTERNS,
    Failure,
    classify,
    parse_signal,
    signal_class,
    with_class,
)
from supervisor.policy import decide
from supervisor.states import Action
from supervisor.states import FailureClass as FC

LOGS = Path(__file__).parent / "data" / "logs"
CRASHERS = Path(__file__).parent / "crashers"

# (fixture, exit_code, signal, class, evidence substring, step, node, rank). None = "must be None".
CASES = [
    # first failure wins: the CUDA error on one rank, not the watchdog timeouts and aborts it causes
    ("ima_accelerator_error_ddp_rank_prefix.log", 1, None, FC.ILLEGAL_MEMORY_ACCESS,
     "torch.AcceleratorError: CUDA error: an illegal memory access", 1200, None, 2),
    ("ima_runtimeerror_then_watchdog_abort.log", 134, None, FC.ILLEGAL_MEMORY_ACCESS,
     "RuntimeError: CUDA error: an illegal memory access", 41900, None, None),
    ("terminate_c10_error_ima.log", None, signal.SIGABRT, FC.ILLEGAL_MEMORY_ACCESS,
     "what():  CUDA error: an illegal memory access", 1024, None, None),
    ("crlf_srun_label_ima.log", 1, None, FC.ILLEGAL_MEMORY_ACCESS, "illegal memory access", 210, "gpu-q2", 0),
    # NCCL: timeouts only when nothing caused them
    ("nccl_watchdog_timeout_abort.log", 143, None, FC.NCCL_ERROR, "Watchdog caught collective operation timeout",
     9000, "gpu-a07", 1),
    ("nccl_watchdog_got_stuck.log", 134, None, FC.NCCL_ERROR, "Heartbeat monitor timed out", None, "gpu-c11", 5),
    ("nccl_unhandled_system_error.log", 1, None, FC.NCCL_ERROR, "unhandled system error", None, None, 7),
    ("nccl_unhandled_cuda_error_oom.log", 1, None, FC.CUDA_OOM, "Cuda failure 'out of memory'", None, None, None),
    # native crashes: srun -K's 143 hides the 139; faulthandler; glibc; UCX; tqdm debris
    ("srun_label_segv_then_terminated.log", 143, None, FC.NATIVE_CRASH,
     "srun: error: n2: task 1: Segmentation fault", 5000, "n2", 1),
    ("faulthandler_segfault_native_reader.log", None, signal.SIGSEGV, FC.NATIVE_CRASH,
     "Fatal Python error: Segmentation fault", 15230, None, None),
    ("glibc_double_free.log", 134, None, FC.NATIVE_CRASH, "double free or corruption", 3, None, None),
    ("mpirun_tag_output_ucx_segv.log", 139, None, FC.NATIVE_CRASH, "Caught signal 11 (Segmentation fault", 250,
     None, 0),
    ("tqdm_debris_then_segfault.log", 139, None, FC.NATIVE_CRASH, "Segmentation fault (core dumped)", 1500,
     None, None),
    ("logged_exception_then_segfault.log", 139, None, FC.NATIVE_CRASH, "Segmentation fault", 330, None, None),
    # torchrun summaries: the root cause, not the first entry listed
    ("torchrun_childfailed_sigsegv.log", 1, None, FC.NATIVE_CRASH, "Signal 11 (SIGSEGV) received by PID 28773",
     3000, "gpu-node-07.cluster.local", 0),
    ("torchrun_childfailed_root_cause_not_first_listed.log", 1, None, FC.NATIVE_CRASH, "exitcode  : -6 (pid: 5277)",
     None, "node-b2", 4),
    ("torchrun_worker_valueerror_then_summary.log", 1, None, FC.PYTHON_EXCEPTION,
     "ValueError: sequence of length 9011 exceeds max_seq_len=8192", 820, None, 0),
    ("torchrun_record_error_file_oom.log", 1, None, FC.CUDA_OOM, "torch.OutOfMemoryError: CUDA out of memory", None,
     "a100-node-3", 1),
    # device-side asserts win over the illegal memory accesses they provoke, even printed first
    ("device_assert_indexkernel_then_ima.log", 1, None, FC.DEVICE_ASSERT, "IndexKernel.cu:94", 77, None, 0),
    ("device_assert_after_ima_other_rank.log", 1, None, FC.DEVICE_ASSERT, "Assertion `srcIndex < srcSelectDimSize`",
     77, None, 0),
    ("device_assert_nll_loss.log", 1, None, FC.DEVICE_ASSERT, "Assertion `t >= 0 && t < n_classes` failed", None,
     None, None),  # the only counter is Lightning's per-epoch bar: progress, not a global step
    # CUDA OOM, launch failures
    ("cuda_oom_outofmemoryerror.log", 1, None, FC.CUDA_OOM, "torch.OutOfMemoryError: CUDA out of memory", 200,
     None, 3),
    ("cuda_oom_runtimeerror_old.log", 1, None, FC.CUDA_OOM, "RuntimeError: CUDA out of memory", 1500, None, None),
    ("tqdm_ansi_oom.log", 1, None, FC.CUDA_OOM, "torch.OutOfMemoryError: CUDA out of memory", 340, None, None),
    ("deepspeed_pdsh_prefix_oom.log", 1, None, FC.CUDA_OOM, "Tried to allocate 1.25 GiB", 40, None, 9),
    ("cuda_unspecified_launch_failure.log", 1, None, FC.CUDA_LAUNCH_FAILURE, "unspecified launch failure", 61050,
     None, None),
    ("triton_misaligned_address.log", 1, None, FC.CUDA_LAUNCH_FAILURE, "misaligned address", 7410, None, None),
    # hardware and node faults
    ("ecc_uncorrectable.log", 1, None, FC.HARDWARE_FAULT, "uncorrectable ECC error", 88000, "gpu-d04", None),
    ("xid79_fallen_off_bus.log", 1, None, FC.HARDWARE_FAULT, "CUDA error: unknown error", 20110, None, 6),
    ("cuda_unknown_error.log", 1, None, FC.HARDWARE_FAULT, "CUDA error: unknown error", 300, None, None),
    ("nvlink_uncorrectable.log", 1, None, FC.HARDWARE_FAULT, "uncorrectable NVLink error", 5120, None, 4),
    ("nccl_ib_completion_error.log", 1, None, FC.INTERCONNECT, "NET/IB : Got completion from peer", 3300,
     "gpu-e09", None),
    ("dataloader_bus_error_shm.log", 1, None, FC.SHM_EXHAUSTED, "insufficient shared memory (shm)", 12, None, None),
    ("shm_torch_file_no_space.log", 1, None, FC.SHM_EXHAUSTED, "No space left on device", 640, None, None),
    ("bus_error_then_shm_explanation.log", None, signal.SIGBUS, FC.SHM_EXHAUSTED, "out of shared memory", 18,
     None, None),
    # the scheduler
    ("slurm_preempted.log", 143, None, FC.PREEMPTED, "DUE TO PREEMPTION", 70400, "gpu-a12", None),
    ("exit0_preempted_lightning.log", 0, None, FC.PREEMPTED, "DUE TO PREEMPTION", None, "gpu-x1", None),
    ("slurm_time_limit.log", 143, None, FC.TIME_LIMIT, "DUE TO TIME LIMIT", 99100, "gpu-a12", None),
    ("slurm_node_failure.log", None, None, FC.NODE_FAILURE, "Node failure on gpu-b03", 4400, "gpu-b03", None),
    ("slurm_user_cancel.log", 143, None, FC.CANCELLED, "CANCELLED AT 2024-06-03T09:00:01 ***", 120, "gpu-a12",
     None),
    ("slurm_oom_kill_dataloader.log", 1, None, FC.HOST_OOM, "Detected 1 oom_kill event", 2210, "nid001277", None),
    ("slurm_oom_kill_old_cgroup.log", 137, None, FC.HOST_OOM, "oom-kill event(s)", None, "Orion-01-01", None),
    ("host_memoryerror.log", 1, None, FC.HOST_OOM, "Unable to allocate 149. GiB", 70, None, None),
    ("killed_137_bash.log", 137, None, FC.KILLED, "55123 Killed", 820, None, None),
    # Python exceptions: the root cause of a chain, from the first traceback
    ("python_exception_chained.log", 1, None, FC.PYTHON_EXCEPTION, "KeyError: 'tabby_cat'", 5, None, None),
    ("python_exception_direct_cause.log", 1, None, FC.PYTHON_EXCEPTION, "FileNotFoundError: [Errno 2]", None, None,
     None),
    ("rich_traceback_valueerror.log", 1, None, FC.PYTHON_EXCEPTION, "ValueError: loss is nan", 10, None, None),
    ("tail_starts_mid_traceback.log", 1, None, FC.PYTHON_EXCEPTION, "mat1 and mat2 shapes cannot be multiplied",
     None, None, None),
    ("keyboard_interrupt.log", 130, None, FC.CANCELLED, "KeyboardInterrupt", 44, None, None),
    # real output from the H200s (tests/crashers/gpu_*.py run there; torch 2.11, triton 3.6, 2026-11-30)
    ("h200_real_device_assert.log", 1, None, FC.DEVICE_ASSERT, "vectorized gather kernel index out of bounds", 3,
     None, None),
    ("h200_real_cuda_oom.log", 1, None, FC.CUDA_OOM, "torch.OutOfMemoryError: CUDA out of memory", 7, None, None),
    ("h200_real_ima_triton.log", 1, None, FC.ILLEGAL_MEMORY_ACCESS, "torch.AcceleratorError: CUDA error: an illegal",
     41, None, None),
    ("h200_real_torchrun_ddp_ima.log", 1, None, FC.ILLEGAL_MEMORY_ACCESS, "an illegal memory access", 4, None, 1),
    ("h200_real_torchrun_ddp_ima_tee.log", 1, None, FC.ILLEGAL_MEMORY_ACCESS, "an illegal memory access", 4, None, 1),
    ("h200_real_torchrun_valueerror.log", 1, None, FC.PYTHON_EXCEPTION, "ValueError: Please use a device_id", None,
     None, None),
    # real output of examples/train_torchrun.py here (torch 2.13 CPU, gloo, 2026-12-01): rank 1 segfaults,
    # rank 0's all_reduce then fails with "Connection reset by peer": the segfault is the first failure
    ("cpu_real_torchrun_gloo_reset_after_rank_sigsegv.log", 1, None, FC.NATIVE_CRASH, "exitcode  : -11 (pid: 20730)",
     3, "localhost", 1),
    # status alone
    ("unknown_exit_no_evidence.log", 3, None, FC.UNKNOWN, None, 300, None, None),
    ("completed.log", 0, None, FC.COMPLETED, None, 10000, None, None),
    # --- real public logs (tests/data/logs/SOURCES.md names each one's issue) -------------------------
    # host OOM: one worker SIGKILLed while its launcher ran on, or the kernel/Slurm saying OOM
    ("torchrun_summary_sigkill_oom.log", 1, None, FC.HOST_OOM, "exitcode  : -9 (pid: 14750)", None,
     "mlxlab115rp2n7682d40d9-20250521025625-6dyyd3-8nir8b-worker", 0),
    ("torchrun_failed_exitcode_9_cpu_memory.log", 1, None, FC.HOST_OOM, "failed (exitcode: -9) local_rank: 0", None,
     None, None),  # "[3/1000]" counts batches: progress, not a global step
    ("deepspeed_launcher_return_code_9.log", 1, None, FC.HOST_OOM, "exits with return code = -9", None, None, None),
    ("mpirun_rank_signal_9_killed.log", 137, None, FC.HOST_OOM, "exited on signal 9 (Killed)", None,
     "DESKTOP-G7NUGFV", 7),
    ("mp_spawn_process_sigkill.log", 1, None, FC.HOST_OOM, "process 0 terminated with signal SIGKILL", None, None,
     None),
    ("dataloader_worker_killed_by_signal_killed.log", 1, None, FC.HOST_OOM, "is killed by signal: Killed", None,
     None, None),
    ("slurm_batch_killed_oom_kill_event.log", 137, None, FC.HOST_OOM, "Detected 1 oom-kill event(s)", None, None,
     None),
    ("dmesg_out_of_memory_killed_process.log", 137, None, FC.HOST_OOM, "Out of memory: Killed process 10245", None,
     None, None),
    # a bare SIGKILL, no memory evidence: not an OOM (a person, a stall kill, Slurm's KillWait)
    ("srun_task_killed_no_memory_evidence.log", 137, None, FC.KILLED, "srun: error: c002: task 0: Killed", None,
     "c002", 0),
    ("epoch_progress_then_bare_killed.log", 137, None, FC.KILLED, "Killed", None, None, None),
    ("lightning_epoch_end_checkpoint_killed.log", 137, None, FC.KILLED, "Killed", None, None, None),  # 100%, no marker
    # the interconnect: InfiniBand/RoCE, libfabric (EFA), UCX
    ("nccl_ib_port_error_then_completion_error.log", 1, None, FC.INTERCONNECT, "Got async event : port error", 83594,
     None, None),  # host names redacted to "...-48" in the report
    ("nccl_ib_local_catastrophic_error.log", 134, None, FC.INTERCONNECT, "local catastrophic error", None, None,
     None),
    ("nccl_ib_completion_error_kp_ddp.log", 1, None, FC.INTERCONNECT, "with status=12", None, "kp-ddp-worker-0",
     None),
    ("nccl_ib_completion_error_4_nccl_tests.log", 1, None, FC.INTERCONNECT, "Got completion from peer 10.0.35.1",
     None, "kolyoz2", None),
    ("ucx_endpoint_timeout_retry_exceeded.log", 134, None, FC.INTERCONNECT, "'Endpoint timeout'", None, None, None),
    ("efa_ofi_request_completed_with_error.log", 1, None, FC.INTERCONNECT,
     "NET/OFI Request 0x7fbb944701b8 completed with error", None, "nccl-tests-worker-1", 13),
    # killed because a sibling failed: the sibling's class
    ("srun_bus_error_then_step_cancelled.log", 135, None, FC.NATIVE_CRASH, "task 289: Bus error", None,
     "Orion-18-69", 289),
    ("mpiexec_rank_segfault_noticed.log", 139, None, FC.NATIVE_CRASH, "Signal: Segmentation fault (11)", None,
     "lhx-910", 0),
    ("torchrun_rendezvous_closed_other_agent_killed.log", 1, None, FC.UNKNOWN, "RendezvousClosedError", None, None,
     None),
    ("torchrun_agent_sighup_death_signal.log", None, signal.SIGHUP, FC.KILLED, "Received 1 death signal", 4080, None,
     None),
    # training finished, then killed at teardown (the log holds no line of the kill: the status says it)
    ("torchrun_group_succeeded_then_killed.log", None, signal.SIGKILL, FC.COMPLETED,
     "Local worker group finished (SUCCEEDED)", None, None, None),
    ("lightning_max_steps_reached_then_killed.log", 137, None, FC.COMPLETED, "`max_steps=400000` reached", 400000,
     None, None),
    # srun and slurmstepd say how the step ended
    ("srun_time_limit_force_terminated.log", 143, None, FC.TIME_LIMIT, "DUE TO TIME LIMIT", None, "nid01934", None),
    ("srun_label_step_aborted_time_limit.log", 143, None, FC.TIME_LIMIT, "DUE TO TIME LIMIT", None, "h19c25", 0),
    ("slurm_time_limit_redacted_node.log", 143, None, FC.TIME_LIMIT, "DUE TO TIME LIMIT", None, None, None),
    ("slurm_scancel_sigcont_job_cancelled.log", 143, None, FC.CANCELLED, "*** JOB 3 ON c1 CANCELLED AT", None, "c1",
     None),
    ("slurm_job_cancelled_julia_sigterm.log", 143, None, FC.CANCELLED, "*** JOB 3737 ON compute-dy-t3large-2", None,
     "compute-dy-t3large-2", None),
    ("srun_forcing_termination_task_killed.log", 137, None, FC.KILLED, "srun: forcing job termination", None, None,
     None),
]


def _read(name: str) -> str:
    return (LOGS / name).read_bytes().decode("utf-8", errors="replace")


@pytest.mark.parametrize("name, exit_code, sig, cls, evidence, step, node, rank", CASES,
                         ids=[c[0].removesuffix(".log") for c in CASES])
def test_log_fixture_is_classified_by_its_first_failure(name, exit_code, sig, cls, evidence, step, node, rank):
    # A genuine preemption, time limit or node failure: Slurm confirmed it (a notice and the job record).
    failure = classify(exit_code, sig, _read(name), slurm=confirmed(cls) if cls in SCHEDULER_CLASSES else None)
    assert failure.cls == cls, failure.reason
    if evidence is None:
        assert not any("error" in e.lower() for e in failure.evidence)
    else:
        assert any(evidence in line for line in failure.evidence), failure.evidence
        assert failure.context, "context lines around the first error"
    assert failure.step == step
    assert failure.node == node
    assert failure.rank == rank
    assert failure.reason
    for line in failure.evidence + failure.context:
        assert "\x1b" not in line and "\r" not in line


def test_the_fixtures_cover_every_class_the_text_can_show():
    """HANG is the supervisor's own verdict (no output shows it); every other class has a real-format case."""
    covered = {c[3] for c in CASES}
    assert set(FC) - covered == {FC.HANG}
    assert len(CASES) >= 40


@pytest.mark.parametrize("name", sorted(p.name for p in LOGS.glob("*.log")))
def test_text_alone_classifies_every_fixture_the_same_way(name):
    """Without an exit status (``supervise classify LOG``) the text still finds the same first failure."""
    expected = {c[0]: c for c in CASES}[name]
    failure = classify(None, None, _read(name))
    if expected[3] in SCHEDULER_CLASSES:
        # Printed text alone never says preempted/time limit/node failure: the claim is recorded instead.
        assert failure.cls not in SCHEDULER_CLASSES and failure.text_claim, failure.reason
        assert failure.text_claim.startswith(("preemption", "time limit", "node failure"))
        failure = classify(None, None, _read(name), slurm=confirmed(expected[3]))
        assert failure.cls == expected[3] and failure.text_claim is None, failure.reason
    elif expected[3] == FC.COMPLETED and expected[4] is None:
        assert failure.cls == FC.UNKNOWN  # no status, no failure evidence: not provably complete
    elif expected[3] == FC.COMPLETED:
        assert failure.cls == FC.COMPLETED  # the training said it finished, and nothing failed after
    elif expected[3] == FC.UNKNOWN:
        assert failure.cls == FC.UNKNOWN
    elif expected[2] is not None and expected[1] is None and expected[3] == FC.NATIVE_CRASH \
            and "Fatal Python error" not in _read(name):
        assert failure.cls in (FC.NATIVE_CRASH, FC.UNKNOWN)
    else:
        assert failure.cls == expected[3], failure.reason


# --------------------------------------------------------------------------------------------- first failure


def test_watchdog_abort_after_an_illegal_memory_access_is_an_illegal_memory_access():
    text = ("[rank1]: RuntimeError: CUDA error: an illegal memory access was encountered\n"
            "[rank0]:[E ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=1, OpType=ALLREDUCE) ran for 600000 milliseconds before timing out.\n"
            "[rank0]:terminate called after throwing an instance of 'c10::DistBackendError'\n"
            "srun: error: n1: task 0: Aborted (core dumped)\n")
    failure = classify(134, None, text)
    assert failure.cls == FC.ILLEGAL_MEMORY_ACCESS
    assert failure.rank == 1


def test_a_watchdog_timeout_printed_before_its_cause_still_loses_to_the_cause():
    text = ("[rank0]:[E ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=1) ran for 600000 milliseconds before timing out.\n"
            "[rank3]: torch.AcceleratorError: CUDA error: unspecified launch failure\n")
    assert classify(1, None, text).cls == FC.CUDA_LAUNCH_FAILURE


def test_terminated_before_the_segfault_line_is_an_echo():
    text = "srun: error: n1: task 0: Terminated\nsrun: error: n2: task 1: Segmentation fault (core dumped)\n"
    failure = classify(143, None, text)
    assert failure.cls == FC.NATIVE_CRASH
    assert (failure.node, failure.rank) == ("n2", 1)


def test_cuda_error_is_a_python_exception_in_text_but_the_text_decides():
    text = ("Traceback (most recent call last):\n  File \"t.py\", line 3, in <module>\n    x.sum()\n"
            "torch.AcceleratorError: CUDA error: an illegal memory access was encountered\n")
    assert classify(1, None, text).cls == FC.ILLEGAL_MEMORY_ACCESS


def test_a_traceback_in_code_is_not_read_as_evidence():
    """A frame's source line that mentions an error name must not count as that error."""
    text = ("Traceback (most recent call last):\n  File \"train.py\", line 9, in step\n"
            "    except torch.OutOfMemoryError:\n  File \"train.py\", line 12, in step\n"
            "    raise ValueError('bad batch')\nValueError: bad batch\n")
    failure = classify(1, None, text)
    assert failure.cls == FC.PYTHON_EXCEPTION
    assert failure.evidence == ("ValueError: bad batch",)


def test_exit_zero_is_completed_even_after_a_logged_traceback():
    text = "Traceback (most recent call last):\n  File \"x.py\", line 1\nOSError: upload failed\nstep 10\ndone\n"
    assert classify(0, None, text).cls == FC.COMPLETED


def test_empty_output_classifies_from_the_status_alone():
    assert classify(None, signal.SIGSEGV, "").cls == FC.NATIVE_CRASH
    assert classify(139, None, "").cls == FC.NATIVE_CRASH  # 128 + 11, srun style
    assert classify(-6, None, "").cls == FC.NATIVE_CRASH  # subprocess returncode style
    assert classify(137, None, "").cls == FC.KILLED
    assert classify(None, signal.SIGINT, "").cls == FC.CANCELLED
    assert classify(2, None, "").cls == FC.UNKNOWN
    assert classify(None, None, "").cls == FC.UNKNOWN
    assert classify(0, None, "").cls == FC.COMPLETED
    failure = classify(139, None, "step 5\n")
    assert failure.evidence == ("killed by SIGSEGV (exit status 139)",)
    assert failure.step == 5


def test_only_echoes_in_the_text_and_a_fault_in_the_status_is_a_native_crash():
    failure = classify(None, signal.SIGSEGV, "srun: error: n1: task 0: Terminated\n")
    assert failure.cls == FC.NATIVE_CRASH


def test_policy_decides_the_action():
    policy = dict(DEFAULT_POLICY)
    policy[FC.NATIVE_CRASH] = ClassPolicy(action=Action.STOP, retries=0)
    failure = classify(None, signal.SIGSEGV, "")
    assert decide(failure, [], policy, None).action == Action.STOP
    assert decide(failure, [], DEFAULT_POLICY, None).action == Action.RESTART


def test_user_step_regex_finds_the_step():
    text = "[train] it=4200 loss=1\nSegmentation fault (core dumped)\n"
    assert classify(139, None, text).step is None
    assert classify(139, None, text, step_regex=r"it=(\d+)").step == 4200


def test_huge_input_and_huge_lines_are_handled():
    """A tail of many MB with lines over 64 KiB still classifies (lines are cut, input is capped)."""
    junk = ("x" * 200_000 + "\n") * 30 + "".join(f"\r{i}/100000 [00:01<00:01]" for i in range(20_000))
    text = junk + "\nstep 77 loss 1\nRuntimeError: CUDA error: misaligned address\n"
    failure = classify(1, None, text)
    assert failure.cls == FC.CUDA_LAUNCH_FAILURE
    assert failure.step == 77
    assert all(len(line) <= 600 for line in failure.context)


def test_pattern_table_is_data_with_a_priority():
    assert all(p.priority in (0, 1, 2, 3) and p.label for p in DEFAULT_PATTERNS)
    assert {p.cls for p in DEFAULT_PATTERNS if isinstance(p.cls, FC)} >= {
        FC.PREEMPTED, FC.TIME_LIMIT, FC.NODE_FAILURE, FC.CANCELLED, FC.HOST_OOM, FC.DEVICE_ASSERT, FC.CUDA_OOM,
        FC.ILLEGAL_MEMORY_ACCESS, FC.CUDA_LAUNCH_FAILURE, FC.HARDWARE_FAULT, FC.SHM_EXHAUSTED, FC.NCCL_ERROR,
        FC.NATIVE_CRASH, FC.INTERCONNECT}


@pytest.mark.parametrize("text, number", [("SEGV", 11), ("SIGSEGV", 11), ("sigsegv", 11), ("11", 11),
                                          ("KILL", 9), ("-6", 6)])
def test_parse_signal(text, number):
    assert parse_signal(text) == number


@pytest.mark.parametrize("text", ["SIGNOPE", "0", "99", ""])
def test_parse_signal_rejects_nonsense(text):
    with pytest.raises(ValueError):
        parse_signal(text)


def test_signal_classes():
    assert signal_class(signal.SIGBUS) == FC.NATIVE_CRASH
    assert signal_class(signal.SIGTERM) == FC.KILLED
    assert signal_class(signal.SIGINT) == FC.CANCELLED


# --------------------------------------------------------------------------------------------- real crashes


def _no_core() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _run(script: str, via_shell: bool = False) -> tuple[int, str]:
    path = str(CRASHERS / script)
    argv = ["bash", "-c", f'"{sys.executable}" "{path}"; exit $?'] if via_shell else [sys.executable, path]
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30, preexec_fn=_no_core,
                          check=False)
    return proc.returncode, proc.stdout.decode("utf-8", errors="replace")


def _status(rc: int) -> tuple[int | None, int | None]:
    return (None, -rc) if rc < 0 else (rc, None)


@pytest.mark.parametrize("script, cls, evidence, step", [
    ("segv_ctypes.py", FC.NATIVE_CRASH, "killed by SIGSEGV", 3),
    ("segv_faulthandler.py", FC.NATIVE_CRASH, "Fatal Python error: Segmentation fault", 5),
    ("abort.py", FC.NATIVE_CRASH, "killed by SIGABRT", 12),
    ("sigkill_self.py", FC.KILLED, "killed by SIGKILL", 40),
    ("raises_chained.py", FC.PYTHON_EXCEPTION, "KeyError: 'tabby'", 3),
    ("raises_cuda_like.py", FC.ILLEGAL_MEMORY_ACCESS, "torch.AcceleratorError: CUDA error", 99),
])
def test_real_crash_is_classified(script, cls, evidence, step):
    rc, out = _run(script)
    failure = classify(*_status(rc), out)
    assert failure.cls == cls, (rc, out[-500:], failure.reason)
    assert any(evidence in line for line in failure.evidence), failure.evidence
    assert failure.step == step


@pytest.mark.parametrize("script, status, cls", [
    ("segv_ctypes.py", 139, FC.NATIVE_CRASH),
    ("abort.py", 134, FC.NATIVE_CRASH),
    ("sigkill_self.py", 137, FC.KILLED),
])
def test_real_crash_under_a_shell_reports_128_plus_n_and_its_message(script, status, cls):
    """Under a shell (sbatch scripts, srun) the status is 128+N and bash prints the signal's name."""
    rc, out = _run(script, via_shell=True)
    assert rc == status
    failure = classify(rc, None, out)
    assert failure.cls == cls
    assert failure.evidence and "exit status" not in failure.evidence[0]  # bash's own line is the evidence


# --------------------------------------------------------------------------------------------- decide


def _rec(n: int, cls: FC | None, job: str = "100") -> AttemptRecord:
    return AttemptRecord(attempt=n, job_id=job, cls=cls)


def _failure(cls: FC, node: str | None = None) -> Failure:
    return Failure(cls=cls, evidence=("evidence line",), node=node)


def test_restart_backoff_doubles_and_stops_beyond_retries():
    history: list[AttemptRecord] = []
    delays = []
    for n in range(1, 4):
        d = decide(_failure(FC.NATIVE_CRASH), history, DEFAULT_POLICY, "100")
        assert d.action == Action.RESTART
        delays.append(d.delay)
        history.append(_rec(n, FC.NATIVE_CRASH))
    assert delays == [2.0, 4.0, 8.0]
    d = decide(_failure(FC.NATIVE_CRASH), history, DEFAULT_POLICY, "100")
    assert d.action == Action.STOP
    assert "native_crash 4 times in a row; policy allows 3 restarts" in d.reason


def test_backoff_is_capped():
    policy = {FC.NATIVE_CRASH: ClassPolicy(action=Action.RESTART, retries=10, backoff=10.0, backoff_max=15.0)}
    history = [_rec(1, FC.NATIVE_CRASH), _rec(2, FC.NATIVE_CRASH)]
    assert decide(_failure(FC.NATIVE_CRASH), history, policy, None).delay == 15.0


def test_another_class_breaks_the_streak_and_unknown_ends_do_not():
    history = [_rec(1, FC.NATIVE_CRASH), _rec(2, FC.NATIVE_CRASH), _rec(3, FC.PREEMPTED), _rec(4, FC.NATIVE_CRASH)]
    d = decide(_failure(FC.NATIVE_CRASH), history, DEFAULT_POLICY, "100")
    assert d.action == Action.RESTART and d.delay == 4.0
    history = [_rec(1, FC.NATIVE_CRASH), _rec(2, None), _rec(3, FC.NATIVE_CRASH), _rec(4, FC.NATIVE_CRASH)]
    assert decide(_failure(FC.NATIVE_CRASH), history, DEFAULT_POLICY, "100").action == Action.STOP


def test_stop_classes_stop_at_once_and_say_why():
    d = decide(_failure(FC.DEVICE_ASSERT), [], DEFAULT_POLICY, "100")
    assert d.action == Action.STOP and "device_assert" in d.reason and d.delay == 0


def test_hardware_fault_requeues_away_from_the_node_then_stops():
    d = decide(_failure(FC.HARDWARE_FAULT, node="gpu-d04"), [], DEFAULT_POLICY, "100")
    assert d.action == Action.REQUEUE and d.exclude_nodes == ("gpu-d04",)
    history = [_rec(1, FC.HARDWARE_FAULT), _rec(2, FC.HARDWARE_FAULT)]
    assert decide(_failure(FC.HARDWARE_FAULT), history, DEFAULT_POLICY, "100").action == Action.STOP


def test_completed_needs_no_decision():
    d = decide(Failure(FC.COMPLETED), [], DEFAULT_POLICY, None)
    assert d.action == Action.STOP and "completed" in d.reason


def test_with_class_gives_the_class_the_policy_then_judges():
    hang = with_class(_failure(FC.UNKNOWN), FC.HANG, "no progress for 600s")
    assert (hang.cls, hang.reason, hang.evidence) == (FC.HANG, "no progress for 600s", ("evidence line",))
    assert decide(hang, [], DEFAULT_POLICY, None).action == Action.RESTART


# --------------------------------------------------------------------------------------------- CLI


def _invoke(*args: str):
    from click.testing import CliRunner

    from supervisor.cli import main

    return CliRunner().invoke(main, list(args))


def test_cli_classify_json():
    result = _invoke("classify", str(LOGS / "srun_label_segv_then_terminated.log"), "--exit-code", "143", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["class"] == "native_crash" and data["action"] == "restart"
    assert data["evidence"] == ["srun: error: n2: task 1: Segmentation fault (core dumped)"]
    assert (data["step"], data["node"], data["rank"]) == (5000, "n2", 1)
    assert data["reason"]


@pytest.mark.parametrize("spelling", ["SEGV", "SIGSEGV", "11"])
def test_cli_classify_signal_spellings(spelling):
    result = _invoke("classify", str(LOGS / "unknown_exit_no_evidence.log"), "--signal", spelling)
    assert result.exit_code == 0
    assert "class:    native_crash" in result.stdout


def test_cli_classify_human_output_names_the_evidence():
    result = _invoke("classify", str(LOGS / "device_assert_nll_loss.log"))
    assert result.exit_code == 0
    assert "class:    device_assert" in result.stdout and "action:   stop" in result.stdout
    assert "Assertion `t >= 0 && t < n_classes` failed" in result.stdout


def test_cli_classify_bad_input(tmp_path):
    log = tmp_path / "x.log"
    log.write_text("step 1\n")
    both = _invoke("classify", str(log), "--exit-code", "1", "--signal", "SEGV")
    assert both.exit_code == 2 and "not both" in both.output
    assert _invoke("classify", str(tmp_path / "missing.log")).exit_code == 2
    assert _invoke("classify", str(tmp_path)).exit_code == 2
    binary = tmp_path / "core"
    binary.write_bytes(bytes(range(256)) * 64)
    result = _invoke("classify", str(binary))
    assert result.exit_code == 2 and "binary" in result.output
    bad_signal = _invoke("classify", str(log), "--signal", "SIGNOPE")
    assert bad_signal.exit_code == 2 and "unknown signal" in bad_signal.output


def test_cli_classify_empty_log_is_unknown_with_a_note(tmp_path):
    log = tmp_path / "empty.log"
    log.write_text("")
    result = _invoke("classify", str(log), "--json")
    assert result.exit_code == 0
    assert json.loads(result.stdout)["class"] == "unknown"
    assert "empty" in result.stderr
    assert json.loads(_invoke("classify", str(log), "--json", "--exit-code", "139").stdout)["class"] == "native_crash"


def test_cli_classify_reads_only_the_tail(tmp_path):
    """A huge log: only the last --tail-mb are read; a failure before that is out of sight."""
    log = tmp_path / "big.log"
    with open(log, "w") as fh:
        fh.write("RuntimeError: CUDA out of memory. Tried to allocate 2 GiB\n")
        fh.write(("step 1 loss 1.0 " + "." * 100 + "\n") * 30_000)
        fh.write("srun: error: n3: task 2: Segmentation fault (core dumped)\n")
    result = _invoke("classify", str(log), "--json", "--tail-mb", "1")
    assert result.exit_code == 0
    assert json.loads(result.stdout)["class"] == "native_crash"


def test_interleaved_writer_inside_a_traceback_is_not_the_exception():
    text = ("Traceback (most recent call last):\n  File \"train.py\", line 9, in step\n"
            "INFO: rank 3 saving checkpoint\n    loss.backward()\nRuntimeError: CUDA error: misaligned address\n")
    failure = classify(1, None, text)
    assert failure.cls == FC.CUDA_LAUNCH_FAILURE


def test_lock_step_ranks_printing_one_more_step_do_not_make_an_exception_non_fatal():
    ranks = "".join(f"[rank{r}]: step 101 loss 1.0\n" for r in range(1, 8))
    text = ("[rank0]: step 100 loss 1.0\n[rank0]: Traceback (most recent call last):\n"
            "[rank0]:   File \"t.py\", line 1, in <module>\n[rank0]: ValueError: bad shape\n" + ranks)
    failure = classify(1, None, text)
    assert (failure.cls, failure.rank, failure.step) == (FC.PYTHON_EXCEPTION, 0, 100)


def test_negative_exit_code_is_reported_as_the_signal():
    failure = classify(-11, None, "")
    assert (failure.exit_code, failure.signal, failure.cls) == (None, 11, FC.NATIVE_CRASH)


def test_dataloader_worker_crash_message():
    text = ("ERROR: Unexpected segmentation fault encountered in worker.\nTraceback (most recent call last):\n"
            "  File \"train.py\", line 50, in <module>\nRuntimeError: DataLoader worker (pid(s) 1234) exited "
            "unexpectedly\n")
    failure = classify(1, None, text)
    assert failure.cls == FC.NATIVE_CRASH
    assert failure.evidence == ("ERROR: Unexpected segmentation fault encountered in worker.",)


def test_the_table_is_extended_with_one_more_row():
    """A site-specific message becomes evidence by adding a row; no code changes."""
    import re

    from supervisor.failures import CAUSE, FailurePattern

    text = "step 9\nlustre: ll_file_io: I/O error -5 on /scratch/data/shard_0007.tar\n"
    assert classify(1, None, text).cls == FC.UNKNOWN
    lustre = FailurePattern(FC.NODE_FAILURE, re.compile(r"lustre: .*I/O error"), CAUSE, "Lustre I/O error",
                            needles=("lustre",))
    failure = classify(1, None, text, patterns=DEFAULT_PATTERNS + (lustre,))
    assert (failure.cls, failure.step) == (FC.NODE_FAILURE, 9)
    no_needles = FailurePattern(FC.NODE_FAILURE, re.compile(r"lustre: .*I/O error"), CAUSE, "Lustre I/O error")
    assert classify(1, None, text, patterns=DEFAULT_PATTERNS + (no_needles,)).cls == FC.NODE_FAILURE


# --------------------------------------------------------------------------------------------- real GPU crashes


def _gpu_count() -> int:
    """GPUs visible, asked of a subprocess so this test process never initialises CUDA."""
    if not Path("/dev/nvidiactl").exists() and not Path("/dev/nvidia0").exists():
        return 0  # no NVIDIA driver here: skip without paying for a torch import
    code = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                             check=False)
        return int(out.stdout.strip() or 0)
    except (subprocess.SubprocessError, ValueError, OSError):
        return 0


@pytest.fixture(scope="module")
def gpus() -> int:
    count = _gpu_count()
    if count == 0:
        pytest.skip("needs an NVIDIA GPU (run `pytest -m gpu --noconftest tests/test_failures.py` on one)")
    return count


@pytest.mark.gpu
@pytest.mark.parametrize("script, cls, evidence, step", [
    ("gpu_device_assert.py", FC.DEVICE_ASSERT, "Assertion", 3),
    ("gpu_cuda_oom.py", FC.CUDA_OOM, "CUDA out of memory", 7),
    ("gpu_ima_triton.py", FC.ILLEGAL_MEMORY_ACCESS, "an illegal memory access was encountered", 41),
])
def test_real_gpu_crash_is_classified(gpus, script, cls, evidence, step):
    rc, out = _run(script)
    failure = classify(*_status(rc), out)
    assert failure.cls == cls, (rc, out[-2000:], failure.reason)
    assert any(evidence in line for line in failure.evidence), failure.evidence
    assert failure.step == step


@pytest.mark.gpu
def test_real_ddp_illegal_memory_access_is_the_first_failure(gpus):
    """torchrun, 2 ranks, NCCL: rank 1's illegal memory access, not rank 0's timeout or torchrun's summary."""
    if gpus < 2:
        pytest.skip("needs 2 GPUs")
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(CRASHERS / "gpu_ddp_ima.py")]
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300, preexec_fn=_no_core,
                          check=False)
    out = proc.stdout.decode("utf-8", errors="replace")
    failure = classify(*_status(proc.returncode), out)
    assert failure.cls == FC.ILLEGAL_MEMORY_ACCESS, (proc.returncode, out[-3000:], failure.reason)
    assert failure.rank == 1
    assert failure.step == 4


# --------------------------------------------------------------------------------------------- host OOM


_TORCHRUN_SUMMARY = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2025-05-21_15:43:03
  host      : gpu-a01
  rank      : 3 (local_rank: 3)
  exitcode  : {code} (pid: 14750)
  error_file: <N/A>
  traceback : Signal {sig} ({name}) received by PID 14750
============================================================
"""


@pytest.mark.parametrize("code, sig, name, cls", [(-9, 9, "SIGKILL", FC.HOST_OOM), (-15, 15, "SIGTERM", FC.KILLED),
                                                   (-11, 11, "SIGSEGV", FC.NATIVE_CRASH)])
def test_a_worker_sigkilled_while_torchrun_ran_on_is_a_host_oom_and_other_signals_keep_their_class(code, sig, name,
                                                                                                  cls):
    failure = classify(1, None, "step 40\n" + _TORCHRUN_SUMMARY.format(code=code, sig=sig, name=name))
    assert (failure.cls, failure.node, failure.rank, failure.step) == (cls, "gpu-a01", 3, 40)
    if cls == FC.HOST_OOM:
        assert "OOM killer" in failure.reason and DEFAULT_POLICY[failure.cls].action == Action.STOP


def test_a_bare_sigkill_with_no_memory_evidence_is_not_an_oom():
    """Exit 137 with a shell's "Killed": a person, a stall kill or Slurm's KillWait could have sent it."""
    for text in ("step 5\nKilled\n", "step 5\n", "srun: error: n1: task 0: Killed\n"):
        failure = classify(137, None, text)
        assert failure.cls == FC.KILLED, (text, failure.reason)
        assert DEFAULT_POLICY[failure.cls].action == Action.RESTART


def test_a_cause_printed_before_the_launchers_sigkill_report_wins():
    """A worker that raised a CUDA OOM and was then SIGKILLed by torchrun's shutdown is a CUDA OOM."""
    text = ("[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
            + _TORCHRUN_SUMMARY.format(code=-9, sig=9, name="SIGKILL"))
    assert classify(1, None, text).cls == FC.CUDA_OOM


def test_the_kernels_and_slurms_oom_messages_are_verdicts_wherever_they_appear():
    text = ("step 10\nSegmentation fault (core dumped)\n"
            "slurmstepd: error: Detected 1 oom_kill event in StepId=440575.0. Some of the step tasks have been "
            "OOM Killed.\n")
    assert classify(139, None, text).cls == FC.HOST_OOM
    assert classify(1, None, "slurmstepd: error: Exceeded step memory limit at some point.\n").cls == FC.HOST_OOM


# --------------------------------------------------------------------------------------------- interconnect


_NCCL_REMOTE = ("[rank12]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote "
                "process exited or there was a network error, NCCL version 2.21.5\n"
                "[rank12]: ncclRemoteError: A call failed possibly due to a network error or a remote process "
                "exiting prematurely.\n[rank12]: Last error:\n")


def test_an_nccl_remote_error_whose_last_error_is_the_network_is_interconnect():
    text = _NCCL_REMOTE + ("[rank12]: NET/IB : Got completion from peer 10.216.210.241<54862> with status=12 "
                           "opcode=0 len=0 vendor err 129 (Recv)\n")
    failure = classify(1, None, text)
    assert failure.cls == FC.INTERCONNECT and DEFAULT_POLICY[failure.cls].action == Action.REQUEUE
    assert DEFAULT_POLICY[FC.INTERCONNECT].exclude_node


def test_an_nccl_remote_error_with_no_network_cause_or_a_closed_socket_stays_nccl_error():
    """NCCL says "remote process exited OR a network error": a peer that died looks the same."""
    assert classify(1, None, _NCCL_REMOTE).cls == FC.NCCL_ERROR
    socket = _NCCL_REMOTE + "[rank12]: socketProgress: Connection closed by remote peer gpu-b07<59116>\n"
    assert classify(1, None, socket).cls == FC.NCCL_ERROR


def test_a_plain_nccl_watchdog_timeout_stays_nccl_error():
    text = ("[rank0]:[E ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=7, OpType=ALLREDUCE) ran for 600000 milliseconds before timing out.\n")
    assert classify(134, None, text).cls == FC.NCCL_ERROR


def test_the_first_cause_wins_between_a_peers_crash_and_the_network_errors_it_causes():
    segv = "srun: error: n2: task 1: Segmentation fault (core dumped)\n"
    ib = "n1:3468:3905 [4] NCCL WARN NET/IB : Got completion from peer 10.0.0.2<1> with status=12 opcode=0\n"
    assert classify(139, None, "step 9\n" + segv + ib).cls == FC.NATIVE_CRASH
    assert classify(139, None, "step 9\n" + ib + segv).cls == FC.INTERCONNECT


def test_a_gpu_that_fell_off_the_bus_beats_the_network_errors_it_causes():
    text = ("n1:3468:3905 [4] NCCL WARN NET/IB : Got completion from peer 10.0.0.2<1> with status=12 opcode=0\n"
            "NVRM: Xid (PCI:0000:41:00): 79, pid=1234, GPU has fallen off the bus.\n")
    assert classify(1, None, text).cls == FC.HARDWARE_FAULT


def test_a_link_flap_that_training_rode_out_is_not_the_failure():
    flap = "n1:34050:34121 [0] transport/net_ib.cc:93 NCCL WARN NET/IB : Got async event : port error\n"
    later = "step 101 loss 1.0\nstep 102 loss 1.0\nstep 103 loss 1.0\nSegmentation fault (core dumped)\n"
    assert classify(139, None, "step 100 loss 1.0\n" + flap + later).cls == FC.NATIVE_CRASH
    assert classify(1, None, "step 100 loss 1.0\n" + flap).cls == FC.INTERCONNECT


@pytest.mark.parametrize("line", [
    "[dgx15:34226:0:34226] ib_mlx5_log.c:139  Transport retry count exceeded on mlx5_3:1/IB (synd 0x15 vend 0x81)",
    ("[1506866470.744682] [clx-hercules-065:1411 :0] dc_verbs.c:633  UCX  ERROR Send completion with error on qp "
     "0x10e55: transport retry counter exceeded syndrome 0x81"),
    "completion error IBV_WC_RETRY_EXC_ERR on qp 0x2a",
    "[1564069506.097666] [dgx15:34226:0] ucp_worker.c:505  UCX  ERROR error 'Endpoint timeout' will not be handled",
    "algo-1:462:580 [0] ofi_process_cq:1039 NCCL WARN NET/OFI Request 0x7f completed with error. RC: 21.",
    ("libfabric:35:1668017255::efa:cq:rxr_cq_write_tx_error():243<warn> rxr_cq_write_tx_error: err: 20, prov_err: "
     "Not a directory (20)"),
    "libfabric:1234:1700000000::cxi:core:cxip_cq_eq_progress():531<warn> nid001234: RC_UNDELIVERABLE",
    ("h100-28:238:1313 [0] transport/net_ib.cc:139 NCCL WARN communicator encountered a fatal error (detected in "
     "ncclIbTest)"),
    "container-57:815:864 [0] misc/ibvwrap.cu:220 NCCL WARN Call to ibv_get_async_event failed",
])
def test_interconnect_errors_of_each_transport(line):
    """Lines of each transport's format (UCX, verbs, libfabric EFA, CXI return codes, NCCL NET/IB)."""
    assert classify(1, None, line + "\n").cls == FC.INTERCONNECT


def test_a_plugin_warning_at_start_after_which_training_ran_is_not_the_failure():
    """aws-ofi-nccl can fail to initialise and NCCL falls back to sockets: training then runs."""
    text = ("algo-1:17778:17848 [5] nccl_net_ofi_create_plugin:259 NCCL WARN NET/OFI Couldn't open CQ. RC: -22\n"
            "step 1 loss 9.0\nstep 2 loss 8.0\nTraceback (most recent call last):\n  File \"t.py\", line 1\n"
            "ValueError: bad batch\n")
    assert classify(1, None, text).cls == FC.PYTHON_EXCEPTION


# --------------------------------------------------------------------------------------------- siblings


_SIGTERMED_AGENT = (
    "W0409 07:28:49.530000 1359 torch/distributed/elastic/agent/server/api.py:719] Received 15 death signal, "
    "shutting down workers\n"
    "W0409 07:28:49.531000 1359 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 1365 closing "
    "signal SIGTERM\nTraceback (most recent call last):\n  File \"/usr/bin/torchrun\", line 8, in <module>\n"
    "    sys.exit(main())\ntorch.distributed.elastic.multiprocessing.api.SignalException: Process 1359 got signal: 15\n")
_SEGV_RANK = "[rank5]: Fatal Python error: Segmentation fault\n"


def test_an_agent_stopped_because_a_rank_on_another_node_crashed_takes_that_ranks_class():
    """srun's merged output may print the other node's shutdown before the crashed rank's own line."""
    for text in (_SEGV_RANK + _SIGTERMED_AGENT, _SIGTERMED_AGENT + _SEGV_RANK):
        failure = classify(143, None, "step 700\n" + text)
        assert (failure.cls, failure.rank) == (FC.NATIVE_CRASH, 5), failure.reason


def test_an_agent_stopped_from_outside_is_killed_not_a_python_exception():
    failure = classify(None, signal.SIGTERM, "step 700\n" + _SIGTERMED_AGENT)
    assert failure.cls == FC.KILLED and "agent was sent a signal" in failure.reason


def test_a_closed_rendezvous_on_the_surviving_node_is_an_echo_of_the_other_nodes_end():
    survivor = "    raise RendezvousClosedError\ntorch.distributed.elastic.rendezvous.api.RendezvousClosedError\n"
    assert classify(1, None, _SIGTERMED_AGENT + survivor).cls == FC.KILLED  # time order: the signal came first
    assert classify(1, None, survivor).cls == FC.UNKNOWN  # never python_exception (that would stop the run)


def test_srun_tasks_killed_after_another_task_failed_take_its_class_and_place():
    text = ("srun: error: n3: task 3: Killed\nsrun: error: n1: task 1: Segmentation fault (core dumped)\n"
            "srun: Terminating StepId=88.0\n"
            "slurmstepd: error: *** STEP 88.0 ON n0 CANCELLED AT 2024-05-02T10:11:12 DUE TO TASK FAILURE ***\n"
            "srun: error: n0: task 0: Terminated\n")
    failure = classify(143, None, text)
    assert (failure.cls, failure.node, failure.rank) == (FC.NATIVE_CRASH, "n1", 1)


def test_a_task_that_exited_with_an_error_before_its_siblings_were_killed_is_the_first_failure():
    text = ("srun: error: n1: task 1: Exited with exit code 1\nsrun: Terminating StepId=88.0\n"
            "srun: error: n0: task 0: Terminated\n")
    failure = classify(143, None, text)
    assert (failure.cls, failure.node, failure.rank) == (FC.UNKNOWN, "n1", 1)
    assert "exited with an error" in failure.reason


def test_mpirun_names_the_rank_and_node_of_a_crash():
    failure = classify(139, None, "mpirun noticed that process rank 2 with PID 4242 on node gpu-c3 exited on "
                                  "signal 11 (Segmentation fault).\n")
    assert (failure.cls, failure.node, failure.rank) == (FC.NATIVE_CRASH, "gpu-c3", 2)


# --------------------------------------------------------------------------------------------- finished, then killed


_HF_END = ("{'loss': 0.8735, 'learning_rate': 1.0e-07, 'epoch': 3.0}\n"
           "100%|##########| 1500/1500 [1:02:11<00:00,  2.49s/it]\n"
           "Training completed. Do not forget to share your model on huggingface.co/models =)\n"
           "{'train_runtime': 3731.4, 'train_samples_per_second': 12.9, 'train_loss': 1.02, 'epoch': 3.0}\n")


@pytest.mark.parametrize("exit_code, sig", [(137, None), (None, signal.SIGKILL), (143, None), (None, None)])
def test_a_kill_after_the_training_said_it_finished_is_completed(exit_code, sig):
    failure = classify(exit_code, sig, _HF_END + "Killed\n")
    assert failure.cls == FC.COMPLETED, failure.reason
    assert decide(failure, [], DEFAULT_POLICY, None).action == Action.STOP  # nothing to restart
    assert "had finished" in failure.reason and any("train_runtime" in e for e in failure.evidence)


@pytest.mark.parametrize("after, cls", [
    ("Traceback (most recent call last):\n  File \"t.py\", line 9, in <module>\nOSError: [Errno 28] No space left\n",
     FC.PYTHON_EXCEPTION),
    ("Segmentation fault (core dumped)\n", FC.NATIVE_CRASH),
    ("srun: error: n1: task 0: Exited with exit code 1\n", FC.UNKNOWN),
    ("slurmstepd: error: *** JOB 77 ON n1 CANCELLED AT 2024-01-01T00:00:00 DUE TO TIME LIMIT ***\n", FC.TIME_LIMIT),
])
def test_a_failure_after_the_completion_line_is_still_a_failure(after, cls):
    assert classify(137, None, _HF_END + after, slurm=confirmed(cls) if cls in SCHEDULER_CLASSES else None).cls == cls


def test_completion_needs_a_kill_from_outside_not_a_crash_or_an_error_exit():
    assert classify(None, signal.SIGSEGV, _HF_END).cls == FC.NATIVE_CRASH
    assert classify(1, None, _HF_END).cls == FC.UNKNOWN


def test_only_clear_completion_lines_count():
    """100 % of a progress bar, "Training completed in 3 min", or a torchrun group that FAILED are not it."""
    for text in ("100%|##########| 1500/1500 [1:02:11<00:00]\n", "Training completed in 3.2 minutes\n",
                 "INFO:torch.distributed.elastic.agent.server.api:Local worker group finished (FAILED). Waiting\n"):
        assert classify(137, None, "step 1500\n" + text + "Killed\n").cls == FC.KILLED, text


# --------------------------------------------------------------------------------------------- srun and slurmstepd


@pytest.mark.parametrize("text, cls, words", [
    ("slurmstepd: error: *** JOB 9 ON n1 CANCELLED AT 2024-01-01T00:00:00 ***\n", FC.CANCELLED, "scancel"),
    ("slurmstepd: error: *** JOB 9 ON n1 CANCELLED AT 2024-01-01T00:00:00 DUE TO PREEMPTION ***\n", FC.PREEMPTED,
     "preempted"),
    ("slurmstepd: error: *** JOB 9 ON n1 CANCELLED AT 2024-01-01T00:00:00 DUE TO JOB REQUEUE ***\n", FC.PREEMPTED,
     "requeued"),
    ("slurmstepd: error: *** JOB 9 ON n1 CANCELLED AT 2024-01-01T00:00:00 DUE TO TIME LIMIT ***\n", FC.TIME_LIMIT,
     "time limit"),
    ("slurmstepd: error: *** JOB 9 ON n1 CANCELLED AT 2024-01-01T00:00:00 DUE TO NODE FAILURE ***\n",
     FC.NODE_FAILURE, "node failed"),
    ("slurmstepd: error: *** STEP 9.0 ON n1 CANCELLED AT 2024-01-01T00:00:00 DUE to SIGNAL Terminated ***\n",
     FC.KILLED, "signalled the step"),
    ("slurmstepd: error: *** STEP 9.0 ON n1 CANCELLED AT 2024-01-01T00:00:00 ***\n", FC.CANCELLED, "cancelled the step"),
    ("srun: Terminating StepId=9.0\nslurmstepd: error: *** STEP 9.0 ON n1 CANCELLED AT 2024-01-01T00:00:00 ***\n",
     FC.UNKNOWN, "one of its tasks failed"),
    ("srun: Job step aborted: Waiting up to 32 seconds for job step to finish.\n", FC.KILLED, "job is ending"),
    ("srun: Force Terminated StepId=120.0\n", FC.KILLED, "force-terminated"),
    ("srun: forcing job termination\n", FC.KILLED, "SIGTERM/SIGHUP"),
    ("srun: interrupt (one more within 1 sec to abort)\n", FC.CANCELLED, "Ctrl-C"),
    ("srun: error: n1: task 3: Killed\n", FC.KILLED, "killed from outside"),
])
def test_each_srun_and_slurmstepd_ending_gets_a_class_and_a_reason_a_person_understands(text, cls, words):
    failure = classify(143, None, text, slurm=confirmed(cls) if cls in SCHEDULER_CLASSES else None)
    assert failure.cls == cls, failure.reason
    assert words in failure.reason


# --------------------------------------------------------------------------------------------- the package


def test_the_failures_package_imports_only_states_signals_progress_and_policy():
    """Classifying needs no config and no budget (the CLI and the run loop both call it)."""
    import ast

    package = Path(__file__).parent.parent / "supervisor" / "failures"
    allowed = {"states", "signals", "progress", "policy"}
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 2:
                assert (node.module or "").split(".")[0] in allowed, (path.name, node.module)
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                assert not node.module.startswith("supervisor"), (path.name, node.module)
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("supervisor") for a in node.names), path.name


def test_every_pattern_carries_lower_case_needles():
    """Needles keep the work linear: a line with none of them never reaches a regex."""
    for pattern in DEFAULT_PATTERNS:
        assert pattern.needles, pattern.label
        assert all(n == n.lower() for n in pattern.needles), pattern.label


def test_cli_classify_names_the_node_a_requeue_keeps_away_from_and_says_a_finished_run_needs_nothing():
    requeue = _invoke("classify", str(LOGS / "nccl_ib_completion_error_kp_ddp.log"))
    assert requeue.exit_code == 0
    assert "class:    interconnect" in requeue.stdout
    assert "action:   requeue, excluding node kp-ddp-worker-0" in requeue.stdout
    done = _invoke("classify", str(LOGS / "lightning_max_steps_reached_then_killed.log"), "--signal", "KILL")
    assert "class:    completed" in done.stdout and "action:   none" in done.stdout
    assert json.loads(_invoke("classify", str(LOGS / "lightning_max_steps_reached_then_killed.log"), "--signal",
                              "KILL", "--json").stdout)["action"] == "stop"  # JSON keeps the policy's action


def _torchrun_real_with(line: str) -> str:
    """The real gloo log (rank 1 segfaults, torchrun names it the root cause) with rank 0's
    ``Connection reset by peer`` line replaced by ``line``."""
    text = _read("cpu_real_torchrun_gloo_reset_after_rank_sigsegv.log")
    gloo = next(ln for ln in text.splitlines() if "Connection reset by peer" in ln)
    return text.replace(gloo, line)


def test_a_peers_lost_connection_yields_to_the_worker_torchrun_saw_die_first_but_a_fabric_error_does_not():
    assert classify(1, None, _read("cpu_real_torchrun_gloo_reset_after_rank_sigsegv.log")).cls == FC.NATIVE_CRASH
    timeout = ("[rank0]:[E ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation timeout: "
               "WorkNCCL(SeqNum=7, OpType=ALLREDUCE) ran for 600000 milliseconds before timing out.")
    assert classify(1, None, _torchrun_real_with(timeout)).cls == FC.NATIVE_CRASH  # rank 0 waited on dead rank 1
    # A fabric error is never a peer's reaction: the node's link failed, whoever died after it.
    fabric = ("[rank0]: NET/IB : Got completion from peer 10.216.210.241<54862> with status=12 opcode=0 len=0 "
              "vendor err 129 (Recv)")
    assert classify(1, None, _torchrun_real_with(fabric)).cls == FC.INTERCONNECT
    # Without rank prefixes nothing says the lost peer was another rank: the order decides as before.
    unnamed = _read("cpu_real_torchrun_gloo_reset_after_rank_sigsegv.log").replace("[rank0]: ", "")
    assert classify(1, None, unnamed).cls == FC.NCCL_ERROR


def test_the_package_loads_the_classifier_only_when_a_name_of_it_is_used():
    # The policy, the ledgers and the config import the class table (supervisor/failures/classes.py);
    # every `supervise` command would otherwise compile the classifier's patterns.
    import supervisor.failures as failures

    assert sorted(failures.__all__) == sorted(failures._HOME)
    assert all(getattr(failures, name) is not None for name in failures.__all__)
    code = ("import sys, supervisor.config, supervisor.ledger, supervisor.policy; "
            "assert 'supervisor.failures.patterns' not in sys.modules, 'classifier loaded'; "
            "from supervisor.failures import classify; assert classify(0, None, '').cls.value == 'completed'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
