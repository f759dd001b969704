"""Supervisor side of the control channel: a UDP server that training code reaches from any rank on
any node of the job (docs/architecture.md "Control channel").

Why UDP: a send never blocks training, and srun tasks on other nodes (which are not our children and
inherit no file descriptors, only the environment) can reach ``udp://HOST:PORT``. Every datagram is
compact JSON of at most :data:`MAX_DATAGRAM` bytes carrying the per-run token. Datagrams that are
forged, malformed, oversized or lost to a flood are dropped and counted, never raised: the channel is
advisory and the supervisor must outlive anything a child sends it.

The wire protocol (message kinds, envelope keys, size limit) lives here; :mod:`supervisor.client`
speaks it from the training side. Stdlib only.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import socket
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Mapping

MAX_DATAGRAM = 8192  # bytes; larger datagrams are dropped as "oversized"
PROTOCOL_VERSION = 1
_NOT_FIELDS = frozenset({"v", "kind", "token"})  # Message.fields keeps rank/pid/host/attempt too
CONTROL_HOST_ENV = "SUPERVISOR_CONTROL_HOST"  # override of the advertised host
MAX_CLIENTS = 16384  # hello'd clients remembered for broadcast; the oldest is forgotten beyond this
_RCVBUF_BYTES = 1 << 20  # ask for 1 MiB; the kernel bounds the queue (and so our memory) under a flood
_SO_RXQ_OVFL = getattr(socket, "SO_RXQ_OVFL", 40)  # Linux: count of datagrams the kernel dropped


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

# Per-kind field checks, so the run loop can trust what poll() returns. (name, check, required)
_INT = "int"
_OPT_INT = "int?"
_OPT_NUM = "num?"
_STR = "str"
_OPT_STR = "str?"
_BOOL = "bool"
_DICT = "dict"
_OPT_DICT = "dict?"
_SCHEMA: dict[Kind, tuple[tuple[str, str], ...]] = {
    Kind.HELLO: (("reply_port", _INT),),
    Kind.HEARTBEAT: (("step", _INT), ("metrics", _OPT_DICT)),
    Kind.SAVE_BEGIN: (("step", _OPT_INT), ("path", _STR)),
    Kind.SAVE_END: (("step", _OPT_INT), ("path", _STR), ("bytes", _OPT_INT), ("duration", _OPT_NUM),
                    ("ok", _BOOL)),
    Kind.RESUMED: (("step", _INT),),
    Kind.DETERMINISM: (("settings", _DICT),),
    Kind.DONE: (("step", _OPT_INT),),
    Kind.STOP: (("reason", _OPT_STR), ("deadline", _OPT_NUM)),
    Kind.ABORT_SAVE: (("path", _OPT_STR), ("reason", _OPT_STR)),
    Kind.SAVE_NOW: (("deadline", _OPT_NUM),),
}


def new_token() -> str:
    """A per-run secret that every datagram must carry (128 bits, hex)."""
    return secrets.token_hex(16)


def parse_address(address: str) -> tuple[str, int]:
    """``udp://HOST:PORT`` -> (host, port). Raises ValueError naming what is wrong."""
    prefix = "udp://"
    if not address.startswith(prefix):
        raise ValueError(f"control address {address!r} must look like udp://HOST:PORT")
    host, sep, port_text = address[len(prefix):].rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"control address {address!r} must look like udp://HOST:PORT")
    return host, int(port_text)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _type_ok(value: Any, check: str) -> bool:
    if value is None:
        return check.endswith("?")
    base = check.rstrip("?")
    if base == _INT:
        return isinstance(value, int) and not isinstance(value, bool)
    if base == "num":
        return _is_number(value)
    if base == _STR:
        return isinstance(value, str)
    if base == _BOOL:
        return isinstance(value, bool)
    if base == _DICT:
        return isinstance(value, dict)
    return False


def check_fields(kind: Kind, record: Mapping[str, Any]) -> str | None:
    """Why ``record`` is not a well-formed ``kind`` message, or None when it is."""
    for name, check in _SCHEMA[kind]:
        if not _type_ok(record.get(name), check):
            return f"{kind.value}.{name} must be {check}"
    if kind is Kind.HELLO and not 0 < record["reply_port"] < 65536:
        return "hello.reply_port out of range"
    if kind is Kind.HEARTBEAT and record.get("metrics"):
        if not all(v is None or _is_number(v) for v in record["metrics"].values()):
            return "heartbeat.metrics values must be numbers"
    return None


def encode(kind: Kind, token: str, **fields: Any) -> bytes:
    """One datagram. Python's json writes NaN/Infinity, which :func:`decode` reads back: a
    non-finite loss must survive the trip."""
    record = {"v": PROTOCOL_VERSION, "kind": kind.value, "token": token}
    record.update(fields)
    return json.dumps(record, separators=(",", ":"), default=str).encode()


class Rejected(Exception):
    """A datagram that is dropped; ``reason`` is one of the drop counters."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def decode(data: bytes, token: str, allowed: frozenset[Kind]) -> tuple[Kind, dict[str, Any]]:
    """Check size, JSON, token and shape. Raises :class:`Rejected` with the drop reason."""
    if len(data) > MAX_DATAGRAM:
        raise Rejected("oversized", f"{len(data)} bytes")
    try:
        record = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise Rejected("malformed", "not JSON") from None
    if not isinstance(record, dict):
        raise Rejected("malformed", "not a JSON object")
    sent_token = record.get("token")
    if not isinstance(sent_token, str) or not hmac.compare_digest(
            sent_token.encode("utf-8", "surrogatepass"), token.encode()):  # constant time
        raise Rejected("bad_token")
    try:
        kind = Kind(record.get("kind"))
    except ValueError:
        raise Rejected("malformed", f"unknown kind {record.get('kind')!r}") from None
    if kind not in allowed:
        raise Rejected("malformed", f"{kind.value} is not sent in this direction")
    for name in ("rank", "pid", "attempt"):
        if not _type_ok(record.get(name), _OPT_INT):
            raise Rejected("malformed", f"{name} must be an integer")
    if not _type_ok(record.get("host"), _OPT_STR):
        raise Rejected("malformed", "host must be a string")
    problem = check_fields(kind, record)
    if problem:
        raise Rejected("malformed", problem)
    return kind, record


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


@dataclass(frozen=True)
class Message:
    """One accepted client datagram. ``fields`` holds every key but ``v``, ``kind`` and ``token``
    (so the envelope's rank/pid/host/attempt are there too, as well as in the attributes)."""

    kind: Kind
    fields: dict[str, Any]
    sender: tuple[str, int]  # (ip, port) the datagram came from
    rank: int | None
    pid: int | None
    attempt: int | None
    host: str | None
    received_at: float  # epoch seconds, read when the datagram was drained

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


@dataclass(frozen=True)
class ControlStats:
    """Counters since the server started. ``flood`` is what the kernel dropped on a full queue."""

    received: int = 0  # datagrams read from the socket
    accepted: int = 0
    bad_token: int = 0
    malformed: int = 0
    oversized: int = 0
    flood: int = 0
    sent: int = 0
    send_failed: int = 0
    clients: int = 0

    @property
    def dropped(self) -> dict[str, int]:
        return {"bad_token": self.bad_token, "malformed": self.malformed, "oversized": self.oversized,
                "flood": self.flood}

    def drops_since(self, earlier: "ControlStats") -> dict[str, int]:
        """New drops per reason since ``earlier`` (for a ``control_dropped`` event); zeros left out."""
        before = earlier.dropped
        return {k: v - before[k] for k, v in self.dropped.items() if v - before[k] > 0}


@dataclass
class _Counters:
    received: int = 0
    accepted: int = 0
    sent: int = 0
    send_failed: int = 0
    flood: int = 0
    drops: dict[str, int] = field(default_factory=lambda: {"bad_token": 0, "malformed": 0, "oversized": 0})


class ControlServer:
    """UDP endpoint of the supervisor. Non-blocking: :meth:`poll` drains what is queued, at most
    ``max_messages`` per call; the kernel's receive queue is the only buffer, so a flood costs
    bounded memory and the excess is dropped by the kernel (counted as ``flood`` on Linux).
    :meth:`fileno` lets a run loop wait on the socket with ``selectors``.
    """

    def __init__(self, token: str, host: str | None = None, port: int = 0,
                 clock: Callable[[], float] = time.time, environ: Mapping[str, str] | None = None) -> None:
        if not token:
            raise ValueError("ControlServer needs a non-empty token")
        self.token = token
        self._bind_host = host or "0.0.0.0"
        self._port = port
        self._clock = clock
        self._environ = environ
        self._sock: socket.socket | None = None
        self._advertised = ""
        self._clients: OrderedDict[tuple[str, int], ClientInfo] = OrderedDict()
        self._counts = _Counters()

    # lifecycle -------------------------------------------------------------------------------

    def start(self) -> "ControlServer":
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.bind((self._bind_host, self._port))
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
        self._sock = sock
        self._advertised = advertised_host(self._bind_host, self._environ)
        return self

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> "ControlServer":
        return self.start() if self._sock is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def port(self) -> int:
        return self._require_socket().getsockname()[1]

    @property
    def address(self) -> str:
        """``udp://HOST:PORT`` to export as ``SUPERVISOR_CONTROL``."""
        return f"udp://{self._advertised}:{self.port}"

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
        for _ in range(max_messages):
            try:
                data, anc, _flags, sender = sock.recvmsg(MAX_DATAGRAM + 1, ancillary)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break  # e.g. a stray ICMP error reported on the socket: nothing to read now
            self._counts.received += 1
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == _SO_RXQ_OVFL and len(payload) >= 4:
                    self._counts.flood = max(self._counts.flood, int.from_bytes(payload[:4], "little"))
            message = self._accept(data, sender)
            if message is not None:
                out.append(message)
        return out

    def _accept(self, data: bytes, sender: tuple[str, int]) -> Message | None:
        try:
            kind, record = decode(data, self.token, CLIENT_KINDS)
        except Rejected as exc:
            self._counts.drops[exc.reason] += 1
            return None
        self._counts.accepted += 1
        now = self._clock()
        fields = {k: v for k, v in record.items() if k not in _NOT_FIELDS}
        message = Message(kind=kind, fields=fields, sender=(sender[0], sender[1]), rank=record.get("rank"),
                          pid=record.get("pid"), attempt=record.get("attempt"), host=record.get("host"),
                          received_at=now)
        if kind is Kind.HELLO:
            self._remember(message, (sender[0], int(fields["reply_port"])))
        return message

    def _remember(self, message: Message, address: tuple[str, int]) -> None:
        self._clients.pop(address, None)
        self._clients[address] = ClientInfo(address, message.rank, message.pid, message.host,
                                            message.attempt, message.received_at)
        while len(self._clients) > MAX_CLIENTS:
            self._clients.popitem(last=False)

    # sending ---------------------------------------------------------------------------------

    def broadcast(self, kind: Kind | str, **fields: Any) -> int:
        """Send one supervisor message to every client that said hello; returns how many sends
        the kernel took. UDP may lose a datagram: repeat a ``stop`` until the child is gone."""
        kind = Kind(kind)
        if kind not in SUPERVISOR_KINDS:
            raise ValueError(f"{kind.value} is not a supervisor-to-client message")
        problem = check_fields(kind, fields)
        if problem:
            raise ValueError(problem)
        data = encode(kind, self.token, **fields)
        if len(data) > MAX_DATAGRAM:
            raise ValueError(f"{kind.value} message is {len(data)} bytes, over {MAX_DATAGRAM}")
        sock = self._sock
        if sock is None:
            return 0
        sent = 0
        for address in list(self._clients):
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
                            send_failed=c.send_failed, clients=len(self._clients), **c.drops)
