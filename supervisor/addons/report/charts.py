"""The SVG charts of the HTML post-mortem (wall clock and step lanes, one marker per event): pure
functions of :class:`~supervisor.addons.report.model.Report`. Everything they show is also in the page's
tables, as text (supervisor/addons/report/html.py)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from ...failures.classes import CLASSES, Ending
from .markup import Html, el, px
from .model import AttemptRow, Report
from .render import fmt_duration, fmt_lost, fmt_ts

# ---------------------------------------------------------------------------------------------
# What each attempt looks like on the charts

# One look per kind of attempt end; the legend, the bars and the table badges share it.
_LOOK = {Ending.DONE: "ok", Ending.SCHEDULER: "sched", Ending.PERSON: "person"}  # else "fail"
_END_KIND = {c.value: _LOOK[t.ends] for c, t in CLASSES.items() if t.ends in _LOOK}


def end_kind(a: AttemptRow) -> str:
    """ok | sched | person | fail | running | unknown: the colour of the attempt's bar and badge."""
    if a.end_class is None:
        return "unknown" if a.ended else "running"
    return _END_KIND.get(a.end_class, "fail")


class Mark(str, Enum):
    """What a chart marks; the value names its CSS class (``mk-<value>``) and shape."""

    FAILURE = "failure"
    NOTICE = "notice"
    REQUEUE = "requeue"
    SAVE = "save"
    QUARANTINE = "quarantine"
    STALL = "stall"
    RESUME = "resume"


@dataclass(frozen=True)
class Marker:
    """One thing that happened, placed on both axes where its time or step is known."""

    kind: Mark
    attempt: int | None
    ts: float | None
    step: int | None
    label: str  # the tooltip and the text alternative


MARK_NAMES = {
    Mark.FAILURE: "crash / failure", Mark.NOTICE: "stop notice (preemption, time limit, cancel)",
    Mark.REQUEUE: "requeue", Mark.SAVE: "checkpoint saved", Mark.QUARANTINE: "torn checkpoint quarantined",
    Mark.STALL: "stall (no progress)", Mark.RESUME: "resumed from a checkpoint",
}


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def markers(report: Report) -> list[Marker]:
    """Every marker of both charts, from the report's data only."""
    out: list[Marker] = []
    by_attempt = {a.attempt: a for a in report.attempts}
    for a in report.attempts:
        if a.resume_step is not None:
            out.append(Marker(Mark.RESUME, a.attempt, a.start, a.resume_step,
                              f"attempt {a.attempt} resumed at step {a.resume_step}"
                              f" from {(a.resume_path or '?').rsplit('/', 1)[-1]}"))
        if a.failed:
            step = a.evidence_step if a.evidence_step is not None else a.last_step
            out.append(Marker(Mark.FAILURE, a.attempt, a.end, step,
                              f"attempt {a.attempt}: {a.end_class} at step {step if step is not None else '?'}"
                              f"{' on ' + a.failure_node if a.failure_node else ''}: {a.evidence or '-'}"))
    for p in report.series:
        if p.kind == "save":
            out.append(Marker(Mark.SAVE, p.attempt, p.ts, p.step,
                              f"attempt {p.attempt}: checkpoint of step {p.step} saved"))
    s = report.events_summary
    for notice in s.notices:
        n = _int(notice.get("attempt"))
        row = by_attempt.get(n) if n is not None else None
        deadline = _num(notice.get("deadline"))
        out.append(Marker(Mark.NOTICE, n, _num(notice.get("ts")), row.last_step if row else None,
                          f"attempt {n if n is not None else '?'}: stop notice "
                          f"({notice.get('signal') or notice.get('source') or '?'})"
                          f"{', deadline ' + fmt_ts(deadline) if deadline is not None else ''}"))
    for q in s.requeues:
        if q.get("ok") is False and q.get("how") not in (None, "none"):
            what = "requeue FAILED"
        else:
            what = "requeue"
        n = _int(q.get("attempt"))
        row = by_attempt.get(n) if n is not None else None
        out.append(Marker(Mark.REQUEUE, n, _num(q.get("ts")), row.last_step if row else None,
                          f"{what} of job {q.get('job_id') or '-'} ({q.get('how') or '-'}): "
                          f"{q.get('reason') or q.get('result') or '-'}"))
    for st in s.stalls:
        out.append(Marker(Mark.STALL, _int(st.get("attempt")), _num(st.get("ts")), _int(st.get("last_step")),
                          f"attempt {st.get('attempt', '?')}: stall after step {st.get('last_step', '?')} "
                          f"({fmt_duration(_num(st.get('idle_s')))} idle)"))
    for qr in report.quarantined:
        out.append(Marker(Mark.QUARANTINE, qr.attempt, qr.ts, qr.step,
                          f"quarantined {qr.original or qr.file} (step {qr.step if qr.step is not None else '?'}): "
                          f"{qr.reason or '-'}"))
    return out


# ---------------------------------------------------------------------------------------------
# Axes

_TIME_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200,
               86400, 172800, 345600, 604800)


def time_ticks(span: float, most: int = 8) -> list[float]:
    """Offsets (s) for at most ``most`` gridlines on a span of ``span`` seconds, at round values."""
    step = next((s for s in _TIME_STEPS if span / s <= most), None)
    if step is None:
        step = math.ceil(span / most / 604800) * 604800
    return [i * step for i in range(int(span // step) + 1)]


def step_ticks(top: int, most: int = 8) -> list[int]:
    """0 and round step numbers up to ``top`` (1, 2, 5 x 10^k apart)."""
    if top <= 0:
        return [0]
    raw = top / most
    mag = 10 ** math.floor(math.log10(raw)) if raw >= 1 else 1
    step = next((m * mag for m in (1, 2, 5, 10) if m * mag >= raw), 10 * mag)
    return list(range(0, top + 1, int(step)))


def fmt_offset(seconds: float) -> str:
    """A tick label: ``0``, ``30s``, ``5m``, ``1h30m``, ``2d``, ``1d12h`` (ticks are round values)."""
    s = int(seconds)
    if s == 0:
        return "0"
    out = ""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if s >= size:
            out += f"{s // size}{unit}"
            s %= size
    return out


def fmt_steps(n: float) -> str:
    n = int(n)
    if n >= 1_000_000 and n % 100_000 == 0:
        return f"{n / 1_000_000:g}M"
    if n >= 10_000 and n % 1000 == 0:
        return f"{n // 1000}k"
    return str(n)


# ---------------------------------------------------------------------------------------------
# SVG charts

CHART_W = 960.0
LEFT = 64.0
RIGHT = 24.0
TOP = 12.0
AXIS_H = 34.0


def _row_height(n: int) -> float:
    return max(8.0, min(24.0, 420.0 / max(n, 1)))


def _marker_shape(kind: Mark, x: float, y: float, r: float) -> Html:
    """A shape per kind, so the marks read without colour too (crosses, triangles, squares...)."""
    cls = f"mk mk-{kind.value}"
    if kind is Mark.FAILURE:
        return el("path", d=f"M{px(x - r)} {px(y - r)}L{px(x + r)} {px(y + r)}M{px(x - r)} {px(y + r)}"
                            f"L{px(x + r)} {px(y - r)}", class_=cls)
    if kind is Mark.NOTICE:
        return el("path", d=f"M{px(x - r)} {px(y - r)}L{px(x + r)} {px(y - r)}L{px(x)} {px(y + r)}Z", class_=cls)
    if kind is Mark.SAVE:
        h = r * 0.6
        return el("rect", x=px(x - h), y=px(y - h), width=px(2 * h), height=px(2 * h), class_=cls)
    if kind is Mark.QUARANTINE:
        return el("path", d=f"M{px(x)} {px(y - r)}L{px(x + r)} {px(y)}L{px(x)} {px(y + r)}L{px(x - r)} {px(y)}Z",
                  class_=cls)
    if kind is Mark.STALL:
        return el("path", d=f"M{px(x - r)} {px(y - r)}L{px(x + r)} {px(y - r)}L{px(x - r)} {px(y + r)}"
                            f"L{px(x + r)} {px(y + r)}Z", class_=cls)
    if kind is Mark.REQUEUE:
        return el("circle", cx=px(x), cy=px(y), r=px(r * 0.8), class_=cls)
    return el("circle", cx=px(x), cy=px(y), r=px(r * 0.6), class_=cls)  # resume


def _chart(chart_id: str, title: str, desc: str, height: float, body: Sequence[Html]) -> Html:
    return el("svg", el("title", title, id=f"{chart_id}-title"), el("desc", desc, id=f"{chart_id}-desc"), *body,
              id=chart_id, xmlns="http://www.w3.org/2000/svg", viewBox=f"0 0 {px(CHART_W)} {px(height)}",
              role="img", aria_labelledby=f"{chart_id}-title {chart_id}-desc", class_="chart",
              preserveAspectRatio="xMinYMin meet")


def _lanes(attempts: Sequence[AttemptRow], rh: float, x0: float, x1: float) -> list[Html]:
    out = []
    for i, a in enumerate(attempts):
        y = TOP + i * rh
        if i % 2:
            out.append(el("rect", x=px(x0), y=px(y), width=px(x1 - x0), height=px(rh), class_="lane"))
        if rh >= 10 or i % max(1, round(10 / rh)) == 0:
            out.append(el("text", f"#{a.attempt}", x=px(x0 - 6), y=px(y + rh / 2), class_="lbl",
                          text_anchor="end", dominant_baseline="middle"))
    return out


def _lane_middle(row: dict[int, int], attempt: int | None, rh: float) -> float:
    """The middle of an attempt's lane; a mark of no known attempt goes on the first one."""
    lane = row.get(attempt, 0) if attempt is not None else 0
    return TOP + lane * rh + rh / 2


def _marks(items: Iterable[tuple[Marker, float, float]], r: float) -> list[Html]:
    return [el("g", el("title", m.label), _marker_shape(m.kind, x, y, r), class_="mark") for m, x, y in items]


def wall_chart(report: Report, marks: Sequence[Marker]) -> Html | None:
    """Attempts on wall-clock time: one lane each, a bar from start to end, the marks on top and the
    requeues (new job sessions) as dashed lines. None when no attempt has a start time."""
    attempts = [a for a in report.attempts if a.start is not None]
    if not attempts:
        return None
    times = [a.start for a in attempts if a.start is not None]
    times += [a.end for a in attempts if a.end is not None]
    times += [m.ts for m in marks if m.ts is not None]
    times += [p.ts for p in report.series]
    t0, t1 = min(times), max(times)
    span = max(t1 - t0, 1.0)
    rh = _row_height(len(report.attempts))
    x0, x1 = LEFT, CHART_W - RIGHT
    height = TOP + rh * len(report.attempts) + AXIS_H

    def x(ts: float) -> float:
        return x0 + (ts - t0) / span * (x1 - x0)

    row = {a.attempt: i for i, a in enumerate(report.attempts)}
    body = _lanes(report.attempts, rh, x0, x1)
    bottom = TOP + rh * len(report.attempts)
    for off in time_ticks(span):
        gx = x(t0 + off)
        body.append(el("line", x1=px(gx), y1=px(TOP), x2=px(gx), y2=px(bottom), class_="grid"))
        body.append(el("text", fmt_offset(off), x=px(gx), y=px(bottom + 14), class_="tick",
                       text_anchor="middle"))
    body.append(el("text", f"wall-clock time since {fmt_ts(t0)}", x=px((x0 + x1) / 2), y=px(bottom + 30),
                   class_="axis", text_anchor="middle"))
    for job in report.run.jobs[1:]:
        if job.start is not None:
            jx = x(job.start)
            body.append(el("g", el("title", f"job {job.job_id or '-'} (requeue {job.restart_count or '?'}) started "
                                            f"on {job.host or '?'} at {fmt_ts(job.start)}"),
                           el("line", x1=px(jx), y1=px(TOP), x2=px(jx), y2=px(bottom), class_="session"),
                           class_="mark"))
    for a in attempts:
        i = row[a.attempt]
        assert a.start is not None
        end = a.end if a.end is not None else max([p.ts for p in report.series if p.attempt == a.attempt]
                                                  + [a.last_progress_ts or a.start])
        bx, bw = x(a.start), max(x(end) - x(a.start), 2.0)
        body.append(el("g", el("title", f"attempt {a.attempt}: {fmt_ts(a.start)} to "
                                        f"{fmt_ts(a.end) if a.end is not None else 'still running'} "
                                        f"({fmt_duration(a.duration)}), {a.end_class or 'running'}"),
                       el("rect", x=px(bx), y=px(TOP + i * rh + rh * 0.2), width=px(bw), height=px(rh * 0.6),
                          rx="2", class_=f"bar k-{end_kind(a)}"), class_="mark"))
    placed = []
    for m in marks:
        if m.ts is None or m.kind is Mark.RESUME:
            continue
        placed.append((m, x(m.ts), _lane_middle(row, m.attempt, rh)))
    body.extend(_marks(placed, min(rh * 0.38, 7.0)))
    desc = (f"{len(report.attempts)} attempt(s) from {fmt_ts(t0)} to {fmt_ts(t1)} ({fmt_duration(t1 - t0)}), "
            f"{len(report.run.jobs)} job session(s). " + _marks_summary(marks))
    return _chart("timeline-wall", "Attempts on wall-clock time", desc, height, body)


def step_chart(report: Report, marks: Sequence[Marker]) -> Html | None:
    """Attempts on the step axis: each bar from the step it started at to the last step it reached;
    the part the next attempt had to redo (steps lost) hatched. None when no step is known."""
    steps = [s for a in report.attempts for s in (a.resume_step, a.first_step, a.last_step) if s is not None]
    steps += [m.step for m in marks if m.step is not None]
    if not steps:
        return None
    top = max(max(steps), 1)
    rh = _row_height(len(report.attempts))
    x0, x1 = LEFT, CHART_W - RIGHT
    bottom = TOP + rh * len(report.attempts)
    height = bottom + AXIS_H

    def x(step: float) -> float:
        return x0 + step / top * (x1 - x0)

    row = {a.attempt: i for i, a in enumerate(report.attempts)}
    body = _lanes(report.attempts, rh, x0, x1)
    for t in step_ticks(top):
        gx = x(t)
        body.append(el("line", x1=px(gx), y1=px(TOP), x2=px(gx), y2=px(bottom), class_="grid"))
        body.append(el("text", fmt_steps(t), x=px(gx), y=px(bottom + 14), class_="tick", text_anchor="middle"))
    body.append(el("text", "training step", x=px((x0 + x1) / 2), y=px(bottom + 30), class_="axis",
                   text_anchor="middle"))
    for a in report.attempts:
        i = row[a.attempt]
        fresh = a.resume_step is None and a.resume_path is None
        first = 0 if fresh else (a.resume_step if a.resume_step is not None else (a.first_step or 0))
        if a.last_step is None:
            continue
        last = max(a.last_step, first)
        y = TOP + i * rh + rh * 0.2
        body.append(el("g", el("title", f"attempt {a.attempt}: steps {first} to {last}, {a.end_class or 'running'}"),
                       el("rect", x=px(x(first)), y=px(y), width=px(max(x(last) - x(first), 2.0)),
                          height=px(rh * 0.6), rx="2", class_=f"bar k-{end_kind(a)}"), class_="mark"))
        if a.steps_lost:
            lo = max(last - a.steps_lost, 0)
            body.append(el("g", el("title", f"attempt {a.attempt}: {fmt_lost(a.steps_lost, a.steps_lost_at_least)} "
                                            f"steps lost (steps {lo} to {last} were done again)"),
                           el("rect", x=px(x(lo)), y=px(y), width=px(max(x(last) - x(lo), 2.0)),
                              height=px(rh * 0.6), class_="lost"), class_="mark"))
    placed = []
    for m in marks:
        if m.step is None:
            continue
        placed.append((m, x(m.step), _lane_middle(row, m.attempt, rh)))
    body.extend(_marks(placed, min(rh * 0.38, 7.0)))
    lost = fmt_lost(report.run.steps_lost, report.run.steps_lost_at_least)
    desc = (f"{len(report.attempts)} attempt(s) up to step {top}; {lost} "
            f"steps lost in all (hatched). " + _marks_summary(marks))
    return _chart("timeline-steps", "Attempts on the step axis", desc, height, body)


def _marks_summary(marks: Sequence[Marker]) -> str:
    counts: dict[Mark, int] = {}
    for m in marks:
        counts[m.kind] = counts.get(m.kind, 0) + 1
    if not counts:
        return "Nothing marked."
    return "Marked: " + ", ".join(f"{counts[k]} {MARK_NAMES[k]}" for k in MARK_NAMES if k in counts) + "."


def legend(marks: Sequence[Marker]) -> Html:
    items = []
    for kind, name in (("ok", "completed"), ("sched", "preempted / time limit"), ("fail", "failed"),
                       ("person", "cancelled by a person"), ("running", "running / no end logged")):
        swatch = el("rect", x="1", y="3", width="22", height="10", rx="2", class_=f"bar k-{kind}")
        items.append(el("li", el("svg", swatch, viewBox="0 0 24 16", width="24", height="16", aria_hidden="true"),
                        " ", name))
    items.append(el("li", el("svg", el("rect", x="1", y="3", width="22", height="10", class_="lost"),
                             viewBox="0 0 24 16", width="24", height="16", aria_hidden="true"), " steps lost"))
    present = {m.kind for m in marks}
    for kind, name in MARK_NAMES.items():
        if kind in present:
            items.append(el("li", el("svg", _marker_shape(kind, 12, 8, 6), viewBox="0 0 24 16", width="24",
                                     height="16", aria_hidden="true"), " ", name))
    return el("ul", *items, class_="legend", aria_label="legend")
