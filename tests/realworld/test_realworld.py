"""The real-world suite (issue 21, item 7): everyday training stacks, each script run unchanged under
``supervise run`` with the flags of docs/realworld.md, each broken from outside after it saved:

* a SIGSEGV sent to the training process at a step between two saves, after the first save the
  supervisor saw (placed from the event log and the child's own output, never by timing);
* a preemption on the test Slurm cluster (partition ``extra`` preempted by ``own``).

Each must finish (exit 0), resume from its own newest finished checkpoint (read from the child's own
output: the step it says it resumed at), quarantine nothing, raise no false alarm (no save "outside"
the checkpoint directory, no "cannot resume"), and be accounted at most one save interval of lost
steps (``supervise report --json``).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stacks import CHILD_ENV, STACKS, Stack
from helpers import REPO, SUPERVISE, events_named, run_supervise, supervise_env

pytest.importorskip("torch")

CRASH_TIMEOUT_S = 420  # two launches of a stack on a loaded 2-core machine


def require(stack: Stack) -> None:
    """Skip a stack whose libraries are missing, saying how to install them; in CI (CI=true, as
    .ci/run sets it) a missing stack fails instead: a skipped stack there is a hole."""
    if stack.key in ("torchtune", "mace"):
        # each in its own directory, which .ci/run fills (tests/realworld/SOURCES.md)
        setup = importlib.import_module(f"{stack.key}_setup")
        if not setup.installed():
            message = f"{stack.key} is not installed in {setup.SITE} ({setup.INSTALL})"
            if os.environ.get("CI") == "true":
                pytest.fail(message)
            pytest.skip(message)
    for module in stack.needs:
        if importlib.util.find_spec(module) is None:
            if module in ("litgpt", "litdata"):
                from litgpt_setup import INSTALL

                how = INSTALL  # not in the test extra: .ci/run installs it (tests/realworld/SOURCES.md)
            else:
                how = "pip install -e '.[test]'"
            message = f"{stack.key}: {module} is not installed ({how})"
            if os.environ.get("CI") == "true":
                pytest.fail(message)
            pytest.skip(message)


def attempt_log(run_dir: Path, attempt: int) -> str:
    try:
        return (run_dir / "supervisor" / f"attempt-{attempt}.log").read_text(errors="replace")
    except OSError:
        return ""


def events(run_dir: Path, name: str) -> list[dict]:
    try:
        return events_named(run_dir, name)
    except OSError:
        return []


def saved_once(stack: Stack, run_dir: Path) -> bool:
    """The child has reported a step past its own first finished save."""
    text = attempt_log(run_dir, 1)
    saves, steps = stack.log.completed_saves(text), stack.log.steps(text)
    return bool(saves and steps and steps[-1] > saves[0])


def supervisor_saw_a_save(run_dir: Path) -> bool:
    return any(e.get("attempt") == 1 and e.get("ok") for e in events(run_dir, "save_end"))


def in_the_middle(stack: Stack, run_dir: Path) -> int | None:
    """The child's last reported step when it lies past a save and well before the next one (no save
    can be in flight), else None."""
    steps = stack.log.steps(attempt_log(run_dir, 1))
    if stack.between_saves is not None:
        starts = events(run_dir, "run_start")
        settled = bool(steps and starts and stack.between_saves(Path(starts[0]["checkpoint_dir"]), steps[-1]))
        return steps[-1] if settled else None
    if steps and 2 <= steps[-1] % stack.save_interval <= stack.save_interval - 3:
        return steps[-1]
    return None


class Freezer:
    """Places one stack's fault, one look at a time, so that several stacks running at once (one
    cluster job) are each placed without waiting on the others: once the child has printed a step
    past its first finished save, stop the training process (SIGSTOP); once the supervisor has
    logged a finished save and copied out the child's last lines, keep it stopped if its last step
    lies between two saves (no save in flight), else let it go (SIGCONT) and try again. Every
    decision is made on the stopped process, so how fast the steps run does not matter."""

    SUPERVISOR_SEES_A_SAVE_S = 30.0
    COPY_OUT_S = 0.5  # attempt-1.log unchanged this long: the supervisor has copied out all the stopped child wrote

    def __init__(self, stack: Stack, run_dir: Path) -> None:
        self.stack, self.run_dir = stack, run_dir
        self.pid: int | None = None
        self.step: int | None = None  # set once frozen between saves
        self._stopped_at = 0.0
        self._saw_at: float | None = None
        self._log_size = -1  # of attempt-1.log at the last look, while the child is stopped

    def look(self) -> bool:
        """One look; True once the training is frozen between two saves."""
        if self.step is not None:
            return True
        stack, run_dir, now = self.stack, self.run_dir, time.monotonic()
        if events(run_dir, "run_end"):
            raise AssertionError(f"{stack.key}: the run ended before the fault could be placed:\n"
                                 f"{attempt_log(run_dir, 1)[-3000:]}")
        if self.pid is None:
            if saved_once(stack, run_dir):
                self.pid = training_pid(run_dir, stack)
                os.kill(self.pid, signal.SIGSTOP)
                self._stopped_at, self._saw_at, self._log_size = time.monotonic(), None, -1
            return False
        if self._saw_at is None:
            if supervisor_saw_a_save(run_dir):
                self._saw_at = now
            elif now - self._stopped_at < self.SUPERVISOR_SEES_A_SAVE_S:
                return False
        if self._saw_at is not None:
            size = len(attempt_log(run_dir, 1))
            if size != self._log_size:  # still copying out (several supervisors share the CPUs)
                self._log_size, self._saw_at = size, now
                return False
            if now - self._saw_at < self.COPY_OUT_S:
                return False
        step = in_the_middle(stack, run_dir)
        if self._saw_at is not None and step is not None:
            self.step = step
            return True
        try:
            os.kill(self.pid, signal.SIGCONT)
        except ProcessLookupError:
            raise AssertionError(f"{stack.key}: the training ended before the fault could be placed "
                                 f"(raise its max_steps):\n{attempt_log(run_dir, 1)[-3000:]}") from None
        self.pid = None
        return False


def freeze_all(placed: list[tuple[Stack, Path]], timeout: float) -> list[Freezer]:
    """Freeze every stack's training between two saves (see :class:`Freezer`)."""
    freezers = [Freezer(stack, run_dir) for stack, run_dir in placed]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if all([f.look() for f in freezers]):
            return freezers
        time.sleep(0.02)
    late = [f for f in freezers if f.step is None]
    raise AssertionError("no step between two saves within {:.0f}s: {}\n{}".format(
        timeout, ", ".join(f.stack.key for f in late), attempt_log(late[0].run_dir, 1)[-3000:]))


@contextlib.contextmanager
def kept_stopped(pids: list[int], every: float = 0.005) -> Iterator[None]:
    """SIGSTOP ``pids`` again and again until they are gone or the block ends, so that a SIGCONT
    from elsewhere (Slurm's, at a preemption) lets each run a few milliseconds at most."""
    done = threading.Event()

    def stop_again() -> None:
        alive = set(pids)
        while alive and not done.is_set():
            for pid in list(alive):
                try:
                    os.kill(pid, signal.SIGSTOP)
                except ProcessLookupError:
                    alive.discard(pid)
            done.wait(every)

    thread = threading.Thread(target=stop_again, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=5)


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        try:
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        out += map(int, children)
        todo += map(int, children)
    return out


def cmdline(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def training_pid(run_dir: Path, stack: Stack) -> int:
    """The process that trains: the child itself, or its worker under a launcher (torchrun)."""
    child = [e for e in events(run_dir, "attempt_start") if e.get("attempt") == 1][0]["pid"]
    if b"torch.distributed.run" not in cmdline(child):
        return child
    script = next(Path(a).name for a in stack.command(run_dir) if a.endswith(".py")).encode()
    for _ in range(200):  # the launcher starts its worker a moment after it starts
        workers = [pid for pid in descendants(child)  # not the supervisor's own helpers (python -c ...)
                   if any(arg.endswith(script) for arg in cmdline(pid)) and b"-c" not in cmdline(pid)[:3]]
        if workers:
            return workers[0]
        time.sleep(0.05)
    raise AssertionError(f"no worker running {script!r} under the launcher {child}")


def check_outcome(stack: Stack, run_dir: Path, rc: int, output: str) -> dict:
    """What every stack must show after one fault: see the module docstring."""
    report_res = run_supervise(["report", "--json", str(run_dir)])
    report = json.loads(report_res.stdout)
    context = f"\n--- supervise output ---\n{output[-4000:]}\n--- report verdict ---\n{report.get('verdict')}"
    assert rc == 0, f"{stack.key}: supervise exited {rc}{context}"
    attempts = report["attempts"]
    assert len(attempts) == 2, f"{stack.key}: {len(attempts)} attempts{context}"
    first, second = attempt_log(run_dir, 1), attempt_log(run_dir, 2)
    saved = stack.log.completed_saves(first)
    assert saved, f"{stack.key}: attempt 1 finished no save:\n{first[-2000:]}"
    resumed = stack.log.resumed_at(second)
    assert resumed == max(saved), (f"{stack.key}: the child resumed at {resumed}, its newest finished save "
                                   f"was step {max(saved)}:\n{second[:3000]}{context}")
    if stack.trains_after_resume:
        assert max(stack.log.steps(second)) == stack.max_steps, f"{stack.key}: did not finish:\n{second[-2000:]}"
    assert report["quarantined"] == [], f"{stack.key}: quarantined {report['quarantined']}{context}"
    # No false alarm on the way: every save is in the watched directory, and the run can resume.
    alarms = [e for e in events(run_dir, "resumability") if not e.get("ok")] + events(run_dir, "save_elsewhere")
    assert alarms == [], f"{stack.key}: {alarms[0]}{context}"
    lost, last = attempts[0]["steps_lost"], max(stack.log.steps(first))
    # Never fewer than the child really lost (its last step minus where it resumed), never more than
    # one save interval.
    assert lost is not None and last - resumed <= lost <= stack.save_interval, (
        f"{stack.key}: attempt 1 accounted {lost} steps lost; the child reached step {last} and resumed at "
        f"{resumed} ({last - resumed} lost; save interval {stack.save_interval}){context}")
    assert report["run"]["steps_lost"] is not None and report["run"]["steps_lost"] <= stack.save_interval, context
    assert report["run"]["outcome"] == "complete" and report["verdict"]["ok"], context
    return report


def test_the_docs_table_gives_the_flags_the_suite_runs():
    rows = [line for line in (REPO / "docs" / "realworld.md").read_text().splitlines() if line.startswith("| ")]
    for stack in STACKS:
        row = next((r for r in rows if r.startswith(f"| {stack.stack} |")), None)
        assert row is not None, f"docs/realworld.md has no row for {stack.stack!r}"
        assert f"--checkpoint-dir {stack.checkpoint_dir} " in row and stack.resume_arg in row, row
        assert f"| {stack.save_interval} " in row, row


@pytest.mark.parametrize("stack", STACKS, ids=[s.key for s in STACKS])
def test_segfault_from_outside_between_saves_resumes_from_the_newest_save(stack: Stack, make_workdir, tmp_path):
    require(stack)
    workdir = make_workdir(stack.key)
    run_dir = tmp_path / "run"
    out_path = tmp_path / "supervise.out"
    argv = [*SUPERVISE, "run", "--run-dir", str(run_dir), "--set", "policy.native_crash.backoff=0.1",
            *stack.supervise_flags(workdir), "--", *stack.command(workdir)]
    with open(out_path, "w") as out:
        proc = subprocess.Popen(argv, cwd=workdir, stdout=out, stderr=subprocess.STDOUT,
                                env=supervise_env({**CHILD_ENV, "HF_HOME": str(workdir / ".hf")}))
        try:
            frozen = freeze_all([(stack, run_dir)], timeout=240)[0]
            victim, step = frozen.pid, frozen.step
            assert victim is not None
            os.kill(victim, signal.SIGSEGV)  # delivered as the process continues: it dies of it
            os.kill(victim, signal.SIGCONT)
            rc = proc.wait(timeout=CRASH_TIMEOUT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
    report = check_outcome(stack, run_dir, rc, out_path.read_text(errors="replace"))
    assert report["attempts"][0]["class"] == "native_crash", report["attempts"][0]
    assert max(stack.log.steps(attempt_log(run_dir, 1))) == step  # it died where it was stopped


# ---- preemption on the test cluster -------------------------------------------------------------
# Every stack in ONE cluster job, for the cost of CI: one supervisor per stack, each in its own job
# step (srun --overlap: the steps share the node's CPUs), each child frozen between two saves, then one
# preemption for all of them and one requeue after which every stack resumes and finishes.
# REALWORLD_CLUSTER_STACKS=nanogpt,accelerate narrows it (keys of stacks.py), should CI need the time; it
# also names a stack left out by default (Stack.on_cluster).
CLUSTER_STACKS = [s for s in STACKS if s.key in os.environ.get("REALWORLD_CLUSTER_STACKS", "").split(",")] \
    if os.environ.get("REALWORLD_CLUSTER_STACKS") else [s for s in STACKS if s.on_cluster]


def victim_script(placed: list[tuple[Stack, Path, Path]]) -> str:
    """One batch script: one ``srun ... supervise run`` per (stack, working dir, run dir), in parallel."""
    exports = "".join(f"export {k}={v}\n" for k, v in CHILD_ENV.items())
    steps = ""
    for stack, workdir, run_dir in placed:
        flags = " ".join(f"'{f}'" for f in stack.supervise_flags(workdir))
        command = " ".join(f"'{a}'" for a in stack.command(workdir))
        steps += (f"(cd {workdir} && HF_HOME={workdir}/.hf srun --overlap -n1 --cpus-per-task=1 {sys.executable} "
                  f"-m supervisor run --run-dir {run_dir} --set preemption.margin=2 {flags} -- {command}; "
                  f'echo "SUPERVISE EXIT {stack.key} $?") &\n')
    return (f"#!/bin/bash\nexport PYTHONPATH={REPO}\nexport PYTHONUNBUFFERED=1\n{exports}"
            'echo "JOB RUN restart=${SLURM_RESTART_COUNT:-0}"\n'
            f"{steps}wait\n")


@pytest.mark.slurm
def test_preempted_on_the_cluster_between_saves_every_stack_resumes_from_its_newest_save(make_workdir, slurm_cluster,
                                                                                        slurm_job_dir):
    stacks = [s for s in CLUSTER_STACKS if all(importlib.util.find_spec(m) is not None for m in s.needs)]
    placed = [(s, make_workdir(s.key, base=slurm_job_dir), slurm_job_dir / f"run-{s.key}") for s in stacks]
    with slurm_cluster.grace(5):
        job = slurm_cluster.sbatch(victim_script(placed), "-p", "extra", "-N1", "--exclusive",
                                   "-w", "n1", "--requeue", "--open-mode=append", "--time=10", "-J", "victim",
                                   "-o", f"{slurm_job_dir}/victim-%j.out")
        # Each child stays stopped through the grace: its supervisor ends it (SIGKILL reaches a stopped
        # process), so the step it reached is the one the test saw. Slurm sends every process of the
        # step a SIGCONT with the preemption's SIGTERM: the children are stopped again at once, or a
        # fast one would train on through the grace (Accelerate's ran its last 900 steps in 2 s).
        freezers = freeze_all([(stack, run_dir) for stack, _, run_dir in placed], timeout=400)
        with kept_stopped([f.pid for f in freezers if f.pid is not None]):
            slurm_cluster.preempt("n1")
            final = slurm_cluster.wait_state(job, "COMPLETED", timeout=500, min_restarts=1)
    assert final.restarts == 1
    output = "".join(p.read_text(errors="replace") for p in slurm_job_dir.glob("victim-*.out"))
    for stack, _, run_dir in placed:
        report = check_outcome(stack, run_dir, 0 if f"SUPERVISE EXIT {stack.key} 0" in output else 1, output)
        # Ended by the preemption: its supervisor judged it "preempted" (PreemptTime set) or, when it looked
        # after Slurm had already requeued the job, "requeued"; either way the job ran again.
        assert report["attempts"][0]["class"] == "preempted", (stack.key, report["attempts"][0])
        assert [e["cause"] for e in events(run_dir, "stop_cause")][:1] in (["preempted"], ["requeued"]), stack.key
