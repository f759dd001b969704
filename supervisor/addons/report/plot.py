"""Step over wall-clock time, one line per attempt, with failures, restarts, stop notices
(preemptions / time limits), resumes and checkpoints marked. matplotlib is an optional extra
(``pip install slurm-supervisor[plot]``); the Agg backend needs no display.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...errors import UsageError
from .model import Report

PLOT_SIZE_IN = (11.0, 5.0)
PLOT_DPI = 100


# (unit, seconds per unit, largest span shown in it)
_TIME_UNITS = (("seconds", 1.0, 120.0), ("minutes", 60.0, 7200.0), ("hours", 3600.0, 172800.0),
               ("days", 86400.0, float("inf")))


class PlotUnavailable(UsageError):
    """matplotlib is not installed: the plot is an optional extra."""


def _matplotlib() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailable("--plot needs matplotlib, which is not installed; "
                              "install it with: pip install 'slurm-supervisor[plot]'") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def plot_report(report: Report, path: Path) -> dict[str, int]:
    """Write the PNG; return how many of each marker were drawn (what a reader should see)."""
    plt = _matplotlib()
    counts = {"attempts": 0, "failures": 0, "restarts": 0, "requeues": 0, "preemptions": 0, "resumes": 0,
              "checkpoints": 0}
    times = [p.ts for p in report.series] + [a.start for a in report.attempts if a.start is not None]
    t0 = min(times) if times else 0.0
    span = (max(times) - t0) if times else 0.0
    unit, scale = next((u, s) for u, s, upto in _TIME_UNITS if span <= upto)
    first_of_session = {j.attempts[0] for j in report.run.jobs if j.attempts}

    def hours(ts: float) -> float:
        return (ts - t0) / scale

    fig, ax = plt.subplots(figsize=PLOT_SIZE_IN, dpi=PLOT_DPI)
    try:
        cmap = plt.get_cmap("tab10")
        labelled: set[str] = set()

        def label(name: str) -> str | None:
            if name in labelled:
                return None
            labelled.add(name)
            return name

        for i, a in enumerate(report.attempts):
            points = sorted((p.ts, p.step) for p in report.series if p.attempt == a.attempt)
            if a.start is not None and a.resume_step is None and a.resume_path is None and points \
                    and points[0][0] > a.start:
                points.insert(0, (a.start, 0))  # a fresh start begins at step 0
            color = cmap(i % 10)
            if points:
                counts["attempts"] += 1
                ax.plot([hours(t) for t, _ in points], [s for _, s in points], "-", color=color,
                        linewidth=1.5, label=f"attempt {a.attempt}" if len(report.attempts) <= 10 else None)
            saves = [p for p in report.series if p.attempt == a.attempt and p.kind == "save"]
            if saves:
                counts["checkpoints"] += len(saves)
                ax.plot([hours(p.ts) for p in saves], [p.step for p in saves], "s", color=color,
                        markersize=4, label=label("checkpoint"))
            if i > 0 and a.start is not None:
                counts["restarts"] += 1
                if a.attempt in first_of_session:  # a new job session: back through Slurm
                    counts["requeues"] += 1
                    ax.axvline(hours(a.start), color="0.35", linestyle="--", linewidth=1,
                               label=label("restart after requeue"))
                else:
                    ax.axvline(hours(a.start), color="0.6", linestyle=":", linewidth=1,
                               label=label("restart in place"))
            if a.resume_step is not None and a.start is not None:
                counts["resumes"] += 1
                ax.plot([hours(a.start)], [a.resume_step], "o", color="tab:green", markersize=8,
                        markerfacecolor="none", markeredgewidth=2, label=label("resume"))
            end_ts = a.end if a.end is not None else (points[-1][0] if points else None)
            end_step = a.last_step if a.last_step is not None else (points[-1][1] if points else None)
            if end_ts is None or end_step is None:
                continue
            if a.preempted:
                counts["preemptions"] += 1
                notice = next((n for n in report.events_summary.notices if n.get("attempt") == a.attempt), None)
                noticed = notice.get("ts") if notice else None
                at = float(noticed) if isinstance(noticed, (int, float)) else end_ts
                ax.plot([hours(at)], [end_step], "v", color="tab:orange", markersize=10,
                        label=label("preemption / time limit"))
            if a.failed:
                counts["failures"] += 1
                step = a.evidence_step if a.evidence_step is not None else end_step
                ax.plot([hours(end_ts)], [step], "x", color="tab:red", markersize=11, markeredgewidth=2.5,
                        label=label("failure"))
        ax.set_xlabel(f"{unit} since the first attempt started")
        ax.set_ylabel("training step")
        title = f"{report.run.name or 'run'}: {report.run.attempts} attempt(s), {report.run.steps_lost} steps lost"
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best", fontsize=8, ncol=2, framealpha=0.8)
        fig.tight_layout()
        fig.savefig(path, format="png", dpi=PLOT_DPI)
    finally:
        plt.close(fig)
    return counts
