"""Pickle scan cost: time and peak memory of validating a plain pickle of 1 MB .. 1 GB.

    python benchmarks/bench_picklescan.py [--sizes 1MB,13MB,60MB,100MB,1GB,tiny:13MB] [--dir /tmp] [--code DIR]

The worst case for the scanner: a pickle of many small objects (a list of small dicts, protocol 2
as torch.save writes data.pkl), written piecewise so that generating 1 GB does not need 1 GB of
memory. Each file is validated by ``supervisor.checkpoints.validate`` in a fresh process (so the
peak RSS is the scan's and not the generator's); the process's RSS after importing the
validator and before scanning is reported as the baseline. ``--code DIR`` runs the validator of
another checkout (e.g. main, for a before/after). Markdown to stdout (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import pickle
import platform
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

UNITS = {"KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
from supervisor.checkpoints.validate import validate
def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
before = rss_mb()
t = time.perf_counter()
report = validate(sys.argv[2])
elapsed = time.perf_counter() - t
print(json.dumps({"seconds": elapsed, "baseline_mb": before,
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "verdict": report.verdict.value, "step": report.step, "reason": report.reason[:120]}))
"""


def parse_size(text: str) -> int:
    for unit, factor in UNITS.items():
        if text.upper().endswith(unit):
            return int(float(text[: -len(unit)]) * factor)
    return int(text)


def _text(raw: str) -> bytes:
    data = raw.encode()
    return b"X" + struct.pack("<I", len(data)) + data


def write_pickle(path: Path, size: int) -> int:
    """``{"items": [{"a": i, "b": "x<i>", "c": (i, 1.5)}, ...], "global_step": 7}`` of about
    ``size`` bytes; returns the number of items."""
    items = 0
    with open(path, "wb") as out:
        out.write(b"\x80\x02}(" + _text("items") + b"]")
        written = out.tell()
        while written < size - 64:
            batch = [{"a": items + i, "b": f"x{items + i}", "c": (items + i, 1.5)} for i in range(1000)]
            body = pickle.dumps(batch, protocol=2)
            body = body[body.index(b"(") : -1]  # MARK ... APPENDS of this batch, appended to our list
            if written + len(body) > size - 64:
                break
            out.write(body)
            written += len(body)
            items += len(batch)
        out.write(_text("global_step") + b"K\x07u.")
    return items


def write_tiny(path: Path, size: int) -> int:
    """The densest objects a pickle can ask for: one empty list per byte, all in one list
    (``MARK``, ``EMPTY_LIST`` x n, ``LIST``)."""
    count = max(0, size - 5)
    with open(path, "wb") as out:
        out.write(b"\x80\x02(")
        chunk = b"]" * (1 << 20)
        left = count
        while left:
            out.write(chunk[: min(left, len(chunk))])
            left -= min(left, len(chunk))
        out.write(b"l.")
    return count


def run(code: str, path: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, code, str(path)], capture_output=True, text=True,
                          timeout=3600, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1MB,13MB,60MB,100MB,1GB,tiny:13MB",
                        help="sizes; tiny:SIZE = one empty list per byte (the densest objects)")
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--code", default=str(Path(__file__).resolve().parent.parent))
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for label in args.sizes.split(","):
            (Path(tmp) / label.replace(":", "-")).mkdir()
            path = Path(tmp) / label.replace(":", "-") / "last.pkl"
            started = time.perf_counter()
            tiny = label.startswith("tiny:")
            items = (write_tiny if tiny else write_pickle)(path, parse_size(label.removeprefix("tiny:")))
            made = time.perf_counter() - started
            result = run(args.code, path)
            rows.append((label, path.stat().st_size, items, made, result))
            print(f"{label}: {result}", file=sys.stderr)
            path.unlink()
    print(f"Pickle scan, {dt.date.today()}, {platform.node()} ({os.cpu_count()} cores, "
          f"Python {platform.python_version()}), code: {args.code}\n")
    print("| pickle | bytes | items | verdict | scan s | RSS before MB | peak RSS MB | reason |")
    print("|---|---:|---:|---|---:|---:|---:|---|")
    for label, size, items, _made, r in rows:
        print(f"| {label} | {size:,} | {items:,} | {r['verdict']} (step {r['step']}) | {r['seconds']:.2f} | "
              f"{r['baseline_mb']:.0f} | {r['peak_mb']:.0f} | {r['reason'][:70]} |")


if __name__ == "__main__":
    main()
