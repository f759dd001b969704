"""A check for cluster tests with accounting (slurmdbd): the report's Slurm history agrees with the run.

Call :func:`check_accounting_history` at the end of a cluster test whose run was requeued and/or
resubmitted, on a cluster with ``AccountingStorageType=accounting_storage/slurmdbd``:

    view = check_accounting_history(run_dir, cluster.env, final_state="COMPLETED")

It runs the same code ``supervise report`` runs (``build_report`` with the real ``sacct`` of the
cluster's version, found on ``cluster.env``'s PATH) and asserts what a user reading the report
relies on. slurmdbd receives job records asynchronously, so it asks again (every second, up to
``wait_s``) while the history is not complete yet, then asserts on the last answer.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

from supervisor.addons.report import Report, build_report
from supervisor.addons.report.accounting import AccountingState, AccountingView, Agreement
from supervisor.addons.accounting import query_sacct
from supervisor.slurm.parse import expand_hostlist

# The states of a run that came back afterwards: requeued (by Slurm or by the supervisor), or ended
# by the scheduler and resubmitted by `supervise submit`.
COME_BACK_STATES = frozenset({"PREEMPTED", "REQUEUED", "CANCELLED", "NODE_FAIL", "TIMEOUT"})


def _report(run_dir: Path, env: Mapping[str, str]) -> Report:
    return build_report(run_dir, check_checkpoints=False, accounting=lambda ids: query_sacct(ids, environ=env))


def _complete(rep: Report) -> bool:
    view = rep.accounting
    return (view is not None and view.state is AccountingState.GATHERED and not view.disagreements
            and all(r.end is not None for r in view.rows if r.agreement is Agreement.MATCHED))


def check_accounting_history(run_dir: Path, env: Mapping[str, str], *, final_state: str | None = "COMPLETED",
                             wait_s: float = 30.0) -> AccountingView:
    """Assert that Slurm's history and the supervisor's sessions are the same story; return the view.

    * sacct answered (state ``gathered``), with a record for every job id the run names;
    * no disagreement: each run Slurm started has its supervisor session and the reverse;
    * one matched record per session, in order, restart counts 0, 1, 2... within each job id;
    * each matched record ran on the node(s) the supervisor's attempts logged;
    * every run but the last ended in a state that brings the job back, the last in ``final_state``;
    * the supervisor's attempts all appear, each once, in the history.
    """
    deadline = time.monotonic() + wait_s
    rep = _report(run_dir, env)
    while not _complete(rep) and time.monotonic() < deadline:
        time.sleep(1.0)
        rep = _report(run_dir, env)
    view = rep.accounting
    assert view is not None and view.state is AccountingState.GATHERED, view and view.reason
    assert not view.disagreements, [(r.job_id, r.restart, r.note) for r in view.disagreements]

    sessions = [j for j in rep.run.jobs if j.job_id]
    matched = [r for r in view.rows if r.agreement is Agreement.MATCHED]
    assert [s for r in matched for s in r.sessions] == [s.session for s in sessions], (matched, sessions)
    assert {r.job_id for r in view.rows} >= {str(s.job_id) for s in sessions}
    by_job: dict[str, list[int | None]] = {}
    for r in matched:
        by_job.setdefault(r.job_id, []).append(r.restart)
    for job, restarts in by_job.items():
        assert restarts == list(range(len(restarts))), (job, restarts)

    nodes_of = {a.attempt: set(a.nodes) for a in rep.attempts if a.nodes}
    for r in matched:
        ran_on = set(expand_hostlist(r.nodes or ""))
        for attempt in r.attempts:
            if attempt in nodes_of:
                assert nodes_of[attempt] <= ran_on, (r.job_id, r.restart, attempt, nodes_of[attempt], ran_on)

    states = [(r.state or "").split()[0] for r in matched]
    # A run the supervisor itself ended to be requeued or resubmitted (exit 75, inside a preemption's
    # grace) is FAILED to Slurm: that brings the job back too.
    came_back = [s in COME_BACK_STATES or (s == "FAILED" and (r.exit_code or "").startswith("75:"))
                 for s, r in zip(states, matched)]
    assert all(came_back[:-1]), [(s, r.exit_code) for s, r in zip(states, matched)]
    if final_state is not None:
        assert states[-1] == final_state, states
    attempts = [a for r in matched for a in r.attempts]
    assert sorted(attempts) == [a.attempt for a in rep.attempts], (attempts, [a.attempt for a in rep.attempts])
    return view
