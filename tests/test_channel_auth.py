"""The control channel is authenticated (issue #13 item 2): an HMAC tag with a per-run key that
never travels, checked before parsing; replays rejected; every per-sender table bounded; flood
detection for the loop; bound to the advertised address; broadcasts authenticated for the client;
an older client's datagrams dropped and counted (they carry no tag), never a crash. Real sockets and processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import REPO, run_supervise
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor import control
from supervisor.control import (
    REPLAY_WINDOW,
    ControlServer,
    ControlStats,
    Kind,
    SeqTracker,
    check_sequence,
    encode,
    flood_verdict,
    new_token,
    parse_address,
    seal,
)


def _drain(server: ControlServer, received: int, timeout: float = 5.0) -> list[control.Message]:
    out: list[control.Message] = []
    deadline = time.monotonic() + timeout
    while server.stats.received < received and time.monotonic() < deadline:
        out.extend(server.poll())
        time.sleep(0.002)
    return out


@pytest.fixture
def server():
    srv = ControlServer(new_token()).start()
    yield srv
    srv.close()


@pytest.fixture
def sender():
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    yield sock
    sock.close()


# --------------------------------------------------------------------------------- replays


def test_a_sequence_number_is_accepted_once_and_late_ones_within_the_window() -> None:
    window = None
    accepted = []
    for seq in (1, 2, 5, 3, 3, 5, 4, 2):
        verdict = check_sequence(window, seq)
        window = verdict.window
        accepted.append(verdict.ok)
    assert accepted == [True, True, True, True, False, False, True, False]
    far = check_sequence(window, 5 + REPLAY_WINDOW + 10).window  # a jump forward
    assert not check_sequence(far, 5).ok  # now too old to tell from a replay


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=300), max_size=200))
def test_no_sequence_number_is_ever_accepted_twice(seqs: list[int]) -> None:
    window = None
    seen: set[int] = set()
    for seq in seqs:
        verdict = check_sequence(window, seq)
        if verdict.ok:
            assert seq not in seen
            seen.add(seq)
        window = verdict.window


def test_a_replayed_datagram_is_dropped_and_counted(server: ControlServer, sender: socket.socket) -> None:
    first = seal(Kind.HEARTBEAT, server.key, 77, 1, 0, step=1)
    second = seal(Kind.HEARTBEAT, server.key, 77, 2, 0, step=2)
    third = seal(Kind.HEARTBEAT, server.key, 77, 3, 0, step=3)
    for data in (first, third, second, first, third):  # reordered (kept), then two replays
        sender.sendto(data, parse_address(server.address))
    messages = _drain(server, 5)
    assert [m.get("step") for m in messages] == [1, 3, 2]
    assert server.stats.replay == 2 and server.stats.accepted == 3


def test_the_key_never_travels(server: ControlServer) -> None:
    key = server.key
    for data in (encode(Kind.HEARTBEAT, key, step=1, metrics={"loss": 0.5}), encode(Kind.HELLO, key, reply_port=9)):
        assert key.encode() not in data and bytes.fromhex(key) not in data
    assert server.child_env() == {"SUPERVISOR_CONTROL": server.address, "SUPERVISOR_KEY": key}
    assert key not in server.address


# --------------------------------------------------------------------------------- bounded tables


def test_every_per_sender_table_is_bounded(monkeypatch: pytest.MonkeyPatch, sender: socket.socket) -> None:
    monkeypatch.setattr(control, "MAX_CLIENTS", 50)
    monkeypatch.setattr(control, "MAX_SENDERS", 60)
    with ControlServer(new_token()) as server:
        address = parse_address(server.address)
        total = 0
        for i in range(1, 2001):  # 2,000 senders, each with its own host name and reply port
            sender.sendto(seal(Kind.HELLO, server.key, i, 1, 0, host=f"host-{i}-" + "x" * 200,
                               reply_port=1024 + i), address)
            total += 1
            if i % 200 == 0:
                _drain(server, total)
        _drain(server, total)
        assert server.stats.accepted == 2000
        assert len(server.clients) == 50 and len(server._senders) == 60
        assert [c.host for c in server.clients][-1].startswith("host-2000-")  # the newest are kept


def test_a_tracker_forgets_the_least_recently_seen_sender() -> None:
    tracker = SeqTracker(capacity=2)
    assert tracker.accept(1, 1) and tracker.accept(2, 1)
    assert tracker.accept(1, 2)  # sender 1 is now the most recent
    assert tracker.accept(3, 1)  # evicts sender 2
    assert len(tracker) == 2 and tracker.evicted == 1
    assert not tracker.accept(1, 2)  # still remembered: a replay


# --------------------------------------------------------------------------------- flood detection


def test_flooded_looks_back_over_its_window_only(sender: socket.socket) -> None:
    now = [1000.0]
    with ControlServer(new_token(), clock=lambda: now[0]) as server:
        address = parse_address(server.address)
        assert not server.flooded()
        forged = encode(Kind.HEARTBEAT, "not the key", step=1)
        for _ in range(1500):
            sender.sendto(forged, address)
        while server.poll(max_messages=4096):
            pass
        verdict = server.flood_check(window=10.0)
        assert verdict.flooded and verdict.rejected + verdict.kernel_dropped >= 1000
        now[0] += 11.0
        server.poll()
        assert not server.flooded(window=10.0)  # the flood is over: silence means something again
        assert server.flooded(window=60.0)


def test_flood_verdict_names_what_it_saw() -> None:
    quiet = flood_verdict(ControlStats(), ControlStats(accepted=100), 10.0)
    assert not quiet.flooded and quiet.reason == "no flood in the last 10 s"
    dropped = flood_verdict(ControlStats(flood=3), ControlStats(flood=9), 10.0)
    assert dropped.flooded and dropped.kernel_dropped == 6 and "kernel dropped 6" in dropped.reason
    forged = flood_verdict(ControlStats(bad_token=10), ControlStats(bad_token=1010), 10.0)
    assert forged.flooded and forged.rejected == 1000
    few = flood_verdict(ControlStats(), ControlStats(bad_token=5, replay=3), 10.0)
    assert not few.flooded and few.rejected == 8


def test_a_saturated_poll_counts_as_a_flood(server: ControlServer, sender: socket.socket) -> None:
    for step in range(20):
        sender.sendto(encode(Kind.HEARTBEAT, server.key, step=step), parse_address(server.address))
    time.sleep(0.05)
    server.poll(max_messages=5)  # datagrams left queued: the loop is behind
    assert server.stats.saturated == 1 and server.flooded()


# --------------------------------------------------------------------------------- binding


def _non_loopback_ipv4() -> str | None:
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("10.255.255.255", 9))
        address = probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()
    return None if address.startswith(("127.", "0.")) else address


def test_the_server_binds_the_advertised_address_only() -> None:
    other = _non_loopback_ipv4()
    if other is None:
        pytest.skip("this host has no non-loopback IPv4 address to test against")
    with ControlServer(new_token(), environ={"SUPERVISOR_CONTROL_HOST": "127.0.0.1"}) as server:
        assert server.bound_host == "127.0.0.1" and server.bind_fallback is None
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.sendto(encode(Kind.HEARTBEAT, server.key, step=1), (other, server.port))  # another interface
            sock.sendto(encode(Kind.HEARTBEAT, server.key, step=2), ("127.0.0.1", server.port))
            messages = _drain(server, 1)
            time.sleep(0.1)
            messages += server.poll()
        finally:
            sock.close()
        assert [m.get("step") for m in messages] == [2]


def test_an_advertised_address_that_is_not_ours_falls_back_to_every_interface() -> None:
    with ControlServer(new_token(), environ={"SUPERVISOR_CONTROL_HOST": "192.0.2.7"}) as server:  # TEST-NET-1
        assert server.bound_host == "0.0.0.0" and "192.0.2.7" in (server.bind_fallback or "")
        assert parse_address(server.address)[0] == "192.0.2.7"  # still what other nodes are told


# --------------------------------------------------------------------------------- the client side


CLIENT = textwrap.dedent("""\
    import sys, time
    from supervisor import client
    print("ready", client.enabled(), flush=True)
    deadline = time.monotonic() + float(sys.argv[1])
    while time.monotonic() < deadline and not client.should_stop():
        client.heartbeat(1)
        time.sleep(0.01)
    print("stop:", client.stop_reason(), "save:", client.save_requested(), flush=True)
""")


def _client_env(server: ControlServer, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERVISOR_", "RANK", "SLURM_PROCID"))}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(server.child_env())
    env.update(extra)
    return env


def _hello(server: ControlServer, timeout: float = 10.0) -> control.ClientInfo:
    deadline = time.monotonic() + timeout
    while not server.clients and time.monotonic() < deadline:
        server.poll()
        time.sleep(0.005)
    assert server.clients, "the client never said hello"
    return server.clients[0]


def test_the_client_ignores_forged_misaddressed_and_replayed_broadcasts(server: ControlServer) -> None:
    proc = subprocess.Popen([sys.executable, "-c", CLIENT, "30"], env=_client_env(server),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().split() == ["ready", "True"]
        info = _hello(server)
        assert info.address[0] == "127.0.0.1" or info.address[0] == parse_address(server.address)[0]
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            forged = [
                seal(Kind.STOP, "a guessed key", 5, 1, info.sender_id, reason="forged", deadline=None),
                seal(Kind.STOP, server.key, 5, 1, info.sender_id + 1, reason="for another client", deadline=None),
                seal(Kind.SAVE_NOW, server.key, 5, 2, 0, deadline=None),  # no recipient
                b'{"v":1,"kind":"stop","token":"%s","reason":"protocol 1"}' % server.key.encode(),
            ]
            replayed = seal(Kind.ABORT_SAVE, server.key, 6, 1, info.sender_id, path="x", reason="first")
            for data in forged + [replayed, replayed]:
                sock.sendto(data, info.address)
            time.sleep(0.5)  # the client drains every 10 ms: all of it has been read and judged
            assert proc.poll() is None  # not stopped
            server.broadcast(Kind.STOP, reason="genuine", deadline=None)
        finally:
            sock.close()
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "stop: genuine save: False" in out, (out, err)


OLD_CLIENT_COMMIT = "7e34a0e"  # the last commit that spoke protocol 1


def test_an_older_client_is_dropped_as_unauthenticated_and_never_crashes_the_server(
        server: ControlServer, tmp_path: Path) -> None:
    old = tmp_path / "old" / "supervisor"
    old.mkdir(parents=True)
    for name in ("__init__.py", "client.py", "control.py"):
        shown = subprocess.run(["git", "-C", str(REPO), "show", f"{OLD_CLIENT_COMMIT}:supervisor/{name}"],
                               capture_output=True, text=True, check=False)
        if shown.returncode != 0:
            pytest.skip(f"no git history to take the protocol-1 client from: {shown.stderr.strip()}")
        (old / name).write_text(shown.stdout)
    env = _client_env(server, SUPERVISOR_TOKEN="unused")  # an old loop also exported a token
    env["PYTHONPATH"] = str(tmp_path / "old")
    # -S and cwd: neither the editable install nor the working directory shadows the old package
    proc = subprocess.run([sys.executable, "-S", "-c", "import supervisor.client as c; print(c.__file__)\n" + CLIENT,
                           "0.5"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(str(old)), proc.stdout  # the protocol-1 client it is
    assert "ready True" in proc.stdout  # the old client thinks it is connected ...
    _drain(server, 2)
    stats = server.stats
    assert stats.accepted == 0 and stats.bad_token >= 2  # ... and is dropped, counted, harmlessly
    assert server.poll() == []


# --------------------------------------------------------------------------------- the record


def test_the_key_is_never_written_to_the_run_directory(tmp_path: Path) -> None:
    """The child learns the key from its environment; no event, manifest or file of the run holds it."""
    spill = tmp_path / "key-seen-by-the-child.txt"
    code = ("import os; from supervisor import client; client.heartbeat(1); client.done(1); "
            f"open({str(spill)!r}, 'w').write(os.environ.get('SUPERVISOR_KEY') or os.environ['SUPERVISOR_TOKEN'])")
    run_dir = tmp_path / "run"
    res = run_supervise(["run", "--run-dir", str(run_dir), "--quiet", "--", sys.executable, "-c", code])
    assert res.returncode == 0, res.stderr[-3000:]
    key = spill.read_text()
    assert len(key) == 32
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert any(p.name == "events.jsonl" for p in files)
    for path in files:
        assert key not in path.read_text(errors="replace"), f"the key is in {path}"
