"""What torchtune's own ``full_finetune_single_device`` recipe needs to run offline on a CPU in
seconds, made locally: a SentencePiece tokenizer trained here on a few hundred random sentences
(what torchtune's ``llama2_tokenizer`` reads), the sentences as a JSON-lines data set (read by its
``text_completion_dataset``), a 2-layer, 256-wide Llama-2-shaped model with random weights in
torchtune's own checkpoint format (``base/model.pt``, read by its ``FullModelTorchTuneCheckpointer``),
and the recipe's ``--config`` file.

Nothing here is torchtune's code: the script the suite runs is the installed package's
``recipes/full_finetune_single_device.py``, unchanged (``recipe_script`` checks its SHA-256), launched
by torchtune's own command line (``tune run``). ``make`` imports torchtune (and so torch) from
``SITE``: the suite runs this file in a subprocess, once per session (conftest.py's ``tiny_torchtune``).

Usage: python torchtune_setup.py WORKDIR
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

WORDS = ("the model saves a checkpoint every few steps and resumes from the newest one after a crash "
         "or a preemption on the cluster while the supervisor keeps the log").split()
SENTENCES = 400
EPOCH_STEPS = 10  # the recipe's max_steps_per_epoch: it saves after every epoch, so this is the save interval
EPOCHS = 8
# Big enough for about 0.1 s a step on one thread (a 32-wide model runs a hundred steps a second): a
# real finetune's steps take seconds, and the test should see a save between two step lines, as a
# user's run does. 80 steps in all keep its cost small.
BATCH = 16
MODEL = {"vocab_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 4, "embed_dim": 256, "max_seq_len": 64}
CHECKPOINT_FILE = "model-00001-of-00001.bin"  # what the recipe's checkpointer writes into out/epoch_<e>/

# The public script the torchtune stack runs: the recipe as the pinned torchtune wheel ships it
# (SOURCES.md), run through torchtune's own command line (``tune run``).
TORCHTUNE_PIN = "torchtune==0.6.1"
RECIPE_SHA256 = "10f934dbcd2a1bf9d4d9f6004b79b1958e374fe81ed6a0ecf383b1fbabe8442a"
# torchtune and what it imports, in a directory of their own that only its child puts on its path
# (SOURCES.md says why: torchtune asks for other versions than the test extra has, and a torchao
# installed beside transformers is imported by every transformers model). .ci/run installs it.
SITE = Path(os.environ.get("REALWORLD_TORCHTUNE_SITE") or Path.home() / ".cache" / "slurm-supervisor" / "torchtune-0.6.1")
PACKAGES = ("torchtune==0.6.1 torchao==0.15.0 torchdata==0.11.0 omegaconf==2.3.0 antlr4-python3-runtime==4.9.3 "
            "sentencepiece==0.2.3 tiktoken==0.14.0 kagglehub==0.3.12")
INSTALL = f"pip install --no-deps --upgrade --target {SITE} {PACKAGES}"


def installed() -> bool:
    return (SITE / "torchtune" / "__init__.py").is_file()


def recipe_script() -> Path:
    """The recipe in ``SITE``, checked byte for byte against the pinned one (torchtune's wheel
    installs its recipes as a top-level ``recipes/`` directory beside the ``torchtune`` package)."""
    import hashlib

    script = SITE / "recipes" / "full_finetune_single_device.py"
    assert script.is_file(), f"torchtune is not installed: {INSTALL}"
    digest = hashlib.sha256(script.read_bytes()).hexdigest()
    assert digest == RECIPE_SHA256, f"{script} is not the pinned script (sha256 {digest}): {INSTALL}"
    return script


def finetune_command(python: str, epochs: int = EPOCHS) -> list[str]:
    """torchtune's recipe as its docs run it (``tune run <recipe> --config <file>``, ``tune`` being
    ``python -m torchtune._cli.tune``), with ``SITE`` on its path, on the files ``make`` wrote (paths
    relative to the working directory)."""
    recipe_script()
    return ["env", f"PYTHONPATH={SITE}", python, "-m", "torchtune._cli.tune", "run", "full_finetune_single_device",
            "--config", "finetune.yaml", f"epochs={epochs}"]


def write_text(workdir: Path) -> list[str]:
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 20))) for _ in range(SENTENCES)]
    (workdir / "corpus.txt").write_text("\n".join(lines) + "\n")
    with open(workdir / "data.jsonl", "w") as f:
        for line in lines:
            f.write(json.dumps({"text": line}) + "\n")
    return lines


def write_tokenizer(workdir: Path) -> None:
    """base/tokenizer.model: a word-level SentencePiece model (one piece per word, BOS 1, EOS 2)."""
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(input=str(workdir / "corpus.txt"), model_prefix=str(workdir / "base" / "tokenizer"),
                                   vocab_size=len(set(WORDS)) + 3, model_type="word", unk_id=0, bos_id=1, eos_id=2,
                                   pad_id=-1, minloglevel=2)


def write_model(workdir: Path) -> None:
    """base/model.pt: the state dict of torchtune's own Llama-2 builder at the tiny size, random weights."""
    import torch
    from torchtune.models.llama2 import llama2

    torch.manual_seed(0)
    torch.save(llama2(**MODEL).state_dict(), workdir / "base" / "model.pt")


def write_config(path: Path) -> None:
    """The ``--config`` file, in the recipe's own keys (JSON is YAML): CPU, fp32, no compile, the
    metrics printed on stdout (``Step N | loss:...``), one epoch of ``EPOCH_STEPS`` steps per save."""
    config = {
        "output_dir": "out",
        "tokenizer": {"_component_": "torchtune.models.llama2.llama2_tokenizer", "path": "base/tokenizer.model",
                      "max_seq_len": 32},
        "dataset": {"_component_": "torchtune.datasets.text_completion_dataset", "source": "json",
                    "data_files": "data.jsonl", "column": "text", "split": "train", "packed": False},
        "seed": 0, "shuffle": True,
        "model": {"_component_": "torchtune.models.llama2.llama2", **MODEL},
        "checkpointer": {"_component_": "torchtune.training.FullModelTorchTuneCheckpointer", "checkpoint_dir": "base",
                         "checkpoint_files": ["model.pt"], "recipe_checkpoint": None, "output_dir": "out",
                         "model_type": "LLAMA2"},
        "resume_from_checkpoint": False,
        "batch_size": BATCH, "epochs": EPOCHS, "max_steps_per_epoch": EPOCH_STEPS,
        "optimizer": {"_component_": "torch.optim.AdamW", "lr": 1e-3, "fused": False},
        "loss": {"_component_": "torchtune.modules.loss.CEWithChunkedOutputLoss"},
        "gradient_accumulation_steps": 1, "clip_grad_norm": None, "compile": False, "optimizer_in_bwd": False,
        "device": "cpu", "dtype": "fp32", "enable_activation_checkpointing": False,
        "enable_activation_offloading": False,
        "metric_logger": {"_component_": "torchtune.training.metric_logging.StdoutLogger"},
        "log_every_n_steps": 1, "log_peak_memory_stats": False,
        "profiler": {"_component_": "torchtune.training.setup_torch_profiler", "enabled": False},
    }
    path.write_text(json.dumps(config, indent=2) + "\n")


def make(workdir: Path) -> None:
    (workdir / "base").mkdir(parents=True, exist_ok=True)
    write_text(workdir)
    write_tokenizer(workdir)
    write_model(workdir)
    write_config(workdir / "finetune.yaml")


if __name__ == "__main__":
    sys.path.insert(0, str(SITE))
    make(Path(sys.argv[1]))
