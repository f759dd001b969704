"""Sharded checkpoints written by torch itself: ``torch.distributed.checkpoint`` by two ranks under
the real launcher (``torchrun``, gloo on CPU) through ``supervisor.integrations.dcp``; then the
supervisor's validator and resume-point scan on those real layouts, intact and damaged. DeepSpeed
layouts are hand-built here with ``torch.save`` (tests/ckpt_factory.py; a real DeepSpeed engine
writes them in tests/test_sharded_deepspeed.py where deepspeed is installed).

The torchrun job runs once per module (imports of torch cost seconds on a small CI box); each test
works on its own copy of the directories it damages.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the DCP layouts are written by torch")

import ckpt_factory as cf

from supervisor import sharded
from supervisor.checkpoints import find_resume_point, validate_checkpoint
from supervisor.checkpoints import formats as F
from supervisor.integrations import deepspeed as sds
from supervisor.states import Verdict

REPO = Path(__file__).resolve().parent.parent

SAVER = textwrap.dedent('''
    import json, os, sys
    from pathlib import Path
    import torch, torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from supervisor import sharded
    from supervisor.integrations import dcp as sdcp

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ckpt = Path(sys.argv[1])

    def state(step):
        # every rank owns its own tensor: a checkpoint mixing two saves shows when loaded
        return {"step": step, f"rank{rank}": torch.full((4096,), float(step)), "shared": torch.ones(8) * step}

    for step in (10, 20):
        sdcp.save(state(step), ckpt / f"step-{step}", step)
        sdcp.save(state(step), ckpt / "last", step)
    pending = sdcp.async_save(state(30), ckpt / "step-30", 30)
    seen_before_commit = (ckpt / "step-30").exists()
    staging = pending.staging.name
    pending.commit()
    # DCP's own in-place save (no commit protocol), for comparison
    dcp.save(state(40), checkpoint_id=str(ckpt.parent / "plain" / "step-40"))
    if rank == 0:
        (ckpt.parent / "facts.json").write_text(json.dumps({
            "world": world, "async_final_existed_before_commit": seen_before_commit, "async_staging": staging}))
    dist.barrier()
    dist.destroy_process_group()
''')


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("dcp")
    script = base / "saver.py"
    script.write_text(SAVER)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERVISOR_", "SLURM_"))}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", SUPERVISOR_ATTEMPT="3")
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          str(script), str(base / "ckpt")], check=False, env=env, cwd=base, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return base


def copy_of(saved: Path, tmp_path: Path, *names: str) -> Path:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for name in names:
        shutil.copytree(saved / "ckpt" / name, ckpt / name, copy_function=shutil.copy2)
    return ckpt


def load(path: Path) -> dict[str, Any]:
    state: dict[str, Any] = {"step": 0, "rank0": torch.zeros(4096), "rank1": torch.zeros(4096), "shared": torch.zeros(8)}
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():  # "torch.distributed is disabled ... single process": intended
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, checkpoint_id=str(path), no_dist=True)
    return state


# ------------------------------------------------------------------------------ intact


def test_two_ranks_commit_dcp_checkpoints_that_validate_and_load(saved: Path) -> None:
    ckpt = saved / "ckpt"
    assert sorted(p.name for p in ckpt.iterdir()) == ["last", "step-10", "step-20", "step-30"]
    for name, step in (("step-10", 10), ("step-20", 20), ("last", 20), ("step-30", 30)):
        marker = sharded.read_marker(ckpt / name)
        assert marker is not None and marker["world_size"] == 2 and marker["writer"] == "dcp"
        assert marker["attempt"] == 3 and marker["step"] == step
        assert {".metadata", "__0_0.distcp", "__1_0.distcp"} <= set(marker["files"])
        report = validate_checkpoint(ckpt / name)
        assert report.verdict is Verdict.VALID and report.format == F.DCP and report.level == 3, report.reason
        assert report.step == step and "committed by 2 rank(s)" in report.reason
        assert validate_checkpoint(ckpt / name, deep=True).level == 4
        state = load(ckpt / name)
        assert state["step"] == step and bool((state["rank0"] == step).all()) and bool((state["rank1"] == step).all())


def test_the_resume_point_is_the_newest_committed_directory(saved: Path) -> None:
    result = find_resume_point(saved / "ckpt", writers_alive=False)
    assert result.path == str(saved / "ckpt" / "step-30") and result.step == 30, result.reason


def test_an_async_save_is_invisible_until_every_rank_commits(saved: Path) -> None:
    facts = json.loads((saved / "facts.json").read_text())
    assert facts["world"] == 2
    assert facts["async_final_existed_before_commit"] is False
    assert sharded.parse_staging_name(facts["async_staging"]).final_name == "step-30"


def test_dcp_alone_writes_in_place_without_a_commit(saved: Path) -> None:
    plain = saved / "plain" / "step-40"
    assert sharded.read_marker(plain) is None
    report = validate_checkpoint(plain)
    assert report.verdict is Verdict.VALID and "committed" not in report.reason


# ------------------------------------------------------------------------------ damaged


def test_a_truncated_shard_of_a_committed_checkpoint_is_quarantined_and_the_previous_one_chosen(
        saved: Path, tmp_path: Path) -> None:
    ckpt = copy_of(saved, tmp_path, "step-10", "step-20")
    shard = ckpt / "step-20" / "__1_0.distcp"
    os.truncate(shard, shard.stat().st_size - 100)
    report = validate_checkpoint(ckpt / "step-20")
    assert report.verdict is Verdict.CORRUPT and "__1_0.distcp has" in report.reason, report.reason
    result = find_resume_point(ckpt, quarantine=True, quarantine_tag="t", writers_alive=False)
    assert result.path == str(ckpt / "step-10") and [Path(q.path).name for q in result.quarantined] == ["step-20"]


def test_a_zeroed_item_of_the_right_size_is_caught_by_the_dcp_framing_check(saved: Path, tmp_path: Path) -> None:
    """Sizes match the commit, so the marker alone cannot tell; DCP's .metadata extents and the
    per-item zip framing can (the item starts with zeros instead of a zip header)."""
    ckpt = copy_of(saved, tmp_path, "step-20")
    shard = ckpt / "step-20" / "__0_0.distcp"
    stamp = shard.stat()
    cf.zero_range(shard, 0, 256)
    os.utime(shard, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    report = validate_checkpoint(ckpt / "step-20")
    assert report.verdict is Verdict.CORRUPT, report.reason
    assert "commit marker matches the file sizes" in report.reason


def test_metadata_naming_a_shard_that_is_gone_is_corrupt_with_or_without_the_commit(saved: Path,
                                                                                  tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    shutil.copytree(saved / "plain" / "step-40", plain / "step-40")
    (plain / "step-40" / "__1_0.distcp").unlink()
    report = validate_checkpoint(plain / "step-40")
    assert report.verdict is Verdict.CORRUPT and "__1_0.distcp listed in .metadata is missing" in report.reason
    ckpt = copy_of(saved, tmp_path, "last")
    (ckpt / "last" / "__1_0.distcp").unlink()
    assert validate_checkpoint(ckpt / "last").verdict is Verdict.CORRUPT


def test_a_staging_dir_is_never_a_candidate_even_when_complete(saved: Path, tmp_path: Path) -> None:
    ckpt = copy_of(saved, tmp_path, "step-10")
    shutil.copytree(saved / "ckpt" / "step-30", ckpt / "step-30.tmp-3-0123456789ab")
    result = find_resume_point(ckpt, writers_alive=False)
    assert result.path == str(ckpt / "step-10")
    assert [Path(c["path"]).name for c in result.candidates] == ["step-10"]


# ------------------------------------------------------------------------------ DeepSpeed, hand-built


def committed_tag(save_dir: Path, step: int, dp: int = 2) -> Path:
    """A DeepSpeed tag written into a staging dir and committed, then ``latest`` (as the helper does)."""
    save_dir.mkdir(parents=True, exist_ok=True)
    tag = f"global_step{step}"
    with sharded.saving_dir(step, save_dir / tag, rank=0, world_size=1, barrier=None, writer="deepspeed",
                            report=False, after_publish=lambda final: sds.write_latest(save_dir, final.name)) as st:
        cf.make_deepspeed_tag(save_dir, step, dp=dp, tag=st.name, write_latest=False)
    return save_dir / tag


def test_deepspeed_latest_names_a_committed_tag_that_validates(tmp_path: Path) -> None:
    run = tmp_path / "run"
    committed_tag(run, 100)
    committed_tag(run, 200)
    assert (run / "latest").read_text() == "global_step200" and sds.latest_tag(run) == "global_step200"
    report = validate_checkpoint(run)
    assert report.verdict is Verdict.VALID and report.embedded_step == 200, report.reason
    assert "committed by 1 rank(s)" in report.reason and "dp_world_size=2" in report.reason
    tag = validate_checkpoint(run / "global_step200", deep=True)
    assert tag.verdict is Verdict.VALID and tag.level == 4 and tag.step == 200


def test_deepspeed_latest_naming_a_torn_committed_tag_is_corrupt(tmp_path: Path) -> None:
    run = tmp_path / "run"
    committed_tag(run, 100)
    tag = committed_tag(run, 200)
    (tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    report = validate_checkpoint(run)
    assert report.verdict is Verdict.CORRUPT and "zero_pp_rank_1_mp_rank_00_optim_states.pt" in report.reason
    result = find_resume_point(run, quarantine=True, quarantine_tag="t", writers_alive=False)
    assert result.step == 100 and result.path == str(run / "global_step100")


def test_deepspeed_shards_fewer_than_the_recorded_world_size_are_corrupt(tmp_path: Path) -> None:
    """The model states record dp_world_size=4; a commit of a tag holding two optimizer shards
    (a save by the wrong number of ranks) matches its own manifest but not DeepSpeed's."""
    run = tmp_path / "run"
    tag = committed_tag(run, 300, dp=4)
    with sharded.saving_dir(300, run / "global_step301", rank=0, world_size=1, barrier=None, report=False) as st:
        for name in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
                     "zero_pp_rank_1_mp_rank_00_optim_states.pt"):
            shutil.copy2(tag / name, st / name)
    report = validate_checkpoint(run / "global_step301")
    assert report.verdict is Verdict.CORRUPT and "missing shard(s)" in report.reason and "dp_world_size=4" in report.reason


def test_latest_tag_ignores_a_latest_naming_an_uncommitted_tag(tmp_path: Path) -> None:
    run = tmp_path / "run"
    cf.make_deepspeed_tag(run, 100)  # DeepSpeed's own save: no commit
    assert (run / "latest").read_text() == "global_step100"
    assert sds.latest_tag(run) is None
    committed_tag(run, 200)
    assert sds.latest_tag(run) == "global_step200"
