"""Steps and temp markers from checkpoint names: what decides the resume order."""

from __future__ import annotations

import pytest

from supervisor.checkpoints.naming import (
    final_name_of_temp,
    is_ignored_name,
    is_temp_name,
    parse_name,
    step_from_name,
    unfinished_marker_names,
)


@pytest.mark.parametrize(
    "name, step",
    [
        ("step=900.ckpt", 900),
        ("epoch=3-step=9500.ckpt", 9500),
        ("epoch=3-step=9500-v1.ckpt", 9500),
        ("epoch=0-step=100-val_loss=0.12.ckpt", 100),
        ("global_step1200", 1200),
        ("checkpoint-1500", 1500),
        ("model_00012000.pt", 12000),
        ("ckpt_300.pt", 300),
        ("iter_0000100", 100),
        ("megatron_gpt--val_loss=2.31-step=4000-consumed_samples=32000.0-last.ckpt", 4000),
        ("step-100", 100),
        ("1000", 1000),
        ("last.ckpt", None),
        ("last-v1.ckpt", None),
        ("epoch=3.ckpt", None),
        ("hpc_ckpt_3.ckpt", None),  # Lightning's SLURM counter, not a step
        ("timestep_embedding.pt", None),
    ],
)
def test_step_from_name(name: str, step: int | None) -> None:
    assert step_from_name(name) == step


def test_versions_and_last_aliases() -> None:
    assert parse_name("last-v2.ckpt").is_last and parse_name("last-v2.ckpt").version == 2
    assert parse_name("latest.pt").is_last
    assert not parse_name("step=9-v1.ckpt").is_last and parse_name("step=9-v1.ckpt").version == 1
    assert parse_name("epoch=3.ckpt").epoch == 3


@pytest.mark.parametrize(
    "name",
    [".step=9.ckpt.tmp-123-abcd", "step=9.ckpt.tmp", "model.pt.partial", "model.pt.incomplete",
     "step=9.ckpt-unfinished", "CORRUPT_step=9.ckpt.4242", "CORRUPT_step=9.ckpt.4242.json",
     "trainer_state.json", ".metadata", "tmp-checkpoint-500"],
)
def test_ignored_names(name: str) -> None:
    assert is_ignored_name(name)


@pytest.mark.parametrize("name", ["step=900.ckpt", "last.ckpt", "checkpoint-1500", "model.safetensors"])
def test_checkpoint_names_are_not_ignored(name: str) -> None:
    assert not is_ignored_name(name)


def test_temp_names_map_to_their_final_name() -> None:
    assert is_temp_name(".step=9.ckpt.tmp-123-abcd")
    assert final_name_of_temp(".step=9.ckpt.tmp-123-abcd") == "step=9.ckpt"
    assert final_name_of_temp(".last.ckpt.k2j3h4.tmp") == "last.ckpt"  # mkstemp style
    assert final_name_of_temp("x.ckpt-unfinished") == "x.ckpt"


def test_nemo_marker_names() -> None:
    assert "step=100-unfinished" in unfinished_marker_names("step=100.ckpt")
    assert "step=100-unfinished" in unfinished_marker_names("step=100-EMA.ckpt")


@pytest.mark.parametrize(
    "name, index",
    [
        ("epoch_3", 3),
        ("epoch=3.ckpt", 3),
        ("tiny_run-1_epoch-12.pt", 12),  # MACE's checkpoint handler: <name>_run-<seed>_epoch-<N>.pt
        ("model_epoch_3.pt", 3),
        ("checkpoint-epoch5.pth", 5),
        ("epoch=3-step=900.ckpt", None),  # a step in the name: never ordered by its epoch
        ("step=900-epoch=3.ckpt", None),
        ("tiny_run-1_epoch-12_swa.pt", None),
        ("nepoch5.pt", None),
    ],
)
def test_a_name_that_ends_with_its_epoch_orders_saves_and_is_no_step(name: str, index: int | None) -> None:
    info = parse_name(name)
    assert info.index == index
    if index is not None:
        assert (info.step, info.epoch, info.index_may_be_step) == (None, index, False)
