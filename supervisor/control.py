"""Supervisor side of the control channel: the UDP server that training code reaches from any rank on
any node of the job (docs/architecture.md "Control channel", docs/security.md).

The wire format (what a datagram holds, how it is sealed and checked, replay windows, limits) is in
:mod:`supervisor.control_wire`, which the training side imports too; this module receives, checks
and keeps what arrived, and sends the supervisor's messages. The wire names are re-exported here for
callers that know the channel as one module. Stdlib only.
"""

from __future__ import annotations

import collections
import ipaddress
import os
import socket
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: the channel stays stdlib-only at run time
    from typing_extensions import Self

from .control_wire import (
    CLIENT_KINDS,
    CONTROL_HOST_ENV,
    DROP_REASONS,
    KEY_ENV,
    Kind,
    MAX_DATAGRAM,
    MAX_SENDERS,
    Rejected,
    SUPERVISOR_KINDS,
    SeqTracker,
    _key_bytes,
    check_fields,
    decode,
    new_sender_id,
    seal,
)
from .control_wire import (  # noqa: F401 - re-exported: callers know the channel as one module
    LEGACY_KEY_ENV,  # noqa: F401
    MAX_STEP,  # noqa: F401
    REPLAY_WINDOW,  # noqa: F401
    check_sequence,  # noqa: F401
    encode,  # noqa: F401
    field_problem,  # noqa: F401
    new_token,  # noqa: F401
    parse_address,  # noqa: F401
    valid_step,  # noqa: F401
)

MAX_CLIENTS = 16384  # hello'd clients remembered for broadcast; the least recently seen goes beyond this
FLOOD_WINDOW = 60.0  # default look-back of flooded(), seconds
FLOOD_REJECTED = 1000  # rejected datagrams within the window that make a flood
_SAMPLE_SPACING = 1.0  # seconds between the samples behind flooded()
_SAMPLES = 8192  # ring of samples: more than an hour at one per second or two
_RCVBUF_BYTES = 1 << 20  # ask for 1 MiB; the kernel bounds the queue (and so our memory) under a flood
_SO_RXQ_OVFL = getattr(socket, "SO_RXQ_OVFL", 40)  # Linux: count of datagrams the kernel dropped


def advertised_host(bind_host: str, environ: Mapping[str, str] | None = None) -> str:
    """An address of this host that srun tasks on other nodes can reach.

    Order: ``$SUPERVISOR_CONTROL_HOST``; the bind address when it is a specific one; the IP the host
    name resolves to, unless it is loopback (Debian maps the host name to 127.0.1.1); the source
    address of the default route (found with a UDP ``connect``, which sends nothing); 127.0.0.1.
    """
    environ = os.environ if environ is None else environ
    override = environ.get(CONTROL_HOST_ENV, "").strip()
    if override:
        return override
    if bind_host not in ("", "0.0.0.0"):
        return bind_host
    try:
        resolved = socket.gethostbyname(socket.gethostname())
        if not resolved.startswith("127."):
            return resolved
    except OSError:
        pass
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("10.255.255.255", 9))  # routing lookup only; UDP connect sends no packet
        routed = probe.getsockname()[0]
        if routed and not routed.startswith(("127.", "0.")):
            return routed
    except OSError:
        pass
    finally:
        probe.close()
    return "127.0.0.1"


def _ipv4_literal(host: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(host), ipaddress.IPv4Address)
    except ValueError:
        return False


# ---------------------------------------------------------------------------------------------
# What the server hands out


@dataclass(frozen=True)
class Message:
    """One accepted client datagram. ``fields`` holds every key of the body but ``kind`` (so the
    envelope's rank/pid/host/attempt are there too, as well as in the attributes)."""

    kind: Kind
    fields: dict[str, Any]
    sender: tuple[str, int]  # (ip, port) the datagram came from
    rank: int | None
    pid: int | None
    attempt: int | None
    host: str | None
    received_at: float  # the server's clock (epoch seconds by default), read when drained
    sender_id: int = 0  # the authenticated id of the sending process
    seq: int = 0

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)


@dataclass(frozen=True)
class ClientInfo:
    """A client that said hello: where broadcasts go and who it is."""

    address: tuple[str, int]
    rank: int | None
    pid: int | None
    host: str | None
    attempt: int | None
    last_seen: float
    sender_id: int = 0  # broadcasts to this client name it as their recipient


@dataclass(frozen=True)
class ControlStats:
    """Counters since the server started. ``flood`` is what the kernel dropped on a full queue;
    ``saturated`` counts polls that stopped at ``max_messages`` with datagrams still queued."""

    received: int = 0  # datagrams read from the socket
    accepted: int = 0
    bad_token: int = 0  # no valid tag: forged, another run's key, or protocol-1 JSON (an older client)
    malformed: int = 0
    oversized: int = 0
    flood: int = 0
    sent: int = 0
    send_failed: int = 0
    clients: int = 0
    bad_version: int = 0  # a supervisor datagram of another protocol version (a newer client)
    replay: int = 0  # a sequence number seen already, or too old
    out_of_range: int = 0  # well-typed but out of bounds (a 400-digit step, a NaN deadline)
    saturated: int = 0

    @property
    def dropped(self) -> dict[str, int]:
        return {"bad_token": self.bad_token, "bad_version": self.bad_version, "replay": self.replay,
                "malformed": self.malformed, "out_of_range": self.out_of_range, "oversized": self.oversized,
                "flood": self.flood}

    @property
    def rejected(self) -> int:
        """Datagrams read and dropped by us (the kernel's drops are ``flood``)."""
        return self.bad_token + self.bad_version + self.replay + self.malformed + self.out_of_range + self.oversized

    def drops_since(self, earlier: ControlStats) -> dict[str, int]:
        """New drops per reason since ``earlier`` (for a ``control_dropped`` event); zeros left out."""
        before = earlier.dropped
        return {k: v - before[k] for k, v in self.dropped.items() if v - before[k] > 0}


@dataclass(frozen=True)
class FloodVerdict:
    flooded: bool
    kernel_dropped: int  # datagrams the kernel dropped in the window: genuine ones may be among them
    rejected: int  # datagrams we read and dropped in the window
    saturated: int  # polls that left datagrams queued in the window
    window: float
    reason: str


def flood_verdict(before: ControlStats, after: ControlStats, window: float,
                  rejected_limit: int = FLOOD_REJECTED) -> FloodVerdict:
    """Whether the channel was flooded between two snapshots ``window`` seconds apart: the kernel
    dropped datagrams (genuine heartbeats may be lost), a poll left datagrams queued, or we
    rejected at least ``rejected_limit`` datagrams. While flooded, silence is no evidence of a hang."""
    kernel = after.flood - before.flood
    rejected = after.rejected - before.rejected
    saturated = after.saturated - before.saturated
    parts = []
    if kernel > 0:
        parts.append(f"the kernel dropped {kernel} datagrams")
    if saturated > 0:
        parts.append(f"{saturated} polls left datagrams queued")
    if rejected >= rejected_limit:
        parts.append(f"{rejected} datagrams rejected")
    flooded = bool(parts)
    reason = ("; ".join(parts) if flooded else "no flood") + f" in the last {window:g} s"
    return FloodVerdict(flooded, kernel, rejected, saturated, window, reason)


@dataclass
class _Counters:
    received: int = 0
    accepted: int = 0
    sent: int = 0
    send_failed: int = 0
    flood: int = 0
    saturated: int = 0
    drops: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DROP_REASONS, 0))


class ControlServer:
    """UDP endpoint of the supervisor. Non-blocking: :meth:`poll` drains what is queued, at most
    ``max_messages`` per call; the kernel's receive queue is the only buffer, so a flood costs
    bounded memory and the excess is dropped by the kernel (counted as ``flood`` on Linux).
    :meth:`fileno` lets a run loop wait on the socket with ``selectors``.

    Binding: to the advertised address (the one other nodes are told) when it is an IPv4 address of
    this host, so the port is not open on interfaces no task uses (a public NIC, a container
    bridge); else, or when that bind fails, to every interface (``bind_fallback`` says why). Either
    way the tag, not the address, is what keeps strangers out.
    """

    def __init__(self, key: str, host: str | None = None, port: int = 0,
                 clock: Callable[[], float] = time.time, environ: Mapping[str, str] | None = None) -> None:
        if not key:
            raise ValueError("ControlServer needs a non-empty key")
        self.key = key
        self._key = _key_bytes(key)
        self._bind_host = host
        self._port = port
        self._clock = clock
        self._environ = environ
        self._sock: socket.socket | None = None
        self._advertised = ""
        self.bound_host = ""
        self.bind_fallback: str | None = None
        self._clients: OrderedDict[tuple[str, int], ClientInfo] = OrderedDict()
        self._senders = SeqTracker(MAX_SENDERS)
        self._sender_id = new_sender_id()
        self._seq = 0
        self._counts = _Counters()
        self._samples: collections.deque[tuple[float, ControlStats]] = collections.deque(maxlen=_SAMPLES)

    @property
    def token(self) -> str:
        """The key (the name of protocol 1, where it travelled as a token)."""
        return self.key

    # lifecycle -------------------------------------------------------------------------------

    def start(self) -> Self:
        wanted = self._bind_host
        if wanted is None:
            self._advertised = advertised_host("0.0.0.0", self._environ)
            wanted = self._advertised if _ipv4_literal(self._advertised) else "0.0.0.0"
            if wanted == "0.0.0.0":
                self.bind_fallback = f"advertised host {self._advertised!r} is not an IPv4 address"
        else:
            self._advertised = advertised_host(wanted, self._environ)
        try:
            sock = self._bind(wanted)
        except OSError as exc:
            if wanted in ("", "0.0.0.0") or self._bind_host is not None:
                raise
            self.bind_fallback = f"cannot bind {wanted} ({exc.strerror or exc}); bound every interface"
            wanted = "0.0.0.0"
            sock = self._bind(wanted)
        self._sock = sock
        self.bound_host = wanted
        self._samples.append((self._clock(), self.stats))
        return self

    def _bind(self, host: str) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.bind((host, self._port))
            sock.setblocking(False)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RCVBUF_BYTES)
            except OSError:
                pass
            try:
                sock.setsockopt(socket.SOL_SOCKET, _SO_RXQ_OVFL, 1)
            except OSError:
                pass  # not Linux: kernel drops go uncounted
        except OSError:
            sock.close()
            raise
        return sock

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> Self:
        return self.start() if self._sock is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def port(self) -> int:
        port: int = self._require_socket().getsockname()[1]
        return port

    @property
    def address(self) -> str:
        """``udp://HOST:PORT`` to export as ``SUPERVISOR_CONTROL`` (never the key)."""
        return f"udp://{self._advertised}:{self.port}"

    def child_env(self) -> dict[str, str]:
        """What the training's environment needs to reach this server: the address and the key.
        (Not ``SUPERVISOR_TOKEN``: an older client would send it in clear in every datagram.)"""
        return {"SUPERVISOR_CONTROL": self.address, KEY_ENV: self.key}

    def fileno(self) -> int:
        return self._require_socket().fileno()

    def _require_socket(self) -> socket.socket:
        if self._sock is None:
            raise RuntimeError("ControlServer is not started (call start())")
        return self._sock

    # receiving -------------------------------------------------------------------------------

    def poll(self, max_messages: int = 1024) -> list[Message]:
        """Drain up to ``max_messages`` datagrams without blocking; return the accepted ones."""
        sock = self._sock
        if sock is None:
            return []
        out: list[Message] = []
        ancillary = socket.CMSG_SPACE(4)
        drained = False
        for _ in range(max_messages):
            try:
                data, anc, _flags, sender = sock.recvmsg(MAX_DATAGRAM + 1, ancillary)
            except (BlockingIOError, InterruptedError):
                drained = True
                break
            except OSError:
                drained = True
                break  # e.g. a stray ICMP error reported on the socket: nothing to read now
            self._counts.received += 1
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == _SO_RXQ_OVFL and len(payload) >= 4:
                    self._counts.flood = max(self._counts.flood, int.from_bytes(payload[:4], "little"))
            message = self._accept(data, sender)
            if message is not None:
                out.append(message)
        if not drained and max_messages > 0:
            self._counts.saturated += 1
        self._sample()
        return out

    def _accept(self, data: bytes, sender: tuple[str, int]) -> Message | None:
        try:
            datagram = decode(data, self._key, CLIENT_KINDS)
            if datagram.recipient != 0:
                raise Rejected("malformed", "a client datagram names a recipient")
            if not self._senders.accept(datagram.sender, datagram.seq):
                raise Rejected("replay")
        except Rejected as exc:
            self._counts.drops[exc.reason] += 1
            return None
        self._counts.accepted += 1
        now = self._clock()
        record = datagram.record
        fields = {k: v for k, v in record.items() if k != "kind"}
        message = Message(kind=datagram.kind, fields=fields, sender=(sender[0], sender[1]),
                          rank=record.get("rank"), pid=record.get("pid"), attempt=record.get("attempt"),
                          host=record.get("host"), received_at=now, sender_id=datagram.sender, seq=datagram.seq)
        if datagram.kind is Kind.HELLO:
            self._remember(message, (sender[0], int(fields["reply_port"])))
        return message

    def _remember(self, message: Message, address: tuple[str, int]) -> None:
        self._clients.pop(address, None)
        self._clients[address] = ClientInfo(address, message.rank, message.pid, message.host,
                                            message.attempt, message.received_at, message.sender_id)
        while len(self._clients) > MAX_CLIENTS:
            self._clients.popitem(last=False)

    # flood detection -------------------------------------------------------------------------

    def _sample(self) -> None:
        """Keep (time, counters) at about one-second resolution; the newest entry is always now."""
        now, samples = self._clock(), self._samples
        if len(samples) >= 2 and now - samples[-2][0] < _SAMPLE_SPACING:
            samples[-1] = (now, self.stats)
        else:
            samples.append((now, self.stats))

    def flood_check(self, now: float | None = None, window: float = FLOOD_WINDOW) -> FloodVerdict:
        """:func:`flood_verdict` over the last ``window`` seconds (of this server's clock) up to
        ``now`` (default: the clock now)."""
        now = self._clock() if now is None else now
        start = now - window
        baseline = self._samples[0][1] if self._samples else ControlStats()
        for at, stats in self._samples:  # the newest sample at or before the window start
            if at > start:
                break
            baseline = stats
        return flood_verdict(baseline, self.stats, window)

    def flooded(self, now: float | None = None, window: float = FLOOD_WINDOW) -> bool:
        """Whether datagrams were dropped by the kernel, left queued, or rejected in bulk within the
        last ``window`` seconds: the run loop must not conclude "hang" from silence then. ``now``
        is in this server's clock (pass ``clock=`` at construction to share the loop's)."""
        return self.flood_check(now, window).flooded

    # sending ---------------------------------------------------------------------------------

    def broadcast(self, kind: Kind | str, **fields: Any) -> int:
        """Send one supervisor message to every client that said hello, each sealed for its
        recipient; returns how many sends the kernel took. UDP may lose a datagram: repeat a
        ``stop`` until the child is gone."""
        kind = Kind(kind)
        if kind not in SUPERVISOR_KINDS:
            raise ValueError(f"{kind.value} is not a supervisor-to-client message")
        problem = check_fields(kind, fields)
        if problem:
            raise ValueError(problem)
        probe = seal(kind, self._key, self._sender_id, 1, 1, **fields)
        if len(probe) > MAX_DATAGRAM:
            raise ValueError(f"{kind.value} message is {len(probe)} bytes, over {MAX_DATAGRAM}")
        sock = self._sock
        if sock is None:
            return 0
        sent = 0
        for address, info in list(self._clients.items()):
            self._seq += 1
            data = seal(kind, self._key, self._sender_id, self._seq, info.sender_id, **fields)
            try:
                sock.sendto(data, address)
                sent += 1
            except OSError:
                self._counts.send_failed += 1
        self._counts.sent += sent
        return sent

    @property
    def clients(self) -> tuple[ClientInfo, ...]:
        return tuple(self._clients.values())

    def forget_clients(self, attempt: int | None = None) -> int:
        """Stop broadcasting to clients of ``attempt`` (all when None), e.g. once an attempt ended."""
        gone = [a for a, c in self._clients.items() if attempt is None or c.attempt == attempt]
        for address in gone:
            del self._clients[address]
        return len(gone)

    @property
    def stats(self) -> ControlStats:
        c = self._counts
        return ControlStats(received=c.received, accepted=c.accepted, flood=c.flood, sent=c.sent,
                            send_failed=c.send_failed, clients=len(self._clients), saturated=c.saturated,
                            **c.drops)
