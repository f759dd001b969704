"""The metrics as files (pure): a Prometheus text exposition, OpenTelemetry-style log records and the
snapshot the training side reads. docs/metrics.md documents every name and field.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from typing import Any

from ... import __version__
from ...events import Ev, Event
from ...failures.classes import classes_where
from .model import RunMetrics

__all__ = ["OTEL_EVENTS", "SNAPSHOT_VERSION", "otel_record", "otel_resource", "prometheus_text", "snapshot_json"]

SNAPSHOT_VERSION = 1
MAX_ATTRIBUTE_CHARS = 1000  # a longer string attribute (a reason, a path) is cut

# The events that get an OpenTelemetry record: run and attempt boundaries, what ended an attempt,
# what Slurm did, and each save's end. Sampled progress and per-line warnings do not.
OTEL_EVENTS = frozenset(e.value for e in (
    Ev.RUN_START, Ev.RUN_END, Ev.ATTEMPT_START, Ev.ATTEMPT_END, Ev.NOTICE, Ev.STOP_CAUSE, Ev.REQUEUE,
    Ev.DECISION, Ev.SAVE_END, Ev.SAVE_ABORTED, Ev.QUARANTINE, Ev.STALL, Ev.RESUME_MISMATCH, Ev.BUDGET))

# OpenTelemetry severity numbers: INFO 9, WARN 13, ERROR 17.
_SEVERITY = {"INFO": 9, "WARN": 13, "ERROR": 17}


def _label(value: str) -> str:
    """A label value in the text format: backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(int(value)) if float(value).is_integer() and abs(value) < 2**53 else repr(float(value))


def prometheus_text(m: RunMetrics, run: str) -> str:
    """The exposition for node_exporter's textfile collector: every series carries ``run``."""
    lines: list[str] = []
    base = f'run="{_label(run)}"'

    def family(name: str, kind: str, help_text: str, samples: list[tuple[str, str, float]]) -> None:
        """A counter's name ends in _total (the family's too, as the 0.0.4 text format writes it)."""
        name = f"{name}_total" if kind == "counter" else name
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for suffix, labels, value in samples:
            extra = f",{labels}" if labels else ""
            lines.append(f"{name}{suffix}{{{base}{extra}}} {_number(value)}")

    def one(name: str, kind: str, help_text: str, value: float) -> None:
        family(name, kind, help_text, [("", "", value)])

    one("supervise_attempts", "counter", "Launches of the training child, across every job of the run.", m.attempts)
    one("supervise_restarts", "counter", "Relaunches in place, inside one supervisor session (job).", m.restarts)
    one("supervise_requeues", "counter", "Supervisor sessions after the first (the job requeued or resubmitted).",
        m.requeues)
    one("supervise_preemptions", "counter",
        "Attempts ended by the scheduler (preemption, time limit) or after a stop notice.", m.preemptions)
    one("supervise_failures", "counter", "Attempts that ended in a failure (crash, hang, error).", m.failures)
    family("supervise_attempt_ends", "counter", "Attempts that ended, by their end class.",
           [("", f'class="{_label(cls)}"', n) for cls, n in m.ends])
    one("supervise_steps_lost", "gauge", "Training steps redone after failures and preemptions (the ledger's).",
        m.steps_lost)
    one("supervise_steps_lost_lower_bound", "gauge",
        "1 when some losses are lower bounds (steps read from the output), else 0.", 1 if m.steps_lost_at_least else 0)
    one("supervise_time_lost_seconds", "gauge", "Wall time from the last durable save to each attempt's end.",
        m.time_lost_s)
    one("supervise_saves", "counter", "Checkpoint saves that ended well.", m.saves)
    one("supervise_saves_failed", "counter", "Checkpoint saves that failed or were aborted at their end.",
        m.saves_failed)
    family("supervise_save_duration_seconds", "summary", "Duration of the saves that ended well.",
           [("_sum", "", m.save_seconds_total), ("_count", "", m.save_seconds_count)])
    if m.save_seconds_last is not None:
        one("supervise_save_duration_last_seconds", "gauge", "Duration of the newest save.", m.save_seconds_last)
    if m.save_seconds_max is not None:
        one("supervise_save_duration_max_seconds", "gauge", "Duration of the longest save.", m.save_seconds_max)
    if m.last_durable_step is not None:
        one("supervise_last_durable_step", "gauge", "Step of the newest good checkpoint.", m.last_durable_step)
    family("supervise_run_outcome", "gauge",
           "1 for the run's outcome (running until a run_end ends it) and what stopped it.",
           [("", f'outcome="{_label(m.outcome)}",stopped_by="{_label(m.stopped_by or "")}"', 1)])
    if m.ts is not None:
        one("supervise_last_event_timestamp_seconds", "gauge", "Time of the newest event folded (epoch seconds).",
            m.ts)
    return "\n".join(lines) + "\n"


def _attribute(value: Any) -> Any:
    """A scalar attribute as OpenTelemetry allows it (string, bool, int, double); None for others."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value if abs(value) < 2**63 else str(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return value[:MAX_ATTRIBUTE_CHARS]
    return None


_NOT_FAILURES = frozenset(c.value for c in classes_where(answerable=False))  # supervisor/failures/classes.py


def _severity(event: Event) -> str:
    if event.event == Ev.RUN_END.value:
        return "INFO" if event.get("outcome") in ("complete", "requeue") else "ERROR"
    if event.event == Ev.ATTEMPT_END.value:
        return "INFO" if event.get("class") in _NOT_FAILURES else "ERROR"
    if event.event in (Ev.NOTICE.value, Ev.SAVE_ABORTED.value, Ev.QUARANTINE.value, Ev.STALL.value,
                       Ev.RESUME_MISMATCH.value):
        return "WARN"
    if event.event in (Ev.SAVE_END.value, Ev.REQUEUE.value, Ev.BUDGET.value) and event.get("ok") is False:
        return "WARN"
    return "INFO"


def _body(event: Event) -> str:
    reason = event.get("reason")
    if isinstance(reason, str) and reason:
        return reason[:MAX_ATTRIBUTE_CHARS]
    attempt = event.get("attempt")
    said = f"attempt {attempt}: " if isinstance(attempt, int) else ""
    detail = event.get("class") or event.get("action") or event.get("outcome") or ""
    return f"{said}{event.event}{' ' + str(detail) if detail else ''}"[:MAX_ATTRIBUTE_CHARS]


def otel_record(event: Event, m: RunMetrics, resource: Mapping[str, Any]) -> dict[str, Any] | None:
    """One record per event of :data:`OTEL_EVENTS` (None for the others), shaped as an OpenTelemetry
    log record: the event's scalar fields under ``supervise.``, and the run's totals after it."""
    if event.event not in OTEL_EVENTS:
        return None
    attributes: dict[str, Any] = {}
    for key, value in event.fields.items():
        plain = _attribute(value)
        if plain is not None:
            attributes[f"supervise.{key}"] = plain
    for key, value in m.as_numbers().items():
        attributes[f"supervise.run.{key}"] = value
    attributes["supervise.run.outcome"] = m.outcome
    severity = _severity(event)
    nanos = int(round(event.ts * 1e9))
    return {
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(event.ts)) + f".{nanos % 10**9 // 1000:06d}Z",
        "time_unix_nano": nanos,
        "severity_text": severity,
        "severity_number": _SEVERITY[severity],
        "event_name": f"supervise.{event.event}",
        "body": _body(event),
        "resource": dict(resource),
        "attributes": attributes,
    }


def otel_resource(run: str, run_dir: str, host: str) -> dict[str, Any]:
    """The resource every record carries: who wrote it, for which run."""
    return {"service.name": "slurm-supervisor", "service.version": __version__, "supervise.run.name": run,
            "supervise.run.dir": run_dir, "host.name": host}


def snapshot_json(m: RunMetrics, run: str) -> str:
    """``supervisor/metrics.json``: what ``supervisor.client.restart_metrics()`` reads in the training."""
    data = {"v": SNAPSHOT_VERSION, "run": run, "ts": m.ts, "metrics": m.as_numbers(), "outcome": m.outcome,
            "stopped_by": m.stopped_by, "reason": m.reason, "steps_lost_at_least": m.steps_lost_at_least,
            "ends": dict(m.ends)}
    return json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n"
