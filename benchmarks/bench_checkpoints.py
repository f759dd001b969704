"""Checkpoint validation cost: L1..L4 against torch.load(weights_only=True) on the same files,
and a resume-point scan over a directory of 1,000 checkpoints.

    python benchmarks/bench_checkpoints.py [--dir /scratch/bench] [--sizes 1MB,1GB,10GB] [--count 1000]

Targets: L1 <= 1 ms at any size; 1,000 checkpoints scanned to a resume point
<= 0.5 s. Writes a Markdown report to stdout (paste into docs/benchmarks.md) and JSON to
--json. Big files are deleted afterwards. "Cold" = the file evicted from this machine's page
cache (fsync + POSIX_FADV_DONTNEED), median of 5; a hypervisor below may still cache it.
Warm = median of 7 repeats.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

from supervisor.checkpoints.scan import find_resume_point, scan
from supervisor.checkpoints.validate import validate
from supervisor.checkpoints.zipcheck import clear_crc_cache, read_index, read_trailer

UNITS = {"KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}
CHUNK = 256 << 20  # bytes per tensor for the big files (a 10 GB file has 40 entries)


def parse_size(text: str) -> int:
    text = text.strip().upper()
    for unit, factor in UNITS.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * factor)
    return int(text)


def machine() -> dict[str, Any]:
    def run(*cmd: str) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem = next((line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal")), "0")
    return {"date_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "nproc": os.cpu_count(), "cpu": cpu, "mem_gib": round(int(mem) / (1 << 20), 1),
            "kernel": platform.release(), "python": platform.python_version(), "torch": torch.__version__,
            "load_avg": os.getloadavg()}


def disk_of(path: Path) -> str:
    out = subprocess.run(["df", "-T", str(path)], capture_output=True, text=True).stdout.splitlines()
    fields = out[-1].split() if out else []
    dev, fstype = (fields[0], fields[1]) if len(fields) > 1 else ("?", "?")
    rota = ""
    name = os.path.basename(dev)
    rota_file = Path(f"/sys/block/{name}/queue/rotational")
    if rota_file.exists():
        rota = " (rotational)" if rota_file.read_text().strip() == "1" else " (non-rotational)"
    return f"{dev} {fstype}{rota}"


def evict(path: Path) -> None:
    """Drop the file from this machine's page cache so the next read is cold."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def warm_median(fn: Callable[[], Any], repeat: int = 7) -> float:
    fn()
    return statistics.median(timed(fn)[0] for _ in range(repeat))


def cold_median(path: Path, fn: Callable[[], Any], repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        evict(path)
        times.append(timed(fn)[0])
    return statistics.median(times)


def make_checkpoint(path: Path, size: int, scratch: Path) -> float:
    """A Lightning-shaped checkpoint of about ``size`` bytes. Tensors are mapped from sparse files
    so a 10 GB checkpoint does not need 10 GB of RAM to write. Returns the torch.save seconds."""
    chunk = min(CHUNK, max(size // 4, 4096))
    tensors: dict[str, torch.Tensor] = {}
    backing = []
    remaining, i = size, 0
    while remaining > 0:
        nbytes = min(chunk, remaining)
        store = scratch / f"backing-{i}.bin"
        with open(store, "wb") as handle:
            handle.truncate(nbytes)
        tensors[f"layer{i}.weight"] = torch.from_file(str(store), shared=True, size=nbytes // 4, dtype=torch.float32)
        backing.append(store)
        remaining -= nbytes
        i += 1
    obj = {"epoch": 3, "global_step": 1000, "state_dict": tensors,
           "optimizer_states": [{"state": {}, "param_groups": [{"lr": 1e-3}]}], "loops": {}, "callbacks": {}}
    start = time.perf_counter()
    torch.save(obj, path)
    os.sync()
    seconds = time.perf_counter() - start
    del obj, tensors
    gc.collect()
    for store in backing:
        store.unlink()
    return seconds


def l1(path: Path) -> None:
    with open(path, "rb", buffering=0) as handle:
        read_trailer(handle.fileno(), 0, os.fstat(handle.fileno()).st_size)


def l2(path: Path) -> None:
    with open(path, "rb", buffering=0) as handle:
        fd = handle.fileno()
        size = os.fstat(fd).st_size
        read_index(fd, 0, size, read_trailer(fd, 0, size))


def bench_file(path: Path, size: int) -> dict[str, Any]:
    row: dict[str, Any] = {"size": path.stat().st_size}
    for name, fn in (("l1", lambda: l1(path)), ("l2", lambda: l2(path)), ("l3", lambda: validate(path))):
        row[f"{name}_cold_ms"] = cold_median(path, fn) * 1e3
        row[f"{name}_warm_ms"] = warm_median(fn) * 1e3
    for label in ("cold", "warm"):
        clear_crc_cache()
        if label == "cold":
            evict(path)
        seconds, report = timed(lambda: validate(path, deep=True))
        assert report.level == 4, report.reason
        row[f"l4_{label}_s"] = seconds
        row[f"l4_{label}_mbps"] = row["size"] / seconds / 1e6
    available = _mem_available()
    for label in ("cold", "warm"):
        if label == "cold":
            evict(path)
        if available > 1.5 * row["size"]:
            seconds, obj = timed(lambda: torch.load(path, weights_only=True, map_location="cpu"))
            row["load_mode"] = "weights_only=True"
        else:
            seconds, obj = timed(lambda: torch.load(path, weights_only=True, mmap=True, map_location="cpu"))
            row["load_mode"] = "weights_only=True, mmap=True (not enough free RAM for a full load)"
        del obj
        gc.collect()
        row[f"load_{label}_s"] = seconds
    evict(path)
    row["load_mmap_cold_ms"] = timed(lambda: torch.load(path, weights_only=True, mmap=True))[0] * 1e3
    return row


def _mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable"):
            return int(line.split()[1]) * 1024
    return 0


def bench_dir(base: Path, count: int) -> dict[str, Any]:
    """``count`` small Lightning checkpoints whose names sort wrongly as text; the newest three torn."""
    d = base / "many"
    d.mkdir()
    steps = list(range(100, 100 * (count + 1), 100))
    for step in steps:
        torch.save({"epoch": 0, "global_step": step, "state_dict": {"w": torch.zeros(64)},
                    "optimizer_states": [{"state": {0: {"exp_avg": torch.zeros(64)}}}]},
                   d / f"epoch=0-step={step}.ckpt")
    for step in steps[-3:]:
        os.truncate(d / f"epoch=0-step={step}.ckpt", 1000)
        os.utime(d / f"epoch=0-step={step}.ckpt", (time.time() - 3600,) * 2)
    os.sync()
    for entry in d.iterdir():
        evict(entry)
    cold, result = timed(lambda: find_resume_point(d))
    assert result.step == steps[-4], result.reason
    warm = warm_median(lambda: find_resume_point(d), repeat=5)
    full = warm_median(lambda: scan(d), repeat=3)
    shutil.rmtree(d)
    return {"count": count, "resume_cold_s": cold, "resume_warm_s": warm, "full_scan_warm_s": full,
            "chosen_step": result.step}


def markdown(info: dict[str, Any], disk: str, files: list[dict[str, Any]], many: dict[str, Any] | None) -> str:
    lines = [
        f"Machine: {info['nproc']} CPUs ({info['cpu']}), {info['mem_gib']} GiB RAM, disk {disk}; "
        f"Linux {info['kernel']}, Python {info['python']}, torch {info['torch']}; "
        f"{info['date_utc']}; load average at start {', '.join(f'{x:.2f}' for x in info['load_avg'])}.",
        "",
        "| file | L1 cold / warm (ms) | L2 cold / warm (ms) | L0-L3 cold / warm (ms) | L4 CRC cold / warm (MB/s) "
        "| torch.load(weights_only) cold / warm (s) | torch.load(mmap, weights_only) cold (ms) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in files:
        load_note = "" if row["load_mode"] == "weights_only=True" else " (mmap)"
        lines.append(
            f"| {row['label']} ({row['size']:,} B) | {row['l1_cold_ms']:.2f} / {row['l1_warm_ms']:.3f} "
            f"| {row['l2_cold_ms']:.2f} / {row['l2_warm_ms']:.3f} | {row['l3_cold_ms']:.2f} / {row['l3_warm_ms']:.2f} "
            f"| {row['l4_cold_mbps']:.0f} / {row['l4_warm_mbps']:.0f} "
            f"| {row['load_cold_s']:.3f} / {row['load_warm_s']:.3f}{load_note} | {row['load_mmap_cold_ms']:.1f} |")
    if many:
        lines += ["", f"Resume point over {many['count']:,} checkpoints (names that sort wrongly as text, "
                      f"newest three truncated): **{many['resume_cold_s'] * 1e3:.0f} ms cold, "
                      f"{many['resume_warm_s'] * 1e3:.0f} ms warm** (chose step {many['chosen_step']}); "
                      f"a full L0-L3 scan of all of them: {many['full_scan_warm_s'] * 1e3:.0f} ms warm."]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="scratch dir on the disk to measure (default: $TMPDIR)")
    parser.add_argument("--sizes", default="1MB,1GB,10GB")
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-ckpt-", dir=args.dir))
    info = machine()
    disk = disk_of(base)
    files = []
    try:
        for label in args.sizes.split(","):
            size = parse_size(label)
            free = shutil.disk_usage(base).free
            if free < size * 1.2 + (1 << 30):
                print(f"skipping {label}: {free / 1e9:.1f} GB free, need {size * 1.2 / 1e9:.1f} GB", file=sys.stderr)
                continue
            path = base / "epoch=3-step=1000.ckpt"
            save_s = make_checkpoint(path, size, base)
            print(f"{label}: written in {save_s:.1f} s; measuring", file=sys.stderr)
            row = bench_file(path, size)
            row.update(label=label.strip(), save_s=save_s)
            files.append(row)
            path.unlink()
        many = bench_dir(base, args.count) if args.count else None
    finally:
        shutil.rmtree(base, ignore_errors=True)
    report = markdown(info, disk, files, many)
    print(report)
    if args.json:
        args.json.write_text(json.dumps({"machine": info, "disk": disk, "files": files, "many": many}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
