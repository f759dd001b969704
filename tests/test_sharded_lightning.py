"""The Lightning callback makes ``DeepSpeedStrategy`` directory saves atomic. Lightning's strategy
refuses to set up without CUDA and DeepSpeed is not installed in CI, so here a stand-in strategy
class named ``DeepSpeedStrategy`` writes the layout Lightning's does (``<name>.ckpt/latest`` +
``checkpoint/`` shards, through tests/ckpt_factory.py) from its ``save_checkpoint``. The real
strategy and engine run in tests/test_sharded_deepspeed.py where deepspeed is installed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
lightning = pytest.importorskip("lightning")

import ckpt_factory as cf
from lightning.fabric.plugins import TorchCheckpointIO

from supervisor import sharded
from supervisor.checkpoints import find_resume_point, validate_checkpoint
from supervisor.checkpoints import formats as F
from supervisor.integrations.lightning import (
    SupervisorCallback,
    is_deepspeed_strategy,
    make_deepspeed_saves_atomic,
)
from supervisor.states import Verdict


class DeepSpeedStrategy:
    """Stand-in for lightning.pytorch.strategies.DeepSpeedStrategy: one rank, the same
    save_checkpoint signature, writes DeepSpeed's layout into ``filepath`` as the engine does."""

    global_rank = 0
    world_size = 1

    def __init__(self, fail_at_step: int | None = None) -> None:
        self.checkpoint_io = TorchCheckpointIO()
        self.cluster_environment = None
        self.saved_to: list[str] = []
        self.fail_at_step = fail_at_step

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return obj

    def barrier(self, name: str | None = None) -> None:
        pass

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        self.saved_to.append(str(filepath))
        if "://" in str(filepath):
            return
        step = checkpoint["global_step"]
        cf.make_lightning_deepspeed(filepath, step)
        if step == self.fail_at_step:
            raise OSError(28, "No space left on device")


class Trainer:
    def __init__(self, strategy: DeepSpeedStrategy) -> None:
        self.strategy = strategy


def test_the_callback_wraps_a_deepspeed_strategy_and_each_save_replaces_last_ckpt_whole(tmp_path: Path) -> None:
    strategy = DeepSpeedStrategy()
    assert is_deepspeed_strategy(strategy)
    callback = SupervisorCallback()
    callback.setup(Trainer(strategy), None, "fit")
    last = tmp_path / "last.ckpt"
    for step in (100, 200):
        strategy.save_checkpoint({"global_step": step, "epoch": 0}, last)
    staging = sharded.parse_staging_name(Path(strategy.saved_to[-1]).name)
    assert staging is not None and staging.final_name == "last.ckpt", strategy.saved_to
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
    marker = sharded.read_marker(last)
    assert marker is not None and marker["step"] == 200 and marker["writer"] == "lightning_deepspeed"
    report = validate_checkpoint(last)
    assert report.verdict is Verdict.VALID and report.format == F.LIGHTNING_DEEPSPEED and report.step == 200
    assert callback.last_saved_step == 200
    callback.setup(Trainer(strategy), None, "fit")  # a second fit: not wrapped twice
    strategy.save_checkpoint({"global_step": 300, "epoch": 0}, last)
    assert sharded.parse_staging_name(Path(strategy.saved_to[-1]).name) is not None


def test_a_failed_directory_save_leaves_the_previous_last_ckpt(tmp_path: Path) -> None:
    strategy = DeepSpeedStrategy(fail_at_step=200)
    make_deepspeed_saves_atomic(strategy)
    last = tmp_path / "last.ckpt"
    strategy.save_checkpoint({"global_step": 100, "epoch": 0}, last)
    with pytest.raises(OSError, match="No space left"):
        strategy.save_checkpoint({"global_step": 200, "epoch": 0}, last)
    assert sharded.read_marker(last)["step"] == 100
    result = find_resume_point(tmp_path, writers_alive=False)
    assert result.path == str(last) and result.step == 100, result.reason


def test_remote_paths_are_saved_as_before(tmp_path: Path) -> None:
    strategy = DeepSpeedStrategy()
    make_deepspeed_saves_atomic(strategy)
    strategy.save_checkpoint({"global_step": 1}, "s3://bucket/last.ckpt")
    assert strategy.saved_to == ["s3://bucket/last.ckpt"]
