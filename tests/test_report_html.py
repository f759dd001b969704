"""``supervise report --html``: one self-contained page, escaped, readable without JavaScript.

Two halves. The page itself, from logs written the way the run loop writes them (a hostile one among
them: evidence lines are the training's own output and may hold markup). Then the page in a real
browser: headless Chromium opens the reports of real ``supervise run`` sessions of the example
training (a native crash restarted and resumed, then a preemption, a requeue and a torn checkpoint
quarantined; and a crash loop the budget stops), with no console message, the sections a reader
jumps to, and a screenshot of a sane size.

Chromium is Debian's ``chromium`` package. Without it the browser tests skip, saying so, except in CI
(``CI`` set), where they fail: CI installs it, so a missing browser there is a broken CI, not a pass.
``REPORT_SCREENSHOT_DIR=DIR`` keeps the screenshots (docs/report-screenshot.png is the story run's).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
import zlib
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from supervisor.events import Ev, EventLog
from supervisor.addons.report import build_report
from supervisor.addons.report.html import render_html, section_ids, time_ticks
from tests.helpers import EXAMPLES, run_supervise, start_supervise, wait_for

PY = sys.executable
PLAIN = str(EXAMPLES / "train_plain.py")
FAST = ["--set", "policy.native_crash.backoff=0.1"]
HOSTILE = "<script>console.error('pwned')</script><img src=x onerror=\"console.error('img')\">"
WINDOW = (1200, 1600)


# ---------------------------------------------------------------------------------------------
# What the page is made of


class Tags(HTMLParser):
    """Every element and attribute of a page, and its text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str, str | None]] = []
        self.ids: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        for name, value in attrs:
            self.attrs.append((tag, name, value))
            if name == "id" and value:
                self.ids.append(value)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse(page: str) -> Tags:
    t = Tags()
    t.feed(page)
    return t


# What the renderer may produce: anything else in a page came from the log and was not escaped.
ALLOWED_TAGS = {"html", "head", "meta", "title", "style", "body", "header", "h1", "h2", "h3", "p", "nav", "ul",
                "li", "a", "main", "section", "dl", "dt", "dd", "table", "caption", "thead", "tbody", "tr", "th",
                "td", "span", "figure", "figcaption", "svg", "desc", "g", "rect", "line", "text", "path", "circle",
                "article", "pre", "details", "summary", "footer"}


def hostile_run(run_dir: Path) -> Path:
    """A run whose log carries markup where the training's output goes: evidence, reasons, names."""
    log = EventLog(run_dir / "supervisor" / "events.jsonl")
    log.emit(Ev.RUN_START, name=f"exp{HOSTILE}", run_dir=str(run_dir), checkpoint_dir=str(run_dir / "ckpt"),
             host="n1", job_id="9", restart_count=0)
    log.emit(Ev.ATTEMPT_START, attempt=1, pid=1, host="n1", job_id="9", restart_count=0, nodes=["n1\x07"],
             resume_path=None, resume_step=None)
    log.emit(Ev.PROGRESS, attempt=1, step=40, rate=2.0, source="regex")
    log.emit(Ev.SAVE_END, attempt=1, step=30, path=f"/ck/step=30{HOSTILE}.ckpt", bytes=1, duration=0.1, ok=True)
    log.emit(Ev.STALL, attempt=1, last_step=40, idle_s=600.0, dump=f"/x/{HOSTILE}")
    log.emit(Ev.ATTEMPT_END, attempt=1, exit_code=1, signal=None, duration=30.0, first_step=0, last_step=40,
             last_durable_step=30, steps_lost=10, wall_lost=12.0, **{"class": "python_exception", "action": "stop"})
    log.emit(Ev.FAILURE, attempt=1, action="stop", step=40, node="n1",
             evidence=[f"RuntimeError: bad batch {HOSTILE}", "</pre></section><h1>forged</h1>", "x\x00y\x1bz"],
             context=[f"step 40 loss nan {HOSTILE}"], **{"class": "python_exception"})
    log.emit(Ev.QUARANTINE, attempt=1, path=f"/ck/last{HOSTILE}.ckpt", dest=f"/ck/CORRUPT_last{HOSTILE}.ckpt.9",
             ok=True, reason="torn </style><script>x</script>", level=1, step=35)
    log.emit(Ev.RUN_END, outcome="stopped", exit_code=4, reason=f"stopped: {HOSTILE}", attempts=1, last_step=40)
    log.close()
    return run_dir


def chart(page: str, chart_id: str) -> str:
    found = re.search(rf'<svg id="{chart_id}".*?</svg>', page, re.DOTALL)
    assert found, f"no chart {chart_id}"
    return found.group(0)


def test_every_string_from_the_log_is_escaped(tmp_path: Path) -> None:
    page = render_html(build_report(hostile_run(tmp_path / "run")))
    tags = parse(page)
    assert set(tags.tags) <= ALLOWED_TAGS, set(tags.tags) - ALLOWED_TAGS
    assert tags.tags.count("h1") == 1  # "<h1>forged</h1>" in the output stayed text
    assert not [a for a in tags.attrs if a[1].startswith("on") or a[1] == "src"], "event handler or src attribute"
    text = "".join(tags.text)
    assert "RuntimeError: bad batch <script>console.error('pwned')</script>" in text  # shown, as text
    assert "</pre></section><h1>forged</h1>" in text
    assert "\x00" not in page and "\x1b" not in page and "\x07" not in page


def test_the_page_loads_nothing_and_runs_nothing(tmp_path: Path) -> None:
    page = render_html(build_report(hostile_run(tmp_path / "run")))
    tags = parse(page)
    assert "script" not in tags.tags and "link" not in tags.tags and "img" not in tags.tags
    hrefs = [v for tag, name, v in tags.attrs if name == "href"]
    assert hrefs and all(v and v.startswith("#") for v in hrefs), hrefs  # in-page links only
    assert "url(" not in page and "@import" not in page
    csp = [v for tag, name, v in tags.attrs if tag == "meta" and name == "content" and v and "default-src" in v]
    assert csp and "default-src 'none'" in csp[0] and "script-src" not in csp[0]


def test_charts_and_tables_tell_the_same_story(tmp_path: Path) -> None:
    """Logged the way the run loop logs a crash, a restart, a preemption and a requeue (tests/test_report.py's
    scenario); the charts mark what the report holds, and the tables say it in text."""
    from tests.test_report import write_scenario

    run_dir = tmp_path / "runs" / "exp1"
    write_scenario(run_dir, {})
    rep = build_report(run_dir)
    page = render_html(rep)
    tags = parse(page)
    for sid in ("verdict", "timeline", "timeline-wall", "timeline-steps", "attempts", "failures", "checkpoints",
                "quarantined", "drift", "events"):
        assert sid in tags.ids, sid
    # Each chart is an image with a title and a description, for screen readers.
    for chart_id in ("timeline-wall", "timeline-steps"):
        assert f'aria-labelledby="{chart_id}-title {chart_id}-desc"' in page
        assert f'<title id="{chart_id}-title">' in page and f'<desc id="{chart_id}-desc">' in page
    # One row per attempt; one failure marker per failed attempt on each chart; a hatched loss per
    # attempt that lost steps on the step chart.
    rows = re.search(r'<table id="attempts-table">.*?</table>', page, re.DOTALL)
    assert rows and rows.group(0).count("<tr>") == len(rep.attempts) + 1
    failed = sum(a.failed for a in rep.attempts)
    wall, steps = chart(page, "timeline-wall"), chart(page, "timeline-steps")
    assert wall.count('class="mk mk-failure"') == failed == steps.count('class="mk mk-failure"')
    assert steps.count('class="lost"') == sum(1 for a in rep.attempts if a.steps_lost)
    notices = len(rep.events_summary.notices)
    assert notices and wall.count('class="mk mk-notice"') == notices
    assert wall.count('class="session"') == len(rep.run.jobs) - 1  # the requeue's new job session
    saves = sum(1 for p in rep.series if p.kind == "save")
    assert steps.count('class="mk mk-save"') == saves
    first = next(a for a in rep.attempts if a.failed)
    assert f"attempt {first.attempt}: {first.end_class} at step {first.evidence_step}" in page  # a tooltip
    assert first.evidence and first.evidence in "".join(tags.text)  # the evidence as text
    for q in rep.quarantined:
        assert q.file in "".join(tags.text)
    assert render_html(rep) == page  # pure: the same report, the same page


def test_results_that_need_a_check_have_their_own_section(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "run" / "supervisor" / "events.jsonl")
    log.emit(Ev.RUN_START, name="ima", run_dir=str(tmp_path / "run"), host="g1")
    log.emit(Ev.ATTEMPT_START, attempt=1, host="g1", resume_path=None, resume_step=None)
    log.emit(Ev.PROGRESS, attempt=1, step=1200, rate=3.0, source="client")
    log.emit(Ev.ATTEMPT_END, attempt=1, exit_code=1, signal=None, duration=400.0, first_step=0, last_step=1200,
             last_durable_step=1000, steps_lost=200, wall_lost=60.0, **{"class": "illegal_memory_access",
                                                                         "action": "restart"})
    log.emit(Ev.FAILURE, attempt=1, action="restart", step=1200, node="g1", evidence=[
        "RuntimeError: CUDA error: an illegal memory access was encountered"], **{"class": "illegal_memory_access"})
    log.close()
    rep = build_report(tmp_path / "run", check_checkpoints=False)
    assert rep.run.results_check is not None and not rep.run.results_check.settled
    page = render_html(rep)
    assert section_ids(page).index("results-check") < section_ids(page).index("timeline")  # near the top
    section = re.search(r'<section id="results-check".*?</section>', page, re.DOTALL)
    assert section and "Results need a check" in section.group(0)
    assert "an illegal memory access was encountered" in section.group(0)


@pytest.mark.parametrize("span", [1.0, 42.0, 3600.0, 3 * 86400.0, 40 * 86400.0])
def test_time_axis_has_a_few_round_ticks_over_the_whole_span(span: float) -> None:
    ticks = time_ticks(span)
    step = ticks[1] - ticks[0]
    assert 2 <= len(ticks) <= 9 and ticks[0] == 0
    assert all(b - a == step for a, b in itertools.pairwise(ticks))
    assert ticks[-1] <= span < ticks[-1] + step  # the last gridline is within a step of the end


def test_a_run_with_no_attempt_yet_still_renders(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "run" / "supervisor" / "events.jsonl")
    log.emit(Ev.RUN_START, name="fresh", run_dir=str(tmp_path / "run"), host="n1")
    log.close()
    page = render_html(build_report(tmp_path / "run"))
    assert "No attempt has started yet" in page and "timeline" in section_ids(page)


def test_cli_writes_the_page_and_keeps_the_exit_code(tmp_path: Path) -> None:
    run_dir = hostile_run(tmp_path / "run")
    out = tmp_path / "report.html"
    res = run_supervise(["report", str(run_dir), "--html", str(out)])
    assert res.returncode == 1  # the run stopped: a problem, as without --html
    assert out.read_text().startswith("<!DOCTYPE html>") and f"html report written to {out}" in res.stderr
    assert "Run exp" in res.stdout  # the text report still goes to stdout
    js = run_supervise(["report", str(run_dir), "--json", "--html", str(out)])
    assert json.loads(js.stdout)["html"] == {"path": str(out)}
    bad = run_supervise(["report", str(run_dir), "--html", str(tmp_path / "no" / "such" / "dir.html")])
    assert bad.returncode == 2 and "does not exist" in bad.stderr and "Traceback" not in bad.stderr


# ---------------------------------------------------------------------------------------------
# In a real browser

def chromium_binary() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
        pytest.fail("chromium is not installed; CI must install Debian's 'chromium' package (apt-get install -y chromium)")
    pytest.skip("chromium is not installed here (Debian: apt-get install -y chromium); CI installs it")


def open_in_browser(page: Path, tmp: Path, screenshot: Path) -> tuple[str, list[str]]:
    """Load the page in headless Chromium: the DOM it built, and its console messages."""
    argv = [chromium_binary(), "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run", "--hide-scrollbars",
            "--disable-extensions", "--disable-background-networking", f"--user-data-dir={tmp / 'chromium-profile'}",
            "--enable-logging=stderr", "--v=0", f"--window-size={WINDOW[0]},{WINDOW[1]}",
            f"--screenshot={screenshot}", "--dump-dom", page.as_uri()]
    res = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=180, cwd=tmp)
    assert res.returncode == 0, res.stderr[-3000:]
    console = [line for line in res.stderr.splitlines() if re.search(r":CONSOLE[(:\]]", line)]
    return res.stdout, console


def png_facts(path: Path) -> tuple[int, int, int]:
    """Width, height and the number of distinct byte values in the pixel data (1 = a blank image)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    pos, idat = 8, b""
    while pos < len(data):
        size, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + size]
        pos += 12 + size
    return width, height, len(set(zlib.decompress(idat)))


def check_page(page: Path, tmp: Path, name: str) -> Tags:
    shot = tmp / f"{name}.png"
    dom, console = open_in_browser(page, tmp, shot)
    assert console == [], console  # no script error, no blocked resource, no CSP violation
    tags = parse(dom)
    for sid in ("timeline", "timeline-wall", "timeline-steps", "attempts", "failures", "checkpoints", "verdict"):
        assert sid in tags.ids, f"{sid} missing from the page the browser built"
    assert "script" not in tags.tags
    width, height, distinct = png_facts(shot)
    assert (width, height) == WINDOW
    assert shot.stat().st_size > 20_000 and distinct > 20, "the screenshot is (nearly) blank"
    keep = os.environ.get("REPORT_SCREENSHOT_DIR")
    if keep:
        shutil.copy(shot, Path(keep) / f"{name}.png")
    return tags


def html_report(run_dir: Path, out: Path) -> dict[str, Any]:
    res = run_supervise(["report", str(run_dir), "--json", "--html", str(out)])
    assert out.is_file(), res.stderr[-3000:]
    data: dict[str, Any] = json.loads(res.stdout)
    return data


def test_hostile_page_in_the_browser_runs_nothing(tmp_path: Path) -> None:
    page = tmp_path / "hostile.html"
    page.write_text(render_html(build_report(hostile_run(tmp_path / "run"))))
    tags = check_page(page, tmp_path, "hostile")
    text = "".join(tags.text)
    assert "console.error('pwned')" in text and "img" not in tags.tags


def log_text(run_dir: Path, attempt: int) -> str:
    path = run_dir / "supervisor" / f"attempt-{attempt}.log"
    return path.read_text() if path.exists() else ""


def latest_step(run_dir: Path, attempt: int) -> int:
    steps = re.findall(r"^step (\d+) loss", log_text(run_dir, attempt), re.MULTILINE)
    return int(steps[-1]) if steps else -1


@pytest.fixture(scope="module")
def story_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Job 1: attempt 1 segfaults at step 15 and is restarted in place; attempt 2 resumes from step 10
    and gets a stop notice (SIGTERM, as at the start of a grace) between two saves: an emergency save,
    exit 75. That last save then turns out torn (cut to a third, as a kill mid-write leaves it). Job 2
    quarantines it, resumes from the save before, and completes."""
    pytest.importorskip("torch")
    run_dir = tmp_path_factory.mktemp("story") / "run"
    common = ["run", "--run-dir", str(run_dir), *FAST]
    train = ["--", PY, PLAIN, "--steps", "120", "--save-every", "10"]
    proc = start_supervise(common + train + ["--step-time", "0.03"], env={"FAULT_SEGFAULT_AT": "15"})
    try:
        assert wait_for(lambda: latest_step(run_dir, 2) > 20 and 3 <= latest_step(run_dir, 2) % 10 <= 7, 120,
                        interval=0.01), log_text(run_dir, 2)[-2000:]
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 75, err[-3000:]
    saved = re.findall(r"saved step (\d+) to (\S+)", log_text(run_dir, 2))
    torn = Path(saved[-1][1])
    with open(torn, "r+b") as fh:
        fh.truncate(torn.stat().st_size // 3)
    past = time.time() - 60  # the next job starts later: the file is not "still being written"
    os.utime(torn, (past, past))
    again = run_supervise(common + train + ["--step-time", "0.002"])
    assert again.returncode == 0, again.stderr[-3000:]
    return run_dir


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A segfault at the same step in every attempt: the crash-loop budget stops the run (exit 4)."""
    pytest.importorskip("torch")
    run_dir = tmp_path_factory.mktemp("stopped") / "run"
    res = run_supervise(["run", "--run-dir", str(run_dir), *FAST, "--set", "budget.same_failure_limit=2", "--",
                         PY, PLAIN, "--steps", "30", "--save-every", "10"],
                        env={"FAULT_SEGFAULT_AT": "15", "FAULT_ATTEMPT": "all"})
    assert res.returncode == 4, res.stderr[-3000:]
    return run_dir


def test_story_run_page_in_the_browser(story_run: Path, tmp_path: Path) -> None:
    chromium_binary()
    out = tmp_path / "story.html"
    rep = html_report(story_run, out)
    assert [a["class"] for a in rep["attempts"]] == ["native_crash", "preempted", "completed"]
    tags = check_page(out, tmp_path, "story")
    text = " ".join(tags.text)
    # The torn emergency save (and last.ckpt, the same file under a second name) renamed aside.
    torn = [q for q in rep["quarantined"] if re.search(r"step=\d+\.ckpt$", q["original"] or "")]
    assert len(torn) == 1 and torn[0]["attempt"] == 3 and "quarantined" in tags.ids
    assert all(q["file"] in text for q in rep["quarantined"])
    page = out.read_text()
    wall, steps = chart(page, "timeline-wall"), chart(page, "timeline-steps")
    for drawn in (wall, steps):
        assert drawn.count('class="mk mk-failure"') == 1  # attempt 1's crash
        assert drawn.count('class="mk mk-notice"') == len(rep["events_summary"]["notices"]) == 1
    assert wall.count('class="mk mk-quarantine"') == len(rep["quarantined"])
    assert steps.count('class="mk mk-quarantine"') == sum(q["step"] is not None for q in rep["quarantined"])
    lost = rep["attempts"][1]["steps_lost"]
    assert lost and lost > 0  # the torn save sent the run back to the save before it
    first = rep["attempts"][0]
    at = first["evidence_step"] if first["evidence_step"] is not None else first["last_step"]
    assert f"Attempt 1: native_crash at step {at}" in text
    assert rep["run"]["outcome"] == "complete" and "Run train_plain" in text


def test_stopped_run_page_in_the_browser(stopped_run: Path, tmp_path: Path) -> None:
    chromium_binary()
    out = tmp_path / "stopped.html"
    rep = html_report(stopped_run, out)
    assert rep["run"]["outcome"] == "stopped"
    tags = check_page(out, tmp_path, "stopped")
    assert "problems" in tags.ids  # "Needs a look" comes first
    text = " ".join(tags.text)
    assert rep["verdict"]["budget"] == "same_failure_limit" and "STOPPED (same_failure_limit)" in text
    assert text.count("native_crash at step 15") >= len(rep["attempts"]) == 2
    # The policy said restart after each crash; after the last one the budget stopped the run.
    assert [a["action"] for a in rep["attempts"]] == ["restart", "stop"]
    assert "then: stop" in text
