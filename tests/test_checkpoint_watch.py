"""Zero-code save detection from the checkpoint directory alone, with real file writes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import ckpt_factory as cf
from supervisor.checkpoints.watch import DirWatcher


def test_atomic_save_seen_from_temp_to_rename(tmp_path: Path) -> None:
    cf.save_zip(tmp_path / "step=100.ckpt", 100)
    watcher = DirWatcher(tmp_path)
    assert not watcher.poll(1000.0).in_flight  # existing checkpoints are the baseline, not saves
    temp = tmp_path / ".step=200.ckpt.tmp-99-abcd"
    temp.write_bytes(b"x" * 5000)
    activity = watcher.poll(1001.0)
    assert activity.in_flight and activity.path == str(tmp_path / "step=200.ckpt")
    assert activity.bytes == 5000 and activity.since == 1001.0
    with open(temp, "ab") as handle:
        handle.write(b"y" * 5000)
    assert watcher.poll(1002.0).bytes == 10000
    os.replace(temp, tmp_path / "step=200.ckpt")
    done = watcher.poll(1003.5)
    assert not done.in_flight
    (save,) = done.completed
    assert save.path == str(tmp_path / "step=200.ckpt") and save.bytes == 10000
    assert save.first_seen == 1001.0 and save.done_at == 1003.5 and save.duration == 2.5
    assert watcher.poll(1004.0).completed == ()  # reported once


def test_in_place_write_is_in_flight_until_it_stops_changing(tmp_path: Path) -> None:
    watcher = DirWatcher(tmp_path)
    watcher.poll(0.0)
    target = tmp_path / "epoch=0-step=50.ckpt"
    with open(target, "wb") as handle:
        handle.write(b"a" * 100)
        handle.flush()
        assert watcher.poll(1.0).in_flight
        handle.write(b"b" * 100)
        handle.flush()
        assert watcher.poll(2.0).in_flight
    activity = watcher.poll(3.0)
    assert not activity.in_flight and [c.bytes for c in activity.completed] == [200]


def test_temp_removed_without_rename_is_an_aborted_save(tmp_path: Path) -> None:
    watcher = DirWatcher(tmp_path)
    watcher.poll(0.0)
    temp = tmp_path / ".last.ckpt.tmp-1-ff"
    temp.write_bytes(b"z" * 10)
    assert watcher.poll(1.0).in_flight
    temp.unlink()
    activity = watcher.poll(2.0)
    assert not activity.in_flight and activity.completed == ()


def test_dcp_dir_save_completes_when_metadata_is_renamed_in(tmp_path: Path) -> None:
    watcher = DirWatcher(tmp_path)
    watcher.poll(0.0)
    ckpt = cf.save_dcp(tmp_path / "step-40", 40)
    os.rename(ckpt / ".metadata", ckpt / ".metadata.tmp")
    assert watcher.poll(1.0).in_flight
    os.rename(ckpt / ".metadata.tmp", ckpt / ".metadata")
    activity = watcher.poll(2.0)
    assert not activity.in_flight and [c.path for c in activity.completed] == [str(ckpt)]


def test_an_in_place_torch_save_that_pauses_is_still_in_flight_until_its_trailer_lands(tmp_path: Path) -> None:
    # Measured in CI under load: a writer descheduled for longer than one poll left last.ckpt
    # unchanged but cut short; the watch called the save complete, the supervisor ended the child
    # on it, and the file was torn. A torch zip is complete only once its trailer is written.
    whole = cf.save_zip(tmp_path / "source.pt", 20).read_bytes()
    (tmp_path / "source.pt").unlink()
    watcher = DirWatcher(tmp_path)
    watcher.poll(0.0)
    target = tmp_path / "last.ckpt"
    with open(target, "wb") as handle:
        handle.write(whole[: len(whole) // 2])
        handle.flush()
        assert watcher.poll(1.0).in_flight
        paused = watcher.poll(2.0)  # unchanged over a whole poll, half written
        assert paused.in_flight and paused.completed == ()
        handle.write(whole[len(whole) // 2:])
        handle.flush()
        assert watcher.poll(3.0).in_flight
    done = watcher.poll(4.0)
    assert not done.in_flight and [c.bytes for c in done.completed] == [len(whole)]


def test_an_in_place_write_left_cut_short_is_torn_not_in_flight_forever(tmp_path: Path) -> None:
    from supervisor.checkpoints.watch import INCOMPLETE_GIVE_UP_S

    whole = cf.save_zip(tmp_path / "source.pt", 20).read_bytes()
    (tmp_path / "source.pt").unlink()
    watcher = DirWatcher(tmp_path)
    watcher.poll(0.0)
    (tmp_path / "last.ckpt").write_bytes(whole[:1000])  # its writer was killed here
    assert watcher.poll(1.0).in_flight
    assert watcher.poll(2.0).in_flight
    given_up = watcher.poll(2.0 + INCOMPLETE_GIVE_UP_S)
    assert not given_up.in_flight and given_up.completed == ()  # never reported as a save


def test_inotify_wakes_the_poll_when_a_save_begins_in_the_dir_or_a_new_step_dir(tmp_path):
    from supervisor.checkpoints.watch import DirEvents

    events = DirEvents(tmp_path)
    if not events.available:
        pytest.skip("no inotify here: the clock-driven poll is all there is")
    try:
        assert events.changed() is False
        with open(tmp_path / "step=20.ckpt", "wb") as fh:
            fh.write(b"x")
        assert events.changed() is True
        assert events.changed() is False  # drained
        (tmp_path / "step-30").mkdir()
        assert events.changed() is True
        (tmp_path / "step-30" / "__0_0.distcp").write_bytes(b"y")  # inside a directory born after the start
        assert events.changed() is True
    finally:
        events.close()
    assert events.changed() is False


def test_more_numbered_dirs_than_it_walks_are_not_taken_for_saves_again_and_again(tmp_path: Path) -> None:
    """torchtune keeps every out/epoch_<e>/: past the TRACKED_DIRS newest, an old directory the poll
    did not walk used to drop out of the snapshot, come back as new at the next poll and be reported
    as a save of the step the training was at (epoch_0 "saved" at step 97, again and again)."""
    from supervisor.checkpoints.watch import TRACKED_DIRS

    def save_epoch(epoch: int) -> None:
        (tmp_path / f"epoch_{epoch}").mkdir()
        (tmp_path / f"epoch_{epoch}" / "model-00001-of-00001.bin").write_bytes(b"w" * (100 + epoch))

    watcher = DirWatcher(tmp_path)
    watcher.poll(0.0)
    completed: list[str] = []
    now = 0.0
    for epoch in range(TRACKED_DIRS + 4):
        save_epoch(epoch)
        for _ in range(4):  # several polls between two saves
            now += 1.0
            completed += [os.path.basename(c.path) for c in watcher.poll(now).completed]
    assert completed == [f"epoch_{e}" for e in range(TRACKED_DIRS + 4)]  # each save once, none again
    for _ in range(6):
        now += 1.0
        activity = watcher.poll(now)
        assert not activity.in_flight and activity.completed == ()
