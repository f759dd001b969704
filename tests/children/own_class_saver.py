"""A plain training script that checkpoints the way most codebases do: ``torch.save`` of a dict
holding its own ``@dataclass`` config and a ``pathlib.Path``, loaded back with
``weights_only=False``. No client, no atomic writer (zero-code mode).

    python own_class_saver.py --ckpt-dir DIR --steps 6 --save-every 2 [--crash-after-saves 2]
        [--resume PATH]

With ``--crash-after-saves N`` the first run (the one that does not resume) kills itself with
SIGSEGV right after its N-th save, as a native crash would.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import signal
import time
from dataclasses import dataclass

import torch


@dataclass
class Cfg:
    lr: float = 0.1
    width: int = 4


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--save-every", type=int, default=2)
    p.add_argument("--crash-after-saves", type=int, default=0)
    p.add_argument("--resume", default=None)
    args = p.parse_args()
    ckpt_dir = pathlib.Path(args.ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    cfg = Cfg()
    model = torch.nn.Linear(cfg.width, cfg.width)
    step = 0
    if args.resume:
        state = torch.load(args.resume, weights_only=False)  # the script's own file, its own classes
        assert isinstance(state["cfg"], Cfg) and isinstance(state["out_dir"], pathlib.Path)
        model.load_state_dict(state["model"])
        step = state["step"]
        print(f"resumed from {args.resume} at step {step}", flush=True)
    saves = 0
    while step < args.steps:
        step += 1
        print(f"step {step} loss 0.5", flush=True)
        time.sleep(0.05)
        if step % args.save_every == 0:
            torch.save({"model": model.state_dict(), "step": step, "cfg": cfg, "out_dir": ckpt_dir},
                       ckpt_dir / f"step={step}.ckpt")
            saves += 1
            if args.crash_after_saves and not args.resume and saves >= args.crash_after_saves:
                time.sleep(0.6)  # let the watch see the save land
                os.kill(os.getpid(), signal.SIGSEGV)
    print("done", flush=True)


if __name__ == "__main__":
    main()
