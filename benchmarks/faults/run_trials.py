"""The long version of the fault-injection suite (issue 9): the trials of tests/faults/, repeated
and counted. Run by hand; results go into docs/reliability.md.

    python benchmarks/faults/run_trials.py --trials 300 --only kill9_atomic,kill9_plain --json out.json
    python benchmarks/faults/run_trials.py --trials 12 --only preemption --json slurm.json
    python benchmarks/faults/run_trials.py --trials 1 --json all.json          # every kind once

Kinds: see ``KINDS``. ``preemption`` starts the throwaway Slurm cluster (tests/slurm_cluster.py)
and runs two trials at a time, one per node. ``--seed`` makes the random kill moments repeatable.
Exit status: 0 when every trial's outcome was ok, 1 otherwise (the JSON says which and why).
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
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from faults import trials as T  # noqa: E402

Runner = Callable[[argparse.Namespace, Path, random.Random], list[T.TrialOutcome]]


def _kill9(mode: str) -> Runner:
    def run(args: argparse.Namespace, work: Path, rng: random.Random) -> list[T.TrialOutcome]:
        params = T.KillParams(save_bytes=args.save_mb << 20)
        with T.SaverPool() as pool:
            return [_progress(T.kill_during_save_trial(pool, work, i, rng, mode, params)) for i in range(args.trials)]
    return run


def _repeat(fn: Callable[..., T.TrialOutcome], **kw: Any) -> Runner:
    def run(args: argparse.Namespace, work: Path, rng: random.Random) -> list[T.TrialOutcome]:
        out = []
        for i in range(args.trials):
            try:
                out.append(_progress(fn(work, i, **kw)))
            except T.Unavailable as exc:
                out.append(T.TrialOutcome(fn.__name__, i, False, "unavailable", [str(exc)]))
                break
        return out
    return run


def _supervisor_kill(args: argparse.Namespace, work: Path, rng: random.Random) -> list[T.TrialOutcome]:
    return [_progress(T.supervisor_killed_trial(work, i, rng)) for i in range(args.trials)]


def _big_line(args: argparse.Namespace, work: Path, rng: random.Random) -> list[T.TrialOutcome]:
    return [_progress(T.big_line_trial(work, i, megabytes=args.big_mb)) for i in range(args.trials)]


def _preemption(args: argparse.Namespace, work: Path, rng: random.Random) -> list[T.TrialOutcome]:
    import slurm_cluster as cluster_lib

    cluster = cluster_lib.start_cluster(owner_pid=os.getpid(), die_with_owner=True)
    try:
        job_dir = cluster.shared_dir / "faults"
        job_dir.mkdir(parents=True, exist_ok=True)
        with cluster.grace(args.grace):
            outcomes = T.run_preemption_batch(cluster, job_dir, 0, args.trials, rng, T.default_preempt_choice)
        for outcome in outcomes:
            _progress(outcome)
        return outcomes
    finally:
        cluster.stop(keep=bool(os.environ.get("SLURM_TEST_KEEP")))


KINDS: dict[str, Runner] = {
    "kill9_atomic": _kill9("atomic"),
    "kill9_plain": _kill9("plain"),
    "preemption": _preemption,
    "supervisor_kill": _supervisor_kill,
    "disk_full": _repeat(T.disk_full_trial),
    "read_only": _repeat(T.read_only_trial),
    "vanishing_dir": _repeat(T.vanishing_dir_trial),
    "clock_forward": _repeat(T.clock_jump_trial, direction="forward"),
    "clock_backward": _repeat(T.clock_jump_trial, direction="backward"),
    "hostile_pickle": _repeat(T.hostile_pickle_trial),
    "symlink_escape": _repeat(T.symlink_escape_trial),
    "forged_control": _repeat(T.forged_control_trial),
    "big_line": _big_line,
}


def _progress(outcome: T.TrialOutcome) -> T.TrialOutcome:
    mark = "ok  " if outcome.ok else "FAIL"
    print(f"{mark} {outcome.kind} #{outcome.trial} {outcome.label} ({outcome.seconds:.1f} s)"
          + ("" if outcome.ok else f"\n     {'; '.join(outcome.problems)}")
          + (f"\n     concern: {'; '.join(outcome.concerns)}" if outcome.concerns else ""),
          file=sys.stderr, flush=True)
    return outcome


def machine() -> dict[str, Any]:
    try:
        import torch
        torch_version = torch.__version__
    except ImportError:
        torch_version = None
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "host": platform.node(), "cpu": T.cpu_model(), "cores": os.cpu_count(),
            "load_avg": os.getloadavg(), "python": platform.python_version(), "torch": torch_version,
            "kernel": platform.release()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=1, help="trials per kind")
    parser.add_argument("--only", default=",".join(KINDS), help=f"comma-separated kinds: {', '.join(KINDS)}")
    parser.add_argument("--json", dest="json_out", type=Path, help="write every outcome and the summary here")
    parser.add_argument("--seed", type=int, default=None, help="random seed of the kill/preemption moments")
    parser.add_argument("--save-mb", type=int, default=4, help="checkpoint size of the kill -9 trials (MB)")
    parser.add_argument("--big-mb", type=int, default=10240, help="size of the big_line child output (MB)")
    parser.add_argument("--grace", type=int, default=3, help="GraceTime of partition extra (preemption)")
    parser.add_argument("--work-dir", type=Path, default=None, help="where trials write [a fresh temp dir]")
    args = parser.parse_args(argv)
    kinds = [k.strip() for k in args.only.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        parser.error(f"unknown kind(s) {unknown}; choose from {', '.join(KINDS)}")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    rng = random.Random(seed)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="faults-"))
    work.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"seed": seed, "machine": machine(), "argv": sys.argv, "kinds": {}}
    all_ok = True
    for kind in kinds:
        began = time.monotonic()
        outcomes = KINDS[kind](args, work / kind, rng)
        summary = T.summarize(kind, outcomes)
        summary["wall_s"] = round(time.monotonic() - began, 1)
        report["kinds"][kind] = {"summary": summary, "outcomes": [o.to_dict() for o in outcomes]}
        all_ok &= summary["failed"] == 0
        print(json.dumps(summary), flush=True)
        if args.json_out:  # after every kind: a long run interrupted later still leaves its counts
            args.json_out.write_text(json.dumps(report, indent=1, default=str))
    if args.work_dir is None and all_ok:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"trial files kept in {work}", file=sys.stderr)
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
