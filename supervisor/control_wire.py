"""The control channel's wire format. The channel is a UDP server that training code reaches from any rank on
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

This module is the wire protocol (message kinds, envelope keys, limits, sealing and checking a
datagram, replay windows, addresses). Both sides import it: :mod:`supervisor.control` (the
supervisor's UDP server) and :mod:`supervisor.client` (the training side). Stdlib only.
"""

from __future__ import annotations

import hmac
import json
import math
import secrets
import struct
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: the channel stays stdlib-only at run time
    pass

MAX_DATAGRAM = 8192  # bytes; larger datagrams are dropped as "oversized"
PROTOCOL_VERSION = 2
MAGIC = b"SV"
KEY_ENV = "SUPERVISOR_KEY"  # the per-run key, in the training's environment only
LEGACY_KEY_ENV = "SUPERVISOR_TOKEN"  # read by the client when $SUPERVISOR_KEY is absent
CONTROL_HOST_ENV = "SUPERVISOR_CONTROL_HOST"  # override of the advertised host
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
