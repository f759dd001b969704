"""DeepSpeed for real (``pip install deepspeed`` works on CPU with torch 2.13 and deepspeed 0.19.8;
the ``test`` extra installs it, so CI runs these; tests/test_sharded_dcp.py also checks the on-disk
layout with hand-built tags). Two ranks under ``torchrun``, gloo, DeepSpeed's CPU
accelerator, a real ``DeepSpeedEngine`` with ZeRO stage 2 and 3:

* ``supervisor.integrations.deepspeed.save_checkpoint`` commits each tag atomically and writes
  ``latest`` only after the commit; DeepSpeed's own ``load_checkpoint`` then resumes from it;
* Lightning's ``DeepSpeedStrategy.save_checkpoint`` (the real method, on a real strategy object
  holding the engine), wrapped by the callback's hook, writes ``last.ckpt/`` as one committed
  directory. The strategy's ``setup`` refuses anything but CUDA, so no ``Trainer`` runs it here:
  the strategy object is built by hand around the engine (the one stand-in of this file).

Run them where deepspeed is installed: ``python -m pytest tests/test_sharded_deepspeed.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("deepspeed", reason="deepspeed is not installed (pip install deepspeed; CPU works)")

from supervisor import sharded
from supervisor.checkpoints import find_resume_point, validate_checkpoint
from supervisor.checkpoints import formats as F
from supervisor.states import Verdict

REPO = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent('''
    import json, sys, warnings
    from pathlib import Path
    import torch, deepspeed
    warnings.simplefilter("ignore")
    deepspeed.init_distributed(dist_backend="gloo")
    import torch.distributed as dist
    from supervisor.integrations import deepspeed as sds
    from supervisor.integrations.lightning import make_deepspeed_saves_atomic

    out, stage = Path(sys.argv[1]), int(sys.argv[2])
    rank = dist.get_rank()

    def engine():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        cfg = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": stage},
               "zero_allow_untested_optimizer": True}
        eng, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
                                       config=cfg)
        return eng

    def train(eng, steps):
        for _ in range(steps):
            x = torch.randn(4, 16)
            loss = eng(x).pow(2).mean()
            eng.backward(loss)
            eng.step()

    eng = engine()
    train(eng, 3)
    sds.save_checkpoint(eng, out / "ds", client_state={"note": "first"})
    train(eng, 3)
    sds.save_checkpoint(eng, out / "ds", client_state={"note": "second"})

    fresh = engine()
    path, client_state = fresh.load_checkpoint(str(out / "ds"))   # DeepSpeed's own loader, via 'latest'

    # Lightning's DeepSpeedStrategy, the real save_checkpoint, around the same engine.
    from lightning.pytorch.plugins.environments import TorchElasticEnvironment
    from lightning.pytorch.strategies import DeepSpeedStrategy
    strategy = DeepSpeedStrategy(stage=stage)
    strategy.cluster_environment = TorchElasticEnvironment()
    strategy.model = eng
    make_deepspeed_saves_atomic(strategy)
    for step in (3, 6):
        strategy.save_checkpoint({"global_step": step, "epoch": 0, "state_dict": {}, "optimizer_states": []},
                                 out / "lightning" / "last.ckpt")
    if rank == 0:
        (out / f"facts.json").write_text(json.dumps({
            "loaded": str(path), "global_steps": fresh.global_steps, "client_note": client_state.get("note")}))
    dist.barrier()
''')


@pytest.fixture(scope="module", params=[2, 3], ids=["zero2", "zero3"])
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp(f"ds{request.param}")
    script = base / "ds_save.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERVISOR_", "SLURM_"))}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", SUPERVISOR_ATTEMPT="1")
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          str(script), str(base), str(request.param)], check=False, env=env, cwd=base,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-4000:]
    return base


def test_each_tag_is_committed_by_both_ranks_and_latest_names_the_newest(saved: Path) -> None:
    ds = saved / "ds"
    tags = sorted(p.name for p in ds.iterdir() if p.is_dir())
    assert tags == ["global_step3", "global_step6"], tags
    assert (ds / "latest").read_text() == "global_step6"
    for tag, step in (("global_step3", 3), ("global_step6", 6)):
        marker = sharded.read_marker(ds / tag)
        assert marker is not None and marker["world_size"] == 2 and marker["writer"] == "deepspeed"
        assert marker["step"] == step
        assert any(name.startswith("zero_pp_rank_1_") for name in marker["files"]), marker["files"]
        report = validate_checkpoint(ds / tag, deep=True)
        assert report.verdict is Verdict.VALID and report.format == F.DEEPSPEED and report.level == 4, report.reason
        assert report.step == step
    save_dir = validate_checkpoint(ds)
    assert save_dir.verdict is Verdict.VALID and save_dir.embedded_step == 6, save_dir.reason
    assert not [p for p in ds.iterdir() if sharded.parse_staging_name(p.name) or sharded.parse_aside_name(p.name)]


def test_deepspeed_s_own_loader_resumes_from_the_committed_tag(saved: Path) -> None:
    facts = json.loads((saved / "facts.json").read_text())
    assert facts["global_steps"] == 6 and facts["client_note"] == "second"
    assert Path(facts["loaded"]).parent.name == "global_step6"  # the model states file DeepSpeed read
    assert find_resume_point(saved / "ds", writers_alive=False).step == 6


def test_lightning_deepspeed_last_ckpt_dir_is_replaced_whole(saved: Path) -> None:
    lightning = saved / "lightning"
    assert sorted(p.name for p in lightning.iterdir()) == ["last.ckpt"], "an aside or staging dir was left"
    last = lightning / "last.ckpt"
    marker = sharded.read_marker(last)
    assert marker is not None and marker["step"] == 6 and marker["writer"] == "lightning_deepspeed"
    assert marker["world_size"] == 2 and (last / "checkpoint").is_dir()
    report = validate_checkpoint(last)
    assert report.verdict is Verdict.VALID and report.format == F.LIGHTNING_DEEPSPEED, report.reason
    assert "committed by 2 rank(s)" in report.reason
