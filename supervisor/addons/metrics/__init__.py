"""Restart metrics for the tools people watch (docs/metrics.md).

``model`` folds the event log into :class:`~supervisor.addons.metrics.model.RunMetrics` (pure); ``render``
turns them into a Prometheus text file, OpenTelemetry-style JSON lines and the snapshot the
training side reads (pure); ``sink`` is the event sink that keeps those files up to date on a
thread of its own (I/O). The run loop knows none of this: the CLI registers the sink
(``supervisor/sinks.py``).
"""
