"""Progress lines that may count the global step (issue 21: steps lost for stacks whose output never
states the global step between saves). The lines are real, captured from the real-world suite's
stacks (tests/realworld/): HF Trainer's bare bar, Lightning's epoch bar and its bar after a resume,
litgpt-style Fabric lines. Pure: StepExtractor and BarEvidence only."""

from __future__ import annotations

import pytest

from supervisor.progress import BarEvidence, StepExtractor

HF_20 = " 17%|█▋        | 20/120 [00:00<00:01, 98.51it/s]"
HF_21 = " 18%|█▊        | 21/120 [00:00<00:01, 94.93it/s]"
LIGHTNING_20 = "Epoch 0:  10%|█         | 20/200 [00:00<00:01, 143.13it/s]"
LIGHTNING_23 = "Epoch 0:  12%|█▏        | 23/200 [00:00<00:01, 127.57it/s]"
LIGHTNING_RESUMED = "Training: |          | 21/? [00:00<00:00, 1278.58it/s]"
FABRIC = "Epoch 1 | iter 46 step 23 | loss train: 4.160, val: n/a | iter time: 0.57 ms"

# (line, progress only, candidate): what the line would be as a global step once proven.
CASES = [
    (HF_20, True, 20),  # HF Trainer: the bar counts optimizer steps up to max_steps
    (HF_20 + "[transformers] Saving model checkpoint to out/checkpoint-20", True, 20),
    (LIGHTNING_20, True, 20),  # Lightning, epoch 0: the batch
    ("Epoch 2:  10%|█         | 20/200 [00:00<00:01, 143.13it/s]", True, 420),  # epoch x batches + batch
    ("Epoch 2: |          | 20/? [00:00<00:00, 143.13it/s]", True, None),  # batches per epoch unknown
    (LIGHTNING_RESUMED, True, 21),  # Lightning after a resume mid-epoch: a bare bar
    (FABRIC, True, 23),  # litgpt: "step" counts optimizer steps, "iter" micro-batches
    ("Epoch 3 step 5/50 loss 0.1", True, None),  # a step of N in an epoch: per-epoch, no candidate
    ("Validation DataLoader 0:  40%|████      | 4/10 [00:00<00:00, 50.00it/s]", True, None),  # a side loop
    ("Epoch 0, global step 20: 'step' reached 20.00000 (best 20.00000), saving model to 'x.ckpt'", False, None),
    ("iter 100: loss 2.1000, time 12.00ms", False, None),  # a global step as it is: no candidate needed
]


@pytest.mark.parametrize(("line", "progress_only", "candidate"), CASES)
def test_a_progress_line_says_what_its_global_step_would_be(line: str, progress_only: bool,
                                                            candidate: int | None) -> None:
    found = StepExtractor().match(line)
    assert found is not None
    assert (found.progress_only, found.candidate) == (progress_only, candidate)


def test_a_bar_is_one_kind_of_line_however_full_it_is() -> None:
    """The fill of a bar changes every few steps; a bar proven once stays proven as it fills."""
    ex = StepExtractor()
    shapes = {ex.match(line).shape for line in (HF_20, HF_21, " 100%|██████████| 120/120 [00:01<00:00, 105.83it/s]")}
    assert len(shapes) == 1
    assert ex.match(LIGHTNING_20).shape == ex.match(LIGHTNING_23).shape


def feed(bars: BarEvidence, line: str) -> bool:
    found = StepExtractor().match(line)
    assert found is not None and found.candidate is not None
    return bars.counts(found.shape, found.candidate)


def hf(n: int) -> str:
    return f" {n * 100 // 120:2d}%|█▋        | {n}/120 [00:00<00:01, 98.51it/s]"


def test_hf_trainer_a_save_seen_late_still_proves_the_bar_that_read_its_step_when_it_began() -> None:
    """HF Trainer at ~100 steps/s: the bar reads 20 when checkpoint-20 begins; by the time the watch
    sees it finished the bar reads 23. The save's begin proves the bar: the crash at 23 lost 3 steps."""
    bars = BarEvidence(resume_step=None)
    assert not any(feed(bars, hf(n)) for n in range(1, 21))
    bars.save_began()
    assert not any(feed(bars, hf(n)) for n in range(21, 24))
    assert bars.saved(20) == (20, 23)  # the reading at the save's begin, then the one now
    assert feed(bars, hf(24))


def test_output_drained_late_the_bar_still_proves_itself_by_what_it_read_while_the_save_was_in_flight() -> None:
    """On a loaded machine the output reaches the supervisor after the watch sees the save begin:
    the bar reads 18 then, 19 and 20 arrive while the save is written, 21-23 after it."""
    bars = BarEvidence(resume_step=None)
    assert not any(feed(bars, hf(n)) for n in range(1, 19))
    bars.save_began()
    assert not any(feed(bars, hf(n)) for n in range(19, 24))
    assert bars.saved(20) == (20, 23)  # the reading that agreed, then the one now
    assert feed(bars, hf(24))


def test_a_fast_save_already_whole_when_first_seen_is_matched_with_the_readings_just_before() -> None:
    """Lightning's tiny checkpoint is written in milliseconds: the watch first sees it when the bar
    already reads 22 (about 140 steps a second); the bar read 20 a moment before."""
    bars = BarEvidence(resume_step=None)
    for n in range(1, 23):
        bars.counts("bar", n, now=n / 140)
    bars.save_began(now=22 / 140 + 0.01)
    bars.counts("bar", 23, now=0.4)
    assert bars.saved(20) == (20, 23)


def test_a_reading_of_the_step_long_before_the_save_was_seen_proves_nothing() -> None:
    """A slow training (one batch a second) whose bar read 20 five seconds before a save of step 20
    was seen: the bar was elsewhere while the save was in flight."""
    bars = BarEvidence(resume_step=None)
    for n in range(1, 26):
        bars.counts("bar", n, now=float(n))
    bars.save_began(now=25.1)
    assert bars.saved(20) == ()


def test_a_counter_that_went_back_while_a_save_was_in_flight_proves_nothing() -> None:
    """A per-epoch bar that starts a new epoch during the save passes through the save's step."""
    bars = BarEvidence(resume_step=None)
    bar = " {p:2d}%|#         | {n}/30 [00:01<00:02, 10.00it/s]"
    for n in range(1, 29):
        feed(bars, bar.format(p=n, n=n))
    bars.save_began()
    for n in [29, 30, *range(0, 22)]:
        feed(bars, bar.format(p=n, n=n))
    assert bars.saved(20) == ()


def test_a_bar_a_save_never_agrees_with_stays_progress_only() -> None:
    """Gradient accumulation: the bar counts batches (40) when the optimizer step 20 is saved."""
    bars = BarEvidence(resume_step=None)
    for n in range(1, 41):
        feed(bars, hf(n))
    bars.save_began()
    assert bars.saved(20) == ()
    assert not feed(bars, hf(41))


def test_lightning_after_a_resume_the_bar_past_its_initial_zero_proves_itself() -> None:
    bars = BarEvidence(resume_step=20)
    assert not feed(bars, "Training: |          | 0/? [00:00<?, ?it/s]")
    assert feed(bars, LIGHTNING_RESUMED)  # 21: the step after the resume point
    assert feed(bars, "Training: |          | 22/? [00:00<00:00, 1219.42it/s]")


def test_a_per_epoch_bar_that_goes_back_is_no_longer_believed() -> None:
    """A tqdm(loader) bar in epoch 0 reads like the step and a save agrees; in epoch 1 it starts
    again at 0: from then on it counts nothing, and no later save makes it count again."""
    bars = BarEvidence(resume_step=None)
    bar = " {p:2d}%|#         | {n}/30 [00:01<00:02, 10.00it/s]"
    for n in range(1, 21):
        feed(bars, bar.format(p=n, n=n))
    assert bars.saved(20) == (20,)
    assert feed(bars, bar.format(p=70, n=21))
    assert not feed(bars, bar.format(p=0, n=0))  # a new epoch
    assert not any(feed(bars, bar.format(p=n, n=n)) for n in range(1, 11))
    assert bars.saved(10) == ()


def test_fabric_the_step_of_an_epoch_line_counts_once_a_save_agrees() -> None:
    bars = BarEvidence(resume_step=None)
    lines = [f"Epoch 1 | iter {2 * n} step {n} | loss train: 4.160, val: n/a | iter time: 0.57 ms" for n in range(1, 25)]
    assert not any(feed(bars, line) for line in lines[:20])
    bars.save_began()
    assert bars.saved(20) == (20,)
    assert all(feed(bars, line) for line in lines[20:])
