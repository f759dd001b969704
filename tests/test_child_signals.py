"""The child's signal shield and its watchdog, with real processes and real signals.

Shield (issue #12 item 8): under ``srun`` Slurm sends SIGTERM to every process of the step at a
notice; the supervisor decides, so the child starts with SIGTERM ignored. A script that installs
its own handler gets the signal as before; SIGKILL always ends everything.

Watchdog (issue #13 item 5): the training's whole process group dies with the supervisor, and a
normal end leaves no watchdog behind.
"""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import REPO, pid_alive, wait_for

from supervisor.child import TREE_ENV, Child, ChildSpec

# Starts a grandchild that sleeps, prints both pids, then waits; optionally installs a handler first.
FAMILY = textwrap.dedent("""\
    import os, signal, subprocess, sys, time
    mode = sys.argv[1]
    if mode == "client":
        from supervisor import client
        client.install()  # replaces the inherited SIG_IGN
    elif mode == "handler":
        signal.signal(signal.SIGTERM, lambda *_: (print("handler got SIGTERM", flush=True), sys.exit(3)))
    grand = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    print("pids", os.getpid(), grand.pid, flush=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if mode == "client":
            from supervisor import client
            if client.should_stop():
                print("client stop:", client.stop_reason(), flush=True)
                grand.kill()
                sys.exit(0)
        time.sleep(0.01)
""")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUPERVISOR_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _start(tmp_path: Path, mode: str, shield: tuple[int, ...] = (signal.SIGTERM,)) -> Child:
    script = tmp_path / "family.py"
    script.write_text(FAMILY)
    child = Child(ChildSpec(argv=[sys.executable, str(script), mode], env=_env(),
                            log_path=tmp_path / f"{mode}.log", echo=False, shield_signals=shield))
    child.start()
    return child


def _pids(child: Child, timeout: float = 20.0) -> tuple[int, int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for _ts, _stream, line in child.lines.drain(100):
            if line.startswith("pids "):
                _, main, grand = line.split()
                return int(main), int(grand)
        time.sleep(0.01)
    child.kill()
    pytest.fail(f"the child never printed its pids: {child.tail.text()[-2000:]}")


def _ignores(pid: int, sig: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    raise AssertionError(f"no SigIgn line for pid {pid}")


def _output(child: Child) -> str:
    return child.tail.text()


def test_a_shielded_child_and_its_grandchild_survive_sigterm_and_die_with_sigkill(tmp_path: Path) -> None:
    child = _start(tmp_path, "plain")
    main, grand = _pids(child)
    try:
        assert _ignores(main, signal.SIGTERM) and _ignores(grand, signal.SIGTERM)  # inherited through fork+exec
        assert child.catches(signal.SIGTERM) is False  # the supervisor must end it with SIGKILL
        child.signal_group(signal.SIGTERM)
        time.sleep(0.5)
        assert child.poll() is None and pid_alive(main) and pid_alive(grand)
    finally:
        exit_ = child.kill()
        child.finish()
    assert exit_.signal == signal.SIGKILL
    assert wait_for(lambda: not pid_alive(grand), 5.0)


def test_a_script_that_installs_a_handler_receives_sigterm(tmp_path: Path) -> None:
    child = _start(tmp_path, "handler")
    main, grand = _pids(child)
    try:
        # A handler (unlike SIG_IGN) is reset to the default by exec: what the script starts after
        # installing it gets SIGTERM as before too.
        assert not _ignores(main, signal.SIGTERM) and not _ignores(grand, signal.SIGTERM)
        assert child.catches(signal.SIGTERM) is True  # it can be asked to leave with SIGTERM
        child.signal_group(signal.SIGTERM)
        exit_ = child.wait(10)
    finally:
        child.signal_group(signal.SIGKILL)
        child.finish()
    assert exit_.exit_code == 3
    assert "handler got SIGTERM" in _output(child)
    assert wait_for(lambda: not pid_alive(grand), 5.0)


def test_client_install_takes_sigterm_back_from_an_inherited_sig_ign(tmp_path: Path) -> None:
    child = _start(tmp_path, "client")
    main, _grand = _pids(child)
    try:
        assert not _ignores(main, signal.SIGTERM)  # install() replaced SIG_IGN with its handler
        assert child.catches(signal.SIGTERM) is True
        child.signal_group(signal.SIGTERM)
        exit_ = child.wait(10)
    finally:
        child.signal_group(signal.SIGKILL)
        child.finish()
    assert exit_.exit_code == 0
    assert "client stop: signal SIGTERM" in _output(child)


def test_without_a_shield_sigterm_ends_the_child_as_before(tmp_path: Path) -> None:
    child = _start(tmp_path, "plain", shield=())
    main, _grand = _pids(child)
    try:
        assert not _ignores(main, signal.SIGTERM)
        child.signal_group(signal.SIGTERM)
        exit_ = child.wait(10)
    finally:
        child.signal_group(signal.SIGKILL)
        child.finish()
    assert exit_.signal == signal.SIGTERM


def _group_members(pgid: int) -> list[int]:
    """Every process (zombies included) whose process group is ``pgid``."""
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            members.append(int(name))
    return members


def test_a_normal_end_leaves_no_watchdog_and_no_zombie(tmp_path: Path) -> None:
    child = Child(ChildSpec(argv=[sys.executable, "-c", "import time; time.sleep(0.3); print('done')"],
                            env=_env(), log_path=tmp_path / "a.log", echo=False))
    child.start()
    pgid = child.pid
    assert pgid is not None
    assert wait_for(lambda: len(_group_members(pgid)) == 2, 10.0)  # the training and its watchdog
    exit_ = child.wait(10)
    child.finish()

    assert exit_.exit_code == 0
    assert _group_members(pgid) == []


def test_the_child_carries_the_tree_marker(tmp_path: Path) -> None:
    child = Child(ChildSpec(argv=[sys.executable, "-c", f"import os; print(os.environ['{TREE_ENV}'])"],
                            env=_env(), log_path=tmp_path / "a.log", echo=False))
    child.start()
    child.wait(10)
    child.finish()
    assert child.tail.text().strip() == child.tree_marker and len(child.tree_marker) == 32
