"""The CLI and pyslurm backends on the same real cluster (results: docs/benchmarks.md, "Slurm backends").

For each Slurm release with a pyslurm (22.05 on the host, 24.11 in its Debian root), on one throwaway
test cluster (tests/slurm_cluster.py) with pyslurm built by tests/vendor/pyslurm/build.sh:

- a job-record read (``job_info``) of a running job: median of N per backend, timed in one process
  inside the cluster's environment (tests/pyslurm_probe.py);
- a requeue (the whole ``requeue()``: its record read, the request, the check) of a running job:
  median of N per backend, each of a different running job of a pool;
- the run loop's notice-to-decision time: a real ``supervise run`` in a Slurm job, preempted; the
  time from its ``notice`` event to its ``arbitration`` event, and to its ``requeue`` event where the
  release needs the explicit requeue (22.05), with the supervisor's PYTHONPATH holding pyslurm or
  not (``auto`` then picks it or the CLI; its ``run_start`` says which).

    python benchmarks/bench_slurm_backends.py [--versions 22.05 24.11] [--count 50] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from pyslurm_cluster import build_pyslurm, ok, probe  # noqa: E402
from slurm_cluster import install_for, start_cluster  # noqa: E402

CHILD = "import time\nfor i in range(100000):\n    print(f'step {i}', flush=True)\n    time.sleep(0.05)\n"


def events(run_dir: Path) -> list[dict]:
    path = run_dir / "supervisor" / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip().startswith("{")]


def wait(predicate, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.1)
    raise SystemExit(f"bench_slurm_backends: timed out waiting for {what}")


def ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 1)


def notice_round(cluster, site: str | None, number: int) -> dict:
    run_dir = cluster.shared_dir / f"bench-{'pyslurm' if site else 'cli'}-{number}"
    path = os.pathsep.join([str(REPO), site] if site else [str(REPO)])
    child = cluster.shared_dir / "bench_child.py"
    child.write_text(CHILD)
    script = (f"#!/bin/bash\nexport PYTHONPATH={path}\n"
              f"srun --cpus-per-task=1 {sys.executable} -m supervisor run --run-dir {run_dir} -- "
              f"{sys.executable} {child}\n")
    job = cluster.sbatch(script, "-p", "extra", "-N1", "--exclusive", "-w", "n1", "--requeue", "-o", "/dev/null")
    wait(lambda: any(e["event"] == "progress" for e in events(run_dir)), 120, "the supervised child's progress")
    cluster.preempt("n1", seconds=1)
    wait(lambda: any(e["event"] == "arbitration" for e in events(run_dir)), 60, "the arbitration")
    time.sleep(3)  # the explicit requeue (22.05) follows the child's exit
    seen = events(run_dir)
    start = next(e for e in seen if e["event"] == "run_start")
    notice = next(e for e in seen if e["event"] == "notice")
    arbitration = next(e for e in seen if e["event"] == "arbitration")
    requeue = next((e for e in seen if e["event"] == "requeue" and e["ts"] >= notice["ts"]), None)
    cluster.command(["scancel", str(job)], check=False)
    cluster.cancel_all()
    cluster.wait_idle(timeout=60)
    return {"backend": start.get("slurm_backend"), "reason": start.get("slurm_backend_reason"),
            "decision_s": arbitration["ts"] - notice["ts"],
            "requeue_s": (requeue["ts"] - notice["ts"]) if requeue else None}


def bench(label: str, count: int, rounds: int) -> dict:
    site = build_pyslurm(label)
    base = Path(tempfile.mkdtemp(prefix="slurm-test-cluster-bench-"))
    cluster = start_cluster(base, install=install_for(label))
    try:
        reader = cluster.sbatch("sleep 900\n", "-p", "own", "-n1", "-o", "/dev/null")
        cluster.wait_state(reader, "RUNNING", timeout=30)
        reads = probe(cluster, site, ["time_info", "cli", reader, count], ["time_info", "pyslurm", reader, count],
                      timeout=600)
        cluster.command(["scancel", str(reader)])
        out: dict = {"version": str(cluster.version), "read_ms": {"cli": ms(ok(reads[0])), "pyslurm": ms(ok(reads[1]))},
                     "requeue_ms": {}, "notice": {}}
        for backend in ("cli", "pyslurm"):
            pool = [cluster.sbatch("sleep 900\n", "-p", "own", "-n1", "--requeue", "-o", "/dev/null")
                    for _ in range(12)]
            [timed] = probe(cluster, site, ["time_requeue", backend, pool, count], timeout=900)
            out["requeue_ms"][backend] = ms(ok(timed)["seconds"])
            out.setdefault("requeue_not_timed", {})[backend] = ok(timed)["not_requeued"]
            cluster.cancel_all()
            cluster.wait_idle(timeout=60)
        for backend, with_site in (("cli", None), ("pyslurm", site)):
            runs = [notice_round(cluster, with_site, n) for n in range(rounds)]
            assert all(r["backend"] == backend for r in runs), runs
            requeues = [r["requeue_s"] for r in runs if r["requeue_s"] is not None]
            out["notice"][backend] = {"decision_ms": ms([r["decision_s"] for r in runs]),
                                      "requeue_ms": ms(requeues) if requeues else None,
                                      "reason": runs[0]["reason"]}
        return out
    finally:
        cluster.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", nargs="+", default=["22.05", "24.11"])
    parser.add_argument("--count", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"# {platform.node()} nproc={os.cpu_count()} {platform.platform()} Python {platform.python_version()} "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} load={os.getloadavg()[0]:.1f}", flush=True)
    for label in args.versions:
        print(json.dumps({label: bench(label, args.count, args.rounds)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
