"""The control channel across a real multi-node step (issue 5): ``supervise run -- srun -N2 -n2 ...``
on the throwaway cluster (tests/slurm_cluster.py; slurmd ``n1`` and ``n2`` on this host).

Both directions are checked: datagrams from every task on every node reach the supervisor, and the
supervisor's ``stop`` reaches every task through srun. Forged datagrams are counted and ignored.
"""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time
from pathlib import Path

from helpers import REPO, events_named, wait_for

PY = sys.executable


def supervise_exe() -> str:
    beside = Path(PY).with_name("supervise")
    return str(beside) if beside.is_file() else f"{PY} -m supervisor"


# Every task: heartbeats a rank-specific step (rank r counts from r*1000) until told to stop, then
# says how it learned and whether an emergency save was asked for (``save_now`` exists only as a
# datagram), and reports a save of its shard (so the log shows each task's datagram).
# SUPERVISOR_RUN_DIR is dropped before the client starts: all "nodes" share this host's filesystem,
# so the stop file would also carry the stop; without it only the UDP message can.
STOP_PROBE = textwrap.dedent("""\
    import os, sys, time
    os.environ.pop("SUPERVISOR_RUN_DIR", None)
    from supervisor import client

    job_dir = sys.argv[1]
    rank = int(os.environ["SLURM_PROCID"])
    node = os.environ["SLURMD_NODENAME"]
    client.install()
    step = rank * 1000
    give_up = time.monotonic() + 60
    while not client.should_stop() and time.monotonic() < give_up:
        step += 1
        client.heartbeat(step)
        if step == rank * 1000 + 20:
            open(os.path.join(job_dir, f"ready-{rank}"), "w").close()
        time.sleep(0.02)
    # "beat", not "step": the supervisor reads "step N" in the output of every task.
    print(f"STOPPED rank={rank} node={node} beat={step} reason={client.stop_reason()} "
          f"save_requested={client.save_requested()}", flush=True)
    shard = os.path.join(job_dir, f"shard-rank{rank}-{node}.txt")
    with client.saving(step, shard):
        with open(shard, "w") as fh:
            fh.write(str(step))
""")


def _stopped_lines(output: str) -> dict[int, dict[str, str]]:
    seen = {}
    for line in output.splitlines():
        if line.startswith("STOPPED "):
            fields = dict(part.split("=", 1) for part in line.split()[1:])
            seen[int(fields["rank"])] = fields
    return seen


def test_stop_notice_reaches_every_task_on_every_node_over_the_channel(slurm_cluster, slurm_job_dir: Path) -> None:
    job_dir = slurm_job_dir
    run_dir = job_dir / "run"
    probe = job_dir / "stop_probe.py"
    probe.write_text(STOP_PROBE)
    pidfile = job_dir / "supervise.pid"
    script = textwrap.dedent(f"""\
        #!/bin/bash
        export PYTHONPATH={REPO}:$PYTHONPATH
        export PYTHONUNBUFFERED=1
        {supervise_exe()} run --run-dir {run_dir} --set preemption.requeue=never \\
            --set preemption.unknown_save_s=1 \\
            -- srun -N2 -n2 --cpus-per-task=1 {PY} {probe} {job_dir} &
        echo $! > {pidfile}
        wait $!
        echo "SUPERVISE EXIT $?"
    """)
    job = slurm_cluster.sbatch(script, "-p", "extra", "-N2", "-n2", "--no-requeue", "-o", f"{job_dir}/job-%j.out")
    assert wait_for(lambda: (job_dir / "ready-0").exists() and (job_dir / "ready-1").exists(), 60), \
        f"the tasks never started heartbeating: {slurm_cluster.job_info(job)}"
    time.sleep(0.3)  # the supervisor drains its socket every tick: let it read both hellos
    # A SIGTERM from outside the scheduler (the job stays RUNNING, no PreemptTime): the supervisor
    # handles it like a notice (stop and save_now to every task), and ends the run as a person's stop.
    os.kill(int(pidfile.read_text()), signal.SIGTERM)

    info = slurm_cluster.wait_finished(job, timeout=90)
    output = Path(info.std_out).read_text(errors="replace")
    assert info.state == "COMPLETED", output[-4000:]
    assert "SUPERVISE EXIT 130" in output, output[-4000:]  # a person's stop: never come back

    stopped = _stopped_lines(output)
    assert sorted(stopped) == [0, 1], output[-4000:]
    assert {s["node"] for s in stopped.values()} == {"n1", "n2"}
    # save_now and stop travel only as datagrams here (no stop file; srun is not signalled before a
    # save lands): "preemption" is the supervisor's stop, a signal would read "signal SIGTERM".
    assert [stopped[r]["save_requested"] for r in (0, 1)] == ["True", "True"], stopped
    assert [stopped[r]["reason"] for r in (0, 1)] == ["preemption", "preemption"], stopped

    notice = events_named(run_dir, "notice")
    assert notice and notice[0]["signal"] == "TERM"
    assert events_named(run_dir, "arbitration")[0]["decision"] == "emergency_save"
    end = events_named(run_dir, "attempt_end")[0]
    # Rank 0 owns the step: its last heartbeat is the attempt's last step, rank 1's (1000+) is not.
    assert end["last_step"] == int(stopped[0]["beat"]), (end, stopped)
    assert end["class"] == "cancelled"
    shards = {Path(e["path"]).name: e["step"] for e in events_named(run_dir, "save_end")}
    for rank, fields in stopped.items():  # a datagram from each task on each node arrived
        assert shards.get(f"shard-rank{rank}-{fields['node']}.txt") == int(fields["beat"]), shards
    assert [e["outcome"] for e in events_named(run_dir, "run_end")] == ["interrupted"]
    assert events_named(run_dir, "requeue") == []


FORGE_PROBE = textwrap.dedent("""\
    import json, os, socket, time
    from supervisor import client

    rank = int(os.environ["SLURM_PROCID"])
    node = os.environ["SLURMD_NODENAME"]
    if rank == 1:  # from the other node: a heartbeat claiming a huge step, signed with a wrong token
        host, _, port = os.environ["SUPERVISOR_CONTROL"][len("udp://"):].rpartition(":")
        forged = {"v": 1, "kind": "heartbeat", "token": "0" * 32, "rank": 0, "step": 999999}
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for _ in range(3):
            sock.sendto(json.dumps(forged).encode(), (host, int(port)))
        print(f"FORGED from {node}", flush=True)
    for step in range(1, 21):
        client.heartbeat(step)
        time.sleep(0.02)
    if rank == 0:
        client.done(20)
""")


def test_forged_datagrams_from_another_node_are_dropped_and_counted(slurm_cluster, slurm_job_dir: Path) -> None:
    run_dir = slurm_job_dir / "run"
    probe = slurm_job_dir / "forge_probe.py"
    probe.write_text(FORGE_PROBE)
    script = textwrap.dedent(f"""\
        #!/bin/bash
        export PYTHONPATH={REPO}:$PYTHONPATH
        {supervise_exe()} run --run-dir {run_dir} -- srun -N2 -n2 --cpus-per-task=1 {PY} {probe}
        echo "SUPERVISE EXIT $?"
    """)
    result = slurm_cluster.run_job(script, "-p", "extra", "-N2", "-n2", "-o", f"{slurm_job_dir}/job-%j.out",
                                   timeout=90)
    assert result.info.state == "COMPLETED", result.output[-4000:]
    assert "SUPERVISE EXIT 0" in result.output and "FORGED from n" in result.output, result.output[-4000:]

    dropped = events_named(run_dir, "control_dropped")
    assert dropped, "no control_dropped event after forged datagrams"
    assert dropped[-1]["by_reason"]["bad_token"] >= 1, dropped
    end = events_named(run_dir, "attempt_end")[0]
    assert end["class"] == "completed" and end["last_step"] == 20  # the forged step 999999 was ignored
    assert [e["outcome"] for e in events_named(run_dir, "run_end")] == ["complete"]
