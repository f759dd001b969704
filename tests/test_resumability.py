"""Can this run resume? The statement made at the first save (issue 21), and the output lines it
reads. Plain data through supervisor.resumability."""

from __future__ import annotations

import pytest

from supervisor.resumability import (
    ResumeFacts,
    judge_resumability,
    resume_line,
    save_line_path,
    suggested_checkpoint_dir,
)


@pytest.mark.parametrize("line, path", [
    ("saving checkpoint to out", "out"),  # nanoGPT
    ("Saving model checkpoint to /scratch/me/run/checkpoint-30", "/scratch/me/run/checkpoint-30"),  # HF Trainer
    ("Saving current state to /data/ckpts/checkpoint_3", "/data/ckpts/checkpoint_3"),  # Accelerate
    ("[2026-12-02 01:00:00,000] [INFO] Saving model checkpoint: /x/global_step5/mp_rank_00_model_states.pt",
     "/x/global_step5/mp_rank_00_model_states.pt"),  # DeepSpeed
    ("checkpoint saved to '/elsewhere/x.pt'", "/elsewhere/x.pt"),
    ("Saved checkpoint at step 400 to /elsewhere/ckpt_400.pt", "/elsewhere/ckpt_400.pt"),
])
def test_a_save_named_in_the_output_is_read_with_its_path(line: str, path: str) -> None:
    assert save_line_path(line) == path


@pytest.mark.parametrize("line, path", [
    # HF Trainer's save_pretrained lines, after "Saving model checkpoint to out/checkpoint-20": the phrase's
    # word is the checkpoint-20 directory inside the path; read as "-20/config.json" it was a save outside
    # the watched directory and a false "cannot resume" warning.
    ("[transformers] Configuration saved in out/checkpoint-20/config.json", "out/checkpoint-20"),
    ("[transformers] tokenizer config file saved in /w/out/checkpoint-20/tokenizer_config.json",
     "/w/out/checkpoint-20"),
    ("[transformers] Model weights saved in out/checkpoint-20/model.safetensors", "out/checkpoint-20/model.safetensors"),
    ("saved checkpoints/ckpt_5.pt", "checkpoints/ckpt_5.pt"),
    ("Saving checkpoint-20 to out", "out"),  # a name, not a path: the word after the phrase
])
def test_a_save_line_whose_checkpoint_word_is_part_of_the_path_names_that_path(line: str, path: str) -> None:
    assert save_line_path(line) == path
    assert suggested_checkpoint_dir(save_line_path(line) or "") in ("out", "/w/out", "checkpoints")


@pytest.mark.parametrize("line", [
    "step 10 loss 1.234", "saving model to final_model.pt", "eval step 0/50", "Loading checkpoint shards: 100%",
    "checkpoint every 1000 steps", "saved 3 images to samples/", "checkpoint saved at step 400",
])
def test_lines_that_save_no_checkpoint_are_not_read_as_saves(line: str) -> None:
    assert save_line_path(line) is None


@pytest.mark.parametrize("line, resumed", [
    ("resumed from out/ckpt.pt at step 100", True),
    ("Resuming training from out", True),
    ("Restoring states from the checkpoint path at /x/last.ckpt", True),
    ("Continuing training from checkpoint, will skip to saved global_step", True),
    ("Loaded checkpoint from /x/step=20.ckpt", True),
    ("Loading checkpoint shards: 100%|##########| 2/2", False),
    ("step 10 loss 1.234", False),
    ("saving checkpoint to out", False),
])
def test_output_that_shows_the_training_loaded_a_checkpoint(line: str, resumed: bool) -> None:
    assert resume_line(line) is resumed


def test_the_directory_to_watch_for_a_named_save() -> None:
    assert suggested_checkpoint_dir("/e/x.pt") == "/e"
    assert suggested_checkpoint_dir("/e/run/checkpoint-30") == "/e/run"
    assert suggested_checkpoint_dir("/x/global_step5/mp_rank_00_model_states.pt") == "/x"
    assert suggested_checkpoint_dir("/w/out") == "/w/out"


SEEN = dict(checkpoint_dir="/run/checkpoints", saved_path="/run/checkpoints/step=10.ckpt", saved_step=10,
            step_source="name")


def test_a_run_with_a_checkpoint_its_step_and_a_resume_command_can_resume() -> None:
    for how in (dict(resume_arg="--ckpt_path {path}"), dict(resume_arg="--init_from=resume"),
                dict(resume_env=("RESUME_FROM={path}",)), dict(client_resumed=0),
                dict(resume_output="resumed from /elsewhere/x.pt at step 40")):
        verdict = judge_resumability(ResumeFacts(**SEEN, **how))  # type: ignore[arg-type]
        assert verdict.ok and verdict.fix is None and verdict.missing == ()
        assert "step 10 (from name)" in verdict.reason


@pytest.mark.parametrize("saved, flag", [
    ("/run/ckpt/checkpoint-30", "--resume-arg '--resume_from_checkpoint {path}'"),
    ("/run/ckpt/out/ckpt.pt", "--resume-arg --init_from=resume"),
    ("/run/ckpt/epoch=1-step=50.ckpt", "--resume-arg '--ckpt_path {path}'"),
    ("/run/ckpt/model_50.pt", "--resume-arg '--resume {path}'"),
])
def test_without_a_resume_command_the_warning_names_the_flag_to_add(saved: str, flag: str) -> None:
    verdict = judge_resumability(ResumeFacts(checkpoint_dir="/run/ckpt", saved_path=saved, saved_step=30))
    assert not verdict.ok and verdict.missing == ("resume",)
    assert verdict.fix is not None and verdict.fix.startswith(flag)
    assert "restarts from step 0" in verdict.reason and flag in verdict.reason


def test_a_checkpoint_whose_step_is_unknown_is_said() -> None:
    verdict = judge_resumability(ResumeFacts(**{**SEEN, "saved_step": None}, resume_arg="--init_from=resume"))
    assert not verdict.ok and verdict.missing == ("step",)
    assert verdict.fix is not None and "checkpoint.step_from" in verdict.fix


def test_checkpoints_saved_outside_the_watched_directory_name_the_checkpoint_dir_flag() -> None:
    verdict = judge_resumability(ResumeFacts(checkpoint_dir="/run/checkpoints", saved_elsewhere="/elsewhere/x.pt",
                                             saved_elsewhere_step=10, last_step=12))
    assert not verdict.ok and verdict.missing == ("checkpoint", "resume")
    assert verdict.fix is not None and verdict.fix.startswith("--checkpoint-dir /elsewhere;")
    assert "saved to /elsewhere/x.pt at step 10" in verdict.reason


def test_nothing_seen_for_long_names_the_checkpoint_dir_flag() -> None:
    verdict = judge_resumability(ResumeFacts(checkpoint_dir="/run/checkpoints", last_step=5000,
                                             seconds_without_save=4000, resume_arg="--ckpt {path}"))
    assert not verdict.ok and verdict.missing == ("checkpoint",)
    assert "none seen in /run/checkpoints after step 5000 and 67 min" in verdict.reason
    assert verdict.fix is not None and verdict.fix.startswith("--checkpoint-dir DIR")


def test_a_start_from_scratch_after_a_save_the_supervisor_could_not_hand_over_is_caught() -> None:
    from supervisor.budget import audit_fresh_start

    outside = audit_fresh_start(100, "/elsewhere/ckpt.pt", 1, "/run/checkpoints", 0, outside=True)
    assert not outside.ok and "pass --checkpoint-dir /elsewhere" in outside.reason and "100 steps" in outside.reason
    unreadable = audit_fresh_start(100, "/run/checkpoints/ckpt.pt", 1, "/run/checkpoints", 1, outside=False)
    assert not unreadable.ok and "checkpoint.step_from" in unreadable.reason and "99 steps" in unreadable.reason
    assert audit_fresh_start(100, "/elsewhere/ckpt.pt", 1, "/run/checkpoints", 100, outside=True).ok  # resumed itself
    assert audit_fresh_start(100, "/elsewhere/ckpt.pt", 1, "/run/checkpoints", 40, outside=True).ok  # an older save
    assert audit_fresh_start(None, None, None, "/run/checkpoints", 0, outside=True).ok


def test_a_later_save_whose_step_is_known_settles_a_first_save_without_one() -> None:
    """Accelerate's test_checkpointing.py prints its step only after save_state(epoch_<e>): the first
    save lands before any step line, the next ones have the log's step. The warning must not stay."""
    from types import SimpleNamespace

    from supervisor.resumability import judge_resumability
    from supervisor.run.attempt import AttemptState, SaveRecord
    from supervisor.run.resumable import facts_now

    ctx = SimpleNamespace(layout=SimpleNamespace(ckpt_dir="/w/out"), resumability_said=None,
                          cfg=SimpleNamespace(resume_arg="--resume_from_checkpoint {path}", resume_env=()))
    state = AttemptState(attempt=1, started_at=0.0)
    state.saves.append(SaveRecord(None, "/w/out/epoch_0", 100, 0.1, True, "watch", 1.0))
    trigger, facts = facts_now(ctx, state, 2.0)  # type: ignore[arg-type,misc]
    assert trigger == "save" and judge_resumability(facts).missing == ("step",)
    state.saves.append(SaveRecord(20, "/w/out/epoch_1", 100, 0.1, True, "watch", 3.0))
    trigger, facts = facts_now(ctx, state, 4.0)  # type: ignore[arg-type,misc]
    verdict = judge_resumability(facts)
    assert verdict.ok and "epoch_1" in verdict.reason, verdict.reason
