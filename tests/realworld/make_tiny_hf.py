"""Writes a tiny randomly initialised causal LM (GPT-2 architecture, 1 layer, 32 wide), a word-level
tokenizer made from the corpus, and a JSON-lines text dataset, all locally: the HF stacks of the
real-world suite load them with ``from_pretrained`` / ``load_dataset`` from disk, never from a hub.

Usage: python make_tiny_hf.py MODEL_DIR DATASET_DIR
"""

import json
import random
import sys
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

WORDS = ("the model saves a checkpoint every few steps and resumes from the newest one after a crash "
         "or a preemption on the cluster while the supervisor keeps the log").split()


def main(model_dir: Path, dataset_dir: Path) -> None:
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 20))) for _ in range(400)]
    dataset_dir.mkdir(parents=True, exist_ok=True)
    with open(dataset_dir / "train.jsonl", "w") as out:
        for line in lines:
            out.write(json.dumps({"text": line}) + "\n")

    specials = ["<pad>", "<unk>", "<eos>"]
    vocab = {tok: i for i, tok in enumerate(specials + sorted(set(WORDS)))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", unk_token="<unk>",
                                        eos_token="<eos>", bos_token="<eos>")
    tokenizer.save_pretrained(model_dir)
    config = GPT2Config(vocab_size=len(vocab), n_positions=64, n_embd=32, n_layer=1, n_head=2,
                        bos_token_id=vocab["<eos>"], eos_token_id=vocab["<eos>"], pad_token_id=vocab["<pad>"])
    GPT2LMHeadModel(config).save_pretrained(model_dir)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
