"""Text that reaches a terminal or a document shows what it is, never acts. STDLIB ONLY, pure.

A checkpoint name, a path, an output line quoted as evidence or a host name read back from the run
directory can hold control characters: ESC starts a terminal escape sequence (recolour, move the
cursor, retitle the window), CR and LF rewrite or forge a line of a report, bidirectional
overrides (U+202E...) make ``step-100.pt`` display as something else. Every renderer (``report``
in all its forms, ``status``, ``verify``, ``resume-point``, ``diagnose``) passes such strings
through :func:`printable` (or :func:`printable_value` for nested data) so they are shown escaped:
``\\x1b``, ``\\n``, ``\\u202e``. A backslash is left as it is, so an ordinary Windows-style path
reads unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["is_printable", "printable", "printable_value"]

# C0 controls (TAB included: it realigns columns), DEL, C1 controls, the bidirectional marks,
# embeddings, overrides and isolates, line/paragraph separators, and the BOM/zero-width no-break.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff]")
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    ch = match.group(0)
    if ch in _SHORT:
        return _SHORT[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: Any) -> str:
    """``text`` as a string with every control and bidi character written as an escape."""
    s = text if isinstance(text, str) else str(text)
    return _UNSAFE.sub(_escape, s) if _UNSAFE.search(s) else s


def is_printable(text: str) -> bool:
    """True when :func:`printable` would leave ``text`` unchanged."""
    return _UNSAFE.search(text) is None


def printable_value(value: Any, _depth: int = 0) -> Any:
    """A copy of nested data (dicts, lists, tuples) with every string, keys included, made
    :func:`printable`; other values as they are."""
    if isinstance(value, str):
        return printable(value) if not is_printable(value) else value
    if _depth > 50:
        return value
    if isinstance(value, Mapping):
        return {printable(k) if isinstance(k, str) else k: printable_value(v, _depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [printable_value(v, _depth + 1) for v in value]
    if isinstance(value, tuple):
        return tuple(printable_value(v, _depth + 1) for v in value)
    return value
