"""Slurm's own history beside the supervisor's attempts (issue 24, item 4).

Parsing is checked on sacct output of the three Slurm versions the test clusters run
(tests/data/slurm/sacct/, README there), matching on the scenarios that matter (requeues, a
resubmission, a run Slurm counted that the supervisor never logged and the reverse, a record that
never started), and the report's three forms (text within 100 columns, JSON, HTML escaped). sacct
itself is replaced by a recorded answer: a real one needs slurmdbd (see accounting_cluster_check).
"""

from __future__ import annotations

import calendar
import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from supervisor.events import Ev, EventLog
from supervisor.addons.report import build_report
from supervisor.addons.report.accounting import (
    AccountingState,
    AccountingView,
    Agreement,
    HistoryRow,
    accounting_view,
    compare,
    run_job_ids,
)
from supervisor.addons.report.html import render_html, section_ids
from supervisor.addons.report.model import JobRow
from supervisor.addons.report.render import accounting_blocks, render_markdown, render_text, to_text
from supervisor.addons.accounting import query_sacct
from supervisor.slurm.sacct import (
    DELIMITER,
    FIELDS_WITHOUT_RESTARTS,
    SacctAnswer,
    SacctStatus,
    classify_failure,
    parse_elapsed,
    parse_sacct,
)

DATA = Path(__file__).parent / "data" / "slurm" / "sacct"
T0 = 1764650000.0  # the samples' first start


def sample(name: str) -> str:
    return (DATA / name).read_text()


def session(n: int, job: str | None, restart: int | None, start: float, attempts: Sequence[int]) -> JobRow:
    return JobRow(session=n, job_id=job, restart_count=restart, host="n1", start=start, attempts=tuple(attempts),
                  ended_by=None)


# ---------------------------------------------------------------------------------------------
# Parsing the three versions


def test_22_05_has_no_restarts_field_and_every_requeue_is_a_record() -> None:
    records = parse_sacct(sample("22.05_requeued.txt"))
    assert [(r.job_id_raw, r.state, r.nodes, r.exit_code) for r in records] == [
        ("4242", "PREEMPTED", "n1", "0:15"), ("4242", "REQUEUED", "n2", "0:0"), ("4242", "COMPLETED", "n1", "0:0")]
    assert all(r.restarts is None for r in records)
    assert [(r.start, r.end, r.elapsed) for r in records][0] == (T0, T0 + 600, 600.0)
    assert all(r.reason is None for r in records)  # "None" is sacct's word for no reason


def test_standard_time_format_reads_the_same_as_epoch_seconds() -> None:
    """sacct's default ``2025-12-02T04:33:20`` is local time; the sample was written in UTC."""
    iso = parse_sacct(sample("22.05_requeued_standard_time.txt"), local_to_epoch=calendar.timegm)
    assert iso == parse_sacct(sample("22.05_requeued.txt"))


def test_24_11_resubmission_is_two_job_ids_with_their_own_restarts() -> None:
    records = parse_sacct(sample("24.11_resubmitted.txt"))
    assert [(r.job_id, r.state, r.restarts, r.elapsed) for r in records] == [
        ("5000", "PREEMPTED", 0, 900.0), ("5001", "COMPLETED", 0, 1080.0)]


def test_26_05_pending_record_never_started() -> None:
    records = parse_sacct(sample("26.05_requeued_pending.txt"))
    assert [r.restarts for r in records] == [0, 1, 2]
    pending = records[-1]
    assert (pending.state, pending.start, pending.end, pending.nodes, pending.reason) == (
        "PENDING", None, None, None, "BeginTime")
    assert [r.started for r in records] == [True, True, False]


def test_untrusted_text_is_escaped_and_a_shifted_line_is_dropped() -> None:
    text = ("JobID|JobIDRaw|State|Start|NodeList|Reason\n"
            "7|7|CANCELLED by 1000|100|n\x1b[31m1|bad\u202eeman\n"
            "7.batch|7.batch|CANCELLED|100|n1|None\n"
            "8|8|FAILED|100|n1|extra|cell\n")
    (rec,) = parse_sacct(text)
    assert (rec.state, rec.state_text) == ("CANCELLED", "CANCELLED by 1000")
    assert rec.nodes == "n\\x1b[31m1" and rec.reason == "bad\\u202eeman"


@pytest.mark.parametrize("text,seconds", [("00:10:00", 600), ("1-02:03:04", 93784), ("05:06", 306),
                                          ("00:00:01.500", 1), ("INVALID", None)])
def test_elapsed_forms(text: str, seconds: int | None) -> None:
    assert parse_elapsed(text) == seconds


def test_no_header_is_an_error_not_an_empty_history() -> None:
    with pytest.raises(ValueError):
        parse_sacct("4242|4242|COMPLETED\n")


@pytest.mark.parametrize("output,status,refused", [
    ("Slurm accounting storage is disabled\n", SacctStatus.DISABLED, None),
    ('Invalid field requested: "Restarts"\n', SacctStatus.ERROR, "Restarts"),
    ("sacct: error: Problem talking to the database: Connection refused\n", SacctStatus.ERROR, None),
])
def test_failures_are_classified(output: str, status: SacctStatus, refused: str | None) -> None:
    got, reason, field = classify_failure(1, output)
    assert (got, field) == (status, refused)
    assert "\n" not in reason and reason


# ---------------------------------------------------------------------------------------------
# The edge: one sacct call, never an exception


class FakeSacct:
    """Answers as a given Slurm version would; records each argv and environment."""

    def __init__(self, text: str = "", *, rc: int = 0, stderr: str = "", legacy: bool = False,
                 timeout: bool = False) -> None:
        self.text, self.rc, self.stderr, self.legacy, self.timeout = text, rc, stderr, legacy, timeout
        self.calls: list[tuple[list[str], dict[str, str]]] = []

    def __call__(self, argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        self.calls.append((argv, kw["env"]))
        if self.timeout:
            raise subprocess.TimeoutExpired(argv, kw["timeout"])
        fields = argv[argv.index("--format") + 1]
        if self.legacy and "Restarts" in fields:
            return subprocess.CompletedProcess(argv, 1, "", 'Invalid field requested: "Restarts"\n')
        return subprocess.CompletedProcess(argv, self.rc, self.text.replace("|", DELIMITER), self.stderr)


def _query(fake: FakeSacct, ids: Sequence[str] = ("4242",)) -> SacctAnswer:
    return query_sacct(ids, run=fake, which=lambda *_, **__: "/usr/bin/sacct", environ={"SLURM_TIME_FORMAT": "relative"})


def test_query_asks_for_every_requeue_in_epoch_seconds() -> None:
    fake = FakeSacct(sample("26.05_requeued_pending.txt"))
    answer = _query(fake, ["6100", "6100", "6101; rm -rf /"])
    assert answer.status is SacctStatus.OK and len(answer.records) == 3
    (argv, env), = fake.calls
    assert "--duplicates" in argv and "--allocations" in argv and argv[argv.index("--jobs") + 1] == "6100"
    assert env["SLURM_TIME_FORMAT"] == "%s"


def test_22_05_refusing_restarts_is_asked_again_without_it() -> None:
    fake = FakeSacct(sample("22.05_requeued.txt"), legacy=True)
    answer = _query(fake)
    assert answer.status is SacctStatus.OK and answer.fields == FIELDS_WITHOUT_RESTARTS
    assert len(fake.calls) == 2 and len(answer.records) == 3


@pytest.mark.parametrize("fake,which,status", [
    (FakeSacct(rc=1, stderr="Slurm accounting storage is disabled\n"), "/usr/bin/sacct", SacctStatus.DISABLED),
    (FakeSacct(timeout=True), "/usr/bin/sacct", SacctStatus.TIMEOUT),
    (FakeSacct(), None, SacctStatus.MISSING),
    (FakeSacct(rc=1, stderr="sacct: error: Problem talking to the database: Connection refused\n"),
     "/usr/bin/sacct", SacctStatus.ERROR),
])
def test_no_history_is_one_line_why(fake: FakeSacct, which: str | None, status: SacctStatus) -> None:
    answer = query_sacct(["1"], run=fake, which=lambda *_, **__: which)
    assert answer.status is status and answer.records == () and "\n" not in answer.reason


# ---------------------------------------------------------------------------------------------
# Matching


def _agreements(rows: Sequence[HistoryRow]) -> list[tuple[str, int | None, Agreement, tuple[int, ...]]]:
    return [(r.job_id, r.restart, r.agreement, r.attempts) for r in rows]


def test_every_requeue_matches_its_session_without_restarts_field() -> None:
    records = parse_sacct(sample("22.05_requeued.txt"))
    sessions = [session(1, "4242", 0, T0 + 3, [1, 2]), session(2, "4242", 1, T0 + 763, [3]),
                session(3, "4242", 2, T0 + 1702, [4])]
    assert _agreements(compare(sessions, records)) == [
        ("4242", 0, Agreement.MATCHED, (1, 2)), ("4242", 1, Agreement.MATCHED, (3,)),
        ("4242", 2, Agreement.MATCHED, (4,))]


def test_a_run_slurm_counted_without_a_session_is_flagged() -> None:
    records = parse_sacct(sample("22.05_requeued.txt"))
    sessions = [session(1, "4242", 0, T0 + 3, [1]), session(2, "4242", 2, T0 + 1702, [2])]
    rows = compare(sessions, records)
    assert _agreements(rows)[1] == ("4242", 1, Agreement.SLURM_ONLY, ())
    assert "no session" in rows[1].note and "REQUEUED" in rows[1].note


def test_a_session_accounting_never_recorded_is_flagged() -> None:
    records = parse_sacct(sample("24.11_resubmitted.txt"))
    sessions = [session(1, "5000", 0, T0 + 2, [1]), session(2, "5001", 0, T0 + 925, [2]),
                session(3, "5002", 0, T0 + 2100, [3]), session(4, "5001", 1, T0 + 5000, [4])]
    rows = compare(sessions, records)
    assert _agreements(rows) == [
        ("5000", 0, Agreement.MATCHED, (1,)), ("5001", 0, Agreement.MATCHED, (2,)),
        ("5002", 0, Agreement.SUPERVISOR_ONLY, (3,)), ("5001", 1, Agreement.SUPERVISOR_ONLY, (4,))]
    assert "no record of job 5002" in rows[2].note
    assert "none at restart 1" in rows[3].note


def test_a_record_that_never_started_is_no_disagreement() -> None:
    records = parse_sacct(sample("26.05_requeued_pending.txt"))
    sessions = [session(1, "6100", 0, T0 + 5, [1]), session(2, "6100", 1, T0 + 425, [2])]
    view = accounting_view(SacctAnswer(SacctStatus.OK, records), sessions, ("6100",))
    assert [r.agreement for r in view.rows] == [Agreement.MATCHED, Agreement.MATCHED, Agreement.NOT_STARTED]
    assert view.disagreements == ()


def test_clocks_far_apart_fall_back_to_the_restart_count() -> None:
    records = parse_sacct(sample("26.05_requeued_pending.txt"))
    skewed = [session(1, "6100", 0, T0 + 3600, [1]), session(2, "6100", 1, T0 + 4025, [2])]
    assert [r.agreement for r in compare(skewed, records)][:2] == [Agreement.MATCHED, Agreement.MATCHED]


def test_runs_outside_slurm_are_not_compared() -> None:
    assert accounting_view(None, [session(1, None, None, T0, [1])], ()).state is AccountingState.NOT_SLURM


def test_job_ids_come_from_sessions_and_the_submissions_ledger() -> None:
    sessions = [session(1, "5000", 0, T0, [1]), session(2, "5000", 1, T0 + 10, [2])]
    subs = [{"job_id": 5000}, {"job_id": 5001}, {"job_id": True}, {"nothing": 1}]
    assert run_job_ids(sessions, subs) == ("5000", "5001")


# ---------------------------------------------------------------------------------------------
# The report: text, JSON, HTML, and gathering from a run directory


def _hostile_view() -> AccountingView:
    long = "x" * 300
    rows = (HistoryRow(job_id="123456789012_999", restart=12345, agreement=Agreement.SLURM_ONLY,
                       state="CANCELLED by 4294967294", start=T0, end=T0 + 5 * 86400, elapsed=5 * 86400.0,
                       nodes="gpu-[001-128]," + long, exit_code="255:127", reason="<script>alert(1)</script>" + long,
                       note="Slurm ran job 123 but the event log has no session in it " + long),
            HistoryRow(job_id="7", restart=0, agreement=Agreement.SUPERVISOR_ONLY, sessions=(1,),
                       attempts=tuple(range(1, 40)), session_start=T0, note="accounting has no record of job 7"),
            HistoryRow(job_id="8", restart=1, agreement=Agreement.MATCHED, state="COMPLETED", start=T0, end=T0 + 60,
                       elapsed=60.0, nodes="n1", exit_code="0:0", sessions=(2,), attempts=(40,)))
    return AccountingView(AccountingState.GATHERED, "", ("123456789012_999", "7", "8"), (), rows)


def test_text_history_fits_100_columns_even_on_overlong_values() -> None:
    text = to_text(accounting_blocks(_hostile_view()))
    assert max(len(line) for line in text.splitlines()) <= 100, text
    assert "NONE!" in text and "Disagreements (2)" in text


def test_unavailable_history_is_one_line_and_the_rest_unchanged(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    plain = build_report(run)
    down = build_report(run, accounting=lambda ids: SacctAnswer(SacctStatus.DISABLED,
                                                                 reason="Slurm accounting storage is disabled"))
    with_line, without = render_text(down).splitlines(), render_text(plain).splitlines()
    extra = [line for line in with_line if line not in without]
    assert len(extra) == 1 and "accounting storage is disabled" in extra[0] and len(extra[0]) <= 100
    assert [line for line in with_line if line in without] == without
    assert down.run == plain.run and down.attempts == plain.attempts


def test_html_escapes_sacct_text_and_has_its_section() -> None:
    from supervisor.addons.report.model import EventsSummary, Report, RunInfo

    rep = Report(run=RunInfo(name="r"), attempts=(), verdict=None, checkpoints=None, quarantined=(), drift=(),
                 events_summary=EventsSummary(counts={}), warnings=(), accounting=_hostile_view())
    page = render_html(rep)
    assert "accounting" in section_ids(page)
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "no supervisor record" in page and "no Slurm record" in page
    assert "| " in render_markdown(rep)  # the markdown table renders too


def _run_dir(tmp_path: Path) -> Path:
    """A run handed back once (job 5000, CANCEL mode) and resubmitted by supervise submit as 5001;
    a third job (5002) was submitted but its supervisor never wrote here."""
    run = tmp_path / "run"
    clock = {"now": T0}
    log = EventLog(run / "supervisor" / "events.jsonl", clock=lambda: clock["now"])
    for n, (job, start, outcome) in enumerate([("5000", T0 + 2, "requeue"), ("5001", T0 + 925, "complete")], 1):
        clock["now"] = start
        log.emit(Ev.RUN_START, name="exp", host=f"n{n}", job_id=job, restart_count=0, run_dir=str(run))
        log.emit(Ev.ATTEMPT_START, attempt=n, host=f"n{n}", job_id=job, restart_count=0, nodes=[f"n{n}"])
        clock["now"] = start + 100
        log.emit(Ev.ATTEMPT_END, attempt=n, exit_code=0, duration=100.0, **{"class": "completed" if n == 2
                                                                              else "preempted"})
        log.emit(Ev.RUN_END, outcome=outcome, exit_code=0, reason=outcome)
    log.close()
    (run / "supervisor" / "submissions.jsonl").write_text(
        "".join(json.dumps({"job_id": j, "submission": i}) + "\n" for i, j in enumerate((5000, 5001, 5002), 1)))
    return run


def test_report_gathers_history_for_every_job_the_run_names(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    text = sample("24.11_resubmitted.txt") + "5002|5002|FAILED|1764652010|1764652020|1764652021|00:00:01|n3|1:0|None|0\n"
    asked: list[tuple[str, ...]] = []

    def sacct(ids: Sequence[str]) -> SacctAnswer:
        asked.append(tuple(ids))
        return SacctAnswer(SacctStatus.OK, parse_sacct(text))

    rep = build_report(run, check_checkpoints=False, accounting=sacct)
    assert asked == [("5000", "5001", "5002")]
    view = rep.accounting
    assert view is not None and [r.agreement for r in view.rows] == [
        Agreement.MATCHED, Agreement.MATCHED, Agreement.SLURM_ONLY]
    data = rep.to_json()["accounting"]
    assert data["state"] == "gathered" and len(data["history"]) == 3
    assert [d["job_id"] for d in data["disagreements"]] == ["5002"]
    json.dumps(rep.to_json())
    text_out = render_text(rep)
    assert "Slurm's history (sacct)" in text_out and "job 5002 restart 0" in text_out
    assert not rep.run.problems  # the exit code stays a function of the run directory


# ---------------------------------------------------------------------------------------------
# Through the real subprocess edge: a stand-in sacct on PATH (a real one needs slurmdbd)


def _sacct_on_path(tmp_path: Path, *, output: str = "", fail: str = "") -> dict[str, str]:
    """A ``sacct`` that answers like a real one: the sample (with the delimiter asked for) when called
    with --duplicates and SLURM_TIME_FORMAT=%s, or ``fail`` on stderr with exit 1."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "answer.txt").write_text(output)
    script = bindir / "sacct"
    if fail:
        script.write_text(f"#!/bin/sh\necho '{fail}' >&2\nexit 1\n")
    else:
        script.write_text("#!/bin/sh\n"
                          'case " $* " in *" --duplicates "*) ;; *) echo "no --duplicates" >&2; exit 3;; esac\n'
                          '[ "$SLURM_TIME_FORMAT" = "%s" ] || { echo "times not in epoch seconds" >&2; exit 3; }\n'
                          f"tr '|' '\\037' < {bindir / 'answer.txt'}\n")
    script.chmod(0o755)
    return {"PATH": f"{bindir}:/usr/bin:/bin"}


def test_cluster_check_passes_on_a_resubmitted_run_whose_history_agrees(tmp_path: Path) -> None:
    from tests.accounting_check import check_accounting_history

    run = _run_dir(tmp_path)
    (run / "supervisor" / "submissions.jsonl").write_text('{"job_id": 5000}\n{"job_id": 5001}\n')
    env = _sacct_on_path(tmp_path, output=sample("24.11_resubmitted.txt"))
    view = check_accounting_history(run, env, final_state="COMPLETED", wait_s=0)
    assert [(r.job_id, r.attempts) for r in view.rows] == [("5000", (1,)), ("5001", (2,))]


def test_cluster_check_fails_on_a_run_slurm_counted_but_the_log_lacks(tmp_path: Path) -> None:
    from tests.accounting_check import check_accounting_history

    run = _run_dir(tmp_path)
    extra = "5002|5002|FAILED|1764652010|1764652020|1764652021|00:00:01|n3|1:0|None|0\n"
    env = _sacct_on_path(tmp_path, output=sample("24.11_resubmitted.txt") + extra)
    with pytest.raises(AssertionError, match="5002"):
        check_accounting_history(run, env, wait_s=0)


def test_cli_report_says_accounting_is_disabled_in_one_line_and_exits_as_before(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from supervisor.cli import main

    run = _run_dir(tmp_path)
    env = {**_sacct_on_path(tmp_path, fail="Slurm accounting storage is disabled"), "COLUMNS": "100"}  # not the runner's
    cli = CliRunner()
    down = cli.invoke(main, ["report", str(run), "--no-checkpoints"], env=env)
    skipped = cli.invoke(main, ["report", str(run), "--no-checkpoints", "--no-accounting"], env=env)
    assert down.exit_code == skipped.exit_code == 0, down.output
    extra = [line for line in down.output.splitlines() if line not in skipped.output.splitlines()]
    assert extra == ["Slurm's history (sacct): not available: Slurm accounting storage is disabled on this cluster"]
    as_json = json.loads(cli.invoke(main, ["report", str(run), "--no-checkpoints", "--json"], env=env).output)
    assert as_json["accounting"]["state"] == "unavailable"


# ---------------------------------------------------------------------------------------------
# The real sacct of each tested version, on a cluster configuration without slurmdbd (no daemon
# needed: sacct reads slurm.conf and answers before it would talk to anything)

_CONF = ("ClusterName=acct\nSlurmctldHost=localhost\nNodeName=n1 CPUs=1\nPartitionName=p Nodes=n1 Default=YES\n")


def _real_sacct_env(version: str, tmp_path: Path, extra_conf: str = "") -> dict[str, str]:
    import os

    from tests.slurm_cluster import ClusterError, root_install, write_shims

    conf = tmp_path / "slurm.conf"
    conf.write_text(_CONF + extra_conf)
    env = {"PATH": os.environ.get("PATH", os.defpath), "SLURM_CONF": str(conf)}
    if version == "host":
        if not Path("/usr/bin/sacct").exists():
            pytest.skip("no sacct on this host")
        return env
    if os.geteuid() != 0:
        pytest.skip("entering a Slurm root needs root")
    try:
        install = root_install(version, build=False)
    except ClusterError as exc:
        pytest.skip(str(exc))
    write_shims(tmp_path / "shims", install)
    env["PATH"] = f"{tmp_path / 'shims'}:{env['PATH']}"
    env["SLURM_ROOT_SHIMS"] = str(tmp_path / "shims")
    return env


@pytest.mark.parametrize("version", ["host", "24.11", "26.05"])
def test_real_sacct_without_accounting_is_reported_disabled(version: str, tmp_path: Path) -> None:
    answer = query_sacct(["5"], environ=_real_sacct_env(version, tmp_path))
    assert (answer.status, answer.reason) == (SacctStatus.DISABLED, "Slurm accounting storage is disabled on this "
                                                                     "cluster")


def test_real_sacct_with_slurmdbd_down_says_what_it_said(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    extra = f"AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=127.0.0.1\n" \
            f"AccountingStoragePort={port}\n"
    answer = query_sacct(["5"], environ=_real_sacct_env("host", tmp_path, extra))
    assert answer.status is SacctStatus.ERROR
    assert answer.reason == "sacct failed (exit 1): Problem talking to the database: Connection refused"


def test_no_record_at_all_is_unavailable_not_a_list_of_disagreements() -> None:
    view = accounting_view(SacctAnswer(SacctStatus.OK, ()), [session(1, "77", 0, T0, [1])], ("77",))
    assert view.state is AccountingState.UNAVAILABLE and view.rows == ()
    assert "no record of job(s) 77" in view.reason
