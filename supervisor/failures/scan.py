"""Reading an output tail: lines split and cleaned, candidate lines found by needles, matches
scored, and the first failure chosen and located (node, rank, step). Pure text processing."""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

from ..progress import StepExtractor
from ..signals import signal_name
from ..states import FailureClass
from .patterns import (
    CAUSE,
    COMPLETION_MARKERS,
    CONSEQUENCE,
    DEFAULT_PATTERNS,
    ECHO,
    EVIDENCE_CHARS,
    FC,
    MAX_LINE_CHARS,
    REFINE_WINDOW,
    TORCHRUN_SUMMARY_LABEL,
    TORCHRUN_SUMMARY_OOM_LABEL,
    TRACEBACK_MAX_LINES,
    VERDICT,
    CompletionMarker,
    FailurePattern,
    launcher_signal_class,
)

# ---------------------------------------------------------------------------------------------
# Reading the text


_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_PREFIX = re.compile(
    r"^(?:\s{0,6}(?P<label>\d{1,6}): "  # srun --label
    r"|\[(?:rank|default)\s?(?P<rank>\d{1,6})\]:\s?"  # torchrun --tee / [rank3]: prefixes
    r"|\[\d+,(?P<mpi>\d+)\]<std(?:out|err)>:\s?"  # mpirun --tag-output
    r"|[\w.-]+: (?=\[rank\d))"  # pdsh host prefix before a rank prefix (DeepSpeed launcher)
)
_PREFIX_FIRST = frozenset("[ \t0123456789")
_TRACEBACK = re.compile(r"Traceback \(most recent call last\)")
_EXC_LINE = re.compile(
    r"^(?P<name>(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*)(?P<colon>:(?:\s.*)?)?$")
_EXC_SUFFIX = re.compile(r"(?:Error|Exception|Interrupt|Exit|Warning|Failure|Fault|Timeout|Failed|Iteration|Group)$")
_FRAME_START = ("File ", "│", "╭", "╰", "┃", "^", "~")
_NODE_PATTERNS = (
    re.compile(r"srun: error: (?P<node>[\w.\-]+): tasks? (?P<rank>\d+)"),
    re.compile(r"\bON (?P<node>[\w.\-]+) CANCELLED AT"),
    re.compile(r"Node failure on (?P<node>[\w.\-]+)"),
    re.compile(r"STEPD TERMINATED ON (?P<node>[\w.\-]+)"),
    re.compile(r"^(?P<node>[A-Za-z][\w.\-]*):\d+:\d+ \[\d+\] "),  # NCCL's host:pid:tid [dev] prefix
    re.compile(r"noticed that process rank (?P<rank>\d+) with PID \S+ on node (?P<node>[\w.\-]+)"),  # mpirun
)
_SRUN_ECHO = re.compile(r": (?:Killed|Terminated)\b")  # srun lines for tasks killed because another failed
_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\)")
_RULE = re.compile(r"^\s*={8,}\s*$")
_FIELD = re.compile(r"^\s*(time|host|rank|exitcode|error_file|traceback)\s*:\s?(.*)$")


@dataclass
class _Line:
    idx: int
    raw: str  # colours removed, cut to MAX_LINE_CHARS, prefix kept
    text: str  # the prefix taken off
    stream: str  # which prefix it had ("" = none): tracebacks and refinements stay within a stream
    rank: int | None
    frame: bool = False  # inside a Python traceback (a frame or its source line)


@dataclass
class _Match:
    line: int  # index of the decisive line
    start: int  # index where the failure began (a traceback's first line)
    pattern: FailurePattern | None  # None for a plain Python exception or a synthesized summary
    cls: FailureClass
    priority: int
    generic: bool
    label: str
    extra: tuple[int, ...] = ()  # more evidence lines (a refinement, a torchrun summary)
    node: str | None = None
    rank: int | None = None
    overrides: frozenset[FailureClass] = frozenset()
    signum: int | None = None  # a launcher's summary: the signal its root-cause worker died of


# A worker that died of one of these was not ended by a peer going away: when the launcher names
# it as the first failure, another rank's "connection reset" or collective timeout is that rank
# noticing the death (FailurePattern.peer_reaction). A fabric error is never such a reaction.
_HARD_CRASH_SIGNALS = frozenset({11, 7, 4, 8})  # SIGSEGV, SIGBUS, SIGILL, SIGFPE


def _split_lines(text: str) -> list[_Line]:
    lines: list[_Line] = []
    for physical in text.split("\n"):
        for segment in physical.split("\r") if "\r" in physical else (physical,):
            if len(segment) > MAX_LINE_CHARS:
                segment = segment[:MAX_LINE_CHARS]
            if "\x1b" in segment:
                segment = _ANSI.sub("", segment)
            if not segment.strip():
                continue
            body, stream, rank = segment, "", None
            maybe_prefixed = segment[:1] in _PREFIX_FIRST or ": [rank" in segment[:100]
            for _ in range(3 if maybe_prefixed else 0):
                m = _PREFIX.match(body)
                if m is None or m.end() == 0:
                    break
                if m.group("rank") is not None:
                    rank = int(m.group("rank"))
                elif m.group("mpi") is not None:
                    rank = int(m.group("mpi"))
                elif m.group("label") is not None and rank is None:
                    rank = int(m.group("label"))
                stream += m.group(0).strip()
                body = body[m.end():]
            lines.append(_Line(len(lines), segment.rstrip(), body.rstrip(), stream, rank))
    return lines


def _clean(text: str) -> str:
    """One line as reported: tabs folded; a long line keeps its start and its end (a launcher prints
    the whole argv before ``exits with return code = -9``)."""
    text = " ".join(text.split()) if "\t" in text else text.strip()
    if len(text) <= EVIDENCE_CHARS:
        return text
    half = (EVIDENCE_CHARS - 3) // 2
    return text[:half] + " … " + text[-half:]


def _needle_union(patterns: Sequence[FailurePattern]) -> tuple[str, ...] | None:
    """Every needle of the table, or None when a pattern has none (then no line can be skipped)."""
    if not patterns or not all(p.needles for p in patterns):
        return None
    return tuple(sorted({n for p in patterns for n in p.needles}))


def _best_match(text: str, patterns: Sequence[FailurePattern],
                union: tuple[str, ...] | None) -> tuple[FailurePattern, FailureClass] | None:
    """The most decisive pattern on one line: specific before generic, then the lowest priority, then the
    table's order (generics by table order alone: the narrower ones come first)."""
    low = text.lower()
    if union is not None and not any(n in low for n in union):
        return None
    best: tuple[tuple[int, int, int], FailurePattern, FailureClass] | None = None
    for order, pat in enumerate(patterns):
        if pat.needles and not any(n in low for n in pat.needles):
            continue
        m = pat.regex.search(text)
        if m is None:
            continue
        cls = pat.resolve(m)
        if cls is None:
            continue
        key = (int(pat.generic), 0 if pat.generic else pat.priority, order)
        if best is None or key < best[0]:
            best = (key, pat, cls)
    return None if best is None else (best[1], best[2])


_DEFAULT_UNION = _needle_union(DEFAULT_PATTERNS)


@dataclass
class _Traceback:
    start: int
    prefix: str  # text before "Traceback" on its line (a logging prefix repeated on every line)
    lines: int = 0


def _exception_name(text: str) -> str | None:
    """The exception's name when ``text`` is a traceback's final line (``KeyError: 'x'``, ``AssertionError``)."""
    m = _EXC_LINE.match(text)
    if m is None:
        return None
    name = m.group("name")
    last = name.rsplit(".", 1)[-1]
    if not last[:1].isupper():
        return None
    # Python prints non-builtin exceptions with their module (``torch.OutOfMemoryError``); builtins and
    # most others end in Error/Exception/...: a bare ``INFO: saving`` from another writer is neither.
    if "." not in name and not _EXC_SUFFIX.search(last):
        return None
    if m.group("colon") is None and not _EXC_SUFFIX.search(last):
        return None
    return name


def _is_frame(body: str) -> bool:
    return not body.strip() or body[:1].isspace() or body.startswith(_FRAME_START)


def _traceback_prefix(text: str, at: int) -> str:
    """A logging prefix before ``Traceback`` is repeated on each line; box drawing (rich) is not a prefix."""
    prefix = text[:at]
    return prefix if any(ch.isalnum() for ch in prefix) else ""


def _candidate_lines(lines: list[_Line], union: tuple[str, ...] | None) -> set[int] | None:
    """Lines holding any needle, found by one C-level ``str.find`` sweep per needle over the whole text
    (most lines of a training log hold none, and per-line checks in Python cost more than the regexes)."""
    if union is None:
        return None
    lows = [line.text.lower() for line in lines]
    starts: list[int] = []
    pos = 0
    for low in lows:
        starts.append(pos)
        pos += len(low) + 1
    joined = "\n".join(lows)
    hits: set[int] = set()
    for needle in union:
        at = joined.find(needle)
        while at >= 0:
            idx = bisect_right(starts, at) - 1
            hits.add(idx)
            at = joined.find(needle, starts[idx + 1]) if idx + 1 < len(starts) else -1
    return hits


def _scan(lines: list[_Line], patterns: Sequence[FailurePattern], union: tuple[str, ...] | None) -> list[_Match]:
    """One pass: pattern matches per line, Python tracebacks per stream, torchrun summaries."""
    matches: list[_Match] = []
    candidates = _candidate_lines(lines, union)
    open_tb: dict[str, _Traceback] = {}
    skip_until = -1  # inside a torchrun ChildFailedError summary: only its root cause counts
    if lines and lines[0].text[:1].isspace() and any(ln.text.lstrip().startswith('File "') for ln in lines[:3]):
        open_tb[lines[0].stream] = _Traceback(0, "")  # the tail starts inside a traceback (header cut off)

    for line in lines:
        if line.idx <= skip_until:
            continue
        text = line.text
        tb = open_tb.get(line.stream)
        if tb is not None:
            body: str | None = text
            if tb.prefix:
                if text.startswith(tb.prefix):
                    body = text[len(tb.prefix):]
                elif tb.lines == 0:
                    tb.prefix = ""  # the prefix was on the header line only
                else:
                    body = None  # another writer's line in the middle: match it normally
            if body is not None:
                tb.lines += 1
                if tb.lines > TRACEBACK_MAX_LINES:
                    del open_tb[line.stream]
                elif _is_frame(body):
                    line.frame = True
                    continue
                else:
                    name = _exception_name(body.strip())
                    if name is not None:
                        del open_tb[line.stream]
                        known = candidates is None or line.idx in candidates
                        skip_until = _add_exception(lines, line, body, name, tb.start, patterns if known else (),
                                                    matches)
                        continue
        tb_at = _TRACEBACK.search(text)
        if tb_at is not None:
            open_tb[line.stream] = _Traceback(line.idx, _traceback_prefix(text, tb_at.start()))
            continue
        if candidates is not None and line.idx not in candidates:
            continue
        found = _best_match(text, patterns, None)
        if found is None:
            continue
        pat, cls = found
        matches.append(_Match(line.idx, line.idx, pat, cls, pat.priority, pat.generic, pat.label_for(cls),
                              rank=line.rank, overrides=pat.overrides))
        if "ChildFailedError" in text:
            skip_until = _torchrun_summary(lines, line, matches)
    return matches


def _add_exception(lines: list[_Line], line: _Line, body: str, name: str, start: int,
                   patterns: Sequence[FailurePattern], matches: list[_Match]) -> int:
    """A traceback's final line: evidence by the table if a pattern knows it, else a Python exception."""
    found = _best_match(body, patterns, None)
    if found is None:
        cls = FC.CANCELLED if name.endswith("KeyboardInterrupt") else FC.PYTHON_EXCEPTION
        matches.append(_Match(line.idx, start, None, cls, CAUSE, False, f"Python exception {name}", rank=line.rank))
        return -1
    pat, cls = found
    matches.append(_Match(line.idx, start, pat, cls, pat.priority, pat.generic, pat.label_for(cls),
                          rank=line.rank, overrides=pat.overrides))
    if "ChildFailedError" in body:
        return _torchrun_summary(lines, line, matches)
    return -1


def _summary_end(lines: list[_Line], start: int) -> int:
    """Index of the closing ``=====`` rule of a torchrun summary that starts at ``start``."""
    rules = 0
    for line in lines[start + 1:start + 400]:
        if _RULE.match(line.text):
            rules += 1
            if rules == 2:
                return line.idx
    return start


def _torchrun_summary(lines: list[_Line], line: _Line, matches: list[_Match]) -> int:
    """torchrun's ``ChildFailedError`` summary: replace its echo by the root cause it names (host,
    rank, exit code, traceback). Returns the index of the summary's last line (skipped after)."""
    end = _summary_end(lines, line.idx)
    head = next((p.idx for p in lines[line.idx + 1:end + 1] if _ROOT_CAUSE.search(p.text)), None)
    if head is None:
        return end
    fields: dict[str, tuple[int, str]] = {}
    tb_lines: list[_Line] = []
    for probe in lines[head + 1:end]:
        m = _FIELD.match(probe.text)
        if m is not None and m.group(1) not in fields:
            fields[m.group(1)] = (probe.idx, m.group(2).strip())
        elif "traceback" in fields and probe.text.strip():
            tb_lines.append(probe)
    code_m = re.match(r"(-?\d+)", fields.get("exitcode", (0, ""))[1])
    if code_m is None or int(code_m.group(1)) == 0:
        return end
    code = int(code_m.group(1))
    evidence = [fields["exitcode"][0]]
    if code < 0:
        cls = launcher_signal_class(-code)  # torchrun outlived the worker: a SIGKILL is the OOM killer
        if "traceback" in fields:
            evidence.append(fields["traceback"][0])
    else:
        cls = FC.UNKNOWN  # the worker's own traceback, if printed, came earlier and is a cause
        if tb_lines:
            last = tb_lines[-1].text.strip()
            found = _best_match(last, DEFAULT_PATTERNS, None)
            if found is not None and not found[0].generic:
                cls = found[1]
            elif _exception_name(last):
                cls = FC.PYTHON_EXCEPTION
            evidence.append(tb_lines[-1].idx)
    host = fields.get("host", (0, ""))[1] or None
    rank_m = re.match(r"(\d+)", fields.get("rank", (0, ""))[1])
    if matches and matches[-1].line == line.idx:
        matches.pop()
    label = TORCHRUN_SUMMARY_OOM_LABEL if cls == FC.HOST_OOM else TORCHRUN_SUMMARY_LABEL
    matches.append(_Match(evidence[0], head, None, cls, CONSEQUENCE, False, label,
                          extra=tuple(evidence[1:]), node=host, rank=int(rank_m.group(1)) if rank_m else None,
                          signum=-code if code < 0 else None))
    return end


# ---------------------------------------------------------------------------------------------
# Choosing the first failure


def _refine(m: _Match, matches: list[_Match], pos: int, lines: list[_Line]) -> _Match:
    """A generic match takes the class of a specific cause on the next lines of the same stream; a
    launcher's report of the same death (``mpirun noticed that process rank 0 ... exited on signal
    11``) only adds where it happened, and a network error explains nothing (a peer that lost its
    connection to the crashed process prints it; NCCL's own "Last error" counts on its own line)."""
    stream = lines[m.line].stream
    limit = min(len(lines), m.line + 1 + REFINE_WINDOW * 8)  # other streams may interleave
    in_stream = {ln.idx for ln in lines[m.line + 1:limit] if ln.stream in (stream, "")}
    window = sorted(in_stream)[:REFINE_WINDOW]
    last = window[-1] if window else m.line
    where: _Match | None = None
    for other in matches[pos + 1:]:
        if other.line > last:
            break
        if other.line == m.line or other.line not in in_stream:
            continue
        if other.generic or other.priority > CONSEQUENCE:
            continue
        if other.cls == FC.INTERCONNECT:
            continue  # a network error right after a crash is the peers' reaction to it, not its explanation
        if other.pattern is not None and other.pattern.child_report:
            where = where or other
            continue
        return _Match(m.line, m.start, other.pattern, other.cls, other.priority, False, other.label,
                      extra=(other.line,) + other.extra, node=other.node or m.node, rank=m.rank,
                      overrides=other.overrides)
    if where is not None:
        return _Match(m.line, m.start, m.pattern, m.cls, m.priority, False, m.label,
                      extra=(where.line,) + where.extra, node=where.node or m.node, rank=m.rank,
                      overrides=m.overrides)
    return m


class _Steps:
    """The global step each line reports (shared patterns of supervisor.progress), computed once per line."""

    def __init__(self, lines: list[_Line], extractor: StepExtractor) -> None:
        self._lines, self._extractor = lines, extractor
        self._memo: dict[int, int | None] = {}

    def at(self, idx: int) -> int | None:
        if idx not in self._memo:
            line = self._lines[idx]
            self._memo[idx] = None if line.frame else self._extractor.extract(line.text)
        return self._memo[idx]

    def before(self, idx: int) -> int | None:
        """The last step reported on or before line ``idx``."""
        for i in range(min(idx, len(self._lines) - 1), -1, -1):
            step = self.at(i)
            if step is not None:
                return step
        return None

    def went_on_after(self, idx: int, floor: int | None) -> bool:
        """Two distinct later steps beyond ``floor``: training went on. (Ranks in lock step can each
        print one more step after a peer died, never two.)"""
        later: set[int] = set()
        for i in range(idx + 1, len(self._lines)):
            step = self.at(i)
            if step is not None and (floor is None or step > floor):
                later.add(step)
                if len(later) >= 2:
                    return True
        return False


def _choose(matches: list[_Match], lines: list[_Line], steps: _Steps) -> tuple[_Match | None, list[_Match]]:
    """The first failure, and the later ones set aside as its consequences."""
    if not matches:
        return None, []
    verdicts = [m for m in matches if m.priority == VERDICT]
    if verdicts:
        return verdicts[0], [m for m in matches if m is not verdicts[0]]

    candidates: list[_Match] = []
    seen_failure = False
    for pos, m in enumerate(matches):
        if m.generic:
            if seen_failure:
                continue  # the echo of a failure already seen (an abort after a watchdog timeout)
            m = _refine(m, matches, pos, lines)
        survivable = (m.cls == FC.PYTHON_EXCEPTION and m.pattern is None) or (m.pattern is not None
                                                                           and m.pattern.transient)
        if survivable and steps.went_on_after(m.line, steps.before(m.start)):
            continue  # a logged exception or a link flap after which training went on: not what ended it
        candidates.append(m)
        if m.priority <= CONSEQUENCE:
            seen_failure = True
    if not candidates:
        return None, []
    top = min(c.priority for c in candidates)
    chosen = next(c for c in candidates if c.priority == top)
    for c in candidates:  # evidence that beats the chosen class wherever it appears
        if chosen.cls in c.overrides and c.priority <= CAUSE:
            chosen = c
            break
    if chosen.pattern is not None and chosen.pattern.peer_reaction and chosen.rank is not None:
        crashed = next((c for c in candidates if c.signum in _HARD_CRASH_SIGNALS
                        and c.rank is not None and c.rank != chosen.rank), None)
        if crashed is not None:  # another rank's lost peer vs. the worker torchrun saw die first
            chosen = crashed
    return chosen, [c for c in candidates if c is not chosen]


def _find_completion(lines: list[_Line], matches: list[_Match]) -> tuple[int, CompletionMarker] | None:
    """The last line that says training finished all its steps, if nothing failed after it.

    After it only a kill's own echoes may follow (``Killed``, ``Terminated``, ``srun: ... task 0:
    Killed``, a step cancelled): any cause or consequence, a task that exited with an error, a
    traceback, or a scheduler verdict means something went wrong after all, and the text decides
    as usual. Used only for a child killed from outside (or of unknown status).
    """
    candidates = _candidate_lines(lines, tuple(sorted({n for mk in COMPLETION_MARKERS for n in mk.needles})))
    found: tuple[int, CompletionMarker] | None = None
    for idx in sorted(candidates or ()):
        line = lines[idx]
        if line.frame:
            continue
        marker = next((mk for mk in COMPLETION_MARKERS if mk.regex.search(line.text)), None)
        if marker is not None:
            found = (idx, marker)
    if found is None:
        return None
    for m in matches:
        if m.line > found[0] and (m.priority < ECHO or m.cls not in (FC.KILLED, FC.CANCELLED)):
            return None
    return found


def _has_name(node: str) -> bool:
    """A host name has a letter or digit (redacted logs print ``...``)."""
    return any(ch.isalnum() for ch in node)


def _locate(chosen: _Match, lines: list[_Line]) -> tuple[str | None, int | None]:
    node, rank = chosen.node, chosen.rank
    for idx in (chosen.line,) + chosen.extra:
        text = lines[idx].text
        for rx in _NODE_PATTERNS:
            m = rx.search(text)
            if m is None or not _has_name(m.group("node")):
                continue
            node = node or m.group("node")
            if rank is None and "rank" in rx.groupindex and m.group("rank") is not None:
                rank = int(m.group("rank"))
    if rank is None:
        rank = lines[chosen.line].rank
    if node is None:  # srun names the node of each task that failed
        rx = _NODE_PATTERNS[0]
        own_failures: set[str] = set()
        for line in lines:
            m = rx.search(line.text)
            if m is None:
                continue
            if not _has_name(m.group("node")):
                continue
            if rank is not None and int(m.group("rank")) == rank:
                return m.group("node"), rank
            if not _SRUN_ECHO.search(line.text):
                own_failures.add(m.group("node"))
        if len(own_failures) == 1:  # one node reported a task's own failure: that is where it happened
            node = own_failures.pop()
    return node, rank


def _status_text(exit_code: int | None, sig: int | None) -> str:
    if sig is not None:
        return f"killed by {signal_name(sig)}"
    if exit_code is None:
        return "exit status unknown"
    return f"exit status {exit_code}"


