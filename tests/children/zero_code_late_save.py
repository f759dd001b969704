"""A zero-code training child whose save *begins with the preemption notice*: the race at the
notice, placed by the signal itself. Slurm sends a preempted job's steps SIGCONT and then SIGTERM;
the SIGTERM is ignored here (the supervisor's shield), SIGCONT is not, and its handler opens
``last.ckpt`` for writing in place, without truncating it. The first byte follows
``--first-byte-after`` seconds later (a big model's state is gathered and serialised first) and the
rest is written slowly, so for a while the directory shows no change at all: only the open file
descriptor says a save is in flight. Killed in that while, nothing is torn but the save is lost;
killed later, ``last.ckpt`` is torn. After it, the next step takes long (the supervisor ends the
child first), so the resume point is that save. Regular saves (a step file, then ``last.ckpt``) are quick.
No supervisor import."""

from __future__ import annotations

import argparse
import io
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--step-time", type=float, default=0.1)
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--first-byte-after", type=float, default=0.5)
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
        if late or args.ckpt_path or not (ckpt_dir / "last.ckpt").exists():
            return  # one late save, over an existing last.ckpt, in the first attempt only
        late["step"] = step
        late["fd"] = os.open(ckpt_dir / "last.ckpt", os.O_WRONLY)  # in place, not truncated: no visible change
        print(f"late save of step {step} begins", flush=True)

    signal.signal(signal.SIGCONT, on_cont)
    while step < args.steps:
        time.sleep(args.step_time)
        if "fd" in late:
            time.sleep(args.first_byte_after)
            write_slowly(late.pop("fd"), late["step"], args.late_seconds)
            time.sleep(600)  # a long next step: the supervisor ends the child before another save
        step += 1
        print(f"step {step}", flush=True)
        if step % args.save_every == 0:
            torch.save(state_of(step), ckpt_dir / f"step={step}.ckpt")
            torch.save(state_of(step), ckpt_dir / "last.ckpt")
    print(f"training complete at step {step}", flush=True)


def state_of(step: int) -> dict[str, Any]:
    return {"step": step, "w": torch.randn(256, 256)}


def write_slowly(fd: int, step: int, seconds: float) -> None:
    buf = io.BytesIO()
    torch.save(state_of(step), buf)
    data = buf.getvalue()
    chunk = len(data) // 20 + 1
    try:
        for i in range(0, len(data), chunk):
            os.pwrite(fd, data[i:i + chunk], i)
            time.sleep(seconds / 20)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)
    print(f"saved step {step}", flush=True)


if __name__ == "__main__":
    main()
