"""Everything Accelerate's public checkpointing script needs, made locally, so that it runs unchanged,
offline, on a CPU in seconds (tests/realworld/SOURCES.md names the script and its pin).

The script loads ``AutoTokenizer``/``AutoModelForSequenceClassification.from_pretrained(<--model_name_or_path>)``,
``datasets.load_dataset("nyu-mll/glue", "mrpc")`` and ``evaluate.load("glue", "mrpc")``. The last two
look for a local directory of that relative path (relative to the working directory) before any hub,
so this writes, under WORKDIR:

* ``model/``: a sequence classifier with random weights (BERT architecture, 1 layer, 32 wide, 2 labels)
  and a word-level tokenizer that encodes sentence pairs the BERT way ([CLS] a [SEP] b [SEP]);
* ``nyu-mll/glue/``: a data set with one configuration, ``mrpc``: the MRPC columns (``sentence1``,
  ``sentence2``, ``label``, ``idx``), ``train`` and ``validation`` splits as JSON lines, declared in
  the ``configs:`` block of its README.md;
* ``glue/glue.py``: a metric module of our own (accuracy and F1 of binary labels), which is what the
  script asks the ``glue`` metric for.

The sentences are made of random words; the label says whether the two sentences share their first
word, so there is something to learn, but nothing here needs to be learned well.

Usage: python accelerate_setup.py WORKDIR [TRAIN_PAIRS]
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

WORDS = ("the model saves a checkpoint every epoch and resumes from the newest one after a crash "
         "or a preemption on the cluster while the supervisor keeps the log").split()
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
VALIDATION_PAIRS = 32  # one evaluation batch of the script (EVAL_BATCH_SIZE)

DATASET_CARD = """---
configs:
- config_name: mrpc
  data_files:
  - split: train
    path: mrpc/train.jsonl
  - split: validation
    path: mrpc/validation.jsonl
---
Sentence pairs in the columns of GLUE's MRPC, made of random words for the real-world suite.
"""

# Our own metric module for evaluate.load("glue", "mrpc"): the accuracy and F1 of 0/1 predictions.
METRIC_MODULE = '''"""Accuracy and F1 of binary labels, under the name the script loads ("glue", config "mrpc")."""

import datasets
import evaluate


class Glue(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description="accuracy and F1 of 0/1 labels",
            citation="",
            inputs_description="predictions and references: lists of 0/1",
            features=datasets.Features({"predictions": datasets.Value("int64"),
                                        "references": datasets.Value("int64")}),
        )

    def _compute(self, predictions, references):
        pairs = list(zip(predictions, references))
        right = sum(1 for p, r in pairs if p == r)
        true_pos = sum(1 for p, r in pairs if p == 1 and r == 1)
        predicted, actual = sum(1 for p, _ in pairs if p == 1), sum(1 for _, r in pairs if r == 1)
        f1 = 2 * true_pos / (predicted + actual) if predicted + actual else 0.0
        return {"accuracy": right / len(pairs) if pairs else 0.0, "f1": f1}
'''


def sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 10)))


def write_pairs(path: Path, count: int, rng: random.Random) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as out:
        for idx in range(count):
            first, second = sentence(rng), sentence(rng)
            out.write(json.dumps({"sentence1": first, "sentence2": second,
                                  "label": int(first.split()[0] == second.split()[0]), "idx": idx}) + "\n")


def write_model(model_dir: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + sorted(set(WORDS)))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", unk_token="[UNK]",
                                        cls_token="[CLS]", sep_token="[SEP]", model_max_length=64)
    tokenizer.save_pretrained(model_dir)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, num_labels=2,
                        pad_token_id=vocab["[PAD]"])
    BertForSequenceClassification(config).save_pretrained(model_dir)


def main(workdir: Path, train_pairs: int) -> None:
    rng = random.Random(0)
    glue = workdir / "nyu-mll" / "glue"
    write_pairs(glue / "mrpc" / "train.jsonl", train_pairs, rng)
    write_pairs(glue / "mrpc" / "validation.jsonl", VALIDATION_PAIRS, rng)
    (glue / "README.md").write_text(DATASET_CARD)
    (workdir / "glue").mkdir(parents=True, exist_ok=True)
    (workdir / "glue" / "glue.py").write_text(METRIC_MODULE)
    write_model(workdir / "model")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 160)
