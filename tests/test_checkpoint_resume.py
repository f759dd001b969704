"""Choosing the resume point: newest valid by the step in the name, ``last.ckpt`` only when it is
valid and newer, torn ones quarantined, in-flight and unverifiable ones never quarantined."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import ckpt_factory as cf
from supervisor.checkpoints.resume import choose_resume_point
from supervisor.checkpoints.scan import find_resume_point, list_candidates, scan
from supervisor.checkpoints.validate import CheckpointReport
from supervisor.states import Verdict

OLD = time.time() - 3600  # mtime far outside the quiet window


def report(name: str, verdict: Verdict, step: int | None, *, level: int = 3, is_last: bool = False,
           name_step: int | None = None, version: int = 0, link_outside: bool = False) -> CheckpointReport:
    return CheckpointReport(path=f"/ckpt/{name}", format="torch_zip", verdict=verdict, level=level,
                            reason=verdict.value, size=1, step=step, embedded_step=step,
                            name_step=name_step, is_last=is_last, version=version, link_outside=link_outside)


# ---------------------------------------------------------------------------- the pure rule


def test_newest_by_step_number_not_by_text() -> None:
    reports = [report("step=900.ckpt", Verdict.VALID, 900), report("step=10000.ckpt", Verdict.VALID, 10000),
               report("step=9500.ckpt", Verdict.VALID, 9500)]
    decision = choose_resume_point(reports)
    assert decision.path == "/ckpt/step=10000.ckpt" and decision.step == 10000
    assert [r.step for r in decision.candidates] == [10000, 9500, 900]


def test_corrupt_newest_is_skipped_and_quarantined_only_it() -> None:
    reports = [report("step=10000.ckpt", Verdict.CORRUPT, 10000), report("step=9500.ckpt", Verdict.VALID, 9500),
               report("step=11000.ckpt", Verdict.IN_PROGRESS, 11000),
               report("step=12000.pt", Verdict.UNVERIFIABLE, 12000, level=0)]
    decision = choose_resume_point(reports)
    assert decision.step == 9500
    assert [r.step for r in decision.to_quarantine] == [10000]
    assert "step=10000.ckpt" in decision.reason


def test_unverifiable_only_when_no_valid_is_as_new() -> None:
    newer_unverifiable = [report("step=2000.pt", Verdict.UNVERIFIABLE, 2000), report("step=1000.pt", Verdict.VALID, 1000)]
    assert choose_resume_point(newer_unverifiable).step == 2000
    tie = [report("a-step=2000.pt", Verdict.UNVERIFIABLE, 2000), report("b-step=2000.pt", Verdict.VALID, 2000)]
    assert choose_resume_point(tie).path == "/ckpt/b-step=2000.pt"
    older = [report("step=1000.pt", Verdict.UNVERIFIABLE, 1000), report("step=2000.pt", Verdict.VALID, 2000)]
    assert choose_resume_point(older).step == 2000


def test_last_only_when_valid_and_newer() -> None:
    steps = [report("step=900.ckpt", Verdict.VALID, 900, name_step=900)]
    newer_last = steps + [report("last.ckpt", Verdict.VALID, 950, is_last=True)]
    assert choose_resume_point(newer_last).path == "/ckpt/last.ckpt"
    same_step = steps + [report("last.ckpt", Verdict.VALID, 900, is_last=True)]
    assert choose_resume_point(same_step).path == "/ckpt/step=900.ckpt"  # immutable name preferred
    torn_last = steps + [report("last.ckpt", Verdict.CORRUPT, None, is_last=True)]
    decision = choose_resume_point(torn_last)
    assert decision.path == "/ckpt/step=900.ckpt" and [r.name for r in decision.to_quarantine] == ["last.ckpt"]


def test_stepless_last_alone_is_used_other_stepless_files_are_not() -> None:
    assert choose_resume_point([report("last.ckpt", Verdict.VALID, None, is_last=True)]).path == "/ckpt/last.ckpt"
    decision = choose_resume_point([report("model.pt", Verdict.VALID, None)])
    assert decision.path is None and "no step number" in decision.reason


def test_outside_symlink_is_never_chosen_or_quarantined() -> None:
    outside = report("last.ckpt", Verdict.UNVERIFIABLE, None, level=0, is_last=True, link_outside=True)
    decision = choose_resume_point([outside])
    assert decision.path is None and decision.to_quarantine == ()


def test_nothing_at_all() -> None:
    decision = choose_resume_point([])
    assert decision.path is None and decision.reason == "no checkpoints found"


# ---------------------------------------------------------------------------- real directories


@pytest.fixture()
def ckpt_dir(tmp_path: Path) -> Path:
    d = tmp_path / "checkpoints"
    d.mkdir()
    for step in (900, 10000, 9500):
        cf.save_zip(d / f"step={step}.ckpt", step)
    return d


def test_scan_orders_numerically_and_ignores_temp_files(ckpt_dir: Path) -> None:
    partial = ckpt_dir / ".step=20000.ckpt.tmp-123-abcd"
    partial.write_bytes(b"PK\x03\x04" + b"\0" * 100)
    (ckpt_dir / "hparams.yaml").write_text("lr: 1\n")
    reports = scan(ckpt_dir)
    assert [r.step for r in reports] == [10000, 9500, 900]
    result = find_resume_point(ckpt_dir)
    assert result.path == str(ckpt_dir / "step=10000.ckpt") and result.step == 10000


def test_torn_newest_falls_back_and_is_quarantined(ckpt_dir: Path) -> None:
    torn = ckpt_dir / "step=10000.ckpt"
    cf.truncate(torn, torn.stat().st_size // 2)
    cf.set_mtime(torn, OLD)
    result = find_resume_point(ckpt_dir, quarantine=True, quarantine_tag="4242")
    assert result.step == 9500
    assert not torn.exists() and (ckpt_dir / "CORRUPT_step=10000.ckpt.4242").exists()
    assert [q.ok for q in result.quarantined] == [True]
    event = result.event_fields()
    assert event["quarantined"] == [str(torn)] and event["path"] == str(ckpt_dir / "step=9500.ckpt")
    assert {c["verdict"] for c in event["candidates"]} == {"valid", "corrupt"}
    # the quarantined file is no longer a candidate on the next attempt
    assert [r.step for r in scan(ckpt_dir)] == [9500, 900]


def test_just_modified_torn_file_is_in_progress_not_quarantined(ckpt_dir: Path) -> None:
    torn = ckpt_dir / "step=10000.ckpt"
    cf.truncate(torn, 100)
    result = find_resume_point(ckpt_dir, quarantine=True, quarantine_tag="t", quiet_s=60)
    assert result.step == 9500 and result.quarantined == () and torn.exists()
    assert result.reports[0].verdict is Verdict.IN_PROGRESS


def test_deep_confirm_falls_back_past_a_hole(ckpt_dir: Path) -> None:
    newest = ckpt_dir / "step=10000.ckpt"
    offset, length = cf.tensor_payload_span(newest)
    cf.zero_range(newest, offset, min(length, 32))
    cf.set_mtime(newest, OLD)
    assert find_resume_point(ckpt_dir).step == 10000  # L1-L3 cannot see it
    result = find_resume_point(ckpt_dir, deep_confirm=True, quarantine=True, quarantine_tag="j1")
    assert result.step == 9500 and "CRC-confirmed" in result.reason
    assert result.deep_checked == (str(newest), str(ckpt_dir / "step=9500.ckpt"))
    assert [q.path for q in result.quarantined] == [str(newest)]


def test_last_ckpt_regular_file_newer_than_step_files(ckpt_dir: Path) -> None:
    cf.save_zip(ckpt_dir / "last.ckpt", 10500)
    assert find_resume_point(ckpt_dir).path == str(ckpt_dir / "last.ckpt")
    cf.save_zip(ckpt_dir / "last.ckpt", 10000)  # same step as the newest step file
    assert find_resume_point(ckpt_dir).path == str(ckpt_dir / "step=10000.ckpt")


def test_last_symlink_takes_its_targets_step(ckpt_dir: Path) -> None:
    os.symlink("step=9500.ckpt", ckpt_dir / "last.ckpt")
    reports = {r.name: r for r in scan(ckpt_dir)}
    assert reports["last.ckpt"].step == 9500 and reports["last.ckpt"].verdict is Verdict.VALID


def test_dangling_last_symlink_is_quarantined_as_a_link(ckpt_dir: Path) -> None:
    os.symlink("step=5.ckpt", ckpt_dir / "last.ckpt")  # target rotated away
    result = find_resume_point(ckpt_dir, quarantine=True, quarantine_tag="q")
    assert result.step == 10000
    moved = ckpt_dir / "CORRUPT_last.ckpt.q"
    assert moved.is_symlink() and os.readlink(moved) == "step=5.ckpt"
    assert (ckpt_dir / "CORRUPT_last.ckpt.q.json").exists()


def test_last_symlink_leaving_the_dir_is_reported_and_left_alone(ckpt_dir: Path, tmp_path: Path) -> None:
    elsewhere = cf.save_zip(tmp_path / "other-run-step=99999.ckpt", 99999)
    os.symlink(elsewhere, ckpt_dir / "last.ckpt")
    result = find_resume_point(ckpt_dir, quarantine=True, quarantine_tag="q")
    assert result.step == 10000 and result.quarantined == ()
    assert os.path.islink(ckpt_dir / "last.ckpt") and elsewhere.exists()
    last = next(r for r in result.reports if r.name == "last.ckpt")
    assert last.link_outside and "leaves the checkpoint dir" in last.reason


def test_nemo_unfinished_marker_means_in_progress(ckpt_dir: Path) -> None:
    newest = cf.save_zip(ckpt_dir / "step=20000.ckpt", 20000)
    (ckpt_dir / "step=20000-unfinished").write_text("")  # NeMo drops .ckpt before the suffix
    result = find_resume_point(ckpt_dir, quarantine=True, quarantine_tag="q")
    assert result.step == 10000 and newest.exists() and result.quarantined == ()


def test_mixed_formats_in_one_dir(tmp_path: Path) -> None:
    cf.make_hf_checkpoint(tmp_path, 100)
    cf.make_hf_checkpoint(tmp_path, 300)
    (tmp_path / "checkpoint-300" / "trainer_state.json").unlink()  # killed before the marker
    cf.set_mtime(tmp_path / "checkpoint-300", OLD)
    result = find_resume_point(tmp_path)
    assert result.step == 100 and [r.step for r in result.reports] == [300, 100]


def test_deepspeed_save_dir_candidates_are_tags(tmp_path: Path) -> None:
    cf.make_deepspeed_tag(tmp_path, 100)
    cf.make_deepspeed_tag(tmp_path, 200)
    (tmp_path / "global_step200" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    assert [os.path.basename(p) for p in list_candidates(tmp_path)] == ["global_step100", "global_step200"]
    assert find_resume_point(tmp_path).step == 100


def test_missing_and_empty_dirs(tmp_path: Path) -> None:
    missing = find_resume_point(tmp_path / "nope")
    assert missing.path is None and "does not exist" in missing.reason
    empty = find_resume_point(tmp_path)
    assert empty.path is None and empty.reason == "no checkpoints found"
