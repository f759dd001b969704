"""A chatty training's line rate, bare and under the supervisor (results: docs/benchmarks.md).

The child prints ``step N loss 0.5`` lines as fast as Python can (buffered ``sys.stdout.write``)
and times itself from its first line to its last flush; that time is the figure, so the
supervisor's start-up and shutdown are not counted. *Bare*: the child's stdout goes straight to a
file (as in a Slurm job's ``-o`` file). *Supervised*: ``python -m supervisor run -- <child>`` with
the supervisor's own stdout to a file; the child's output goes through the supervisor's pipe, the
console echo, the attempt log, the bounded tail and the step analysis. Bare and supervised runs
alternate (pairs), and the medians are reported:

    python benchmarks/bench_output_rate.py                 # 2,000,000 lines, 3 pairs
    python benchmarks/bench_output_rate.py --lines 200000 --pairs 1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import sys, time
n, out = int(sys.argv[1]), sys.argv[2]
w = sys.stdout.write
t0 = time.perf_counter()
for i in range(1, n + 1):
    w(f"step {i} loss 0.5\n")
sys.stdout.flush()
elapsed = time.perf_counter() - t0
with open(out, "w") as fh:
    fh.write(repr(elapsed))
"""


def run_once(work: Path, lines: int, supervised: bool, tag: str) -> float:
    timing = work / f"time-{tag}"
    child = [sys.executable, "-c", CHILD, str(lines), str(timing)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = child
    if supervised:
        argv = [sys.executable, "-m", "supervisor", "run", "--run-dir", str(work / f"run-{tag}"), "--", *child]
    with open(work / f"stdout-{tag}", "wb") as out:
        subprocess.run(argv, stdout=out, stderr=subprocess.DEVNULL, env=env, check=True, cwd=work)
    elapsed = float(timing.read_text())
    if supervised:
        log = work / f"run-{tag}" / "supervisor" / "attempt-1.log"
        with open(log, "rb") as fh:
            count = sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
        if count != lines:
            raise SystemExit(f"the attempt log holds {count} lines, not {lines}")
    return lines / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=2_000_000)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args()
    bare: list[float] = []
    supervised: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-output-") as tmp:
        work = Path(tmp)
        for i in range(args.pairs):
            bare.append(run_once(work, args.lines, False, f"bare-{i}"))
            supervised.append(run_once(work, args.lines, True, f"sup-{i}"))
    result = {
        "lines": args.lines, "pairs": args.pairs,
        "bare_lines_per_s": [round(r) for r in bare], "supervised_lines_per_s": [round(r) for r in supervised],
        "bare_median": round(statistics.median(bare)), "supervised_median": round(statistics.median(supervised)),
        "ratio": round(statistics.median(supervised) / statistics.median(bare), 3),
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{args.lines:,} lines, {args.pairs} pairs ({result['machine']}, {result['date']})")
    print(f"bare:       median {result['bare_median']:>10,} lines/s  {result['bare_lines_per_s']}")
    print(f"supervised: median {result['supervised_median']:>10,} lines/s  {result['supervised_lines_per_s']}")
    print(f"supervised / bare: {result['ratio']:.1%}")


if __name__ == "__main__":
    main()
