"""Restart metrics on the training side: what the supervisor counted before this attempt started
(docs/metrics.md). Stdlib only, like ``supervisor.client``, which re-exports both functions."""

from __future__ import annotations

import json
import os
from typing import Any

METRICS_SNAPSHOT = "metrics.json"  # in $SUPERVISOR_RUN_DIR/supervisor/, written by supervisor/addons/metrics/sink.py
_MAX_SNAPSHOT_BYTES = 1 << 16
_MAX_METRICS = 64


def restart_metrics(run_dir: str | os.PathLike[str] | None = None) -> dict[str, float]:
    """The run's restart metrics, as the supervisor wrote them right before this attempt started:
    ``attempt``, ``attempts``, ``restarts``, ``requeues``, ``preemptions``, ``failures``,
    ``steps_lost``, ``time_lost_s``, ``saves``, ``saves_failed``, and ``save_seconds_last``,
    ``save_seconds_max``, ``last_durable_step`` once known. Empty without a supervisor, or when its
    metrics are off (``metrics.enabled: false``). Never raises."""
    base = os.fspath(run_dir) if run_dir is not None else os.environ.get("SUPERVISOR_RUN_DIR")
    if not base:
        return {}
    try:
        with open(os.path.join(base, "supervisor", METRICS_SNAPSHOT), "rb") as fh:
            data = json.loads(fh.read(_MAX_SNAPSHOT_BYTES))
    except (OSError, ValueError, RecursionError):
        return {}
    numbers = data.get("metrics") if isinstance(data, dict) else None
    if not isinstance(numbers, dict):
        return {}
    out: dict[str, float] = {}
    for key, value in list(numbers.items())[:_MAX_METRICS]:
        plain = value.__class__ is int or (value.__class__ is float and value == value and abs(value) != float("inf"))
        if isinstance(key, str) and 0 < len(key) <= 64 and plain:
            out[key] = value
    return out


def log_restart_metrics(logger: Any, step: int | None = None, *, prefix: str = "supervisor/") -> dict[str, float]:
    """Log :func:`restart_metrics` at ``step`` in one call and return what was logged (empty: nothing
    was). ``logger``: a TensorBoard ``SummaryWriter`` (or anything with ``add_scalar``), a Lightning
    logger (``log_metrics``) or a W&B run (``log``); flushed where it can be, so that a crash later in
    the attempt does not lose them."""
    named = {f"{prefix}{key}": value for key, value in restart_metrics().items()}
    if not named:
        return {}
    if callable(getattr(logger, "add_scalar", None)):
        for key, value in named.items():
            logger.add_scalar(key, value, step)
        if callable(getattr(logger, "flush", None)):
            logger.flush()
    elif callable(getattr(logger, "log_metrics", None)):
        logger.log_metrics(named, step=step)
        if callable(getattr(logger, "save", None)):
            logger.save()
    elif callable(getattr(logger, "log", None)):
        if step is None:
            logger.log(named)
        else:
            logger.log(named, step=step)
    else:
        raise TypeError(f"log_restart_metrics: {type(logger).__name__} has none of add_scalar (a SummaryWriter), "
                        "log_metrics (a Lightning logger) or log (a W&B run); pass one of those, or use "
                        "restart_metrics() and log the dict yourself")
    return named
