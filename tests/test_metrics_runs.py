"""Restart metrics end to end: a real Lightning training (CPU, 10 steps) preempted once and crashed
once under `supervise run` shows its restarts in its own TensorBoard event files and CSV log, and the
run's Prometheus file parses with Prometheus' own parser and says the same."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

from helpers import REPO, events_named, run_supervise

pytest.importorskip("torch")
pytest.importorskip("lightning")
pytest.importorskip("tensorboard")
parser = pytest.importorskip("prometheus_client.parser")

SCRIPT = str(REPO / "tests" / "children" / "lightning_logged.py")
ARGS = ["--set", "policy.native_crash.backoff=0.1", "--set", "budget.max_steps_lost_fraction=null"]


def _tensorboard_scalars(logs: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    points = []
    for version in sorted((logs / "tb").iterdir()):
        acc = EventAccumulator(str(version))
        acc.Reload()
        if tag in acc.Tags()["scalars"]:
            points += [(e.step, e.value) for e in acc.Scalars(tag)]
    return points


def _csv_values(logs: Path, column: str) -> list[tuple[int, float]]:
    points = []
    for path in sorted((logs / "csv").glob("version_*/metrics.csv")):
        with open(path, newline="") as fh:
            for row in csv.DictReader(fh):
                if row.get(column):
                    points.append((int(row["step"]), float(row[column])))
    return points


def _prometheus(run_dir: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = (run_dir / "supervisor" / "metrics.prom").read_text()
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "run"))): s.value
            for family in parser.text_string_to_metric_families(text) for s in family.samples}


def test_a_crashed_and_preempted_run_shows_its_restarts_where_the_training_logs(tmp_path: Path) -> None:
    run_dir, logs = tmp_path / "run", tmp_path / "logs"
    command = ["run", "--run-dir", str(run_dir), "--name", "tiny", *ARGS, "--", sys.executable, SCRIPT, "4", str(logs)]
    first = run_supervise(command)  # attempt 1 crashes and is restarted; attempt 2 is preempted
    assert first.returncode == 75, first.stderr[-3000:]  # handed back to Slurm to requeue
    second = run_supervise(command)  # the requeued job: attempt 3 trains with Lightning and completes
    assert second.returncode == 0, second.stderr[-3000:]
    assert [e["class"] for e in events_named(run_dir, "attempt_end")] == ["native_crash", "preempted", "completed"]

    # The Lightning attempt logged what came before it, at the step it started from (0: no save yet).
    expected = {"attempt": 3, "attempts": 3, "restarts": 1, "requeues": 1, "preemptions": 1, "failures": 1,
                "steps_lost": 5}  # steps 1-2 of attempt 1 and 1-3 of attempt 2, none of them saved
    for read in (_tensorboard_scalars, _csv_values):
        for name, value in expected.items():
            assert read(logs, f"supervisor/{name}") == [(0, value)], (read.__name__, name)

    prom = _prometheus(run_dir)
    assert prom[("supervise_attempts_total", ())] == 3
    assert prom[("supervise_restarts_total", ())] == 1
    assert prom[("supervise_requeues_total", ())] == 1
    assert prom[("supervise_preemptions_total", ())] == 1
    assert prom[("supervise_failures_total", ())] == 1
    assert prom[("supervise_attempt_ends_total", (("class", "native_crash"),))] == 1
    assert prom[("supervise_attempt_ends_total", (("class", "preempted"),))] == 1
    assert prom[("supervise_steps_lost", ())] == 5
    assert prom[("supervise_saves_total", ())] == 2  # steps 2 and 4 of the Lightning attempt
    assert prom[("supervise_save_duration_seconds_count", ())] == 2
    assert prom[("supervise_last_durable_step", ())] == 4
    assert prom[("supervise_run_outcome", (("outcome", "complete"), ("stopped_by", "")))] == 1

    records = [json.loads(line) for line in (run_dir / "supervisor" / "metrics.otel.jsonl").read_text().splitlines()]
    ends = [r for r in records if r["event_name"] == "supervise.attempt_end"]
    assert [r["attributes"]["supervise.class"] for r in ends] == ["native_crash", "preempted", "completed"]
    assert [r["severity_text"] for r in ends] == ["ERROR", "INFO", "INFO"]
    last = records[-1]
    assert last["event_name"] == "supervise.run_end" and last["attributes"]["supervise.run.restarts"] == 1
    assert last["resource"]["supervise.run.name"] == "tiny"
