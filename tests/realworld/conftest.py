"""Data and tiny models for the real-world suite, made here on every run: nothing is downloaded
(no hub, no data set), so the suite runs offline."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stacks import CHILD_ENV, DS_CONFIG, DS_CONFIG_FILE

HERE = Path(__file__).resolve().parent

def make_nanogpt_data(workdir: Path) -> None:
    """data/tiny/{train,val}.bin: uint16 tokens, as nanoGPT's prepare scripts write them."""
    import numpy as np

    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 256, 8000).astype(np.uint16)
    (workdir / "data" / "tiny").mkdir(parents=True)
    tokens.tofile(workdir / "data" / "tiny" / "train.bin")
    tokens[:2000].tofile(workdir / "data" / "tiny" / "val.bin")


@pytest.fixture(scope="session")
def tiny_hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with ``model/`` (a 1-layer GPT-2 with random weights and a word-level tokenizer)
    and ``data/train.jsonl``, made in a subprocess (transformers stays out of the test process)."""
    root = tmp_path_factory.mktemp("tiny_hf")
    res = subprocess.run([sys.executable, str(HERE / "make_tiny_hf.py"), str(root / "model"), str(root / "data")],
                         capture_output=True, text=True, timeout=300, env={**_base_env(), **CHILD_ENV})
    assert res.returncode == 0, res.stderr[-3000:]
    return root


@pytest.fixture(scope="session")
def tiny_glue(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``model/`` (a 1-layer BERT classifier), ``nyu-mll/glue/`` (MRPC-shaped pairs) and ``glue/glue.py``
    (our metric module): what Accelerate's test_checkpointing.py loads, made by accelerate_setup.py."""
    from stacks import GLUE_TRAIN_PAIRS

    root = tmp_path_factory.mktemp("tiny_glue")
    res = subprocess.run([sys.executable, str(HERE / "accelerate_setup.py"), str(root), str(GLUE_TRAIN_PAIRS)],
                         capture_output=True, text=True, timeout=300, env={**_base_env(), **CHILD_ENV})
    assert res.returncode == 0, res.stderr[-3000:]
    return root


@pytest.fixture(scope="session")
def tiny_litgpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What litgpt's pretrain reads (``litgpt_setup.py``): a tokenizer, litdata chunks, its config."""
    root = tmp_path_factory.mktemp("tiny_litgpt")
    res = subprocess.run([sys.executable, str(HERE / "litgpt_setup.py"), str(root)],
                         capture_output=True, text=True, timeout=300, env={**_base_env(), **CHILD_ENV})
    assert res.returncode == 0, res.stderr[-3000:]
    return root


@pytest.fixture(scope="session")
def tiny_torchtune(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What torchtune's recipe reads (``torchtune_setup.py``): a tokenizer, a tiny model, data, its config."""
    root = tmp_path_factory.mktemp("tiny_torchtune")
    res = subprocess.run([sys.executable, str(HERE / "torchtune_setup.py"), str(root)],
                         capture_output=True, text=True, timeout=300, env={**_base_env(), **CHILD_ENV})
    assert res.returncode == 0, res.stderr[-3000:]
    return root


@pytest.fixture(scope="session")
def tiny_mace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What MACE's run_train reads (``mace_setup.py``): ``train.xyz``, random molecules with energies and forces."""
    root = tmp_path_factory.mktemp("tiny_mace")
    res = subprocess.run([sys.executable, str(HERE / "mace_setup.py"), str(root)],
                         capture_output=True, text=True, timeout=300, env={**_base_env(), **CHILD_ENV})
    assert res.returncode == 0, res.stderr[-3000:]
    return root


def _base_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith(("SUPERVISE_", "SUPERVISOR_"))}


@pytest.fixture
def make_workdir(tmp_path: Path, request: pytest.FixtureRequest):
    """``make_workdir(stack_key, base=None)``: a fresh working directory holding the stack's data."""

    def make(key: str, base: Path | None = None) -> Path:
        workdir = (base or tmp_path) / f"work-{key}"
        workdir.mkdir(parents=True)
        if key == "nanogpt":
            make_nanogpt_data(workdir)
        elif key in ("hf_trainer", "hf_deepspeed"):
            hf = request.getfixturevalue("tiny_hf")
            shutil.copytree(hf / "model", workdir / "model")
            shutil.copytree(hf / "data", workdir / "data")
            if key == "hf_deepspeed":
                (workdir / DS_CONFIG_FILE).write_text(json.dumps(DS_CONFIG, indent=1))
        elif key == "accelerate_epochs":
            shutil.copytree(request.getfixturevalue("tiny_glue"), workdir, dirs_exist_ok=True)
        elif key == "litgpt":
            shutil.copytree(request.getfixturevalue("tiny_litgpt"), workdir, dirs_exist_ok=True)
        elif key == "torchtune":
            shutil.copytree(request.getfixturevalue("tiny_torchtune"), workdir, dirs_exist_ok=True)
        elif key == "mace":
            shutil.copytree(request.getfixturevalue("tiny_mace"), workdir, dirs_exist_ok=True)
        return workdir

    return make
