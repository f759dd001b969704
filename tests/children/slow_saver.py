"""A training child whose checkpoint saves take a controlled time (a stand-in for a slow shared
filesystem), so preemption tests can land a notice before, during, or after a save.

It uses the client like a real script: resume from the supervisor's choice, heartbeat, atomic
saves inside ``client.saving``, an emergency save when asked, a clean exit when told to stop.
The checkpoint bytes are a real ``torch.save`` zip; only the write is paced.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from pathlib import Path

import torch

from supervisor import client
from supervisor.checkpoints.atomic import atomic_writer, update_last


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--step-time", type=float, default=0.1)
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--save-seconds", type=float, default=1.0)
    args = p.parse_args()
    client.install()
    ckpt_dir = Path(os.environ.get("SUPERVISOR_CHECKPOINT_DIR", "checkpoints"))
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    step = 0
    resume = client.resume_path()
    if resume:
        step = int(torch.load(resume, weights_only=True)["step"])
        print(f"resumed from {resume} at step {step}", flush=True)
    client.resumed(step)

    def save(at: int) -> None:
        buf = io.BytesIO()
        torch.save({"step": at, "w": torch.randn(512, 512)}, buf)
        data = buf.getvalue()
        path = ckpt_dir / f"step={at}.ckpt"
        pieces = 20
        size = len(data) // pieces + 1
        with client.saving(at, path):
            with atomic_writer(path) as fh:
                for i in range(0, len(data), size):
                    fh.write(data[i:i + size])
                    fh.flush()
                    time.sleep(args.save_seconds / pieces)
        update_last(path, ckpt_dir / "last.ckpt")
        print(f"saved step {at}", flush=True)

    while step < args.steps:
        if client.should_stop():
            if client.save_requested():
                save(step)
            print(f"stopping at step {step} ({client.stop_reason()})", flush=True)
            sys.exit(0)
        time.sleep(args.step_time)
        step += 1
        print(f"step {step}", flush=True)
        client.heartbeat(step)
        if step % args.save_every == 0:
            save(step)
    client.done(step)
    print(f"training complete at step {step}", flush=True)


if __name__ == "__main__":
    main()
