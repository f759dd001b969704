"""Asking ``sacct`` for a run's job history: the I/O edge behind the report's accounting section.

One call per report, at report time (``supervise report``, unless ``--no-accounting``): argv only,
never a shell, a timeout, and never an exception out of :func:`query_sacct`: a cluster without
accounting, a missing ``sacct``, a database that does not answer all become a :class:`SacctAnswer`
with one line saying why, and the report goes on without the history. ``SLURM_TIME_FORMAT=%s``
makes the times epoch seconds, so they compare with the event log's whatever the time zones of the
nodes and of the machine the report runs on. Parsing is in ``supervisor/slurm/sacct.py`` (pure).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence

from ..slurm.sacct import DELIMITER, FIELDS, SacctAnswer, SacctStatus, classify_failure, parse_sacct

DEFAULT_TIMEOUT = 15.0
MAX_JOB_IDS = 200

Runner = Callable[..., "subprocess.CompletedProcess[str]"]


def sacct_argv(job_ids: Sequence[str], fields: Sequence[str] = FIELDS) -> list[str]:
    """``sacct`` for every accounting record of these jobs: requeued runs too (``--duplicates``),
    the allocation line only (``--allocations``), one line each with a header (``--parsable2``),
    split on a character no value holds; whoever submitted them (``--allusers``: the report may be
    made by a colleague; a site's PrivateData still decides what they may see)."""
    return ["sacct", "--jobs", ",".join(job_ids), "--allusers", "--duplicates", "--allocations", "--parsable2",
            f"--delimiter={DELIMITER}", "--format", ",".join(fields)]


def query_sacct(job_ids: Sequence[str], *, timeout: float = DEFAULT_TIMEOUT, run: Runner = subprocess.run,
                which: Callable[..., str | None] = shutil.which,
                environ: Mapping[str, str] | None = None) -> SacctAnswer:
    """The accounting records of ``job_ids`` (numeric Slurm job ids), or why there are none.
    ``environ``: the environment sacct runs in (default this process's); sacct is looked up on its PATH."""
    ids = [j for j in dict.fromkeys(str(j).strip() for j in job_ids) if j.replace("_", "").isdigit()][:MAX_JOB_IDS]
    if not ids:
        return SacctAnswer(SacctStatus.ERROR, reason="no Slurm job id to ask sacct about")
    env = dict(os.environ if environ is None else environ)
    if which("sacct", path=env.get("PATH", os.defpath)) is None:
        return SacctAnswer(SacctStatus.MISSING, reason="sacct is not installed here (not on PATH)")
    env["SLURM_TIME_FORMAT"] = "%s"  # epoch seconds: no time zone to guess
    fields = list(FIELDS)
    for _ in range(len(FIELDS)):  # each retry drops one field an older sacct refused
        argv = sacct_argv(ids, fields)
        try:
            done = run(argv, capture_output=True, text=True, timeout=timeout, env=env, errors="replace")
        except subprocess.TimeoutExpired:
            return SacctAnswer(SacctStatus.TIMEOUT, reason=f"sacct did not answer within {timeout:g}s "
                                                           "(slurmdbd busy or unreachable)")
        except OSError as exc:
            return SacctAnswer(SacctStatus.MISSING, reason=f"cannot run sacct ({exc.strerror or exc})")
        if done.returncode == 0:
            try:
                records = parse_sacct(done.stdout or "", DELIMITER)
            except ValueError as exc:
                return SacctAnswer(SacctStatus.ERROR, reason=str(exc))
            return SacctAnswer(SacctStatus.OK, records=records, fields=tuple(fields))
        status, reason, refused = classify_failure(done.returncode, f"{done.stderr or ''}\n{done.stdout or ''}")
        if refused is None or refused not in fields:
            return SacctAnswer(status, reason=reason)
        fields.remove(refused)
    return SacctAnswer(SacctStatus.ERROR, reason="sacct refused every field asked for")


__all__ = ["DEFAULT_TIMEOUT", "query_sacct", "sacct_argv"]
