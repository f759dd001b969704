"""A checkpoint writer to kill -9 at random moments (fault trials 1 and 2).

Started once per test session as a *zygote*: it imports torch (seconds on a loaded 2-core machine)
and then forks one saver per trial on request (milliseconds), so hundreds of kills fit in minutes.
Each saver is a real process writing real ``torch.save`` files until it is SIGKILLed; nothing is
simulated. Protocol on stdin/stdout, one JSON object per line:

    {"cmd": "spawn", "mode": "atomic"|"plain", "dir": D, "journal": J, "bytes": N, "pause": S, "keep": K}
        -> {"pid": P}
    {"cmd": "reap", "pid": P}  -> {"status": <waitpid status>}

The saver appends ``<monotonic s> begin N``, ``written N`` (the step file is complete; ``last.ckpt``
and retention follow) and ``end N`` to the journal around every save with ``os.write`` (in the kernel as soon as the call returns: a kill -9 cannot lose a line),
so the driver knows the last save that completed and where in the save loop its kill landed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def save_loop(mode: str, ckpt_dir: Path, journal: Path, nbytes: int, pause: float, keep: int) -> None:
    """Save ``step=<N>.ckpt`` and ``last.ckpt`` over and over, as a training loop does.

    ``atomic``: the product's way (client.save = atomic_torch_save, update_last's hard link,
    retention through prune). ``plain``: the zero-code way (two plain torch.save calls in place,
    like examples/train_zero_code.py), which tears files when killed mid-write."""
    import torch

    from supervisor import client
    from supervisor.checkpoints import prune

    torch.set_num_threads(1)
    pad = torch.ones(nbytes, dtype=torch.uint8)
    fd = os.open(journal, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def note(text: str) -> None:
        os.write(fd, f"{time.monotonic():.6f} {text}\n".encode())

    step = 0
    while True:
        step += 1
        state = {"step": step, "weights": torch.full((256,), float(step)), "pad": pad}
        path = ckpt_dir / f"step={step}.ckpt"
        note(f"begin {step}")
        if mode == "atomic":
            client.save(state, path, step=step)
            note(f"written {step}")
            client.update_last(path, ckpt_dir / "last.ckpt")
            prune(ckpt_dir, keep=keep, protect=[path])
        else:
            torch.save(state, path)
            note(f"written {step}")
            torch.save(state, ckpt_dir / "last.ckpt")
        note(f"end {step}")
        if pause > 0:
            time.sleep(pause)


def zygote() -> None:
    import torch  # noqa: F401  the expensive import, paid once

    from supervisor import client  # noqa: F401
    from supervisor.checkpoints import prune  # noqa: F401

    out = sys.stdout
    for line in sys.stdin:
        request = json.loads(line)
        if request["cmd"] == "spawn":
            pid = os.fork()
            if pid == 0:  # the saver: never returns into the zygote's loop
                try:
                    devnull = os.open(os.devnull, os.O_RDWR)
                    os.dup2(devnull, 0)
                    os.dup2(devnull, 1)
                    save_loop(request["mode"], Path(request["dir"]), Path(request["journal"]),
                              int(request["bytes"]), float(request.get("pause", 0.0)),
                              int(request.get("keep", 2)))
                finally:
                    os._exit(0)
            reply = {"pid": pid}
        elif request["cmd"] == "reap":
            _, status = os.waitpid(int(request["pid"]), 0)
            reply = {"status": status}
        else:
            reply = {"error": f"unknown command {request['cmd']!r}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    zygote()
