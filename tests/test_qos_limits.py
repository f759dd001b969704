"""QOS limits in the resubmission loop: the pure decisions (slurm/qos_limits.py) as tables, and the
loop's use of them against a scripted Slurm (no cluster; tests/test_qos_cluster.py runs the same
against a real slurmdbd)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from supervisor.config import BudgetConfig
from supervisor.errors import SlurmError
from supervisor.addons.resubmit import SubmitLoop
from supervisor.slurm import JobInfo
from supervisor.slurm.qos_limits import (
    QosLimit,
    backoff_seconds,
    check_wall_time,
    job_option,
    limit_of_pending_reason,
    limit_of_sbatch_error,
    time_option_seconds,
    wait_for_limit,
)

POLICY = ("sbatch: error: Batch job submission failed: Job violates accounting/QOS policy "
          "(job submit limit, user's size and/or time limits)")


@pytest.mark.parametrize("reason, limit", [
    ("QOSMaxJobsPerUserLimit", QosLimit.MAX_JOBS_PER_USER),
    ("QOSMaxSubmitJobPerUserLimit", QosLimit.MAX_SUBMIT_PER_USER),
    ("QOSMaxWallDurationPerJobLimit", QosLimit.MAX_WALL),
    ("QOSGrpCpuLimit", QosLimit.OTHER),  # any other QOS limit passes the same way
    ("QOSMaxCpuPerUserLimit", QosLimit.OTHER),
    ("Priority", None), ("Resources", None), ("BeginTime", None), ("JobHeldUser", None), ("", None), (None, None),
    ("AssocMaxJobsLimit", None),  # an association limit, not the QOS's: not ours to name
])
def test_pending_reason_names_the_qos_limit(reason, limit):
    assert limit_of_pending_reason(reason) is limit


@pytest.mark.parametrize("stderr, limit", [
    (POLICY, QosLimit.MAX_SUBMIT_PER_USER),
    ("sbatch: error: QOSMaxSubmitJobPerUserLimit", QosLimit.MAX_SUBMIT_PER_USER),
    ("sbatch: error: Batch job submission failed: Invalid qos specification", None),  # can never pass
    ("sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified",
     None),
    ("sbatch: error: Batch job submission failed: Socket timed out on send/recv operation", None),
    ("", None), (None, None),
])
def test_sbatch_refusal_names_the_qos_limit(stderr, limit):
    assert limit_of_sbatch_error(stderr) is limit


@pytest.mark.parametrize("tries, seconds", [(0, 15), (1, 30), (2, 60), (3, 120), (4, 240), (5, 300), (40, 300)])
def test_backoff_doubles_up_to_the_cap(tries, seconds):
    assert backoff_seconds(tries, 15, 300) == seconds


def test_backoff_refuses_a_negative_count_and_the_wait_says_it_is_not_a_failure():
    with pytest.raises(ValueError):
        backoff_seconds(-1, 1, 2)
    wait = wait_for_limit(QosLimit.MAX_JOBS_PER_USER, 1, 10, 300, what="job 12")
    assert wait.seconds == 20 and wait.limit is QosLimit.MAX_JOBS_PER_USER
    assert "job 12" in wait.reason and "MaxJobsPerUser" in wait.reason and "not a failure" in wait.reason
    with pytest.raises(dataclasses.FrozenInstanceError):
        wait.seconds = 1  # type: ignore[misc]


@pytest.mark.parametrize("value, seconds", [
    ("30", 1800), ("30:15", 1815), ("1:00:00", 3600), ("2-0", 172800), ("1-2:30", 95400), ("1-00:00:01", 86401),
    ("UNLIMITED", None), ("infinite", None),
])
def test_time_option_reads_sbatch_formats(value, seconds):
    assert time_option_seconds(value) == seconds


@pytest.mark.parametrize("requested, max_wall, ok, words", [
    ("10", "00:05:00", False, "--time=10 is over MaxWall=00:05:00 of QOS extra"),
    ("5", "00:05:00", True, "fits"),
    ("2-00:00:00", "1-00:00:00", False, "at most --time=1-00:00:00"),
    ("1-00:00:00", "1-00:00:00", True, "fits"),
    ("10", "", True, "nothing to check"),  # no MaxWall on the QOS
    ("10", None, True, "nothing to check"),
    (None, "00:05:00", True, "nothing to check"),  # no --time: the partition's default, Slurm judges
    ("soon", "00:05:00", True, "Slurm will judge"),
    ("UNLIMITED", "00:05:00", True, "unlimited"),
])
def test_wall_time_over_max_wall_is_refused(requested, max_wall, ok, words):
    verdict = check_wall_time(requested, "extra", max_wall)
    assert verdict.ok is ok and words in verdict.reason


@pytest.mark.parametrize("script, args, expected", [
    ("#!/bin/bash\n#SBATCH --qos=extra\nsrun x\n", [], "extra"),
    ("#!/bin/bash\n#SBATCH -q extra\n", [], "extra"),
    ("#!/bin/bash\n#SBATCH --qos=extra\n", ["--qos=normal"], "normal"),  # the command line wins
    ("#!/bin/bash\n#SBATCH --qos extra\n", ["-q", "normal"], "normal"),
    ("#!/bin/bash\necho hi\n#SBATCH --qos=extra\n", [], None),  # after the first command: sbatch ignores it
    ("#!/bin/bash\n", [], None),
])
def test_job_option_as_sbatch_reads_it(script, args, expected):
    assert job_option(script, args, "-q", "--qos") == expected


# ---------------------------------------------------------------------------------------------
# The loop against a scripted Slurm


class ScriptedSlurm:
    """sbatch refuses ``refusals`` times with the QOS policy error; the job then pends on
    ``pending`` reasons (one per poll), runs once and completes (writing the run's end)."""

    def __init__(self, run_dir: Path, refusals: int, pending: list[str]) -> None:
        self.run_dir, self.refusals, self.pending = run_dir, refusals, list(pending)
        self.submitted: list[int] = []

    def submit(self, script: str, args) -> int:
        if self.refusals:
            self.refusals -= 1
            err = SlurmError(["sbatch"], POLICY, 1)
            err.stderr = POLICY  # type: ignore[attr-defined]
            raise err
        self.submitted.append(100 + len(self.submitted))
        return self.submitted[-1]

    def job_info(self, job_id) -> JobInfo:
        if self.pending:
            return JobInfo(job_id=int(job_id), state="PENDING", reason=self.pending.pop(0))
        events = self.run_dir / "supervisor" / "events.jsonl"
        if not events.exists():
            events.parent.mkdir(parents=True, exist_ok=True)
            lines = [{"event": "run_start", "ts": 1.0, "job_id": str(job_id), "restart_count": 0},
                     {"event": "run_end", "ts": 2.0, "outcome": "complete", "reason": "training complete"}]
            events.write_text("".join(json.dumps(x) + "\n" for x in lines))
            return JobInfo(job_id=int(job_id), state="RUNNING")
        return JobInfo(job_id=int(job_id), state="COMPLETED", exit_code=0)


def run_loop(tmp_path: Path, refusals: int, pending: list[str]):
    script = tmp_path / "train.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --qos=extra\n")
    slurm = ScriptedSlurm(tmp_path / "run", refusals, pending)
    sleeps: list[float] = []
    loop = SubmitLoop(script, [], tmp_path / "run", slurm, BudgetConfig(), max_submissions=1, poll=2.0,
                      settle=0.0, event_wait=0.0, sleep=sleeps.append)
    return loop.run(), slurm, sleeps


def test_submission_refused_by_a_qos_limit_is_tried_again_with_backoff_never_counted(tmp_path, caplog):
    result, slurm, sleeps = run_loop(tmp_path, refusals=5, pending=[])
    assert result.outcome == "complete" and result.exit_code == 0  # max_submissions=1 was not used up by refusals
    assert slurm.submitted == [100] and len(result.submissions) == 1
    assert result.limit_waits == 5
    assert sleeps[:5] == [2, 4, 8, 16, 16]  # doubled from --poll, at most 8 polls apart
    assert "held back by the QOS limit MaxSubmitJobsPerUser" in caplog.text
    lines = (tmp_path / "run" / "supervisor" / "submissions.jsonl").read_text().splitlines()
    assert len(lines) == 1  # only the submission that got through is recorded


def test_job_pending_on_a_qos_limit_is_followed_with_backoff_and_completes(tmp_path, caplog):
    pending = ["QOSMaxJobsPerUserLimit"] * 3 + ["Priority"] + ["QOSMaxWallDurationPerJobLimit"]
    result, slurm, sleeps = run_loop(tmp_path, refusals=0, pending=pending)
    assert result.outcome == "complete" and len(result.submissions) == 1
    assert result.limit_waits == 4
    assert sleeps[:5] == [2, 4, 8, 2, 2]  # the backoff starts over after the limit passed once
    assert "job 100 is held back by the QOS limit MaxJobsPerUser" in caplog.text
    assert "QOSMaxWallDurationPerJobLimit" in caplog.text


def test_a_refusal_that_is_no_qos_limit_still_ends_the_loop(tmp_path):
    script = tmp_path / "train.sbatch"
    script.write_text("#!/bin/bash\n")

    class Refusing(ScriptedSlurm):
        def submit(self, script, args):
            err = SlurmError(["sbatch"], "Invalid qos specification", 1)
            err.stderr = "sbatch: error: Batch job submission failed: Invalid qos specification"  # type: ignore[attr-defined]
            raise err

    loop = SubmitLoop(script, [], tmp_path / "run", Refusing(tmp_path / "run", 0, []), BudgetConfig(),
                      poll=1.0, sleep=lambda s: None)
    result = loop.run()
    assert result.outcome == "slurm_error" and result.exit_code == 1 and "Invalid qos" in result.reason
    assert result.limit_waits == 0
