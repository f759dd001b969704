"""A zero-code child shaped like nanoGPT's train.py: one ``out/ckpt.pt`` rewritten in place by a
plain ``torch.save``, the step under ``iter_num``, ``--init_from=resume`` to resume from it (the
script knows where its checkpoint is), evaluation lines that name a step of their own
("eval step 0/50"), and a config dump naming a step count. With ``CRASH_AT=N`` the first attempt
sends itself SIGSEGV at iteration N (after a save); ``CRASH_AT=N,M``: attempt 2 crashes at M too.
No supervisor import."""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

import torch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out_dir", required=True)
    p.add_argument("--max_iters", type=int, default=40)
    p.add_argument("--eval_interval", type=int, default=10)
    p.add_argument("--init_from", default="scratch")
    p.add_argument("--iter_time", type=float, default=0.02)
    args = p.parse_args()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    print(f"max step {args.max_iters}", flush=True)  # a config dump: not a step
    print(f"max_steps: {args.max_iters}", flush=True)
    iter_num = 0
    if args.init_from == "resume":
        ckpt = torch.load(out / "ckpt.pt", weights_only=True)
        iter_num = int(ckpt["iter_num"])
        print(f"Resuming training from {out} at iter {iter_num}", flush=True)
    crashes = [int(n) for n in os.environ.get("CRASH_AT", "").split(",") if n]
    attempt = int(os.environ.get("SUPERVISOR_ATTEMPT", "1"))
    crash_at = crashes[attempt - 1] if attempt <= len(crashes) else None
    while True:
        if iter_num % args.eval_interval == 0:
            for k in range(3):
                print(f"eval step {k}/50", flush=True)  # an evaluation loop's own counter
            if iter_num > 0:
                torch.save({"model": {"w": torch.full((4,), float(iter_num))}, "iter_num": iter_num,
                            "best_val_loss": 1.0, "config": {"max_iters": args.max_iters}}, out / "ckpt.pt")
                print(f"saving checkpoint to {out}", flush=True)
        if iter_num >= args.max_iters:
            break
        if iter_num == crash_at:
            os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(args.iter_time)
        print(f"iter {iter_num}: loss {2.0 / (iter_num + 1):.4f}, time 20.00ms, mfu 1.00%", flush=True)
        iter_num += 1
    print("done", flush=True)


if __name__ == "__main__":
    main()
