"""The event log under a full disk, a deleted run directory and malformed records (issue #13
item 3). The full disk is real: a 64 KiB tmpfs (needs root, as CI has; skipped elsewhere)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import run_supervise

from supervisor.events import LOG_MODE, Ev, EventLog, read_events


@contextlib.contextmanager
def tiny_filesystem(where: Path, size: str = "64k") -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs (a real full disk); CI runs as root")
    where.mkdir(parents=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                         capture_output=True, text=True, check=False)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(path: Path) -> None:
    """Take every byte left on the filesystem of ``path``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for size in (4096, 256, 16, 1):
            while True:
                try:
                    if os.write(fd, b"x" * size) < size:
                        break
                except OSError:
                    break
    finally:
        os.close(fd)


def markers(path: Path) -> list[str]:
    return [e.get("marker") for e in read_events(path).events if e.get("marker") is not None]


def test_a_full_disk_delays_events_and_loses_none_and_records_the_gap(tmp_path: Path) -> None:
    with tiny_filesystem(tmp_path / "fs") as fs:
        log_path = fs / "supervisor" / "events.jsonl"
        err = io.StringIO()
        log = EventLog(log_path, stderr=err)
        sent: list[str] = []

        def emit(event: Ev, n: int) -> None:
            marker = f"{event.value}-{n}"
            log.emit(event, attempt=1, step=n, marker=marker, path=f"ckpt/step={n}.ckpt", pad="p" * 150)
            sent.append(marker)

        emit(Ev.RUN_START, 0)
        fill(fs / "filler")
        n = 1
        while log.pending == 0 and n < 200:  # the log's last page had room for a few
            emit(Ev.SAVE_BEGIN if n % 2 else Ev.SAVE_END, n)
            n += 1
        waiting_at_full = log.pending
        for _ in range(5):  # the disk is full: these wait in memory
            emit(Ev.SAVE_BEGIN if n % 2 else Ev.SAVE_END, n)
            n += 1
        assert log.pending == waiting_at_full + 5
        assert log.read().events[-1].get("marker") == sent[-1]  # the loop still sees every event

        (fs / "filler").unlink()  # space returns
        emit(Ev.DECISION, n)
        log.close()
        read = read_events(log_path)

    assert waiting_at_full >= 1
    got = [e.get("marker") for e in read.events if e.get("marker")]
    assert got == sent  # every event, once, in order: none glued to a torn line, none lost
    assert read.bad_lines <= 1  # at most the torn remains of the short write, on a line of its own
    gaps = [e for e in read.events if e.event == "event_log_gap"]
    assert len(gaps) == 1 and gaps[0].get("lost") == 0 and gaps[0].get("delayed") == waiting_at_full + 5
    assert "No space left" in gaps[0].get("error") or "short write" in gaps[0].get("error")
    assert err.getvalue().count("cannot write the event log") == 1  # one warning, not one per event


def test_a_full_backlog_loses_the_oldest_progress_first_and_counts_it(tmp_path: Path) -> None:
    with tiny_filesystem(tmp_path / "fs") as fs:
        log_path = fs / "events.jsonl"
        log = EventLog(log_path, backlog=4, stderr=io.StringIO())
        fill(fs / "filler")
        pad = "p" * 4000  # bigger than what the last page can hold: nothing more lands
        log.emit(Ev.FAILURE, marker="failure", pad=pad)
        for i in range(6):
            log.emit(Ev.PROGRESS, marker=f"progress-{i}", pad=pad)
        assert log.pending == 4 and log.lost_total == 3
        (fs / "filler").unlink()
        log.emit(Ev.RUN_END, marker="run_end")
        log.close()
        read = read_events(log_path)
    got = [e.get("marker") for e in read.events if e.get("marker")]
    assert got == ["failure", "progress-3", "progress-4", "progress-5", "run_end"]  # durable kept, oldest progress went
    gap = next(e for e in read.events if e.event == "event_log_gap")
    assert gap.get("lost") == 3


def test_a_deleted_run_directory_never_raises_and_the_log_is_recreated(tmp_path: Path) -> None:
    run = tmp_path / "run"
    log_path = run / "supervisor" / "events.jsonl"
    err = io.StringIO()
    log = EventLog(log_path, stderr=err)
    log.emit(Ev.RUN_START, marker="before")
    shutil.rmtree(run)
    log.emit(Ev.ATTEMPT_END, attempt=1, marker="after")  # e.g. the child's segfault, decided anyway
    log.emit(Ev.RUN_END, marker="end")
    assert [e.get("marker") for e in log.read().events] == ["before", "after", "end"]
    log.close()
    assert markers(log_path) == ["before", "after", "end"]  # the history survived the deletion
    assert err.getvalue().count("vanished") == 1


def test_the_log_is_not_world_readable(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        EventLog(tmp_path / "events.jsonl").close()
    finally:
        os.umask(old)
    assert (tmp_path / "events.jsonl").stat().st_mode & 0o777 == LOG_MODE == 0o640


def test_an_unserializable_field_never_raises(tmp_path: Path) -> None:
    circular: dict = {}
    circular["self"] = circular
    log = EventLog(tmp_path / "events.jsonl")
    log.emit(Ev.WARNING, data=circular)
    log.close()
    assert read_events(tmp_path / "events.jsonl").events[0].event == "warning"


def test_a_torn_last_line_from_a_killed_supervisor_is_not_glued_to_the_next(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"ts":1,"event":"run_start","v":1}\n{"ts":2,"event":"attem')
    with EventLog(path) as log:
        log.emit(Ev.RUN_START, marker="next")
    read = read_events(path)
    assert [e.event for e in read.events] == ["run_start", "run_start"] and read.bad_lines == 1


BAD_RECORDS = [
    {"ts": 5, "event": "attempt_start", "v": 1, "attempt": "x"},
    {"ts": "now", "event": "run_start", "v": 1},
    {"ts": 5, "event": 7, "v": 1},
    {"ts": 5, "event": "attempt_end", "v": 1, "attempt": 1, "last_step": 10**400},
    {"ts": 5, "event": "attempt_end", "v": 1, "attempt": True},
    {"ts": 5, "event": "save_end", "v": 1, "attempt": 1, "ok": "yes"},
    {"ts": 5, "event": "run_end", "v": "one"},
    {"ts": float("nan"), "event": "run_end", "v": 1},
]


def test_records_with_wrong_field_types_are_skipped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    lines = [json.dumps({"ts": 1, "event": "run_start", "v": 1, "attempt": None})]
    lines += [json.dumps(r) for r in BAD_RECORDS]
    lines += ["not json", json.dumps({"ts": 2, "event": "attempt_start", "v": 1, "attempt": 1, "step": 0})]
    path.write_text("\n".join(lines) + "\n")
    read = read_events(path)
    assert [(e.event, e.get("attempt")) for e in read.events] == [("run_start", None), ("attempt_start", 1)]
    assert read.bad_lines == len(BAD_RECORDS) + 1 and read.bad_fields == len(BAD_RECORDS)


def test_a_malformed_record_does_not_stop_the_next_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    events = run_dir / "supervisor" / "events.jsonl"
    events.parent.mkdir(parents=True)
    events.write_text(json.dumps({"ts": 1.0, "event": "attempt_start", "v": 1, "attempt": "x"}) + "\n")
    res = run_supervise(["run", "--run-dir", str(run_dir), "--quiet", "--", sys.executable, "-c", "print('step 1')"])
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Traceback" not in res.stderr
    ends = [e for e in read_events(events).events if e.event == "run_end"]
    assert ends and ends[-1].get("outcome") == "complete"
