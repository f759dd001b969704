"""Fault 4: the supervisor itself is SIGKILLed mid-run: its child must not outlive it, and the
next start takes the lock over and resumes from the newest valid checkpoint.

The whole tree goes, not only the direct child: a training started through a shell
(``bash -c 'python train.py; echo'``) leaves a grandchild that PDEATHSIG alone never reached, and a
process may leave the group (``setsid``). The watchdog the child's shim forks kills them all."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import REPO, pid_alive, start_supervise, wait_for

from faults.trials import supervisor_killed_trial


@pytest.mark.slow
def test_sigkilled_supervisor_leaves_no_orphan_and_the_next_start_resumes(
        tmp_path: Path, fault_seed: int, fault_outcomes: list) -> None:
    pytest.importorskip("torch")
    outcome = supervisor_killed_trial(tmp_path, 0, random.Random(fault_seed))
    fault_outcomes.append(outcome)
    assert outcome.ok, f"FAULT_SEED={fault_seed}: {outcome.explain()}"


# The training: a shell runs python (the grandchild of the supervisor), which starts a worker in
# the same group and one that left it with setsid; each writes its pid to a file.
TREE = textwrap.dedent("""\
    import os, subprocess, sys, time
    out = sys.argv[1]
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    escaped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    for name, pid in (("train", os.getpid()), ("worker", worker.pid), ("escaped", escaped.pid)):
        with open(os.path.join(out, name + ".pid"), "w") as fh:
            fh.write(str(pid))
    print("step 1", flush=True)
    time.sleep(120)
""")

# A minimal supervisor: one Child (the real class, real shim and watchdog), then sleep until killed.
MINI_SUPERVISOR = textwrap.dedent("""\
    import os, sys, time
    from pathlib import Path
    from supervisor.child import Child, ChildSpec
    out, script = sys.argv[1], sys.argv[2]
    cmd = ["bash", "-c", f"{sys.executable} {script} {out}; echo after"]
    child = Child(ChildSpec(argv=cmd, env=dict(os.environ), log_path=Path(out) / "attempt-1.log", echo=False))
    child.start()
    Path(out, "child.pid").write_text(str(child.pid))
    time.sleep(120)
""")


def _read_pids(out: Path) -> dict[str, int]:
    return {name: int((out / f"{name}.pid").read_text()) for name in ("child", "train", "worker", "escaped")}


def _all_written(out: Path) -> bool:
    return all((out / f"{name}.pid").is_file() and (out / f"{name}.pid").read_text()
               for name in ("child", "train", "worker", "escaped"))


def _kill_leftovers(pids: dict[str, int]) -> None:
    for pid in pids.values():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_the_whole_tree_dies_with_a_sigkilled_supervisor(tmp_path: Path) -> None:
    (tmp_path / "tree.py").write_text(TREE)
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    mini = subprocess.Popen([sys.executable, "-c", MINI_SUPERVISOR, str(tmp_path), str(tmp_path / "tree.py")],
                            env=env)
    try:
        assert wait_for(lambda: _all_written(tmp_path), 30), "the training never started"
        pids = _read_pids(tmp_path)
        assert all(pid_alive(pid) for pid in pids.values())
        mini.send_signal(signal.SIGKILL)
        mini.wait()
        gone = wait_for(lambda: not any(pid_alive(pid) for pid in pids.values()), 5.0, 0.01)
        alive = {name: pid for name, pid in pids.items() if pid_alive(pid)}
    finally:
        if mini.poll() is None:
            mini.kill()
    _kill_leftovers(pids)
    assert gone, f"outlived their SIGKILLed supervisor: {alive}"


def test_supervise_run_killed_takes_the_shell_and_its_grandchild_along(tmp_path: Path) -> None:
    (tmp_path / "tree.py").write_text(TREE)
    run_dir = tmp_path / "run"
    proc = start_supervise(["run", "--run-dir", str(run_dir), "--quiet", "--",
                            "bash", "-c", f"{sys.executable} {tmp_path / 'tree.py'} {tmp_path}; echo after"])
    names = ("train", "worker", "escaped")
    try:
        started = wait_for(lambda: all((tmp_path / f"{n}.pid").is_file() and (tmp_path / f"{n}.pid").read_text()
                                       for n in names), 60)
        if not started:
            proc.kill()
            pytest.fail(f"the training never started: {proc.communicate()[1][-3000:]}")
        pids = {n: int((tmp_path / f"{n}.pid").read_text()) for n in names}
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        gone = wait_for(lambda: not any(pid_alive(pid) for pid in pids.values()), 5.0, 0.01)
        alive = {name: pid for name, pid in pids.items() if pid_alive(pid)}
    finally:
        if proc.poll() is None:
            proc.kill()
    _kill_leftovers(pids)
    assert gone, f"outlived the SIGKILLed supervisor: {alive}"


def test_the_watchdog_costs_no_cpu_while_the_training_runs(tmp_path: Path) -> None:
    """Blocked in read(): not a single scheduled tick of CPU over a second of training."""
    from supervisor.child import Child, ChildSpec

    child = Child(ChildSpec(argv=[sys.executable, "-c", "import time; time.sleep(30)"], env=dict(os.environ),
                            log_path=tmp_path / "a.log", echo=False))
    child.start()
    try:
        pgid = child.pid
        assert pgid is not None

        def watchdog() -> int | None:
            for name in os.listdir("/proc"):
                if name.isdigit() and int(name) != pgid:
                    try:
                        stat = Path(f"/proc/{name}/stat").read_text()
                    except OSError:
                        continue
                    fields = stat.rsplit(")", 1)[1].split()
                    if int(fields[2]) == pgid and "supervise-watch" in stat:
                        return int(name)
            return None

        assert wait_for(lambda: watchdog() is not None, 10)
        pid = watchdog()
        assert pid is not None
        time.sleep(0.3)  # past its start-up
        before = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        time.sleep(1.0)
        after = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        # utime and stime (fields 14 and 15 of stat; 11 and 12 after the name)
        assert (after[11], after[12]) == (before[11], before[12])
        assert after[0] == "S"  # sleeping
    finally:
        child.kill()
        child.finish()
