"""A slow node is named: per-rank step times from sparse heartbeats, compared across nodes.

The pure tests feed heartbeats at the client's real rates (rank 0 every 0.2 s, other ranks every
2 s). The last test runs two real processes with the real client against a real control server;
the slowed one runs in a UTS namespace of its own (``unshare -u``) so that it reports another host
name, as a rank on a second node would.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from supervisor.config import SlowNodeConfig, load_config
from supervisor.control import ControlServer, new_token
from supervisor.errors import ConfigError
from supervisor.addons.slownode import EVALUATE_EVERY, SlowNodeTracker

REPO = Path(__file__).resolve().parent.parent
CFG = SlowNodeConfig(factor=1.3, min_samples=5, min_duration=60.0, window=300.0)


def run_job(tracker: SlowNodeTracker, step_time: dict[str, float], ranks: dict[int, str], seconds: float,
            start: float = 0.0, tick: float = 0.2) -> list[tuple[float, str]]:
    """Simulate ranks stepping at their node's pace; each rank sends a heartbeat at the client's
    rate (0.2 s on rank 0, 2 s elsewhere). Returns (time, node) of every verdict."""
    verdicts = []
    next_beat = {rank: start for rank in ranks}
    now = start
    while now <= start + seconds:
        for rank, host in ranks.items():
            if now >= next_beat[rank]:
                step = int((now - start) / step_time[host])
                tracker.observe(rank, host, step, now)
                next_beat[rank] = now + (0.2 if rank == 0 else 2.0)
        found = tracker.verdict(now)
        if found is not None:
            verdicts.append((now, found.node))
        now = round(now + tick, 6)
    return verdicts


def test_a_node_persistently_slower_than_its_peers_is_named_after_the_minimum_duration() -> None:
    tracker = SlowNodeTracker(CFG)
    ranks = {0: "n1", 1: "n1", 2: "n2", 3: "n2"}
    verdicts = run_job(tracker, {"n1": 0.10, "n2": 0.16}, ranks, seconds=200.0)
    assert [node for _, node in verdicts] == ["n2"]  # once per episode, never the fast node
    when = verdicts[0][0]
    assert CFG.min_duration <= when <= CFG.min_duration + 3 * 2.0 + 2 * EVALUATE_EVERY


def test_the_verdict_carries_the_numbers_and_a_reason() -> None:
    tracker = SlowNodeTracker(CFG)
    found = []
    for now_step in range(400):
        now = now_step * 0.5
        tracker.observe(0, "fast", int(now / 0.1), now)
        tracker.observe(1, "slow", int(now / 0.2), now)
        verdict = tracker.verdict(now)
        if verdict:
            found.append(verdict)
    (slow,) = found
    assert slow.node == "slow" and slow.ranks == (1,) and slow.peers == ("fast",)
    assert slow.ratio == pytest.approx(2.0, rel=0.1) and slow.step_time == pytest.approx(0.2, rel=0.1)
    assert slow.duration >= CFG.min_duration and slow.samples >= CFG.min_samples
    event = slow.to_event()
    assert event["node"] == "slow" and event["factor"] == CFG.factor and "slow" in event["reason"]


def test_among_many_nodes_only_the_slow_one_is_named() -> None:
    tracker = SlowNodeTracker(CFG)
    hosts = [f"n{i}" for i in range(8)]
    pace = {h: 0.10 + 0.004 * i for i, h in enumerate(hosts)}  # healthy nodes differ a little
    pace["n5"] = 0.15
    ranks = {r: hosts[r // 2] for r in range(16)}
    assert [n for _, n in run_job(tracker, pace, ranks, seconds=150.0)] == ["n5"]


def test_a_node_within_the_factor_is_not_named() -> None:
    tracker = SlowNodeTracker(CFG)
    assert run_job(tracker, {"n1": 0.10, "n2": 0.12}, {0: "n1", 1: "n2"}, seconds=300.0) == []


def test_synchronous_ranks_stepping_together_name_no_node() -> None:
    """All-reduce makes every rank as slow as the slowest: nothing to attribute, and nothing falsely named."""
    tracker = SlowNodeTracker(CFG)
    assert run_job(tracker, {"n1": 0.3, "n2": 0.3, "n3": 0.3}, {0: "n1", 1: "n2", 2: "n3"}, seconds=300.0) == []


def test_rank_reported_step_times_name_the_slow_node_of_a_synchronous_job() -> None:
    tracker = SlowNodeTracker(CFG)
    named = []
    for i in range(200):
        now = i * 1.0
        tracker.observe(0, "n1", i, now, step_time=0.080)  # the same global step everywhere ...
        tracker.observe(1, "n2", i, now, step_time=0.150)  # ... but n2's own compute takes longer
        verdict = tracker.verdict(now)
        if verdict:
            named.append(verdict.node)
    assert named == ["n2"]


def test_one_node_alone_is_never_called_slow() -> None:
    tracker = SlowNodeTracker(CFG)
    assert run_job(tracker, {"n1": 0.5}, {0: "n1", 1: "n1"}, seconds=200.0) == []


def test_a_short_hiccup_is_not_a_slow_node() -> None:
    tracker = SlowNodeTracker(CFG)
    ranks = {0: "n1", 1: "n2"}
    run_job(tracker, {"n1": 0.1, "n2": 0.1}, ranks, seconds=100.0)
    # n2 slow for 30 s (less than min_duration), then back to normal: its samples age out
    assert run_job(tracker, {"n1": 0.1, "n2": 0.3}, ranks, seconds=30.0, start=100.0) == []
    fresh = SlowNodeTracker(CFG)
    assert run_job(fresh, {"n1": 0.1, "n2": 0.3}, ranks, seconds=30.0) == []


def test_a_node_slow_again_after_recovering_is_named_again() -> None:
    cfg = SlowNodeConfig(factor=1.3, min_samples=5, min_duration=30.0, window=40.0)
    tracker = SlowNodeTracker(cfg)
    ranks = {0: "n1", 1: "n2"}
    first = run_job(tracker, {"n1": 0.1, "n2": 0.3}, ranks, seconds=120.0)
    run_job(tracker, {"n1": 0.1, "n2": 0.1}, ranks, seconds=120.0, start=1000.0)  # recovered: episode over
    again = run_job(tracker, {"n1": 0.1, "n2": 0.3}, ranks, seconds=120.0, start=5000.0)
    assert [n for _, n in first] == ["n2"] and [n for _, n in again] == ["n2"]


@pytest.mark.parametrize("key, value", [("factor", "1.0"), ("action", "kill"), ("min_samples", "0")])
def test_bad_slow_node_settings_are_refused_with_the_key(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=f"slow_node.{key}"):
        load_config(environ={f"SUPERVISE_SLOW_NODE__{key.upper()}": value})


RANK_SCRIPT = textwrap.dedent("""
    import os, sys, time
    from supervisor import client
    step_time, seconds = float(sys.argv[1]), float(sys.argv[2])
    end = time.monotonic() + seconds
    step = 0
    while time.monotonic() < end:
        time.sleep(step_time)   # the "work" of one step
        step += 1
        client.heartbeat(step)
""")


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-u", "sh", "-c", "hostname slownode-probe && hostname"],
                           capture_output=True, text=True, check=False)
    return probe.returncode == 0 and probe.stdout.strip() == "slownode-probe"


@pytest.mark.skipif(not _unshare_works(), reason="needs `unshare -u` (root or CAP_SYS_ADMIN) to give the "
                    "slowed rank a host name of its own; the pure tests above cover the attribution")
def test_two_real_ranks_with_the_real_client_the_slowed_node_is_named(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    server = ControlServer(new_token()).start()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERVISOR_", "RANK", "SLURM_"))}
        env.update(PYTHONPATH=str(REPO), SUPERVISOR_CONTROL=server.address, SUPERVISOR_KEY=server.token,
                   SUPERVISOR_ATTEMPT="1")
        seconds = 11.0
        fast = subprocess.Popen([sys.executable, str(script), "0.01", str(seconds)], env={**env, "RANK": "0"})
        slow = subprocess.Popen(["unshare", "-u", "sh", "-c", 'hostname node-b && exec "$@"', "sh",
                                 sys.executable, str(script), "0.03", str(seconds)], env={**env, "RANK": "1"})
        tracker = SlowNodeTracker(SlowNodeConfig(factor=1.3, min_samples=3, min_duration=2.0, window=60.0),
                                  evaluate_every=0.5)
        hosts: set[str] = set()
        named = []
        deadline = time.monotonic() + seconds + 10
        while (fast.poll() is None or slow.poll() is None) and time.monotonic() < deadline:
            for msg in server.poll():
                step = msg.fields.get("step")
                if str(getattr(msg.kind, "value", msg.kind)) == "heartbeat" and isinstance(step, int):
                    hosts.add(str(msg.host))
                    tracker.observe(msg.rank, msg.host, step, msg.received_at)
            verdict = tracker.verdict(time.time())
            if verdict is not None:
                named.append(verdict)
            time.sleep(0.02)
        assert fast.wait(10) == 0 and slow.wait(10) == 0
    finally:
        server.close()
    assert "node-b" in hosts and len(hosts) == 2, hosts
    assert [v.node for v in named] == ["node-b"], [v.reason for v in named]
    assert named[0].ratio > 1.3 and named[0].ranks == (1,)
