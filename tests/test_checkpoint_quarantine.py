"""Quarantine renames aside and never deletes; on a read-only filesystem it reports and loses
nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

import ckpt_factory as cf
from supervisor.checkpoints.quarantine import quarantine, quarantine_name, quarantine_tag
from supervisor.checkpoints.validate import validate
from supervisor.states import Verdict

OLD = time.time() - 3600


def torn_dir(base: Path) -> Path:
    d = base / "ckpts"
    d.mkdir()
    cf.save_zip(d / "step=100.ckpt", 100)
    torn = cf.save_zip(d / "step=200.ckpt", 200)
    cf.truncate(torn, 300)
    cf.set_mtime(torn, OLD)
    return d


def test_rename_and_sidecar(tmp_path: Path) -> None:
    d = torn_dir(tmp_path)
    report = validate(d / "step=200.ckpt")
    record = quarantine(report, d, "777", now=1_700_000_000.0, host="node7")
    assert record.ok and record.error is None
    dest = d / "CORRUPT_step=200.ckpt.777"
    assert record.dest == str(dest) and dest.stat().st_size == 300  # same bytes, just renamed
    sidecar = json.loads((d / "CORRUPT_step=200.ckpt.777.json").read_text())
    assert sidecar["level"] == report.level and sidecar["reason"] == report.reason
    assert sidecar["host"] == "node7" and sidecar["original_path"] == str(d / "step=200.ckpt")
    assert sidecar["time_utc"] == "2023-11-14T22:13:20Z" and sidecar["format"] == "torch_zip"


def test_name_collisions_get_a_counter(tmp_path: Path) -> None:
    assert quarantine_name("last.ckpt", "9", {"CORRUPT_last.ckpt.9"}) == "CORRUPT_last.ckpt.9-2"
    assert quarantine_name("last.ckpt", "a/b") == "CORRUPT_last.ckpt.a_b"


def test_tag_from_slurm_or_clock() -> None:
    assert quarantine_tag({"SLURM_JOB_ID": "123456"}) == "123456"
    assert quarantine_tag({}, now=0.0) == "local-19700101T000000Z"


def test_refuses_paths_outside_the_dir(tmp_path: Path) -> None:
    d = torn_dir(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    stray = cf.save_zip(other / "step=1.ckpt", 1)
    cf.truncate(stray, 10)
    record = quarantine(validate(stray), d, "t")
    assert not record.ok and stray.exists()


def _supervise_in_readonly_mount(ckpt_dir: Path) -> subprocess.CompletedProcess[str]:
    """Run ``resume-point --quarantine`` with ``ckpt_dir`` read-only. Root ignores permission
    bits, so as root the directory is bind-mounted read-only in a private mount namespace
    (``unshare -m``; nothing leaks to the host); otherwise chmod does it."""
    args = [*cf.SUPERVISE, "resume-point", str(ckpt_dir), "--quarantine", "--json", "--tag", "ro", "--settle", "0"]
    if os.geteuid() != 0:
        ckpt_dir.chmod(0o555)
        try:
            return subprocess.run(args, capture_output=True, text=True, timeout=60)
        finally:
            ckpt_dir.chmod(0o755)
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("running as root without unshare(1): cannot make a read-only filesystem here")
    probe = subprocess.run([unshare, "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"running as root but cannot create a mount namespace: {probe.stderr.decode().strip()}")
    script = ('mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"')
    return subprocess.run([unshare, "-m", "sh", "-c", script, "sh", str(ckpt_dir), *args],
                          capture_output=True, text=True, timeout=60)


def test_read_only_filesystem_reports_and_loses_nothing(tmp_path: Path) -> None:
    d = torn_dir(tmp_path)
    before = sorted(os.listdir(d))
    proc = _supervise_in_readonly_mount(d)
    assert proc.returncode == 0, proc.stderr  # a resume point exists: step 100
    out = json.loads(proc.stdout)
    assert out["step"] == 100
    (record,) = out["quarantined"]
    assert record["ok"] is False and record["path"].endswith("step=200.ckpt")
    assert "Read-only file system" in record["error"] or "Permission denied" in record["error"]
    assert "Traceback" not in proc.stderr
    assert sorted(os.listdir(d)) == before  # nothing renamed, nothing lost
    assert validate(d / "step=200.ckpt").verdict is Verdict.CORRUPT
