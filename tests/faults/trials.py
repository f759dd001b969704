"""The fault-injection trials of issue 9: each function runs one fault end to end and returns a
:class:`TrialOutcome` saying what happened and what, if anything, went wrong.

Everything is real: real child processes killed with real signals, real ``torch.save`` files,
real filesystems (a small tmpfs for "disk full", a remount for "read-only"), the real throwaway
Slurm cluster of tests/slurm_cluster.py for preemption. The only stand-in is the clock jump: the
system clock cannot be changed safely on a shared machine, so the supervisor process runs with
``time.time`` offset by a file's value (:mod:`faults.clockjump`), which is what a stepped wall
clock looks like to it while its monotonic clock runs on.

Shared by ``tests/faults/`` (CI-sized: dozens of kills, a handful of preemptions; each test asserts
every outcome) and ``benchmarks/faults/run_trials.py`` (the long version: counts outcomes).
Timings are recorded as facts, never judged.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import pickle
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
if str(HERE.parent) not in sys.path:  # tests/: helpers.py, slurm_cluster.py
    sys.path.insert(0, str(HERE.parent))

from helpers import pid_alive, read_events, supervise_env  # noqa: E402

from supervisor.checkpoints import find_resume_point, scan_checkpoints, validate_checkpoint  # noqa: E402
from supervisor.checkpoints.naming import QUARANTINE_PREFIX, is_ignored_name, is_temp_name  # noqa: E402
from supervisor.states import Verdict  # noqa: E402

PY = sys.executable
SUPERVISE = [PY, "-m", "supervisor"]
PLAIN = str(REPO / "examples" / "train_plain.py")
SAVER = HERE / "saver.py"
CLOCKJUMP = HERE / "clockjump.py"
FAST = ["--set", "policy.native_crash.backoff=0.2", "--set", "policy.python_exception.backoff=0.2"]


# ----------------------------------------------------------------------------- outcomes


@dataclass
class TrialOutcome:
    """One trial: ``ok`` when nothing a user cares about went wrong; ``label`` says which way the
    fault landed (mid-write, between saves, the arbitration decision...), ``facts`` the numbers."""

    kind: str
    trial: int
    ok: bool
    label: str
    problems: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    concerns: list[str] = field(default_factory=list)  # expectations beyond the fault's core one (known bugs)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def explain(self) -> str:
        """For assertion messages: what went wrong and the facts behind it."""
        said = "; ".join(self.problems) or "ok"
        extra = f"\nconcerns: {'; '.join(self.concerns)}" if self.concerns else ""
        return f"{self.kind} #{self.trial} ({self.label}): {said}{extra}\nfacts: {self.facts}"


class Findings:
    """Collects broken expectations instead of stopping at the first, so one trial reports all."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.concerns: list[str] = []

    def concern(self, condition: Any, message: str) -> bool:
        """An expectation beyond the trial's core criterion: reported, does not fail the trial."""
        if not condition:
            self.concerns.append(message)
        return bool(condition)

    def expect(self, condition: Any, message: str) -> bool:
        if not condition:
            self.problems.append(message)
        return bool(condition)

    def outcome(self, kind: str, trial: int, label: str, facts: dict[str, Any], started: float) -> TrialOutcome:
        return TrialOutcome(kind, trial, not self.problems, label, list(self.problems), facts,
                            round(time.monotonic() - started, 3), list(self.concerns))


class Unavailable(Exception):
    """This machine cannot stage the fault (no mount permission...): the reason says why."""


def summarize(kind: str, outcomes: list[TrialOutcome]) -> dict[str, Any]:
    """The counts docs/reliability.md reports for one kind of trial."""
    labels = collections.Counter(o.label for o in outcomes)
    summary: dict[str, Any] = {"kind": kind, "trials": len(outcomes), "ok": sum(o.ok for o in outcomes),
                               "failed": sum(not o.ok for o in outcomes), "labels": dict(labels.most_common()),
                               "seconds": round(sum(o.seconds for o in outcomes), 1),
                               "problems": sorted({p for o in outcomes for p in o.problems})[:20],
                               "with_concerns": sum(bool(o.concerns) for o in outcomes),
                               "concerns": sorted({c for o in outcomes for c in o.concerns})[:10]}
    facts = [o.facts for o in outcomes]
    if kind.startswith("kill9"):
        summary["mid_write_kills"] = sum(bool(f.get("mid_write")) for f in facts)
        summary["temp_files_left"] = sum(int(f.get("temp_files") or 0) for f in facts)
        summary["phases"] = dict(collections.Counter(f.get("phase") for f in facts))
        summary["saves_lost"] = sum(1 for f in facts if f.get("resume_step") is not None
                                    and f["resume_step"] < f.get("completed_save", 0))
    if "kill9_plain" in kind:
        summary["torn_quarantined"] = sum(int(f.get("torn_quarantined") or 0) for f in facts)
        summary["torn_by_name"] = dict(collections.Counter(n for f in facts for n in f.get("torn_names", [])))
        summary["torn_reasons"] = dict(collections.Counter(r for f in facts for r in f.get("torn_levels", [])))
    if "preemption" in kind:
        summary["decisions"] = dict(collections.Counter(d for f in facts for d in f.get("arbitration", [])))
        summary["requeues"] = sum(int(f.get("restarts") or 0) for f in facts)
        summary["steps_lost"] = [f.get("steps_lost") for f in facts]
        summary["temp_files_left"] = sum(len(f.get("temp_left") or []) for f in facts)
        summary["save_aborted"] = sum(int(f.get("save_aborted") or 0) for f in facts)
    return summary



# ----------------------------------------------------------------------------- small helpers


def supervise(args: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 180,
              cwd: Path | None = None, wrapper: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    argv = list(wrapper) + list(args) if wrapper else SUPERVISE + list(args)
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=supervise_env(env),
                          cwd=cwd or REPO)


def start_supervise(args: Sequence[str], log: Path, *, env: dict[str, str] | None = None,
                    wrapper: Sequence[str] = ()) -> subprocess.Popen[bytes]:
    """A background ``supervise`` whose stderr goes to ``log`` (a pipe nobody reads could fill)."""
    argv = list(wrapper) + list(args) if wrapper else SUPERVISE + list(args)
    with open(log, "ab") as err:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                env=supervise_env(env), cwd=REPO)


def wait_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.02) -> Any:
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > end:
            return value
        time.sleep(interval)


def events_of(run_dir: Path, name: str | None = None) -> list[dict[str, Any]]:
    try:
        events = read_events(run_dir)
    except OSError:
        return []
    return [e for e in events if name is None or e.get("event") == name]


def supervisor_traceback(stderr: str) -> bool:
    """A traceback in ``supervise --quiet``'s stderr is the supervisor's own (the child's output is
    not echoed with --quiet): the rule is a one-line error, never a traceback."""
    return "Traceback (most recent call last)" in stderr


def checkpoint_files(ckpt_dir: Path) -> dict[str, list[str]]:
    """The names in a checkpoint dir, sorted into candidates, temp files, quarantined entries."""
    out: dict[str, list[str]] = {"candidates": [], "temp": [], "quarantined": [], "other": []}
    try:
        names = sorted(os.listdir(ckpt_dir))
    except OSError:
        return out
    for name in names:
        if is_temp_name(name):
            out["temp"].append(name)
        elif name.startswith(QUARANTINE_PREFIX):
            out["quarantined"].append(name)
        elif is_ignored_name(name):
            out["other"].append(name)
        else:
            out["candidates"].append(name)
    return out


def file_identity(path: Path) -> tuple[int, int, int, int]:
    st = os.stat(path, follow_symlinks=False)
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def peak_rss_kib(pid: int) -> int | None:
    """VmHWM (peak resident set) of a live process, in KiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


# ----------------------------------------------------------------------------- filesystems


def _run_quiet(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=60)


@contextlib.contextmanager
def small_filesystem(path: Path, size_bytes: int) -> Iterator[str]:
    """A filesystem of ``size_bytes`` mounted at ``path`` for the ``with`` block: a tmpfs, else a
    loop-mounted ext4 image. Yields which. Raises :class:`Unavailable` when neither can be mounted
    (not root, a container without mount rights)."""
    path.mkdir(parents=True, exist_ok=True)
    how = "tmpfs"
    tried = _run_quiet(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(path)])
    image = path.parent / f".{path.name}.img"
    if tried.returncode != 0:
        how = "loop-ext4"
        reasons = [f"tmpfs: {tried.stderr.strip()}"]
        with open(image, "wb") as handle:
            handle.truncate(size_bytes + (1 << 20))
        for argv in (["mkfs.ext4", "-q", "-F", str(image)], ["mount", "-o", "loop", str(image), str(path)]):
            step = _run_quiet(argv) if shutil.which(argv[0]) else None
            if step is None or step.returncode != 0:
                reasons.append(f"{argv[0]}: {step.stderr.strip() if step else 'not installed'}")
                image.unlink(missing_ok=True)
                raise Unavailable("cannot mount a small filesystem here: " + "; ".join(reasons))
    try:
        yield how
    finally:
        if _run_quiet(["umount", str(path)]).returncode != 0:
            _run_quiet(["umount", "-l", str(path)])
        image.unlink(missing_ok=True)


def remount_read_only(path: Path) -> None:
    done = _run_quiet(["mount", "-o", "remount,ro", str(path)])
    if done.returncode != 0:
        raise Unavailable(f"cannot remount {path} read-only: {done.stderr.strip()}")


# ============================================================================= 1-2: kill -9 during saves


class SaverPool:
    """The zygote of tests/faults/saver.py: forks savers to kill (torch is imported once)."""

    def __init__(self) -> None:
        env = supervise_env({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
        self._proc = subprocess.Popen([PY, str(SAVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      text=True, env=env, cwd=REPO, bufsize=1)
        self._lock = threading.Lock()

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        with self._lock:
            self._proc.stdin.write(json.dumps(request) + "\n")
            self._proc.stdin.flush()
            line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the saver zygote died (exit {self._proc.poll()})")
        return json.loads(line)

    def spawn(self, mode: str, ckpt_dir: Path, journal: Path, nbytes: int, pause: float, keep: int,
              stop_at: int | None = None, paused: Path | None = None) -> int:
        return int(self._ask({"cmd": "spawn", "mode": mode, "dir": str(ckpt_dir), "journal": str(journal),
                              "bytes": nbytes, "pause": pause, "keep": keep, "stop_at": stop_at,
                              "paused": str(paused) if paused else None})["pid"])

    def reap(self, pid: int) -> int:
        return int(self._ask({"cmd": "reap", "pid": pid})["status"])

    def close(self) -> None:
        if self._proc.stdin:
            self._proc.stdin.close()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def __enter__(self) -> "SaverPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class KillParams:
    save_bytes: int = 4 << 20  # a few MB: a write takes tens of ms, so kills land inside writes often
    pause: float = 0.005  # "training" between saves, so some kills land between saves
    keep: int = 2  # retention of the atomic saver (prune never leaves fewer than two)


def _read_journal(journal: Path) -> dict[str, dict[int, float]]:
    """``{"begin": {step: t}, "written": {...}, "end": {...}}`` from the saver's journal."""
    seen: dict[str, dict[int, float]] = {"begin": {}, "written": {}, "end": {}}
    try:
        text = journal.read_text()
    except OSError:
        return seen
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2].isdigit() and parts[1] in seen:
            seen[parts[1]][int(parts[2])] = float(parts[0])
    return seen


def _phase(journal: dict[str, dict[int, float]], killed_at: float, mode: str) -> str:
    """Where the kill landed, from the last journal entry before it."""
    last = max(((t, what) for what, steps in journal.items() for t in steps.values() if t <= killed_at),
               default=(0.0, "end"))[1]
    if mode == "atomic":
        return {"begin": "in atomic write", "written": "in update_last/prune", "end": "between saves"}[last]
    return {"begin": "in step file write", "written": "in last.ckpt write", "end": "between saves"}[last]


def kill_during_save_trial(pool: SaverPool, work_dir: Path, trial: int, rng: random.Random, mode: str,
                           params: KillParams = KillParams(), placed: bool = False) -> TrialOutcome:
    """Fault 1 (``mode="atomic"``) and 2 (``mode="plain"``): SIGKILL a process that saves in a loop,
    at a random moment of one of its save cycles, then check what a restart would find.

    The kill time: wait for save k (k random in 2..4) to begin, then sleep a uniform fraction of
    the previous cycle's length, so kills spread over the write, the ``last.ckpt`` update, the
    retention and the gap before the next save. ``placed``: instead, the saver stops half-way
    through the step file of save k (a pause point in the writer, tests/faults/saver.py) and is
    killed there: mid-write every time, whatever the machine's load.

    atomic: nothing torn among the non-temp files (L0-L4, CRC included), a valid resume point at or
    after the last completed save. plain: the resume point the run loop would pick right away is
    valid; quarantine then moves every torn file aside, everything left validates, and the resume
    point is a valid step checkpoint at or after the last completed save."""
    started = time.monotonic()
    kind = "kill9_atomic_save" if mode == "atomic" else "kill9_plain_save"
    base = work_dir / f"{mode}-{trial}"
    ckpt, journal_path = base / "ckpt", base / "journal"
    ckpt.mkdir(parents=True)
    f = Findings()
    target = rng.randint(2, 4)
    paused = base / "paused"
    pid = pool.spawn(mode, ckpt, journal_path, params.save_bytes, params.pause, params.keep,
                     stop_at=target if placed else None, paused=paused if placed else None)
    reached = wait_until(lambda: target in _read_journal(journal_path)["begin"], timeout=60, interval=0.001)
    journal = _read_journal(journal_path)
    cycle = (journal["begin"].get(target, 0.0) - journal["begin"].get(target - 1, 0.0)) if reached else 0.0
    delay = rng.uniform(0, cycle)
    if placed:
        reached = reached and bool(wait_until(paused.exists, timeout=60, interval=0.001))
        delay = 0.0
    deadline = journal["begin"].get(target, time.monotonic()) + delay
    while time.monotonic() < deadline:
        pass  # busy-wait: sleep() overshoots by a millisecond or more, as long as a small write
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    status = pool.reap(pid)
    f.expect(reached, f"the saver never began save {target} (within 60 s)")
    f.expect(os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL,
             f"the saver was not killed by SIGKILL (status {status})")
    journal = _read_journal(journal_path)
    completed = max(journal["end"], default=0)
    began = max(journal["begin"], default=0)
    names = checkpoint_files(ckpt)
    phase = _phase(journal, killed_at, mode)
    facts: dict[str, Any] = {"target_save": target, "cycle_s": round(cycle, 4), "delay_s": round(delay, 4),
                             "placed": placed, "phase": phase, "completed_save": completed, "began_save": began,
                             "temp_files": len(names["temp"]), "mid_write": bool(names["temp"])}

    if mode == "atomic":
        reports = scan_checkpoints(ckpt, deep=True)
        torn = [f"{os.path.basename(r.path)}: {r.verdict.value} ({r.reason})" for r in reports
                if r.verdict is not Verdict.VALID]
        f.expect(not torn, f"torn or unverifiable non-temp files after the kill: {torn}")
        facts["files_checked"] = len(reports)
        _expect_resume(f, find_resume_point(ckpt), completed, began, facts, "resume")
        label = "mid-write (temp file left)" if names["temp"] else phase
    else:
        # What the run loop sees when it restarts at once (files younger than 2 s count as in progress).
        _expect_resume(f, find_resume_point(ckpt), completed, began, facts, "resume_at_once")
        result = find_resume_point(ckpt, quarantine=True, quarantine_tag=f"trial{trial}", quiet_s=0.0)
        moved = [q for q in result.quarantined if q.ok]
        failed = [f"{q.path}: {q.error}" for q in result.quarantined if not q.ok]
        f.expect(not failed, f"quarantine failed: {failed}")
        left = scan_checkpoints(ckpt, deep=True)
        not_valid = [f"{os.path.basename(r.path)}: {r.verdict.value} ({r.reason})" for r in left
                     if r.verdict is not Verdict.VALID]
        f.expect(not not_valid, f"files left after quarantine that do not validate: {not_valid}")
        _expect_resume(f, result, completed, began, facts, "resume")
        f.expect(result.chosen is not None and not result.chosen.is_last,
                 f"resume point is not a step checkpoint: {result.path}")
        facts["torn_quarantined"] = len(moved)
        facts["torn_names"] = sorted(os.path.basename(q.path).split("=")[0] for q in moved)
        facts["torn_levels"] = sorted({f"L{q.level} {q.reason.split(':')[0]}" for q in moved})
        label = f"{phase}: {len(moved)} torn quarantined"
    outcome = f.outcome(kind, trial, label, facts, started)
    if outcome.ok:
        shutil.rmtree(base, ignore_errors=True)  # keep the evidence of a failed trial
    return outcome


def _expect_resume(f: Findings, result: Any, completed: int, began: int, facts: dict[str, Any], key: str) -> None:
    """The resume point exists, validates to L4 (CRC), and loses no completed save."""
    facts[f"{key}_step"] = result.step
    if not f.expect(result.path is not None, f"{key}: no resume point ({result.reason})"):
        return
    deep = validate_checkpoint(result.path, deep=True)
    f.expect(deep.verdict is Verdict.VALID, f"{key}: {result.path} fails the CRC check: {deep.reason}")
    f.expect(result.step is not None and result.step >= completed,
             f"{key}: step {result.step} is before the last completed save {completed}: a save was lost")
    f.expect(result.step is not None and result.step <= began,
             f"{key}: step {result.step} was never even started (last begun {began})")


# ============================================================================= 3: preemption on Slurm


@dataclass(frozen=True)
class PreemptParams:
    steps: int = 40
    step_time: float = 0.15
    save_every: int = 10
    save_mb: int = 20  # 20 MB saves in ~0.3 s here; 300 MB take longer than a 3 s grace
    moment: str = "random"  # early | in_save | after_save | random
    margin: float = 0.5  # preemption.margin: seconds kept free before the deadline
    timeout: float = 300.0


PREEMPT_MOMENTS = ("early", "in_save", "after_save", "random")
# Cluster.sbatch numbers the script files it writes with a counter that two threads can read at
# once, so one job's script can overwrite the other's (seen: both jobs ran the same run dir).
# Trials submit their own script files, and every submission from the two trial threads is serialized.
SBATCH_LOCK = threading.Lock()


def preemption_trial(cluster: Any, node: str, job_dir: Path, trial: int, rng: random.Random,
                     params: PreemptParams = PreemptParams()) -> TrialOutcome:
    """Fault 3: ``srun supervise run -- python examples/train_plain.py`` in partition ``extra`` is
    preempted by a job in ``own`` at a chosen kind of moment. The run must complete over its
    requeues, ``supervise audit`` must account every attempt, no checkpoint may be torn, and the
    final step must be reached."""
    started = time.monotonic()
    f = Findings()
    run_dir = job_dir / f"run-{node}-{trial}"
    ckpt = run_dir / "checkpoints"
    out = job_dir / f"job-{node}-{trial}.out"
    save_bytes = params.save_mb << 20
    script = f"""#!/bin/bash
export PYTHONPATH={REPO}
export PYTHONUNBUFFERED=1
echo "RUN restart=${{SLURM_RESTART_COUNT:-0}} node=$SLURMD_NODENAME"
srun -n1 {PY} -m supervisor run --run-dir {run_dir} --quiet --set preemption.margin={params.margin} \\
  -- {PY} {PLAIN} --steps {params.steps} --step-time {params.step_time} --save-every {params.save_every} \\
  --save-bytes {save_bytes} --keep 2
rc=$?
echo "SUPERVISE EXIT $rc"
exit $rc
"""
    script_path = job_dir / f"job-{node}-{trial}.sh"
    script_path.write_text(script)
    with SBATCH_LOCK:
        job = cluster.sbatch(script_path, "-p", "extra", "-N1", "--exclusive", "-w", node, "--requeue",
                             "--open-mode=append", "-J", f"fault{trial}", "-o", str(out))
    log1 = run_dir / "supervisor" / "attempt-1.log"
    saw_step = wait_until(lambda: log1.exists() and "step 1 " in log1.read_text(errors="replace"), 120, 0.05)
    f.expect(saw_step, "the training never started (no 'step 1' in attempt-1.log within 120 s)")
    moment_ok = _wait_for_moment(params, ckpt, log1, rng) if saw_step else False
    preempted_at = time.time()
    phase = "in_save" if checkpoint_files(ckpt)["temp"] else "no_save"
    with SBATCH_LOCK:
        preemptor = cluster.preempt(node, seconds=1)
    final = _wait_job_done(cluster, job, params.timeout)
    facts: dict[str, Any] = {"job": job, "node": node, "moment": params.moment, "moment_reached": moment_ok,
                             "save_mb": params.save_mb, "phase_at_sbatch": phase,
                             "final_state": final.state if final else None,
                             "restarts": final.restarts if final else None}
    with contextlib.suppress(Exception):
        cluster.wait_finished(preemptor, timeout=30)
    f.expect(final is not None and final.state == "COMPLETED",
             f"job {job} did not complete: {final.state if final else 'timed out'}")
    f.expect(final is not None and final.restarts >= 1, "the job was never requeued (was it preempted?)")

    events = events_of(run_dir)
    arbitration = [e.get("decision") for e in events if e.get("event") == "arbitration"]
    facts["arbitration"] = arbitration
    facts["notices"] = sum(1 for e in events if e.get("event") == "notice")
    requeues = [e for e in events if e.get("event") == "requeue"]
    facts["requeue_how"] = sorted({str(e.get("how")) for e in requeues})
    facts["save_aborted"] = sum(1 for e in events if e.get("event") == "save_aborted")
    ends = [e for e in events if e.get("event") == "run_end"]
    f.expect(ends and ends[-1].get("outcome") == "complete",
             f"last run_end is not complete: {ends[-1] if ends else 'none'}")
    f.expect(ends and ends[-1].get("last_step") == params.steps,
             f"final step {ends[-1].get('last_step') if ends else None} != {params.steps}")

    audit = supervise(["audit", "--json", str(run_dir)], timeout=60)
    try:
        ledger = json.loads(audit.stdout)
    except ValueError:
        ledger = {}
    f.expect(audit.returncode == 0, f"supervise audit exited {audit.returncode}: {audit.stderr.strip()[-300:]}")
    attempts = ledger.get("attempts", [])
    facts["attempts"] = len(attempts)
    facts["steps_lost"] = [a.get("steps_lost") for a in attempts]
    facts["classes"] = [a.get("status") or a.get("class") for a in attempts]
    unaccounted = [a.get("attempt") for a in attempts
                   if (a.get("first_step") is not None or a.get("last_step") is not None)
                   and a.get("steps_lost") is None]
    f.expect(not unaccounted, f"attempts with steps but steps_lost null: {unaccounted}")
    f.expect(len(attempts) >= 2, f"audit shows {len(attempts)} attempt(s); a preempted run has at least 2")
    f.expect(ledger.get("resume_ok") is True, "a resume audit failed")

    names = checkpoint_files(ckpt)
    facts["temp_left"] = names["temp"]
    facts["quarantined"] = names["quarantined"]
    files = [str(ckpt / n) for n in names["candidates"]]
    if f.expect(files, "no checkpoint left at all"):
        verify = supervise(["verify", "--json", *files], timeout=120)
        try:
            verdicts = {os.path.basename(r["path"]): r["verdict"] for r in json.loads(verify.stdout)}
        except (ValueError, KeyError, TypeError):
            verdicts = {}
        torn = {n: v for n, v in verdicts.items() if v != "valid"}
        f.expect(verify.returncode == 0 and not torn, f"supervise verify: {torn or verify.stderr.strip()[-300:]}")
    f.expect(f"step={params.steps}.ckpt" in names["candidates"], f"no step={params.steps}.ckpt at the end")
    facts["preempt_to_done_s"] = round(time.time() - preempted_at, 1)
    label = "/".join(str(d) for d in arbitration) or "no arbitration"
    if f.problems:  # the cluster dir goes with the cluster: keep what the job said
        with contextlib.suppress(OSError):
            facts["job_output_tail"] = out.read_text(errors="replace")[-2000:]
        with contextlib.suppress(OSError):
            facts["attempt_log_tail"] = log1.read_text(errors="replace")[-1000:]
    return f.outcome("slurm_preemption", trial, label, facts, started)


def _wait_for_moment(params: PreemptParams, ckpt: Path, log1: Path, rng: random.Random) -> bool:
    """Sleep until the chosen kind of moment; True when it was reached (else we preempt anyway)."""
    if params.moment == "early":
        return True
    if params.moment == "random":
        compute = params.steps * params.step_time
        time.sleep(rng.uniform(0, 0.6 * compute))
        return True
    if params.moment == "in_save":
        return bool(wait_until(lambda: checkpoint_files(ckpt)["temp"], 60, 0.01))
    if params.moment == "after_save":
        return bool(wait_until(lambda: any(n.startswith("step=") for n in checkpoint_files(ckpt)["candidates"])
                               and not checkpoint_files(ckpt)["temp"], 60, 0.01))
    raise ValueError(f"unknown moment {params.moment!r}; one of {PREEMPT_MOMENTS}")


def _wait_job_done(cluster: Any, job: int, timeout: float) -> Any:
    """The job's final record once it ended for good (PREEMPTED is passed through: with
    PreemptMode=REQUEUE the job comes back), None on timeout."""
    terminal = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "BOOT_FAIL", "DEADLINE",
                "OUT_OF_MEMORY", "SPECIAL_EXIT"}
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        info = cluster.job(job)
        if info is not None and info.state in terminal:
            return info
        time.sleep(0.5)
    return None


def run_preemption_batch(cluster: Any, job_dir: Path, first_trial: int, count: int, rng: random.Random,
                         choose: Callable[[int, random.Random], PreemptParams]) -> list[TrialOutcome]:
    """``count`` trials, two at a time (one per node), each with the parameters ``choose`` picks."""
    outcomes: list[TrialOutcome] = []
    trial = first_trial
    while trial < first_trial + count:
        pair = list(zip(cluster.nodes, range(trial, min(trial + len(cluster.nodes), first_trial + count))))
        results: dict[int, TrialOutcome] = {}

        def one(node: str, n: int) -> None:
            params = choose(n, rng)
            try:
                results[n] = preemption_trial(cluster, node, job_dir, n, random.Random(rng.random()), params)
            except Exception as exc:  # a harness failure is a failed trial, never a lost one
                results[n] = TrialOutcome("slurm_preemption", n, False, "harness error",
                                          [f"{type(exc).__name__}: {exc}"], {"node": node, **asdict(params)})

        threads = [threading.Thread(target=one, args=(node, n)) for node, n in pair]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        outcomes += [results[n] for _, n in pair]
        trial += len(pair)
    return outcomes


def default_preempt_choice(n: int, rng: random.Random) -> PreemptParams:
    """Cycle through the moments; every other trial saves more than a 3 s grace can hold."""
    moment = PREEMPT_MOMENTS[n % len(PREEMPT_MOMENTS)]
    big = (n // len(PREEMPT_MOMENTS)) % 2 == 1 if n >= len(PREEMPT_MOMENTS) else n % 2 == 1
    return PreemptParams(moment=moment, save_mb=300 if big else 20, steps=30 if big else 40)


# ============================================================================= 4: supervisor SIGKILLed


def supervisor_killed_trial(work_dir: Path, trial: int, rng: random.Random, *, steps: int = 60,
                            step_time: float = 0.05) -> TrialOutcome:
    """Fault 4: SIGKILL ``supervise run`` at a random moment of a training. Its child must die with
    it (PDEATHSIG: no orphan holding the GPU), and the next ``supervise run`` of the same run
    directory must take over the lock and resume from the newest valid checkpoint."""
    started = time.monotonic()
    f = Findings()
    base = work_dir / f"superkill-{trial}"
    run_dir = base / "run"
    base.mkdir(parents=True)
    train = ["--", PY, PLAIN, "--steps", str(steps), "--step-time", str(step_time), "--save-every", "10",
             "--save-bytes", str(2 << 20)]
    proc = start_supervise(["run", "--run-dir", str(run_dir), "--quiet", *FAST, *train], base / "first.err")
    start = wait_until(lambda: events_of(run_dir, "attempt_start"), 90)
    log1 = run_dir / "supervisor" / "attempt-1.log"
    training = wait_until(lambda: log1.exists() and "step 1 " in log1.read_text(errors="replace"), 90)
    delay = rng.uniform(0, steps * step_time * 1.1)
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    proc.wait()
    f.expect(start and training, "the first attempt never started training")
    child = int(start[0]["pid"]) if start else None
    gone = wait_until(lambda: child is None or not pid_alive(child), 5.0, 0.01)
    gone_after = time.monotonic() - killed_at
    f.expect(gone, f"the child {child} outlived its SIGKILLed supervisor by more than 5 s (orphan)")
    if not gone and child:
        os.kill(child, signal.SIGKILL)
    ckpt = run_dir / "checkpoints"
    expected = find_resume_point(ckpt, quiet_s=0.0) if ckpt.exists() else None
    expected_step = expected.step if expected else None
    second = supervise(["run", "--run-dir", str(run_dir), "--quiet", *FAST, *train], timeout=180)
    f.expect(second.returncode == 0, f"the second supervise run exited {second.returncode}: "
             f"{second.stderr.strip()[-400:]}")
    f.expect(not supervisor_traceback(second.stderr), "the second supervise printed a traceback")
    starts = events_of(run_dir, "run_start")
    points = events_of(run_dir, "resume_point")
    later = points[-1] if points else {}
    facts: dict[str, Any] = {"kill_after_s": round(delay, 3), "child_gone_s": round(gone_after, 3),
                             "expected_resume_step": expected_step, "resumed_step": later.get("step"),
                             "run_starts": len(starts)}
    f.expect(len(starts) == 2, f"{len(starts)} run_start events; expected 2")
    f.expect(later.get("step") == expected_step,
             f"resumed from step {later.get('step')}, the newest valid checkpoint is step {expected_step}")
    resumed = [e for e in events_of(run_dir, "resumed") if e.get("attempt") == later.get("attempt")]
    f.expect(not resumed or resumed[-1].get("ok") is True, f"resume audit failed: {resumed[-1:]}")
    end = events_of(run_dir, "run_end")
    f.expect(end and end[-1].get("outcome") == "complete" and end[-1].get("last_step") == steps,
             f"the run did not complete at step {steps}: {end[-1:] }")
    label = "killed before any save" if expected_step is None else f"killed after step {expected_step} was saved"
    outcome = f.outcome("supervisor_sigkill", trial, label, facts, started)
    if outcome.ok:
        shutil.rmtree(base, ignore_errors=True)
    return outcome


# ============================================================================= 5: disk full


def disk_full_trial(work_dir: Path, trial: int = 0) -> TrialOutcome:
    """Fault 5: the checkpoint dir is a 5 MiB filesystem; the third 2 MB save does not fit. The
    save must fail cleanly (no temp file left: space given back), the previous checkpoint stay
    intact and valid, and the supervisor record the failure and decide (never crash)."""
    started = time.monotonic()
    f = Findings()
    base = work_dir / f"diskfull-{trial}"
    ckpt, run_dir = base / "ckpt", base / "run"
    with small_filesystem(ckpt, 5 << 20) as how:
        res = supervise(["run", "--run-dir", str(run_dir), "--checkpoint-dir", str(ckpt), "--quiet", *FAST,
                         "--", PY, PLAIN, "--steps", "40", "--save-every", "10", "--save-bytes", "2000000",
                         "--keep", "5"], timeout=180)
        names = checkpoint_files(ckpt)
        usage = shutil.disk_usage(ckpt)
        kept = {n: validate_checkpoint(ckpt / n, deep=True) for n in names["candidates"]}
        resume = find_resume_point(ckpt, quiet_s=0.0)
    failures = events_of(run_dir, "failure")
    evidence = " | ".join(" ".join(e.get("evidence") or []) for e in failures)
    ends = events_of(run_dir, "run_end")
    facts = {"filesystem": how, "exit_code": res.returncode, "files": names, "used_bytes": usage.used,
             "evidence": evidence[:300], "class": [e.get("class") for e in failures],
             "decision": [e.get("action") for e in events_of(run_dir, "decision")],
             "run_end": ends[-1].get("reason") if ends else None, "resume_step": resume.step}
    f.expect(not supervisor_traceback(res.stderr), "supervise printed a traceback")
    f.expect(failures, "no failure event for the attempt that hit the full disk")
    f.expect("no space left" in evidence.lower() or "errno 28" in evidence.lower() or "write failed" in evidence.lower(),
             f"the failure evidence does not say the disk is full: {evidence[:200]!r}")
    f.expect(ends, "no run_end event: the supervisor did not finish its decision")
    f.expect(not names["temp"], f"temp files left on the full disk: {names['temp']}")
    f.expect("step=20.ckpt" in kept and kept["step=20.ckpt"].ok, "the previous checkpoint step=20 is not intact")
    bad = {n: r.reason for n, r in kept.items() if not r.ok}
    f.expect(not bad, f"checkpoints damaged: {bad}")
    f.expect(resume.step == 20, f"resume point after the full disk is step {resume.step}, expected 20")
    return f.outcome("disk_full", trial, f"ENOSPC on {how}", facts, started)


# ============================================================================= 6: read-only, vanishing dir, clock


def _make_checkpoints(run_dir: Path, ckpt: Path, steps: int, save_every: int) -> subprocess.CompletedProcess[str]:
    return supervise(["run", "--run-dir", str(run_dir), "--checkpoint-dir", str(ckpt), "--quiet",
                      "--", PY, PLAIN, "--steps", str(steps), "--save-every", str(save_every)], timeout=180)


def _tear_copy(src: Path, dest: Path, age_s: float = 60.0) -> None:
    """A torn copy of a real checkpoint (its first half), dated back so nothing takes it for a
    save still in progress."""
    data = src.read_bytes()
    dest.write_bytes(data[: len(data) // 2])
    past = time.time() - age_s
    os.utime(dest, (past, past))


def read_only_trial(work_dir: Path, trial: int = 0) -> TrialOutcome:
    """Fault 6a: the checkpoint filesystem turns read-only (remount,ro), holding a valid step=10
    and a torn step=20. ``resume-point --quarantine`` and ``run`` must report the failed
    quarantine and go on from step 10; the child's next save fails cleanly; nothing is lost."""
    started = time.monotonic()
    f = Findings()
    base = work_dir / f"readonly-{trial}"
    ckpt, run_dir = base / "ckpt", base / "run"
    with small_filesystem(ckpt, 32 << 20) as how:
        made = _make_checkpoints(base / "maker", ckpt, 10, 10)
        f.expect(made.returncode == 0, f"could not make the first checkpoint: {made.stderr[-300:]}")
        for extra in ("last.ckpt",):  # keep the picture simple: one valid, one torn
            with contextlib.suppress(OSError):
                (ckpt / extra).unlink()
        _tear_copy(ckpt / "step=10.ckpt", ckpt / "step=20.ckpt")
        before = {n: file_identity(ckpt / n) for n in os.listdir(ckpt)}
        remount_read_only(ckpt)
        try:
            point = supervise(["resume-point", "--quarantine", "--settle", "0", "--json", str(ckpt)], timeout=60)
            run = supervise(["run", "--run-dir", str(run_dir), "--checkpoint-dir", str(ckpt), "--quiet", *FAST,
                             "--", PY, PLAIN, "--steps", "30", "--save-every", "10"], timeout=180)
            after = {n: file_identity(ckpt / n) for n in os.listdir(ckpt)}
        finally:
            _run_quiet(["mount", "-o", "remount,rw", str(ckpt)])
    try:
        chosen = json.loads(point.stdout)
    except ValueError:
        chosen = {}
    failed_q = [q for q in chosen.get("quarantined", []) if not q.get("ok")]
    q_events = events_of(run_dir, "quarantine")
    failures = events_of(run_dir, "failure")
    evidence = " | ".join(" ".join(e.get("evidence") or []) for e in failures)
    facts = {"filesystem": how, "resume_point_exit": point.returncode, "resume_step": chosen.get("step"),
             "quarantine_errors": [q.get("error") for q in failed_q], "run_exit": run.returncode,
             "run_quarantine_events": [(q.get("ok"), q.get("error")) for q in q_events],
             "evidence": evidence[:300], "run_end": [e.get("reason") for e in events_of(run_dir, "run_end")]}
    f.expect(point.returncode == 0 and chosen.get("step") == 10,
             f"resume-point on the read-only dir: exit {point.returncode}, step {chosen.get('step')}")
    f.expect(failed_q and all("read-only" in str(q.get("error")).lower() for q in failed_q),
             f"the failed quarantine is not reported as such: {chosen.get('quarantined')}")
    f.expect(not supervisor_traceback(point.stderr + run.stderr), "a supervise command printed a traceback")
    f.expect(before == after, "a file on the read-only filesystem changed (impossible unless remount failed)")
    starts = events_of(run_dir, "attempt_start")
    f.expect(starts and starts[0].get("resume_step") == 10, f"run did not resume from step 10: {starts[:1]}")
    f.expect(q_events and not any(q.get("ok") for q in q_events), "run: no failed-quarantine event recorded")
    f.expect("read-only" in evidence.lower(), f"the child's failed save is not the evidence: {evidence[:200]!r}")
    f.expect(events_of(run_dir, "run_end"), "no run_end: the supervisor did not decide")
    return f.outcome("read_only_dir", trial, f"read-only {how}", facts, started)


def vanishing_dir_trial(work_dir: Path, trial: int = 0) -> TrialOutcome:
    """Fault 6b: the checkpoint directory is renamed away mid-run (an unmounted or moved volume).
    The attempt's next save fails; the supervisor must record it and decide. The next start must
    not quietly train from step 0 as if the run were new: its own event log says checkpoints up
    to step N were durable, so starting fresh is an alarm."""
    started = time.monotonic()
    f = Findings()
    base = work_dir / f"vanish-{trial}"
    run_dir = base / "run"
    ckpt = run_dir / "checkpoints"
    train = ["--", PY, PLAIN, "--steps", "40", "--step-time", "0.05", "--save-every", "10"]
    base.mkdir(parents=True)
    proc = start_supervise(["run", "--run-dir", str(run_dir), "--quiet", *FAST, *train], base / "first.err")
    saved = wait_until(lambda: (ckpt / "step=10.ckpt").exists(), 120, 0.01)
    gone_to = run_dir / "checkpoints.gone"
    if saved:
        os.rename(ckpt, gone_to)
    try:
        first_rc = proc.wait(120)
    except subprocess.TimeoutExpired:
        proc.kill()
        first_rc = None
    first_err = (base / "first.err").read_text(errors="replace")
    f.expect(saved, "step=10.ckpt never appeared")
    f.expect(first_rc is not None and not supervisor_traceback(first_err),
             f"the first supervise did not end cleanly (exit {first_rc})")
    f.expect(events_of(run_dir, "run_end"), "no run_end after the directory vanished")
    durable = max((e.get("step") or 0 for e in events_of(run_dir, "save_end") if e.get("ok")), default=None)
    second = supervise(["run", "--run-dir", str(run_dir), "--quiet", *FAST, *train], timeout=180)
    starts = events_of(run_dir, "attempt_start")
    last_start = starts[-1] if starts else {}
    alarms = [e for e in events_of(run_dir) if e.get("event") in ("resume_mismatch", "warning")
              and e.get("attempt", 0) >= last_start.get("attempt", 0)]
    ends = events_of(run_dir, "run_end")
    fresh = last_start.get("resume_step") is None
    facts = {"first_exit": first_rc, "second_exit": second.returncode, "durable_step_recorded": durable,
             "second_resume_step": last_start.get("resume_step"), "alarms": [a.get("event") for a in alarms],
             "second_outcome": ends[-1].get("outcome") if ends else None,
             "first_evidence": [" ".join(e.get("evidence") or [])[:160] for e in events_of(run_dir, "failure")][:1]}
    f.expect(not supervisor_traceback(second.stderr), "the second supervise printed a traceback")
    silently_fresh = fresh and durable and not alarms and ends and ends[-1].get("outcome") == "complete"
    f.concern(not silently_fresh,
              f"the next start trained from step 0 with no alarm although the event log records a durable "
             f"checkpoint at step {durable} (the checkpoint dir had vanished)")
    label = "restarted from 0 silently" if silently_fresh else "missing checkpoints flagged"
    return f.outcome("vanishing_dir", trial, label, facts, started)


def clock_jump_trial(work_dir: Path, trial: int, direction: str) -> TrialOutcome:
    """Fault 6c: the wall clock steps by two hours while ``supervise run`` works (see
    :mod:`faults.clockjump`). ``forward``: during a healthy training with stall detection on:
    no stall may be declared and the child must not be killed. ``backward``: during the backoff
    before a restart: the restart must still come after the backoff, not two hours later."""
    started = time.monotonic()
    f = Findings()
    base = work_dir / f"clock-{direction}-{trial}"
    base.mkdir(parents=True)
    run_dir = base / "run"
    offset = base / "offset"
    offset.write_text("0")
    wrapper = [PY, str(CLOCKJUMP), str(offset)]
    log1 = run_dir / "supervisor" / "attempt-1.log"
    if direction == "forward":
        args = ["run", "--run-dir", str(run_dir), "--quiet", "--stall-timeout", "20", *FAST,
                "--", PY, PLAIN, "--steps", "14", "--step-time", "0.5", "--save-every", "100"]
        proc = start_supervise(args, base / "err", wrapper=wrapper)
        wait_until(lambda: log1.exists() and "step 4 " in log1.read_text(errors="replace"), 90, 0.01)
        time.sleep(0.2)  # mid-step: the supervisor has taken step 4 in; step 5 is 0.3 s away
        offset.write_text("7200")
        try:
            rc = proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = None
        stalls = events_of(run_dir, "stall")
        attempts = events_of(run_dir, "attempt_start")
        facts = {"exit": rc, "stall_events": [s.get("reason") for s in stalls], "attempts": len(attempts),
                 "classes": [e.get("class") for e in events_of(run_dir, "attempt_end")]}
        f.expect(rc == 0, f"supervise exited {rc}")
        f.expect(not stalls, f"a 2 h forward clock step was taken for a stall: {facts['stall_events']}")
        f.expect(len(attempts) == 1, f"{len(attempts)} attempts: the healthy child was killed and restarted")
    else:
        args = ["run", "--run-dir", str(run_dir), "--quiet", "--set", "policy.native_crash.backoff=3",
                "--", PY, PLAIN, "--steps", "20", "--save-every", "5"]
        proc = start_supervise(args, base / "err", wrapper=wrapper, env={"FAULT_SEGFAULT_AT": "8"})
        failed = wait_until(lambda: events_of(run_dir, "decision"), 90, 0.01)
        offset.write_text("-7200")
        jumped = time.monotonic()
        restarted = wait_until(lambda: len(events_of(run_dir, "attempt_start")) >= 2, 15, 0.05)
        waited = time.monotonic() - jumped
        if restarted:
            try:
                rc = proc.wait(90)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = None
        else:
            proc.kill()
            proc.wait()
            rc = None
        facts = {"decision_seen": bool(failed), "restart_after_s": round(waited, 2) if restarted else None,
                 "exit": rc, "backoff_s": 3}
        f.expect(failed, "the injected segfault never produced a decision")
        f.expect(restarted, "no restart within 15 s of a backward clock step during a 3 s backoff "
                            "(the backoff sleeps on the wall clock)")
        f.expect(rc == 0, f"supervise exited {rc}")
    label = "no effect" if not f.problems else "clock step changed the supervisor's behaviour"
    outcome = f.outcome(f"clock_jump_{direction}", trial, label, facts, started)
    if outcome.ok:
        shutil.rmtree(base, ignore_errors=True)
    return outcome


# ============================================================================= 7: hostile inputs


class _Hostile:
    """Unpickling this runs ``touch MARKER``. Only ever pickled here, never loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def write_hostile_checkpoints(ckpt: Path, marker: Path, step: int) -> list[Path]:
    """Checkpoints whose pickle runs code when loaded: a torch-zip layout (``archive/data.pkl``),
    a raw (legacy-style) pickle, and a ``last.ckpt`` of the zip kind, each with the step of its
    name inside. Their steps are above ``step`` so a careless resume-point choice picks them."""
    def payload(at: int) -> bytes:
        return pickle.dumps({"step": at, "global_step": at, "state": _Hostile(marker)}, protocol=2)

    out = []
    for name, at in ((f"step={step + 10}.ckpt", step + 10), ("last.ckpt", step + 20)):
        path = ckpt / name
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("archive/data.pkl", payload(at))
            archive.writestr("archive/byteorder", "little")
            archive.writestr("archive/version", "3\n")
        out.append(path)
    legacy = ckpt / f"step={step + 20}.pt"
    legacy.write_bytes(payload(step + 20))
    out.append(legacy)
    past = time.time() - 60
    for path in out:
        os.utime(path, (past, past))
    return out


def hostile_pickle_trial(work_dir: Path, trial: int = 0) -> TrialOutcome:
    """Fault 7a: checkpoints whose pickle would run ``touch MARKER``. ``supervise verify``,
    ``supervise resume-point --quarantine`` and ``supervise run`` (which validates before each
    attempt) must never run it (the core criterion). Beyond it (``concerns``): a pickle that calls
    ``os.system`` is not a valid checkpoint, is not chosen as the resume point, and the run
    resumes from the real step=40 checkpoint and completes."""
    started = time.monotonic()
    f = Findings()
    base = work_dir / f"pickle-{trial}"
    run_dir = base / "run"
    ckpt = run_dir / "checkpoints"
    marker = base / "PWNED"
    made = _make_checkpoints(run_dir, ckpt, 40, 40)
    f.expect(made.returncode == 0, f"could not make the real checkpoint: {made.stderr[-300:]}")
    with contextlib.suppress(OSError):
        (ckpt / "last.ckpt").unlink()
    hostile = write_hostile_checkpoints(ckpt, marker, 40)
    verify = supervise(["verify", "--json", *map(str, hostile)], timeout=60)
    try:
        verdicts = {os.path.basename(r["path"]): (r["verdict"], r["reason"]) for r in json.loads(verify.stdout)}
    except (ValueError, KeyError, TypeError):
        verdicts = {}
    point = supervise(["resume-point", "--quarantine", "--settle", "0", "--json", str(ckpt)], timeout=60)
    try:
        chosen = json.loads(point.stdout)
    except ValueError:
        chosen = {}
    run = supervise(["run", "--run-dir", str(run_dir), "--quiet", "--", PY, PLAIN, "--steps", "45",
                     "--save-every", "45"], timeout=180)
    starts = events_of(run_dir, "attempt_start")
    failures = events_of(run_dir, "failure")
    facts = {"verdicts": verdicts, "verify_exit": verify.returncode, "resume_point": chosen.get("path"),
             "run_exit": run.returncode, "run_resume": starts[-1].get("resume_path") if starts else None,
             "run_failure": [" ".join(e.get("evidence") or [])[:200] for e in failures][:1]}
    f.expect(not marker.exists(), "THE HOSTILE PICKLE RAN: the marker file exists")
    f.expect(verdicts, f"verify gave no verdicts: {verify.stderr[-300:]}")
    f.expect(not supervisor_traceback(verify.stderr + point.stderr + run.stderr),
             "a supervise command printed a traceback")
    f.concern(all(v[0] != "valid" for v in verdicts.values()),
              f"a checkpoint whose pickle calls os.system verifies as valid: "
              f"{ {n: v for n, v in verdicts.items() if v[0] == 'valid'} }")
    f.concern(str(chosen.get("path", "")).endswith("step=40.ckpt"),
              f"resume-point chose the hostile {chosen.get('path')}, not step=40.ckpt")
    f.concern(run.returncode == 0 and starts and str(starts[-1].get("resume_path", "")).endswith("step=40.ckpt"),
              f"supervise run resumed from {facts['run_resume']} and exited {run.returncode}")
    return f.outcome("hostile_pickle", trial, "never executed" if not marker.exists() else "EXECUTED", facts, started)


def symlink_escape_trial(work_dir: Path, trial: int = 0) -> TrialOutcome:
    """Fault 7b: ``last.ckpt`` and ``step=99.ckpt`` are symlinks out of the checkpoint dir (to a
    torn file and to a valid-looking one). verify, resume-point --quarantine and a real run that
    saves and updates ``last.ckpt`` must never move, follow into, or write through them: the
    outside files keep their inode, size and mtime, and the run resumes from its own step=10."""
    started = time.monotonic()
    f = Findings()
    base = work_dir / f"symlink-{trial}"
    run_dir = base / "run"
    ckpt = run_dir / "checkpoints"
    outside = base / "outside"
    outside.mkdir(parents=True)
    made = _make_checkpoints(run_dir, ckpt, 10, 10)
    f.expect(made.returncode == 0, f"could not make the real checkpoint: {made.stderr[-300:]}")
    (ckpt / "last.ckpt").unlink(missing_ok=True)
    _tear_copy(ckpt / "step=10.ckpt", outside / "precious.ckpt")
    shutil.copyfile(ckpt / "step=10.ckpt", outside / "other_run.ckpt")
    past = time.time() - 60
    os.utime(outside / "other_run.ckpt", (past, past))
    (ckpt / "last.ckpt").symlink_to(outside / "precious.ckpt")
    (ckpt / "step=99.ckpt").symlink_to(outside / "other_run.ckpt")
    before = {p.name: file_identity(p) for p in outside.iterdir()}
    links = {n: os.readlink(ckpt / n) for n in ("last.ckpt", "step=99.ckpt")}
    verify = supervise(["verify", "--json", str(ckpt / "last.ckpt"), str(ckpt / "step=99.ckpt")], timeout=60)
    point = supervise(["resume-point", "--quarantine", "--settle", "0", "--json", str(ckpt)], timeout=60)
    try:
        chosen = json.loads(point.stdout)
    except ValueError:
        chosen = {}
    links_mid = {n: os.readlink(ckpt / n) if (ckpt / n).is_symlink() else None for n in links}
    run = supervise(["run", "--run-dir", str(run_dir), "--quiet", "--", PY, PLAIN, "--steps", "20",
                     "--save-every", "10"], timeout=180)
    after = {p.name: file_identity(p) for p in outside.iterdir()}
    starts = events_of(run_dir, "attempt_start")
    facts = {"resume_point": chosen.get("path"), "links_after_resume_point": links_mid,
             "run_exit": run.returncode, "run_resume": starts[-1].get("resume_path") if starts else None,
             "last_after_run": os.readlink(ckpt / "last.ckpt") if (ckpt / "last.ckpt").is_symlink()
             else ("regular file" if (ckpt / "last.ckpt").exists() else None),
             "outside_after": sorted(after)}
    f.expect(before == after, f"a file outside the checkpoint dir changed: {before} -> {after}")
    f.expect(links_mid == links, f"resume-point --quarantine moved or changed a symlink: {links_mid}")
    f.expect(str(chosen.get("path", "")).endswith("step=10.ckpt"), f"resume-point chose {chosen.get('path')}")
    f.expect(verify.returncode != 0, "verify called the escaping symlinks valid")
    f.expect(run.returncode == 0, f"supervise run exited {run.returncode}: {run.stderr[-300:]}")
    f.expect(starts and str(starts[-1].get("resume_path", "")).endswith("step=10.ckpt"),
             f"run resumed from {facts['run_resume']}")
    f.expect(not supervisor_traceback(verify.stderr + point.stderr + run.stderr), "a supervise command printed a traceback")
    return f.outcome("symlink_escape", trial, "outside untouched" if before == after else "OUTSIDE CHANGED",
                     facts, started)


def forged_control_trial(work_dir: Path, trial: int = 0, *, flood: int = 20000) -> TrialOutcome:
    """Fault 7c: while a real run trains, datagrams with a wrong token (a heartbeat claiming step
    999999), malformed JSON, oversized ones and a flood hit the control port. The run must
    complete with its true steps, and ``control_dropped`` must count the rejects."""
    started = time.monotonic()
    f = Findings()
    base = work_dir / f"forged-{trial}"
    base.mkdir(parents=True)
    run_dir = base / "run"
    proc = start_supervise(["run", "--run-dir", str(run_dir), "--quiet", "--", PY, PLAIN, "--steps", "60",
                            "--step-time", "0.05", "--save-every", "20"], base / "err")
    start = wait_until(lambda: events_of(run_dir, "run_start"), 60)
    address = (start[0].get("control") if start else None) or ""
    sent = {"bad_token": 0, "malformed": 0, "oversized": 0, "flood": 0}
    log1 = run_dir / "supervisor" / "attempt-1.log"
    wait_until(lambda: log1.exists() and "step 1 " in log1.read_text(errors="replace"), 90)
    if f.expect(address.startswith("udp://"), f"no control address in run_start: {address!r}"):
        host, port = address[len("udp://"):].rsplit(":", 1)
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        target = (host.strip("[]"), int(port))
        forged = [json.dumps({"v": 1, "kind": "heartbeat", "token": "0" * 32, "step": 999999}).encode(),
                  json.dumps({"v": 1, "kind": "hello", "token": "guess", "reply_port": 9}).encode()]
        for i in range(200):
            sock.sendto(forged[i % 2], target)
            sent["bad_token"] += 1
            sock.sendto(b"{not json" if i % 3 else b"\xff\xfe\x00garbage", target)
            sent["malformed"] += 1
        for _ in range(50):
            sock.sendto(b"{" + b" " * 9000 + b"}", target)
            sent["oversized"] += 1
        for i in range(flood):
            with contextlib.suppress(OSError):
                sock.sendto(forged[0], target)
                sent["flood"] += 1
        sock.close()
    try:
        rc = proc.wait(120)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = None
    dropped = events_of(run_dir, "control_dropped")
    by_reason = dropped[-1].get("by_reason", {}) if dropped else {}
    steps = [e.get("step") for e in events_of(run_dir, "progress")]
    ends = events_of(run_dir, "run_end")
    facts = {"sent": sent, "dropped": by_reason, "exit": rc, "max_progress_step": max(steps, default=None),
             "last_step": ends[-1].get("last_step") if ends else None}
    f.expect(rc == 0, f"supervise exited {rc}")
    f.expect(ends and ends[-1].get("last_step") == 60, f"run_end last_step is not 60: {facts['last_step']}")
    f.expect(max(steps, default=0) <= 60, "a forged heartbeat's step was taken as progress")
    f.expect(dropped, "no control_dropped event recorded")
    for reason in ("bad_token", "malformed", "oversized"):
        f.expect(by_reason.get(reason, 0) > 0, f"control_dropped has no {reason} count: {by_reason}")
    return f.outcome("forged_control", trial, "dropped and counted" if not f.problems else "accepted or lost",
                     facts, started)


def big_line_trial(work_dir: Path, trial: int = 0, *, megabytes: int = 256) -> TrialOutcome:
    """Fault 7d: the child prints one line of ``megabytes`` MB with no newline until the end. The
    supervisor's memory must stay bounded (far below the line) and the attempt log must hold
    every byte."""
    started = time.monotonic()
    f = Findings()
    base = work_dir / f"bigline-{trial}"
    base.mkdir(parents=True)
    run_dir = base / "run"
    child = ("import sys\nchunk = b'x' * (1 << 20)\nw = sys.stdout.buffer.write\n"
             f"for _ in range({megabytes}):\n    w(chunk)\nw(b'\\n')\nsys.stdout.flush()\n")
    proc = start_supervise(["run", "--run-dir", str(run_dir), "--quiet", "--", PY, "-c", child], base / "err")
    peak = 0
    while proc.poll() is None:  # VmHWM is the lifetime peak: the last sample before the exit has it
        peak = max(peak, peak_rss_kib(proc.pid) or 0)
        time.sleep(0.02)
    rc = proc.returncode
    log = run_dir / "supervisor" / "attempt-1.log"
    expected = (megabytes << 20) + 1
    size = log.stat().st_size if log.exists() else 0
    intact = size == expected and _all_x_then_newline(log, megabytes << 20)
    facts = {"megabytes": megabytes, "exit": rc, "log_bytes": size, "expected_bytes": expected,
             "peak_rss_mib": round(peak / 1024, 1),
             "warnings": [e.get("reason") for e in events_of(run_dir, "warning")]}
    f.expect(rc == 0, f"supervise exited {rc}")
    f.expect(intact, f"the attempt log does not hold every byte: {size} of {expected}")
    f.expect(peak and peak < 200 * 1024, f"supervisor peak RSS {peak / 1024:.0f} MiB for a {megabytes} MB line")
    outcome = f.outcome("big_line", trial, f"{megabytes} MB line", facts, started)
    shutil.rmtree(base, ignore_errors=True)  # hundreds of MB of log
    return outcome


def _all_x_then_newline(path: Path, count: int) -> bool:
    with open(path, "rb") as handle:
        left = count
        block = b"x" * (1 << 20)
        while left:
            chunk = handle.read(min(left, 1 << 20))
            if not chunk or chunk != block[: len(chunk)]:
                return False
            left -= len(chunk)
        return handle.read() == b"\n"
