"""Which node is slow: per-rank step times from the client's heartbeats, compared across nodes. Pure.

A job-wide slowdown says that the run got slower, not where. Every heartbeat carries its rank, its
host and its step, and the loop knows when it arrived: two heartbeats of one rank give that rank's
time per step (receive-time difference over step difference). Heartbeats are sparse (at most 5/s
on rank 0 and one every 2 s on the other ranks), so each sample spans several steps, which is
fine: a sample is the mean time per step over its span. A rank that reports its own measured step
time (``client.heartbeat(step, step_time=...)``) is taken at its word instead.

A node is slow when the median step time of its ranks' samples within ``slow_node.window`` (at
least ``slow_node.min_samples`` of them) is over ``slow_node.factor`` times its peers' (the median
of the other nodes' medians), at every evaluation for ``slow_node.min_duration`` seconds.
Comparing with the *other* nodes (not with all ranks) keeps a two-node job decidable; comparing
node medians keeps an evaluation cheap for thousands of ranks.

What this cannot see: in synchronous data-parallel training every rank waits for the slowest in
each collective, so all ranks report the same step times and no node stands out (the job-wide
slowdown still fires). There, the ranks must report their own compute time (``step_time``) for the
slow node to be named. Without a client there are no per-rank reports at all; per-node supervisors
(one event log per node) are not compared here.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

from ..config import SlowNodeConfig

EVALUATE_EVERY = 5.0  # seconds between evaluations: the medians are not worth a tick's time
MAX_RANKS = 4096  # ranks remembered (heartbeats are authenticated; the bound is for memory)
SAMPLES_PER_RANK = 128


@dataclass(frozen=True)
class SlowNode:
    """The verdict: ``node`` stepped ``ratio`` times slower than its peers for ``duration`` seconds."""

    node: str
    ranks: tuple[int, ...]
    step_time: float  # median seconds per step of the node's ranks
    peer_step_time: float  # median seconds per step of the other nodes' ranks
    ratio: float
    factor: float
    since: float  # when the node was first seen slow in this episode
    duration: float
    samples: int  # the node's samples since then
    peers: tuple[str, ...]
    reason: str

    def to_event(self) -> dict[str, Any]:
        """The ``slow_node`` event's fields (the loop adds ``attempt`` and ``action``)."""
        return {"node": self.node, "ranks": list(self.ranks[:64]), "step_time": round(self.step_time, 6),
                "peer_step_time": round(self.peer_step_time, 6), "ratio": round(self.ratio, 3),
                "factor": self.factor, "since": round(self.since, 3), "duration": round(self.duration, 3),
                "samples": self.samples, "peers": list(self.peers[:16]), "reason": self.reason}


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


def _median_without(ordered: list[float], index: int) -> float:
    """The median of ``ordered`` (sorted) without its element at ``index``, in O(1)."""
    n = len(ordered) - 1

    def at(k: int) -> float:
        return ordered[k] if k < index else ordered[k + 1]

    mid = n // 2
    return at(mid) if n % 2 else (at(mid - 1) + at(mid)) / 2.0


@dataclass
class _Rank:
    host: str
    last_step: int | None = None
    last_at: float | None = None
    samples: deque[tuple[float, float]] | None = None  # (received at, seconds per step)


class SlowNodeTracker:
    """Fed every heartbeat by the run loop; :meth:`verdict` names a slow node once per episode."""

    def __init__(self, cfg: SlowNodeConfig, evaluate_every: float = EVALUATE_EVERY) -> None:
        self.cfg = cfg
        self.evaluate_every = evaluate_every
        self._ranks: dict[int, _Rank] = {}
        self._slow_since: dict[str, float] = {}
        self._reported: set[str] = set()
        self._next_evaluation = -math.inf
        self.ignored = 0  # heartbeats not used: no host, too many ranks, not a number

    def observe(self, rank: int | None, host: str | None, step: int, now: float,
                step_time: float | None = None) -> None:
        """A heartbeat of ``rank`` on ``host`` at ``step``, received at ``now``. ``step_time``: the
        rank's own measured seconds per step, when it reports one."""
        if not host or isinstance(step, bool) or not isinstance(step, int):
            self.ignored += 1
            return
        key = 0 if rank is None else rank
        state = self._ranks.get(key)
        if state is None:
            if len(self._ranks) >= MAX_RANKS:
                self.ignored += 1
                return
            state = self._ranks[key] = _Rank(host=host, samples=deque(maxlen=SAMPLES_PER_RANK))
        assert state.samples is not None
        if state.host != host:  # the rank moved (a restart elsewhere): its history is another node's
            state.host, state.last_step, state.last_at = host, None, None
            state.samples.clear()
        if step_time is not None and not isinstance(step_time, bool) and math.isfinite(step_time) and step_time > 0:
            state.samples.append((now, float(step_time)))
        elif (state.last_step is not None and state.last_at is not None and step > state.last_step
              and now > state.last_at):
            state.samples.append((now, (now - state.last_at) / (step - state.last_step)))
        if state.last_step is None or step != state.last_step:
            state.last_step, state.last_at = step, now

    def _by_host(self, now: float) -> dict[str, tuple[list[int], list[tuple[float, float]]]]:
        horizon = now - self.cfg.window
        hosts: dict[str, tuple[list[int], list[tuple[float, float]]]] = {}
        for rank, state in self._ranks.items():
            assert state.samples is not None
            while state.samples and state.samples[0][0] < horizon:
                state.samples.popleft()
            if not state.samples:
                continue
            ranks, samples = hosts.setdefault(state.host, ([], []))
            ranks.append(rank)
            samples.extend(state.samples)
        return hosts

    def verdict(self, now: float) -> SlowNode | None:
        """The slowest node that has been slow long enough and not yet reported in this episode."""
        if now < self._next_evaluation:
            return None
        self._next_evaluation = now + self.evaluate_every
        hosts = self._by_host(now)
        if len(hosts) < 2:
            self._slow_since.clear()
            self._reported.clear()
            return None
        medians = {h: _median([s for _, s in samples]) for h, (_, samples) in hosts.items()}
        names = sorted(medians, key=lambda h: medians[h])
        ordered = [medians[h] for h in names]
        best: SlowNode | None = None
        for index, host in enumerate(names):
            ranks, samples = hosts[host]
            peer = _median_without(ordered, index)
            ratio = medians[host] / peer if peer > 0 else 0.0
            if ratio <= self.cfg.factor or len(samples) < self.cfg.min_samples:
                self._slow_since.pop(host, None)
                self._reported.discard(host)
                continue
            since = self._slow_since.setdefault(host, now)
            if host in self._reported or now - since < self.cfg.min_duration:
                continue
            peer_names = tuple(h for h in sorted(hosts) if h != host)
            reason = (f"node {host} (ranks {', '.join(map(str, sorted(ranks)[:8]))}"
                      f"{', ...' if len(ranks) > 8 else ''}) took {medians[host]:.3g} s a step, {ratio:.2f} x the "
                      f"{peer:.3g} s of the other nodes (limit {self.cfg.factor:g} x), for {now - since:.0f} s; "
                      f"{len(samples)} samples in the last {self.cfg.window:g} s")
            verdict = SlowNode(node=host, ranks=tuple(sorted(ranks)), step_time=medians[host], peer_step_time=peer,
                               ratio=ratio, factor=self.cfg.factor, since=since, duration=now - since,
                               samples=len(samples), peers=peer_names, reason=reason)
            if best is None or verdict.ratio > best.ratio:
                best = verdict
        if best is not None:
            self._reported.add(best.node)
        return best
