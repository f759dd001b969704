"""Pure renderers: a :class:`Report` (or :class:`StatusView`) to aligned text or Markdown.

Both formats come from one list of blocks (heading, paragraph, table, bullet list), so the text a
person reads in the terminal and the Markdown pasted into an issue say the same thing.
"""

from __future__ import annotations

import textwrap
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .accounting import AccountingState, AccountingView, Agreement, HistoryRow
from .model import AttemptRow, Report
from .status import StatusView
from .textfit import DEFAULT_COLUMNS, fit_table, wrap

EVIDENCE_WIDTH = 160


@dataclass(frozen=True)
class Block:
    kind: str  # h | p | table | list
    text: str = ""
    headers: tuple[str, ...] = ()
    rows: tuple[tuple[str, ...], ...] = ()
    items: tuple[str, ...] = ()


def _h(text: str) -> Block:
    return Block("h", text=text)


def _p(text: str) -> Block:
    return Block("p", text=text)


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> Block:
    return Block("table", headers=tuple(headers), rows=tuple(tuple(_cell(c) for c in r) for r in rows))


def _list(items: Sequence[str]) -> Block:
    return Block("list", items=tuple(items))


# ---------------------------------------------------------------------------------------------
# Formatting of values


def fmt_ts(ts: float | None, with_date: bool = True) -> str:
    if ts is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S" if with_date else "%H:%M:%S", time.localtime(ts))


def fmt_ts_short(ts: float | None) -> str:
    """Month-day and time: enough for a timeline table, and runs do span days."""
    return "-" if ts is None else time.strftime("%m-%d %H:%M:%S", time.localtime(ts))


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = round(seconds)
    if s < 60:
        return f"{max(seconds, 0):.0f}s" if seconds >= 1 or seconds == 0 else f"{seconds:.1f}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"


def fmt_size(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def _short(text: str | None, width: int = EVIDENCE_WIDTH) -> str:
    if not text:
        return "-"
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _steps(a: AttemptRow) -> str:
    if a.first_step is None and a.last_step is None:
        return "-"
    return f"{_cell(a.first_step)}→{_cell(a.last_step)}"


def fmt_lost(steps: int | None, at_least: bool) -> str:
    """``≥5`` when the loss is a lower bound (the last step seen is the last one printed)."""
    return "-" if steps is None else f"{'≥' if at_least else ''}{steps}"


def _resume(a: AttemptRow) -> str:
    if a.resume_path is None and a.resume_step is None:
        return "fresh"
    name = (a.resume_path or "?").rsplit("/", 1)[-1]
    return f"{name} (step {_cell(a.resume_step)})"


def _node(a: AttemptRow) -> str:
    return ",".join(a.nodes) if a.nodes else (a.host or "-")


def _level(v: Any) -> str:
    return f"L{v}" if isinstance(v, int) else _cell(v)


def _value(v: Any) -> str:
    if isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v):
        return v[:12]  # sha256: the first 12 hex digits are plenty to tell values apart
    if isinstance(v, str) and len(v) == 40 and all(c in "0123456789abcdef" for c in v):
        return v[:10]  # git sha
    if v is None:
        return "unset"
    return _cell(v)


# ---------------------------------------------------------------------------------------------
# The report as blocks


def report_blocks(report: Report) -> list[Block]:
    r = report.run
    blocks: list[Block] = [_h(f"Run {r.name or '?'}")]
    facts = [f"run dir: {r.run_dir or '-'}", f"checkpoint dir: {r.checkpoint_dir or '-'}"]
    if r.outcome:
        facts.append(f"outcome: {r.outcome} (supervise exit {_cell(r.exit_code)}): {r.reason or '-'}")
    else:
        facts.append("outcome: none logged (running, or the supervisor was killed)")
    facts.append(f"from {fmt_ts(r.start)} to {fmt_ts(r.end)} ({fmt_duration(r.duration)})")
    facts.append(f"{r.attempts} attempt(s) in {len(r.jobs)} job session(s): "
                 f"{r.restarts} restart(s) in place, {r.requeues} requeue(s)")
    facts.append(f"final step {_cell(r.final_step)}; steps lost {fmt_lost(r.steps_lost, r.steps_lost_at_least)}; "
                 f"wall time lost {fmt_duration(r.wall_lost)}")
    blocks.append(_list(facts))
    if r.problems:
        blocks.append(_h("Problems"))
        blocks.append(_list(r.problems))

    if report.attempts:
        blocks.append(_h("Attempts"))
        blocks.append(_table(
            ("#", "job", "requeue", "node", "start", "duration", "resumed from", "steps", "class", "action",
             "lost", "wall lost"),
            [(a.attempt, a.job_id, a.restart_count, _node(a), fmt_ts_short(a.start),
              fmt_duration(a.duration), _resume(a), _steps(a), a.end_class or ("running" if not a.ended else "?"),
              a.action, fmt_lost(a.steps_lost, a.steps_lost_at_least), fmt_duration(a.wall_lost))
             for a in report.attempts]))
        firsts = [f"attempt {a.attempt} ({a.end_class}) at step {_cell(a.evidence_step)}"
                  f"{' on ' + a.failure_node if a.failure_node else ''}: {_short(a.evidence)}"
                  for a in report.attempts if a.failed]
        if firsts:
            blocks.append(_p("First failure of each attempt:"))
            blocks.append(_list(firsts))
        mism = [f"attempt {a.attempt}: {a.resume_mismatch}" for a in report.attempts if a.resume_mismatch]
        if mism:
            blocks.append(_p("Resume audit failed:"))
            blocks.append(_list(mism))
    blocks.extend(accounting_blocks(report.accounting))

    blocks.append(_h("Verdict"))
    v = report.verdict
    if v is None:
        blocks.append(_p("no verdict (no attempt judged yet)"))
    else:
        blocks.append(_p(verdict_line(v.ok, v.budget, v.reason, v.source)))
    check = report.run.results_check
    if check is not None:
        blocks.append(_h("Results need a check" if not check.settled else "Results check"))
        free = "unknown" if check.crash_free_steps is None else str(check.crash_free_steps)
        blocks.append(_p(f"{free} crash-free steps since the last of these (a fix is believed after "
                         f"{check.crash_free_needed}); a memory or device error can corrupt weights or "
                         "gradients silently before it crashes: compare against a known-good run"))
        blocks.append(_table(("attempt", "what", "step", "evidence"),
                             [(e.attempt, e.what, e.step, _short(e.evidence, 100)) for e in check.events]))

    blocks.append(_h("Checkpoints"))
    if report.checkpoints is None:
        blocks.append(_p("not scanned"))
    elif not report.checkpoints:
        blocks.append(_p("none found"))
    else:
        blocks.append(_table(("file", "size", "verdict", "step", "format", "reason"),
                             [(c.file, fmt_size(c.size), c.verdict or "unchecked", c.step, c.format,
                               _short(c.reason, 80)) for c in report.checkpoints]))
    if report.quarantined:
        blocks.append(_p("Quarantined (renamed aside, never deleted):"))
        blocks.append(_table(("file", "size", "original", "level", "reason", "on disk"),
                             [(q.file, fmt_size(q.size), (q.original or "-").rsplit("/", 1)[-1], _level(q.level),
                               _short(q.reason, 100), q.on_disk) for q in report.quarantined]))

    blocks.append(_h("Drift between attempts"))
    breaking = [d for d in report.drift if d.breaks_reproducibility]
    info = [d for d in report.drift if not d.breaks_reproducibility]
    if not breaking:
        if len(report.run.manifests) > 1:
            blocks.append(_p(f"none: the {len(report.run.manifests)} attempts with a manifest ran the same "
                             "code, config, software and GPU setup"))
        else:
            blocks.append(_p("not checked: fewer than two attempts have a manifest"))
    else:
        blocks.append(_p("NOT one reproducible run:"))
        blocks.append(_table(("what", "attempts", "old", "new"),
                             [(d.what, f"{d.from_attempt}→{d.to_attempt}", _value(d.old), _value(d.new))
                              for d in breaking]))
    if info:
        blocks.append(_list([f"{d.what}: {_value(d.old)} → {_value(d.new)} (attempt {d.from_attempt}→"
                             f"{d.to_attempt})" for d in info]))

    blocks.append(_h("Events"))
    blocks.append(_list(event_lines(report)))
    if report.warnings:
        blocks.append(_h("Warnings"))
        blocks.append(_list(report.warnings))
    return blocks


def verdict_line(ok: bool | None, budget: str | None, reason: str, source: str) -> str:
    """``STOPPED (policy.x.retries): ...`` / ``EXCEEDED (budget): ...`` / ``ok: ...``: one wording for
    the report and ``supervise audit``. The reason carries the numbers that matter; --json has all."""
    if ok:
        state = "ok"
    elif ok is None:
        state = "unknown"
    else:
        state = "STOPPED" if source == "run_end" else "EXCEEDED"
    note = " [last verdict logged by the supervisor]" if source == "log" else ""
    return f"{state}{' (' + budget + ')' if budget else ''}: {reason}{note}"


def event_lines(report: Report) -> list[str]:
    """One line per notable event, in time order."""
    s = report.events_summary
    timed: list[tuple[float, str]] = []

    def add(record: Any, text: str) -> None:
        ts = record.get("ts")
        timed.append((ts if isinstance(ts, (int, float)) else float("inf"), text))

    for n in s.notices:
        add(n, f"stop notice in attempt {_cell(n.get('attempt'))} at {fmt_ts(n.get('ts'))}: "
               f"{n.get('signal') or n.get('source') or '?'}, deadline {fmt_ts(n.get('deadline'))}")
    for a in s.arbitrations:
        add(a, f"arbitration (attempt {_cell(a.get('attempt'))}): {a.get('decision')}: "
               f"{a.get('reason') or '-'}")
    for q in s.requeues:
        add(q, f"requeue of job {q.get('job_id') or '-'} ({q.get('how') or '-'}): "
               f"{q.get('reason') or q.get('result') or '-'}")
    for d in s.decisions:
        add(d, f"decision after attempt {_cell(d.get('attempt'))}: {d.get('action')}: {d.get('reason') or '-'}")
    for st in s.stalls:
        add(st, f"stall in attempt {_cell(st.get('attempt'))} after step {_cell(st.get('last_step'))} "
                f"({fmt_duration(st.get('idle_s'))} idle){'; stacks: ' + st['dump'] if st.get('dump') else ''}")
    for sl in s.slowdowns:
        add(sl, f"slowdown in attempt {_cell(sl.get('attempt'))}: {_cell(sl.get('rate'))} steps/s vs "
                f"median {_cell(sl.get('median_rate'))}")
    for la in s.loss_anomalies:
        add(la, f"loss anomaly in attempt {_cell(la.get('attempt'))} at step {_cell(la.get('step'))}: "
                f"{la.get('kind') or '?'} (loss {_cell(la.get('loss'))}, median {_cell(la.get('median'))})")
    for ab in s.save_aborted:
        add(ab, f"save aborted in attempt {_cell(ab.get('attempt'))}: {ab.get('path') or '-'}: "
                f"{ab.get('reason') or '-'}")
    for w in s.warnings:
        add(w, f"supervisor warning (attempt {_cell(w.get('attempt'))}): {w.get('reason') or '-'}")
    lines = [text for _, text in sorted(timed, key=lambda item: item[0])]
    if s.control_dropped:
        by = ", ".join(f"{k} {v}" for k, v in s.control_dropped_by_reason.items())
        lines.append(f"control messages dropped: {s.control_dropped}{' (' + by + ')' if by else ''}")
    if not lines:
        lines.append("no notices, requeues, stalls, slowdowns or loss anomalies")
    return lines


# ---------------------------------------------------------------------------------------------
# Slurm's own history (report/accounting.py): its own section, 100 columns at most in text

ACCOUNTING_WIDTH = 100
# Cell widths of the history table: with two spaces between columns and the indent, the widest
# possible line is ACCOUNTING_WIDTH (tests/test_report_accounting.py checks it on over-long values).
_HISTORY_COLUMNS = (("job", 9), ("rst", 3), ("state", 10), ("start", 11), ("end", 11), ("elapsed", 7),
                    ("node", 8), ("exit", 5), ("reason", 8), ("attempts", 8))


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _history_end(row: HistoryRow) -> str:
    if row.end is None:
        return "-"
    same_day = row.start is not None and time.localtime(row.start)[:3] == time.localtime(row.end)[:3]
    return time.strftime("%H:%M:%S" if same_day else "%m-%d %H:%M", time.localtime(row.end))


def history_cells(row: HistoryRow) -> tuple[str, ...]:
    """One line of the history table, each cell cut to its column's width."""
    if row.agreement is Agreement.SUPERVISOR_ONLY:
        slurm = ("no record", "-", "-", "-", "-", "-", "-")
    else:
        start = "-" if row.start is None else time.strftime("%m-%d %H:%M", time.localtime(row.start))
        slurm = (row.state or "-", start, _history_end(row), fmt_duration(row.elapsed), row.nodes or "-",
                 row.exit_code or "-", row.reason or "-")
    attempts = ",".join(map(str, row.attempts)) or "-"
    if row.agreement is Agreement.SLURM_ONLY:
        attempts = "NONE!"  # a run Slurm counted that the supervisor has no record of
    elif row.agreement is Agreement.SUPERVISOR_ONLY:
        attempts = _fit(attempts, 6) + " !"  # a session accounting has no record of
    cells = (row.job_id, _cell(row.restart), *slurm, attempts)
    return tuple(_fit(c, w) for c, (_, w) in zip(cells, _HISTORY_COLUMNS))


def _wrapped(text: str) -> str:
    return textwrap.fill(text, width=ACCOUNTING_WIDTH - 4, subsequent_indent="    ")


def accounting_blocks(view: AccountingView | None) -> list[Block]:
    """Slurm's history beside the attempts, or the one line saying why there is none. Nothing when
    the history was not asked for or the run never ran under Slurm."""
    if view is None or view.state in (AccountingState.SKIPPED, AccountingState.NOT_SLURM):
        return []
    if view.state is AccountingState.UNAVAILABLE:
        return [_p(_fit(f"Slurm's history (sacct): not available: {view.reason}", ACCOUNTING_WIDTH))]
    blocks = [_h("Slurm's history (sacct)")]
    blocks.append(_p("Each run of a job as Slurm counted it (rst: restart count), beside the supervisor's attempts."))
    blocks.append(_table([h for h, _ in _HISTORY_COLUMNS], [history_cells(r) for r in view.rows]))
    bad = view.disagreements
    if bad:
        blocks.append(_p(f"Disagreements ({len(bad)}):"))
        blocks.append(_list([_wrapped(f"job {r.job_id} restart {_cell(r.restart)}: {r.note}") for r in bad]))
    else:
        blocks.append(_p("Slurm and the supervisor agree: each run Slurm counted has its supervisor session."))
    return blocks


# ---------------------------------------------------------------------------------------------
# Block renderers


def to_text(blocks: Sequence[Block], width: int = DEFAULT_COLUMNS) -> str:
    """Plain text in at most ``width`` columns (``textfit``): paragraphs and list items wrap, tables
    narrow their widest columns and wrap those cells."""
    out: list[str] = []
    for b in blocks:
        if b.kind == "h":
            if out:
                out.append("")
            heading = wrap(b.text, width)
            out.extend(heading)
            out.append(("=" if not out[:-len(heading)] else "-") * max(len(line) for line in heading))
        elif b.kind == "p":
            out.extend(wrap(b.text, width))
        elif b.kind == "list":
            for item in b.items:
                out.extend(wrap(item, width, "  - ", "    "))
        elif b.kind == "table":
            out.extend(fit_table(b.headers, b.rows, width))
    return "\n".join(out) + "\n"


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(blocks: Sequence[Block]) -> str:
    out: list[str] = []
    first = True
    for b in blocks:
        if b.kind == "h":
            out.append(("## " if first else "### ") + b.text)
            out.append("")
            first = False
        elif b.kind == "p":
            out.extend([b.text, ""])
        elif b.kind == "list":
            out.extend(f"- {_md_cell(item)}" for item in b.items)
            out.append("")
        elif b.kind == "table":
            out.append("| " + " | ".join(_md_cell(h) for h in b.headers) + " |")
            out.append("|" + "|".join("---" for _ in b.headers) + "|")
            out.extend("| " + " | ".join(_md_cell(c) for c in r) + " |" for r in b.rows)
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def render_text(report: Report, width: int = DEFAULT_COLUMNS) -> str:
    return to_text(report_blocks(report), width)


def render_markdown(report: Report) -> str:
    return to_markdown(report_blocks(report))


# ---------------------------------------------------------------------------------------------
# Status


def status_blocks(view: StatusView) -> list[Block]:
    lines = [f"state: {view.state}: {view.liveness_reason}"]
    if view.attempt is not None:
        age = f" ({fmt_duration(view.attempt_age)} ago)" if view.attempt_age is not None else ""
        lines.append(f"attempt {view.attempt} (job {view.job_id or '-'}, {view.host or '-'}), "
                     f"started {fmt_ts(view.attempt_start)}{age}")
    if view.last_step is not None:
        lines.append(f"{_training_text(view)}, reported {fmt_duration(view.progress_age)} ago")
    else:
        lines.append("no step reported yet")
    if view.notice_ts is not None:
        lines.append(f"STOP NOTICE ({view.notice_signal or '?'}) at {fmt_ts(view.notice_ts)}: "
                     + _deadline_text(view.notice_deadline, view.deadline_left))
    if view.last_checkpoint:
        c = view.last_checkpoint
        name = (str(c.get('path') or '-')).rsplit('/', 1)[-1]
        lines.append(f"last checkpoint: step {_cell(c.get('step'))} ({name}), "
                     f"{fmt_duration(view.checkpoint_age)} ago")
    else:
        lines.append("no checkpoint saved yet")
    if view.at_risk_steps is not None:
        lines.append(f"a preemption now would lose {_risk_text(view)} (without an emergency save)")
    lines.append(f"restarts {view.restarts}, requeues {view.requeues}, steps lost so far {view.steps_lost}, "
                 f"wall time lost {fmt_duration(view.wall_lost)}")
    if view.last_failure:
        f = view.last_failure
        lines.append(f"last failure: attempt {f['attempt']} {f['class']} at step {_cell(f.get('step'))}: "
                     f"{_short(f.get('evidence'), 120)}")
    if view.outcome:
        lines.append(f"run ended: {view.outcome} (supervise exit {_cell(view.exit_code)}): {view.reason or '-'}")
    blocks = [_h(f"Run {view.name or '?'} ({view.run_dir})"), _list(lines)]
    if view.problems:
        blocks += [_p("Problems:"), _list(view.problems)]
    if view.warnings:
        blocks += [_p("Warnings:"), _list(view.warnings)]
    return blocks


def _training_text(view: StatusView) -> str:
    """``step 250/1000, loss 0.531, 6.5 steps/s, ETA 1m55s``: what is known of it."""
    parts = [f"step {view.last_step}" + (f"/{view.max_step}" if view.max_step is not None else "")]
    if view.loss is not None:
        parts.append(f"loss {view.loss:.4g}")
    if view.rate is not None:
        parts.append(f"{view.rate:.3g} steps/s")
    if view.eta is not None:
        parts.append(f"ETA {fmt_duration(view.eta)}")
    return ", ".join(parts)


def _risk_text(view: StatusView) -> str:
    time_text = f" (~{fmt_duration(view.at_risk_time)} of training)" if view.at_risk_time is not None else ""
    return f"{view.at_risk_steps} step(s){time_text}"


def _deadline_text(deadline: float | None, left: float | None) -> str:
    """The grace clock as a person reads it: how long is left, or how long ago it ran out."""
    if deadline is None:
        return "no grace deadline known"
    if left is None:
        return f"grace deadline {fmt_ts(deadline)}"
    if left >= 0:
        return f"grace deadline in {fmt_duration(left)} ({fmt_ts(deadline)})"
    return f"grace deadline passed {fmt_duration(-left)} ago ({fmt_ts(deadline)})"


def render_status(view: StatusView, width: int = DEFAULT_COLUMNS) -> str:
    return to_text(status_blocks(view), width)


def status_line(view: StatusView, stamp: str) -> str:
    """The view as one line, for a watch whose output is a file or a pipe (one line per refresh,
    grep-able; not cut to a width: a line is a record)."""
    head = f"{stamp} {view.state}" + (f", attempt {view.attempt}" if view.attempt is not None else "")
    parts = [head + (f": {_training_text(view)}" if view.last_step is not None else ": no step reported yet")]
    if view.last_checkpoint:
        parts.append(f"saved step {_cell(view.last_checkpoint.get('step'))} {fmt_duration(view.checkpoint_age)} ago")
    else:
        parts.append("nothing saved yet")
    if view.at_risk_steps is not None:
        parts.append(f"preemption now loses {_risk_text(view)}")
    if view.notice_ts is not None:
        parts.append(f"STOP NOTICE ({view.notice_signal or '?'}): "
                     + _deadline_text(view.notice_deadline, view.deadline_left))
    if view.outcome:
        parts.append(f"run ended ({view.outcome}): {view.reason or '-'}")
    return "; ".join(parts)
