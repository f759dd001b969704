"""A checkpoint writer to kill -9 at random moments (fault trials 1 and 2).

Started once per test session as a *zygote*: it imports torch (seconds on a loaded 2-core machine)
and then forks one saver per trial on request (milliseconds), so hundreds of kills fit in minutes.
Each saver is a real process writing real ``torch.save`` files until it is SIGKILLed; nothing is
simulated. Protocol on stdin/stdout, one JSON object per line:

    {"cmd": "spawn", "mode": "atomic"|"plain", "dir": D, "journal": J, "bytes": N, "pause": S, "keep": K,
     "stop_at": k|null, "paused": F|null}                         -> {"pid": P}
    {"cmd": "reap", "pid": P}  -> {"status": <waitpid status>}

The saver appends ``<monotonic s> begin N``, ``written N`` (the step file is complete; ``last.ckpt``
and retention follow) and ``end N`` to the journal around every save with ``os.write`` (in the kernel as soon as the call returns: a kill -9 cannot lose a line),
so the driver knows the last save that completed and where in the save loop its kill landed.

``stop_at``: a pause point in the writer. The step file of save ``k`` is written half-way (through
the product's own path: ``client.save``'s temp file in atomic mode, the file itself in plain mode),
then the saver writes ``paused`` and waits to be killed: a kill placed mid-write every time, never
hoped for by timing.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def stop_half_way(real_save: Any, paused: Path) -> Any:
    """A ``torch.save`` that writes half of the archive where it was asked to, then says so in
    ``paused`` and waits for the kill -9."""

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        buf = io.BytesIO()
        real_save(obj, buf, *args, **kwargs)
        data = buf.getvalue()
        fh = open(f, "wb") if isinstance(f, (str, os.PathLike)) else f  # noqa: SIM115 - never closed: killed
        fh.write(data[: len(data) // 2])
        fh.flush()
        tmp = paused.with_name(paused.name + ".tmp")
        tmp.write_text("paused mid-write")
        os.replace(tmp, paused)
        while True:
            time.sleep(3600)

    return save


def save_loop(mode: str, ckpt_dir: Path, journal: Path, nbytes: int, pause: float, keep: int,
              stop_at: int | None = None, paused: Path | None = None) -> None:
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
        if step == stop_at and paused is not None:
            torch.save = stop_half_way(torch.save, paused)  # client.save looks torch.save up at each call
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
                              int(request.get("keep", 2)), request.get("stop_at"),
                              Path(request["paused"]) if request.get("paused") else None)
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
