"""The log-line corpus (tests/data/step_lines/lines.tsv): every line from public training code gives
the global step it carries, or none. Evaluation, warm-up, sub-loop and config lines never pass for
the global step; the training's own progress lines do."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.progress import StepExtractor

CORPUS = Path(__file__).parent / "data" / "step_lines" / "lines.tsv"


def _rows() -> list[tuple[int | None, str, str]]:
    rows = []
    for raw in CORPUS.read_text(encoding="utf-8").splitlines():
        if not raw.strip() or raw.startswith("#"):
            continue
        expected, source, line = raw.split("\t", 2)
        rows.append((None if expected == "none" else int(expected), source, line.replace("\\e", "\x1b")))
    return rows


ROWS = _rows()


def test_corpus_covers_the_stacks_and_the_false_steps() -> None:
    sources = {source.split()[0] for _, source, _ in ROWS}
    assert len(ROWS) >= 80
    assert {"karpathy/nanoGPT", "huggingface/transformers", "Lightning-AI/pytorch-lightning",
            "huggingface/pytorch-image-models", "NVIDIA/Megatron-LM", "microsoft/DeepSpeed",
            "facebookresearch/fairseq", "pytorch/torchtitan", "huggingface/accelerate"} <= sources
    assert sum(1 for expected, _, _ in ROWS if expected is None) >= 40


@pytest.mark.parametrize(("expected", "source", "line"), ROWS, ids=[f"{i}" for i in range(len(ROWS))])
def test_each_line_gives_its_global_step_or_none(expected: int | None, source: str, line: str) -> None:
    assert StepExtractor().extract(line) == expected, f"{source}: {line!r}"
