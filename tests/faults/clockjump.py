"""Run ``supervise`` with its wall clock stepped by the number of seconds in a file: a faketime
stand-in for fault trial 6c (libfaketime is not installed here, and the real system clock of a
shared machine must not be changed).

    python tests/faults/clockjump.py OFFSET_FILE run --run-dir R -- python train.py

``time.time()`` of this process returns the real time plus the file's value (re-read every 20 ms),
so writing ``7200`` to the file looks to the supervisor exactly like an NTP step of two hours.
``time.monotonic()`` is left alone, as the kernel leaves it alone when the wall clock steps. The
training child runs on the real clock.
"""

from __future__ import annotations

import sys
import threading
import time

_real_time = time.time
_offset = 0.0


def _follow(path: str) -> None:
    global _offset
    while True:
        try:
            with open(path) as handle:
                _offset = float(handle.read().strip() or 0)
        except (OSError, ValueError):
            pass
        time.sleep(0.02)


def main() -> None:
    path = sys.argv[1]
    threading.Thread(target=_follow, args=(path,), daemon=True, name="clockjump").start()
    time.time = lambda: _real_time() + _offset  # type: ignore[assignment]
    sys.argv = ["supervise", *sys.argv[2:]]
    from supervisor.cli import main as supervise

    supervise()


if __name__ == "__main__":
    main()
