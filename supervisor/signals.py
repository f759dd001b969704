"""Signal handlers only record; the run loop decides (a handler never does work)."""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable


@dataclass(frozen=True)
class ReceivedSignal:
    signum: int
    received_at: float

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


def signal_name(signum: int) -> str:
    """``SIGSEGV`` for 11; ``signal 99`` for a number that names no signal here."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def parse_signal(text: str | int) -> int:
    """``SEGV``, ``SIGSEGV``, ``sigsegv`` or ``11`` to 11; ValueError names what is allowed."""
    if isinstance(text, int):
        value = text
    else:
        raw = text.strip()
        if raw.lstrip("-").isascii() and raw.lstrip("-").isdigit() and len(raw) <= 4:
            value = abs(int(raw))
        else:
            name = raw.upper()
            name = name if name.startswith("SIG") else "SIG" + name
            try:
                value = int(signal.Signals[name])
            except KeyError:
                raise ValueError(f"unknown signal {text!r}; use a name like SEGV or SIGSEGV, or a number like 11") \
                    from None
    if not 1 <= value <= 64:
        raise ValueError(f"signal number {value} is out of range (1-64)")
    return value


def signal_number(name: str) -> int:
    """'TERM', 'SIGTERM' or '15' to a signal number."""
    text = name.strip().upper()
    if text.isdigit():
        return int(text)
    if not text.startswith("SIG"):
        text = "SIG" + text
    return int(signal.Signals[text])


class SignalInbox:
    """Collects the signals the supervisor receives, in order, for the loop to act on."""

    def __init__(self, signums: Iterable[int], clock: Callable[[], float] = time.time) -> None:
        self._signums = sorted(set(signums))
        self._clock = clock
        self._pending: list[ReceivedSignal] = []
        self._lock = threading.Lock()
        self._previous: dict[int, object] = {}
        self.event = threading.Event()

    def install(self) -> None:
        for signum in self._signums:
            self._previous[signum] = signal.signal(signum, self._record)

    def uninstall(self) -> None:
        for signum, prev in self._previous.items():
            signal.signal(signum, prev)  # type: ignore[arg-type]
        self._previous.clear()

    def _record(self, signum: int, _frame: object) -> None:
        self._pending.append(ReceivedSignal(signum, self._clock()))
        self.event.set()

    def drain(self) -> list[ReceivedSignal]:
        pending, self._pending = self._pending, []
        self.event.clear()
        return pending

    def wait(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` but wake at once when a signal arrives."""
        return self.event.wait(timeout)
