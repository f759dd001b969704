"""A zero-code training child whose save *begins with the preemption notice*: the race at the
notice, placed deterministically. Slurm sends a preempted job's steps SIGCONT and then SIGTERM; the
SIGTERM is ignored here (the supervisor's shield), but SIGCONT is not, and its handler opens
``step=N.ckpt`` for writing at once, so the save begins 0-few ms after the notice, before or after
the supervisor's arbitration, never by chance of timing. The main loop then writes it slowly
(plain ``open``/``write``, no temp file: torn if killed mid-write) and goes on training. Regular
saves are quick ``torch.save`` calls. No supervisor import."""

from __future__ import annotations

import argparse
import io
import signal
import time
from pathlib import Path
from typing import Any, BinaryIO

import torch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--step-time", type=float, default=0.1)
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--late-seconds", type=float, default=2.0)
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--ckpt_path", default=None)
    args = p.parse_args()
    ckpt_dir = Path(args.ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    step = 0
    if args.ckpt_path:
        step = int(torch.load(args.ckpt_path, weights_only=True)["step"])
        print(f"resumed from {args.ckpt_path} at step {step}", flush=True)
    late: dict[str, Any] = {}

    def on_cont(signum: int, frame: Any) -> None:
        if late or args.ckpt_path:
            return  # one late save, in the first attempt only
        late["step"] = step
        late["fh"] = open(ckpt_dir / f"step={step}.ckpt", "wb")  # noqa: SIM115 - closed by the main loop
        print(f"late save of step {step} begins", flush=True)

    signal.signal(signal.SIGCONT, on_cont)
    while step < args.steps:
        time.sleep(args.step_time)
        if "fh" in late:
            write_slowly(late.pop("fh"), late["step"], args.late_seconds)
        step += 1
        print(f"step {step}", flush=True)
        if step % args.save_every == 0:
            torch.save({"step": step, "w": torch.randn(256, 256)}, ckpt_dir / f"step={step}.ckpt")
    print(f"training complete at step {step}", flush=True)


def write_slowly(fh: BinaryIO, step: int, seconds: float) -> None:
    buf = io.BytesIO()
    torch.save({"step": step, "w": torch.randn(256, 256)}, buf)
    data = buf.getvalue()
    chunk = len(data) // 20 + 1
    with fh:
        for i in range(0, len(data), chunk):
            fh.write(data[i:i + chunk])
            fh.flush()
            time.sleep(seconds / 20)
    print(f"saved step {step}", flush=True)


if __name__ == "__main__":
    main()
