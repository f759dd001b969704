"""Markup for the HTML post-mortem, escaped by construction: every string goes through :func:`el`,
which escapes whatever is not already :class:`Html` (see supervisor/addons/report/html.py)."""

from __future__ import annotations

import html
import math
import re
from collections.abc import Iterable
from typing import Any

# ---------------------------------------------------------------------------------------------
# Markup: escaped by construction


class Html(str):
    """Text that is already markup. Anything else handed to :func:`el` is escaped."""


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def esc(value: Any) -> Html:
    """Escape for text and attribute values alike; control characters (never valid in HTML) go."""
    if isinstance(value, Html):
        return value
    return Html(html.escape(_CONTROL.sub("\ufffd", "" if value is None else str(value)), quote=True))


def el(tag: str, *children: Any, **attrs: Any) -> Html:
    """``<tag attrs>children</tag>``. ``class_`` is ``class``, ``aria_label`` is ``aria-label``; an
    attribute whose value is None or False is left out; True gives a bare attribute."""
    parts = [tag]
    for name, value in attrs.items():
        if value is None or value is False:
            continue
        key = name.rstrip("_").replace("_", "-")
        parts.append(key if value is True else f'{key}="{esc(value)}"')
    inner = "".join(esc(c) for c in _flatten(children))
    return Html(f"<{' '.join(parts)}>{inner}</{tag}>")


def _flatten(items: Iterable[Any]) -> Iterable[Any]:
    for item in items:
        if isinstance(item, (list, tuple)):
            yield from _flatten(item)
        elif item is not None:
            yield item


def join(*items: Any) -> Html:
    return Html("".join(esc(i) for i in _flatten(items)))


def px(x: float) -> str:
    """A coordinate: short, and never 'nan' (a NaN would break the SVG)."""
    return "0" if not math.isfinite(x) else f"{x:.1f}".rstrip("0").rstrip(".")
