"""The pyslurm backend against a real controller, answer for answer against the CLI backend (issue 22).

pyslurm is built from the vendored sources (tests/vendor/pyslurm/) for the cluster's release and
runs where its libslurm is (tests/pyslurm_cluster.py): 22.05 on the host, 24.11 inside its root.
Every question is asked of both backends on the same job in one probe process, and every field both
report must be equal. 26.05 has no pyslurm upstream: .ci/run does not run this file there.
"""

from __future__ import annotations

import os
import sys
import time

import pytest
from helpers import REPO, events_named
from pyslurm_cluster import PYSLURM_RELEASES, build_pyslurm, ok, probe
from slurm_cluster import ClusterError

pytestmark = pytest.mark.slurm

# JobInfo fields each backend may leave unset where the other has a value (compared when both have
# one): pyslurm has no COMPLETING sub-state to add (state_flags come from the CLI's --json read),
# and it reports no QOS without accounting.
ONE_SIDED = {"state_flags", "qos"}
# Read a moment apart (the CLI first, then pyslurm): equal within the seconds between the two reads.
MOVING = {"run_time": 5}
# What both backends must report on a running job, so that a comparison of nothing cannot pass.
MUST_COMPARE_RUNNING = {"job_id", "state", "name", "partition", "restarts", "requeue", "batch_flag", "submit_time",
                        "start_time", "nodes", "num_nodes", "batch_host", "std_out", "work_dir", "node_names",
                        "is_running", "in_grace", "is_held"}


@pytest.fixture(scope="module")
def site(slurm_cluster) -> str:
    if slurm_cluster.label not in PYSLURM_RELEASES:
        pytest.skip(f"no pyslurm exists for Slurm {slurm_cluster.label} (only {', '.join(PYSLURM_RELEASES)})")
    try:
        return build_pyslurm(slurm_cluster.label)
    except ClusterError as exc:
        if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
            raise  # CI must build it (.ci/run's pyslurm stage): never a silent skip there
        pytest.skip(f"pyslurm could not be built here: {str(exc)[-300:]}")


def compare(answer: dict) -> set[str]:
    """Assert every field both backends report is equal; return the names compared."""
    cli, py = answer["cli"], answer["pyslurm"]
    assert (cli is None) == (py is None), answer
    if cli is None:
        return set()
    compared = set()
    for name in sorted(set(cli) | set(py)):
        if cli.get(name) is None or py.get(name) is None:
            assert name in ONE_SIDED or cli.get(name) == py.get(name), \
                f"{name}: cli {cli.get(name)!r}, pyslurm {py.get(name)!r}"
            continue
        if name in ONE_SIDED and (cli[name] in ((), []) or py[name] in ((), [])):
            continue
        if name in MOVING:
            assert abs(cli[name] - py[name]) <= MOVING[name], f"{name}: cli {cli[name]!r}, pyslurm {py[name]!r}"
        else:
            assert cli[name] == py[name], f"{name}: cli {cli[name]!r}, pyslurm {py[name]!r}"
        compared.add(name)
    return compared


def test_job_record_grace_stop_cause_and_version_agree_with_the_cli(slurm_cluster, slurm_job_dir, site):
    out = f"{slurm_job_dir}/victim-%j.out"
    # A preemptible job that fills a node and rides out its grace (the TERM is ignored).
    job = slurm_cluster.sbatch("trap '' TERM\nsleep 120 & wait; sleep 120\n", "-p", "extra", "--exclusive",
                               "--requeue", "-J", "victim", "-t", "30", "-o", out)
    running = slurm_cluster.wait_state(job, "RUNNING", timeout=30)
    record, grace, version, choice, unknown = probe(
        slurm_cluster, site, ["info", job], ["grace", job], ["version"], ["choice"], ["info", 999999])
    assert MUST_COMPARE_RUNNING <= compare(ok(record))
    assert ok(record)["pyslurm"]["time_limit"] == 30 * 60 and ok(record)["pyslurm"]["state"] == "RUNNING"
    assert ok(unknown) == {"cli": None, "pyslurm": None}
    assert ok(grace)["cli"] == ok(grace)["pyslurm"] == {"seconds": float(slurm_cluster.grace_time),
                                                      "source": "partition extra GraceTime"}
    # version(): the controller's Slurm, not pyslurm's own package version (22.5.3 on 22.05.8).
    assert ok(version)["cli"] == ok(version)["pyslurm"] == list(slurm_cluster.version)
    assert ok(choice)["name"] == "pyslurm" and slurm_cluster.label in ok(choice)["reason"]

    slurm_cluster.preempt(running.node_names[0], seconds=1)
    slurm_cluster.wait_state(job, "RUNNING", timeout=30)  # still running, now in its grace
    deadline = time.monotonic() + 20
    while slurm_cluster.job(job).preempt_time is None and time.monotonic() < deadline:
        time.sleep(0.2)
    in_grace, cause = probe(slurm_cluster, site, ["info", job], ["stop_cause", job, "TERM"])
    compared = compare(ok(in_grace))
    assert {"preempt_time", "end_time", "grace_deadline", "in_grace"} <= compared
    assert ok(in_grace)["pyslurm"]["in_grace"] is True
    assert ok(cause)["cli"]["cause"] == ok(cause)["pyslurm"]["cause"] == "PREEMPTED"
    slurm_cluster.command(["scancel", str(job)])
    slurm_cluster.wait_finished(job)

    done = slurm_cluster.run_job("echo fine\n", "-o", f"{slurm_job_dir}/ok-%j.out")
    failed = slurm_cluster.run_job("exit 3\n", "-o", f"{slurm_job_dir}/bad-%j.out")
    cancelled_info, ok_info, bad_info = probe(
        slurm_cluster, site, ["info", job], ["info", done.job_id], ["info", failed.job_id])
    for answer in (cancelled_info, ok_info, bad_info):
        assert {"state", "exit_code", "end_time", "is_finished"} <= compare(ok(answer))
    assert (ok(bad_info)["pyslurm"]["state"], ok(bad_info)["pyslurm"]["exit_code"]) == ("FAILED", 3)
    assert ok(cancelled_info)["pyslurm"]["is_cancelled"] is True


def test_submit_requeue_exclude_release_and_cancel_through_pyslurm(slurm_cluster, slurm_job_dir, site):
    script = slurm_job_dir / "job.sh"
    script.write_text("#!/bin/bash\nsleep 60\n")
    out = f"{slurm_job_dir}/job-%j.out"
    [submitted] = probe(slurm_cluster, site, ["submit", "pyslurm", str(script), ["--requeue", "-o", out]])
    job = ok(submitted)
    node = slurm_cluster.wait_state(job, "RUNNING", timeout=30).node_names[0]
    first, second = probe(slurm_cluster, site, ["requeue", "pyslurm", job, 0, [node]],
                          ["requeue", "pyslurm", job, None, []])
    assert ok(first)["requeued"] and ok(first)["excluded"] == [node] and ok(first)["exclude_error"] is None
    assert ok(second)["already"] and not ok(second)["requeued"]
    # Compared once it has settled (pending until its BeginTime): not while its old run is completing.
    slurm_cluster.wait_state(job, "PENDING", timeout=30)
    after, more = probe(slurm_cluster, site, ["info", job], ["update_exclude", "pyslurm", job, ["n1", "n2"]])
    assert {"restarts", "exc_nodes", "exc_node_names", "state"} <= compare(ok(after))
    assert ok(after)["pyslurm"]["restarts"] == 1 and ok(after)["pyslurm"]["exc_node_names"] == [node]
    assert ok(more) == list(dict.fromkeys([node, "n1", "n2"]))
    assert set(slurm_cluster.job(job).exc_node_names) == {"n1", "n2"}
    [cancelled] = probe(slurm_cluster, site, ["cancel", "pyslurm", job])
    ok(cancelled)
    assert slurm_cluster.wait_finished(job).state == "CANCELLED"

    held = slurm_cluster.sbatch(script, "--hold", "-o", out)
    fixed = slurm_cluster.sbatch(script, "--no-requeue", "-o", out)
    slurm_cluster.wait_state(fixed, "RUNNING", timeout=30)
    held_info, released, again, refused, gone = probe(
        slurm_cluster, site, ["info", held], ["release", "pyslurm", held], ["release", "pyslurm", held],
        ["requeue", "pyslurm", fixed, None, []], ["requeue", "pyslurm", 999999, None, []])
    assert {"is_held", "priority", "reason", "state"} <= compare(ok(held_info))
    assert ok(held_info)["pyslurm"]["is_held"] is True
    assert ok(released) is True and ok(again) is False
    assert "not requeueable" in refused["error"] and "--requeue" in refused["error"]
    assert not ok(gone)["requeued"] and "no longer known" in ok(gone)["reason"]
    slurm_cluster.cancel_all()


def test_auto_picks_the_cli_where_pyslurm_does_not_match_the_controller(slurm_cluster, site, tmp_path):
    """A pyslurm that imports but was built for another release (a stand-in module that says so)
    is not used: the CLI is, with the reason. The real mismatch (this 22.05 build beside a 24.11
    controller) cannot even import inside the 24.11 root: libslurm.so.38 is not there."""
    fake = tmp_path / "fake" / "pyslurm"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "__version__ = '21.8.0'\nclass Job: pass\nclass JobSubmitDescription: pass\nclass RPCError(Exception): pass\n"
        f"def slurm_api_version(): return (21, 8, 8)\nclass config:\n"
        f"    def get(self): return {{'version': '{slurm_cluster.version}'}}\n")
    [choice] = probe(slurm_cluster, os.pathsep.join([str(tmp_path / "fake"), site]), ["choice"])
    assert ok(choice)["name"] == "cli"
    assert "built for Slurm 21.08" in ok(choice)["reason"] and str(slurm_cluster.version) in ok(choice)["reason"]


def test_run_start_says_which_backend_auto_picked_inside_a_job(slurm_cluster, slurm_job_dir, site):
    """A supervisor in a Slurm job picks pyslurm where the matching build is on its path and the CLI
    where it is not, and its run_start says which and why."""
    runs = {name: slurm_job_dir / f"run-{name}" for name in ("pyslurm", "cli")}
    paths = {"pyslurm": os.pathsep.join([str(REPO), site]), "cli": str(REPO)}
    lines = ["#!/bin/bash"]
    for name, run_dir in runs.items():
        lines.append(f"PYTHONPATH={paths[name]} {sys.executable} -m supervisor run --run-dir {run_dir} -- "
                     f"{sys.executable} -c \"print('step 1')\"")
    result = slurm_cluster.run_job("\n".join(lines) + "\n", "-o", f"{slurm_job_dir}/pick-%j.out", timeout=120)
    assert result.info.state == "COMPLETED", result.output
    picked = {name: events_named(run_dir, "run_start")[0] for name, run_dir in runs.items()}
    assert picked["pyslurm"]["slurm_backend"] == "pyslurm"
    assert f"built for Slurm {slurm_cluster.label} matches the controller" in picked["pyslurm"]["slurm_backend_reason"]
    assert picked["cli"]["slurm_backend"] == "cli"
    assert "No module named 'pyslurm'" in picked["cli"]["slurm_backend_reason"]
