"""The README's first command runs `supervise demo`; it must show what its help text promises:
a restart after a real segfault, an emergency save at the preemption, the requeue exit, the
quarantine of a torn last.ckpt, and the resume from the newest valid step checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")


def run_or_show(argv: list[str], timeout: float, cwd: Path, run_dir: Path) -> subprocess.CompletedProcess[str]:
    """Run the demo; past ``timeout``, fail with what it printed and the events it logged (a bare
    TimeoutExpired says nothing of where it was)."""
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd,
                          start_new_session=True) as proc:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            log = run_dir / "supervisor" / "events.jsonl"
            events = log.read_text().splitlines()[-15:] if log.exists() else []
            pytest.fail(f"the demo did not end in {timeout:.0f} s; its output:\n{out[-3000:]}\nlast events:\n"
                        + "\n".join(events))
    return subprocess.CompletedProcess(argv, proc.returncode, out, "")


def test_demo_shows_restart_emergency_save_requeue_quarantine_and_resume(tmp_path: Path) -> None:
    run_dir = tmp_path / "demo"
    res = run_or_show([sys.executable, "-m", "supervisor", "demo", "--run-dir", str(run_dir)], 300, tmp_path, run_dir)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    events = [json.loads(line) for line in (run_dir / "supervisor" / "events.jsonl").read_text().splitlines()]
    by = lambda name: [e for e in events if e["event"] == name]  # noqa: E731
    ends = [e["class"] for e in by("attempt_end")]
    assert ends == ["native_crash", "preempted", "completed"], ends
    assert by("decision")[0]["action"] == "restart"
    assert [a["decision"] for a in by("arbitration")] == ["emergency_save"]
    emergency = [s for s in by("save_end") if s["attempt"] == 2][-1]
    assert by("run_end")[0]["outcome"] == "requeue" and by("run_end")[0]["exit_code"] == 75
    quarantined = by("quarantine")
    assert quarantined and Path(quarantined[0]["dest"]).name.startswith("CORRUPT_last.ckpt.")
    assert Path(quarantined[0]["dest"]).exists()  # renamed aside, never deleted
    resume = [r for r in by("resume_point") if r["attempt"] == 3][0]
    assert resume["step"] == emergency["step"] and Path(resume["path"]).name == f"step={emergency['step']}.ckpt"
    assert "CORRUPT_last.ckpt" in out and "emergency save" in out

    # Its report fits 100 columns when written to a file or a pipe (no COLUMNS, not a terminal), and
    # the fitted text lost nothing: every word of the wide layout is still there.
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    fitted = subprocess.run([sys.executable, "-m", "supervisor", "report", str(run_dir)], capture_output=True,
                            text=True, timeout=120, cwd=tmp_path, env=env)
    wide = subprocess.run([sys.executable, "-m", "supervisor", "report", str(run_dir)], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path, env={**env, "COLUMNS": "1000"})
    assert fitted.returncode == 0 and wide.returncode == 0, fitted.stderr
    too_long = [line for line in fitted.stdout.splitlines() if len(line) > 100]
    assert not too_long, too_long
    assert any(len(line) > 100 for line in wide.stdout.splitlines())  # the demo's report does need fitting
    assert _characters(fitted.stdout) == _characters(wide.stdout)  # wrapped, nothing cut


def _characters(text: str) -> list[str]:
    """The text's characters, layout aside: no spaces, no rules (their length follows the width)."""
    return sorted(c for c in text if not c.isspace() and c not in "-=")
