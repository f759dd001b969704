"""Supervisor side of the control channel: a UDP server that training code reaches from any rank on
any node of the job (docs/architecture.md "Control channel", docs/security.md).

Why UDP: a send never blocks training, and srun tasks on other nodes (which are not our children and
inherit no file descriptors, only the environment) can reach ``udp://HOST:PORT``.

Why authenticated: anyone who can send UDP to the node can reach the port, and the network between
nodes is not trusted. Every datagram carries an HMAC-SHA256 tag computed with a per-run key that
travels to the training only in its environment (``$SUPERVISOR_KEY``), never on the wire. The tag is
checked (``hmac.compare_digest``) before a single byte is parsed, so a forged datagram costs one
hash and is never decoded. A per-sender sequence number rejects replays; every per-sender table is
an LRU with a hard cap. Datagrams that are forged, replayed, malformed, out of range, oversized or
lost to a flood are dropped and counted, never raised: the channel is advisory and the supervisor
must outlive anything the network sends it. HMAC authenticates; it does not encrypt.

Wire format, protocol 2 (integers big-endian)::

    0   2  magic  b"SV"
    2   1  protocol version (2)
    3   8  sender id: random per sending process, never 0 (a client) or the supervisor's
    11  8  sequence number of the sender, from 1, +1 per datagram
    19  8  recipient id: 0 for the supervisor; a client's sender id for supervisor -> client
    27  n  body: compact JSON object {"kind": ..., fields...}
    -32 32 HMAC-SHA256(key, every byte before the tag)

Replays: the supervisor keeps, per sender id, the highest sequence number and a 64-bit window of
those below it (as IPsec and DTLS do), so reordering within 64 datagrams is tolerated and a
repeat never is. A supervisor -> client message names its recipient, so one client's stop cannot be
replayed at another, nor at a later attempt's client (a new process, a new id). No timestamps:
nodes' clocks may differ or step (NTP), and a clock must never make the supervisor deaf to its
training. A new supervisor (a requeue) draws a new key, so nothing replays across supervisors.

The wire protocol (message kinds, envelope keys, limits) lives here; :mod:`supervisor.client`
speaks it from the training side. Stdlib only.
"""

from __future__ import annotations

import collections
import hmac
import ipaddress
import json
import math
import os
import secrets
import socket
import struct
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: the channel stays stdlib-only at run time
    from typing_extensions import Self

MAX_DATAGRAM = 8192  # bytes; larger datagrams are dropped as "oversized"
PROTOCOL_VERSION = 2
MAGIC = b"SV"
KEY_ENV = "SUPERVISOR_KEY"  # the per-run key, in the training's environment only
LEGACY_KEY_ENV = "SUPERVISOR_TOKEN"  # read by the client when $SUPERVISOR_KEY is absent
CONTROL_HOST_ENV = "SUPERVISOR_CONTROL_HOST"  # override of the advertised host
MAX_CLIENTS = 16384  # hello'd clients remembered for broadcast; the least recently seen goes beyond this
MAX_SENDERS = 16384  # sequence windows kept; the least recently seen sender goes beyond this
REPLAY_WINDOW = 64  # sequence numbers below a sender's highest that may still arrive (reordering)
MAX_STEP = 2**53  # exclusive; steps are bounded integers (a float holds every one of them exactly)
MAX_ID = 2**31  # exclusive bound of rank, pid and attempt
MAX_BYTES = 2**63  # exclusive bound of a save's size
MAX_METRIC_INT = 2**63  # an integer metric beyond this could not become a float
MAX_HOST = 255  # characters of a host name
MAX_PATH = 4096  # characters of a path
MAX_TEXT = 1024  # characters of a reason
TAG_BYTES = 32
_HEADER = struct.Struct("!2sBQQQ")
HEADER_BYTES = _HEADER.size  # 27
_MIN_DATAGRAM = HEADER_BYTES + 2 + TAG_BYTES  # the smallest body is "{}"
FLOOD_WINDOW = 60.0  # default look-back of flooded(), seconds
FLOOD_REJECTED = 1000  # rejected datagrams within the window that make a flood
_SAMPLE_SPACING = 1.0  # seconds between the samples behind flooded()
_SAMPLES = 8192  # ring of samples: more than an hour at one per second or two
_RCVBUF_BYTES = 1 << 20  # ask for 1 MiB; the kernel bounds the queue (and so our memory) under a flood
_SO_RXQ_OVFL = getattr(socket, "SO_RXQ_OVFL", 40)  # Linux: count of datagrams the kernel dropped
DROP_REASONS = ("bad_token", "bad_version", "replay", "malformed", "out_of_range", "oversized")


class Kind(str, Enum):
    """Message kinds of the channel (a vocabulary, like ``events.Ev``; not a state space)."""

    # client -> supervisor
    HELLO = "hello"  # reply_port: where broadcasts reach this client
    HEARTBEAT = "heartbeat"  # step, metrics
    SAVE_BEGIN = "save_begin"  # step, path
    SAVE_END = "save_end"  # step, path, bytes, duration, ok
    RESUMED = "resumed"  # step
    DETERMINISM = "determinism"  # settings
    DONE = "done"  # training finished all its steps: an exit 0 after this is completion
    # supervisor -> client
    STOP = "stop"  # reason, deadline (epoch s or null)
    ABORT_SAVE = "abort_save"  # path, reason
    SAVE_NOW = "save_now"  # deadline


CLIENT_KINDS = frozenset({Kind.HELLO, Kind.HEARTBEAT, Kind.SAVE_BEGIN, Kind.SAVE_END, Kind.RESUMED,
                          Kind.DETERMINISM, Kind.DONE})
SUPERVISOR_KINDS = frozenset({Kind.STOP, Kind.ABORT_SAVE, Kind.SAVE_NOW})


def valid_step(value: object) -> bool:
    """An int (not a bool) with 0 <= value < :data:`MAX_STEP`."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_STEP


# ---------------------------------------------------------------------------------------------
# Field checks, so the run loop can trust what poll() returns: the right type (else "malformed")
# and within bounds (else "out_of_range"). Anything the loop computes from them never raises.


@dataclass(frozen=True)
class _Field:
    name: str
    kind: str  # "int", "num", "str", "bool", "dict"
    optional: bool = False
    low: float = 0  # int and num: inclusive lower bound
    high: float = math.inf  # int: exclusive upper bound; num: inclusive; str: max length


def _f(name: str, kind: str, optional: bool = False, low: float = 0, high: float = math.inf) -> _Field:
    return _Field(name, kind, optional, low, high)


_STEP = _f("step", "int", high=MAX_STEP)
_OPT_STEP = _f("step", "int", True, high=MAX_STEP)
_PATH = _f("path", "str", high=MAX_PATH)
_DEADLINE = _f("deadline", "num", True, low=-math.inf)
_REASON = _f("reason", "str", True, high=MAX_TEXT)
_SCHEMA: dict[Kind, tuple[_Field, ...]] = {
    Kind.HELLO: (_f("reply_port", "int", low=1, high=65536),),
    Kind.HEARTBEAT: (_STEP, _f("metrics", "dict", True)),
    Kind.SAVE_BEGIN: (_OPT_STEP, _PATH),
    Kind.SAVE_END: (_OPT_STEP, _PATH, _f("bytes", "int", True, high=MAX_BYTES), _f("duration", "num", True),
                    _f("ok", "bool")),
    Kind.RESUMED: (_STEP,),
    Kind.DETERMINISM: (_f("settings", "dict"),),
    Kind.DONE: (_OPT_STEP,),
    Kind.STOP: (_REASON, _DEADLINE),
    Kind.ABORT_SAVE: (_f("path", "str", True, high=MAX_PATH), _REASON),
    Kind.SAVE_NOW: (_DEADLINE,),
}
_ENVELOPE = (_f("rank", "int", True, high=MAX_ID), _f("pid", "int", True, high=MAX_ID),
             _f("attempt", "int", True, high=MAX_ID), _f("host", "str", True, high=MAX_HOST))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check(spec: _Field, value: Any) -> tuple[str, str] | None:
    """(reason, problem) when ``value`` does not fit ``spec``; None when it does."""
    if value is None:
        return None if spec.optional else ("malformed", f"{spec.name} is missing")
    if spec.kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            return "malformed", f"{spec.name} must be an integer"
        if not spec.low <= value < spec.high:
            return "out_of_range", f"{spec.name} out of range"
    elif spec.kind == "num":
        if not _is_number(value):
            return "malformed", f"{spec.name} must be a number"
        if not (math.isfinite(value) and spec.low <= value <= spec.high):
            return "out_of_range", f"{spec.name} must be finite and >= {spec.low:g}"
    elif spec.kind == "str":
        if not isinstance(value, str):
            return "malformed", f"{spec.name} must be a string"
        if len(value) > spec.high:
            return "out_of_range", f"{spec.name} longer than {spec.high:g} characters"
    elif spec.kind == "bool":
        if not isinstance(value, bool):
            return "malformed", f"{spec.name} must be true or false"
    elif spec.kind == "dict" and not isinstance(value, dict):
        return "malformed", f"{spec.name} must be an object"
    return None


def field_problem(kind: Kind, record: Mapping[str, Any]) -> tuple[str, str] | None:
    """(drop reason, problem) when ``record`` is not a well-formed ``kind`` message, else None."""
    for spec in _SCHEMA[kind]:
        found = _check(spec, record.get(spec.name))
        if found:
            return found[0], f"{kind.value}.{found[1]}"
    metrics = record.get("metrics") if kind is Kind.HEARTBEAT else None
    if metrics:
        for value in metrics.values():
            if value is None:
                continue
            if not _is_number(value):
                return "malformed", "heartbeat.metrics values must be numbers"
            if isinstance(value, int) and not -MAX_METRIC_INT < value < MAX_METRIC_INT:
                return "out_of_range", "heartbeat.metrics integer too large for a float"
    return None


def check_fields(kind: Kind, record: Mapping[str, Any]) -> str | None:
    """Why ``record`` is not a well-formed ``kind`` message, or None when it is."""
    found = field_problem(kind, record)
    return found[1] if found else None


# ---------------------------------------------------------------------------------------------
# Keys, sealing and opening


def new_token() -> str:
    """A per-run key: 128 random bits, hex. It authenticates every datagram and never travels."""
    return secrets.token_hex(16)


new_key = new_token


def new_sender_id() -> int:
    """A random, non-zero 64-bit id for one sending process."""
    return secrets.randbits(64) or 1


def _key_bytes(key: str | bytes) -> bytes:
    return key if isinstance(key, bytes) else key.encode("utf-8", "surrogatepass")


def seal(kind: Kind, key: str | bytes, sender: int, seq: int, recipient: int = 0, **fields: Any) -> bytes:
    """One authenticated datagram. Python's json writes NaN/Infinity, which :func:`decode` reads
    back: a non-finite loss must survive the trip."""
    record: dict[str, Any] = {"kind": kind.value}
    record.update(fields)
    body = json.dumps(record, separators=(",", ":"), default=str).encode()
    head = _HEADER.pack(MAGIC, PROTOCOL_VERSION, sender, seq, recipient)
    return head + body + hmac.digest(_key_bytes(key), head + body, "sha256")


def encode(kind: Kind, key: str | bytes, **fields: Any) -> bytes:
    """One datagram from a fresh one-off sender (sequence 1): for tools and tests. A client that
    sends more than one message uses :func:`seal` with its own id and a rising sequence number."""
    return seal(kind, key, new_sender_id(), 1, 0, **fields)


class Rejected(Exception):
    """A datagram that is dropped; ``reason`` is one of :data:`DROP_REASONS`."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(frozen=True)
class Datagram:
    """An authenticated, well-formed datagram (before the replay check, which needs state)."""

    kind: Kind
    record: dict[str, Any]  # the JSON body, "kind" included
    sender: int
    seq: int
    recipient: int


def authenticate(data: bytes, key: str | bytes) -> tuple[int, int, int, bytes]:
    """(sender, seq, recipient, body) of a datagram whose tag is right; raises :class:`Rejected`.

    Size and version come first (no hashing for what cannot be ours), then the tag in constant
    time. Nothing is parsed before the tag is known good."""
    if len(data) > MAX_DATAGRAM:
        raise Rejected("oversized", f"{len(data)} bytes")
    if data[:1] == b"{":
        # Protocol 1 (JSON, an older client's or a forger's): it carries no tag, so it fails
        # authentication; telling the two apart would mean parsing it.
        raise Rejected("bad_token", "a protocol-1 (unauthenticated JSON) datagram")
    if len(data) < _MIN_DATAGRAM or data[:2] != MAGIC:
        raise Rejected("malformed", "not a supervisor datagram")
    if data[2] != PROTOCOL_VERSION:
        raise Rejected("bad_version", f"protocol {data[2]}, expected {PROTOCOL_VERSION}")
    signed = memoryview(data)[:-TAG_BYTES]
    if not hmac.compare_digest(hmac.digest(_key_bytes(key), signed, "sha256"), data[-TAG_BYTES:]):
        raise Rejected("bad_token")
    _magic, _version, sender, seq, recipient = _HEADER.unpack_from(data)
    if sender == 0 or seq == 0:
        raise Rejected("malformed", "sender id and sequence number must not be 0")
    return sender, seq, recipient, bytes(signed[HEADER_BYTES:])


def parse_body(body: bytes, allowed: frozenset[Kind]) -> tuple[Kind, dict[str, Any]]:
    """The authenticated body as (kind, record); raises :class:`Rejected` (malformed, out_of_range)."""
    try:
        record = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):  # ValueError: also > 4300-digit integers
        raise Rejected("malformed", "not JSON") from None
    if not isinstance(record, dict):
        raise Rejected("malformed", "not a JSON object")
    try:
        kind = Kind(record.get("kind"))
    except ValueError:
        raise Rejected("malformed", f"unknown kind {str(record.get('kind'))[:40]!r}") from None
    if kind not in allowed:
        raise Rejected("malformed", f"{kind.value} is not sent in this direction")
    for spec in _ENVELOPE:
        found = _check(spec, record.get(spec.name))
        if found:
            raise Rejected(*found)
    found = field_problem(kind, record)
    if found:
        raise Rejected(*found)
    return kind, record


def decode(data: bytes, key: str | bytes, allowed: frozenset[Kind]) -> Datagram:
    """Authenticate, then parse and check the shape. Raises :class:`Rejected` with the drop reason.
    Replays are the caller's to reject (:func:`check_sequence`): that needs per-sender state."""
    sender, seq, recipient, body = authenticate(data, key)
    kind, record = parse_body(body, allowed)
    return Datagram(kind, record, sender, seq, recipient)


# ---------------------------------------------------------------------------------------------
# Replay protection (pure)


@dataclass(frozen=True)
class SeqWindow:
    """What a receiver remembers of one sender: the highest sequence number accepted, and a bitmap
    of the :data:`REPLAY_WINDOW` numbers at and below it (bit i set: ``highest - i`` was accepted)."""

    highest: int
    seen: int


@dataclass(frozen=True)
class SeqVerdict:
    ok: bool
    window: SeqWindow  # the state to keep (unchanged when not ok)
    reason: str


_WINDOW_MASK = (1 << REPLAY_WINDOW) - 1


def check_sequence(window: SeqWindow | None, seq: int) -> SeqVerdict:
    """Accept ``seq`` once: new senders and numbers above the highest always; numbers within the
    window once; older ones never (they may be replays and cannot be told apart)."""
    if window is None:
        return SeqVerdict(True, SeqWindow(seq, 1), "first datagram of this sender")
    if seq > window.highest:
        shift = seq - window.highest
        seen = ((window.seen << shift) | 1) & _WINDOW_MASK if shift < REPLAY_WINDOW else 1
        return SeqVerdict(True, SeqWindow(seq, seen), "new")
    behind = window.highest - seq
    if behind >= REPLAY_WINDOW:
        return SeqVerdict(False, window, f"sequence {seq} is {behind} behind the highest: too old")
    if window.seen >> behind & 1:
        return SeqVerdict(False, window, f"sequence {seq} seen already: a replay")
    return SeqVerdict(True, SeqWindow(window.highest, window.seen | 1 << behind), "late, within the window")


class SeqTracker:
    """Sequence windows per sender id, an LRU capped at ``capacity`` entries."""

    def __init__(self, capacity: int = MAX_SENDERS) -> None:
        self.capacity = capacity
        self._windows: OrderedDict[int, SeqWindow] = OrderedDict()
        self.evicted = 0

    def accept(self, sender: int, seq: int) -> bool:
        verdict = check_sequence(self._windows.get(sender), seq)
        if not verdict.ok:
            return False
        self._windows[sender] = verdict.window
        self._windows.move_to_end(sender)
        while len(self._windows) > self.capacity:
            self._windows.popitem(last=False)
            self.evicted += 1
        return True

    def __len__(self) -> int:
        return len(self._windows)


# ---------------------------------------------------------------------------------------------
# Addresses


def parse_address(address: str) -> tuple[str, int]:
    """``udp://HOST:PORT`` -> (host, port). Raises ValueError naming what is wrong."""
    prefix = "udp://"
    if not address.startswith(prefix):
        raise ValueError(f"control address {address!r} must look like udp://HOST:PORT")
    host, sep, port_text = address[len(prefix):].rpartition(":")
    host = host.strip("[]")
    if (not sep or not host or not port_text.isascii() or not port_text.isdigit() or len(port_text) > 5
            or not 0 < int(port_text) < 65536):
        raise ValueError(f"control address {address!r} must look like udp://HOST:PORT")
    return host, int(port_text)


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
