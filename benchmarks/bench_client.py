"""Cost of the training-side client and of the control channel (results: docs/benchmarks.md).

Each client scenario runs in a fresh Python process, because the client is a per-process singleton
built from the environment (with or without ``SUPERVISOR_CONTROL``):

    python benchmarks/bench_client.py            # full run (~1 min on 2 cores)
    python benchmarks/bench_client.py --quick    # smaller counts

Measured: ns per heartbeat() (bare and with a metric), per heartbeat()+should_stop() (the usual
training-loop pair), per saving() block (no write inside) and per resumed(); allocated memory after
1e6 heartbeats (tracemalloc); stop broadcast -> should_stop() latency in a live child; the server's
decode throughput; StepExtractor cost per output line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from supervisor.control import ControlServer, Kind, new_token, parse_address, seal  # noqa: E402
from supervisor.progress import StepExtractor  # noqa: E402

CHILD = r"""
import json, os, sys, time, tracemalloc
from supervisor import client
n = int(sys.argv[1]); mode = sys.argv[2]
out = {}
def per_call(fn, count):
    fn(0)  # build the client outside the timing
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter(); fn(count); best = min(best, time.perf_counter() - t)
    return best / count * 1e9
def hb(count):
    h = client.heartbeat
    for i in range(count): h(i)
def hb_metric(count):
    h = client.heartbeat
    for i in range(count): h(i, loss=0.5)
def hb_stop(count):
    h = client.heartbeat; s = client.should_stop
    for i in range(count):
        h(i, loss=0.5); s()
def saving(count):
    for i in range(count):
        with client.saving(i, "bench.bin"):
            pass
def resumed(count):
    for i in range(count): client.resumed(i)
open("bench.bin", "wb").write(b"x" * 4096)
if mode == "timing":
    out["heartbeat_ns"] = per_call(hb, n)
    out["heartbeat_metric_ns"] = per_call(hb_metric, n)
    out["heartbeat_should_stop_ns"] = per_call(hb_stop, n)
    out["saving_ns"] = per_call(saving, max(n // 100, 100))
    out["resumed_ns"] = per_call(resumed, max(n // 100, 100))
else:
    hb_stop(1000)
    tracemalloc.start()
    hb_stop(10_000)
    before = tracemalloc.take_snapshot()
    t = time.perf_counter(); hb_stop(n); elapsed = time.perf_counter() - t
    after = tracemalloc.take_snapshot()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
    out["calls"] = n
    out["grown_bytes"] = grown
    out["peak_bytes"] = tracemalloc.get_traced_memory()[1]
    out["tracemalloc_s"] = elapsed
out["enabled"] = client.enabled()
print(json.dumps(out))
"""

LATENCY_CHILD = r"""
import sys, time
from supervisor import client
print("ready", flush=True)
i = 0
while not client.should_stop():
    i += 1
    client.heartbeat(i, loss=0.5)
    time.sleep(0.0005)  # a (very) short training step
print(repr(time.time()), flush=True)
"""


def child_env(server: ControlServer | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUPERVISOR_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    if server is not None:
        env.update(SUPERVISOR_CONTROL=server.address, SUPERVISOR_KEY=server.key, SUPERVISOR_ATTEMPT="1")
    return env


def run_child(code: str, args: list[str], server: ControlServer | None, workdir: Path) -> dict:
    proc = subprocess.Popen([sys.executable, "-c", code, *args], env=child_env(server), cwd=workdir,
                            stdout=subprocess.PIPE, text=True)
    while proc.poll() is None:
        if server is not None:
            server.poll()  # keep the queue drained, as the run loop does
        time.sleep(0.01)
    out = proc.stdout.read() if proc.stdout else ""
    return json.loads(out.strip().splitlines()[-1])


def stop_latency(server: ControlServer, workdir: Path, rounds: int) -> list[float]:
    latencies = []
    for _ in range(rounds):
        server.forget_clients()
        proc = subprocess.Popen([sys.executable, "-c", LATENCY_CHILD], env=child_env(server), cwd=workdir,
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 10
        while not server.clients and time.monotonic() < deadline:
            server.poll()
            time.sleep(0.002)
        time.sleep(0.2)
        sent_at = time.time()
        server.broadcast(Kind.STOP, reason="bench", deadline=None)
        seen_at = float(proc.stdout.readline())
        proc.wait()
        latencies.append((seen_at - sent_at) * 1e3)
    return latencies


def server_throughput(count: int) -> float:
    """Datagrams decoded and checked per second by poll() (the sender is this process)."""
    import socket

    with ControlServer(new_token()) as server:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        addr = parse_address(server.address)
        handled = 0
        elapsed = 0.0
        seq = 0
        while handled < count:
            for _ in range(1000):  # fits the kernel queue: nothing is dropped
                seq += 1  # a fresh sequence number each time: the server rejects replays
                sock.sendto(seal(Kind.HEARTBEAT, server.key, 7, seq, 0, rank=0, pid=1, host="n1", attempt=1,
                                 step=123, metrics={"loss": 0.5, "lr": 1e-4}), addr)
            t = time.perf_counter()
            handled += len(server.poll(max_messages=2000))
            elapsed += time.perf_counter() - t
        sock.close()
        return handled / elapsed


def extractor_cost(lines: int) -> dict[str, float]:
    samples = {
        "tqdm_bar": "Epoch 0:  45%|████▌     | 450/1000 [00:10<00:12, 43.2it/s, v_num=0, loss=1.23]",
        "nanogpt": "iter 100: loss 2.3412, time 50.12ms, mfu 30.12%",
        "plain_log_line": "INFO:root:loading shard 3 of the dataset (1.2 GB), 8 workers",
        "log_line_with_path": "INFO:root:loading shard 3 of the dataset from /scratch/data (1.2 GB)",
    }
    extractor = StepExtractor()
    out = {}
    for name, line in samples.items():
        t = time.perf_counter()
        for _ in range(lines):
            extractor.match(line)
        out[name] = (time.perf_counter() - t) / lines * 1e9
    return out


def machine() -> dict[str, str]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"nproc": str(os.cpu_count()), "cpu": model, "python": platform.python_version(),
            "kernel": platform.release(), "date": time.strftime("%Y-%m-%d")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    args = parser.parse_args()
    n = 100_000 if args.quick else 1_000_000
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench_client_{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)

    results: dict = {"machine": machine(), "calls": n}
    results["no_supervisor"] = run_child(CHILD, [str(n), "timing"], None, workdir)
    with ControlServer(new_token()) as server:
        results["with_supervisor"] = run_child(CHILD, [str(n), "timing"], server, workdir)
        results["memory_with_supervisor"] = run_child(CHILD, [str(n), "memory"], server, workdir)
        latencies = sorted(stop_latency(server, workdir, 5 if args.quick else 20))
    results["memory_no_supervisor"] = run_child(CHILD, [str(n), "memory"], None, workdir)
    results["stop_latency_ms"] = {"median": latencies[len(latencies) // 2], "max": latencies[-1],
                                  "rounds": len(latencies)}
    results["server_decode_per_s"] = server_throughput(20_000 if args.quick else 100_000)
    results["extract_ns_per_line"] = extractor_cost(20_000 if args.quick else 100_000)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
