"""Text that fits: the width chosen (COLUMNS, the terminal, else 100), tables and list items fitted
to it without losing a word, the status view's training numbers (loss, ETA, what a preemption now
costs), and log lines that carry their date (issue 26 items 3 and 4). Pure and fast."""

from __future__ import annotations

import io
import logging
import re
import socket
from pathlib import Path

import pytest

from supervisor.cli.common import setup_logging
from supervisor.events import Ev, EventLog
from supervisor.addons.report import build_report, summarize_status
from supervisor.addons.report.render import render_status, status_line, to_text
from supervisor.addons.report.render import Block
from supervisor.addons.report.textfit import DEFAULT_COLUMNS, columns, fit_table, wrap
from supervisor.run.attempt import AttemptState
from supervisor.run.monitor import progress_extras


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty


def test_the_width_is_columns_else_the_terminal_else_100() -> None:
    assert columns({}, _Stream(tty=False)) == DEFAULT_COLUMNS == 100  # a file, a pipe, a Slurm log
    assert columns({"COLUMNS": "132"}, _Stream(tty=False)) == 132
    assert columns({"COLUMNS": "wide"}, _Stream(tty=False)) == 100  # not a number: ignored
    assert columns({"COLUMNS": "10"}, _Stream(tty=False)) == 40  # narrower than 40 helps nobody


def _words(lines: list[str]) -> list[str]:
    return sorted(w for line in lines for w in line.split() if set(w) != {"-"})


def test_a_wide_table_is_narrowed_and_wrapped_without_losing_a_word() -> None:
    headers = ("#", "job", "resumed from", "class", "evidence")
    rows = [("1", "4242", "step=20.ckpt (step 20)", "native_crash",
             "RuntimeError: CUDA error: an illegal memory access was encountered at step 250"),
            ("2", "4243", "fresh", "preempted", "-")]
    lines = fit_table(headers, rows, 60)
    assert max(map(len, lines)) <= 60
    assert _words(lines) == _words(fit_table(headers, rows, 1000))  # same words, other layout
    assert "native_crash" in "\n".join(lines)  # a short word is not split when free text can wrap instead
    assert len(fit_table(headers, rows, 1000)) == 4  # wide enough: one line a row, as before


def test_list_items_and_paragraphs_wrap_under_their_bullet() -> None:
    item = "decision after attempt 1: restart: " + "native_crash after durable progress " * 6
    text = to_text([Block("h", text="Events"), Block("list", items=(item,)), Block("p", text="x " * 80)], 100)
    lines = text.splitlines()
    assert all(len(line) <= 100 for line in lines)
    assert lines[2].startswith("  - decision") and all(line.startswith("    ") for line in lines[3:5])
    assert wrap("/a/very/long/" + "path" * 40, 50, "  - ", "    ")[1].startswith("    ")  # split, not overflowing


def test_log_lines_carry_the_date(capsys: pytest.CaptureFixture[str]) -> None:
    """A Slurm job's log spans days: the time alone repeats."""
    logger = logging.getLogger("supervisor")
    saved = logger.handlers[:], logger.level, logger.propagate
    try:
        setup_logging(0)
        logger.info("attempt 1 started")
    finally:
        logger.handlers[:], logger.level, logger.propagate = saved
    line = capsys.readouterr().err.strip()
    assert re.fullmatch(r"\[supervise \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] attempt 1 started", line), line


# --------------------------------------------------------------------------- the training in the status view


def _live(run_dir: Path, **progress: object) -> EventLog:
    log = EventLog(run_dir / "supervisor" / "events.jsonl", clock=lambda: 1000.0)
    log.emit(Ev.RUN_START, name="t", run_dir=str(run_dir), host=socket.gethostname(), job_id="7", restart_count=0)
    log.emit(Ev.ATTEMPT_START, attempt=1, host=socket.gethostname(), job_id="7", restart_count=0,
             resume_path=str(run_dir / "checkpoints" / "step=100.ckpt"), resume_step=100)
    log.emit(Ev.PROGRESS, attempt=1, step=400, rate=10.0, source="client", **progress)
    return log


def test_status_shows_loss_rate_eta_and_what_a_preemption_would_cost(tmp_path: Path) -> None:
    log = _live(tmp_path, loss=0.5312, max_step=1000)
    log.close()
    view = summarize_status(build_report(tmp_path, check_checkpoints=False), True, "alive", None, now=1010.0)
    assert (view.last_step, view.loss, view.max_step, view.rate) == (400, 0.5312, 1000, 10.0)
    assert view.eta == 50.0  # 600 steps at 10 steps/s, reported 10 s ago
    assert (view.at_risk_steps, view.at_risk_time) == (300, 30.0)  # past the resume point, step 100
    text = render_status(view)
    assert "step 400/1000, loss 0.5312, 10 steps/s, ETA 50s, reported 10s ago" in text
    assert "a preemption now would lose 300 step(s) (~30s of training)" in text
    line = status_line(view, "2026-12-02 10:00:00")
    assert "\n" not in line and line.startswith("2026-12-02 10:00:00 running, attempt 1: step 400/1000, loss 0.5312")
    assert "ETA 50s" in line and "preemption now loses 300 step(s)" in line


def test_a_finished_run_shows_no_rate_eta_or_risk(tmp_path: Path) -> None:
    log = _live(tmp_path, loss=0.5, max_step=1000)
    log.close()
    view = summarize_status(build_report(tmp_path, check_checkpoints=False), False, "gone", None, now=1010.0)
    assert view.state != "running" and view.rate is None and view.eta is None and view.at_risk_steps is None


def test_the_max_step_is_the_clients_report_else_the_config() -> None:
    state = AttemptState(attempt=1, started_at=0.0)
    assert progress_extras(state, None) == {}
    assert progress_extras(state, 5000) == {"max_step": 5000}
    state.max_step, state.last_loss = 800, float("nan")
    assert progress_extras(state, 5000) == {"max_step": 800}  # a NaN loss is a loss anomaly, not a reading
    state.last_loss = 1.25
    assert progress_extras(state, None) == {"max_step": 800, "loss": 1.25}
