"""A zero-code training that saves its checkpoints to a directory of its own (argv[1]), outside the
run directory the supervisor watches, and has no way to resume. ``CRASH_AT="1:25"`` dereferences NULL
(a real SIGSEGV) after that step in that attempt (``SUPERVISOR_ATTEMPT``). No torch."""

import ctypes
import os
import sys
import time

out = sys.argv[1]
crash = dict(item.split(":") for item in os.environ.get("CRASH_AT", "").split(",") if item)
crash_at = int(crash.get(os.environ.get("SUPERVISOR_ATTEMPT", "1"), -1))
os.makedirs(out, exist_ok=True)
for step in range(0, 41):
    print(f"step {step} loss {1.0 / (step + 1):.4f}", flush=True)
    if step and step % 10 == 0:
        path = os.path.join(out, f"model_{step}.pt")
        print(f"saving checkpoint to {path}", flush=True)
        with open(path, "wb") as fh:
            fh.write(b"weights" * 100)
    if step == crash_at:
        time.sleep(0.3)  # let the supervisor read the save line before the crash
        ctypes.string_at(0)
    time.sleep(0.01)
print("done", flush=True)
