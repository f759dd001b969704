"""Post-mortem views folded from the event log.

``build_report(run_dir)`` reads a run directory and returns a frozen :class:`Report`;
``fold(events, manifests)`` is the pure part. Renderers (text and Markdown in ``render``, the
self-contained page in ``html``) and the optional plot live in their own modules so that the CLI
imports only what it draws.
"""

from .drift import DriftItem, find_drift
from .load import Liveness, build_report, check_alive, resolve_run_dir
from .model import (
    AttemptRow,
    CheckpointRow,
    EventsSummary,
    JobRow,
    QuarantineFile,
    QuarantineRow,
    Report,
    RunInfo,
    StepPoint,
    VerdictView,
    fold,
)
from .status import StatusView, summarize_status

__all__ = [
    "AttemptRow", "CheckpointRow", "DriftItem", "EventsSummary", "JobRow", "Liveness", "QuarantineFile",
    "QuarantineRow", "Report", "RunInfo", "StatusView", "StepPoint", "VerdictView", "build_report",
    "check_alive", "find_drift", "fold", "resolve_run_dir", "summarize_status",
]
