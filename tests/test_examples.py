"""The example training scripts, run for real on CPU without a supervisor: they train, write valid
checkpoints, keep ``last.ckpt`` as a hard link, resume exactly, and each FAULT_* produces the real
failure (a SIGSEGV, a Python exception, a hang, a SIGTERM notice).

Every script run imports torch (seconds on a small CPU), so the independent runs of this module start
together, once, in a module fixture; each test then checks its own run. The end-to-end supervised
runs of these examples live in the run-loop tests.
"""

from __future__ import annotations

import faulthandler
import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the examples need torch (pip install torch)")

from supervisor.checkpoints import validate_checkpoint  # noqa: E402
from supervisor.states import Verdict  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
PLAIN = REPO / "examples" / "train_plain.py"
ZERO = REPO / "examples" / "train_zero_code.py"
TORCHRUN = REPO / "examples" / "train_torchrun.py"
RUN_TIMEOUT = 180.0  # generous: a loaded 2-core CI box imports torch slowly


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """No supervisor around: the client is a no-op; no stray FAULT_* from the outer environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERVISOR_", "SUPERVISE_", "FAULT_"))}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra or {})
    return env


class Run:
    """A script started in its own session (its own process group: FAULT_SIGTERM_AT's default target),
    with its output collected line by line with arrival times."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(argv, cwd=cwd, env=clean_env(env), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def wait(self, timeout: float = RUN_TIMEOUT) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"{self.proc.args} did not finish in {timeout} s:\n{self.output}")
        self._reader.join(5)
        return code

    def wait_for_line(self, prefix: str, timeout: float = RUN_TIMEOUT) -> float:
        until = time.monotonic() + timeout
        while time.monotonic() < until:
            for at, line in list(self.lines):
                if line.startswith(prefix):
                    return at
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        pytest.fail(f"no line starting with {prefix!r}:\n{self.output}")

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        self.proc.wait(10)

    @property
    def output(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def step_lines(self) -> list[int]:
        return [int(line.split()[1]) for _, line in self.lines if line.startswith("step ")]


def train_in_process(argv: list[str]) -> None:
    """train_plain.py's main() in this process: a reference run without another torch import.
    One thread, like the subprocesses (OMP_NUM_THREADS=1), so that results match bit for bit."""
    from supervisor import client

    spec = importlib.util.spec_from_file_location("example_train_plain", PLAIN)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    saved_handler, threads = signal.getsignal(signal.SIGTERM), torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:
        for name in [n for n in os.environ if n.startswith(("SUPERVISOR_", "FAULT_"))]:
            mp.delenv(name)
        client._CLIENT = None  # rebuilt from this (supervisor-free) environment
        torch.set_num_threads(1)
        try:
            assert module.main(argv) == 0
        finally:
            torch.set_num_threads(threads)
            signal.signal(signal.SIGTERM, saved_handler)
            if client.STACK_DUMP_SIGNAL is not None:
                faulthandler.unregister(client.STACK_DUMP_SIGNAL)
            client._CLIENT = None


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Start every run of the module at once (each imports torch: seconds); tests check their own."""
    base = tmp_path_factory.mktemp("examples")
    py = sys.executable

    def plain(name: str, *args: str, env: dict[str, str] | None = None) -> Run:
        work = base / name
        work.mkdir()
        return Run([py, str(PLAIN), "--ckpt-dir", str(work / "ckpt"), *args], work, env)

    def zero(name: str, *args: str, env: dict[str, str] | None = None) -> Run:
        work = base / name
        work.mkdir()
        return Run([py, str(ZERO), "--ckpt-dir", str(work / "ckpt"), *args], work, env)

    # The uninterrupted reference run (steps 1..8, a checkpoint every 2), in this process.
    reference = base / "reference"
    train_in_process(["--steps", "8", "--save-every", "2", "--keep", "10", "--ckpt-dir", str(reference)])
    # A zero-code checkpoint in that script's own format (model, optim, step) to resume from.
    (base / "zero_source").mkdir()
    zero_model = torch.nn.Linear(16, 1)
    torch.save({"model": zero_model.state_dict(), "step": 4,
                "optim": torch.optim.SGD(zero_model.parameters(), lr=0.05).state_dict()},
               base / "zero_source" / "step=4.ckpt")

    (base / "torchrun").mkdir()
    started: dict[str, Any] = {
        "base": base,
        "basic": plain("basic", "--steps", "8", "--save-every", "2", "--keep", "2"),
        # Attempt 2 resumes where attempt 1 saved; a fault armed for attempt 1 does not fire again.
        "resumed": plain("resumed", "--steps", "8", "--save-every", "2", env={
            "SUPERVISOR_RESUME_FROM": str(reference / "step=6.ckpt"), "SUPERVISOR_RESUME_STEP": "6",
            "SUPERVISOR_ATTEMPT": "2", "FAULT_SEGFAULT_AT": "7"}),
        "segfault": plain("segfault", "--steps", "6", env={"FAULT_SEGFAULT_AT": "3"}),
        "exception": plain("exception", "--steps", "6", env={"FAULT_EXCEPTION_AT": "3"}),
        "stall": plain("stall", "--steps", "6", env={"FAULT_STALL_AT": "3"}),
        # FAULT_ILLEGAL_MEMORY_AT on a CPU only says why it is skipped, then the notice comes.
        "sigterm": plain("sigterm", "--steps", "20", "--save-every", "100",
                         env={"FAULT_ILLEGAL_MEMORY_AT": "2", "FAULT_SIGTERM_AT": "3"}),
        "from_zero": plain("from_zero", "--steps", "2", "--ckpt", str(reference / "step=6.ckpt"),
                           env={"FAULT_RESTART_FROM_ZERO": "1"}),
        "zero_basic": zero("zero_basic", "--steps", "4", "--save-every", "2"),
        "zero_resumed": zero("zero_resumed", "--steps", "6", "--ckpt_path", str(base / "zero_source" / "step=4.ckpt")),
        "zero_segfault": zero("zero_segfault", "--steps", "6", env={"FAULT_SEGFAULT_AT": "2"}),
        "zero_stall": zero("zero_stall", "--steps", "6", env={"FAULT_STALL_AT": "2"}),
        "zero_exception": zero("zero_exception", "--steps", "6", env={"FAULT_EXCEPTION_AT": "2"}),
        # Rank 1 alone gets SIGTERM after step 3 (torchrun: the real launcher, gloo on CPU).
        "torchrun": Run([py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                         str(TORCHRUN), "--steps", "20", "--save-every", "2",
                         "--ckpt-dir", str(base / "torchrun" / "ckpt")], base / "torchrun",
                        {"FAULT_SIGTERM_AT": "3", "FAULT_RANK": "1", "FAULT_SIGTERM_PID": "self"}),
    }
    try:
        yield started
    finally:
        for run in started.values():
            if isinstance(run, Run) and run.proc.poll() is None:
                run.kill()


def load(path: Path) -> dict[str, Any]:
    return torch.load(path, weights_only=True)


# --------------------------------------------------------------------------- train_plain.py


def test_plain_writes_valid_step_checkpoints_and_a_hard_linked_last(runs: Any) -> None:
    run: Run = runs["basic"]
    assert run.wait() == 0, run.output
    ckpt = runs["base"] / "basic" / "ckpt"
    assert run.step_lines() == list(range(1, 9))
    assert f"saved step 8 to {ckpt / 'step=8.ckpt'}" in run.output
    assert run.output.splitlines()[-1] == "training complete at step 8"
    names = sorted(p.name for p in ckpt.iterdir())
    assert names == ["last.ckpt", "step=6.ckpt", "step=8.ckpt"], names  # keep=2: step 2 and 4 pruned
    last, newest = ckpt / "last.ckpt", ckpt / "step=8.ckpt"
    assert not last.is_symlink() and os.path.samefile(last, newest)  # a hard link, not a copy
    for path in (newest, ckpt / "step=6.ckpt"):
        assert validate_checkpoint(path).verdict is Verdict.VALID
    state = load(newest)
    assert state["step"] == 8 and set(state) >= {"model", "optimizer", "rng"}


def test_plain_resume_from_the_env_continues_exactly(runs: Any) -> None:
    """Attempt 2 resumes from step 6 (SUPERVISOR_RESUME_FROM) and trains to 8: bit-identical weights to
    the uninterrupted run; the segfault armed for attempt 1 does not fire in attempt 2."""
    resumed: Run = runs["resumed"]
    assert resumed.wait() == 0, resumed.output
    source = runs["base"] / "reference" / "step=6.ckpt"
    assert f"resumed from {source} at step 6" in resumed.output
    assert resumed.step_lines() == [7, 8] and "FAULT" not in resumed.output
    ours = load(runs["base"] / "resumed" / "ckpt" / "step=8.ckpt")["model"]
    reference = load(runs["base"] / "reference" / "step=8.ckpt")["model"]
    assert ours.keys() == reference.keys()
    for key in ours:
        assert torch.equal(ours[key], reference[key]), key


def test_plain_restart_from_zero_fault_ignores_the_resume_point(runs: Any) -> None:
    run: Run = runs["from_zero"]
    assert run.wait() == 0, run.output
    source = runs["base"] / "reference" / "step=6.ckpt"
    assert f"FAULT_RESTART_FROM_ZERO: ignoring resume point {source}" in run.output
    assert "resumed from" not in run.output and run.step_lines() == [1, 2]


def test_plain_segfault_is_a_real_sigsegv(runs: Any) -> None:
    run: Run = runs["segfault"]
    assert run.wait() == -signal.SIGSEGV, run.output
    assert run.step_lines() == [1, 2, 3]
    assert "FAULT_SEGFAULT_AT: segfault at step 3" in run.output


def test_plain_exception_exits_1_with_the_traceback(runs: Any) -> None:
    run: Run = runs["exception"]
    assert run.wait() == 1, run.output
    assert "RuntimeError: FAULT_EXCEPTION_AT: injected exception at step 3" in run.output
    assert "Traceback (most recent call last)" in run.output


def test_plain_stall_hangs_silently_until_killed(runs: Any) -> None:
    run: Run = runs["stall"]
    run.wait_for_line("FAULT_STALL_AT: hanging at step 3")
    count = len(run.lines)
    time.sleep(2.0)
    assert run.proc.poll() is None, "a stalled process must still be alive"
    assert len(run.lines) == count, f"a stalled process printed more:\n{run.output}"
    os.killpg(run.proc.pid, signal.SIGTERM)  # recorded by the client, not acted on: it stays hung
    time.sleep(0.5)
    assert run.proc.poll() is None
    run.kill()
    assert run.proc.returncode == -signal.SIGKILL


def test_plain_sigterm_notice_stops_at_a_step_boundary_with_a_checkpoint(runs: Any) -> None:
    run: Run = runs["sigterm"]
    assert run.wait() == 0, run.output
    ckpt = runs["base"] / "sigterm" / "ckpt"
    assert f"FAULT_SIGTERM_AT: SIGTERM to pid {run.proc.pid} at step 3" in run.output
    assert "stopping at step 3 (signal SIGTERM)" in run.output
    assert f"saved step 3 to {ckpt / 'step=3.ckpt'}" in run.output  # no supervisor: always save
    assert run.step_lines() == [1, 2, 3]
    assert load(ckpt / "step=3.ckpt")["step"] == 3
    assert os.path.samefile(ckpt / "last.ckpt", ckpt / "step=3.ckpt")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU; CI has none "
                    "(benchmarks/gpu/run_all.sh runs this on the H200)")
def test_plain_illegal_memory_fault_raises_cudas_own_error(tmp_path: Path) -> None:
    run = Run([sys.executable, str(PLAIN), "--device", "cuda", "--steps", "4", "--ckpt-dir", str(tmp_path)],
              tmp_path, {"FAULT_ILLEGAL_MEMORY_AT": "2"})
    assert run.wait() == 1, run.output
    assert "CUDA error: an illegal memory access was encountered" in run.output


# --------------------------------------------------------------------------- train_zero_code.py


def test_zero_code_saves_plain_files_and_resumes_from_ckpt_path(runs: Any) -> None:
    first: Run = runs["zero_basic"]
    assert first.wait() == 0, first.output
    ckpt = runs["base"] / "zero_basic" / "ckpt"
    assert sorted(p.name for p in ckpt.iterdir()) == ["last.ckpt", "step=2.ckpt", "step=4.ckpt"]
    assert not os.path.samefile(ckpt / "last.ckpt", ckpt / "step=4.ckpt")  # its own in-place copy
    assert validate_checkpoint(ckpt / "last.ckpt").verdict is Verdict.VALID
    assert first.step_lines() == [1, 2, 3, 4]
    second: Run = runs["zero_resumed"]
    assert second.wait() == 0, second.output
    assert f"resumed from {runs['base'] / 'zero_source' / 'step=4.ckpt'} at step 4" in second.output
    assert second.step_lines() == [5, 6]
    assert "import supervisor" not in ZERO.read_text() and "from supervisor" not in ZERO.read_text()


def test_zero_code_faults_are_real(runs: Any) -> None:
    segfault, exception, stall = runs["zero_segfault"], runs["zero_exception"], runs["zero_stall"]
    assert segfault.wait() == -signal.SIGSEGV, segfault.output
    assert segfault.step_lines() == [1, 2]
    assert exception.wait() == 1 and "FAULT_EXCEPTION_AT: injected exception at step 2" in exception.output
    stall.wait_for_line("step 2 ")
    time.sleep(1.5)
    assert stall.proc.poll() is None and stall.step_lines() == [1, 2]
    stall.kill()


# --------------------------------------------------------------------------- train_torchrun.py


def test_torchrun_ranks_stop_together_when_one_rank_gets_the_notice(runs: Any) -> None:
    """Rank 1 alone gets SIGTERM after step 3; the all-reduced stop flag stops both ranks at step 3,
    rank 0 writes the checkpoint, and nobody hangs in a collective."""
    run: Run = runs["torchrun"]
    assert run.wait() == 0, run.output
    assert "stopping at step 3 (signal SIGTERM) on rank 1" in run.output
    assert "stopping at step 3 (another rank was told to stop) on rank 0" in run.output
    assert load(runs["base"] / "torchrun" / "ckpt" / "step=3.ckpt")["step"] == 3
    assert max(run.step_lines()) == 3
