"""Tolerant readers for event-log fields: the log may come from another version, a killed writer or
a hand edit, so a field of the wrong type reads as None (unknown), never as an exception or a guess.
Numbers are bounded: a 400-digit string is not a step."""

from __future__ import annotations

import math
from typing import Any

MAX_DIGITS = 18  # beyond any step, byte count or pid; int() of thousands of digits is slow or refused


def as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and abs(value) < 1e18:
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        digits = text[1:] if text.startswith("-") else text
        if digits.isascii() and digits.isdigit() and len(digits) <= MAX_DIGITS:
            return int(text)
    return None


def as_float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return None if math.isnan(number) else number


def as_str(value: Any) -> str | None:
    return None if value is None or value == "" else str(value)


def as_nodes(value: Any) -> tuple[str, ...]:
    """A node list written as one name or a list of names."""
    if isinstance(value, str):
        return (value,) if value else ()
    if isinstance(value, (list, tuple)):
        return tuple(str(x) for x in value if x)
    return ()
