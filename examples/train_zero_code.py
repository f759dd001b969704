"""A training script as people write it, with no supervisor code at all: zero-code mode.

    supervise run --resume-arg "--ckpt_path {path}" -- python examples/train_zero_code.py --ckpt-dir ckpt

It saves with a plain ``torch.save`` (not atomic: a kill during the write tears the file, which the
supervisor quarantines on the next start), writes ``step=<N>.ckpt`` files and overwrites
``last.ckpt`` in place, prints ``step N loss X`` (the default step regex reads it), and resumes from
``--ckpt_path``. SIGTERM kills it (the default action), as it kills most scripts.

Fault injection (fires after step N, in attempt ``FAULT_ATTEMPT``, default 1, ``all`` = always):
``FAULT_SEGFAULT_AT``, ``FAULT_STALL_AT``, ``FAULT_EXCEPTION_AT``.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import time
from pathlib import Path

import torch


def fault_at(name: str, step: int) -> bool:
    wanted = os.environ.get("FAULT_ATTEMPT", "1").strip().lower()
    armed = wanted == "all" or (os.environ.get("SUPERVISOR_ATTEMPT") or "1") == wanted
    value = os.environ.get(name, "").strip()
    return armed and value.isdigit() and int(value) == step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--step-time", type=float, default=0.0)
    parser.add_argument("--save-bytes", type=int, default=0)
    parser.add_argument("--ckpt-dir", default="checkpoints")
    parser.add_argument("--ckpt_path", default=None, help="checkpoint to resume from")
    parser.add_argument("--last-only", action="store_true",
                        help="keep only last.ckpt, overwritten in place (the single-copy hazard)")
    args = parser.parse_args()

    ckpt_dir = Path(args.ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    true_w = torch.randn(16, 1)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    step = 0
    if args.ckpt_path:
        state = torch.load(args.ckpt_path, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        step = int(state["step"])
        print(f"resumed from {args.ckpt_path} at step {step}", flush=True)

    while step < args.steps:
        x = torch.randn(64, 16)
        loss = torch.nn.functional.mse_loss(model(x), x @ true_w)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        print(f"step {step} loss {loss.item():.6f}", flush=True)
        if fault_at("FAULT_SEGFAULT_AT", step):
            ctypes.string_at(0)  # a real SIGSEGV
        if fault_at("FAULT_STALL_AT", step):
            while True:
                time.sleep(3600)
        if fault_at("FAULT_EXCEPTION_AT", step):
            raise RuntimeError(f"FAULT_EXCEPTION_AT: injected exception at step {step}")
        if step % args.save_every == 0 or step == args.steps:
            state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": step}
            if args.save_bytes:
                state["pad"] = torch.ones(args.save_bytes, dtype=torch.uint8)
            if not args.last_only:
                torch.save(state, ckpt_dir / f"step={step}.ckpt")
            torch.save(state, ckpt_dir / "last.ckpt")  # in place: torn if killed mid-write
            print(f"saved step {step} to {ckpt_dir / ('last.ckpt' if args.last_only else f'step={step}.ckpt')}",
                  flush=True)
        time.sleep(args.step_time)
    print(f"training complete at step {step}", flush=True)


if __name__ == "__main__":
    main()
