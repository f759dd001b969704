"""Restart metrics (supervisor/addons/metrics/, docs/metrics.md): the fold agrees with the report, the files
are what Prometheus and an OpenTelemetry pipeline read, the sink counts an earlier job's history once
and has the training's snapshot on disk before a launch, and the training side logs it in one call."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from supervisor import client
from supervisor.config import MetricsConfig, load_config
from supervisor.errors import ConfigError
from supervisor.events import Event, EventLog
from supervisor.addons.metrics.model import EventWindow, run_metrics
from supervisor.addons.metrics.render import otel_record, otel_resource, prometheus_text
from supervisor.addons.metrics.sink import MetricsSink, metrics_sink
from supervisor.addons.report.model import fold
from supervisor.sinks import deliver, seed


def ev(event: str, ts: float, **fields: object) -> Event:
    return Event(event, ts, dict(fields))


def session(ts: float, job: str = "7") -> Event:
    return ev("run_start", ts, name="r", job_id=job, restart_count=0)


def attempt(n: int, ts: float, cls: str, *, resume: int | None, last: int, saves: tuple[int, ...] = (),
            notice: bool = False) -> list[Event]:
    out = [ev("resume_point", ts, attempt=n, step=resume), ev("attempt_start", ts + 0.1, attempt=n, resume_step=resume)]
    for i, step in enumerate(saves):
        out.append(ev("save_end", ts + 1 + i, attempt=n, step=step, ok=True, duration=0.5 + i, source="client"))
    for step in range(resume or 0, last + 1):
        out.append(ev("progress", ts + 2 + step * 0.01, attempt=n, step=step, source="client"))
    if notice:
        out.append(ev("notice", ts + 8, source="signal", signal="TERM"))
    durable = max(saves) if saves else resume
    out.append(ev("attempt_end", ts + 9, attempt=n, **{"class": cls}, last_step=last, last_durable_step=durable,
                  steps_lost=None if cls == "completed" else last - (durable or 0), wall_lost=2.0))
    return out


def crashed_preempted_completed() -> list[Event]:
    """Job 1: a crash at 25 (saved 20), restarted; a preemption at 47 (saved 40). Job 2: completes."""
    return [session(0), *attempt(1, 1, "native_crash", resume=None, last=25, saves=(10, 20)),
            ev("decision", 11, attempt=1, action="restart"),
            *attempt(2, 12, "preempted", resume=20, last=47, saves=(30, 40), notice=True),
            ev("run_end", 22, outcome="requeue", exit_code=75, reason="preempted"),
            session(30), *attempt(3, 31, "completed", resume=40, last=60, saves=(50, 60)),
            ev("run_end", 41, outcome="complete", exit_code=0, reason="training complete")]


def test_the_metrics_are_the_reports_numbers() -> None:
    events = crashed_preempted_completed()
    m, run = run_metrics(events), fold(events, {}).run
    assert (m.attempts, m.restarts, m.requeues) == (run.attempts, run.restarts, run.requeues) == (3, 1, 1)
    assert (m.steps_lost, m.time_lost_s) == (run.steps_lost, run.wall_lost) == (5 + 7, 4.0)
    assert (m.preemptions, m.failures, dict(m.ends)) == (1, 1, {"native_crash": 1, "preempted": 1, "completed": 1})
    assert (m.saves, m.save_seconds_count, m.save_seconds_max, m.last_durable_step) == (6, 6, 1.5, 60)
    assert (m.outcome, m.reason, m.attempt) == ("complete", "training complete", 3)


def test_an_attempt_counts_from_its_resume_point_unless_the_run_ended_instead() -> None:
    """The training reads the snapshot as it starts: it must find itself counted."""
    before = [session(0), *attempt(1, 1, "native_crash", resume=None, last=5)]
    launching = run_metrics([*before, ev("resume_point", 11, attempt=2, step=None)])
    assert (launching.attempt, launching.attempts, launching.restarts) == (2, 2, 1)
    refused = run_metrics([*before, ev("resume_point", 11, attempt=2, step=None),
                           ev("run_end", 12, outcome="stopped", stopped_by="resume_audit", reason="no")])
    assert (refused.attempts, refused.restarts, refused.outcome, refused.stopped_by) == (1, 0, "stopped", "resume_audit")


def test_the_window_kept_in_memory_gives_the_same_numbers_as_the_whole_log() -> None:
    events = crashed_preempted_completed()
    window = EventWindow()
    for event in events:
        window.add(event)
    assert len(window.events) < len(events) / 2  # sampled progress and older saves are not kept
    assert run_metrics(window.events, window.saves) == run_metrics(events)


def test_the_prometheus_file_parses_and_escapes_a_hostile_run_name() -> None:
    parser = pytest.importorskip("prometheus_client.parser")
    name = 'a "quoted"\\run\nname'
    text = prometheus_text(run_metrics(crashed_preempted_completed()), name)
    samples = {s.name: s for family in parser.text_string_to_metric_families(text) for s in family.samples
               if not s.labels.keys() - {"run"}}
    assert samples["supervise_restarts_total"].labels == {"run": name}
    assert samples["supervise_restarts_total"].value == 1 and samples["supervise_requeues_total"].value == 1
    assert samples["supervise_save_duration_seconds_sum"].value == pytest.approx(0.5 + 1.5 + 0.5 + 1.5 + 0.5 + 1.5)


def test_an_otel_record_carries_the_event_and_the_run_totals_after_it() -> None:
    events = crashed_preempted_completed()
    end = next(e for e in events if e.event == "attempt_end")
    record = otel_record(end, run_metrics(events[:events.index(end) + 1]), otel_resource("r", "/runs/r", "n1"))
    assert record is not None and record["event_name"] == "supervise.attempt_end"
    assert record["severity_text"] == "ERROR" and record["time_unix_nano"] == 10 * 10**9
    assert record["attributes"]["supervise.class"] == "native_crash"
    assert record["attributes"]["supervise.run.failures"] == 1
    assert otel_record(ev("progress", 1, step=3), run_metrics(events), {}) is None  # sampled progress: no record


def _sink(tmp_path: Path, **cfg: object) -> tuple[MetricsSink, EventLog]:
    """A sink seeded as the run loop seeds it: with the log read once (RunContext.begin)."""
    run_dir = tmp_path / "run"
    log = EventLog(run_dir / "supervisor" / "events.jsonl")
    sink = MetricsSink(MetricsConfig(**cfg), run_dir, "r", "n1")  # type: ignore[arg-type]
    seed([sink], list(log.read().events))
    return sink, log


def test_the_sink_counts_an_earlier_jobs_history_once_and_writes_the_snapshot_before_a_launch(tmp_path: Path) -> None:
    events = crashed_preempted_completed()
    first = events[:[e.event for e in events].index("run_end") + 1]  # job 1, up to its run_end
    run_dir = tmp_path / "run"
    earlier = EventLog(run_dir / "supervisor" / "events.jsonl")
    for e in first:
        earlier.emit(e.event, **e.fields)
    earlier.close()
    sink, log = _sink(tmp_path)
    for name, fields in (("run_start", {"name": "r", "job_id": "7"}), ("resume_point", {"attempt": 3, "step": 40})):
        deliver([sink], log.emit(name, **fields))
    # accept() waited at the resume point: the training starting now reads itself counted
    assert client.restart_metrics(run_dir) == {
        "attempt": 3, "attempts": 3, "restarts": 1, "requeues": 1, "preemptions": 1, "failures": 1,
        "steps_lost": 12, "time_lost_s": 4.0, "saves": 4, "saves_failed": 0, "save_seconds_last": 1.5,
        "save_seconds_max": 1.5, "last_durable_step": 40}
    for name in ("metrics.json", "metrics.prom", "metrics.otel.jsonl"):
        assert stat.S_IMODE(os.stat(run_dir / "supervisor" / name).st_mode) == 0o640, name
    records = [json.loads(line) for line in (run_dir / "supervisor" / "metrics.otel.jsonl").read_text().splitlines()]
    assert [r["event_name"] for r in records] == ["supervise.run_start"]  # this job's events only


def test_formats_left_out_are_not_written_and_disabled_metrics_make_no_sink(tmp_path: Path) -> None:
    sink, log = _sink(tmp_path, formats=("otel",), otel_file="/nonexistent-dir/{name}.jsonl")
    deliver([sink], log.emit("run_start", name="r"))
    deliver([sink], log.emit("run_end", outcome="complete", reason="done"))
    supervisor_dir = tmp_path / "run" / "supervisor"
    assert (supervisor_dir / "metrics.json").is_file() and not (supervisor_dir / "metrics.prom").exists()
    assert sink.otel_path == Path("/nonexistent-dir/r.jsonl")  # cannot be written: a warning, never an error
    assert metrics_sink(MetricsConfig(enabled=False), tmp_path, "r", "h") is None


def test_a_sink_that_raises_does_not_stop_the_others() -> None:
    seen: list[str] = []

    class Broken:
        def accept(self, event: Event) -> None:
            raise RuntimeError("boom")

    class Kept:
        def accept(self, event: Event) -> None:
            seen.append(event.event)

    deliver([Broken(), Kept()], ev("run_start", 1))
    assert seen == ["run_start"]


@pytest.mark.parametrize(("key", "value", "needle"), [
    ("metrics.formats", "[statsd]", "unknown format"),
    ("metrics.prometheus_file", "m.txt", "ending in .prom"),
    ("metrics.otel_file", "{job}.jsonl", "{name}"),
])
def test_bad_metrics_settings_name_the_key(key: str, value: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, sets=[f"{key}={value}"], environ={})
    assert key in str(info.value) and needle in str(info.value)


# --------------------------------------------------------------------------- the training side


def _snapshot(run_dir: Path, metrics: dict[str, object]) -> None:
    (run_dir / "supervisor").mkdir(parents=True, exist_ok=True)
    (run_dir / "supervisor" / "metrics.json").write_text(json.dumps({"v": 1, "metrics": metrics}))


def test_restart_metrics_is_empty_without_a_supervisor_and_skips_what_is_not_a_number(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SUPERVISOR_RUN_DIR", raising=False)
    assert client.restart_metrics() == {}
    _snapshot(tmp_path, {"restarts": 2, "time_lost_s": 1.5, "bad": "x", "flag": True, "nan": float("nan")})
    monkeypatch.setenv("SUPERVISOR_RUN_DIR", str(tmp_path))
    assert client.restart_metrics() == {"restarts": 2, "time_lost_s": 1.5}
    (tmp_path / "supervisor" / "metrics.json").write_text("{torn")
    assert client.restart_metrics() == {}


def test_one_call_logs_them_to_a_tensorboard_summary_writer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("tensorboard")
    tb = pytest.importorskip("torch.utils.tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _snapshot(tmp_path / "run", {"restarts": 2, "preemptions": 1})
    monkeypatch.setenv("SUPERVISOR_RUN_DIR", str(tmp_path / "run"))
    writer = tb.SummaryWriter(str(tmp_path / "tb"))
    assert client.log_restart_metrics(writer, step=120) == {"supervisor/restarts": 2, "supervisor/preemptions": 1}
    writer.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("supervisor/restarts")] == [(120, 2.0)]
    with pytest.raises(TypeError, match="add_scalar"):
        client.log_restart_metrics(object())


def test_the_hf_callback_logs_them_through_the_trainers_loggers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    pytest.importorskip("tensorboard")
    import importlib.util

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from helpers import EXAMPLES
    from supervisor.integrations.hf import SupervisorCallback

    spec = importlib.util.spec_from_file_location("example_train_hf", EXAMPLES / "train_hf.py")
    assert spec and spec.loader
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    _snapshot(tmp_path / "run", {"attempt": 2, "restarts": 1})
    monkeypatch.setenv("SUPERVISOR_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), max_steps=2, save_strategy="no",
                                          logging_steps=1, per_device_train_batch_size=4, report_to=["tensorboard"],
                                          use_cpu=True, disable_tqdm=True)
    trainer = transformers.Trainer(model=example.TinyRegression(), args=args, train_dataset=example.SyntheticData(16))
    trainer.add_callback(SupervisorCallback(trainer, own_signals=False))
    trainer.train()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    # the Trainer's TensorBoard callback files what Trainer.log gets under train/
    assert [(e.step, e.value) for e in acc.Scalars("train/supervisor/restarts")] == [(0, 1.0)]


def test_a_killed_supervisors_history_is_counted_as_the_whole_log_would_be(tmp_path: Path) -> None:
    """The window keeps only the first and last progress event of an attempt: the steps an attempt
    with no attempt_end reached (its supervisor was killed) still come from the last one."""
    killed = [e for e in attempt(1, 1, "native_crash", resume=None, last=30, saves=(10, 20))
              if e.event != "attempt_end"]
    run_dir = tmp_path / "run"
    earlier = EventLog(run_dir / "supervisor" / "events.jsonl")
    for e in [session(0), *killed]:
        earlier.emit(e.event, **e.fields)
    earlier.close()
    sink, log = _sink(tmp_path)
    deliver([sink], log.emit("run_start", name="r", job_id="8"))
    deliver([sink], log.emit("resume_point", attempt=2, step=20))
    deliver([sink], log.emit("attempt_start", attempt=2, resume_step=20))
    assert sink.flush(10)
    log.close()
    from supervisor.events import read_events

    whole = run_metrics(read_events(run_dir / "supervisor" / "events.jsonl").events)
    assert whole.steps_lost == 10  # reached 30, resumed from 20
    assert client.restart_metrics(run_dir) == {k: v for k, v in whole.as_numbers().items()}


def test_the_run_hands_the_sink_its_history_from_the_one_read_of_the_log(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """An earlier job's events are counted in the snapshot the next job's training reads, and the log
    is read once, by the run loop at its start (RunContext.begin): the sink is seeded from that read."""
    from fakes import ChildScript, FakeChannel, FakeClock, FakeSlurm, FakeStarter, FakeWaker

    from supervisor.run.loop import Runner

    events = crashed_preempted_completed()
    run_dir = tmp_path / "run"
    earlier = EventLog(run_dir / "supervisor" / "events.jsonl")
    for e in events[:[e.event for e in events].index("run_end") + 1]:  # job 1: a crash, then a preemption
        earlier.emit(e.event, **e.fields)
    earlier.close()
    reads: list[Path] = []
    real_read = EventLog.read
    monkeypatch.setattr(EventLog, "read", lambda self: reads.append(self.path) or real_read(self))

    clock = FakeClock()
    channel = FakeChannel()
    channel.clock = clock
    (run_dir / "checkpoints").mkdir(parents=True)
    done = ChildScript([(0.1, "msg", "heartbeat", {"step": 41}), (0.2, "msg", "done", {}), (0.3, "exit", 0)])
    cfg = load_config(None, environ={}, cli={"run_dir": str(run_dir)})
    runner = Runner(cfg, ["python3", "train.py"], environ={"PATH": "/usr/bin:/bin"}, cwd=tmp_path, echo=False,
                    clock=clock, waker=FakeWaker(clock, None),
                    start_child=FakeStarter([done], clock, channel, run_dir / "checkpoints"),
                    slurm=FakeSlurm(clock, None), channel=channel)
    sink = MetricsSink(MetricsConfig(), run_dir, "r", "n1")
    runner.ctx.sinks.append(sink)
    assert runner.run().exit_code == 0
    assert sink.flush(10)
    assert reads == [run_dir / "supervisor" / "events.jsonl"]  # once, by the loop
    numbers = client.restart_metrics(run_dir)
    assert (numbers["attempts"], numbers["restarts"], numbers["preemptions"], numbers["failures"]) == (3, 1, 1, 1)
