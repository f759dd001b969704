"""kill -9 of one rank of a real multi-process DCP save, at a random moment (issue #16 item 4).

A *zygote* (``python -m faults.sharded_kill``) imports torch once, then on request forks the
ranks of one trial: real processes, a real gloo process group (a FileStore in the trial's
directory), real ``torch.distributed.checkpoint`` saves through
``supervisor.integrations.dcp.save``. Each rank saves ``step-<k>`` and then ``last`` (a fixed name,
replaced on every save: the rename-aside path) in a loop; rank 0 keeps two step directories and
discards older ones with ``sharded.discard``, as a training's retention would. Every rank saves
its own tensor ``rank<r>`` filled with the step, so a checkpoint mixing two saves shows when it
is loaded.

Protocol on stdin/stdout, one JSON object per line:

    {"cmd": "spawn", "dir": D, "world": W, "bytes": N, "attempt": A, "writer": "atomic"|"plain",
     "names": "step_and_last"|"last_only"}                         -> {"pids": [...]}
    {"cmd": "reap", "pid": P}                                      -> {"status": <waitpid status>}
    {"cmd": "load", "path": P, "world": W}                         -> {"ok": bool, "steps": [...], "error": str}
    {"cmd": "quit"}

Rank 0 journals ``<monotonic s> begin <name> <k>`` and ``<monotonic s> committed <name> <k>``
around each save with ``os.write`` (a kill -9 cannot lose a line), so the driver knows the last
save that completed.

The driver side is :func:`sharded_kill_trial` (one trial: spawn, kill one rank at a random moment,
kill the rest a moment later as a launcher would, then judge the directory with the supervisor's
own resume-point scan and attempt-start cleanup, and load the chosen checkpoint with
``dcp.load``).
"""

from __future__ import annotations

import functools
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------ the ranks (zygote side)


WRITERS = ("atomic", "plain")
NAMES = ("step_and_last", "last_only")
# Where a trial can stop the writer and kill it, exactly there (see :func:`_install_pause`):
PLACED = {
    "writing": "writing: staging without marker",  # the victim rank's files are in staging; no marker
    "commit": "commit: marker written, not yet renamed",  # rank 0 wrote the marker; nothing renamed yet
    "publish": "publish: old one moved aside",  # rank 0 moved the old checkpoint aside; the new one not in yet
}
PAUSED = "paused"  # the file a paused rank writes in the trial's directory: "<phase> <rank>"
_current: dict[str, Any] = {}  # the save this rank is in: {"name": ..., "step": ...}


def _install_pause(work: Path, rank: int, pause: dict[str, Any]) -> None:
    """A pause point in the writer: at ``pause["phase"]`` of save ``pause["step"]`` of checkpoint
    ``pause["name"]``, this rank says so (``work/paused``) and waits to be killed. Wraps the
    protocol's own steps in this rank's process only: ``sync_tree`` (a rank's files are written,
    before its note and the commit), ``publish`` (rank 0, the marker is written) and ``fsync_dir``
    inside ``publish`` right after the old checkpoint was moved aside."""
    from supervisor import sharded

    phase = pause["phase"]

    def due() -> bool:
        return _current.get("name") == pause["name"] and _current.get("step") == pause["step"]

    def stop_here() -> None:
        tmp = work / f".{PAUSED}.{rank}"
        tmp.write_text(f"{phase} {rank}")
        os.replace(tmp, work / PAUSED)
        while True:
            time.sleep(3600)  # until the driver's kill -9

    if phase == "writing":
        sync_tree = sharded.sync_tree

        def paused_sync_tree(root: Path) -> list[str]:
            if due():
                stop_here()
            return sync_tree(root)

        sharded.sync_tree = paused_sync_tree  # type: ignore[assignment]
    elif phase in ("commit", "publish"):
        publish, fsync_dir = sharded.publish, sharded.fsync_dir
        inside: dict[str, Any] = {}

        def paused_publish(staging: Path, final: Path, name: Any) -> None:
            if due() and phase == "commit":
                stop_here()
            inside["final"] = final if due() else None
            try:
                publish(staging, final, name)
            finally:
                inside["final"] = None

        def paused_fsync_dir(path: Any) -> None:
            fsync_dir(path)
            final = inside.get("final")
            if final is not None and phase == "publish" and not os.path.lexists(final):
                stop_here()  # the old one is aside, the new one not renamed in

        sharded.publish = paused_publish  # type: ignore[assignment]
        sharded.fsync_dir = paused_fsync_dir  # type: ignore[assignment]
    else:
        raise ValueError(f"pause phase {phase!r}: one of {sorted(PLACED)}")


def rank_loop(rank: int, world: int, work: Path, nbytes: int, writer: str = "atomic",
              names: str = "step_and_last", pause: dict[str, Any] | None = None) -> None:
    """One rank: init gloo, then save forever (until killed): ``step-<k>`` then ``last`` each
    time, or ``last`` alone (the single-copy set-up: every save replaces the only checkpoint).
    ``writer``: ``atomic`` (``supervisor.integrations.dcp.save``) or ``plain`` (DCP's own
    ``dcp.save`` straight into the directory, the baseline). ``pause``: this rank stops at a
    named point of one save (:func:`_install_pause`)."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from supervisor import sharded
    from supervisor.integrations import dcp as sdcp

    torch.set_num_threads(1)
    if pause is not None and pause.get("rank") == rank:
        _install_pause(work, rank, pause)
    dist.init_process_group("gloo", init_method=f"file://{work / 'store'}", rank=rank, world_size=world)
    ckpt = work / "ckpt"
    fd = os.open(work / "journal", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if rank == 0 else -1
    pad = torch.ones(max(nbytes // 4, 1), dtype=torch.float32)

    def note(text: str) -> None:
        if fd >= 0:
            os.write(fd, f"{time.monotonic():.6f} {text}\n".encode())

    step = 0
    while True:
        step += 1
        state = {"step": step, f"rank{rank}": torch.full((64,), float(step)), f"pad{rank}": pad}
        for name in (f"step-{step}", "last") if names == "step_and_last" else ("last",):
            note(f"begin {name} {step}")
            _current.update(name=name, step=step)
            if writer == "atomic":
                sdcp.save(state, ckpt / name, step)
            else:
                dcp.save(state, checkpoint_id=str(ckpt / name))
            note(f"committed {name} {step}")
        if rank == 0:
            for old in sorted(ckpt.glob("step-*"), key=lambda p: int(p.name.split("-")[1].split(".")[0])):
                parts = old.name.split("-")[1]
                if parts.isdigit() and int(parts) <= step - 2:
                    sharded.discard(old)


def load_check(path: Path, world: int) -> dict[str, Any]:
    """dcp.load the checkpoint in one process: every rank's tensor must hold the same step."""
    import torch
    import torch.distributed.checkpoint as dcp

    state: dict[str, Any] = {"step": 0}
    for r in range(world):
        state[f"rank{r}"] = torch.zeros(64)
    dcp.load(state, checkpoint_id=str(path), no_dist=True)
    steps = sorted({int(state[f"rank{r}"][0].item()) for r in range(world)})
    consistent = len(steps) == 1 and all(bool((state[f"rank{r}"] == steps[0]).all()) for r in range(world))
    return {"ok": consistent and state["step"] == steps[0], "steps": steps, "step_item": state["step"]}


def _spawn(request: dict[str, Any]) -> list[int]:
    work = Path(request["dir"])
    os.environ["SUPERVISOR_ATTEMPT"] = str(request["attempt"])
    pids = []
    for rank in range(request["world"]):
        pid = os.fork()
        if pid == 0:
            _child(functools.partial(rank_loop, rank, request["world"], work, request["bytes"],
                                     request.get("writer", "atomic"), request.get("names", "step_and_last"),
                                     request.get("pause")))
        pids.append(pid)
    return pids


def _load(request: dict[str, Any]) -> dict[str, Any]:
    """dcp.load in a forked child (the zygote itself stays free of threads and state)."""
    path = Path(request["path"])
    result_path = path.parent.parent / "load.json"

    def run() -> None:
        try:
            result = load_check(path, request["world"])
        except BaseException as exc:  # noqa: BLE001 - the driver reports it
            result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
        result_path.write_text(json.dumps(result))

    pid = os.fork()
    if pid == 0:
        _child(run)
    os.waitpid(pid, 0)
    try:
        return json.loads(result_path.read_text())
    except (OSError, ValueError) as exc:
        return {"ok": False, "error": f"loader died: {exc}"}


def zygote() -> None:
    import warnings

    import torch  # the expensive imports, paid once
    import torch.distributed.checkpoint  # noqa: F401

    from supervisor.integrations import dcp  # noqa: F401

    warnings.simplefilter("ignore")
    out = sys.stdout
    for line in sys.stdin:
        request = json.loads(line)
        cmd = request["cmd"]
        if cmd == "spawn":
            out.write(json.dumps({"pids": _spawn(request)}) + "\n")
        elif cmd == "reap":
            _, status = os.waitpid(request["pid"], 0)
            out.write(json.dumps({"status": status}) + "\n")
        elif cmd == "load":
            out.write(json.dumps(_load(request)) + "\n")
        elif cmd == "quit":
            return
        out.flush()


def _child(body: Any) -> None:
    """Run ``body`` in a forked child and never return into the zygote's loop."""
    code = 0
    try:
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        body()
    except BaseException:  # noqa: BLE001
        code = 1
    finally:
        os._exit(code)


# ------------------------------------------------------------------------------ the driver side


class ShardedPool:
    """The zygote process, driven from the test."""

    def __init__(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "tests"), env.get("PYTHONPATH", "")])
        env["OMP_NUM_THREADS"] = "1"
        self.proc = subprocess.Popen([sys.executable, "-m", "faults.sharded_kill"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env, cwd=REPO / "tests")

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the sharded-save zygote died (exit {self.proc.poll()})")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.ask({"cmd": "quit"})
            except (OSError, RuntimeError, ValueError):
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def __enter__(self) -> ShardedPool:  # noqa: PYI034 - a final class of the harness
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class ShardedOutcome:
    """One trial: ``ok`` when the directory held a valid, loadable resume point no older than the
    last committed save, before and after the attempt-start cleanup, and nothing torn was chosen."""

    trial: int
    ok: bool
    label: str
    problems: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"trial": self.trial, "ok": self.ok, "label": self.label, "problems": self.problems,
                "facts": self.facts}


def _journal(work: Path) -> list[tuple[float, str, str, int]]:
    try:
        text = (work / "journal").read_text()
    except OSError:
        return []
    rows = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[3].isdigit():
            rows.append((float(parts[0]), parts[1], parts[2], int(parts[3])))
    return rows


def _wait(predicate: Any, timeout: float) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.002)
    return None


def _landed(ckpt: Path) -> str:
    """Where the kill landed, read from what it left on disk."""
    from supervisor import sharded

    staging = [p for p in ckpt.iterdir() if sharded.parse_staging_name(p.name)]
    aside = [p for p in ckpt.iterdir() if sharded.parse_aside_name(p.name)]
    committed = [p for p in staging if (p / sharded.MARKER).exists()]
    if aside:
        return "publish: old one moved aside"
    if committed:
        return "commit: marker written, not yet renamed"
    if staging:
        return "writing: staging without marker"
    return "between saves"


MOMENTS = ("uniform", "at_marker", *PLACED)


def sharded_kill_trial(pool: ShardedPool, work: Path, trial: int, rng: random.Random, *,
                       world: int | None = None, nbytes: int | None = None,
                       moment: str | None = None, names: str = "step_and_last",
                       writer: str = "atomic") -> ShardedOutcome:
    """Start ``world`` ranks saving, kill -9 one during save k (k in 2..4), kill the others 0-50 ms
    later, then judge (see :class:`ShardedOutcome`). ``moment``: ``uniform`` (a random time within
    that save's cycle, any rank: wherever it lands), ``at_marker`` (rank 0, as soon as a commit
    marker appears; where it lands is still up to timing), or a *placed* phase of :data:`PLACED`
    (``writing``, ``commit``, ``publish``): the rank stops at that point of the save of ``last``
    at step k (a pause point in the writer) and is killed there, so the kill lands in that window
    every time, whatever the machine's load; random among uniform and at_marker when None.
    ``names`` and ``writer``: see :func:`rank_loop` (``writer="plain"`` is the baseline, which
    is expected to fail)."""
    if names not in NAMES or writer not in WRITERS:
        raise ValueError(f"names {names!r} / writer {writer!r}: one of {NAMES} / {WRITERS}")
    from supervisor import sharded
    from supervisor.checkpoints import find_resume_point, validate_checkpoint
    from supervisor.states import Verdict

    world = world or rng.choice([2, 2, 3, 4])
    nbytes = nbytes or rng.choice([256 << 10, 1 << 20, 4 << 20])
    work.mkdir(parents=True)
    ckpt = work / "ckpt"
    attempt = 1
    started = time.monotonic()
    victim = rng.randrange(world)
    target = rng.randint(2, 4)
    how = moment or rng.choice(["uniform", "uniform", "uniform", "at_marker"])
    if how not in MOMENTS:
        raise ValueError(f"moment {how!r}: one of {MOMENTS}")
    if how in ("commit", "publish", "at_marker"):
        victim = 0  # only rank 0 commits and publishes
    pause = {"phase": how, "rank": victim, "step": target, "name": "last"} if how in PLACED else None
    pids = pool.ask({"cmd": "spawn", "dir": str(work), "world": world, "bytes": nbytes, "attempt": attempt,
                     "writer": writer, "names": names, "pause": pause})["pids"]
    problems: list[str] = []
    facts: dict[str, Any] = {"world": world, "bytes_per_rank": nbytes, "victim_rank": victim, "save": target,
                             "moment": how, "names": names, "writer": writer}
    try:
        begun = _wait(lambda: [r for r in _journal(work) if r[1] == "begin" and r[3] == target], 60)
        if pause is not None:
            if not _wait(lambda: (work / PAUSED).exists(), 120):
                problems.append(f"rank {victim} never reached the pause point {how!r} of save {target}")
        elif not begun:
            problems.append(f"save {target} never began: {_journal(work)[-3:]}")
        else:
            rows = _journal(work)
            firsts = [r[0] for r in rows if r[1] == "begin" and r[3] == target - 1]
            cycle = max(begun[0][0] - firsts[0], 0.01) if firsts else 0.2
            if how == "at_marker":
                _wait(lambda: any((p / sharded.MARKER).exists() for p in ckpt.glob("*.tmp-*")
                                  if sharded.parse_staging_name(p.name)), cycle * 2)
            else:
                time.sleep(rng.uniform(0, cycle))
        os.kill(pids[victim], signal.SIGKILL)
        time.sleep(rng.uniform(0, 0.05))
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            pool.ask({"cmd": "reap", "pid": pid})
    rows = _journal(work)
    committed = [r for r in rows if r[1] == "committed"]
    last_committed = max((r[3] for r in committed), default=0)
    last_begun = max((r[3] for r in rows if r[1] == "begin"), default=0)
    facts.update(last_committed=last_committed, last_begun=last_begun)
    label = _landed(ckpt) if ckpt.is_dir() else "before the first save"
    facts["landed"] = label
    if pause is not None and label != PLACED[how]:
        problems.append(f"placed at {how!r} but the directory shows {label!r}")

    def judge(stage: str) -> int | None:
        result = find_resume_point(ckpt, writers_alive=False, quarantine=True, quarantine_tag=f"t{trial}")
        facts[f"{stage}_resume"] = {"path": result.path and Path(result.path).name, "step": result.step,
                                    "quarantined": [Path(q.path).name for q in result.quarantined]}
        if result.path is None:
            if last_committed:
                problems.append(f"{stage}: no resume point although step {last_committed} was committed")
            return None
        report = validate_checkpoint(result.path, deep=True)
        if report.verdict is not Verdict.VALID:
            problems.append(f"{stage}: chosen {result.path} is {report.verdict.value} at L4: {report.reason}")
        loaded = pool.ask({"cmd": "load", "path": result.path, "world": world})
        facts[f"{stage}_load"] = loaded
        if not loaded.get("ok"):
            problems.append(f"{stage}: TORN checkpoint chosen: {result.path} loads as {loaded}")
        if result.step is None or result.step < last_committed - 0:
            # the last committed save of any name is step-<k> or last at k: either is >= k
            problems.append(f"{stage}: resume step {result.step} < last committed save {last_committed}")
        if result.step is not None and result.step > last_begun:
            problems.append(f"{stage}: resume step {result.step} > last begun save {last_begun}")
        return result.step

    before = judge("scan")
    from supervisor.checkpoints.staging import StagingAction, remove_stale_staging

    cleanup = remove_stale_staging(ckpt, time.time(), attempt=attempt + 1) if ckpt.is_dir() else []
    facts["cleanup"] = [(Path(c.path).name, c.action, c.ok) for c in cleanup]
    if any(not c.ok for c in cleanup):
        problems.append(f"cleanup failed: {[c.to_event() for c in cleanup if not c.ok]}")
    after = judge("after_cleanup")
    if ckpt.is_dir():
        leftovers = [p.name for p in ckpt.iterdir()
                     if sharded.parse_staging_name(p.name) or sharded.parse_aside_name(p.name)]
        if leftovers:
            problems.append(f"cleanup left {leftovers}")
    if before is not None and after is not None and after < before:
        problems.append(f"the cleanup lost a checkpoint: resume step {before} -> {after}")
    facts["lost_saves"] = max(last_committed - (after or 0), 0)
    facts["rolled_forward"] = any(c[1] == StagingAction.ROLL_FORWARD.value for c in facts["cleanup"])
    facts["seconds"] = round(time.monotonic() - started, 2)
    return ShardedOutcome(trial, not problems, label, problems, facts)


def summarize(outcomes: list[ShardedOutcome]) -> dict[str, Any]:
    """The counts docs/reliability.md reports: trials, ok, torn chosen, lost, where kills landed."""
    landed: dict[str, int] = {}
    for o in outcomes:
        landed[o.label] = landed.get(o.label, 0) + 1
    torn = sum(1 for o in outcomes if any("TORN" in p for p in o.problems))
    return {
        "trials": len(outcomes),
        "ok": sum(o.ok for o in outcomes),
        "torn_chosen": torn,
        "no_resume_point": sum(1 for o in outcomes if any("no resume point" in p for p in o.problems)),
        "saves_lost": sum(o.facts.get("lost_saves", 0) for o in outcomes),
        "rolled_forward": sum(1 for o in outcomes if o.facts.get("rolled_forward")),
        "quarantined": sum(len((o.facts.get("scan_resume") or {}).get("quarantined", [])) for o in outcomes),
        "landed": dict(sorted(landed.items())),
        "worlds": sorted({o.facts.get("world") for o in outcomes}),
        "names": sorted({o.facts.get("names") for o in outcomes}),
        "writers": sorted({o.facts.get("writer") for o in outcomes}),
    }


if __name__ == "__main__":
    zygote()
