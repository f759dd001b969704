"""A new checkpoint format needs its module and one ``register`` call, nothing else.

tests/toy_format.py defines a made-up single-file format (``TOYF`` header, step, length, payload,
CRC32) and registers it. Through the supervisor's own entry points, unchanged, it is then detected,
validated, its step read, a torn one quarantined and the resume point chosen, and the save watch
waits for a cut-short one. Unregistered, the same files are not checkpoints at all: the registration
is the whole switch (docs/extending/checkpoint-format.md).
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.checkpoints import find_resume_point, list_candidates, validate_checkpoint
from supervisor.checkpoints import formats as F
from supervisor.checkpoints.watch import DirWatcher, written_to_the_end
from supervisor.states import Verdict
from tests import toy_format as toy

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def toy_registered() -> Iterator[None]:
    toy.install()
    try:
        yield
    finally:
        toy.uninstall()


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_builtin_detection_precedence_is_the_documented_one() -> None:
    assert F.names() == ("safetensors", "torch_zip", "torch_legacy", "pickle",
                         "dcp", "lightning_deepspeed", "hf_trainer", "deepspeed", "directory")


def test_a_format_goes_where_it_asks_in_the_precedence_and_only_once(toy_registered: None) -> None:
    with pytest.raises(F.RegistryError):
        F.register(toy.FORMAT)  # twice: refused, the first stays
    F.unregister(toy.NAME)
    with pytest.raises(F.RegistryError):
        F.register(toy.FORMAT, before="no_such_format")
    F.register(toy.FORMAT, before="torch_zip")
    assert F.names()[:3] == ("safetensors", "toy", "torch_zip")


def test_a_registered_format_is_detected_validated_and_its_step_read(tmp_path: Path, toy_registered: None) -> None:
    whole = _write(tmp_path / "step=100.toy", toy.encode(100, b"weights" * 100))
    alias = _write(tmp_path / "last.toy", toy.encode(150, b"weights" * 100))
    cut = _write(tmp_path / "step=200.toy", toy.encode(200, b"weights" * 100)[:-9])
    flipped = bytearray(toy.encode(300, b"weights" * 100))
    flipped[40] ^= 0xFF
    damaged = _write(tmp_path / "step=300.toy", bytes(flipped))

    assert F.sniff_file(whole) == "toy"
    report = validate_checkpoint(whole)
    assert (report.format, report.verdict, report.level, report.step) == ("toy", Verdict.VALID, 3, 100)
    assert report.embedded_step == 100
    named_by_content = validate_checkpoint(alias)  # no step in the name: the format's header says
    assert named_by_content.ok and named_by_content.step == 150
    assert named_by_content.step_source == "TOYF header"
    assert validate_checkpoint(cut).verdict is Verdict.CORRUPT
    bad_crc = validate_checkpoint(damaged)
    assert bad_crc.verdict is Verdict.CORRUPT and "CRC32" in bad_crc.reason


def test_a_registered_format_is_quarantined_and_chosen_as_resume_point(tmp_path: Path, toy_registered: None) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    _write(ckpt / "step=100.toy", toy.encode(100, b"a" * 64))
    _write(ckpt / "last.toy", toy.encode(150, b"b" * 64))
    _write(ckpt / "step=200.toy", toy.encode(200, b"c" * 64)[:-5])

    assert sorted(os.path.basename(p) for p in list_candidates(ckpt)) == ["last.toy", "step=100.toy", "step=200.toy"]
    result = find_resume_point(ckpt, quarantine=True, quarantine_tag="t1", writers_alive=False)

    assert result.path == str(ckpt / "last.toy") and result.step == 150, result.reason
    assert [(os.path.basename(q.path), q.ok, q.format) for q in result.quarantined] == [("step=200.toy", True, "toy")]
    dest = result.quarantined[0].dest
    assert not (ckpt / "step=200.toy").exists() and dest is not None  # renamed aside, never deleted
    assert os.path.basename(dest).startswith("CORRUPT_") and Path(dest).read_bytes()[:4] == toy.MAGIC
    assert (ckpt / "step=100.toy").exists() and (ckpt / "last.toy").exists()


def test_the_save_watch_waits_for_a_cut_short_file_of_a_registered_format(tmp_path: Path,
                                                                         toy_registered: None) -> None:
    data = toy.encode(7, b"x" * 1000)
    assert written_to_the_end(str(_write(tmp_path / "step=7.toy", data)))
    assert not written_to_the_end(str(_write(tmp_path / "step=8.toy", data[:500])))


def test_a_registered_directory_format_with_a_commit_marker(tmp_path: Path, toy_registered: None) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    committed = toy.write_dir(ckpt / "save-a", 10, shards=2)  # no step in the name: the marker says
    never_committed = toy.write_dir(ckpt / "save-b", 20, shards=2, commit=False)

    assert F.detect_dir(committed) == "toydir" and F.detect_dir(never_committed) == "toydir"
    report = validate_checkpoint(committed)
    assert report.ok and report.step == 10 and report.step_source == "TOYDIR marker", report.reason
    (committed / "shard-1.toy").write_bytes(toy.encode(10, b"x" * 256)[:-3])
    torn_shard = validate_checkpoint(committed)
    assert torn_shard.verdict is Verdict.CORRUPT and "shard-1.toy" in torn_shard.reason
    (committed / "shard-1.toy").write_bytes(toy.encode(10, b"x" * 256))

    result = find_resume_point(ckpt, quarantine=True, quarantine_tag="t2", writers_alive=False)
    assert result.path == str(committed) and result.step == 10, result.reason
    assert [os.path.basename(q.path) for q in result.quarantined] == ["save-b"]
    assert not never_committed.exists() and (committed / "shard-0.toy").exists()


def test_the_save_watch_completes_a_directory_save_only_at_its_commit_marker(tmp_path: Path,
                                                                            toy_registered: None) -> None:
    watcher = DirWatcher(tmp_path)
    watcher.poll(0.0)
    done = toy.write_dir(tmp_path / "step-10", 10, shards=2, commit=False)
    toy.write_dir(tmp_path / "step-20", 20, shards=2, commit=False)
    first = watcher.poll(1.0)
    assert first.in_flight
    (done / toy.COMMIT).write_text("step 10\nshard-0.toy\nshard-1.toy\n")
    second = watcher.poll(2.0)  # step-20 stopped changing without its marker: torn, not a save
    third = watcher.poll(3.0)  # step-10 stopped changing with it: a save
    completed = [c.path for a in (first, second, third) for c in a.completed]
    assert completed == [str(done)] and not third.in_flight


def test_unregistered_the_same_files_are_not_checkpoints(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    path = _write(ckpt / "step=100.toy", toy.encode(100, b"a" * 64))
    assert "toy" not in F.names()
    assert list_candidates(ckpt) == []
    assert F.sniff_file(path) != "toy"
    assert not validate_checkpoint(path).ok  # what nothing claims is never a resume point


def test_adding_the_format_touched_no_supervisor_file() -> None:
    # The toy module uses only the public registry and outcome types...
    tree = ast.parse((ROOT / "tests" / "toy_format.py").read_text())
    used = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert {m for m in used if m.startswith("supervisor")} == {"supervisor.checkpoints.formats",
                                                               "supervisor.checkpoints.outcome"}
    # ...and nothing in the supervisor knows of it: no list, no branch, no name to add.
    mentions = [str(p.relative_to(ROOT)) for p in (ROOT / "supervisor").rglob("*.py")
                if "TOYF" in p.read_text() or "toy_format" in p.read_text() or '".toy"' in p.read_text()]
    assert mentions == []
