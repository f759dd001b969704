"""The supervisor's UDP endpoint against hostile and broken input: real sockets, real datagrams."""

from __future__ import annotations

import hmac
import json
import socket
import struct
import time

import pytest

from supervisor.control import (
    MAX_DATAGRAM,
    MAX_STEP,
    ControlServer,
    ControlStats,
    Kind,
    advertised_host,
    decode,
    encode,
    new_token,
    parse_address,
    seal,
)


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


def raw(key: str, body: bytes, sender: int = 9, seq: int = 1) -> bytes:
    """A datagram with a hand-written body, correctly signed."""
    head = struct.pack("!2sBQQQ", b"SV", 2, sender, seq, 0)
    return head + body + hmac.digest(key.encode(), head + body, "sha256")


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


def test_only_authentic_well_formed_datagrams_are_accepted(server, sender):
    good = encode(Kind.HEARTBEAT, server.key, rank=2, pid=99, host="n1", attempt=4, step=7,
                  metrics={"loss": float("nan")})
    legacy = json.dumps({"v": 1, "kind": "heartbeat", "token": server.key, "step": 7}).encode()
    forged_garbage = bytearray(encode(Kind.HEARTBEAT, "f" * 32, step=7))
    body_at = len(forged_garbage) - 32 - 20
    forged_garbage[body_at:body_at + 5] = b"{{{{{"  # not JSON, but the tag is checked first
    bad = {
        "bad_version": [
            bytes(good[:2]) + bytes([1]) + bytes(good[3:]),  # another protocol version
            bytes(good[:2]) + bytes([3]) + bytes(good[3:]),
        ],
        "bad_token": [
            legacy,  # protocol 1: JSON with the key in clear, no tag
            b"{not json",
            encode(Kind.HEARTBEAT, "f" * 32, step=7),  # another key
            encode(Kind.HEARTBEAT, server.key[:-1], step=7),  # almost the key
            bytes(good[:-1]) + bytes([good[-1] ^ 1]),  # one bit of the tag flipped
            bytes(good[:30]) + b"9" + bytes(good[31:]),  # one byte of the body changed
            bytes(forged_garbage),
        ],
        "malformed": [
            b"\xff\xfe\x00garbage",
            b"SV",  # too short
            encode(Kind.STOP, server.key, reason="x", deadline=1.0),  # supervisor->client kind
            encode(Kind.HEARTBEAT, server.key, step="seven"),
            encode(Kind.HEARTBEAT, server.key, step=True),
            encode(Kind.HEARTBEAT, server.key, step=1, metrics={"loss": "low"}),
            encode(Kind.SAVE_END, server.key, step=1, path="a", bytes=1, duration=0.1, ok="yes"),
            encode(Kind.HEARTBEAT, server.key, step=1, rank="zero"),
            raw(server.key, b'{"kind":"heartbeat","step":' + b"9" * 5000 + b"}"),  # over json's digit limit
            raw(server.key, b'{"kind":"reboot"}'),  # unknown kind
        ],
        "out_of_range": [
            encode(Kind.HELLO, server.key, reply_port=70000),
            encode(Kind.HEARTBEAT, server.key, step=int("9" * 400)),
            encode(Kind.HEARTBEAT, server.key, step=MAX_STEP),
            encode(Kind.HEARTBEAT, server.key, step=-1),
            encode(Kind.RESUMED, server.key, step=2**64),
            encode(Kind.HEARTBEAT, server.key, step=1, metrics={"loss": 10**400}),
            encode(Kind.SAVE_END, server.key, step=1, path="a", bytes=1, duration=float("nan"), ok=True),
            encode(Kind.HEARTBEAT, server.key, step=1, host="h" * 300),
            encode(Kind.HEARTBEAT, server.key, step=1, attempt=2**40),
        ],
        "oversized": [
            b" " * (MAX_DATAGRAM + 1),
            encode(Kind.HEARTBEAT, server.key, step=1, metrics={"m": "x" * MAX_DATAGRAM}),
        ],
    }
    everything = [data for group in bad.values() for data in group] + [good]
    for data in everything:
        sender.sendto(data, target(server))
    messages = drain(server, len(everything))

    assert len(messages) == 1
    msg = messages[0]
    assert (msg.kind, msg.rank, msg.pid, msg.host, msg.attempt) == (Kind.HEARTBEAT, 2, 99, "n1", 4)
    assert msg.get("step") == 7 and msg.get("metrics")["loss"] != msg.get("metrics")["loss"]  # NaN survives
    assert msg.fields["host"] == "n1" and "kind" not in msg.fields
    assert msg.sender[1] == sender.getsockname()[1]
    stats = server.stats
    assert {reason: stats.dropped[reason] for reason in bad} == {reason: len(group) for reason, group in bad.items()}
    assert stats.accepted == 1 and stats.received == len(everything) and stats.replay == 0


def test_a_flood_is_bounded_counted_and_the_server_keeps_working(server, sender):
    flood = 20000
    payload = encode(Kind.HEARTBEAT, "intruder", step=1)  # signed with a key that is not the run's
    for _ in range(flood):
        sender.sendto(payload, target(server))
    # The kernel queue bounds what is held; the rest is dropped by the kernel, not by our memory.
    while server.poll(max_messages=4096):
        pass
    hello = encode(Kind.HELLO, server.key, rank=0, pid=1, reply_port=4242)
    sender.sendto(hello, target(server))
    messages = drain(server, server.stats.received + 1)

    assert [m.kind for m in messages] == [Kind.HELLO]
    stats = server.stats
    assert stats.flood > 0  # Linux reports the kernel's drop count with the next datagram
    assert stats.received + stats.flood == flood + 1
    assert stats.bad_token == stats.received - 1
    assert server.flooded()  # the loop must not read the silence of a flood as a hang


def test_poll_never_blocks_and_honours_max_messages(server, sender):
    assert server.poll() == []
    for step in range(10):
        sender.sendto(encode(Kind.HEARTBEAT, server.key, step=step), target(server))
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
            hello = seal(Kind.HELLO, server.key, 1000 + rank, 1, 0, rank=rank, pid=100 + rank, attempt=1,
                         reply_port=sock.getsockname()[1])
            sock.sendto(hello, target(server))
        drain(server, 3)
        assert sorted(c.rank for c in server.clients) == [0, 1, 2]

        assert server.broadcast(Kind.STOP, reason="preempted", deadline=1234.0) == 3
        for rank, sock in enumerate(clients):
            data = sock.recv(MAX_DATAGRAM)
            got = decode(data, server.key, frozenset({Kind.STOP}))
            assert (got.kind, got.record["reason"], got.record["deadline"]) == (Kind.STOP, "preempted", 1234.0)
            assert got.recipient == 1000 + rank  # sealed for this client only
            assert server.key.encode() not in data and bytes.fromhex(server.key) not in data
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
