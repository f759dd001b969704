"""What a QOS limit means for the resubmission loop (``supervise submit``): wait, or refuse up front.

A site's preemptible QOS ("extra", "scavenger") usually carries per-user limits. Slurm enforces
them in two places (docs/qos.md):

* at ``sbatch``: over ``MaxSubmitJobsPerUser`` the submission is refused ("Job violates
  accounting/QOS policy (job submit limit, user's size and/or time limits)"); no job exists;
* in the queue: over ``MaxJobsPerUser`` (or over ``MaxWall`` without the QOS's ``DenyOnLimit``
  flag) the job is accepted and stays PENDING with the reason ``QOSMaxJobsPerUserLimit`` /
  ``QOSMaxWallDurationPerJobLimit``.

Both pass when the user's other jobs end: the loop waits them out with a growing interval and
says so; they are never a failure of the training nor a reason to give up. A wall time over the
QOS's ``MaxWall`` can never pass (the limit does not move with the user's other jobs): that is
refused before the first submission (:func:`check_wall_time`).

Everything here is pure: text and numbers in, a frozen answer with a ``reason`` out.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass

from .parse import parse_duration


class QosLimit(enum.Enum):
    """The QOS limits the resubmission loop knows how to wait for."""

    MAX_SUBMIT_PER_USER = "MaxSubmitJobsPerUser"
    MAX_JOBS_PER_USER = "MaxJobsPerUser"
    MAX_WALL = "MaxWall"
    OTHER = "other QOS limit"


# Pending reasons (squeue %r / scontrol Reason=) and the limit behind each.
_PENDING_REASONS: dict[str, QosLimit] = {
    "QOSMaxSubmitJobPerUserLimit": QosLimit.MAX_SUBMIT_PER_USER,
    "QOSMaxJobsPerUserLimit": QosLimit.MAX_JOBS_PER_USER,
    "QOSMaxWallDurationPerJobLimit": QosLimit.MAX_WALL,
}
_QOS_REASON = re.compile(r"^QOS(Grp|Max|MinTRES|JobLimit|UsageThreshold)", re.IGNORECASE)
# sbatch's refusal under AccountingStorageEnforce=limits (the text of ESLURM_ACCOUNTING_POLICY), and
# the names a newer Slurm or a job_submit plugin may print instead.
_SBATCH_POLICY = re.compile(r"violates accounting/QOS policy|QOSMaxSubmitJob|MaxSubmitJobs", re.IGNORECASE)


@dataclass(frozen=True)
class LimitWait:
    """A submission or a pending job held back by a QOS limit: wait ``seconds``, then look again."""

    limit: QosLimit
    seconds: float
    reason: str


def limit_of_pending_reason(reason: str | None) -> QosLimit | None:
    """The QOS limit a pending job waits on, from its Reason; None when it is not a QOS limit."""
    word = (reason or "").strip()
    if word in _PENDING_REASONS:
        return _PENDING_REASONS[word]
    return QosLimit.OTHER if _QOS_REASON.match(word) else None


def limit_of_sbatch_error(stderr: str | None) -> QosLimit | None:
    """The QOS limit an sbatch refusal names; None when the refusal is something else.

    Slurm's refusal does not say which limit: over ``MaxSubmitJobsPerUser`` is by far the common
    one for a loop that resubmits while the user's other jobs queue, so it is named so; the wait is
    the same whatever the limit (a MaxWall that can never pass is caught before, by
    :func:`check_wall_time`)."""
    text = stderr or ""
    return QosLimit.MAX_SUBMIT_PER_USER if _SBATCH_POLICY.search(text) else None


def backoff_seconds(tries: int, base: float, cap: float) -> float:
    """The wait before look number ``tries + 1`` (tries >= 0): ``base`` doubled each time, at most
    ``cap``. A limit usually passes when one of the user's jobs ends: minutes, not seconds."""
    if tries < 0:
        raise ValueError(f"tries must be >= 0, got {tries}")
    return float(min(cap, base * (2 ** min(tries, 30))))


def wait_for_limit(limit: QosLimit, tries: int, base: float, cap: float, *, what: str) -> LimitWait:
    """How long to wait out ``limit`` before look ``tries + 1``, and the line that says so.
    ``what``: "the submission" or "job 12"."""
    seconds = backoff_seconds(tries, base, cap)
    name = limit.value
    return LimitWait(limit, seconds,
                     f"{what} is held back by the QOS limit {name}: waiting {seconds:.0f} s for the user's other "
                     "jobs to end (not a failure of the training; the run goes on when the limit allows)")


@dataclass(frozen=True)
class WallCheck:
    """Can the asked wall time ever run under the QOS's MaxWall?"""

    ok: bool
    reason: str


def check_wall_time(requested: str | None, qos: str | None, max_wall: str | None) -> WallCheck:
    """``requested``: the job's ``--time`` (Slurm's formats); ``max_wall``: the QOS's MaxWall as
    ``sacctmgr`` prints it (empty when unlimited). Not ok only when both are known and the request
    is over the limit: a job that would wait in the queue forever (or be refused) on every
    submission."""
    if not requested or not max_wall or not max_wall.strip():
        return WallCheck(True, "no wall time asked or no MaxWall on the QOS: nothing to check")
    try:
        asked = time_option_seconds(requested)
        limit = parse_duration(max_wall.strip())
    except ValueError:
        return WallCheck(True, f"cannot read --time {requested!r} or MaxWall {max_wall!r}: Slurm will judge")
    if asked is None or limit is None:
        return WallCheck(True, "unlimited wall time or MaxWall: nothing to check")
    if asked <= limit:
        return WallCheck(True, f"--time {requested} fits MaxWall {max_wall} of QOS {qos}")
    return WallCheck(False, f"--time={requested} is over MaxWall={max_wall.strip()} of QOS {qos}: Slurm would never "
                            f"start the job; ask for at most --time={max_wall.strip()} (the supervisor resubmits "
                            "after each allocation ends) or use another QOS")


def time_option_seconds(value: str) -> int | None:
    """sbatch's ``--time`` in seconds: ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``
    (a bare number is minutes, unlike the ``MM:SS`` that scontrol prints); None for unlimited."""
    text = value.strip()
    if text.lower() in ("infinite", "unlimited", "-1"):
        return None
    days, _, rest = text.rpartition("-") if "-" in text else ("", "", text)
    parts = [int(p) for p in rest.split(":")]  # ValueError on anything else
    if any(p < 0 for p in parts) or len(parts) > 3:
        raise ValueError(f"not a --time value: {value!r}")
    if days:
        hours, minutes, seconds = (parts + [0, 0])[:3]
        return ((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds
    if len(parts) == 1:
        return parts[0] * 60
    if len(parts) == 2:
        return parts[0] * 60 + parts[1]
    return (parts[0] * 60 + parts[1]) * 60 + parts[2]


def option_value(args: Sequence[str], short: str, long: str) -> str | None:
    """The last value of ``-x V`` / ``-xV`` / ``--long=V`` / ``--long V`` in an argument list."""
    found = None
    for i, arg in enumerate(args):
        if arg in (short, long) and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith(long + "="):
            found = arg.split("=", 1)[1]
        elif short and arg.startswith(short) and len(arg) > len(short) and not arg.startswith("--"):
            found = arg[len(short):]
    return found


def job_option(script_text: str, sbatch_args: Sequence[str], short: str, long: str) -> str | None:
    """An sbatch option as the job gets it: the command line beats the script's ``#SBATCH`` lines."""
    on_line = option_value(sbatch_args, short, long)
    if on_line is not None:
        return on_line
    found = None
    for line in script_text.splitlines():
        if line.startswith("#SBATCH"):
            value = option_value(line[len("#SBATCH"):].split(), short, long)
            found = value if value is not None else found
        elif line.strip() and not line.startswith("#"):
            break  # sbatch stops reading #SBATCH at the first command
    return found
