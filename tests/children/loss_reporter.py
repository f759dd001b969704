"""A training child that reports what ``supervise status`` shows: its step, its loss and the step it
ends at, through the client like a real script (no torch: it starts fast). It trains until the file
named by ``--stop-file`` appears, so a test decides when it ends, not a clock."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from supervisor import client


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--stop-file", type=Path, required=True)
    p.add_argument("--max-steps", type=int, default=1_000_000)
    p.add_argument("--step-time", type=float, default=0.01)
    args = p.parse_args()
    client.install()
    client.resumed(0)
    step = 0
    while not args.stop_file.exists() and not client.should_stop() and step < args.max_steps:
        step += 1
        client.heartbeat(step, loss=4.0 / (1.0 + step / 100.0), max_steps=args.max_steps)
        time.sleep(args.step_time)
    client.done(step)
    print(f"stopped at step {step}", flush=True)


if __name__ == "__main__":
    main()
