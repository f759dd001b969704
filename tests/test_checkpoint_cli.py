"""``supervise verify`` and ``supervise resume-point``: rows, JSON and exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import ckpt_factory as cf
from supervisor.cli.checkpoint_cmds import register

OLD = time.time() - 3600


@pytest.fixture(scope="module")
def cli() -> click.Group:
    group = click.Group("supervise")
    register(group)
    return group


def run(cli: click.Group, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture()
def ckpts(tmp_path: Path) -> Path:
    d = tmp_path / "ckpts"
    d.mkdir()
    for step in (900, 10000, 9500):
        cf.save_zip(d / f"step={step}.ckpt", step)
    return d


def test_verify_good_files_exit_0(cli: click.Group, ckpts: Path) -> None:
    code, out, _ = run(cli, "verify", str(ckpts / "step=900.ckpt"), str(ckpts / "step=9500.ckpt"))
    assert code == 0
    assert out.count("valid (whole) · trusted") == 2 and "invalid" not in out
    assert "torch_zip" in out and "step 900" in out and "L3" in out


def test_verify_json_fields_and_exit_1_for_a_torn_file(cli: click.Group, ckpts: Path) -> None:
    torn = ckpts / "step=10000.ckpt"
    cf.truncate(torn, 500)
    code, out, _ = run(cli, "verify", "--json", str(torn), str(ckpts / "step=900.ckpt"))
    assert code == 1
    rows = json.loads(out)
    assert [r["path"] for r in rows] == [str(torn), str(ckpts / "step=900.ckpt")]
    assert [r["ok"] for r in rows] == [False, True]
    assert rows[0]["format"] == "torch_zip" and rows[0]["step"] == 10000 and rows[0]["reason"]


def test_verify_deep_finds_a_hole(cli: click.Group, ckpts: Path) -> None:
    target = ckpts / "step=900.ckpt"
    offset, length = cf.tensor_payload_span(target)
    cf.zero_range(target, offset, min(length, 16))
    assert run(cli, "verify", str(target))[0] == 0
    code, out, _ = run(cli, "verify", "--deep", str(target))
    assert code == 1 and "CRC32 mismatch" in out and "L4" in out


def test_verify_usage_errors_exit_2(cli: click.Group, ckpts: Path) -> None:
    code, _, err = run(cli, "verify", str(ckpts / "nope.ckpt"))
    assert code == 2 and "nope.ckpt: no such file or directory" in err
    assert run(cli, "verify")[0] == 2  # no path at all


def test_verify_dir_of_checkpoints_expands(cli: click.Group, ckpts: Path) -> None:
    code, out, _ = run(cli, "verify", "--json", str(ckpts))
    assert code == 0 and sorted(r["step"] for r in json.loads(out)) == [900, 9500, 10000]


def test_verify_dangling_symlink_is_a_finding_not_a_usage_error(cli: click.Group, ckpts: Path) -> None:
    os.symlink("gone.ckpt", ckpts / "last.ckpt")
    code, out, _ = run(cli, "verify", str(ckpts / "last.ckpt"))
    assert code == 1 and "dangling symlink" in out


def test_resume_point_json(cli: click.Group, ckpts: Path) -> None:
    torn = ckpts / "step=10000.ckpt"
    cf.truncate(torn, 100)
    cf.set_mtime(torn, OLD)
    code, out, _ = run(cli, "resume-point", "--json", str(ckpts))
    assert code == 0
    data = json.loads(out)
    assert data["path"] == str(ckpts / "step=9500.ckpt") and data["step"] == 9500
    assert [c["step"] for c in data["candidates"]] == [10000, 9500, 900] and data["quarantined"] == []
    assert torn.exists()


def test_resume_point_quarantine(cli: click.Group, ckpts: Path) -> None:
    torn = ckpts / "step=10000.ckpt"
    cf.truncate(torn, 100)
    cf.set_mtime(torn, OLD)
    code, out, _ = run(cli, "resume-point", str(ckpts), "--quarantine", "--tag", "55")
    assert code == 0 and "quarantined:" in out and "resume point:" in out
    assert (ckpts / "CORRUPT_step=10000.ckpt.55").exists() and not torn.exists()


def test_resume_point_none_and_usage(cli: click.Group, tmp_path: Path) -> None:
    code, out, _ = run(cli, "resume-point", "--json", str(tmp_path))
    assert code == 1 and json.loads(out)["path"] is None
    code, out, _ = run(cli, "resume-point", str(tmp_path))
    assert code == 1 and "no checkpoints found" in out
    code, _, err = run(cli, "resume-point", str(tmp_path / "missing"))
    assert code == 2 and "no such file or directory" in err
    file_arg = cf.save_zip(tmp_path / "step=1.ckpt", 1)
    code, _, err = run(cli, "resume-point", str(file_arg))
    assert code == 2 and "not a directory" in err


def test_real_entry_point_registers_the_commands(ckpts: Path) -> None:
    proc = subprocess.run([*cf.SUPERVISE_MAIN, "resume-point", "--json", str(ckpts)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["step"] == 10000


def test_verify_a_fifo_by_name_reports_it_and_never_blocks(cli: click.Group, tmp_path: Path) -> None:
    fifo = tmp_path / "model.pt"
    os.mkfifo(fifo)
    code, out, _ = run(cli, "verify", str(fifo))  # opening a FIFO for reading would block forever
    assert code == 1 and "unverifiable" in out and "FIFO" in out


def test_resume_point_no_writers_quarantines_a_fresh_torn_file(cli: click.Group, ckpts: Path) -> None:
    torn = ckpts / "last.ckpt"
    cf.save_zip(torn, 20000)
    cf.truncate(torn, torn.stat().st_size // 2)  # just written: within the settle time
    code, out, _ = run(cli, "resume-point", str(ckpts), "--quarantine")
    assert torn.exists() and "in_progress" in out  # someone may still be writing it
    code, out, _ = run(cli, "resume-point", str(ckpts), "--quarantine", "--no-writers", "--json")
    data = json.loads(out)
    assert code == 0 and data["step"] == 10000 and not torn.exists()
    assert any(Path(p).name.startswith("CORRUPT_last.ckpt.") for p in os.listdir(ckpts))


def test_resume_point_safe_global_must_name_module_and_name(cli: click.Group, ckpts: Path) -> None:
    code, _, err = run(cli, "resume-point", str(ckpts), "--safe-global", "nocolon")
    assert code == 2 and "MODULE:NAME" in err
