"""A chatty training's line rate, bare and under the supervisor (results: docs/benchmarks.md).

The child prints ``step N loss 0.5`` lines as fast as Python can (buffered ``sys.stdout.write``)
and times itself from its first line to its last flush; that time is the figure, so the
supervisor's start-up and shutdown are not counted. *Bare*: the child's stdout goes straight to
/dev/null (the fastest it can print: writes that cost nothing). *Supervised*: ``python -m
supervisor run -- <child>`` with the supervisor's own stdout to /dev/null; the child's output goes
through the supervisor's pipe, the console echo, the attempt log (a real file), the bounded tail
and the step analysis. *Bare | cat*: bare, but through a pipe into ``cat > /dev/null``: the cost of
any reader of the output (under ``srun``, slurmstepd reads the task's output the same way). Bare and supervised runs
alternate (pairs), and the medians are reported, with the CPU the supervisor spent (its start-up
included: CPU seconds of the supervised run beyond the child's print loop, less the same for the
bare run), a figure a busy machine disturbs less than the rates:

    python benchmarks/bench_output_rate.py                 # 2,000,000 lines, 3 pairs
    python benchmarks/bench_output_rate.py --lines 200000 --pairs 1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
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
t0, c0 = time.perf_counter(), time.process_time()
for i in range(1, n + 1):
    w(f"step {i} loss 0.5\n")
sys.stdout.flush()
elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
with open(out, "w") as fh:
    fh.write(f"{elapsed!r} {cpu!r}")
"""


def run_once(work: Path, lines: int, supervised: bool, tag: str, repo: Path = REPO,
             piped: bool = False, to_file: bool = False) -> tuple[float, float]:
    """The child's line rate, and the CPU seconds spent by everything but the child's print loop
    (the supervisor, and the start-up of both). ``piped``: bare, but into ``cat > /dev/null``
    through a pipe (what any reader of the output costs, slurmstepd's included). ``to_file``: the
    run's stdout is a real file instead of /dev/null (a batch job's output file)."""
    timing = work / f"time-{tag}"
    child = [sys.executable, "-c", CHILD, str(lines), str(timing)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))}
    argv = child
    if piped:
        argv = ["bash", "-c", 'exec "$@" | cat > /dev/null', "bash", *child]
    if supervised:
        argv = [sys.executable, "-m", "supervisor", "run", "--run-dir", str(work / f"run-{tag}"), "--", *child]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(work / f"out-{tag}" if to_file else os.devnull, "wb") as out:
        subprocess.run(argv, stdout=out, stderr=subprocess.DEVNULL, env=env, check=True, cwd=work)
    if to_file:
        (work / f"out-{tag}").unlink()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    elapsed, child_cpu = map(float, timing.read_text().split())
    others = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime) - child_cpu
    if supervised:
        log = work / f"run-{tag}" / "supervisor" / "attempt-1.log"
        with open(log, "rb") as fh:
            count = sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
        if count != lines:
            raise SystemExit(f"the attempt log holds {count} lines, not {lines}")
    return lines / elapsed, others


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=2_000_000)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="another checkout of slurm-supervisor (e.g. before a change): its supervised rate is "
                         "measured in the same rounds, so a busy machine affects both alike")
    args = ap.parse_args()
    bare: list[float] = []
    supervised: list[float] = []
    overhead: list[float] = []  # CPU seconds beyond the child's print loop, supervised minus bare
    baseline: list[float] = []
    piped: list[float] = []
    bare_file: list[float] = []  # stdout a real file: what `python train.py` in a batch script writes to
    sup_file: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-output-") as tmp:
        work = Path(tmp)
        for i in range(args.pairs):
            rate, bare_others = run_once(work, args.lines, False, f"bare-{i}")
            bare.append(rate)
            rate, sup_others = run_once(work, args.lines, True, f"sup-{i}")
            supervised.append(rate)
            overhead.append(sup_others - bare_others)
            piped.append(run_once(work, args.lines, False, f"piped-{i}", piped=True)[0])
            bare_file.append(run_once(work, args.lines, False, f"bare-file-{i}", to_file=True)[0])
            sup_file.append(run_once(work, args.lines, True, f"sup-file-{i}", to_file=True)[0])
            if args.baseline is not None:
                baseline.append(run_once(work, args.lines, True, f"base-{i}", args.baseline)[0])
    result = {
        "lines": args.lines, "pairs": args.pairs,
        "bare_lines_per_s": [round(r) for r in bare], "supervised_lines_per_s": [round(r) for r in supervised],
        "bare_median": round(statistics.median(bare)), "supervised_median": round(statistics.median(supervised)),
        "ratio": round(statistics.median(supervised) / statistics.median(bare), 3),
        "piped_lines_per_s": [round(r) for r in piped], "piped_median": round(statistics.median(piped)),
        "bare_file_lines_per_s": [round(r) for r in bare_file], "bare_file_median": round(statistics.median(bare_file)),
        "supervised_file_lines_per_s": [round(r) for r in sup_file],
        "supervised_file_median": round(statistics.median(sup_file)),
        "file_ratio": round(statistics.median(sup_file) / statistics.median(bare_file), 3),
        "supervisor_cpu_s": [round(o, 2) for o in overhead],
        "supervisor_cpu_us_per_line": round(statistics.median(overhead) / args.lines * 1e6, 3),
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    if baseline:
        result.update(baseline=str(args.baseline), baseline_lines_per_s=[round(r) for r in baseline],
                      baseline_median=round(statistics.median(baseline)),
                      baseline_ratio=round(statistics.median(baseline) / statistics.median(bare), 3))
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{args.lines:,} lines, {args.pairs} pairs ({result['machine']}, {result['date']})")
    print(f"bare:       median {result['bare_median']:>10,} lines/s  {result['bare_lines_per_s']}")
    print(f"supervised: median {result['supervised_median']:>10,} lines/s  {result['supervised_lines_per_s']}")
    print(f"bare | cat: median {result['piped_median']:>10,} lines/s  {result['piped_lines_per_s']}")
    print(f"supervised / bare: {result['ratio']:.1%}")
    print(f"bare > file:       median {result['bare_file_median']:>10,} lines/s  {result['bare_file_lines_per_s']}")
    print(f"supervised > file: median {result['supervised_file_median']:>10,} lines/s  "
          f"{result['supervised_file_lines_per_s']}")
    print(f"supervised > file / bare > file: {result['file_ratio']:.1%}")
    if baseline:
        print(f"baseline:   median {result['baseline_median']:>10,} lines/s  {result['baseline_lines_per_s']}  "
              f"({result['baseline_ratio']:.1%} of bare; {args.baseline})")
    print(f"supervisor CPU (start-up included): {result['supervisor_cpu_s']} s, "
          f"median {result['supervisor_cpu_us_per_line']} us per line")


if __name__ == "__main__":
    main()
