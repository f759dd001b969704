"""A zero-code GPU training (no supervisor client) that hits a genuine CUDA illegal memory access.

It prints ``step N loss X``, saves ``step=N.ckpt`` atomically (temp file + rename) every
``--save-every`` steps, and resumes from ``--ckpt`` (given by ``supervise run --resume-arg``).
``--fault-steps 120,240`` makes an out-of-bounds GPU store at each listed step; with
``--fault-once DIR`` each listed step faults only the first time it is reached (a marker file per
step in DIR), which models a crash that recurs every few thousand steps at different places, the
torch.compile case. Without ``--fault-once`` the same step faults every time (a deterministic bug).

Run by benchmarks/gpu/progress_policy.sh on the lent H200; needs torch with CUDA.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from train_plain import illegal_memory_access  # noqa: E402  (the same genuine fault as the examples)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=700)
    p.add_argument("--save-every", type=int, default=50)
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--ckpt", default=None)
    p.add_argument("--fault-steps", default="")
    p.add_argument("--fault-once", default=None, help="directory for 'already fired' markers")
    p.add_argument("--step-time", type=float, default=0.005)
    args = p.parse_args()
    faults = {int(s) for s in args.fault_steps.split(",") if s.strip()}
    device = torch.device("cuda")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = 0
    if args.ckpt:
        state = torch.load(args.ckpt, map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step = int(state["global_step"])
        print(f"resumed from {args.ckpt} at step {step}", flush=True)
    ckpt_dir = Path(args.ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    x = torch.randn(512, 256, device=device)
    while step < args.steps:
        step += 1
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item():.5f}", flush=True)
        if step in faults:
            marker = Path(args.fault_once) / f"fired-{step}" if args.fault_once else None
            if marker is None or not marker.exists():
                if marker is not None:
                    marker.parent.mkdir(parents=True, exist_ok=True)
                    marker.write_text("")
                print(f"injecting an out-of-bounds GPU store at step {step}", flush=True)
                illegal_memory_access(device)
        if step % args.save_every == 0:
            path = ckpt_dir / f"step={step}.ckpt"
            tmp = ckpt_dir / f".{path.name}.tmp-{os.getpid()}"
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "global_step": step}, tmp)
            os.replace(tmp, path)
        time.sleep(args.step_time)
    print(f"training complete at step {step}", flush=True)


if __name__ == "__main__":
    main()
