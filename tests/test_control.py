"""The supervisor's UDP endpoint against hostile and broken input: real sockets, real datagrams."""

from __future__ import annotations

import json
import socket
import time

import pytest

from supervisor.control import (MAX_DATAGRAM, ControlServer, ControlStats, Kind, advertised_host, encode,
                                new_token, parse_address)


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


def target(server: ControlServer) -> tuple[str, int]:
    return parse_address(server.address)


def drain(server: ControlServer, expect_received: int, timeout: float = 5.0) -> list:
    """Poll until the server has read ``expect_received`` datagrams in total."""
    out: list = []
    deadline = time.monotonic() + timeout
    while server.stats.received < expect_received and time.monotonic() < deadline:
        out.extend(server.poll())
        time.sleep(0.002)
    return out


def test_only_well_formed_datagrams_with_the_token_are_accepted(server, sender):
    good = encode(Kind.HEARTBEAT, server.token, rank=2, pid=99, host="n1", attempt=4, step=7,
                  metrics={"loss": float("nan")})
    bad = [
        json.dumps({"v": 1, "kind": "heartbeat", "step": 7}).encode(),  # no token
        encode(Kind.HEARTBEAT, "f" * 32, step=7),  # wrong token
        encode(Kind.HEARTBEAT, server.token[:-1], step=7),  # almost the token
        json.dumps({"kind": "heartbeat", "token": 12345, "step": 7}).encode(),  # token not a string
        b"{not json",
        b"\xff\xfe\x00garbage",
        b"[1, 2, 3]",
        json.dumps({"token": server.token, "kind": "reboot"}).encode(),  # unknown kind
        encode(Kind.STOP, server.token, reason="x", deadline=1.0),  # supervisor->client kind
        encode(Kind.HEARTBEAT, server.token, step="seven"),
        encode(Kind.HEARTBEAT, server.token, step=True),
        encode(Kind.HEARTBEAT, server.token, step=1, metrics={"loss": "low"}),
        encode(Kind.HELLO, server.token, reply_port=70000),
        encode(Kind.SAVE_END, server.token, step=1, path="a", bytes=1, duration=0.1, ok="yes"),
        encode(Kind.HEARTBEAT, server.token, step=1, rank="zero"),
        b"[" * 3000 + b"]" * 3000,  # nested deeper than the recursion limit
        b" " * (MAX_DATAGRAM + 1),  # oversized
        encode(Kind.HEARTBEAT, server.token, step=1, metrics={"m": "x" * MAX_DATAGRAM}),  # oversized
    ]
    for data in bad + [good]:
        sender.sendto(data, target(server))
    messages = drain(server, len(bad) + 1)

    assert len(messages) == 1
    msg = messages[0]
    assert (msg.kind, msg.rank, msg.pid, msg.host, msg.attempt) == (Kind.HEARTBEAT, 2, 99, "n1", 4)
    assert msg.get("step") == 7 and msg.get("metrics")["loss"] != msg.get("metrics")["loss"]  # NaN survives
    assert "token" not in msg.fields and msg.fields["host"] == "n1"
    assert msg.sender[1] == sender.getsockname()[1]
    stats = server.stats
    assert (stats.bad_token, stats.malformed, stats.oversized) == (4, 12, 2)
    assert stats.accepted == 1 and stats.received == len(bad) + 1


def test_a_flood_is_bounded_counted_and_the_server_keeps_working(server, sender):
    flood = 20000
    payload = encode(Kind.HEARTBEAT, "intruder", step=1)
    for _ in range(flood):
        sender.sendto(payload, target(server))
    # The kernel queue bounds what is held; the rest is dropped by the kernel, not by our memory.
    while server.poll(max_messages=4096):
        pass
    hello = encode(Kind.HELLO, server.token, rank=0, pid=1, reply_port=4242)
    sender.sendto(hello, target(server))
    messages = drain(server, server.stats.received + 1)

    assert [m.kind for m in messages] == [Kind.HELLO]
    stats = server.stats
    assert stats.flood > 0  # Linux reports the kernel's drop count with the next datagram
    assert stats.received + stats.flood == flood + 1
    assert stats.bad_token == stats.received - 1


def test_poll_never_blocks_and_honours_max_messages(server, sender):
    assert server.poll() == []
    for step in range(10):
        sender.sendto(encode(Kind.HEARTBEAT, server.token, step=step), target(server))
    time.sleep(0.05)
    first = server.poll(max_messages=4)
    rest = server.poll()
    assert [m.get("step") for m in first + rest] == list(range(10))
    assert len(first) == 4


def test_broadcast_reaches_every_client_that_said_hello(server):
    clients = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(3)]
    try:
        for rank, sock in enumerate(clients):
            sock.bind(("0.0.0.0", 0))
            sock.settimeout(5)
            hello = encode(Kind.HELLO, server.token, rank=rank, pid=100 + rank, attempt=1,
                           reply_port=sock.getsockname()[1])
            sock.sendto(hello, target(server))
        drain(server, 3)
        assert sorted(c.rank for c in server.clients) == [0, 1, 2]

        assert server.broadcast(Kind.STOP, reason="preempted", deadline=1234.0) == 3
        for sock in clients:
            record = json.loads(sock.recv(MAX_DATAGRAM))
            assert (record["kind"], record["reason"], record["deadline"]) == ("stop", "preempted", 1234.0)
            assert record["token"] == server.token
        assert server.stats.sent == 3

        assert server.forget_clients(attempt=1) == 3
        assert server.broadcast("save_now", deadline=1.0) == 0
    finally:
        for sock in clients:
            sock.close()


def test_broadcast_refuses_what_a_client_cannot_read(server):
    with pytest.raises(ValueError):
        server.broadcast(Kind.HEARTBEAT, step=1)
    with pytest.raises(ValueError):
        server.broadcast(Kind.STOP, reason="x", deadline="soon")
    with pytest.raises(ValueError):
        server.broadcast(Kind.ABORT_SAVE, path="p" * MAX_DATAGRAM, reason="x")


def test_drops_since_gives_the_new_drops_per_reason():
    before = ControlStats(bad_token=2, malformed=1)
    after = ControlStats(bad_token=5, malformed=1, oversized=1, flood=10)
    assert after.drops_since(before) == {"bad_token": 3, "oversized": 1, "flood": 10}


def test_address_is_advertised_for_other_nodes_and_can_be_overridden():
    assert advertised_host("0.0.0.0", {"SUPERVISOR_CONTROL_HOST": "10.1.2.3"}) == "10.1.2.3"
    assert advertised_host("192.168.7.7", {}) == "192.168.7.7"
    found = advertised_host("0.0.0.0", {})
    socket.inet_aton(found)  # an IPv4 address, not a name that other nodes may not resolve
    with ControlServer(new_token(), environ={"SUPERVISOR_CONTROL_HOST": "127.0.0.1"}) as srv:
        host, port = parse_address(srv.address)
        assert host == "127.0.0.1" and port == srv.port > 0


@pytest.mark.parametrize("bad", ["127.0.0.1:5000", "udp://:5000", "udp://host", "udp://host:0",
                                 "udp://host:99999", "tcp://host:5000"])
def test_parse_address_rejects_malformed_addresses(bad):
    with pytest.raises(ValueError, match="udp://HOST:PORT"):
        parse_address(bad)


def test_tokens_are_fresh_secrets():
    tokens = {new_token() for _ in range(100)}
    assert len(tokens) == 100 and all(len(t) == 32 for t in tokens)
    with pytest.raises(ValueError):
        ControlServer("")
