"""A tiny CPU training used by ``supervise demo``: linear regression with step checkpoints.

It uses the client the way a real training script would: resume from the supervisor's resume point,
heartbeat every step, save atomically, save once more and leave when told to stop. A real native
crash (a NULL read through ctypes, SIGSEGV) is injected at ``--segfault-at`` in the first attempt.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import time
from pathlib import Path

import torch

from supervisor import client


def crash_natively() -> None:
    """A genuine segmentation fault, as a blosc2/hdf5 reader would produce: no Python can catch it."""
    ctypes.string_at(0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--step-time", type=float, default=0.03)
    parser.add_argument("--segfault-at", type=int, default=-1)
    args = parser.parse_args()
    client.install()

    ckpt_dir = Path(os.environ.get("SUPERVISOR_CHECKPOINT_DIR", "checkpoints"))
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    true_w = torch.randn(16, 1)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    step = 0
    resume_path = client.resume_path()
    if resume_path:
        state = torch.load(resume_path, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        step = int(state["step"])
        print(f"resumed from {resume_path} at step {step}", flush=True)
    client.resumed(step)

    def save(at: int) -> None:
        path = ckpt_dir / f"step={at}.ckpt"
        client.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": at}, path, step=at)
        client.update_last(path, ckpt_dir / "last.ckpt")
        print(f"saved step {at} to {path.name}", flush=True)

    first_attempt = os.environ.get("SUPERVISOR_ATTEMPT", "1") == "1"
    while step < args.steps:
        if client.should_stop():
            if client.save_requested():
                save(step)
            print(f"stopping at step {step} ({client.stop_reason() or 'stop requested'})", flush=True)
            return
        x = torch.randn(64, 16)
        loss = torch.nn.functional.mse_loss(model(x), x @ true_w)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        print(f"step {step} loss {loss.item():.4f}", flush=True)
        client.heartbeat(step, loss=loss.item())
        if first_attempt and step == args.segfault_at:
            crash_natively()
        if step % args.save_every == 0:
            save(step)
        time.sleep(args.step_time)
    if hasattr(client, "done"):
        client.done()
    print(f"training complete at step {step}", flush=True)


if __name__ == "__main__":
    main()
