"""Where a checkpoint's step comes from (issue 21): the precedence on plain data, then real
``torch.save`` files in the layouts people use (nanoGPT's in-place ``ckpt.pt`` with ``iter_num``,
a Lightning-like dict, an HF ``checkpoint-N/`` with ``trainer_state.json``, Accelerate's
``checkpoint_<i>/``), as ``validate``, the resume-point chooser and the save watcher see them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from supervisor.checkpoints.resume import choose_resume_point
from supervisor.checkpoints.scan import RecordedStep, find_resume_point
from supervisor.checkpoints.stepsource import StepEvidence, choose_step, parse_step_rule
from supervisor.checkpoints.validate import validate
from supervisor.run.saves import step_of_saved

from ckpt_factory import lightning_checkpoint, make_hf_checkpoint, model_state, save_safetensors

# ---------------------------------------------------------------------------- precedence, plain data


def test_the_name_beats_inside_and_the_log_and_says_who_disagreed() -> None:
    choice = choose_step(StepEvidence("step=900.ckpt", name_step=900, inside_step=1200, inside_key="global_step",
                                      log_step=950))
    assert (choice.step, choice.source) == (900, "name")
    assert "1200 from key global_step" in choice.reason and "950 from log" in choice.reason


def test_inside_beats_the_log_and_the_log_is_the_last_resort() -> None:
    inside = choose_step(StepEvidence("ckpt.pt", inside_step=240, inside_key="iter_num", log_step=250))
    assert (inside.step, inside.source, inside.described) == (240, "key iter_num", "240 (key iter_num)")
    assert choose_step(StepEvidence("model.pt", log_step=250)).source == "log"


def test_a_save_index_is_never_a_step() -> None:
    alone = choose_step(StepEvidence("checkpoint_3", name_step=3, name_is_index=True))
    assert (alone.step, alone.index, alone.described) == (None, 3, "- (save index 3)")
    logged = choose_step(StepEvidence("checkpoint_3", name_step=3, name_is_index=True, log_step=40))
    assert (logged.step, logged.source, logged.index) == (40, "log", 3)


@pytest.mark.parametrize(("rule", "expected"), [
    ("name:run-([0-9]+)-", (77, "rule name:run-([0-9]+)-")),
    ("key:iter_num", (240, "rule key:iter_num")),
    ("log", (250, "rule log")),
])
def test_the_user_rule_wins_when_it_yields_a_step(rule: str, expected: tuple[int, str]) -> None:
    evidence = StepEvidence("run-77-step=900.ckpt", name_step=900, inside_step=240, inside_key="iter_num",
                            log_step=250)
    choice = choose_step(evidence, parse_step_rule(rule))
    assert (choice.step, choice.source) == expected


def test_a_rule_that_yields_nothing_falls_back_to_the_precedence() -> None:
    choice = choose_step(StepEvidence("step=900.ckpt", name_step=900), parse_step_rule("key:iter_num"))
    assert (choice.step, choice.source) == (900, "name")


# ---------------------------------------------------------------------------- real files


def nanogpt_ckpt(path: Path, iter_num: int) -> Path:
    """nanoGPT's train.py: one ckpt.pt rewritten in place, the step under iter_num."""
    torch.save({"model": model_state(iter_num), "optimizer": {"state": {}, "param_groups": []},
                "model_args": {"n_layer": 2, "n_head": 2}, "iter_num": iter_num, "best_val_loss": 1.5,
                "config": {"max_iters": 5000, "eval_interval": 250}}, path)
    return path


def accelerate_dir(root: Path, index: int, name: str = "checkpoint_{}") -> Path:
    """Accelerate save_state() with automatic_checkpoint_naming: checkpoints/checkpoint_<i>/ holding
    model.safetensors, optimizer.bin and random_states_0.pkl (whose "step" counts accumulation).
    ``name="epoch_{}"``: save_state(f"epoch_{epoch}") once per epoch, as Accelerate's examples do."""
    d = root / name.format(index)
    d.mkdir(parents=True)
    save_safetensors(d / "model.safetensors", model_state(index), {"format": "pt"})
    torch.save({"state": {}, "param_groups": [{"lr": 1e-3, "params": [0]}]}, d / "optimizer.bin")
    torch.save({"step": 0, "random_state": 7, "torch_manual_seed": torch.zeros(4, dtype=torch.uint8)},
               d / "random_states_0.pkl")
    return d


def test_nanogpt_in_place_ckpt_has_its_step_under_iter_num(tmp_path: Path) -> None:
    report = validate(nanogpt_ckpt(tmp_path / "ckpt.pt", 240))
    assert (report.step, report.step_source, report.step_described) == (240, "key iter_num", "240 (key iter_num)")
    result = find_resume_point(tmp_path, writers_alive=False)
    assert (result.path, result.step) == (str(tmp_path / "ckpt.pt"), 240)
    assert result.event_fields()["step_source"] == "key iter_num"


def litgpt_step_dir(out: Path, name: str, step_count: int) -> Path:
    """litgpt's pretrain/finetune: fabric.save of {model, optimizer, ..., iter_num, step_count} into
    <out>/<name>/lit_model.pth, then its YAML files beside it; with gradient accumulation iter_num
    counts micro-batches (here two per optimizer step) and the name counts optimizer steps."""
    d = out / name
    d.mkdir(parents=True)
    torch.save({"model": model_state(step_count), "optimizer": {"state": {}, "param_groups": []},
                "train_dataloader": {"num_samples_yielded": 8 * step_count, "current_epoch": 1},
                "iter_num": 2 * step_count, "step_count": step_count}, d / "lit_model.pth")
    (d / "model_config.yaml").write_text("n_layer: 1\n")
    (d / "hyperparameters.yaml").write_text("train:\n  save_interval: 20\n")
    return d


def test_litgpt_step_dirs_are_whole_and_their_step_is_step_count_not_iter_num(tmp_path: Path) -> None:
    # iter_num (micro-batches) read as the step made every step-N dir "unverifiable: embedded step 2N != N"
    report = validate(litgpt_step_dir(tmp_path, "step-00000020", 20))
    assert (report.verdict.value, report.step, report.step_source) == ("valid", 20, "name"), report.reason
    final = validate(litgpt_step_dir(tmp_path, "final", 60))  # no step in the name: the key inside says it
    assert (final.step, final.step_source) == (60, "inside the file")


def test_lightning_dict_and_hf_dir_say_where_their_step_is(tmp_path: Path) -> None:
    torch.save(lightning_checkpoint(300), tmp_path / "last.ckpt")
    assert (validate(tmp_path / "last.ckpt").step, validate(tmp_path / "last.ckpt").step_source) == \
        (300, "key global_step")
    hf = make_hf_checkpoint(tmp_path / "hf", 30)
    (hf / "trainer_state.json").write_text(json.dumps({"global_step": 30, "epoch": 1.0}))
    report = validate(hf)
    assert (report.step, report.step_source) == (30, "name")  # checkpoint-30: the name, trainer_state agrees
    renamed = hf.rename(tmp_path / "hf" / "best")
    assert (validate(renamed).step, validate(renamed).step_source) == (30, "trainer_state.json")


def test_accelerate_index_dirs_are_ranked_by_save_order_never_read_as_steps(tmp_path: Path) -> None:
    for i in range(3):
        accelerate_dir(tmp_path, i)
    report = validate(tmp_path / "checkpoint_1")
    assert (report.step, report.index, report.step_described) == (None, 1, "- (save index 1)")
    result = find_resume_point(tmp_path, writers_alive=False)
    assert (Path(result.path).name, result.step) == ("checkpoint_2", None)
    # the log knew the step when each save landed: then that is the step, and it ranks
    logged = {str(tmp_path / f"checkpoint_{i}"): RecordedStep(20 * (i + 1)) for i in range(3)}
    result = find_resume_point(tmp_path, writers_alive=False, recorded_steps=logged)
    assert (Path(result.path).name, result.step, result.event_fields()["step_source"]) == ("checkpoint_2", 60, "log")


def test_a_checkpoint_N_that_accelerate_did_not_write_keeps_N_as_its_step(tmp_path: Path) -> None:
    torch.save(lightning_checkpoint(500), tmp_path / "checkpoint_500")
    assert validate(tmp_path / "checkpoint_500").step == 500


def test_a_log_step_for_a_file_rewritten_since_is_not_used(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    torch.save({"weights": model_state(1)}, path)
    stale = {str(path): RecordedStep(90, bytes=path.stat().st_size + 1)}
    assert find_resume_point(tmp_path, writers_alive=False, recorded_steps=stale).step is None
    fresh = {str(path): RecordedStep(90, bytes=path.stat().st_size)}
    result = find_resume_point(tmp_path, writers_alive=False, recorded_steps=fresh)
    assert (result.step, result.event_fields()["step_source"]) == (90, "log")


def test_the_user_key_rule_reads_a_key_nobody_else_uses(tmp_path: Path) -> None:
    path = tmp_path / "state.pt"
    torch.save({"model": model_state(2), "trained_batches": 4321}, path)
    assert validate(path).step is None
    report = validate(path, step_from="key:trained_batches")
    assert (report.step, report.step_source) == (4321, "rule key:trained_batches")


def test_the_save_watcher_records_the_step_and_its_source(tmp_path: Path) -> None:
    nanogpt_ckpt(tmp_path / "ckpt.pt", 240)
    assert (step_of_saved(str(tmp_path / "ckpt.pt"), log_step=250).described) == "240 (key iter_num)"
    d = accelerate_dir(tmp_path, 4)
    assert step_of_saved(str(d), log_step=40).described == "40 (log)"
    assert step_of_saved(str(d)).described == "- (save index 4)"
    assert step_of_saved(str(make_hf_checkpoint(tmp_path, 30))).described == "30 (name)"


def test_chooser_prefers_any_known_step_over_an_index(tmp_path: Path) -> None:
    reports = [validate(accelerate_dir(tmp_path, 9)), validate(nanogpt_ckpt(tmp_path / "ckpt.pt", 5))]
    decision = choose_resume_point(reports)
    assert (Path(decision.path).name, decision.step) == ("ckpt.pt", 5)


def test_the_watch_sees_an_accelerate_save_land(tmp_path: Path) -> None:
    from supervisor.checkpoints.watch import DirWatcher

    watcher = DirWatcher(str(tmp_path))
    watcher.poll(0.0)
    accelerate_dir(tmp_path, 0)
    watcher.poll(1.0)
    done = watcher.poll(2.0).completed
    assert [Path(c.path).name for c in done] == ["checkpoint_0"]


def test_epoch_named_saves_are_listed_and_ranked_by_epoch_never_read_as_steps(tmp_path: Path) -> None:
    """Accelerate's test_checkpointing.py and its examples save_state(f"epoch_{e}") after each epoch:
    these were no candidates at all, so a crash restarted the training from scratch in silence."""
    for epoch in (0, 1, 2, 10):
        accelerate_dir(tmp_path, epoch, "epoch_{}")
    report = validate(tmp_path / "epoch_2")
    assert (report.step, report.index, report.step_described) == (None, 2, "- (save index 2)")
    result = find_resume_point(tmp_path, writers_alive=False)
    assert (Path(result.path).name, result.step) == ("epoch_10", None)  # by number, not lexically
    logged = {str(tmp_path / f"epoch_{e}"): RecordedStep(40 * (e + 1)) for e in (0, 1, 2, 10)}
    result = find_resume_point(tmp_path, writers_alive=False, recorded_steps=logged)
    assert (Path(result.path).name, result.step, result.event_fields()["step_source"]) == ("epoch_10", 440, "log")
    assert step_of_saved(str(tmp_path / "epoch_1")).described == "- (save index 1)"


def test_an_epoch_is_never_a_step_even_outside_accelerate(tmp_path: Path) -> None:
    (tmp_path / "epoch_7").mkdir()
    save_safetensors(tmp_path / "epoch_7" / "model.safetensors", model_state(7), {"format": "pt"})
    torch.save({"model": model_state(3)}, tmp_path / "epoch_3.pt")
    assert [(validate(tmp_path / n).step, validate(tmp_path / n).index) for n in ("epoch_7", "epoch_3.pt")] == \
        [(None, 7), (None, 3)]
    assert step_of_saved(str(tmp_path / "epoch_7")).described == "- (save index 7)"
    torch.save(lightning_checkpoint(900), tmp_path / "epoch=4.ckpt")  # the step inside still wins
    assert validate(tmp_path / "epoch=4.ckpt").step == 900
    assert Path(find_resume_point(tmp_path, writers_alive=False).path).name == "epoch=4.ckpt"


def test_mace_saves_named_by_their_epoch_are_resumed_from_the_newest(tmp_path: Path) -> None:
    """MACE's checkpoint handler saves ``<name>_run-<seed>_epoch-<N>.pt`` (model, optimizer and scheduler
    state, no step) and restarts from the newest by N. Those saves are ordered by their epoch (not
    lexically: epoch-10 after epoch-9), so a fixed resume flag is appended; before, none of them was a
    resume point ("carry no step number") and a crash restarted the training from scratch."""
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()  # Adam's per-parameter "step" counts its own steps: never read as the training's
    for epoch in (2, 9, 10):
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "lr_scheduler": {"last_epoch": epoch}}, tmp_path / f"tiny_run-1_epoch-{epoch}.pt")
    report = validate(tmp_path / "tiny_run-1_epoch-10.pt")
    assert (report.step, report.index) == (None, 10)
    result = find_resume_point(tmp_path, writers_alive=False)
    assert (Path(result.path).name, result.step) == ("tiny_run-1_epoch-10.pt", None)
    logged = {str(tmp_path / f"tiny_run-1_epoch-{e}.pt"): RecordedStep(e) for e in (2, 9, 10)}
    result = find_resume_point(tmp_path, writers_alive=False, recorded_steps=logged)
    assert (Path(result.path).name, result.step, result.event_fields()["step_source"]) == \
        ("tiny_run-1_epoch-10.pt", 10, "log")


def test_the_watch_sees_an_epoch_save_land(tmp_path: Path) -> None:
    from supervisor.checkpoints.watch import DirWatcher

    watcher = DirWatcher(str(tmp_path))
    watcher.poll(0.0)
    accelerate_dir(tmp_path, 0, "epoch_{}")
    watcher.poll(1.0)
    done = watcher.poll(2.0).completed
    assert [Path(c.path).name for c in done] == ["epoch_0"]


def test_an_epoch_save_is_recorded_at_the_step_the_output_reports_after_it(tmp_path: Path) -> None:
    """Accelerate's test_checkpointing.py prints its step only after save_state(epoch_<e>): the
    save_end of epoch_2 waits for that line and records its step (30), not the previous epoch's
    (20, the lower bound when the save began), and a crash 5 steps later has lost 5 steps."""
    from types import SimpleNamespace

    from supervisor.checkpoints.watch import DirWatcher
    from supervisor.events import Ev
    from supervisor.run.attempt import AttemptState
    from supervisor.run.saves import final_rescan, note_step_line, watch_saves

    emitted: list[tuple[Ev, dict]] = []
    ctx = SimpleNamespace(emit=lambda ev, **f: emitted.append((ev, f)), cfg=SimpleNamespace(checkpoint=None),
                          layout=SimpleNamespace(ckpt_dir=tmp_path))
    state, watcher = AttemptState(1, 0.0), DirWatcher(str(tmp_path))
    state.observe_step(20, 0.5, "regex")  # the last line before the save: epoch 1's, step 20
    watch_saves(ctx, watcher, state, 0.0)
    accelerate_dir(tmp_path, 2, "epoch_{}")
    watch_saves(ctx, watcher, state, 1.0)  # in flight
    watch_saves(ctx, watcher, state, 2.0)  # landed: its save_end waits for the output
    assert [f["step"] for ev, f in emitted if ev is Ev.SAVE_END] == []
    assert state.last_durable_step == 20  # meanwhile the lower bound
    note_step_line(state, 30, 2, 2.5)  # epoch 2: {'accuracy': 0.5, 'f1': 0.66, 'epoch': 2, 'step': 30}
    state.observe_step(30, 2.5, "regex")
    watch_saves(ctx, watcher, state, 3.0)
    ends = [f for ev, f in emitted if ev is Ev.SAVE_END]
    assert [(f["step"], f["step_source"]) for f in ends] == [(30, "log after the save")]
    assert "epoch 2" in ends[0]["step_reason"]
    state.observe_step(35, 4.0, "regex")  # then the crash
    final_rescan(ctx, watcher, state, 5.0)
    assert (state.last_durable_step, state.steps_lost()) == (30, 5)
    assert len([f for ev, f in emitted if ev is Ev.SAVE_END]) == 1


def test_an_epoch_save_with_no_line_after_it_keeps_the_lower_bound_and_says_so(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from supervisor.checkpoints.watch import DirWatcher
    from supervisor.events import Ev
    from supervisor.run.attempt import AttemptState
    from supervisor.run.saves import final_rescan, watch_saves

    emitted: list[tuple[Ev, dict]] = []
    ctx = SimpleNamespace(emit=lambda ev, **f: emitted.append((ev, f)), cfg=SimpleNamespace(checkpoint=None),
                          layout=SimpleNamespace(ckpt_dir=tmp_path))
    state, watcher = AttemptState(1, 0.0), DirWatcher(str(tmp_path))
    state.observe_step(20, 0.5, "regex")
    watch_saves(ctx, watcher, state, 0.0)
    accelerate_dir(tmp_path, 2, "epoch_{}")
    watch_saves(ctx, watcher, state, 1.0)
    watch_saves(ctx, watcher, state, 2.0)
    final_rescan(ctx, watcher, state, 3.0)  # the child died before printing its line
    ends = [f for ev, f in emitted if ev is Ev.SAVE_END]
    assert [(f["step"], f["step_source"]) for f in ends] == [(20, "log")]
    assert "lower bound" in ends[0]["step_reason"] and "no step line" in ends[0]["step_reason"]
