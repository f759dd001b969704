"""Quarantine cost against the number of torn files in one checkpoint directory.

    PYTHONPATH=. python benchmarks/bench_quarantine.py [--counts 10000,100000] [--dir /scratch/bench]
        [--with-resume] [--per-file-baseline 2000]

For each count N: N torn checkpoints (``step=<i>.ckpt``, a zip header and nothing else) are
written (one is validated; the others' reports are copies of its report with their own path,
outside the timing), then renamed aside with their sidecars by
``quarantine_all`` (one directory listing for the batch): that is the figure, target <= 10 s for
100,000. With ``--with-resume``, also the whole attempt-start path, ``find_resume_point(quarantine=True)`` over a fresh
directory of N torn files (listing, validation, choice and quarantine), for reference.
``--per-file-baseline M`` also times M files through the one-at-a-time ``quarantine()`` call that
lists the directory for each file (what the run loop did before): quadratic.
Prints Markdown rows for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from supervisor.checkpoints.quarantine import SIDECARS_PER_BATCH, quarantine, quarantine_all
from supervisor.checkpoints.scan import find_resume_point
from supervisor.checkpoints.validate import validate

TORN = b"PK\x03\x04" + b"\x00" * 60  # a local header cut short: CORRUPT at L1


def make_torn(directory: Path, count: int) -> list[str]:
    directory.mkdir(parents=True)
    paths = []
    for i in range(count):
        path = directory / f"step={i}.ckpt"
        path.write_bytes(TORN)
        paths.append(str(path))
    return paths


def bench(root: Path, count: int, with_resume: bool) -> dict[str, float]:
    d = root / f"batch-{count}"
    paths = make_torn(d, count)
    first = validate(paths[0], writers_alive=False, max_level=1)  # every file is torn the same way
    reports = [replace(first, path=p, name_step=i, step=i) for i, p in enumerate(paths)]
    started, cpu = time.perf_counter(), time.process_time()
    records = quarantine_all(reports, d, "bench", now=0.0, host="bench")
    batch_s, batch_cpu = time.perf_counter() - started, time.process_time() - cpu
    assert all(r.ok for r in records)
    assert len(os.listdir(d)) == count + min(count, SIDECARS_PER_BATCH) + (count > SIDECARS_PER_BATCH)
    shutil.rmtree(d)
    if not with_resume:
        return {"count": count, "quarantine_all_s": batch_s, "quarantine_all_cpu_s": batch_cpu}

    d = root / f"resume-{count}"
    make_torn(d, count)
    started, cpu = time.perf_counter(), time.process_time()
    result = find_resume_point(d, quarantine=True, quarantine_tag="bench", writers_alive=False)
    resume_s, resume_cpu = time.perf_counter() - started, time.process_time() - cpu
    assert result.path is None and len(result.quarantined) == count
    shutil.rmtree(d)
    return {"count": count, "quarantine_all_s": batch_s, "quarantine_all_cpu_s": batch_cpu,
            "find_resume_point_s": resume_s, "find_resume_point_cpu_s": resume_cpu}


def bench_per_file(root: Path, count: int) -> float:
    d = root / f"per-file-{count}"
    paths = make_torn(d, count)
    reports = [validate(p, writers_alive=False, max_level=1) for p in paths]
    started = time.perf_counter()
    for report in reports:
        quarantine(report, d, "bench", now=0.0, host="bench")  # lists the directory every time
    elapsed = time.perf_counter() - started
    shutil.rmtree(d)
    return elapsed


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--counts", default="10000,100000")
    p.add_argument("--dir", default=None, help="where to write the files [a temp dir]")
    p.add_argument("--per-file-baseline", type=int, default=0)
    p.add_argument("--with-resume", action="store_true", help="also time find_resume_point end to end")
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-quarantine-", dir=args.dir))
    try:
        print(f"machine: {platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
              f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, files under {root}", file=sys.stderr)
        print("| torn files | quarantine_all: wall (CPU) | find_resume_point, list + validate + quarantine: wall (CPU) |")
        print("|---:|---:|---:|")
        for count in (int(c) for c in args.counts.split(",")):
            row = bench(root, count, args.with_resume)
            resume = (f"{row['find_resume_point_s']:.2f} s ({row['find_resume_point_cpu_s']:.2f} s)"
                      if args.with_resume else "not run")
            print(f"| {count:,} | {row['quarantine_all_s']:.2f} s ({row['quarantine_all_cpu_s']:.2f} s) "
                  f"| {resume} |", flush=True)
        if args.per_file_baseline:
            n = args.per_file_baseline
            print(f"\nper-file quarantine() (lists the directory each time), {n:,} files: "
                  f"{bench_per_file(root, n):.2f} s")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
