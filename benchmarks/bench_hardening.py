"""Costs of the round-three hardening (issue 25 items 2, 4, 5): the YAML alias refusal against what
an alias bomb costs a plain SafeLoader, and what redaction and escaping add per line and per event.

    python benchmarks/bench_hardening.py

Results, machine and date: docs/benchmarks.md ("Hardening: YAML aliases, redaction, escaping").
"""

from __future__ import annotations

import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from supervisor.config import ConfigError, read_yaml  # noqa: E402
from supervisor.events import EventLog  # noqa: E402
from supervisor.redact import redact_argv, redact_text  # noqa: E402
from supervisor.textsafe import printable  # noqa: E402


def laughs(levels: int) -> bytes:
    """``name:`` holding ``levels`` nested levels of nine aliases each: 9**levels strings once expanded."""
    parts = ['&l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    parts += [f"&l{n} [" + ",".join([f"*l{n - 1}"] * 9) + "]" for n in range(1, levels)]
    return ("name: [" + ", ".join(parts) + "]\n").encode()


def without_the_refusal(levels: int) -> tuple[float, float, str]:
    """Seconds, peak MB and the outcome of ``load_config`` on the bomb with the alias check taken
    out (the loader as it was before), in a fresh process."""
    code = ("import resource, sys, time, yaml\n"
            "from supervisor import config\n"
            "config._StrictLoader.compose_node = yaml.SafeLoader.compose_node\n"
            "t = time.perf_counter()\n"
            "try:\n"
            "    config.load_config(sys.argv[1], environ={}); out = 'loaded'\n"
            "except config.ConfigError as exc:\n"
            "    out = f'ConfigError of {len(str(exc)):,} characters'\n"
            "d = time.perf_counter() - t\n"
            "print(d, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, out)\n")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bomb.yaml"
        path.write_bytes(laughs(levels))
        proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True,
                              env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=600)
    seconds, mb, out = proc.stdout.split(maxsplit=2)
    return float(seconds), float(mb), out.strip()


def refused(levels: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bomb.yaml"
        path.write_bytes(laughs(levels))
        t = time.perf_counter()
        try:
            read_yaml(path)
        except ConfigError:
            pass
        else:
            raise SystemExit("the bomb was not refused")
        return time.perf_counter() - t


def per_call(fn, arg, n: int) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(n):
            fn(arg)
        best = min(best, (time.perf_counter() - t) / n)
    return best


def main() -> None:
    print("## YAML alias bombs")
    print("| levels (strings under name:) | without the refusal | peak RSS | outcome | with it (refused) |")
    for levels in (5, 6, 7):
        seconds, mb, out = without_the_refusal(levels)
        print(f"| {levels} (9^{levels} = {9 ** levels:,}) | {seconds:.2f} s | {mb:.0f} MB | {out} | "
              f"{refused(levels) * 1000:.2f} ms |")
    print(f"| 9 (9^9 = {9 ** 9:,}) | not run | | | {refused(9) * 1000:.2f} ms |")
    print(f"maxrss of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")

    print("\n## Redaction and escaping, per call (best of 3)")
    ordinary = "step 1200 loss 0.4312 lr 3.0e-04 tokens/s 51234.5 grad_norm 1.02"
    telling = "RuntimeError: CUDA error: an illegal memory access was encountered (see https://example.org/x?a=1)"
    secret = "uploading with Authorization: Bearer abcdefghijklmnop0123456789"
    for name, line in (("ordinary output line", ordinary), ("failure line with a URL", telling),
                       ("line with a Bearer token", secret)):
        print(f"| redact_text, {name} | {per_call(redact_text, line, 20000) * 1e6:.2f} µs |")
    argv = ["python", "train.py", "--lr", "3e-4", "--api-key", "K", "--data", "/data/x", "wandb.project=p"]
    print(f"| redact_argv, 9 arguments | {per_call(redact_argv, argv, 20000) * 1e6:.2f} µs |")
    print(f"| printable, a clean name | {per_call(printable, 'step-1200.safetensors', 100000) * 1e6:.3f} µs |")
    with tempfile.TemporaryDirectory() as tmp:
        log = EventLog(Path(tmp) / "events.jsonl")
        fields = {"attempt": 1, "step": 1200, "path": "/scratch/run/checkpoints/step-1200.pt", "ok": True}
        t = time.perf_counter()
        for _ in range(5000):
            log.emit("save_begin", **fields)
        print(f"| EventLog.emit (save_begin: not fsynced), redaction included | "
              f"{(time.perf_counter() - t) / 5000 * 1e6:.1f} µs |")
        log.close()


if __name__ == "__main__":
    main()
