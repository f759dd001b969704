"""What litgpt's own ``pretrain`` needs to run offline on a CPU in seconds, made locally: a
word-level tokenizer directory (``tokenizer.json`` + ``tokenizer_config.json``, the two files litgpt's
``Tokenizer`` reads), training and validation text cut into litdata's chunks (what litgpt's ``LitData``
data module reads), and a ``--config`` file with a tiny custom ``model_config`` (1 layer, 32 wide) and
the training settings.

Nothing here is litgpt's code: the script the suite runs is the installed package's ``pretrain.py``,
unchanged (``pretrain_script`` checks its SHA-256). ``make`` imports litdata (and so torch): the
suite runs this file in a subprocess, once per session (conftest.py's ``tiny_litgpt``).

Usage: python litgpt_setup.py WORKDIR
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

WORDS = ("the model saves a checkpoint every few steps and resumes from the newest one after a crash "
         "or a preemption on the cluster while the supervisor keeps the log").split()
SPECIALS = ["<pad>", "<unk>", "<bos>", "<eos>"]
SEQ_LEN = 32  # the model's block size: one sample is 33 tokens (input and shifted target)
MICRO_BATCH, GLOBAL_BATCH = 4, 8  # two iterations per optimizer step, as pretraining usually runs


def max_tokens(steps: int) -> int:
    """``--train.max_tokens`` that makes ``pretrain`` stop after ``steps`` optimizer steps (it counts
    iterations of ``micro_batch_size * block_size`` tokens; ``GLOBAL_BATCH // MICRO_BATCH`` per step)."""
    return steps * (GLOBAL_BATCH // MICRO_BATCH) * MICRO_BATCH * SEQ_LEN


def write_tokenizer(directory: Path) -> int:
    """A word-level tokenizer; returns its vocabulary size."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(SPECIALS + sorted(set(WORDS)))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    directory.mkdir(parents=True, exist_ok=True)
    core.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
        "pad_token": "<pad>", "unk_token": "<unk>", "add_bos_token": True}))
    return len(vocab)


def write_text(directory: Path, files: int, seed: int) -> None:
    """``files`` plain-text files of random sentences over ``WORDS`` (about 6,000 tokens each)."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 20))) for _ in range(400)]
        (directory / f"part-{i}.txt").write_text("\n".join(lines) + "\n")


def write_config(path: Path, vocab_size: int) -> None:
    """The ``--config`` file: a tiny GPT (litgpt's ``Config`` fields) and settings for a CPU. JSON is
    YAML, so no YAML writer is needed."""
    config = {
        "model_name": "tiny",
        "model_config": {"name": "tiny", "block_size": SEQ_LEN, "n_layer": 1, "n_head": 2, "n_embd": 32,
                         "vocab_size": vocab_size, "padded_vocab_size": 64, "bias": True},
        "precision": "32-true",
        "devices": 1,
        "logger_name": "csv",
        "tokenizer_dir": "checkpoints/tiny",
        "data": {"class_path": "litgpt.data.LitData",
                 "init_args": {"data_path": "data", "split_names": ["train", "val"], "num_workers": 0}},
        "train": {"global_batch_size": GLOBAL_BATCH, "micro_batch_size": MICRO_BATCH, "log_interval": 1,
                  "lr_warmup_steps": 5, "max_norm": 1.0, "min_lr": 1e-4},
        "eval": {"interval": 100000, "max_iters": 2, "final_validation": False},
        "optimizer": {"class_path": "torch.optim.AdamW", "init_args": {"lr": 1e-3}},
    }
    path.write_text(json.dumps(config, indent=2) + "\n")


def tokenize(path: str, tokenizer_dir: str):
    """One text file as one token sequence, as litgpt's ``TextFiles`` tokenizes (a BOS first): litdata
    concatenates the sequences and cuts them into samples of ``SEQ_LEN + 1`` tokens."""
    import torch
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
    ids = [tokenizer.token_to_id("<bos>"), *tokenizer.encode(Path(path).read_text().strip()).ids]
    yield torch.tensor(ids, dtype=torch.int32)


def write_streaming_data(text_dir: Path, out_dir: Path, tokenizer_dir: Path) -> None:
    """litdata's optimized chunks of the text files, the input litgpt's ``LitData`` data module reads.
    Forked workers (litdata's default, spawn, starts a fresh interpreter per call: a minute here)."""
    from functools import partial

    from litdata import optimize
    from litdata.streaming import TokensLoader

    optimize(fn=partial(tokenize, tokenizer_dir=str(tokenizer_dir)), inputs=sorted(map(str, text_dir.glob("*.txt"))),
             output_dir=str(out_dir), num_workers=1, chunk_bytes="1MB", start_method="fork",
             item_loader=TokensLoader(block_size=SEQ_LEN + 1), verbose=False)


# The public script the litgpt stack runs: ``pretrain.py`` as the pinned litgpt wheel ships it
# (SOURCES.md), run through litgpt's own command line (``python -m litgpt pretrain``).
LITGPT_PIN = "litgpt==0.5.13"
LITGPT_PRETRAIN_SHA256 = "03964908724f48f6d4a07ab8abc7680c3e60996bdad51dbe33bbf1d2de709ca9"
# litgpt's own requirements ask for an older huggingface_hub and jsonargparse than transformers and the
# rest of the test extra use; so .ci/run installs these without their dependencies, then the few
# modules they import that the extra lacks (SOURCES.md says why).
INSTALL = ("pip install --no-deps litgpt==0.5.13 litdata==0.2.59 tifffile==2026.3.3 obstore==0.12.1 && "
           "pip install 'jsonargparse[signatures]==4.53.0' boto3==1.43.11 requests==2.34.2")


def pretrain_script() -> Path:
    """The installed litgpt's pretrain.py, checked byte for byte against the pinned one. Found without
    importing litgpt (its package imports torch)."""
    import hashlib
    import importlib.util

    spec = importlib.util.find_spec("litgpt")
    assert spec is not None and spec.origin, f"litgpt is not installed: {INSTALL}"
    script = Path(spec.origin).parent / "pretrain.py"
    digest = hashlib.sha256(script.read_bytes()).hexdigest()
    assert digest == LITGPT_PRETRAIN_SHA256, f"{script} is not the pinned script (sha256 {digest}): {INSTALL}"
    return script


def pretrain_command(python: str, save_interval: int, steps: int) -> list[str]:
    """litgpt's pretraining as its docs run it, on the files ``make`` wrote (paths relative to the
    working directory)."""
    pretrain_script()
    return [python, "-m", "litgpt", "pretrain", "--config", "pretrain.yaml", "--out_dir", "out/pretrain",
            "--train.save_interval", str(save_interval), "--train.max_tokens", str(max_tokens(steps))]


def make(workdir: Path) -> None:
    tokenizer_dir = workdir / "checkpoints" / "tiny"
    vocab_size = write_tokenizer(tokenizer_dir)
    for split, seed in (("train", 0), ("val", 1)):
        write_text(workdir / "text" / split, files=1, seed=seed)
        write_streaming_data(workdir / "text" / split, workdir / "data" / split, tokenizer_dir)
    write_config(workdir / "pretrain.yaml", vocab_size)


if __name__ == "__main__":
    make(Path(sys.argv[1]))
