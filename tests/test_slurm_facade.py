"""The Slurm facade without a cluster: parsers on literal outputs captured from a real Slurm 22.05.8
(tests/data/slurm/, re-capture with tests/data/slurm/capture.py) and, for the stop causes, from
22.05.8, 24.11.5 and 26.05.5 (tests/data/slurm/<release>/, ``capture.py --stops``), the job
environment, the requeue policy, versions and their capabilities, stop causes, holds, backend
choice, and the CLI seam's failure handling with stand-in commands.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
import types
from pathlib import Path

import pytest

from supervisor.errors import SlurmError
from supervisor.slurm import (
    PyslurmBackend,
    SlurmCli,
    SlurmEnv,
    SlurmVersion,
    SlurmVersionError,
    StopCause,
    get_backend,
    needs_explicit_requeue,
    requeue_need,
    stop_cause,
)
from supervisor.slurm.cli_backend import is_transient, slurm_error
from supervisor.slurm.parse import (
    SlurmParseError,
    expand_hostlist,
    parse_duration,
    parse_fields,
    parse_json_state,
    parse_sbatch_job_id,
    parse_scontrol_job,
    parse_scontrol_jobs,
    parse_time,
    parse_version,
)
from supervisor.slurm.requeue_policy import ALREADY_PENDING_MESSAGE, check_requeue
from supervisor.states import FailureClass

DATA = Path(__file__).parent / "data" / "slurm"
JOB_OUTPUTS = sorted(p for p in DATA.glob("*.txt") if p.name not in ("version.txt", "sbatch_parsable.txt"))


def job(name: str):
    return parse_scontrol_job((DATA / name).read_text())


# ---- parsing captured scontrol output --------------------------------------------------------------
@pytest.mark.parametrize("path", JOB_OUTPUTS, ids=lambda p: p.stem)
def test_every_captured_job_line_parses(path: Path) -> None:
    jobs = parse_scontrol_jobs(path.read_text())
    assert jobs and all(j.job_id > 0 and j.state.isupper() for j in jobs)
    assert all(j.raw["JobId"] == str(j.job_id) for j in jobs)


def test_pending_job_has_no_times_it_cannot_know_and_keeps_spaces_in_values() -> None:
    info = job("pending.txt")
    assert (info.state, info.reason) == ("PENDING", "BeginTime")
    assert info.is_pending and not info.is_running and not info.is_finished
    assert info.name == "a name with spaces" and info.raw["Comment"] == "k=v and more"
    assert info.end_time is None and info.preempt_time is None and info.nodes is None and info.node_names == ()
    assert info.time_limit is None  # UNLIMITED
    assert info.eligible_time - info.submit_time == 3600  # --begin=now+1hour
    assert info.raw["TRES"] == "cpu=1,mem=1M,node=1,billing=1"


def test_running_job_is_not_in_grace() -> None:
    info = job("running.txt")
    assert info.state == "RUNNING" and info.is_running and not info.in_grace
    assert info.preempt_time is None and info.grace_deadline is None
    assert info.nodes == "n1" and info.node_names == ("n1",) and info.partition == "extra"
    assert info.requeue and info.restarts == 0 and info.batch_flag == 1
    assert info.time_limit == 365 * 86400 and info.std_out and info.std_out.endswith(".out")


def test_grace_shows_preempt_time_and_the_deadline_as_end_time() -> None:
    info = job("grace.txt")  # captured with GraceTime=5, right after the step got SIGTERM
    assert info.state == "RUNNING" and info.in_grace
    assert info.end_time - info.preempt_time == 5
    assert info.grace_deadline == info.end_time
    assert info.start_time <= info.preempt_time


@pytest.mark.parametrize("name", ["preempted_pending.txt", "requeued_pending.txt"])
def test_requeued_job_waits_in_begin_time_with_one_restart(name: str) -> None:
    info = job(name)
    assert (info.state, info.reason, info.restarts) == ("PENDING", "BeginTime", 1)
    assert info.preempt_time is None and info.is_pending


def test_finished_states_exit_codes_and_signals() -> None:
    completed, failed, signaled = job("completed.txt"), job("failed.txt"), job("signaled.txt")
    assert (completed.state, completed.exit_code, completed.exit_signal) == ("COMPLETED", 0, 0)
    assert (failed.state, failed.reason, failed.exit_code) == ("FAILED", "NonZeroExitCode", 3)
    assert (signaled.exit_code, signaled.exit_signal) == (0, 11)  # the batch shell died of SIGSEGV
    timeout, cancelled = job("timeout.txt"), job("cancelled.txt")
    assert (timeout.state, timeout.reason, timeout.time_limit) == ("TIMEOUT", "TimeLimit", 60)
    assert timeout.run_time >= 60
    assert (cancelled.state, cancelled.exit_signal) == ("CANCELLED", 15)
    assert all(j.is_finished for j in (completed, failed, signaled, timeout, cancelled))
    after = job("completed_after_requeue.txt")
    assert (after.state, after.restarts) == ("COMPLETED", 1)


def test_exclude_list_is_expanded() -> None:
    assert job("excluded_pending.txt").exc_node_names == ("n1", "n2")
    assert job("running.txt").exc_node_names == ()


def test_array_output_holds_one_line_per_task_and_lookup_by_either_id() -> None:
    text = (DATA / "array.txt").read_text()
    tasks = parse_scontrol_jobs(text)
    assert len(tasks) == 2 and {t.array_task_id for t in tasks} == {1, 2}
    master = tasks[0].array_job_id
    by_task = parse_scontrol_job(text, f"{master}_1")
    assert by_task.array_task_id == 1 and parse_scontrol_job(text, by_task.job_id) == by_task


def test_version_and_sbatch_outputs() -> None:
    assert parse_version((DATA / "version.txt").read_text()) == (22, 5, 8)
    assert parse_version("slurm 24.05.0-0rc1") == (24, 5, 0)
    assert parse_version("slurm 23.11") == (23, 11, 0)
    assert parse_sbatch_job_id((DATA / "sbatch_parsable.txt").read_text()) == 2
    assert parse_sbatch_job_id("4711;cluster2\n") == 4711
    assert parse_sbatch_job_id("sbatch: warning: something\nSubmitted batch job 99\n") == 99


@pytest.mark.parametrize(
    "text",
    ["", "no job here", "JobName=x"],
)
def test_unparseable_scontrol_output_is_a_clear_error(text: str) -> None:
    with pytest.raises(SlurmParseError):
        parse_scontrol_job(text)


def test_bad_version_and_sbatch_text_are_clear_errors() -> None:
    with pytest.raises(SlurmParseError, match="no Slurm version"):
        parse_version("scontrol: fatal: Could not establish a configuration source")
    with pytest.raises(SlurmParseError, match="no job id"):
        parse_sbatch_job_id("sbatch: error: Batch job submission failed: Invalid partition name specified")


def test_fields_keep_equals_signs_and_spaces_inside_values() -> None:
    fields = parse_fields("JobId=7 JobName=my run Command=/a b/train.sh --lr=0.1 TRES=cpu=2,node=1 Power=")
    assert fields["JobName"] == "my run"
    assert fields["Command"] == "/a b/train.sh --lr=0.1"  # "--lr=0.1" is no Key= token
    assert fields["TRES"] == "cpu=2,node=1" and fields["Power"] == ""


def test_times_and_durations() -> None:
    assert parse_time("None") is None and parse_time("Unknown") is None and parse_time("N/A") is None
    assert parse_time("2026-11-30T14:19:45") - parse_time("2026-11-30T14:19:40") == 5
    with pytest.raises(SlurmParseError):
        parse_time("yesterday")
    assert parse_duration("1-02:03:04") == 93784 and parse_duration("05:00") == 300
    assert parse_duration("UNLIMITED") is None and parse_duration("Partition_Limit") is None


@pytest.mark.parametrize(
    ("hostlist", "names"),
    [
        ("n1", ("n1",)),
        ("n[1-2]", ("n1", "n2")),
        ("gpu[01-03,7],cpu5", ("gpu01", "gpu02", "gpu03", "gpu7", "cpu5")),
        ("r[1-2]-n[1-2]", ("r1-n1", "r1-n2", "r2-n1", "r2-n2")),
        ("(null)", ()),
        ("", ()),
    ],
)
def test_hostlists_expand(hostlist: str, names: tuple[str, ...]) -> None:
    assert expand_hostlist(hostlist) == names


def test_bad_hostlist_is_a_clear_error() -> None:
    with pytest.raises(SlurmParseError, match="unbalanced"):
        expand_hostlist("n[1-2")


# ---- environment --------------------------------------------------------------------------------
BATCH_ENV = {  # a subset of what the batch shell saw on the test cluster
    "SLURM_JOB_ID": "2", "SLURM_JOBID": "2", "SLURM_PROCID": "0", "SLURMD_NODENAME": "n1",
    "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_PARTITION": "extra", "SLURM_CLUSTER_NAME": "sstest",
    "SLURM_SUBMIT_DIR": "/tmp/x", "SLURM_LOCALID": "0",
}
STEP_ENV = {**BATCH_ENV, "SLURM_STEP_ID": "0", "SLURM_STEPID": "0", "SLURM_PROCID": "1",
            "SLURMD_NODENAME": "n2", "SLURM_NTASKS": "2", "SLURM_RESTART_COUNT": "3"}


def test_batch_shell_environment() -> None:
    env = SlurmEnv.from_environ(BATCH_ENV)
    assert env.in_job and env.is_batch_shell and not env.in_step
    assert (env.job_id, env.restart_count, env.procid, env.nodename) == ("2", 0, 0, "n1")
    assert env.node_names == ("n1", "n2") and env.partition == "extra" and env.ntasks is None


@pytest.mark.parametrize("step_id", ["-5", "4294967291", "batch"])
def test_26_05_batch_shell_has_a_step_id_that_is_no_srun_step(step_id: str) -> None:
    """26.05 exports SLURM_STEP_ID=-5 (the batch pseudo-step, 0xfffffffb) to the batch script;
    22.05 and 24.11 leave it unset (seen by test_slurm_cluster.py::test_srun_two_tasks_...)."""
    env = SlurmEnv.from_environ({**BATCH_ENV, "SLURM_STEP_ID": step_id, "SLURM_STEPID": step_id})
    assert env.is_batch_shell and not env.in_step


def test_step_environment_and_restart_count() -> None:
    env = SlurmEnv.from_environ(STEP_ENV)
    assert env.in_step and not env.is_batch_shell
    assert (env.step_id, env.procid, env.nodename, env.ntasks, env.restart_count) == ("0", 1, "n2", 2, 3)


def test_outside_slurm_and_odd_values() -> None:
    env = SlurmEnv.from_environ({"HOME": "/root"})
    assert not env.in_job and not env.in_step and env.restart_count == 0 and env.node_names == ()
    odd = SlurmEnv.from_environ({"SLURM_JOBID": "9", "SLURM_RESTART_COUNT": "", "SLURM_STEP_ID": "batch",
                                 "SLURM_ARRAY_JOB_ID": "8", "SLURM_ARRAY_TASK_ID": "1", "SLURM_PROCID": "x"})
    assert odd.job_id == "9" and odd.restart_count == 0 and not odd.in_step and odd.procid is None
    assert (odd.array_job_id, odd.array_task_id) == ("8", "1")


# ---- requeue policy -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("version", "explicit"),
    [((22, 5, 8), True), ((23, 2, 7), True), ((23, 11, 10), True), ((24, 5, 0), False), ((25, 11, 2), False)],
)
def test_exit_during_grace_needs_explicit_requeue_before_24_05(version, explicit) -> None:
    assert needs_explicit_requeue(version, FailureClass.PREEMPTED) is explicit
    assert needs_explicit_requeue(version, "preempted") is explicit


@pytest.mark.parametrize("reason", [FailureClass.TIME_LIMIT, "time_limit", FailureClass.HARDWARE_FAULT, "node_failure"])
@pytest.mark.parametrize("version", [(22, 5, 8), (25, 11, 2)])
def test_slurm_never_requeues_a_time_limit_or_a_chosen_requeue(version, reason) -> None:
    need = requeue_need(version, reason)
    assert need.explicit and need.reason


def test_unknown_version_requeues_explicitly() -> None:
    assert needs_explicit_requeue(None, FailureClass.PREEMPTED)


def test_requeue_check_skips_a_job_already_waiting_to_run_again() -> None:
    assert check_requeue(job("running.txt"), 0).call_requeue
    for name in ("pending.txt", "preempted_pending.txt", "requeued_pending.txt"):
        check = check_requeue(job(name), 0)
        assert not check.call_requeue and check.already_requeued
    completing = job("requeued_completing.txt")  # the old run still completing after a requeue
    assert check_requeue(completing, expected_restarts=0).already_requeued
    assert check_requeue(completing, expected_restarts=None).call_requeue  # ...Slurm then answers:
    assert ALREADY_PENDING_MESSAGE in (DATA / "requeue_completing.stderr").read_text()
    assert ALREADY_PENDING_MESSAGE in (DATA / "requeue_pending.stderr").read_text()
    gone = check_requeue(None, 0)
    assert not gone.call_requeue and not gone.already_requeued
    assert check_requeue(job("completed.txt"), 0).call_requeue  # a finished job can be requeued


# ---- CLI seam: errors, retries, timeouts (stand-in commands) -------------------------------------------
def test_transient_errors_are_those_of_a_busy_or_unreachable_controller() -> None:
    def err(stderr: str) -> SlurmError:
        return slurm_error(["scontrol"], "x", 1, stderr)

    assert is_transient(err("slurm_load_jobs error: Socket timed out on send/recv operation"))
    assert is_transient(err("Unable to contact slurm controller (connect failure)"), idempotent=False)
    assert not is_transient(err("Socket timed out on send/recv operation"), idempotent=False)  # may have been sent
    for name in ("invalid_job.stderr", "not_requeueable.stderr", "requeue_pending.stderr", "exclude_running.stderr"):
        assert not is_transient(err((DATA / name).read_text())), name


def make_command(bin_dir: Path, name: str, body: str) -> Path:
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def test_no_slurm_on_path_is_one_clear_error(tmp_path: Path) -> None:
    cli = SlurmCli(env={"PATH": str(tmp_path)})
    with pytest.raises(SlurmError, match="'scontrol' not found on PATH") as info:
        cli.job_info(1)
    assert info.value.argv[:3] == ["scontrol", "show", "job"]
    with pytest.raises(SlurmError, match="not found on PATH"):
        get_backend("cli", env={"PATH": ""}).version()


def test_hung_command_is_killed_at_its_timeout_and_retried(tmp_path: Path) -> None:
    """A stand-in for a hung controller: an ``scontrol`` that never answers."""
    calls = tmp_path / "calls"
    make_command(tmp_path / "bin", "scontrol", f"echo $$ >> {calls}\nexec {shutil.which('sleep')} 30\n")
    cli = SlurmCli(env={"PATH": str(tmp_path / "bin")}, timeout=0.3, attempts=2, backoff=0.01)
    with pytest.raises(SlurmError, match=r"timed out after 0.3 s \(attempt 2 of 2\)") as info:
        cli.job_info(5)
    assert info.value.returncode is None
    pids = [int(p) for p in calls.read_text().split()]
    assert len(pids) == 2  # tried twice
    for pid in pids:  # and no hung command left behind
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_failed_command_carries_argv_returncode_and_stderr(tmp_path: Path) -> None:
    stderr = (DATA / "not_requeueable.stderr").read_text().strip()
    make_command(tmp_path / "bin", "scontrol", f"echo '{stderr}' >&2\nexit 1\n")
    cli = SlurmCli(env={"PATH": str(tmp_path / "bin")}, attempts=3, backoff=0.01)
    with pytest.raises(SlurmError) as info:
        cli.run(["scontrol", "requeue", "5"])
    err = info.value
    assert err.argv == ["scontrol", "requeue", "5"] and err.returncode == 1
    assert "presently disabled" in err.stderr and "presently disabled" in str(err)


def test_invalid_job_id_is_none_not_an_error(tmp_path: Path) -> None:
    stderr = (DATA / "invalid_job.stderr").read_text().strip()
    make_command(tmp_path / "bin", "scontrol", f"echo '{stderr}' >&2\nexit 1\n")
    make_command(tmp_path / "bin", "squeue", f"echo '{stderr}' >&2\nexit 1\n")
    cli = SlurmCli(env={"PATH": str(tmp_path / "bin")})
    assert cli.job_info(999999) is None and cli.queue_state(999999) is None


def test_submit_of_a_missing_script_says_so(tmp_path: Path) -> None:
    with pytest.raises(SlurmError, match="does not exist"):
        SlurmCli(env={"PATH": ""}).submit(tmp_path / "nope.sh")


# ---- backend choice ------------------------------------------------------------------------------------
class _StandInRPCError(Exception):
    def __init__(self, msg: str) -> None:
        super().__init__(msg)
        self.msg, self.errno = msg, 2017


def stand_in_pyslurm(jobs: dict[int, dict]) -> types.ModuleType:
    """A stand-in for pyslurm: the real one cannot be built against this host's Slurm 22.05."""
    module = types.ModuleType("pyslurm")
    module.__version__ = "25.11.0"  # pyslurm's own release, not the controller's Slurm
    module.RPCError = _StandInRPCError
    module.slurm_api_version = lambda: (25, 11, 1)  # the headers it was built against
    module.config = lambda: types.SimpleNamespace(get=lambda: {"version": "25.11.2"})  # the controller
    requeued: list[int] = []

    class Job:
        def __init__(self, job_id: int) -> None:
            self.id = job_id

        @staticmethod
        def load(job_id: int):
            if job_id not in jobs:
                raise _StandInRPCError("Invalid job id specified")
            return types.SimpleNamespace(id=job_id, **jobs[job_id])

        def requeue(self) -> None:
            requeued.append(self.id)
            jobs[self.id].update(state="PENDING", requeue_count=jobs[self.id]["requeue_count"] + 1)

    module.Job = Job
    module.JobSubmitDescription = lambda **kw: kw
    module.requeued = requeued
    return module


def test_auto_uses_the_cli_here_and_pyslurm_is_refused_with_the_reason() -> None:
    assert isinstance(get_backend(), SlurmCli)  # pyslurm does not import against 22.05 here
    with pytest.raises(SlurmError, match="pyslurm is not importable"):
        get_backend("pyslurm")
    with pytest.raises(SlurmError, match="unknown Slurm backend"):
        get_backend("rest")


def test_auto_prefers_pyslurm_when_it_imports() -> None:
    module = stand_in_pyslurm({})
    chosen = get_backend(importer=lambda name: module)
    assert isinstance(chosen, PyslurmBackend) and "matches the controller (25.11.2)" in chosen.choice.reason
    assert isinstance(get_backend("cli", importer=lambda name: module), SlurmCli)
    module.config = lambda: types.SimpleNamespace(get=lambda: {"version": "26.05.1"})  # another release
    chosen = get_backend(importer=lambda name: module)
    assert isinstance(chosen, SlurmCli) and "built for Slurm 25.11" in chosen.choice.reason
    assert isinstance(get_backend("pyslurm", importer=lambda name: module), PyslurmBackend)  # forced

    def broken(name: str):
        raise OSError("libslurm.so.38: cannot open shared object file")

    assert isinstance(get_backend(importer=broken), SlurmCli)
    old_api = types.ModuleType("pyslurm")  # a pre-22.5.2 pyslurm without the Job class
    assert isinstance(get_backend(importer=lambda name: old_api), SlurmCli)


def test_pyslurm_backend_maps_jobs_and_requeues_idempotently() -> None:
    running = dict(state="RUNNING", state_reason="None", name="train", partition="extra", requeue_count=0,
                   is_requeueable=True, is_batch_job=True, exit_code=0, exit_code_signal=0, submit_time=100,
                   start_time=110, end_time=170, preempt_time=150, time_limit=60, run_time=40,
                   allocated_nodes="n[1-2]", excluded_nodes=None, standard_output="/x/out")
    module = stand_in_pyslurm({7: running})
    backend = get_backend(importer=lambda name: module)
    assert backend.version() == (25, 11, 2)
    info = backend.job_info(7)
    assert info.in_grace and info.grace_deadline == 170.0 and info.node_names == ("n1", "n2")
    assert info.time_limit == 3600 and info.reason is None
    assert backend.job_info(8) is None
    first, second = backend.requeue(7, expected_restarts=0), backend.requeue(7, expected_restarts=0)
    assert first.requeued and second.already and module.requeued == [7]


# ---- versions, stop causes, holds (issue #15): outputs captured on 22.05.8, 24.11.5 and 26.05.5 ------
# tests/data/slurm/<release>/ was written by `capture.py --stops --slurm <release>` on the real
# throwaway clusters (the host's 22.05, and the trixie/sid roots of tests/slurm_roots/).
RELEASES = ("22.05", "24.11", "26.05")
STOP_OUTPUTS = sorted(p for r in RELEASES for p in (DATA / r).glob("*.txt") if p.name != "version.txt")


def captured(release: str, name: str, with_flags: bool = True):
    """A captured job, with the full state from the --json capture beside it (what the CLI backend
    adds for a COMPLETING job on 23.02+)."""
    info = parse_scontrol_job((DATA / release / f"{name}.txt").read_text())
    flags_file = DATA / release / f"{name}.json"
    if with_flags and flags_file.exists():
        info = dataclasses.replace(info, state_flags=parse_json_state(flags_file.read_text(), info.job_id))
    return info


def release_version(release: str) -> SlurmVersion:
    return SlurmVersion.parse((DATA / release / "version.txt").read_text())


def at_end(info, plus: float = 0.5) -> float:
    """A moment just after the record's EndTime (the kill window), or now when it has none."""
    return (info.end_time + plus) if info.end_time is not None else time.time()


def test_versions_parse_compare_like_tuples_and_name_their_capabilities() -> None:
    v22, v24, v26 = (release_version(r) for r in RELEASES)
    assert (v22, v24, v26) == ((22, 5, 8), (24, 11, 5), (26, 5, 5))
    assert str(v24) == "24.11.5" and v24.release == "24.11" and v22[:2] == (22, 5)
    assert parse_version("slurm 24.05.0-0rc1") == SlurmVersion(24, 5, 0) and v22 >= (22, 5) and v24 > (24, 5)
    assert SlurmVersion.of([23, 11]) == (23, 11, 0) and SlurmVersion.of("slurm-wlm 26.05.5") == v26
    assert [v.requeues_on_exit_during_grace for v in (v22, v24, v26)] == [False, True, True]
    assert [v.holds_after_max_batch_requeue for v in (v22, v24, v26)] == [False, True, True]
    assert [v.may_requeue_again_after_grace_expiry for v in (v22, v24, v26)] == [False, True, False]
    assert [v.scontrol_json for v in (v22, v24, v26)] == [False, True, True]
    assert [v.requeue_delay_setting for v in (v22, v24, v26)] == [False, False, True]
    assert not v26.restart_count_always_set and SlurmVersion(26, 11).restart_count_always_set
    with pytest.raises(SlurmVersionError):
        SlurmVersion.parse("no version here")
    # the requeue policy asks the capability, whatever form the version comes in
    assert needs_explicit_requeue(v22, "preempted") and not needs_explicit_requeue(v24, "preempted")
    assert not needs_explicit_requeue([26, 5, 5], "preempted")


@pytest.mark.parametrize("path", STOP_OUTPUTS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_captured_stop_output_parses(path: Path) -> None:
    jobs = parse_scontrol_jobs(path.read_text())
    assert jobs and all(j.job_id > 0 and j.state.isupper() for j in jobs)


@pytest.mark.parametrize("release", RELEASES)
def test_a_cancel_in_its_kill_window_is_a_persons_final_stop_on_every_version(release: str) -> None:
    """During the kill window the text says COMPLETING on every version; 24.11/26.05 --json says
    CANCELLED+COMPLETING; 22.05 has no --json, and its COMPLETING record ended long before its time
    limit with no PreemptTime. Afterwards every version says CANCELLED."""
    window = captured(release, "cancel_kill_window")
    assert window.state == "COMPLETING" and window.preempt_time is None
    assert window.is_cancelled is (release != "22.05")  # seen in the full state where there is one
    if release != "22.05":
        assert window.state_flags == ("CANCELLED", "COMPLETING")
    for info in (window, captured(release, "cancel_done")):
        verdict = stop_cause(info, at_end(info), "TERM", version=release_version(release), expected_restarts=0)
        assert verdict.cause is StopCause.CANCELLED_BY_PERSON and verdict.final, verdict
        assert verdict.slurm_requeues is False and not verdict.may_requeue
    assert captured(release, "cancel_done").is_cancelled


@pytest.mark.parametrize("release", RELEASES)
def test_scancel_signal_term_leaves_the_job_running_so_the_signal_is_a_persons(release: str) -> None:
    info = captured(release, "signal_term_running")
    assert info.state == "RUNNING" and info.preempt_time is None and not info.is_cancelled
    verdict = stop_cause(info, info.start_time + 2, "SIGTERM", version=release_version(release), expected_restarts=0)
    assert verdict.cause is StopCause.CANCELLED_BY_PERSON and verdict.final
    assert verdict.recheck_after  # the record could lag a preemption: read it once more first
    quiet = stop_cause(info, info.start_time + 2, None, version=release_version(release), expected_restarts=0)
    assert quiet.cause is StopCause.UNKNOWN and not quiet.final  # no signal: the child's own exit decides


@pytest.mark.parametrize("release", RELEASES)
def test_a_preempted_job_in_grace_and_what_slurm_does_when_it_exits_now(release: str) -> None:
    info = captured(release, "grace")
    assert info.state == "RUNNING" and info.preempt_time is not None and info.in_grace
    # 22.05 pulls EndTime in to PreemptTime + GraceTime at once; 24.11/26.05 show EndTime=Unknown
    # for a job without a time limit at that moment (it is filled in a little later).
    assert (info.end_time == info.preempt_time + 5) if release == "22.05" else info.end_time is None
    verdict = stop_cause(info, info.preempt_time + 1, "TERM", version=release_version(release), expected_restarts=0)
    assert verdict.cause is StopCause.PREEMPTED and not verdict.final
    assert verdict.slurm_requeues is (release != "22.05")
    assert verdict.may_requeue is (release == "22.05")
    unknown = stop_cause(info, info.preempt_time + 1, "TERM", expected_restarts=0)
    assert unknown.cause is StopCause.PREEMPTED and unknown.slurm_requeues is None


@pytest.mark.parametrize("release", RELEASES)
def test_exit_during_grace_ends_the_job_on_22_05_and_requeues_it_from_24_05(release: str) -> None:
    after = captured(release, "grace_after")
    if release == "22.05":
        assert (after.state, after.restarts) == ("COMPLETED", 0) and after.preempt_time is not None
    else:  # requeued through the batch-requeue path: BatchFlag counts it (toward MaxBatchRequeue)
        assert (after.state, after.restarts, after.batch_flag) == ("PENDING", 1, 2)
        verdict = stop_cause(after, time.time(), "TERM", version=release_version(release), expected_restarts=0)
        assert verdict.cause is StopCause.REQUEUED and not verdict.may_requeue


@pytest.mark.parametrize("release", RELEASES)
def test_the_time_limit_in_its_kill_window(release: str) -> None:
    info = captured(release, "timeout_kill_window")
    assert info.state == "COMPLETING" and info.reason == "TimeLimit"
    assert ("TIMEOUT" in info.state_flags) is (release != "22.05")
    verdict = stop_cause(info, at_end(info), "TERM", version=release_version(release), expected_restarts=0)
    assert verdict.cause is StopCause.TIME_LIMIT and verdict.slurm_requeues is False and not verdict.final
    done = captured(release, "timeout")
    assert stop_cause(done, at_end(done), "TERM", expected_restarts=0).cause is StopCause.TIME_LIMIT


@pytest.mark.parametrize("release", RELEASES)
def test_a_node_set_down_under_the_job_is_requeued_by_slurm_at_once(release: str) -> None:
    info = captured(release, "node_down")
    assert info.state == "PENDING" and info.restarts == 1 and info.nodes is None
    requeued = stop_cause(info, time.time(), "TERM", version=release_version(release), expected_restarts=0)
    assert requeued.cause is StopCause.REQUEUED and not requeued.may_requeue
    node = stop_cause(info, time.time(), "TERM", version=release_version(release), expected_restarts=0,
                      node_states={"n2": "DOWN+NOT_RESPONDING", "n1": "IDLE"})
    assert node.cause is StopCause.NODE_FAILURE and node.slurm_requeues is True and not node.may_requeue
    assert "n2" in node.reason


@pytest.mark.parametrize("release", ["24.11", "26.05"])
def test_the_hold_after_max_batch_requeue_and_its_release(release: str) -> None:
    held = captured(release, "held_max_requeue")
    assert held.state == "REQUEUE_HOLD" and held.priority == 0
    assert held.reason == "launch_failure_limit_exceeded_requeued_held"
    assert held.is_held and held.held_for_max_requeue and held.is_pending
    verdict = stop_cause(held, time.time(), "TERM", version=release_version(release), expected_restarts=4)
    assert verdict.cause is StopCause.REQUEUED and "HELD" in verdict.reason and verdict.fields["held"]
    released = captured(release, "released")
    assert not released.is_held and not released.held_for_max_requeue and released.priority == 1


def test_the_time_limit_warning_signal_and_an_ended_limit_without_a_record_state() -> None:
    info = job("running.txt")
    warning = stop_cause(info, info.start_time + 5, "USR1", expected_restarts=0)
    assert warning.cause is StopCause.TIME_LIMIT and not warning.final and warning.slurm_requeues is False
    limit = dataclasses.replace(info, end_time=info.start_time + 60, time_limit=60)
    assert stop_cause(limit, info.start_time + 61, "TERM", expected_restarts=0).cause is StopCause.TIME_LIMIT
    assert stop_cause(None, 0.0, "TERM").cause is StopCause.UNKNOWN
    assert stop_cause(info, info.start_time + 5, "TERM", time_limit_signal=None).final  # TERM, RUNNING: a person


def test_a_running_job_requeued_by_scontrol_is_already_requeued_not_cancelled() -> None:
    info = job("requeued_completing.txt")  # 22.05: COMPLETING, Restarts=1, EndTime cleared
    for expected in (0, None):
        verdict = stop_cause(info, time.time(), "TERM", expected_restarts=expected)
        assert verdict.cause is StopCause.REQUEUED and not verdict.final and not verdict.may_requeue
    assert stop_cause(job("preempted_pending.txt"), time.time(), "TERM").cause is StopCause.REQUEUED


def test_stop_verdict_event_fields() -> None:
    verdict = stop_cause(captured("24.11", "cancel_kill_window"), time.time(), "TERM", version="24.11")
    event = verdict.to_event()
    assert event["cause"] == "cancelled_by_person" and event["final"] is True and event["job_state"] == "COMPLETING"


def test_json_state_forms() -> None:
    assert parse_json_state('{"jobs": [{"job_id": 3, "job_state": ["CANCELLED", "COMPLETING"]}]}', 3) == (
        "CANCELLED", "COMPLETING")
    assert parse_json_state('{"jobs": [{"job_id": 3, "job_state": "CANCELLED+COMPLETING"}]}') == (
        "CANCELLED", "COMPLETING")
    assert parse_json_state('{"jobs": []}', 3) == ()
    with pytest.raises(SlurmParseError):
        parse_json_state("scontrol: error")


def fake_scontrol(bin_dir: Path, release: str, name: str, calls: Path) -> None:
    """An scontrol that answers like the captured one: --version, show job -o, show job --json."""
    text = DATA / release / f"{name}.txt"
    flags = DATA / release / f"{name}.json"
    cat = shutil.which("cat")
    make_command(bin_dir, "scontrol", f"""echo "$@" >> {calls}
case "$*" in
  --version) {cat} {DATA / release / 'version.txt'} ;;
  *--json*) {cat} {flags} ;;
  "show job -o"*) {cat} {text} ;;
  release*) exit 0 ;;
  *) echo "unexpected: $*" >&2; exit 1 ;;
esac
""")


@pytest.mark.parametrize("release", RELEASES)
def test_cli_backend_reads_the_full_state_of_a_completing_job_where_slurm_has_json(tmp_path: Path,
                                                                                  release: str) -> None:
    calls = tmp_path / "calls"
    fake_scontrol(tmp_path / "bin", release, "cancel_kill_window", calls)
    cli = SlurmCli(env={"PATH": str(tmp_path / "bin")})
    info = cli.job_info(2)
    assert info.state == "COMPLETING" and info.is_cancelled is (release != "22.05")
    assert cli.version() == release_version(release)
    assert ("--json" in calls.read_text()) is (release != "22.05")  # 22.05 has none: never asked


def test_cli_backend_releases_only_a_held_job(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    fake_scontrol(tmp_path / "bin", "24.11", "held_max_requeue", calls)
    assert SlurmCli(env={"PATH": str(tmp_path / "bin")}).release(7) is True
    assert "release 7" in calls.read_text()
    calls2 = tmp_path / "calls2"
    fake_scontrol(tmp_path / "bin2", "24.11", "released", calls2)
    assert SlurmCli(env={"PATH": str(tmp_path / "bin2")}).release(7) is False
    assert "release" not in calls2.read_text().replace("show job", "")


def test_cli_backend_node_state(tmp_path: Path) -> None:
    make_command(tmp_path / "bin", "scontrol",
                 'echo "NodeName=n2 Arch=x86_64 CoresPerSocket=1 State=DOWN+NOT_RESPONDING ThreadsPerCore=1 Reason=test"\n')
    assert SlurmCli(env={"PATH": str(tmp_path / "bin")}).node_state("n2") == "DOWN+NOT_RESPONDING"
    with pytest.raises(SlurmError, match="not a node name"):
        SlurmCli(env={"PATH": str(tmp_path / "bin")}).node_state("n2; rm -rf /")


# ---- the grace a preemption would give, read from the configuration (slurm/grace.py) -------------------
def test_which_configured_grace_applies_follows_the_preempt_plugin() -> None:
    from supervisor.slurm.grace import ClusterGrace, grace_from

    assert grace_from("preempt/partition_prio", "extra", "4", "normal", None) == \
        ClusterGrace(4.0, "partition extra GraceTime")
    assert grace_from("preempt/qos", "extra", "4", "scavenger", "00:02:00") == \
        ClusterGrace(120.0, "QOS scavenger GraceTime")
    assert grace_from("preempt/qos", "extra", "4", "scavenger", "1-00:00:00").seconds == 86400.0
    assert grace_from("preempt/none", "extra", "4", None, None) is None  # nothing preempts: nothing to learn
    assert grace_from("preempt/qos", "extra", "4", "scavenger", None) is None  # no accounting answer
    assert grace_from("preempt/partition_prio", "extra", "soon", None, None) is None
    assert grace_from(None, None, None, None, None) is None
    # No grace period to plan with: Slurm's default GraceTime=0 (the kill comes after KillWait and
    # the record shows it at once), or a partition/QOS that is never preempted or only suspended.
    assert grace_from("preempt/partition_prio", "extra", "0", None, None) is None
    assert grace_from("preempt/qos", "extra", None, "normal", "00:00:00") is None
    assert grace_from("preempt/partition_prio", "own", "60", None, None, preempt_mode="REQUEUE",
                      partition_mode="OFF") is None
    assert grace_from("preempt/partition_prio", "extra", "60", None, None, preempt_mode="SUSPEND,GANG") is None
    assert grace_from("preempt/qos", "extra", None, "scavenger", "120", preempt_mode="REQUEUE",
                      qos_mode="requeue").seconds == 120.0
    # sacctmgr prints PreemptMode "cluster" for a QOS without its own (as QOS normal shows on the
    # accounting test cluster): the cluster's PreemptMode decides then.
    assert grace_from("preempt/qos", "extra", None, "scavenger", "00:00:05", preempt_mode="SUSPEND,GANG",
                      qos_mode="cluster") is None
    assert grace_from("preempt/qos", "extra", None, "scavenger", "00:00:05", preempt_mode="REQUEUE",
                      qos_mode="cluster") == ClusterGrace(5.0, "QOS scavenger GraceTime")


def test_cli_backend_reads_the_grace_of_the_jobs_partition_or_qos(tmp_path: Path) -> None:
    from supervisor.slurm.grace import ClusterGrace

    info = parse_scontrol_job("JobId=7 JobName=t JobState=RUNNING Partition=extra QOS=scavenger")
    assert info.qos == "scavenger"
    for plugin, expected in (("preempt/partition_prio", ClusterGrace(4.0, "partition extra GraceTime")),
                             ("preempt/qos", ClusterGrace(90.0, "QOS scavenger GraceTime")),
                             ("preempt/none", None)):
        bin_dir = tmp_path / plugin.replace("/", "_")
        make_command(bin_dir, "scontrol", f"""case "$*" in
  "show config") printf 'Configuration data as of 2026-12-01T10:00:00\\nPreemptMode             = REQUEUE\\nPreemptType             = {plugin}\\n' ;;
  "show partition -o extra") echo "PartitionName=extra AllowGroups=ALL Default=YES GraceTime=4 Hidden=NO PreemptMode=REQUEUE" ;;
  "show partition -o own") echo "PartitionName=own AllowGroups=ALL Default=NO GraceTime=4 Hidden=NO PreemptMode=OFF" ;;
  *) echo "unexpected: $*" >&2; exit 1 ;;
esac
""")
        make_command(bin_dir, "sacctmgr", 'echo "00:01:30|requeue"\n')
        assert SlurmCli(env={"PATH": str(bin_dir)}).preemption_grace(info) == expected, plugin
    own = parse_scontrol_job("JobId=8 JobName=t JobState=RUNNING Partition=own QOS=normal")
    assert SlurmCli(env={"PATH": str(tmp_path / "preempt_partition_prio")}).preemption_grace(own) is None
