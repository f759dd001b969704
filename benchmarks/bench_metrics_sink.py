"""What the metrics writer (supervisor/addons/metrics/sink.py) costs the run loop (results: docs/benchmarks.md).

* accept(): the time the loop's thread spends handing one event over (no wait: a progress event);
* the wait at a resume point, the first one of a job whose event log already holds N earlier events
  (the writer folds that history first: the events the run loop read once at its start, handed to
  the sink by ``MetricsSink.seed``; the read itself is the loop's, not timed here), and a later one;
* the fold on the writer's thread for a run of many attempts and saves.

    python benchmarks/bench_metrics_sink.py            # N = 0, 10,000, 100,000
    python benchmarks/bench_metrics_sink.py --quick    # N = 0, 10,000
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from supervisor.config import MetricsConfig  # noqa: E402
from supervisor.events import Event, EventLog  # noqa: E402
from supervisor.addons.metrics.model import EventWindow, run_metrics  # noqa: E402
from supervisor.addons.metrics.sink import MetricsSink  # noqa: E402


def history(n: int) -> list[tuple[str, dict]]:
    """N events of a long run: progress every step of 10 attempts, a save every 50, a crash per attempt."""
    out: list[tuple[str, dict]] = [("run_start", {"name": "bench", "job_id": "1"})]
    per = max(n // 10, 1)
    for a in range(1, 11):
        out.append(("resume_point", {"attempt": a, "step": (a - 1) * per}))
        out.append(("attempt_start", {"attempt": a}))
        for i in range(per):
            step = (a - 1) * per + i
            out.append(("progress", {"attempt": a, "step": step, "rate": 2.0}))
            if i % 50 == 0:
                out.append(("save_end", {"attempt": a, "step": step, "ok": True, "duration": 1.0}))
        out.append(("attempt_end", {"attempt": a, "class": "native_crash", "last_step": a * per, "wall_lost": 3.0}))
    return out[: max(n, 1)]


def one(n: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        log = EventLog(run / "supervisor" / "events.jsonl")
        for name, fields in history(n):
            log.emit(name, **fields)
        earlier = list(log.read().events)  # the run loop's one read at its start (RunContext.begin)
        sink = MetricsSink(MetricsConfig(), run, "bench", "host")
        t = time.perf_counter()
        sink.seed(earlier)
        sink.accept(log.emit("resume_point", attempt=11, step=None))
        first_wait = time.perf_counter() - t
        per_accept = []
        for i in range(2000):
            ev = log.emit("progress", attempt=11, step=i, rate=2.0)
            t = time.perf_counter()
            sink.accept(ev)
            per_accept.append(time.perf_counter() - t)
        sink.flush(30)
        t = time.perf_counter()
        sink.accept(log.emit("resume_point", attempt=12, step=None))
        later_wait = time.perf_counter() - t
        log.close()
    per_accept.sort()
    return {"first_wait_ms": first_wait * 1e3, "later_wait_ms": later_wait * 1e3,
            "accept_median_us": per_accept[len(per_accept) // 2] * 1e6,
            "accept_p99_us": per_accept[int(len(per_accept) * 0.99)] * 1e6}


def fold_cost(attempts: int, saves_per_attempt: int) -> float:
    window = EventWindow()
    ts = 0.0
    window.add(Event("run_start", ts, {"name": "bench"}))
    for a in range(1, attempts + 1):
        window.add(Event("attempt_start", ts, {"attempt": a}))
        for s in range(saves_per_attempt):
            ts += 1
            window.add(Event("save_end", ts, {"attempt": a, "step": a * 1000 + s, "ok": True, "duration": 1.0}))
        window.add(Event("attempt_end", ts, {"attempt": a, "class": "preempted", "last_step": a * 1000 + 999}))
    t = time.perf_counter()
    run_metrics(window.events)
    return (time.perf_counter() - t) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(f"# {platform.node()} {platform.processor() or platform.machine()} python {platform.python_version()}"
          f" {time.strftime('%Y-%m-%d')}")
    for n in ([0, 10_000] if args.quick else [0, 10_000, 100_000]):
        r = one(n)
        print(f"history {n:>7} events: first resume-point wait {r['first_wait_ms']:.1f} ms, later "
              f"{r['later_wait_ms']:.1f} ms; accept() median {r['accept_median_us']:.1f} us, "
              f"p99 {r['accept_p99_us']:.1f} us")
    for attempts, saves in ((10, 100), (100, 100)):
        print(f"fold of {attempts} attempts x {saves} saves: {fold_cost(attempts, saves):.1f} ms")


if __name__ == "__main__":
    main()
