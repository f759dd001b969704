"""The directory commit protocol of ``supervisor.sharded`` without torch: real processes (forked
ranks meeting at a real ``multiprocessing.Barrier``), real files, the supervisor's own resume-point
scan and attempt-start cleanup. Each crash window of the publish is staged with the exact files a
crash there leaves (the kill -9 trials in tests/faults/test_sharded_kill.py land in them for real)."""

from __future__ import annotations

import json
import multiprocessing
import os
import queue
import time
from pathlib import Path
from typing import Any

import pytest

from supervisor import sharded

from supervisor.checkpoints import staging as cleanup
from supervisor.checkpoints import find_resume_point, validate_checkpoint
from supervisor.checkpoints.naming import parse_name
from supervisor.control import ControlServer, Kind, new_token
from supervisor.states import Verdict

CTX = multiprocessing.get_context("fork")


def write_shards(directory: Path, rank: int, step: int, size: int = 1000) -> None:
    """What a rank's writer does: its own files, named by rank, holding the step."""
    (directory / f"shard-{rank}.dat").write_bytes(bytes([step % 256]) * (size + rank))
    if rank == 0:
        (directory / "index.json").write_text(json.dumps({"step": step}))


def rank_main(rank: int, world: int, barrier: Any, final: str, step: int, env: dict[str, str],
              fail_rank: int | None, result: Any) -> None:
    os.environ.update(env)
    try:
        with sharded.saving_dir(step, final, rank=rank, world_size=world, barrier=barrier.wait) as staging:
            write_shards(staging, rank, step)
            if rank == fail_rank:
                raise RuntimeError("disk full")
        result.put((rank, "ok", str(staging)))
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        result.put((rank, f"{type(exc).__name__}: {exc}", ""))


def save_with_ranks(final: Path, step: int, world: int = 3, *, attempt: int = 1, fail_rank: int | None = None,
                    extra_env: dict[str, str] | None = None, timeout: float = 30.0) -> dict[int, tuple[str, str]]:
    """Run one save with ``world`` real processes; returns rank -> (status, staging path)."""
    barrier = CTX.Barrier(world, timeout=5 if fail_rank is not None else 30)
    result = CTX.Queue()
    env = {"SUPERVISOR_ATTEMPT": str(attempt), **(extra_env or {})}
    procs = [CTX.Process(target=rank_main, args=(r, world, barrier, str(final), step, env, fail_rank, result))
             for r in range(world)]
    for p in procs:
        p.start()
    outcome: dict[int, tuple[str, str]] = {}
    deadline = time.monotonic() + timeout
    while len(outcome) < world and time.monotonic() < deadline:
        try:
            rank, status, staging = result.get(timeout=0.5)
        except queue.Empty:
            continue
        outcome[rank] = (status, staging)
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.kill()
    return outcome


# ------------------------------------------------------------------------------ the happy path


def test_three_ranks_commit_one_directory_with_every_rank_s_files(tmp_path: Path) -> None:
    final = tmp_path / "ckpt" / "step-40"
    outcome = save_with_ranks(final, 40, world=3)
    assert [outcome[r][0] for r in range(3)] == ["ok", "ok", "ok"], outcome
    stagings = {outcome[r][1] for r in range(3)}
    assert len(stagings) == 1, f"the ranks did not agree on one staging dir: {stagings}"
    assert not Path(stagings.pop()).exists()  # renamed into place
    assert sorted(p.name for p in final.iterdir() if not p.name.startswith(".")) == [
        "index.json", "shard-0.dat", "shard-1.dat", "shard-2.dat"]
    marker = sharded.read_marker(final)
    assert marker is not None and marker["step"] == 40 and marker["world_size"] == 3 and marker["attempt"] == 1
    assert marker["files"]["shard-2.dat"] == {"size": 1002}
    check = sharded.verify_commit(final)
    assert check.committed and check.files == 4, check.reason
    report = validate_checkpoint(final)
    assert report.verdict is Verdict.VALID and report.step == 40, report.reason
    assert "committed by 3 rank(s)" in report.reason
    assert [p.name for p in final.parent.iterdir()] == ["step-40"]  # nothing left beside it


def test_a_fixed_name_is_replaced_whole_and_the_old_copy_removed(tmp_path: Path) -> None:
    last = tmp_path / "last"
    for step in (10, 20):
        outcome = save_with_ranks(last, step, world=2)
        assert all(s == "ok" for s, _ in outcome.values()), outcome
    assert sharded.read_marker(last)["step"] == 20
    assert (last / "shard-1.dat").read_bytes()[:1] == bytes([20])
    assert [p.name for p in tmp_path.iterdir()] == ["last"], "an aside or staging dir was left behind"
    result = find_resume_point(tmp_path)
    assert result.path == str(last) and result.step == 20, result.reason


def test_a_rank_that_fails_leaves_the_previous_checkpoint_and_no_candidate(tmp_path: Path) -> None:
    last = tmp_path / "last"
    save_with_ranks(last, 10, world=2)
    outcome = save_with_ranks(last, 20, world=2, fail_rank=1)
    assert "disk full" in outcome[1][0]
    assert outcome[0][0] != "ok", "rank 0 must not report success when rank 1 failed"
    assert sharded.read_marker(last)["step"] == 10  # untouched
    staging = [p for p in tmp_path.iterdir() if sharded.parse_staging_name(p.name)]
    assert len(staging) == 1 and not (staging[0] / sharded.MARKER).exists()
    result = find_resume_point(tmp_path, writers_alive=False)
    assert result.path == str(last) and result.step == 10
    assert all(Path(c["path"]).name == "last" for c in result.candidates), "a staging dir became a candidate"


def test_rank_zero_reports_the_save_once_and_only_after_every_rank_is_done(tmp_path: Path) -> None:
    """save_end must not go out before the slowest rank has finished writing."""
    server = ControlServer(new_token()).start()
    try:
        final = tmp_path / "step-7"
        env = {"SUPERVISOR_CONTROL": server.address, "SUPERVISOR_TOKEN": server.token,
               "SUPERVISOR_RUN_DIR": str(tmp_path)}
        slow = tmp_path / "slow-rank-done"

        def slow_rank_writer(rank: int, world: int, barrier: Any, result: Any) -> None:
            os.environ.update(env, SUPERVISOR_ATTEMPT="1", RANK=str(rank))
            with sharded.saving_dir(7, final, rank=rank, world_size=world, barrier=barrier.wait) as staging:
                write_shards(staging, rank, 7)
                if rank == 1:
                    time.sleep(1.0)
                    slow.write_text("done")
            result.put(rank)

        barrier, result = CTX.Barrier(2, timeout=30), CTX.Queue()
        procs = [CTX.Process(target=slow_rank_writer, args=(r, 2, barrier, result)) for r in range(2)]
        for p in procs:
            p.start()
        # Watch the channel while the ranks run: when save_end arrives, the slow rank must have
        # finished writing already (it wrote its file before reaching the barrier).
        messages: list[Any] = []
        slow_done_when_reported = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and slow_done_when_reported is None:
            for message in server.poll():
                messages.append(message)
                if message.kind is Kind.SAVE_END:
                    slow_done_when_reported = slow.exists()
            time.sleep(0.002)
        for p in procs:
            p.join(30)
        messages.extend(server.poll())
        assert slow_done_when_reported is True, "save_end went out before the slow rank finished"
        begins = [m for m in messages if m.kind is Kind.SAVE_BEGIN]
        ends = [m for m in messages if m.kind is Kind.SAVE_END]
        assert len(begins) == 1 and len(ends) == 1, [(m.kind, m.rank) for m in messages]
        assert begins[0].rank == 0 and ends[0].rank == 0
        assert ends[0].get("path") == str(final) and ends[0].get("ok") is True and ends[0].get("step") == 7
        assert ends[0].get("bytes") >= 2000 + 1  # the whole directory, every rank's files
    finally:
        server.close()


# ------------------------------------------------------------------------------ agreement on names


def test_the_derived_nonce_is_shared_and_changes_with_every_fact() -> None:
    env = {"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "2", "TORCHELASTIC_RUN_ID": "r", "TORCHELASTIC_RESTART_COUNT": "0"}
    base = sharded.derive_nonce("last", 100, 3, 1, "", env)
    assert base == sharded.derive_nonce("last", 100, 3, 1, "", dict(env)) and len(base) == 12
    variants = [sharded.derive_nonce("step-100", 100, 3, 1, "", env), sharded.derive_nonce("last", 101, 3, 1, "", env),
                sharded.derive_nonce("last", 100, 4, 1, "", env), sharded.derive_nonce("last", 100, 3, 2, "", env),
                sharded.derive_nonce("last", 100, 3, 1, "x", env),
                sharded.derive_nonce("last", 100, 3, 1, "", {**env, "SLURM_RESTART_COUNT": "3"})]
    assert len({base, *variants}) == 7


def test_a_broadcast_gives_every_rank_rank_zero_s_attempt_and_token() -> None:
    """With one supervisor per node, ranks may see different SUPERVISOR_ATTEMPT values: the
    broadcast (the framework's collective in the integrations) makes rank 0's win."""
    sent: list[str] = []

    def rank0_broadcast(value: str) -> str:
        sent.append(value)
        return value

    name0 = sharded.agree_staging("bcast-a", 5, rank=0, broadcast=rank0_broadcast, environ={"SUPERVISOR_ATTEMPT": "4"})
    name1 = sharded.agree_staging("bcast-a", 5, rank=1, broadcast=lambda _v: sent[0],
                                  environ={"SUPERVISOR_ATTEMPT": "9"})
    assert name0 == name1 and name0.attempt == 4
    with pytest.raises(sharded.CommitError):
        sharded.agree_staging("bcast-b", 5, rank=1, broadcast=lambda _v: "garbage")


@pytest.mark.parametrize("name, ours", [
    ("step-100.tmp-3-0123456789ab", True), ("last.ckpt.tmp-12-abcdefabcdef", True),
    (".step=9.ckpt.tmp-4242-0a1b2c3d", False),  # the single-file atomic writer's temp file
    ("step-100.tmp-3-0123456789", False), ("step-100.tmp-x-0123456789ab", False),
    (".hidden.tmp-3-0123456789ab", False), ("step-100.tmp", False), ("step-100", False),
])
def test_only_our_staging_names_are_recognised(name: str, ours: bool) -> None:
    assert (sharded.parse_staging_name(name) is not None) is ours


def test_an_aside_copy_is_a_resume_candidate_that_ranks_below_its_original() -> None:
    aside, original = parse_name("last.old-0123456789ab"), parse_name("last")
    assert aside.is_last and aside.version < original.version
    assert parse_name("step-100.old-0123456789ab").step == 100


# ------------------------------------------------------------------------------ the marker check


def committed_dir(tmp_path: Path, name: str = "step-5", step: int = 5, *, checksums: bool = False) -> Path:
    final = tmp_path / name
    with sharded.saving_dir(step, final, rank=0, world_size=1, barrier=None, checksums=checksums,
                            report=False) as staging:
        write_shards(staging, 0, step)
        (staging / "sub").mkdir()
        (staging / "sub" / "opt.dat").write_bytes(b"o" * 500)
    return final


@pytest.mark.parametrize("damage, expected", [
    ("truncate", "has 999 bytes, the commit recorded 1,000"),
    ("remove", "named in .supervisor-commit.json but missing"),
    ("extra", "not in .supervisor-commit.json: written after the commit"),
    ("nested_truncate", "sub/opt.dat has 1 bytes"),
    ("torn_marker", "is not JSON"),
])
def test_a_directory_that_does_not_match_its_commit_is_corrupt_and_quarantined(
        tmp_path: Path, damage: str, expected: str) -> None:
    older = committed_dir(tmp_path, "step-4", 4)
    final = committed_dir(tmp_path, "step-5", 5)
    shard = final / "shard-0.dat"
    if damage == "truncate":
        os.truncate(shard, 999)
    elif damage == "remove":
        shard.unlink()
    elif damage == "extra":
        (final / "shard-1.dat").write_bytes(b"x" * 10)
    elif damage == "nested_truncate":
        os.truncate(final / "sub" / "opt.dat", 1)
    else:
        marker = final / sharded.MARKER
        os.truncate(marker, marker.stat().st_size // 2)
    report = validate_checkpoint(final)
    assert report.verdict is Verdict.CORRUPT and expected in report.reason, report.reason
    result = find_resume_point(tmp_path, quarantine=True, quarantine_tag="t", writers_alive=False)
    assert result.path == str(older) and result.step == 4
    assert [Path(q.path).name for q in result.quarantined] == ["step-5"]
    assert (tmp_path / "CORRUPT_step-5.t").is_dir()  # renamed, never deleted


def test_deep_verification_compares_the_recorded_crc32(tmp_path: Path) -> None:
    final = committed_dir(tmp_path, checksums=True)
    assert validate_checkpoint(final, deep=True).verdict is Verdict.VALID
    data = bytearray((final / "shard-0.dat").read_bytes())
    data[500] ^= 0xFF  # a bit flip: same size, same name
    (final / "shard-0.dat").write_bytes(bytes(data))
    os.utime(final / "shard-0.dat", (time.time() - 3600,) * 2)  # as old as the rest
    assert validate_checkpoint(final).verdict is Verdict.VALID  # sizes alone cannot see it
    report = validate_checkpoint(final, deep=True)
    assert report.verdict is Verdict.CORRUPT and "CRC32" in report.reason and report.level == 4, report.reason


def test_a_file_rewritten_after_the_commit_is_not_trusted(tmp_path: Path) -> None:
    final = committed_dir(tmp_path)
    later = time.time() + 3600
    os.utime(final / "shard-0.dat", (later, later))
    report = validate_checkpoint(final)
    assert report.verdict is Verdict.UNVERIFIABLE and "modified after the commit" in report.reason


def test_an_unknown_layout_is_valid_by_its_manifest_alone(tmp_path: Path) -> None:
    final = committed_dir(tmp_path)
    report = validate_checkpoint(final)
    assert report.verdict is Verdict.VALID and report.level == 2 and "no checkpoint format recognised" in report.reason


def test_a_staging_dir_is_never_written_through_a_symlink(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    monkeypatch.setenv("SUPERVISOR_ATTEMPT", "2")
    # A hostile or stale link at the exact staging name the next save will use.
    seq = sharded._SEQ.get("step-1", 0) + 1
    name = sharded.StagingName("step-1", 2, sharded.derive_nonce("step-1", 1, 2, seq, "fixed"))
    (ckpt / name.name).symlink_to(outside)
    with pytest.raises(sharded.CommitError, match="not a directory"), \
            sharded.saving_dir(1, ckpt / "step-1", rank=0, world_size=1, barrier=None, nonce="fixed", report=False) as d:
        (d / "x").write_text("never")
    assert list(outside.iterdir()) == []


# ------------------------------------------------------------------------------ crash windows


class Crash(BaseException):
    """A process death at an exact point of the real save code (what kill -9 does there)."""


def crash_save(ckpt: Path, name: str, step: int, point: str, *, attempt: int = 1) -> None:
    """Run the real save of ``ckpt/name`` and stop it dead at ``point``: ``body`` (while writing),
    ``before_aside`` (marker written, first rename not done), ``before_rename_in`` (old moved aside),
    ``before_discard`` (new in place, old aside still whole), ``in_discard`` (the old one's marker
    removed, not yet renamed away)."""
    real_rename, real_discard = os.rename, sharded.discard
    renames = {"before_aside": 1, "before_rename_in": 2, "in_discard": 3}
    seen = 0

    def rename(src: Any, dst: Any) -> None:
        nonlocal seen
        seen += 1
        if seen == renames.get(point):
            raise Crash(point)
        real_rename(src, dst)

    def discard(path: Any, **kw: Any) -> None:
        raise Crash(point)

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SUPERVISOR_ATTEMPT", str(attempt))
        if point in renames:
            mp.setattr(os, "rename", rename)
        if point == "before_discard":
            mp.setattr(sharded, "discard", discard)
        with pytest.raises(Crash), sharded.saving_dir(step, ckpt / name, rank=0, world_size=1, barrier=None,
                                                      report=False) as staging:
            write_shards(staging, 0, step)
            if point == "body":
                raise Crash(point)
    assert sharded.discard is real_discard and os.rename is real_rename


@pytest.mark.parametrize("point, scan_wins, after_cleanup_wins", [
    ("body", 10, 10),              # no marker yet: the old one, and the staging dir goes
    ("before_aside", 10, 20),      # committed, not renamed: old for a scan, rolled forward at attempt start
    ("before_rename_in", 10, 20),  # old moved aside, new not in place: the aside copy, then rolled forward
    ("before_discard", 20, 20),    # new in place, old aside: the new one
    ("in_discard", 20, 20),        # new in place, the old one's marker gone: the new one
])
def test_each_crash_window_leaves_one_complete_checkpoint(tmp_path: Path, point: str, scan_wins: int,
                                                          after_cleanup_wins: int) -> None:
    ckpt = tmp_path / "ckpt"
    committed_dir(ckpt, "last", 10)
    crash_save(ckpt, "last", 20, point)
    scan = find_resume_point(ckpt, writers_alive=False)
    assert scan.step == scan_wins, scan.reason
    assert validate_checkpoint(scan.path).verdict is Verdict.VALID
    assert all(not sharded.parse_staging_name(Path(c["path"]).name) for c in scan.candidates)

    done = cleanup.remove_stale_staging(ckpt, time.time(), attempt=2)
    assert all(d.ok for d in done), done
    after = find_resume_point(ckpt, writers_alive=False)
    assert after.path == str(ckpt / "last") and after.step == after_cleanup_wins, after.reason
    assert sorted(p.name for p in ckpt.iterdir()) == ["last"]
    assert sharded.verify_commit(ckpt / "last").committed


def test_a_new_name_cut_short_before_its_rename_is_rolled_forward(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    committed_dir(ckpt, "step-10", 10)
    crash_save(ckpt, "step-20", 20, "before_aside")  # no old step-20: the first rename is the one into place
    assert find_resume_point(ckpt, writers_alive=False).step == 10
    assert [d.action for d in cleanup.remove_stale_staging(ckpt, time.time(), attempt=2)] == ["roll_forward"]
    assert find_resume_point(ckpt, writers_alive=False).step == 20


def test_cleanup_keeps_a_live_writer_s_staging_dir(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    committed_dir(ckpt, "last", 10)
    crash_save(ckpt, "last", 20, "body", attempt=3)
    staging = next(p for p in ckpt.iterdir() if sharded.parse_staging_name(p.name))
    steps = cleanup.stale_staging(ckpt, time.time(), attempt=3)  # this attempt's own, just written
    assert [(s.path.name, s.action) for s in steps] == [(staging.name, cleanup.StagingAction.KEEP)]
    assert cleanup.remove_stale_staging(ckpt, time.time(), attempt=3) == []
    assert staging.is_dir()
    # Unknown writer (no attempt to compare), idle long enough: abandoned.
    done = cleanup.remove_stale_staging(ckpt, time.time() + cleanup.STALE_STAGING_S + 1, attempt=None)
    assert [(Path(d.path).name, d.action, d.ok) for d in done] == [(staging.name, "remove_uncommitted", True)]


def test_cleanup_touches_nothing_but_our_own_directories_and_never_follows_links(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.bin").write_bytes(b"p" * 100)
    keep = {
        "step-3.tmp": "dir", "step-3.tmp-1-xyz": "dir", ".step=3.ckpt.tmp-77-0a1b2c3d": "file",
        "step-3.tmp-1-0123456789ab.json": "file", "user-notes.old-0123456789ab": "file",
    }
    for name, kind in keep.items():
        if kind == "dir":
            (ckpt / name).mkdir()
            (ckpt / name / "f").write_text("x")
        else:
            (ckpt / name).write_text("x")
    (ckpt / "last.tmp-1-0123456789ab").symlink_to(outside)  # a link with our staging name
    (ckpt / "last.old-0123456789ab").symlink_to(outside)  # and with our aside name
    later = time.time() + 10 * cleanup.STALE_STAGING_S
    assert cleanup.remove_stale_staging(ckpt, later, attempt=99) == []
    assert sorted(p.name for p in ckpt.iterdir()) == sorted([*keep, "last.tmp-1-0123456789ab", "last.old-0123456789ab"])
    assert (outside / "precious.bin").read_bytes() == b"p" * 100


def test_a_committed_staging_dir_older_than_the_final_one_is_removed_not_rolled_forward(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    crash_save(ckpt, "last", 10, "before_aside")
    committed_dir(ckpt, "last", 20)
    done = cleanup.remove_stale_staging(ckpt, time.time(), attempt=2)
    assert [d.action for d in done] == ["remove_superseded"]
    assert sharded.read_marker(ckpt / "last")["step"] == 20


def test_discard_never_leaves_half_a_checkpoint_that_looks_whole(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    old = committed_dir(ckpt, "step-1", 1)
    committed_dir(ckpt, "step-2", 2)
    sharded.discard(old)
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-2"]


def test_an_earlier_attempt_s_commit_never_replaces_a_later_attempt_s_checkpoint(tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Attempt 1 committed step 30 but died before its rename; attempt 2 resumed from step 20 (no
    cleanup ran) and saved step 25. The step-30 commit belongs to an abandoned history: removed."""
    ckpt = tmp_path / "ckpt"
    crash_save(ckpt, "last", 30, "before_aside", attempt=1)
    monkeypatch.setenv("SUPERVISOR_ATTEMPT", "2")
    committed_dir(ckpt, "last", 25)
    done = cleanup.remove_stale_staging(ckpt, time.time(), attempt=3)
    assert [d.action for d in done] == ["remove_superseded"]
    assert sharded.read_marker(ckpt / "last")["step"] == 25
