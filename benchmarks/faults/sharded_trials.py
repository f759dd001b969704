"""The long version of tests/faults/test_sharded_kill.py (issue #16): kill -9 one rank of a real
multi-process DCP save (gloo, 2-4 ranks) at a random moment, hundreds of times, and count.
Results go into docs/reliability.md.

    python benchmarks/faults/sharded_trials.py --trials 300 --seed 1601 --json sharded.json

Each trial: the ranks save ``step-<k>`` and ``last`` through ``supervisor.integrations.dcp.save``
in a loop; one rank is SIGKILLed during save k (k in 2..4) at a uniform moment of that save's
cycle (every fourth trial: rank 0, the moment a commit marker appears, to land in the
milliseconds-wide commit and publish windows); the other ranks are killed 0-50 ms later, as a
launcher would. Then the supervisor's own resume-point scan (with quarantine), its attempt-start
cleanup (``cleanup.remove_stale_staging``) and the scan again; the chosen checkpoint is
CRC-checked (L4) and loaded with ``dcp.load`` every time (a torn one would mix two saves' tensors).
Every other trial keeps ``last`` alone (every save replaces the only checkpoint). ``--writer
plain`` runs the same kills against DCP's own in-place ``dcp.save``: the baseline.
Exit status: 0 when every trial was ok, 1 otherwise (the JSON says which and why).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from faults.sharded_kill import (
    PLACED,
    ShardedOutcome,
    ShardedPool,
    sharded_kill_trial,
    summarize,
)

PHASES = tuple(PLACED)  # every fourth trial (atomic writer) is killed at one of these pause points, in turn


def machine() -> dict[str, object]:
    try:
        import torch

        torch_version = torch.__version__
    except ImportError:
        torch_version = None
    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"nproc": os.cpu_count(), "cpu": cpu, "python": platform.python_version(), "torch": torch_version,
            "kernel": platform.release(), "load_average": os.getloadavg()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--seed", type=int, default=None, help="repeat a run's random choices")
    parser.add_argument("--world", type=int, default=None, help="ranks per trial (default: 2, 3 or 4 at random)")
    parser.add_argument("--writer", choices=["atomic", "plain"], default="atomic",
                        help="atomic: supervisor.integrations.dcp.save; plain: dcp.save in place (the baseline)")
    parser.add_argument("--json", type=Path, default=None, help="write the outcomes and the summary here")
    parser.add_argument("--keep", action="store_true", help="keep the trial directories")
    args = parser.parse_args(argv)
    if args.trials < 1:
        parser.error("--trials must be at least 1")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    rng = random.Random(seed)
    work = Path(tempfile.mkdtemp(prefix="sharded-trials-"))
    started = time.time()
    outcomes: list[ShardedOutcome] = []
    try:
        with ShardedPool() as pool:
            for i in range(args.trials):
                placed = PHASES[(i // 4) % len(PHASES)] if args.writer == "atomic" else "at_marker"
                outcome = sharded_kill_trial(pool, work / f"t{i}", i, rng, world=args.world,
                                             moment=placed if i % 4 == 3 else "uniform",
                                             names="last_only" if i % 2 else "step_and_last", writer=args.writer)
                outcomes.append(outcome)
                mark = "ok " if outcome.ok else "BAD"
                print(f"{mark} {i:4d} world={outcome.facts['world']} victim={outcome.facts['victim_rank']} "
                      f"{outcome.label}; resume {outcome.facts.get('after_cleanup_resume', {}).get('path')}"
                      + ("" if outcome.ok else f"  {outcome.problems}"), flush=True)
                if not args.keep and outcome.ok:
                    shutil.rmtree(work / f"t{i}", ignore_errors=True)
    finally:
        summary = summarize(outcomes)
        report = {"kind": "sharded_kill9_dcp", "seed": seed, "date": datetime.date.today().isoformat(),
                  "seconds": round(time.time() - started, 1), "machine": machine(), "summary": summary,
                  "outcomes": [o.to_dict() for o in outcomes]}
        if args.json:
            args.json.write_text(json.dumps(report, indent=1, default=str))
        print(json.dumps({"seed": seed, "seconds": report["seconds"], **summary}, indent=1))
        if not args.keep and all(o.ok for o in outcomes):
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"trial directories kept in {work}", file=sys.stderr)
    return 0 if outcomes and all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
