"""An output burst never hides the newest lines (issue #12 item 2): a real child prints 60,000
``step N`` lines as fast as it can while a consumer reads the way the run loop does (at most 5,000
lines per 50 ms tick). The analysis must end on the last step; the log keeps every line."""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
from pathlib import Path

import pytest

from supervisor.child import Child, ChildSpec, LineQueue
from supervisor.progress import StepExtractor

LINES = 60_000
BURST = f"import sys\nw = sys.stdout.write\nfor i in range(1, {LINES + 1}):\n    w(f'step {{i}} loss 0.5\\n')\n"


def _spec(tmp_path: Path, code: str, **extra: object) -> ChildSpec:
    return ChildSpec(argv=[sys.executable, "-c", code], env=dict(os.environ), log_path=tmp_path / "attempt-1.log",
                     echo=False, **extra)  # type: ignore[arg-type]


def test_a_burst_of_step_lines_ends_on_the_last_step_even_with_a_small_queue(tmp_path: Path) -> None:
    """The same with room for 1,000 lines, so that the burst overflows the queue on any machine."""
    _burst_ends_on_the_last_step(tmp_path, line_queue_size=1000)


def test_a_burst_of_step_lines_ends_on_the_last_step_and_the_log_keeps_every_line(tmp_path: Path) -> None:
    _burst_ends_on_the_last_step(tmp_path)


def _burst_ends_on_the_last_step(tmp_path: Path, **spec: object) -> None:
    child = Child(_spec(tmp_path, BURST, **spec))
    extractor = StepExtractor()
    last_step = None
    child.start()
    try:
        while True:  # the loop's cadence: one drain of at most 5,000 lines per 50 ms tick
            exited = child.poll() is not None
            for _ts, _stream, line in child.lines.drain(5000):
                step = extractor.extract(line)
                if step is not None:
                    last_step = step
            if exited and child.lines.empty() and not any(t.is_alive() for t in child._readers):
                break
            time.sleep(0.05)
    finally:
        child.finish()
    log_lines = (tmp_path / "attempt-1.log").read_text().splitlines()

    assert last_step == LINES
    assert len(log_lines) == LINES and log_lines[-1] == f"step {LINES} loss 0.5"
    stats = child.line_stats
    assert stats.queued == LINES
    if spec:
        assert stats.dropped > 0  # the burst did overflow the queue: the oldest lines went


def test_the_queue_drops_the_oldest_and_counts_them() -> None:
    lines = LineQueue(3)
    evicted = [lines.put((float(i), "stdout", f"step {i}")) for i in range(1, 6)]

    assert evicted == [False, False, False, True, True]
    assert lines.dropped == 2 and lines.queued == 5
    assert [item[2] for item in lines.drain(10)] == ["step 3", "step 4", "step 5"]
    with pytest.raises(queue.Empty):
        lines.get_nowait()


def test_two_writers_and_a_reader_lose_nothing_but_what_is_counted() -> None:
    lines = LineQueue(100)
    seen: list[str] = []
    done = threading.Event()

    def write(name: str) -> None:
        for i in range(20_000):
            lines.put((0.0, name, f"{name} {i}"))

    def read() -> None:
        while not done.is_set() or not lines.empty():
            seen.extend(item[2] for item in lines.drain(50))

    reader = threading.Thread(target=read)
    writers = [threading.Thread(target=write, args=(name,)) for name in ("stdout", "stderr")]
    reader.start()
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    done.set()
    reader.join()

    assert len(seen) + lines.dropped == 40_000 == lines.queued
    assert "stdout 19999" in seen or "stderr 19999" in seen  # nothing came after the last line put
    for name in ("stdout", "stderr"):  # each writer's lines arrive in order
        numbers = [int(text.split()[1]) for text in seen if text.startswith(name)]
        assert numbers == sorted(numbers)


def test_a_two_million_line_burst_under_supervise_run_is_logged_whole_in_order_and_ends_on_the_last_step(
        tmp_path: Path) -> None:
    """The chatty child at full speed through the whole path (pipe, echo, attempt log, tail, line
    queue, step analysis in the run loop): every line in the attempt log, in order, and the newest
    step the supervisor knows is the last one printed. Timing is the benchmark's business
    (benchmarks/bench_output_rate.py), not this test's."""
    import subprocess

    from helpers import events_named

    lines = 2_000_000
    code = (f"import sys\nw = sys.stdout.write\nfor i in range(1, {lines + 1}):\n    w(f'step {{i}} loss 0.5\\n')\n"
            "sys.stdout.flush()\n")
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[1]),
                                                                   os.environ.get("PYTHONPATH", "")) if p)}
    done = subprocess.run([sys.executable, "-m", "supervisor", "run", "--run-dir", str(run_dir), "--quiet", "--",
                           sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    logged = (run_dir / "supervisor" / "attempt-1.log").read_bytes()
    expected = b"".join(b"step %d loss 0.5\n" % i for i in range(1, lines + 1))
    if logged != expected:
        got = logged.split(b"\n")
        first_bad = next((i for i, (a, b) in enumerate(zip(got, expected.split(b"\n"))) if a != b), len(got))
        raise AssertionError(f"the attempt log differs from line {first_bad + 1}: {got[first_bad:first_bad + 2]}")
    assert events_named(run_dir, "attempt_end")[0]["last_step"] == lines


def test_of_a_burst_the_loop_observes_every_step_until_the_first_then_the_newest_step_and_counter() -> None:
    from supervisor.progress import StepMatch
    from supervisor.run.monitor import matches_worth_observing

    def match(line: str) -> StepMatch | None:  # "s N": a global step; "c N": a progress-only counter
        kind, _, n = line.partition(" ")
        return StepMatch(int(n), kind == "c", "test") if kind in ("s", "c") else None

    def seen(lines: list[str], every_match: bool) -> list[tuple[int, bool]]:
        return [(m.value, m.progress_only) for m in matches_worth_observing(lines, match,
                                                                            every_match=every_match)]

    burst = ["noise", "c 1", "s 7", "noise", "c 2", "s 8", "s 9", "c 3", "noise"]
    # until the first step is known and a progress line proven, every reading in order (the resume audit's first step)
    assert seen(burst, every_match=True) == [(1, True), (7, False), (2, True), (8, False), (9, False), (3, True)]
    assert seen(burst, every_match=False) == [(3, True), (9, False)]
    assert seen(["noise", "c 4", "noise", "c 5"], every_match=False) == [(5, True)]
    assert seen(["s 5", "s 6"], every_match=True) == [(5, False), (6, False)]
    assert seen([f"s {2 ** 60}", "noise"], every_match=False) == []  # out of range: not a step


def test_a_resumed_attempt_s_first_step_is_where_it_resumed_however_its_lines_fall_into_ticks() -> None:
    """A resume line of one kind, then progress lines of another, printed faster than the loop
    ticks: the first step the audit sees is the resume step, never a later step of the burst
    (a newest-first reading had made a resume at 20 look like a start at 25: exit 4)."""
    from supervisor.progress import StepConfirmer, StepExtractor
    from supervisor.run.monitor import matches_worth_observing

    extractor = StepExtractor()
    lines = ["resuming from iter 20", *(f"step {n}: loss 0.5" for n in range(21, 31))]
    for cut in range(1, len(lines)):  # every way of splitting the output into two ticks
        confirm, counted = StepConfirmer(), []
        for tick in (lines[:cut], lines[cut:]):
            for m in matches_worth_observing(tick, extractor.match, every_match=not counted):
                if not m.progress_only:
                    counted.extend(confirm.feed(m.shape, m.value))
        assert counted and counted[0] in (20, 21), (cut, counted)


def _reference_lines(stream: bytes, limit: int) -> tuple[list[str], int]:
    """What the analysis must get from ``stream``: lines ended by \\n or \\r, empty ones skipped,
    each cut to ``limit`` bytes (and counted), decoded with replacement."""
    pieces = stream.replace(b"\r", b"\n").split(b"\n")
    kept = [p for p in pieces if p]
    cut = sum(1 for p in kept if len(p) > limit)
    return [p[:limit].decode("utf-8", errors="replace") for p in kept], cut


def test_the_bulk_splitter_gives_the_lines_of_the_line_by_line_reading_whatever_the_reads() -> None:
    """Any split of the output into reads (a line cut across reads, \\r\\n across reads, lines over
    the limit spanning several reads, multi-byte characters) yields the same analysed lines, in
    order, and the same count of cut lines."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    limit = 256
    atoms = st.sampled_from([b"step 7", b"\n", b"\r", b"\r\n", b"x" * 200, "é".encode(), b"loss 0.5 ", b""])

    @settings(max_examples=60, deadline=None)
    @given(st.lists(atoms, max_size=40), st.lists(st.integers(1, 700), min_size=1, max_size=20))
    def check(parts: list[bytes], sizes: list[int]) -> None:
        stream = b"".join(parts)
        child = Child(ChildSpec(argv=["true"], env={}, log_path=Path(os.devnull), echo=False,
                                max_line_bytes=limit, line_queue_size=100_000))
        reads = []
        at, i = 0, 0
        while at < len(stream):
            reads.append(stream[at:at + sizes[i % len(sizes)]])
            at += sizes[i % len(sizes)]
            i += 1

        class Reads:  # a stream whose reads return exactly these chunks
            def __init__(self) -> None:
                self.r, w = os.pipe()
                self.w = w

            def fileno(self) -> int:
                return self.r

            def close(self) -> None:
                os.close(self.r)

        src = Reads()
        original_read = os.read
        queue_of_reads = list(reads)

        def read(fd: int, n: int) -> bytes:
            if fd != src.r:
                return original_read(fd, n)
            return queue_of_reads.pop(0) if queue_of_reads else b""

        os.read = read  # type: ignore[assignment]
        try:
            child._pump(src, "stdout", 1)  # type: ignore[arg-type]
        finally:
            os.read = original_read  # type: ignore[assignment]
            os.close(src.w)
        got = [item[2] for item in child.lines.drain(1_000_000)]
        expected, cut = _reference_lines(stream, limit)
        assert got == expected
        assert child.line_stats.cut == cut

    check()


HANG_AFTER_A_BURST = """
import json, sys, time
from pathlib import Path
from supervisor import client

if client.attempt() != 1:
    sys.exit(0)  # the restart after the stall ends the run
client.heartbeat(1)  # the first step, from the client: it proves no output line
events = Path(sys.argv[1]) / "supervisor" / "events.jsonl"
deadline = time.monotonic() + 60
def progress_seen():
    return any(json.loads(line).get("event") == "progress" for line in events.read_text().splitlines() if line)
while time.monotonic() < deadline and not progress_seen():
    time.sleep(0.05)  # the supervisor has taken step 1 from the client before any line is printed
# One write: the whole burst lands in one tick of the run loop, then the training hangs.
sys.stdout.write("".join(f"step {i} loss 0.5\\n" for i in range(1, 16)) + "hanging at step 15\\n")
sys.stdout.flush()
time.sleep(3600)
"""


def test_a_burst_printed_after_the_client_s_first_step_moves_the_step_before_a_hang(tmp_path: Path) -> None:
    """The client reports step 1, then the training prints steps 1-15 in one write and hangs. The
    stall must say step 15: every line of that tick is read, so the step lines prove themselves
    (read newest first, only "hanging at step 15" was seen, an unproven line, and the stall said
    step 1; on a loaded machine the example training's stall test saw exactly that)."""
    from helpers import events_named, run_supervise

    run_dir = tmp_path / "run"
    script = tmp_path / "hang_after_a_burst.py"
    script.write_text(HANG_AFTER_A_BURST)
    res = run_supervise(["run", "--run-dir", str(run_dir), "--stall-timeout", "3",
                         "--set", "policy.hang.backoff=0.1", "--", sys.executable, str(script), str(run_dir)])
    assert res.returncode == 0, res.stderr[-3000:]
    stall = events_named(run_dir, "stall")
    assert stall and stall[0]["last_step"] == 15, (stall, res.stderr[-2000:])
