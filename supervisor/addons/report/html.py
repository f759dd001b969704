"""The post-mortem as one self-contained HTML page: a file to open offline or attach to an issue.

Built from :class:`~supervisor.addons.report.model.Report` (the pure fold) by pure functions: no clock, no
I/O. The page carries everything inline (CSS, SVG) and loads nothing: no script, font, image or
style from anywhere, and its Content-Security-Policy forbids all of them, so even a browser that
opened a tampered copy would run no script. Every string from the event log is untrusted (evidence
lines are the training's own output) and goes through :func:`el`, which escapes whatever is not
already :class:`Html`.

The charts are SVG with ``<title>``/``<desc>`` and a tooltip per marker; everything they show is
also in the tables below them, as text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from ... import __version__
from .charts import Mark, Marker, end_kind, legend, markers, step_chart, time_ticks, wall_chart
from .markup import Html, el, esc, join
from .accounting import AccountingState, Agreement, HistoryRow
from .model import AttemptRow, CheckpointRow, QuarantineRow, Report
from .render import (
    event_lines,
    fmt_duration,
    fmt_lost,
    fmt_size,
    fmt_ts,
    fmt_ts_short,
    verdict_line,
)

# ---------------------------------------------------------------------------------------------
# Text parts


def _cell(v: Any) -> str:
    if v is None or v == "":
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, caption: str | None = None,
          table_id: str | None = None, numeric: Iterable[int] = ()) -> Html:
    """A plain table; cells may be :class:`Html` (badges, bars) or anything printable."""
    num = set(numeric)
    head = el("thead", el("tr", *(el("th", h, scope="col") for h in headers)))
    body = el("tbody", *(el("tr", *(el("td", c if isinstance(c, Html) else _cell(c),
                                       class_="num" if j in num else None) for j, c in enumerate(r)))
                         for r in rows))
    return el("table", el("caption", caption) if caption else None, head, body, id=table_id)


def badge(text: str, kind: str) -> Html:
    return el("span", text, class_=f"badge k-{kind}")


def _lost_cell(a: AttemptRow, most: int) -> Html:
    text = fmt_lost(a.steps_lost, a.steps_lost_at_least)
    if not a.steps_lost or most <= 0:
        return esc(text)
    width = max(2, round(60 * a.steps_lost / most))
    return join(el("span", class_="lostbar", style=f"width:{width}px", aria_hidden="true"), " ", text)


def _resume(a: AttemptRow) -> str:
    if a.resume_path is None and a.resume_step is None:
        return "fresh start"
    return f"{(a.resume_path or '?').rsplit('/', 1)[-1]} (step {_cell(a.resume_step)})"


def attempts_table(report: Report) -> Html:
    most = max((a.steps_lost or 0 for a in report.attempts), default=0)
    rows = []
    for a in report.attempts:
        steps = "-" if a.first_step is None and a.last_step is None else f"{_cell(a.first_step)} → {_cell(a.last_step)}"
        end = badge(a.end_class or ("running" if not a.ended else "?"), end_kind(a))
        rows.append((a.attempt, a.job_id, a.restart_count, ", ".join(a.nodes) or a.host, fmt_ts_short(a.start),
                     fmt_duration(a.duration), _resume(a), steps, a.last_durable_step, end, a.action,
                     f"{a.saves_ok}" + (f" (+{a.saves_failed} failed)" if a.saves_failed else ""),
                     _lost_cell(a, most), fmt_duration(a.wall_lost)))
    return table(("#", "job", "requeue", "node", "start", "duration", "resumed from", "steps", "last saved",
                  "end", "action", "saves", "steps lost", "wall lost"), rows,
                 caption="One row per launch of the training (attempt), in order", table_id="attempts-table",
                 numeric=(0, 8, 11, 12, 13))


def failures_part(report: Report) -> list[Html]:
    failed = [a for a in report.attempts if a.failed]
    if not failed:
        return [el("p", "No attempt failed.")]
    out = []
    for a in failed:
        step = a.evidence_step if a.evidence_step is not None else a.last_step
        head = (f"Attempt {a.attempt}: {a.end_class} at step {_cell(step)}"
                f"{' on ' + a.failure_node if a.failure_node else ''}")
        lines = a.evidence_lines or ((a.evidence,) if a.evidence else ())
        what = [el("h3", head, id=f"failure-{a.attempt}")]
        facts = [f"the child's exit code {_cell(a.exit_code)}", f"signal {_cell(a.signal)}", f"then: {_cell(a.action)}"]
        if a.decision:
            facts.append(f"because: {a.decision}")
        what.append(el("p", "; ".join(facts)))
        if lines:
            what.append(el("pre", "\n".join(lines), class_="evidence", aria_label=f"evidence of attempt {a.attempt}"))
        else:
            what.append(el("p", "No evidence line in the output (the log says why in the reason above)."))
        if a.context_lines:
            what.append(el("details", el("summary", f"output around it ({len(a.context_lines)} lines)"),
                           el("pre", "\n".join(a.context_lines), class_="context")))
        out.append(el("article", *what, class_="failure"))
    return out


def _checkpoint_counts(rows: Sequence[CheckpointRow]) -> str:
    counts: dict[str, int] = {}
    for c in rows:
        key = c.verdict or "unchecked"
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))


_VERDICT_KIND = {"valid": "ok", "corrupt": "fail", "unverifiable": "sched", "in_progress": "running"}


def checkpoints_part(report: Report) -> list[Html]:
    out: list[Html] = []
    if report.checkpoints is None:
        out.append(el("p", "Not scanned (the checkpoint directory was not found here, or the scan was skipped)."))
    elif not report.checkpoints:
        out.append(el("p", "None found in the checkpoint directory."))
    else:
        out.append(el("p", f"{len(report.checkpoints)} in {report.run.checkpoint_dir or 'the checkpoint directory'}: "
                           f"{_checkpoint_counts(report.checkpoints)}. Checked without loading them "
                           "(no pickle is run)."))
        out.append(table(("file", "size", "verdict", "step", "format", "level", "reason"),
                         [(c.file, fmt_size(c.size),
                           badge(c.verdict or "unchecked", _VERDICT_KIND.get(c.verdict or "", "unknown")),
                           c.step, c.format, c.level, c.reason) for c in report.checkpoints],
                         caption="Checkpoints in the directory, by step", table_id="checkpoints-table",
                         numeric=(1, 3)))
    out.append(el("h3", "Quarantined", id="quarantined"))
    if not report.quarantined:
        out.append(el("p", "Nothing was quarantined."))
    else:
        out.append(el("p", "Torn or corrupt files renamed aside (never deleted), with why:"))
        out.append(table(("file", "original", "size", "step", "attempt", "when", "level", "reason", "on disk"),
                         [_quarantine_row(q) for q in report.quarantined],
                         caption="Quarantined checkpoints", table_id="quarantine-table", numeric=(2, 3, 4)))
    return out


def _quarantine_row(q: QuarantineRow) -> tuple[Any, ...]:
    return (q.file, (q.original or "-").rsplit("/", 1)[-1], fmt_size(q.size), q.step, q.attempt, fmt_ts_short(q.ts),
            q.level, q.reason, q.on_disk)


def _plain_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return ", ".join(_plain_value(i) for i in v)
    return _cell(v)


def verdict_part(report: Report) -> list[Html]:
    v = report.verdict
    if v is None:
        return [el("p", "No verdict: no attempt was judged yet.")]
    kind = "ok" if v.ok else ("unknown" if v.ok is None else "fail")
    out = [el("p", badge("within budget" if v.ok else ("unknown" if v.ok is None else "stopped / exceeded"), kind),
              " ", verdict_line(v.ok, v.budget, v.reason, v.source), class_="verdict")]
    if v.numbers:
        out.append(el("details", el("summary", "the numbers"),
                      table(("what", "value"), [(k, _plain_value(val)) for k, val in v.numbers.items()],
                            table_id="verdict-numbers")))
    return out


def results_part(report: Report) -> list[Html]:
    check = report.run.results_check
    if check is None:
        return []
    free = "an unknown number of" if check.crash_free_steps is None else str(check.crash_free_steps)
    head = "Results need a check" if not check.settled else "Results check (settled)"
    return [el("section", el("h2", head), el("p", badge("check" if not check.settled else "settled",
                                                        "fail" if not check.settled else "sched"), " ",
                                             f"{free} crash-free steps since the last of these; a fix is believed "
                                             f"after {check.crash_free_needed}. A memory or device error can corrupt "
                                             "weights or gradients silently before it crashes: compare against a "
                                             "known-good run."),
               table(("attempt", "what", "step", "evidence"), [(e.attempt, e.what, e.step, e.evidence)
                                                               for e in check.events], table_id="results-table"),
               id="results-check", class_="alert" if not check.settled else None)]


def drift_part(report: Report) -> list[Html]:
    breaking = [d for d in report.drift if d.breaks_reproducibility]
    info = [d for d in report.drift if not d.breaks_reproducibility]
    out: list[Html] = []
    if not breaking:
        if len(report.run.manifests) > 1:
            out.append(el("p", f"None: the {len(report.run.manifests)} attempts with a manifest ran the same code, "
                               "config, software and GPU setup."))
        else:
            out.append(el("p", "Not checked: fewer than two attempts have a manifest."))
    else:
        out.append(el("p", badge("drift", "fail"), " Not one reproducible run: these changed between attempts."))
        out.append(table(("what", "attempts", "old", "new"),
                         [(d.what, f"{d.from_attempt} → {d.to_attempt}", _plain_value(d.old), _plain_value(d.new))
                          for d in breaking], table_id="drift-table"))
    if info:
        out.append(el("p", "Changed, without affecting reproducibility:"))
        out.append(el("ul", *(el("li", f"{d.what}: {_plain_value(d.old)} → {_plain_value(d.new)} "
                                       f"(attempt {d.from_attempt} → {d.to_attempt})") for d in info)))
    return out


def _summary(report: Report) -> Html:
    run = report.run
    lost = fmt_lost(run.steps_lost, run.steps_lost_at_least)
    items: list[tuple[str, Any]] = [
        ("outcome", (run.outcome or "running / no end logged")
         + (f" (supervise exit {run.exit_code})" if run.exit_code is not None else "")),
        ("reason", run.reason),
        ("attempts", f"{run.attempts} ({run.restarts} restart(s) in place, {run.requeues} requeue(s))"),
        ("final step", run.final_step),
        ("steps lost", lost),
        ("wall time lost", fmt_duration(run.wall_lost)),
        ("started", fmt_ts(run.start)),
        ("ended", fmt_ts(run.end)),
        ("duration", fmt_duration(run.duration)),
        ("run directory", run.run_dir),
        ("checkpoint directory", run.checkpoint_dir),
    ]
    return el("dl", *(join(el("dt", k), el("dd", _cell(v))) for k, v in items), class_="summary")


def _outcome_kind(report: Report) -> str:
    outcome = report.run.outcome
    if outcome == "complete":
        return "ok" if not report.run.problems else "sched"
    if outcome == "requeue":
        return "sched"
    if outcome == "interrupted":
        return "person"
    if outcome is None:
        return "running"
    return "fail"


# ---------------------------------------------------------------------------------------------
# The page

CSS = """
:root{--fg:#1b1f24;--muted:#57606a;--bg:#fff;--panel:#f6f8fa;--line:#d0d7de;--ok:#1a7f37;--sched:#bc6c00;
--fail:#cf222e;--person:#6e7781;--run:#0969da;--q:#8250df;--stall:#953800;--save:#1f6feb}
@media (prefers-color-scheme:dark){:root{--fg:#e6edf3;--muted:#9198a1;--bg:#0d1117;--panel:#161b22;
--line:#30363d;--ok:#3fb950;--sched:#d29922;--fail:#f85149;--person:#8b949e;--run:#58a6ff;--q:#bc8cff;
--stall:#db6d28;--save:#79c0ff}}
*{box-sizing:border-box}
body{margin:0 auto;max-width:1100px;padding:16px 20px 40px;font:14px/1.45 system-ui,-apple-system,"Segoe UI",
Roboto,"Helvetica Neue",Arial,sans-serif;color:var(--fg);background:var(--bg)}
h1{font-size:1.6em;margin:.2em 0}h2{font-size:1.25em;border-bottom:1px solid var(--line);padding-bottom:4px;
margin-top:1.8em}h3{font-size:1.05em;margin:1.2em 0 .3em}
nav ul{list-style:none;padding:0;display:flex;flex-wrap:wrap;gap:4px 14px}
a{color:var(--run)}
dl.summary{display:grid;grid-template-columns:max-content 1fr;gap:2px 16px;background:var(--panel);
padding:10px 14px;border-radius:6px;border:1px solid var(--line)}
dl.summary dt{color:var(--muted)}dl.summary dd{margin:0;overflow-wrap:anywhere}
table{border-collapse:collapse;width:100%;margin:.5em 0;font-size:13px}
caption{text-align:left;color:var(--muted);padding:2px 0}
th,td{border:1px solid var(--line);padding:3px 6px;text-align:left;vertical-align:top;overflow-wrap:break-word}
th{background:var(--panel);white-space:nowrap}td.num{text-align:right;white-space:nowrap}
.badge{display:inline-block;padding:0 7px;border-radius:10px;font-size:12px;font-weight:600;color:#fff;
background:var(--person);white-space:nowrap}
.badge.k-ok{background:var(--ok)}.badge.k-sched{background:var(--sched)}.badge.k-fail{background:var(--fail)}
.badge.k-running{background:var(--run)}
.outcome{font-size:1.1em}
.alert{border-left:4px solid var(--fail);padding-left:12px}
ul.problems li{margin:2px 0}
pre{background:var(--panel);border:1px solid var(--line);border-radius:6px;padding:8px 10px;overflow-x:auto;
white-space:pre-wrap;overflow-wrap:anywhere;font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
pre.evidence{border-left:4px solid var(--fail)}
article.failure{margin-bottom:1em}
figure{margin:1em 0}figcaption{color:var(--muted);font-size:13px}
svg.chart{width:100%;height:auto;display:block;background:var(--bg)}
.lane{fill:var(--panel)}.grid{stroke:var(--line);stroke-width:1}.session{stroke:var(--muted);stroke-width:1.5;
stroke-dasharray:5 4}
.lbl,.tick{font-size:11px;fill:var(--muted)}.axis{font-size:12px;fill:var(--fg)}
.bar{fill:var(--person);opacity:.85}.bar.k-ok{fill:var(--ok)}.bar.k-sched{fill:var(--sched)}
.bar.k-fail{fill:var(--fail)}.bar.k-running{fill:var(--run)}.bar.k-unknown{fill:var(--person)}
.lost{fill:var(--fail);fill-opacity:.35;stroke:var(--fail);stroke-width:1;stroke-dasharray:2 2}
.mk{stroke-width:1.5}.mk-failure{stroke:var(--fail);stroke-width:2.5;fill:none}
.mk-notice{fill:var(--sched);stroke:var(--bg)}.mk-save{fill:var(--save);stroke:var(--bg);stroke-width:.8}
.mk-quarantine{fill:var(--q);stroke:var(--bg)}.mk-stall{fill:var(--stall);stroke:var(--bg)}
.mk-requeue{fill:none;stroke:var(--fg);stroke-width:2}.mk-resume{fill:var(--bg);stroke:var(--ok);stroke-width:2}
ul.legend{list-style:none;padding:0;display:flex;flex-wrap:wrap;gap:2px 16px;font-size:12px;color:var(--muted)}
ul.legend svg{vertical-align:middle}
.lostbar{display:inline-block;height:9px;background:var(--fail);opacity:.6;border-radius:2px;vertical-align:middle}
footer{margin-top:3em;color:var(--muted);font-size:12px}
@media print{nav{display:none}body{max-width:none}h2{break-after:avoid}table,figure{break-inside:avoid}}
"""

# Nothing is loaded from anywhere and no script runs, whatever the page holds.
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"

SECTIONS = (("problems", "Needs a look"), ("verdict", "Budget verdict"), ("results-check", "Results check"),
            ("timeline", "Timeline"), ("attempts", "Attempts"), ("accounting", "Slurm's history"),
            ("failures", "First failures"),
            ("events", "Events"), ("checkpoints", "Checkpoints"), ("drift", "Drift"), ("warnings", "Warnings"))


# ---------------------------------------------------------------------------------------------
# Slurm's own history (report/accounting.py)

_AGREEMENT_BADGE = {Agreement.MATCHED: ("agrees", "ok"), Agreement.NOT_STARTED: ("never ran", "sched"),
                    Agreement.SLURM_ONLY: ("no supervisor record", "fail"),
                    Agreement.SUPERVISOR_ONLY: ("no Slurm record", "fail")}


def _history_row(r: HistoryRow) -> tuple[Any, ...]:
    text, kind = _AGREEMENT_BADGE[r.agreement]
    slurm = r.agreement is not Agreement.SUPERVISOR_ONLY
    return (r.job_id, r.restart, r.state if slurm else "no record", fmt_ts(r.start) if slurm else "-",
            fmt_ts(r.end) if slurm else "-", fmt_duration(r.elapsed) if slurm else "-", r.nodes, r.exit_code,
            r.reason, ", ".join(map(str, r.attempts)) or "-", badge(text, kind))


def accounting_part(report: Report) -> list[Html]:
    """The history table with its disagreements, or one paragraph saying why there is none; nothing
    when the history was not asked for or the run never ran under Slurm."""
    view = report.accounting
    if view is None or view.state in (AccountingState.SKIPPED, AccountingState.NOT_SLURM):
        return []
    if view.state is AccountingState.UNAVAILABLE:
        return [el("p", f"Not available: {view.reason}. The attempts above are the supervisor's record only.")]
    out = [table(("job", "restart", "state", "start", "end", "elapsed", "node", "exit", "reason", "attempts",
                  "agreement"), [_history_row(r) for r in view.rows],
                 caption="Each run of the job as Slurm's accounting counted it, with the supervisor's attempts in "
                         "it", table_id="history-table", numeric=(1,))]
    bad = view.disagreements
    if bad:
        out.append(el("ul", *(el("li", f"job {r.job_id} restart {_cell(r.restart)}: {r.note}") for r in bad),
                      class_="problems"))
    else:
        out.append(el("p", "Slurm and the supervisor agree: every run Slurm counted has its supervisor session."))
    return out


def render_html(report: Report) -> str:
    """The whole page, as one string (UTF-8 when written)."""
    run = report.run
    name = run.name or "run"
    marks = markers(report)
    parts: list[Html] = []
    present: set[str] = set()

    def section(sid: str, title: str, *content: Any, class_: str | None = None) -> None:
        present.add(sid)
        parts.append(el("section", el("h2", title), *content, id=sid, class_=class_))

    if run.problems:
        section("problems", "Needs a look", el("ul", *(el("li", p) for p in run.problems), class_="problems"),
                class_="alert")
    section("verdict", "Budget verdict", *verdict_part(report))
    results = results_part(report)
    if results:
        present.add("results-check")
        parts.extend(results)

    charts: list[Html] = []
    wall = wall_chart(report, marks)
    steps = step_chart(report, marks)
    if wall is not None:
        charts.append(el("figure", wall, el("figcaption", "Each lane is one attempt, left to right in wall-clock time; "
                                                          "dashed lines are new job sessions (requeues). Hover a mark "
                                                          "for what it is.")))
    if steps is not None:
        caption = ("The same attempts on the step axis: where each one started and how far it got; hatched steps "
                   "were lost and done again.")
        charts.append(el("figure", steps, el("figcaption", caption)))
    if charts:
        section("timeline", "Timeline", legend(marks), *charts)
    else:
        section("timeline", "Timeline", el("p", "No attempt has started yet: nothing to draw."))
    section("attempts", "Attempts", attempts_table(report) if report.attempts else el("p", "No attempts."))
    history = accounting_part(report)
    if history:
        section("accounting", "Slurm's history (sacct)", *history)
    section("failures", "First failure of each attempt", *failures_part(report))
    section("events", "Events", el("ul", *(el("li", line) for line in event_lines(report))))
    section("checkpoints", "Checkpoints", *checkpoints_part(report))
    section("drift", "Drift between attempts", *drift_part(report))
    if report.warnings:
        section("warnings", "Warnings", el("ul", *(el("li", w) for w in report.warnings)))

    nav = el("nav", el("ul", *(el("li", el("a", title, href=f"#{sid}")) for sid, title in SECTIONS if sid in present)),
             aria_label="sections")
    outcome = el("p", badge(run.outcome or "running", _outcome_kind(report)), " ",
                 run.reason or ("no run_end logged yet: running, or the supervisor was killed"), class_="outcome")
    head = el("head", Html('<meta charset="utf-8">'),
              Html(f'<meta http-equiv="Content-Security-Policy" content="{esc(CSP)}">'),
              Html('<meta name="viewport" content="width=device-width, initial-scale=1">'),
              Html('<meta name="color-scheme" content="light dark">'),
              el("title", f"{name}: post-mortem ({run.outcome or 'running'})"),
              el("style", Html(CSS)))
    body = el("body", el("header", el("h1", f"Run {name}", id="top"), outcome, _summary(report)), nav,
              el("main", *parts),
              el("footer", f"supervise report {__version__}, folded from {run.run_dir or 'the run directory'}"
                           "/supervisor/events.jsonl. Self-contained: no script, nothing loaded from the network."))
    return "<!DOCTYPE html>\n" + el("html", head, body, lang="en") + "\n"


def section_ids(page: str) -> list[str]:
    """The ids of the page's sections, in order (what a reader can jump to)."""
    return re.findall(r'<section id="([^"]+)"', page)


__all__ = ["Html", "Mark", "Marker", "el", "esc", "markers", "render_html", "section_ids", "step_chart", "time_ticks",
           "wall_chart"]
