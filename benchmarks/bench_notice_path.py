"""Notice-to-decision time as the run ages (results: docs/benchmarks.md).

A real ``supervise run`` of a child that prints steps, started on a run directory whose event log
already holds N earlier ``progress`` and ``save_end`` events (a long run's history); SIGTERM goes to the
supervisor, and the time from its ``notice`` event to its ``arbitration`` event is read back from the
log. Before the in-memory save history, that path re-read and parsed the whole log. Beside it, the
time from ``run_start`` to the first ``attempt_start`` (the log is read once at run start; the
attempt start then reads the ledger and the saves from memory, ``RunContext.history``).

    python benchmarks/bench_notice_path.py            # N = 0, 10,000, 100,000; 3 rounds each
    python benchmarks/bench_notice_path.py --quick    # N = 0, 10,000; 1 round
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = "import time\nfor i in range(100000):\n    print(f'step {i}', flush=True)\n    time.sleep(0.05)\n"


def _prefill(events: Path, n: int) -> None:
    """N old events: mostly progress, one failed save in ten (a failed save is history the arbitration
    reads but that implies no checkpoint the resume audit would look for)."""
    t0 = time.time() - 86400.0
    with events.open("w") as f:
        for i in range(n):
            if i % 10 == 0:
                rec = {"ts": t0 + i, "event": "save_end", "v": 1, "attempt": 1, "ok": False, "duration": 3.0,
                       "path": f"/nonexistent/step-{i}.ckpt"}
            else:
                rec = {"ts": t0 + i, "event": "progress", "v": 1, "attempt": 1, "step": i, "rate": 2.0}
            f.write(json.dumps(rec) + "\n")
        # A long run's history was written long ago: flushed to disk, not dirty pages that the
        # supervisor's first fsync of the log (a durable event) would have to write out.
        f.flush()
        os.fsync(f.fileno())


def one(n: int, repo: Path) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        (run / "supervisor").mkdir(parents=True)
        _prefill(run / "supervisor" / "events.jsonl", n)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")])))  # and cwd=tmp: `-m` puts the cwd before PYTHONPATH
        env.pop("SLURM_JOB_ID", None)
        proc = subprocess.Popen([sys.executable, "-m", "supervisor", "run", "--run-dir", str(run), "--",
                                 sys.executable, "-c", CHILD], env=env, cwd=tmp,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        log = run / "supervisor" / "events.jsonl"
        deadline = time.time() + 300
        while time.time() < deadline:  # wait for the child's first progress in this run
            tail = log.read_text()[-200000:] if log.exists() else ""
            if '"attempt_start"' in tail and '"progress"' in tail.split('"attempt_start"', 1)[1]:
                break
            time.sleep(0.2)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=300)
        ts: dict[str, float] = {}
        for line in log.read_text().splitlines()[n:]:
            rec = json.loads(line)
            if rec.get("event") in ("notice", "arbitration", "run_start", "attempt_start") and rec["event"] not in ts:
                ts[rec["event"]] = rec["ts"]
        start = (ts["attempt_start"] - ts["run_start"]) * 1000.0 if "attempt_start" in ts else float("nan")
        if "arbitration" not in ts or "notice" not in ts:
            return float("nan"), start  # nan: the run did not reach a notice (a machine too loaded?)
        return (ts["arbitration"] - ts["notice"]) * 1000.0, start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repo", type=Path, default=REPO, help="the checkout to measure (default: this one)")
    ap.add_argument("--sizes", help="comma-separated event counts (default 0,10000,100000,300000)")
    ap.add_argument("--rounds", type=int)
    args = ap.parse_args()
    sizes = (0, 10_000) if args.quick else (0, 10_000, 100_000, 300_000)
    if args.sizes:
        sizes = tuple(int(x) for x in args.sizes.split(","))
    rounds = args.rounds or (1 if args.quick else 3)
    print(f"# {platform.node()} {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}, python {platform.python_version()}, "
          f"{args.repo}")
    print("| events before the notice | notice -> arbitration, ms (median of %d) | all rounds "
          "| run_start -> attempt_start, ms (median) |" % rounds)
    print("|---:|---:|---|---:|")
    for n in sizes:
        got = [one(n, args.repo) for _ in range(rounds)]
        times = sorted(g[0] for g in got)
        starts = sorted(g[1] for g in got)
        print(f"| {n:,} | {times[len(times) // 2]:.1f} | {', '.join(f'{t:.1f}' for t in times)} "
              f"| {starts[len(starts) // 2]:.0f} |")


if __name__ == "__main__":
    main()
