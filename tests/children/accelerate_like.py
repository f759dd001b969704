"""A zero-code child shaped like an Accelerate script with
``ProjectConfiguration(automatic_checkpoint_naming=True)``: every save goes to
``<project>/checkpoints/checkpoint_<i>`` (i = 0, 1, 2...: a save index) holding
``model.safetensors`` and ``random_states_0.pkl`` (whose "step" is not the training step). The
training step is kept where the supervisor cannot read it (``meta.json``); the script resumes by
itself from the newest save. ``CRASH_AT=N``: the first attempt sends itself SIGSEGV at step N.
Stdlib only, so it starts fast."""

from __future__ import annotations

import argparse
import json
import os
import pickle
import signal
import struct
import time
from pathlib import Path


def save(directory: Path, step: int) -> None:
    directory.mkdir(parents=True)
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    (directory / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + struct.pack("<2f", step, 0))
    (directory / "random_states_0.pkl").write_bytes(pickle.dumps({"step": 0, "random_state": [1, 2, 3]}, protocol=4))
    (directory / "meta.json").write_text(json.dumps({"step": step}))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--project_dir", required=True)
    p.add_argument("--max_steps", type=int, default=40)
    p.add_argument("--checkpointing_steps", type=int, default=10)
    args = p.parse_args()
    root = Path(args.project_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    saved = sorted((int(d.name.split("_")[1]), d) for d in root.iterdir() if d.name.startswith("checkpoint_"))
    step, index = 0, 0
    if saved:
        index, newest = saved[-1]
        step = json.loads((newest / "meta.json").read_text())["step"]
        index += 1
        print(f"Loading states from {newest}", flush=True)
    crash_at = int(os.environ.get("CRASH_AT", "0")) if os.environ.get("SUPERVISOR_ATTEMPT", "1") == "1" else 0
    while step < args.max_steps:
        time.sleep(0.03)
        step += 1
        print(f"step {step} loss {1.0 / step:.4f}", flush=True)
        if step % args.checkpointing_steps == 0:
            save(root / f"checkpoint_{index}", step)
            index += 1
            time.sleep(0.6)  # the watch sees the save land before the training goes on
        if step == crash_at:
            os.kill(os.getpid(), signal.SIGSEGV)
    print("done", flush=True)


if __name__ == "__main__":
    main()
