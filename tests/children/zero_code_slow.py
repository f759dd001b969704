"""A zero-code training child: plain non-atomic ``torch.save`` of step files, then ``last.ckpt``
overwritten in place and slowly (a stand-in for a big checkpoint on a slow filesystem), so a
preemption can tear it. No supervisor import; SIGTERM kills it, as it kills most scripts."""

from __future__ import annotations

import argparse
import io
import time
from pathlib import Path

import torch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--step-time", type=float, default=0.1)
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--last-seconds", type=float, default=3.0)
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--ckpt_path", default=None)
    args = p.parse_args()
    ckpt_dir = Path(args.ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    step = 0
    if args.ckpt_path:
        step = int(torch.load(args.ckpt_path, weights_only=True)["step"])
        print(f"resumed from {args.ckpt_path} at step {step}", flush=True)
    while step < args.steps:
        time.sleep(args.step_time)
        step += 1
        print(f"step {step}", flush=True)
        if step % args.save_every == 0:
            state = {"step": step, "w": torch.randn(512, 512)}
            torch.save(state, ckpt_dir / f"step={step}.ckpt")
            buf = io.BytesIO()
            torch.save(state, buf)
            data = buf.getvalue()
            print(f"writing last.ckpt for step {step}", flush=True)
            with open(ckpt_dir / "last.ckpt", "wb") as fh:  # in place: torn if killed mid-write
                for i in range(0, len(data), len(data) // 30 + 1):
                    fh.write(data[i:i + len(data) // 30 + 1])
                    fh.flush()
                    time.sleep(args.last_seconds / 30)
            print(f"saved step {step}", flush=True)
    print(f"training complete at step {step}", flush=True)


if __name__ == "__main__":
    main()
