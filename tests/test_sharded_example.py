"""examples/train_fsdp.py for real: FSDP2 on CPU (gloo) under ``torchrun``, two ranks, DCP shards
committed through ``supervisor.integrations.dcp``. Alone it trains, keeps committed step
directories, and resumes bit for bit; under ``supervise run`` a segfault on rank 1 is restarted
and the next attempt resumes from the newest committed directory, reported save by save.

Every run imports torch in three processes (torchrun's agent and two ranks): the independent runs
start together in a module fixture and each test checks its own.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the example needs torch")

from helpers import events_named, supervise_env

from supervisor import sharded
from supervisor.checkpoints import validate_checkpoint
from supervisor.states import Verdict

REPO = Path(__file__).resolve().parent.parent
FSDP = REPO / "examples" / "train_fsdp.py"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
TIMEOUT = 300


def start(argv: list[str], cwd: Path, extra: dict[str, str] | None = None) -> subprocess.Popen[str]:
    env = supervise_env({"OMP_NUM_THREADS": "1", **(extra or {})})
    env = {k: v for k, v in env.items() if not k.startswith(("FAULT_", "SLURM_"))} | (extra or {})
    return subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"{proc.args} did not finish in {TIMEOUT} s:\n{out[-4000:]}")
    return proc.returncode, out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("fsdp")
    for name in ("alone", "supervised"):
        (base / name).mkdir()
    procs = {
        "alone": start([*TORCHRUN, str(FSDP), "--steps", "8", "--save-every", "2", "--keep", "3",
                        "--ckpt-dir", str(base / "alone" / "ckpt")], base / "alone"),
        # Rank 1 segfaults after step 6 in attempt 1: torchrun fails the group, the supervisor
        # restarts it, attempt 2 resumes from step-4 (the newest committed directory).
        "supervised": start([sys.executable, "-m", "supervisor", "run", "--run-dir", str(base / "supervised" / "run"),
                             "--set", "policy.native_crash.backoff=0.1", "--", *TORCHRUN, str(FSDP),
                             "--steps", "10", "--save-every", "4"], base / "supervised",
                            {"FAULT_SEGFAULT_AT": "6", "FAULT_RANK": "1"}),
    }
    results = {name: finish(proc) for name, proc in procs.items()}
    # Resume the alone run from its step-6 in a separate run: must end bit for bit where it ended.
    (base / "resumed").mkdir()
    results["resumed"] = finish(start([*TORCHRUN, str(FSDP), "--steps", "8", "--save-every", "2", "--keep", "3",
                                       "--ckpt", str(base / "alone" / "ckpt" / "step-6"),
                                       "--ckpt-dir", str(base / "resumed" / "ckpt")], base / "resumed"))
    return {"base": base, **results}


def full_state(path: Path, tmp_path: Path) -> dict[str, Any]:
    """The sharded checkpoint as one plain state dict (DCP's own converter)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = tmp_path / f"{path.parent.parent.name}-{path.name}.pt"
    dcp_to_torch_save(str(path), str(out))
    return torch.load(out, weights_only=False)


def test_alone_every_save_is_a_committed_directory_and_retention_keeps_the_newest(runs: dict[str, Any]) -> None:
    code, out = runs["alone"]
    assert code == 0, out[-4000:]
    assert "training complete at step 8" in out
    ckpt = runs["base"] / "alone" / "ckpt"
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-4", "step-6", "step-8"]
    for name, step in (("step-4", 4), ("step-6", 6), ("step-8", 8)):
        marker = sharded.read_marker(ckpt / name)
        assert marker is not None and marker["world_size"] == 2 and marker["step"] == step
        assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(marker["files"])
        report = validate_checkpoint(ckpt / name, deep=True)
        assert report.verdict is Verdict.VALID and report.level == 4 and report.step == step, report.reason


def test_alone_resume_from_a_committed_directory_continues_bit_for_bit(runs: dict[str, Any], tmp_path: Path) -> None:
    code, out = runs["resumed"]
    assert code == 0, out[-4000:]
    assert f"resumed from {runs['base'] / 'alone' / 'ckpt' / 'step-6'} at step 6" in out
    ours = full_state(runs["base"] / "resumed" / "ckpt" / "step-8", tmp_path)
    reference = full_state(runs["base"] / "alone" / "ckpt" / "step-8", tmp_path)
    assert ours["step"] == reference["step"] == 8
    assert ours["model"].keys() == reference["model"].keys()
    for key in reference["model"]:
        assert torch.equal(ours["model"][key], reference["model"][key]), key


def test_supervised_a_crashed_rank_is_restarted_from_the_newest_committed_directory(runs: dict[str, Any]) -> None:
    code, out = runs["supervised"]
    run_dir = runs["base"] / "supervised" / "run"
    assert code == 0, out[-4000:]
    ends = events_named(run_dir, "attempt_end")
    assert len(ends) == 2 and ends[1]["class"] == "completed", ends
    assert events_named(run_dir, "decision")[0]["action"] == "restart"  # the crash (its class: failures/' job)
    resume = events_named(run_dir, "resume_point")[1]
    assert Path(resume["path"]).name == "step-4" and resume["step"] == 4, resume
    assert [e["step"] for e in events_named(run_dir, "resumed") if e["attempt"] == 2] == [4]
    saves = [(e["attempt"], e["step"], Path(e["path"]).name, e["source"]) for e in events_named(run_dir, "save_end")
             if e.get("ok")]
    # One report per save (rank 0's, after every rank finished), none from the directory watch.
    assert saves == [(1, 4, "step-4", "client"), (2, 8, "step-8", "client"), (2, 10, "step-10", "client")], saves
    assert events_named(run_dir, "run_end")[-1]["outcome"] == "complete"
    ckpt = run_dir / "checkpoints"
    assert not [p for p in ckpt.iterdir() if sharded.parse_staging_name(p.name)], "a staging dir was left"
    assert validate_checkpoint(ckpt / "step-10").verdict is Verdict.VALID
