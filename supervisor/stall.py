"""How long without progress is a stall: learned from the run itself. Pure.

A fixed ``stall_timeout`` is either too short for a run with long silent phases or too long to be
worth having, so it was off by default and hangs went unnoticed. Instead the timeout is learned
from the gaps between step reports (global steps or progress counters, whatever the loop sees as
progress): after a warm-up of ``stall.warmup_reports`` gaps (or the first save, whichever comes
first), a stall is ``max(stall.floor, stall.multiple x p99 gap, SURVIVED x longest gap)`` seconds
without progress. The p99 of the gaps covers the logging interval too: a script that prints every
100 steps is judged by its print interval, not its step time. A silent phase the run has already
come through (an evaluation pass every few thousand steps, rarer than 1 % of the gaps) is not a
stall the next time either: the longest gap seen, with a margin, is a lower bound. The first such
phase longer than the floor still is one: raise ``stall.floor`` for a run with long silent phases.

Keep one :class:`StallTimeout` for the whole run and call :meth:`StallTimeout.start_attempt` at
each attempt: what was learned carries over a restart, the time between attempts is not a gap.

Before the warm-up ends there is no learned timeout yet, but a child that never reports a step (a
deadlocked start, a stuck rendezvous) must still be caught: ``stall.startup_limit`` seconds without
progress, counted from the attempt start or the last report.

``stall_timeout`` > 0 in the config wins over all of this once the attempt has reported a step
(before that, the startup limit, when it is the longer); ``stall.enabled: false`` turns stall
detection off unless ``stall_timeout`` is set.

The loop's :class:`~supervisor.progress.ProgressTracker` gives the verdict;
:meth:`StallTimeout.limit` says what timeout to hand its ``is_stalled``. (That method allows twice
its timeout before the first progress, as a startup grace; :attr:`StallLimit.tracker_timeout`
takes that into account so the startup limit is what the config says.)
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Literal

from .config import StallConfig

GAP_HISTORY = 1024  # gaps kept; the p99 is taken over these
SURVIVED = 2.0  # the longest gap the run came through, times this, is never a stall

StallPhase = Literal["off", "fixed", "startup", "warmup", "learned"]


@dataclass(frozen=True)
class StallLimit:
    """The stall limit in force now. ``seconds``: what counts as a stall (0 = no verdict);
    ``tracker_timeout``: what to pass to ``ProgressTracker.is_stalled`` for that."""

    seconds: float
    tracker_timeout: float
    phase: StallPhase
    reason: str


def p99(values: list[float]) -> float:
    """The 99th percentile by the nearest-rank method (the largest value below 100 samples)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(math.ceil(0.99 * len(ordered)) - 1, 0)]


class StallTimeout:
    """Learns the stall timeout of one attempt from its progress reports."""

    def __init__(self, cfg: StallConfig, fixed: float = 0.0) -> None:
        self.cfg = cfg
        self.fixed = fixed  # the config's stall_timeout: > 0 wins
        self._gaps: deque[float] = deque(maxlen=GAP_HISTORY)
        self._last_value: int | None = None
        self._last_at: float | None = None
        self._saved = False
        self._longest = 0.0
        self._cached: float | None = None

    def start_attempt(self) -> None:
        """A new attempt starts: its first report is not a gap (the restart in between is not
        progress time); what was learned stays."""
        self._last_value, self._last_at = None, None

    def observe(self, step: int, now: float) -> None:
        """A step (or progress counter) reported at ``now``; a value different from the last one is
        progress, and the time since the previous progress is a gap."""
        if step == self._last_value:
            return
        if self._last_at is not None and now >= self._last_at:
            gap = now - self._last_at
            self._gaps.append(gap)
            self._longest = max(self._longest, gap)
            self._cached = None
        self._last_value, self._last_at = step, now

    def progress(self, now: float) -> None:
        """Progress already judged by the caller (``ProgressTracker.observe`` returned True): the
        time since the previous progress is a gap."""
        if self._last_at is not None and now >= self._last_at:
            gap = now - self._last_at
            self._gaps.append(gap)
            self._longest = max(self._longest, gap)
            self._cached = None
        self._last_value, self._last_at = None, now

    def saved(self) -> None:
        """A checkpoint landed: the run is past its start-up, the learned timeout applies."""
        self._saved = True

    @property
    def gaps(self) -> int:
        return len(self._gaps)

    @property
    def warmed_up(self) -> bool:
        return len(self._gaps) >= self.cfg.warmup_reports or (self._saved and self._last_at is not None)

    def timeout(self) -> float | None:
        """The learned timeout in seconds; None during the warm-up (and when stall detection is
        off). With a fixed ``stall_timeout``, that value."""
        if self.fixed > 0:
            return self.fixed
        if not self.cfg.enabled or not self.warmed_up:
            return None
        if self._cached is None:
            self._cached = max(self.cfg.floor, self.cfg.multiple * p99(list(self._gaps)), SURVIVED * self._longest)
        return self._cached

    def limit(self, never_progressed: bool) -> StallLimit:
        """What a stall is right now, and what to pass to ``ProgressTracker.is_stalled``
        (``never_progressed``: the tracker has seen no progress in this attempt yet)."""
        if self.fixed > 0:
            startup = self.cfg.startup_limit
            if never_progressed and startup > self.fixed:
                # A fixed timeout is a gap between steps; start-up (imports, data, compile, rendezvous)
                # is not one, in any attempt: it gets the startup limit, as a heartbeat timeout gets a
                # separate initial one in other supervisors.
                return StallLimit(startup, startup / 2, "startup",
                                  f"no step reported yet: startup limit {startup:g} s (stall.startup_limit); "
                                  f"stall_timeout {self.fixed:g} s applies from the first step")
            return StallLimit(self.fixed, self.fixed, "fixed", f"stall_timeout {self.fixed:g} s (fixed in the config)")
        if not self.cfg.enabled:
            return StallLimit(0.0, 0.0, "off", "stall detection off (stall.enabled: false)")
        startup = self.cfg.startup_limit
        if never_progressed:
            # Start-up (imports, loading a checkpoint, rendezvous) is not steady state, in every
            # attempt. is_stalled allows twice its timeout before the first progress: hand it half.
            return StallLimit(startup, startup / 2, "startup",
                              f"no step reported yet: startup limit {startup:g} s (stall.startup_limit)")
        learned = self.timeout()
        if learned is not None:
            worst = p99(list(self._gaps))
            return StallLimit(learned, learned, "learned",
                              f"learned stall timeout {learned:.0f} s = max(floor {self.cfg.floor:g} s, "
                              f"{self.cfg.multiple:g} x p99 gap {worst:.3g} s over {len(self._gaps)} gaps, "
                              f"{SURVIVED:g} x longest gap {self._longest:.3g} s)")
        return StallLimit(startup, startup, "warmup",
                          f"warm-up ({len(self._gaps)} of {self.cfg.warmup_reports} gaps, no save yet): "
                          f"startup limit {startup:g} s since the last report")
