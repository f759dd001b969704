"""The ladder on single-file checkpoints written by real torch.save, intact and damaged the ways
runs damage them. Every truncation must be caught; only L4 sees a hole inside tensor data."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import ckpt_factory as cf
from supervisor.checkpoints import formats as F
from supervisor.checkpoints.validate import validate
from supervisor.checkpoints.trust import Trust
from supervisor.states import Verdict


@pytest.fixture(scope="module")
def originals(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("orig")
    return {
        "zip": cf.save_zip(d / "epoch=1-step=900.ckpt", 900, epoch=1),
        "legacy": cf.save_legacy(d / "step=900.pt", 900),
        "safetensors": cf.save_safetensors(d / "model.safetensors", cf.model_state(1), {"step": "900"}),
    }


@pytest.mark.parametrize("kind, fmt, step", [("zip", F.TORCH_ZIP, 900), ("legacy", F.TORCH_LEGACY, 900),
                                             ("safetensors", F.SAFETENSORS, 900)])
def test_good_files_are_valid_with_their_step(originals: dict[str, Path], kind: str, fmt: str, step: int) -> None:
    report = validate(originals[kind])
    assert report.verdict is Verdict.VALID, report.reason
    assert report.format == fmt and report.level == 3
    assert report.step == step and report.embedded_step == step


def test_deep_check_of_a_good_zip_reaches_l4(originals: dict[str, Path]) -> None:
    report = validate(originals["zip"], deep=True)
    assert report.verdict is Verdict.VALID and report.level == 4


@pytest.mark.parametrize("kind", ["zip", "legacy", "safetensors"])
def test_every_truncation_is_caught(originals: dict[str, Path], kind: str, tmp_path: Path) -> None:
    data = originals[kind].read_bytes()
    target = tmp_path / originals[kind].name
    missed = []
    # every cut in the last 200 bytes and the first 200, then every 7th byte in between
    cuts = sorted(set(range(0, min(200, len(data)))) | set(range(max(len(data) - 200, 0), len(data)))
                  | set(range(0, len(data), 7)))
    for cut in cuts:
        target.write_bytes(data[:cut])
        report = validate(target)
        if report.verdict is not Verdict.CORRUPT:
            missed.append((cut, report.verdict, report.reason))
    assert not missed, missed[:5]


def test_zero_filled_tail_is_corrupt(originals: dict[str, Path], tmp_path: Path) -> None:
    for length in (22, 98, 4096):
        target = tmp_path / f"tail{length}.ckpt"
        target.write_bytes(originals["zip"].read_bytes())
        cf.zero_tail(target, length)
        report = validate(target)
        assert report.verdict is Verdict.CORRUPT and report.level == 1, (length, report.reason)


def test_whole_file_zeroed_is_corrupt(originals: dict[str, Path], tmp_path: Path) -> None:
    target = tmp_path / "step=900.ckpt"
    target.write_bytes(bytes(originals["zip"].stat().st_size))
    report = validate(target)
    assert report.verdict is Verdict.CORRUPT and "zero-filled" in report.reason


def test_appended_garbage_is_corrupt(originals: dict[str, Path], tmp_path: Path) -> None:
    target = tmp_path / "step=900.ckpt"
    target.write_bytes(originals["zip"].read_bytes() + b"\x17" * 300)
    assert validate(target).verdict is Verdict.CORRUPT


def test_hole_in_tensor_payload_only_l4_sees(originals: dict[str, Path], tmp_path: Path) -> None:
    target = tmp_path / "epoch=1-step=900.ckpt"
    target.write_bytes(originals["zip"].read_bytes())
    offset, length = cf.tensor_payload_span(target, "data/0")
    cf.zero_range(target, offset, min(length, 64))
    assert validate(target).verdict is Verdict.VALID  # structure is intact: L1-L3 cannot know
    deep = validate(target, deep=True)
    assert deep.verdict is Verdict.CORRUPT and deep.level == 4 and "CRC32 mismatch" in deep.reason


def test_all_zero_crcs_are_unverifiable_never_corrupt(tmp_path: Path) -> None:
    path = cf.save_without_crc(tmp_path / "step=5.ckpt", 5)
    assert validate(path).verdict is Verdict.VALID
    deep = validate(path, deep=True)
    assert deep.verdict is Verdict.UNVERIFIABLE and deep.level == 4 and "CRC" in deep.reason


def test_empty_and_text_files_are_corrupt(tmp_path: Path) -> None:
    empty = tmp_path / "step=1.ckpt"
    empty.write_bytes(b"")
    text = tmp_path / "step=2.ckpt"
    text.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 123\n")
    html = tmp_path / "step=3.pt"
    html.write_text("<html><body>502 Bad Gateway</body></html>\n")
    assert validate(empty).verdict is Verdict.CORRUPT and validate(empty).format == F.EMPTY
    assert validate(text).verdict is Verdict.CORRUPT and "git-lfs" in validate(text).reason
    assert validate(html).verdict is Verdict.CORRUPT


def test_unknown_binary_is_unverifiable(tmp_path: Path) -> None:
    path = tmp_path / "step=4.pt"
    path.write_bytes(b"\x93NUMPY\x01\x00" + os.urandom(200))
    assert validate(path).verdict is Verdict.UNVERIFIABLE


def test_safetensors_zero_tail_passes_structure_but_truncated_header_fails(originals: dict[str, Path],
                                                                           tmp_path: Path) -> None:
    target = tmp_path / "model.safetensors"
    target.write_bytes(originals["safetensors"].read_bytes())
    cf.zero_tail(target, 16)  # no checksum in the format: data zeros are invisible
    assert validate(target).verdict is Verdict.VALID
    cf.zero_range(target, 0, 16)
    assert validate(target).verdict is Verdict.CORRUPT


def test_embedded_step_disagreeing_with_name_is_not_valid(tmp_path: Path) -> None:
    path = cf.save_zip(tmp_path / "step=900.ckpt", 500)
    report = validate(path)
    assert report.verdict is Verdict.UNVERIFIABLE and "500" in report.reason
    near = validate(cf.save_zip(tmp_path / "step=901.ckpt", 900))  # off by one: a loop's step+1
    assert near.verdict is Verdict.VALID and near.step == 901


def test_step_stored_as_tensor_is_read_without_unpickling(tmp_path: Path) -> None:
    import torch

    path = tmp_path / "model.pt"
    torch.save({"step": torch.tensor(1234), "model": cf.model_state()}, path)
    assert validate(path).embedded_step == 1234


def test_hostile_pickle_is_never_executed(tmp_path: Path) -> None:
    """The crafted files really do create the marker when torch.load unpickles them; validating
    them (library and CLI, shallow and deep) must not."""
    proof = tmp_path / "proof-it-works"
    bait = cf.save_hostile(tmp_path / "bait.pt", proof)
    subprocess.run([sys.executable, "-c", f"import torch; torch.load({str(bait)!r}, weights_only=False)"],
                   check=False, capture_output=True)
    assert proof.exists(), "the hostile pickle should create its marker when really loaded"

    marker = tmp_path / "must-not-exist"
    ckpt = tmp_path / "ckpts"
    ckpt.mkdir()
    zip_file = cf.save_hostile(ckpt / "step=5.ckpt", marker)
    legacy_file = cf.save_hostile(ckpt / "step=6.ckpt", marker, step=6, legacy=True)
    for path in (zip_file, legacy_file):
        for deep in (False, True):
            report = validate(path, deep=deep)
            # Never run, and never a resume point: a child loading it with weights_only=False would run it.
            assert report.verdict is Verdict.CORRUPT and "hostile pickle" in report.reason, report.reason
            assert report.trust is Trust.HOSTILE
            assert "os.system" in report.reason or "posix.system" in report.reason
    for args in (["verify", "--deep", str(zip_file), str(legacy_file)], ["resume-point", str(ckpt), "--deep"]):
        subprocess.run([*cf.SUPERVISE, *args], check=False, capture_output=True, timeout=60)
    assert not marker.exists()


def test_safetensors_written_by_the_library_and_read_back(tmp_path: Path) -> None:
    """The hand-written files match the real format, and library-written files validate."""
    st = pytest.importorskip("safetensors.torch")
    ours = cf.save_safetensors(tmp_path / "ours.safetensors", cf.model_state(3))
    assert set(st.load_file(str(ours))) == set(cf.model_state(3))
    theirs = tmp_path / "theirs.safetensors"
    st.save_file(cf.model_state(4), str(theirs), metadata={"step": "77"})
    report = validate(theirs)
    assert report.verdict is Verdict.VALID and report.embedded_step == 77
