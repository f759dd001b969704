"""Text that fits the terminal: the width to fit, and tables and list items fitted to it.

One helper for every text view (``supervise report``, ``supervise status``), so a table and an
event line wrap the same way. Pure except :func:`columns`, which reads the environment and asks
whether stdout is a terminal.
"""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
from collections.abc import Mapping, Sequence
from typing import TextIO

DEFAULT_COLUMNS = 100  # a file, a pipe, a Slurm log: what a person reads it in without scrolling sideways
MIN_COLUMNS = 40  # below this, wrapping costs more than it helps: lines are cut at 40
MIN_CELL = 6  # a table column is never squeezed narrower than this (or its widest cell, if less)


def columns(environ: Mapping[str, str] | None = None, stream: TextIO | None = None) -> int:
    """The width to fit: ``COLUMNS`` when it is a positive number, else the terminal's width when
    ``stream`` (stdout) is one, else :data:`DEFAULT_COLUMNS`."""
    environ = os.environ if environ is None else environ
    stream = sys.stdout if stream is None else stream
    raw = environ.get("COLUMNS", "").strip()
    if raw.isdigit() and int(raw) > 0:
        return max(int(raw), MIN_COLUMNS)
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        tty = False
    if tty:
        size = shutil.get_terminal_size((DEFAULT_COLUMNS, 24)).columns
        return max(size, MIN_COLUMNS) if size > 0 else DEFAULT_COLUMNS
    return DEFAULT_COLUMNS


def wrap(text: str, width: int, first: str = "", rest: str = "") -> list[str]:
    """``text`` as lines of at most ``width`` characters: ``first`` before the first line, ``rest``
    before the others. Words longer than a line (a path, a hash) are split rather than overflow."""
    width = max(width, MIN_COLUMNS)
    lines = textwrap.wrap(text, width=width, initial_indent=first, subsequent_indent=rest,
                          break_long_words=True, break_on_hyphens=False, drop_whitespace=True)
    return lines or [first.rstrip()]


def _fit_widths(natural: list[int], words: list[int], room: int) -> list[int]:
    """Narrow the widest columns, one character at a time, until the row fits ``room``: first only
    down to each column's longest word (cells wrap between words), then, if that is not enough, down
    to :data:`MIN_CELL` (long words are split)."""
    widths = list(natural)
    for floors in (words, [min(n, MIN_CELL) for n in natural]):
        while sum(widths) > room:
            shrinkable = [i for i, w in enumerate(widths) if w > floors[i]]
            if not shrinkable:
                break
            widest = max(shrinkable, key=lambda i: widths[i])
            widths[widest] -= 1
    return widths


def _longest_word(cells: Sequence[str]) -> int:
    return max((len(word) for cell in cells for word in cell.split()), default=1)


def _cell_lines(text: str, width: int) -> list[str]:
    if len(text) <= width:
        return [text]
    return textwrap.wrap(text, width=width, break_long_words=True, break_on_hyphens=False) or [""]


def fit_table(headers: Sequence[str], rows: Sequence[Sequence[str]], width: int, indent: str = "  ",
              gap: str = "  ") -> list[str]:
    """An aligned table in at most ``width`` columns: when the natural layout is wider, the widest
    columns are narrowed and their cells wrap onto continuation lines (nothing is dropped)."""
    natural = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    room = max(width, MIN_COLUMNS) - len(indent) - len(gap) * max(len(headers) - 1, 0)
    words = [min(n, _longest_word([h, *(r[i] for r in rows)])) for i, (n, h) in enumerate(zip(natural, headers))]
    widths = _fit_widths(natural, words, room)

    def render(cells: Sequence[str]) -> list[str]:
        parts = [_cell_lines(c, w) for c, w in zip(cells, widths)]
        height = max((len(p) for p in parts), default=1)
        out = []
        for k in range(height):
            line = gap.join((p[k] if k < len(p) else "").ljust(w) for p, w in zip(parts, widths))
            out.append((indent + line).rstrip())
        return out

    lines = render(headers) + [(indent + gap.join("-" * w for w in widths)).rstrip()]
    for row in rows:
        lines.extend(render(row))
    return lines


def cut(line: str, width: int) -> str:
    """One line cut to ``width`` characters, ending in an ellipsis when cut (a last resort)."""
    width = max(width, MIN_COLUMNS)
    return line if len(line) <= width else line[: width - 1] + "…"
