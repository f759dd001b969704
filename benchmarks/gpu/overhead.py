"""Supervision overhead on training throughput: bare ``python train_plain.py`` against
``supervise run -- python train_plain.py``, same model, same GPU, alternating runs.

    python benchmarks/gpu/overhead.py --device cuda --rounds 5 --out overhead.json \
        -- --dtype bf16 --dim 1024 --hidden 4096 --layers 8 --batch 16384

Everything after ``--`` goes to examples/train_plain.py. Throughput is the script's own
``throughput X steps/s`` line (steps after ``--warmup``, so interpreter and CUDA start-up are left
out); the wall time of each whole run is recorded too. Bare and supervised runs alternate, and the
order flips every round, so slow drift (clocks, temperature) hits both alike. A calibration run sizes
``--steps`` so that one run trains for about ``--target-seconds``. New rounds start only while they
fit in ``--budget-seconds``. Checkpoints are off (``--save-every 0``): saves cost the same with or
without the supervisor and would only add noise here.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "examples" / "train_plain.py"
THROUGHPUT = re.compile(r"^throughput ([0-9.]+) steps/s over steps (\d+)\.\.(\d+)", re.MULTILINE)


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERVISOR_", "SUPERVISE_", "FAULT_"))}
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_once(kind: str, index: int, steps: int, opts: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One training run, bare or supervised; its throughput and wall time."""
    train = [opts.python, str(TRAIN), "--device", opts.device, "--steps", str(steps), "--save-every", "0",
             "--log-every", str(opts.log_every), "--warmup", str(opts.warmup),
             "--ckpt-dir", str(work / f"{kind}-{index}" / "checkpoints"), *opts.train_args]
    if kind == "supervised":
        cmd = [opts.python, "-m", "supervisor", "run", "--run-dir", str(work / f"{kind}-{index}"), "--", *train]
    else:
        cmd = train
    started = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=clean_env(), cwd=work,
                              timeout=opts.run_timeout)
        rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc = None
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        stderr = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
    wall = time.perf_counter() - started
    match = THROUGHPUT.search(stdout)
    record: dict[str, Any] = {"kind": kind, "round": index, "steps": steps, "rc": rc, "wall_s": round(wall, 3),
                              "steps_per_s": float(match.group(1)) if match else None,
                              "timed_steps": int(match.group(3)) - int(match.group(2)) if match else None}
    if rc != 0 or match is None:
        record["tail"] = (stdout + stderr)[-2000:]
    shutil.rmtree(work / f"{kind}-{index}", ignore_errors=True)
    print(f"  {kind:<10} round {index}: rc={rc} {record['steps_per_s']} steps/s, wall {wall:.1f} s",
          flush=True)
    return record


def summary(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    med = statistics.median(values)
    return {"n": len(values), "median": round(med, 4), "min": round(min(values), 4),
            "max": round(max(values), 4), "spread_pct": round(100 * (max(values) - min(values)) / med, 3),
            "values": [round(v, 4) for v in values]}


def machine_facts(python: str) -> dict[str, Any]:
    facts: dict[str, Any] = {"host": platform.node(), "platform": platform.platform(),
                             "date_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M"),
                             "cpus": os.cpu_count()}
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=15)
        facts["gpus"] = [ln.strip() for ln in smi.stdout.splitlines() if ln.strip()]
    except (OSError, subprocess.TimeoutExpired):
        facts["gpus"] = []
    try:
        ver = subprocess.run([python, "-c", "import sys, torch; print(torch.__version__, torch.version.cuda, "
                              "sys.version.split()[0])"], capture_output=True, text=True, timeout=60)
        facts["torch_cuda_python"] = ver.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        facts["torch_cuda_python"] = None
    return facts


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    train_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, train_args = argv[:cut], argv[cut + 1:]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--rounds", type=int, default=5, help="bare+supervised pairs at most")
    p.add_argument("--target-seconds", type=float, default=20.0, help="training time per run")
    p.add_argument("--budget-seconds", type=float, default=300.0, help="no new round past this")
    p.add_argument("--calibration-steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--min-steps", type=int, default=100)
    p.add_argument("--run-timeout", type=float, default=180.0)
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--out", type=Path, default=None, help="write the JSON here (else print it)")
    opts = p.parse_args(argv)
    opts.train_args = train_args
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="overhead-"))
    try:
        print(f"calibrating: {opts.calibration_steps} steps, bare", flush=True)
        calib = run_once("calibration", 0, opts.calibration_steps + opts.warmup, opts, work)
        rate = calib["steps_per_s"]
        if not rate:
            result = {"ok": False, "reason": "calibration run failed", "calibration": calib}
            return _finish(result, opts)
        steps = max(opts.min_steps, int(rate * opts.target_seconds) + opts.warmup)
        one_run = calib["wall_s"] + steps / rate
        runs: list[dict[str, Any]] = []
        for index in range(1, opts.rounds + 1):
            if time.monotonic() - started + 2 * one_run > opts.budget_seconds:
                print(f"stopping after {index - 1} rounds: the time budget is spent", flush=True)
                break
            order = ("bare", "supervised") if index % 2 else ("supervised", "bare")
            for kind in order:
                runs.append(run_once(kind, index, steps, opts, work))
        bare = [r["steps_per_s"] for r in runs if r["kind"] == "bare" and r["steps_per_s"]]
        sup = [r["steps_per_s"] for r in runs if r["kind"] == "supervised" and r["steps_per_s"]]
        pairs = {}
        for r in runs:
            pairs.setdefault(r["round"], {})[r["kind"]] = r["steps_per_s"]
        ratios = [v["supervised"] / v["bare"] for v in pairs.values() if v.get("bare") and v.get("supervised")]
        result = {
            "ok": bool(bare and sup),
            "what": "steps/s of examples/train_plain.py, bare vs under `supervise run`",
            "machine": machine_facts(opts.python),
            "device": opts.device, "train_args": train_args, "steps_per_run": steps,
            "warmup_steps": opts.warmup, "log_every": opts.log_every,
            "calibration": calib,
            "step_ms_bare": round(1000 / statistics.median(bare), 3) if bare else None,
            "bare": summary(bare), "supervised": summary(sup),
            "overhead_pct": (round(100 * (1 - statistics.median(sup) / statistics.median(bare)), 3)
                             if bare and sup else None),
            "paired_overhead_pct": summary([100 * (1 - r) for r in ratios]),
            "wall_s": {"bare": summary([r["wall_s"] for r in runs if r["kind"] == "bare" and r["rc"] == 0]),
                       "supervised": summary([r["wall_s"] for r in runs
                                              if r["kind"] == "supervised" and r["rc"] == 0])},
            "runs": runs,
            "elapsed_s": round(time.monotonic() - started, 1),
        }
        return _finish(result, opts)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _finish(result: dict[str, Any], opts: argparse.Namespace) -> int:
    text = json.dumps(result, indent=2)
    if opts.out:
        opts.out.write_text(text + "\n")
        keys = ("ok", "reason", "step_ms_bare", "bare", "supervised", "overhead_pct", "paired_overhead_pct")
        print(json.dumps({k: result[k] for k in keys if k in result}), flush=True)
    else:
        print(text, flush=True)
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
