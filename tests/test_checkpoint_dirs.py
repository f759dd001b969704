"""Directory checkpoints: DCP (real torch.distributed.checkpoint.save), DeepSpeed tag dirs,
Lightning's DeepSpeed ``*.ckpt/`` dirs and HF ``checkpoint-N/``, intact and torn."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import ckpt_factory as cf
from supervisor.checkpoints import formats as F
from supervisor.checkpoints.validate import validate
from supervisor.states import Verdict


# ---------------------------------------------------------------------------- DCP


def test_dcp_good(tmp_path: Path) -> None:
    path = cf.save_dcp(tmp_path / "step-40", 40)
    report = validate(path)
    assert report.verdict is Verdict.VALID, report.reason
    assert report.format == F.DCP and report.level == 3 and report.step == 40
    assert report.embedded_step == 40  # read from the 'step' item without unpickling it
    assert validate(path, deep=True).level == 4


def test_dcp_missing_metadata_is_uncommitted(tmp_path: Path) -> None:
    path = cf.save_dcp(tmp_path / "step-40", 40)
    (path / ".metadata").unlink()
    report = validate(path)
    assert report.verdict is Verdict.CORRUPT and "never committed" in report.reason


def test_dcp_leftover_metadata_tmp_is_corrupt(tmp_path: Path) -> None:
    path = cf.save_dcp(tmp_path / "step-40", 40)
    (path / ".metadata").rename(path / ".metadata.tmp")
    assert validate(path).verdict is Verdict.CORRUPT


@pytest.mark.parametrize("damage", ["missing", "empty", "truncated", "zeroed_item"])
def test_dcp_torn_shard(tmp_path: Path, damage: str) -> None:
    path = cf.save_dcp(tmp_path / "step-40", 40)
    shard = next(path.glob("*.distcp"))
    size = shard.stat().st_size
    if damage == "missing":
        shard.unlink()
    elif damage == "empty":
        cf.truncate(shard, 0)
    elif damage == "truncated":
        cf.truncate(shard, size - 1)
    else:  # a hole over the first item: extents still fit, framing does not
        cf.zero_range(shard, 0, 256)
    report = validate(path)
    assert report.verdict is Verdict.CORRUPT, (damage, report.reason)
    assert shard.name in report.reason or "item" in report.reason


# ---------------------------------------------------------------------------- DeepSpeed


def test_deepspeed_tag_good(tmp_path: Path) -> None:
    tag = cf.make_deepspeed_tag(tmp_path, 1200, dp=4)
    report = validate(tag)
    assert report.verdict is Verdict.VALID, report.reason
    assert report.format == F.DEEPSPEED and report.step == 1200 and report.embedded_step == 1200
    assert "dp_world_size=4" in report.reason
    assert validate(tag, deep=True).level == 4


def test_deepspeed_save_dir_follows_latest(tmp_path: Path) -> None:
    cf.make_deepspeed_tag(tmp_path / "run", 100, dp=2)
    cf.make_deepspeed_tag(tmp_path / "run", 200, dp=2)
    report = validate(tmp_path / "run")
    assert report.verdict is Verdict.VALID and report.embedded_step == 200


def test_deepspeed_missing_rank_shard(tmp_path: Path) -> None:
    tag = cf.make_deepspeed_tag(tmp_path, 1200, dp=4)
    (tag / "zero_pp_rank_3_mp_rank_00_optim_states.pt").unlink()
    report = validate(tag)
    assert report.verdict is Verdict.CORRUPT and "zero_pp_rank_3_mp_rank_00_optim_states.pt" in report.reason


def test_deepspeed_truncated_shard(tmp_path: Path) -> None:
    tag = cf.make_deepspeed_tag(tmp_path, 1200, dp=2)
    shard = tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    cf.truncate(shard, shard.stat().st_size // 2)
    report = validate(tag)
    assert report.verdict is Verdict.CORRUPT and shard.name in report.reason


def test_deepspeed_truncated_model_states(tmp_path: Path) -> None:
    tag = cf.make_deepspeed_tag(tmp_path, 1200, dp=2)
    cf.truncate(tag / "mp_rank_00_model_states.pt", 100)
    assert validate(tag).verdict is Verdict.CORRUPT


def test_deepspeed_latest_naming_a_missing_tag(tmp_path: Path) -> None:
    cf.make_deepspeed_tag(tmp_path / "run", 100)
    (tmp_path / "run" / "latest").write_text("global_step999")
    report = validate(tmp_path / "run")
    assert report.verdict is Verdict.CORRUPT and "global_step999" in report.reason


def test_deepspeed_mixed_generation_mtimes(tmp_path: Path) -> None:
    tag = cf.make_deepspeed_tag(tmp_path, 1200, dp=2)
    cf.set_mtime(tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt", time.time() - 3600)
    report = validate(tag)
    assert report.verdict is Verdict.UNVERIFIABLE and "mtimes span" in report.reason


# ---------------------------------------------------------------------------- Lightning DeepSpeed


def test_lightning_deepspeed_dir_good(tmp_path: Path) -> None:
    path = cf.make_lightning_deepspeed(tmp_path / "epoch=0-step=300.ckpt", 300)
    report = validate(path)
    assert report.verdict is Verdict.VALID, report.reason
    assert report.format == F.LIGHTNING_DEEPSPEED and report.step == 300 and report.is_dir


def test_lightning_deepspeed_last_overwritten_in_place_is_corrupt(tmp_path: Path) -> None:
    """``last.ckpt/checkpoint/`` is rewritten in place: shards from two saves = torn."""
    path = cf.make_lightning_deepspeed(tmp_path / "last.ckpt", 300)
    cf.set_mtime(path / "checkpoint" / "zero_pp_rank_1_mp_rank_00_optim_states.pt", time.time() - 7200)
    report = validate(path)
    assert report.verdict is Verdict.CORRUPT and report.embedded_step == 300


def test_lightning_deepspeed_truncated_shard(tmp_path: Path) -> None:
    path = cf.make_lightning_deepspeed(tmp_path / "last.ckpt", 300)
    cf.truncate(path / "checkpoint" / "zero_pp_rank_0_mp_rank_00_optim_states.pt", 10)
    assert validate(path).verdict is Verdict.CORRUPT


# ---------------------------------------------------------------------------- HF Trainer


@pytest.mark.parametrize("sharded", [False, True])
def test_hf_checkpoint_good(tmp_path: Path, sharded: bool) -> None:
    path = cf.make_hf_checkpoint(tmp_path, 1500, sharded=sharded, world_size=2)
    report = validate(path)
    assert report.verdict is Verdict.VALID, report.reason
    assert report.format == F.HF_TRAINER and report.step == 1500 and report.embedded_step == 1500


def test_hf_without_trainer_state_did_not_finish(tmp_path: Path) -> None:
    path = cf.make_hf_checkpoint(tmp_path, 1500)
    (path / "trainer_state.json").unlink()
    report = validate(path)
    assert report.verdict is Verdict.CORRUPT and "trainer_state.json" in report.reason


def test_hf_torn_trainer_state(tmp_path: Path) -> None:
    path = cf.make_hf_checkpoint(tmp_path, 1500)
    state = path / "trainer_state.json"
    state.write_bytes(state.read_bytes()[:10])
    assert validate(path).verdict is Verdict.CORRUPT


def test_hf_missing_shard_named_in_index(tmp_path: Path) -> None:
    path = cf.make_hf_checkpoint(tmp_path, 1500, sharded=True)
    (path / "model-00002-of-00002.safetensors").unlink()
    report = validate(path)
    assert report.verdict is Verdict.CORRUPT and "model-00002-of-00002.safetensors" in report.reason


def test_hf_truncated_optimizer(tmp_path: Path) -> None:
    path = cf.make_hf_checkpoint(tmp_path, 1500)
    cf.truncate(path / "optimizer.pt", os.path.getsize(path / "optimizer.pt") - 5)
    report = validate(path)
    assert report.verdict is Verdict.CORRUPT and "optimizer.pt" in report.reason


def test_hf_missing_rank_rng_state(tmp_path: Path) -> None:
    path = cf.make_hf_checkpoint(tmp_path, 1500, world_size=3)
    (path / "rng_state_1.pth").unlink()
    assert validate(path).verdict is Verdict.CORRUPT


def test_hf_step_mismatch(tmp_path: Path) -> None:
    path = cf.make_hf_checkpoint(tmp_path, 1500)
    path.rename(tmp_path / "checkpoint-2000")
    assert validate(tmp_path / "checkpoint-2000").verdict is Verdict.UNVERIFIABLE


def test_generic_dir_of_torch_files(tmp_path: Path) -> None:
    """Megatron-style ``iter_0000100/mp_rank_00/model_optim_rng.pt``."""
    import torch

    inner = tmp_path / "iter_0000100" / "mp_rank_00"
    inner.mkdir(parents=True)
    torch.save({"iteration": 100, "model": cf.model_state()}, inner / "model_optim_rng.pt")
    report = validate(tmp_path / "iter_0000100")
    assert report.verdict is Verdict.VALID and report.step == 100 and report.embedded_step == 100
    cf.truncate(inner / "model_optim_rng.pt", 50)
    assert validate(tmp_path / "iter_0000100").verdict is Verdict.CORRUPT


def test_dcp_safetensors_serialization_with_a_zero_tensor_is_valid(tmp_path: Path) -> None:
    """Raw tensor items (SAFETENSORS serialization) are not zips; a tensor of zeros is data."""
    import warnings

    pytest.importorskip("safetensors", reason="DCP's SAFETENSORS serialization needs the safetensors package")

    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.filesystem import SerializationFormat

    writer = dcp.FileSystemWriter(str(tmp_path / "step-7"), serialization_format=SerializationFormat.SAFETENSORS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.save({"model": {"zeros": torch.zeros(64), "w": torch.randn(8, 8)}, "step": 7}, storage_writer=writer)
    report = validate(tmp_path / "step-7")
    assert report.verdict is Verdict.VALID and report.step == 7, report.reason
    shard = next((tmp_path / "step-7").glob("*.distcp"))
    cf.truncate(shard, shard.stat().st_size - 1)
    assert validate(tmp_path / "step-7").verdict is Verdict.CORRUPT
