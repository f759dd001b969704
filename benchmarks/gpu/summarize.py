"""Turn the files run_all.sh leaves in $OUT into the markdown rows of docs/benchmarks.md ("GPU").

    python benchmarks/gpu/summarize.py OUT_DIR   >> the table in docs/benchmarks.md (by hand)

Reads, when present: check_gpu.json, ima_events.jsonl (+ ima_attempt1.log), overhead.json.
Missing or failed parts become a row that says so: a result is never invented.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HEADER = ("| date (UTC) | machine | measurement | result |\n"
          "|---|---|---|---|")


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _events(path: Path) -> list[dict[str, Any]]:
    out = []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


def machine_of(overhead: Any, check: Any) -> tuple[str, str]:
    date, parts = "?", []
    if isinstance(overhead, dict):
        facts = overhead.get("machine") or {}
        date = facts.get("date_utc") or date
        gpus = facts.get("gpus") or []
        if gpus:
            parts.append(f"{len(gpus)}× {gpus[0].split(',')[0]}")
            fields = [f.strip() for f in gpus[0].split(",")]
            if len(fields) > 1:
                parts.append(f"driver {fields[1]}")
        if facts.get("torch_cuda_python"):
            torch_v, cuda_v, py_v = (facts["torch_cuda_python"].split() + ["?", "?", "?"])[:3]
            parts.append(f"torch {torch_v} (CUDA {cuda_v}), Python {py_v}")
    elif isinstance(check, dict) and check.get("gpus"):
        gpu = check["gpus"][0]
        parts.append(f"{len(check['gpus'])}× {gpu.get('name')}, driver {gpu.get('driver')}, "
                     f"torch {check.get('torch')}")
    return date, ", ".join(parts) or "?"


def check_row(check: Any) -> str:
    if not isinstance(check, dict):
        return "GPU health check (`supervise check-gpu`) | not run or no JSON"
    word = "healthy" if check.get("ok") else ("UNHEALTHY" if check.get("checkable") else "cannot check")
    details = []
    for gpu in check.get("gpus") or []:
        checks = ", ".join(f"{c['name']} ×{c['runs']} ({c['seconds']:.2f} s)" if c.get("seconds") is not None
                           else f"{c['name']} ×{c['runs']}" for c in gpu.get("checks") or [])
        clocks = f", SM {gpu['clock_sm_mhz']} MHz" if gpu.get("clock_sm_mhz") is not None else ""
        details.append(f"GPU {gpu.get('index')}: {checks}{clocks}")
    return (f"GPU health check (`supervise check-gpu`, exit {check.get('exit_code')}) | {word}: "
            f"{check.get('reason')}" + (f" — {'; '.join(details)}" if details else ""))


def ima_row(events: list[dict[str, Any]], attempt_log: str) -> str:
    title = "injected CUDA illegal memory access → classify → restart → resume"
    if not events:
        return f"{title} | not run or no event log"
    failures = [e for e in events if e.get("event") == "failure"]
    resumes = [e for e in events if e.get("event") == "resume_point" and (e.get("attempt") or 0) >= 2]
    end = next((e for e in reversed(events) if e.get("event") == "run_end"), {})
    seen_text = "an illegal memory access was encountered" in attempt_log
    parts = []
    if failures:
        first = failures[0]
        evidence = (first.get("evidence") or [""])[0]
        parts.append(f"attempt {first.get('attempt')} failed at step {first.get('step')}: class "
                     f"`{first.get('class')}`, action `{first.get('action')}`; evidence `{str(evidence)[:120]}`")
    else:
        parts.append("no failure recorded")
    parts.append("CUDA's own error text in the attempt log" if seen_text else "CUDA error text NOT found")
    if resumes:
        r = resumes[0]
        parts.append(f"attempt {r.get('attempt')} resumed from `{Path(str(r.get('path'))).name}` "
                     f"(step {r.get('step')})")
    parts.append(f"run ended `{end.get('outcome')}` after {end.get('attempts')} attempts" if end else "no run_end")
    return f"{title} | " + "; ".join(parts)


def overhead_row(overhead: Any) -> str:
    title = "supervision overhead, steps/s (bare vs `supervise run`)"
    if not isinstance(overhead, dict) or not overhead.get("ok"):
        reason = overhead.get("reason") if isinstance(overhead, dict) else "no JSON"
        return f"{title} | not measured ({reason})"
    bare, sup = overhead["bare"], overhead["supervised"]
    paired = overhead.get("paired_overhead_pct") or {}
    model = " ".join(overhead.get("train_args") or []) or "defaults"
    return (f"{title}; train_plain.py {model}, {overhead['steps_per_run']} steps/run | "
            f"bare median {bare['median']} steps/s (n={bare['n']}, spread {bare['spread_pct']} %), "
            f"supervised median {sup['median']} steps/s (n={sup['n']}, spread {sup['spread_pct']} %): "
            f"overhead {overhead['overhead_pct']} % (paired per round: median {paired.get('median')} %, "
            f"range {paired.get('min')}..{paired.get('max')} %); one step ≈ {overhead.get('step_ms_bare')} ms")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: summarize.py OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    check = _load_json(out / "check_gpu.json")
    overhead = _load_json(out / "overhead.json")
    try:
        attempt_log = (out / "ima_attempt1.log").read_text(errors="replace")
    except OSError:
        attempt_log = ""
    date, machine = machine_of(overhead, check)
    print(HEADER)
    for row in (check_row(check), ima_row(_events(out / "ima_events.jsonl"), attempt_log), overhead_row(overhead)):
        print(f"| {date} | {machine} | {row} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
