"""The node health ledger: concurrent writers never tear or lose a line, the file stays bounded,
and the queries name suspects and exclusions with their evidence, reasons and expiry; ``supervise
nodes`` shows them. The writers are real processes; the cluster test writes from both nodes of
the throwaway Slurm cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from supervisor.config import NodesConfig, load_config
from supervisor.errors import ConfigError
from supervisor.addons.nodes import (
    NodeEventKind,
    NodeLedger,
    current_exclusions,
    exclusions,
    node_ledger_path,
    parse_record,
    record_cleared,
    record_failure,
    record_gpu_check,
    record_loss_anomaly,
    record_slow_node,
    suspects,
)

REPO = Path(__file__).resolve().parent.parent
DAY = 86400.0
POLICY = NodesConfig(window=7 * DAY, suspect_after=2, exclude_after=2, exclude_for=DAY)

WRITER = textwrap.dedent("""
    import sys, time
    from supervisor.addons.nodes import NodeLedger, record_failure
    path, name, count, max_bytes, start = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    while time.time() < start:
        time.sleep(0.001)
    ledger = NodeLedger(path, max_bytes)
    for i in range(count):
        # details of varying length, so that a torn or interleaved write would show
        ok = ledger.append(record_failure(name, "hardware_fault", ts=time.time(), job_id=str(i),
                                          evidence=name * (1 + i % 40)))
        assert ok
""")


def _writers(tmp_path: Path, path: Path, count: int, max_bytes: int, names: tuple[str, ...] = ("wa", "wb")) -> None:
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.time() + 1.0
    procs = [subprocess.Popen([sys.executable, str(script), str(path), name, str(count), str(max_bytes), str(start)],
                              env=env) for name in names]
    assert [p.wait(120) for p in procs] == [0] * len(names)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_two_processes_appending_at_once_leave_every_record_whole_and_once(tmp_path: Path) -> None:
    path = tmp_path / "nodes.jsonl"
    _writers(tmp_path, path, 400, max_bytes=64 * 1024 * 1024)
    lines = _lines(path)
    records = [parse_record(line) for line in lines]
    assert None not in records, "a line was torn or two writes interleaved"
    for name in ("wa", "wb"):
        mine = sorted(int(r.job_id) for r in records if r and r.node == name and r.job_id is not None)
        assert mine == list(range(400)), f"{name}: records lost or duplicated"
        assert all(r.detail == name * (1 + int(r.job_id) % 40) for r in records if r and r.node == name)


def test_the_ledger_is_rotated_and_stays_bounded_under_concurrent_writers(tmp_path: Path) -> None:
    path = tmp_path / "nodes.jsonl"
    max_bytes = 65536
    _writers(tmp_path, path, 1500, max_bytes=max_bytes)
    rotated = path.with_name(path.name + ".1")
    assert rotated.exists(), "the ledger was never rotated"
    assert path.stat().st_size <= max_bytes and rotated.stat().st_size <= max_bytes
    read = NodeLedger(path, max_bytes).read()
    assert read.bad_lines == 0
    kept = {name: sorted(int(r.job_id) for r in read.records if r.node == name and r.job_id is not None)
            for name in ("wa", "wb")}
    # Rotation drops the oldest records only: what is kept of each writer is the end of its
    # sequence, with nothing missing in between (a writer that finished early may be gone entirely).
    for name, ids in kept.items():
        assert ids == list(range(ids[0], 1500)) if ids else True, f"{name}: a record was lost mid-sequence"
    assert any(ids and ids[-1] == 1499 for ids in kept.values())
    assert sum(map(len, kept.values())) > 100


def test_a_torn_or_foreign_line_is_skipped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "nodes.jsonl"
    ledger = NodeLedger(path)
    assert ledger.append(record_failure("n1", "node_failure", ts=1000.0))
    with open(path, "a") as fh:
        fh.write('{"ts": 1001, "node": "n2", "kind": "failure", "lab\n')  # a writer killed mid-line
        fh.write('{"ts": "yesterday", "node": "n3", "kind": "failure"}\n')
        fh.write("not json at all\n")
    assert ledger.append(record_failure("n4", "hardware_fault", ts=1002.0))
    read = ledger.read()
    assert [r.node for r in read.records] == ["n1", "n4"] and read.bad_lines == 3


def test_a_background_append_lands_without_the_caller_waiting_for_the_lock(tmp_path: Path) -> None:
    from filelock import FileLock

    path = tmp_path / "nodes.jsonl"
    ledger = NodeLedger(path)
    with FileLock(str(ledger.lock_path)):  # another writer holds the lock
        started = time.monotonic()
        thread = ledger.append_in_background(record_slow_node("n2", "1.6 x slower", ts=NOW))
        assert time.monotonic() - started < 1.0 and thread.is_alive()
    thread.join(15)
    assert [r.node for r in ledger.read().records] == ["n2"]


def test_the_exclusions_at_a_requeue_are_read_within_a_bound(tmp_path: Path) -> None:
    ledger = NodeLedger(tmp_path / "nodes.jsonl")
    now = time.time()
    for ts in (now - 100, now - 50):
        ledger.append(record_failure("n7", "hardware_fault", ts=ts))
    found, problem = current_exclusions(ledger, now, POLICY)
    assert problem is None and [x.node for x in found] == ["n7"]
    (tmp_path / "nodes.jsonl").unlink()  # unreadable: a directory in its place (root reads any file)
    (tmp_path / "nodes.jsonl").mkdir()
    found, problem = current_exclusions(ledger, now, POLICY)
    assert found == [] and problem is not None and "cannot read the node ledger" in problem


def test_a_ledger_that_cannot_be_written_does_not_raise(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert NodeLedger(blocked / "sub" / "nodes.jsonl").append(record_failure("n1", "hang", ts=1.0)) is False


def test_the_ledger_path_comes_from_the_config_or_its_environment_variable(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "SUPERVISE_NODES__LEDGER": "~/shared/nodes.jsonl"}
    assert node_ledger_path(load_config(environ=env).nodes, env) == tmp_path / "shared" / "nodes.jsonl"
    assert node_ledger_path(NodesConfig(), {"HOME": str(tmp_path)}) == tmp_path / ".cache/slurm-supervisor/nodes.jsonl"
    with pytest.raises(ConfigError, match="nodes.hardware"):
        load_config(environ={"SUPERVISE_NODES__HARDWARE": "[segfaults]"})


# --------------------------------------------------------------------------- the queries (pure)

NOW = 1_800_000_000.0


def test_two_hardware_records_in_the_window_exclude_the_node_with_a_reason_and_an_expiry() -> None:
    records = [record_gpu_check("n17", False, "GPU 0: conv2d_fp32_4096_out1 differed in 2 of 299", ts=NOW - 3 * DAY,
                                run_dir="/r/a", job_id="11"),
               record_failure("n17", "hardware_fault", ts=NOW - 3600, run_dir="/r/b", job_id="12",
                              evidence="Xid 79: GPU has fallen off the bus"),
               record_failure("n2", "preempted", ts=NOW - 60)]
    (excluded,) = exclusions(records, NOW, POLICY)
    assert excluded.node == "n17" and excluded.until == NOW - 3600 + POLICY.exclude_for
    assert "1 x gpu_check" in excluded.reason and "1 x hardware_fault" in excluded.reason
    assert "exclude_after=2" in excluded.reason
    (suspect,) = suspects(records, NOW, POLICY)
    assert suspect.node == "n17" and suspect.hardware_count == 2
    assert [e.what for e in suspect.evidence] == ["gpu_check", "hardware_fault"]
    assert suspect.evidence[-1].detail == "Xid 79: GPU has fallen off the bus" and suspect.evidence[-1].job_id == "12"


def test_an_exclusion_expires_but_the_node_stays_a_suspect_within_the_window() -> None:
    records = [record_failure("n5", "node_failure", ts=NOW - 3 * DAY), record_slow_node("n5", "2x slower", ts=NOW - 2 * DAY)]
    assert exclusions(records, NOW - 2 * DAY + 10, POLICY)[0].node == "n5"
    assert exclusions(records, NOW, POLICY) == []
    assert [s.node for s in suspects(records, NOW, POLICY)] == ["n5"]


def test_evidence_older_than_the_window_no_longer_counts() -> None:
    records = [record_failure("n9", "hardware_fault", ts=NOW - 8 * DAY), record_failure("n9", "hardware_fault",
                                                                                        ts=NOW - 7.5 * DAY)]
    assert suspects(records, NOW, POLICY) == [] and exclusions(records, NOW, POLICY) == []


def test_one_hardware_record_makes_a_suspect_but_no_exclusion() -> None:
    records = [record_gpu_check("n3", False, "matmul mismatch", ts=NOW - 10)]
    assert [s.node for s in suspects(records, NOW, POLICY)] == ["n3"] and exclusions(records, NOW, POLICY) == []


def test_softer_evidence_needs_suspect_after_records_and_never_excludes() -> None:
    one = [record_failure("n4", "illegal_memory_access", ts=NOW - 100)]
    two = one + [record_loss_anomaly("n4", "nan", "loss is nan at step 880", ts=NOW - 50)]
    assert suspects(one, NOW, POLICY) == []
    (suspect,) = suspects(two, NOW, POLICY)
    assert suspect.hardware_count == 0 and "1 x illegal_memory_access" in suspect.reason
    assert exclusions(two * 3, NOW, POLICY) == []


def test_failures_that_say_nothing_about_a_node_are_not_evidence() -> None:
    records = [record_failure("n6", cls, ts=NOW - 10) for cls in ("python_exception", "preempted", "cuda_oom",
                                                                   "cancelled", "time_limit", "device_assert")]
    assert suspects(records * 3, NOW, POLICY) == []


def test_a_passed_gpu_check_is_not_evidence_and_clearing_a_node_forgives_its_past() -> None:
    bad = [record_failure("n8", "hardware_fault", ts=NOW - 300), record_failure("n8", "hardware_fault", ts=NOW - 200)]
    passed = [record_gpu_check("n8", True, "all bitwise identical", ts=NOW - 100)]
    assert [s.node for s in suspects(bad + passed, NOW, POLICY)] == ["n8"]
    cleared = bad + [record_cleared("n8", "GPU replaced", ts=NOW - 50)]
    assert suspects(cleared, NOW, POLICY) == [] and exclusions(cleared, NOW, POLICY) == []
    later = cleared + [record_failure("n8", "hardware_fault", ts=NOW - 10)]
    assert suspects(later, NOW, POLICY)[0].hardware_count == 1


def test_exclude_after_zero_never_excludes() -> None:
    records = [record_failure("n1", "hardware_fault", ts=NOW - i) for i in range(1, 6)]
    assert exclusions(records, NOW, NodesConfig(exclude_after=0)) == []


def test_records_round_trip_through_the_file_format() -> None:
    rec = record_loss_anomaly("gpu-a01", "spike", "loss 91.2 at step 4000 is over 10 x the running median 0.8",
                              ts=NOW, run_dir="/scratch/r", job_id="991", attempt=3)
    back = parse_record(rec.to_json())
    assert back == rec and back.kind is NodeEventKind.LOSS_ANOMALY and json.loads(rec.to_json())["v"] == 1
    huge = record_failure("n1", "hardware_fault", ts=NOW, evidence="x" * 20000)
    assert len(huge.to_json().encode()) <= 4096 and parse_record(huge.to_json()) is not None


# --------------------------------------------------------------------------- supervise nodes


def _supervise(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor", *args], capture_output=True, text=True, timeout=60,
                          env={**{k: v for k, v in os.environ.items() if not k.startswith("SUPERVISE_")}, **env},
                          cwd=REPO, check=False)


def test_supervise_nodes_lists_suspects_with_evidence_and_exits_1(tmp_path: Path) -> None:
    path = tmp_path / "nodes.jsonl"
    ledger = NodeLedger(path)
    now = time.time()
    ledger.append(record_gpu_check("n17", False, "GPU 0 (NVIDIA H200): conv2d_fp32_4096_out1 differed", ts=now - 7200,
                                   job_id="41"))
    ledger.append(record_failure("n17", "hardware_fault", ts=now - 60, run_dir="/scratch/exp1", job_id="42",
                                 evidence="Xid 79: GPU has fallen off the bus"))
    env = {"SUPERVISE_NODES__LEDGER": str(path)}
    text = _supervise("nodes", env=env)
    assert text.returncode == 1, text.stderr
    assert "n17  EXCLUDED until" in text.stdout and "conv2d_fp32_4096_out1 differed" in text.stdout
    assert "Xid 79" in text.stdout and "job 42" in text.stdout
    data = json.loads(_supervise("nodes", "--json", env=env).stdout)
    assert [s["node"] for s in data["suspects"]] == ["n17"] and data["exclusions"][0]["node"] == "n17"
    assert data["suspects"][0]["excluded_until"] == pytest.approx(now - 60 + NodesConfig().exclude_for, abs=1)
    assert _supervise("nodes", "--exclude-list", env=env).stdout.strip() == "n17"
    cleared = _supervise("nodes", "--clear", "n17", "--reason", "GPU swapped", env=env)
    assert cleared.returncode == 0 and "cleared n17" in cleared.stdout
    after = _supervise("nodes", env=env)
    assert after.returncode == 0 and after.stdout.startswith("no suspect node")
    assert _supervise("nodes", "--exclude-list", env=env).stdout.strip() == ""


def test_supervise_nodes_with_a_bad_config_value_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = _supervise("nodes", env={"SUPERVISE_NODES__EXCLUDE_FOR": "-5"})
    assert proc.returncode == 2 and "nodes.exclude_for" in proc.stderr and "Traceback" not in proc.stderr


def test_check_gpu_record_puts_an_unhealthy_verdict_in_the_ledger(tmp_path: Path) -> None:
    """No GPU here: the probe is replaced by a stand-in interpreter that reports what the real probe
    prints for a GPU whose conv2d result differed (the probe itself is tested in test_health.py)."""
    probe = {"torch": "2.11.0+cu130", "cuda": "13.0", "device_count": 1, "error": None, "warnings": [],
             "gpus": [{"index": 0, "name": "NVIDIA H200", "uuid": None, "pci_bus_id": None, "checks": [
                 {"name": "conv2d_fp32_4096_out1", "runs": 300, "mismatches": 2, "max_abs_diff": 0.25,
                  "first_bad_run": 117, "seconds": 1.2, "error": None}]}]}
    fake = tmp_path / "python-with-bad-gpu"
    fake.write_text(f"#!/bin/sh\necho 'PROBE_RESULT {json.dumps(probe)}'\n")
    fake.chmod(0o755)
    path = tmp_path / "nodes.jsonl"
    env = {"SUPERVISE_NODES__LEDGER": str(path), "SLURMD_NODENAME": "gpu-n42", "SLURM_JOB_ID": "777"}
    proc = _supervise("check-gpu", "--python", str(fake), "--record", env=env)
    assert proc.returncode == 1 and "UNHEALTHY" in proc.stdout
    (rec,) = NodeLedger(path).read().records
    assert (rec.node, rec.kind, rec.ok, rec.job_id) == ("gpu-n42", NodeEventKind.GPU_CHECK, False, "777")
    assert "conv2d_fp32_4096_out1" in (rec.detail or "")
    listed = _supervise("nodes", env=env)
    assert listed.returncode == 1 and "gpu-n42" in listed.stdout


# --------------------------------------------------------------------------- on the Slurm cluster


def test_both_nodes_of_a_job_write_one_ledger(slurm_cluster, slurm_job_dir: Path) -> None:
    ledger = slurm_job_dir / "nodes.jsonl"
    body = ("import os, time; from supervisor.addons.nodes import NodeLedger, record_slow_node; "
            f"L = NodeLedger({str(ledger)!r}); node = os.environ['SLURMD_NODENAME']; "
            "[L.append(record_slow_node(node, 'x' * (i % 50), ts=time.time(), job_id=os.environ['SLURM_JOB_ID'])) "
            "for i in range(300)]")
    script = f"#!/bin/bash\nexport PYTHONPATH={REPO}\nsrun -N2 -n2 {sys.executable} -c \"{body}\"\n"
    result = slurm_cluster.run_job(script, "-N2", "-n2", "-o", f"{slurm_job_dir}/ledger-%j.out", timeout=90)
    assert result.info.state == "COMPLETED", result.output
    read = NodeLedger(ledger).read()
    assert read.bad_lines == 0
    assert {r.node for r in read.records} == {"n1", "n2"}
    for node in ("n1", "n2"):
        assert sum(r.node == node for r in read.records) == 300
