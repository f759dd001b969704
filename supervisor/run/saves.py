"""Saves as the loop sees them: reported by the client, or seen in the checkpoint directory.

Zero-code mode has no client, so the directory is watched: a temp file or a checkpoint whose
size/mtime keeps changing is a save in flight (an in-place ``torch.save`` onto ``last.ckpt``
included), and it is complete once the file stops changing. A save the watch saw late, or only in
the final rescan after the child ended, still counts: the ledger's durable step must agree with
the resume point the next attempt will choose. A completed save of a file with no step in its
name (``last.ckpt``) carries the step read from inside it by the inert scan, never by unpickling.

A save named by its epoch alone (``epoch_2/``) has no step in its name, often none inside either,
and a script that prints nothing while it trains reports its step on a line printed *after* the
save lands. Such a save's ``save_end`` waits (``settle_saves``) until the output has said something
after it, the next save began, or the attempt ended; its step is then the reported one when the
pairing holds (supervisor/checkpoints/stepsource.py ``log_step_after_save``), else the step the
output had reported when the save began (a lower bound), and the event says which and why.
"""

from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path
from typing import Any

from ..checkpoints import DirWatcher
from ..checkpoints.naming import has_checkpoint_suffix, parse_name, step_from_name
from ..checkpoints.stepsource import (
    LOG_AFTER_SAVE,
    SaveStepTimeline,
    StepChoice,
    StepEvidence,
    choose_step,
    is_accelerate_state_dir,
    parse_step_rule,
)
from ..checkpoints.validate import fingerprint, validate
from ..events import Ev
from ..preemption import InFlightSave
from ..states import Verdict
from .attempt import AttemptState, AwaitingStep, SaveRecord
from .context import RunContext

log = logging.getLogger("supervisor.run")

WATCH_INTERVAL = 0.25  # seconds between checkpoint-directory polls
STALE_TEMP_S = 30.0
# How long a landed save's save_end waits for the output to report its step (an evaluation may run
# between the save and the line). Past it, the lower bound is recorded: late, never wrong.
AFTER_SAVE_WAIT_S = 120.0
_OUR_TEMP = re.compile(r"^\..+\.tmp-(?P<pid>[0-9]+)-[0-9a-f]{8}$")


def embedded_step(path: str, user_key: str | None = None) -> tuple[int | None, str | None]:
    """The training step stored inside a checkpoint file and the key it was under, read by the
    inert scan ((None, None) when unknown)."""
    try:
        from ..checkpoints.stepinfo import embedded_step as read_step
        info = read_step(Path(path), user_key)
    except Exception:
        return None, None
    step = getattr(info, "step", None)
    if not (isinstance(step, int) and not isinstance(step, bool) and 0 <= step < 2**53):
        return None, None
    return step, getattr(info, "key", None)


def step_of_saved(path: str, log_step: int | None = None, step_from: str | None = None,
                  log_after_step: int | None = None) -> StepChoice:
    """The step of a completed save and where it came from, by the precedence of
    supervisor/checkpoints/stepsource.py: the user's rule, the name (unless it is a save index),
    inside the file, the step the log reported for it after it landed (``log_after_step``), the
    step the log had reported when it began (``log_step``)."""
    name = Path(path).name
    info = parse_name(name)
    rule = parse_step_rule(step_from)
    is_index = info.index is not None and (not info.index_may_be_step or _accelerate_dir(path))
    name_step = info.step if info.index is None or is_index else info.index
    inside, key = (None, None) if os.path.isdir(path) else embedded_step(
        path, rule.arg if rule is not None and rule.kind == "key" else None)
    return choose_step(StepEvidence(name=name, name_step=info.index if is_index else name_step,
                                    name_is_index=is_index, inside_step=inside, inside_key=key,
                                    log_step=log_step, log_after_step=log_after_step), rule)


def _accelerate_dir(path: str) -> bool:
    try:
        return os.path.isdir(path) and is_accelerate_state_dir(os.listdir(path))
    except OSError:
        return False


def record_save(ctx: RunContext, state: AttemptState, step: Any, path: str, nbytes: Any, duration: Any,
                ok: bool, source: str, now: float, step_source: str | None = None, *, emit: bool = True) -> SaveRecord:
    """Add the save to the attempt; ``emit`` False: its ``save_end`` waits (``settle_saves``)."""
    step_i = step if isinstance(step, int) and not isinstance(step, bool) else None
    record = SaveRecord(step_i, path, nbytes if isinstance(nbytes, int) else None,
                        float(duration) if isinstance(duration, (int, float)) else None, ok, source, now)
    state.saves.append(record)
    state.in_flight = None
    if step_source is None and step_i is not None:
        step_source = source  # the client said it
    record.step_source = step_source if step_i is not None else None
    if emit:
        _emit_save_end(ctx, state, record, step_source)
    return record


def _emit_save_end(ctx: RunContext, state: AttemptState, record: SaveRecord, step_source: str | None,
                   **extra: Any) -> None:
    mark = fingerprint(record.path) if record.ok else None  # size and mtime now: this run's own file (provenance)
    ctx.emit(Ev.SAVE_END, attempt=state.attempt, step=record.step, path=record.path, bytes=record.bytes,
             duration=record.duration, ok=record.ok, source=record.source, step_source=step_source,
             size=mark[0] if mark else None, mtime=mark[1] if mark else None, **extra)


def note_step_line(state: AttemptState, step: int, epoch: int | None, now: float,
                   read_at: float | None = None) -> None:
    """An output line reported the global step (``epoch``: the whole epoch it names): kept for
    the saves whose step the output reports after them, and with the wall clock it was read at
    (``read_at``; else now, later than it was read) for :func:`reported_before_written`."""
    state.save_steps.line(now, step, epoch, read_at if read_at is not None else time.time())


def written_at(path: str) -> float | None:
    """When the save at ``path`` was last written: the newest ``st_ctime`` of its files (a file's
    own, a directory's files'). ctime, not mtime: a file copied in with its old mtime kept
    (``shutil.copy2``) still has the time of the copy. None: nothing could be read."""
    newest: float | None = None
    try:
        if not os.path.isdir(path):
            return os.lstat(path).st_ctime
        for root, _dirs, files in os.walk(path):
            for name in files:
                try:
                    ctime = os.lstat(os.path.join(root, name)).st_ctime
                except OSError:
                    continue
                newest = ctime if newest is None else max(newest, ctime)
    except OSError:
        return None
    return newest


# A line read this long after a save's files were last written still counts as printed before it: the
# kernel stamps files with a clock that lags by up to a tick (1-10 ms), and the reader thread stamps a
# line when it wakes. A training prints its next step a whole step of work after a save.
FILE_CLOCK_SLACK_S = 0.02


# A save the watch reports as complete was last written moments ago, on this machine's clock. A file
# time further from now than this (either way) was set by another clock (a network filesystem's
# server, skewed): the two clocks cannot be compared, and the step when the watch saw it stands.
FILE_CLOCK_AGREES_S = 30.0


def reported_before_written(state: AttemptState, path: str, reported: int | None,
                            now_wall: float | None = None) -> int | None:
    """The step the output had reported when the save at ``path`` was written, a lower bound of its
    step: ``reported`` (the step when the watch saw it) lowered to the step of the newest line read
    before the save's files were last written (give or take ``FILE_CLOCK_SLACK_S``). A fast
    training (tens of steps a second) prints several steps between the write and the moment the
    watch sees it; those steps came after the save and must not be taken for its step (the resume
    audit would then see the restart begin below the resume point)."""
    return step_before_write(state.save_steps, written_at(path), reported,
                             time.time() if now_wall is None else now_wall)


def step_before_write(timeline: SaveStepTimeline, written: float | None, reported: int | None,
                      now_wall: float) -> int | None:
    """:func:`reported_before_written` once the save's write time (``written``, wall clock; None:
    unknown) is read. Pure."""
    if written is None or abs(now_wall - written) > FILE_CLOCK_AGREES_S:
        return reported
    before = timeline.reported_by(written + FILE_CLOCK_SLACK_S)
    if before is None or (reported is not None and before >= reported):
        return reported
    return before


def settle_saves(ctx: RunContext, state: AttemptState, now: float, *, ended: bool = False) -> None:
    """Emit the ``save_end`` of each waiting save once the output has settled its step (or the
    attempt ended, or it waited ``AFTER_SAVE_WAIT_S``): the step the output reported after the
    save when it can be paired with it, else the lower bound it had when the save began."""
    waiting: list[AwaitingStep] = []
    step_from = _step_rule_text(ctx)
    for item in state.awaiting_step:
        path = item.record.path
        after = state.save_steps.after(path, item.log_at_start, ended=ended)
        if not after.settled and now - item.landed_at < AFTER_SAVE_WAIT_S:
            waiting.append(item)
            continue
        reason = after.reason if after.settled else f"no step line within {AFTER_SAVE_WAIT_S:.0f} s of the save"
        choice = step_of_saved(path, item.log_at_start, step_from, after.step)
        item.record.step, item.record.step_source = choice.step, choice.source
        note = reason if choice.source == LOG_AFTER_SAVE else (
            f"{choice.reason}; not from the output after the save: {reason}"
            + (" (a lower bound: the step it had printed when the save began)" if choice.source == "log" else ""))
        _emit_save_end(ctx, state, item.record, choice.source, step_reason=note)
    state.awaiting_step = waiting


def _reported_after(choice: StepChoice, path: str, step_from: str | None) -> bool:
    """Whether a landed save's step may come from the output after it: nothing stronger said it
    (no rule, no step in its name or contents) and its name counts an epoch."""
    return step_from is None and choice.source in (None, "log") and parse_name(Path(path).name).epoch is not None


def own_saves(events: list[Any]) -> dict[str, tuple[int, float]]:
    """Path -> (size, mtime) of every checkpoint this run's child wrote, from the ``save_end``
    events (the newest per path): a file that still matches is the user's own, trusted by
    provenance whatever globals it names."""
    out: dict[str, tuple[int, float]] = {}
    for e in events:
        size, mtime, path = e.get("size"), e.get("mtime"), e.get("path")
        if (e.event != Ev.SAVE_END.value or not e.get("ok") or not isinstance(path, str)
                or type(size) is not int or not isinstance(mtime, (int, float)) or isinstance(mtime, bool)):
            continue
        out[os.path.abspath(path)] = (size, float(mtime))
    return out


def client_owns_saves(state: AttemptState) -> bool:
    return any(s.source == "client" for s in state.saves) or (
        state.in_flight is not None and state.in_flight.source == "client")


def watch_saves(ctx: RunContext, watcher: DirWatcher, state: AttemptState, now: float) -> None:
    """One poll of the checkpoint directory (zero-code mode only: a client reports its own saves)."""
    try:
        activity = watcher.poll(now)
    except OSError:
        return
    if client_owns_saves(state):
        return
    step_from = _step_rule_text(ctx)
    for done in activity.completed:
        path = str(done.path)
        written, now_wall = written_at(path), time.time()  # one walk of the save's files
        if path not in state.save_steps.saves:  # the first sighting counts (SaveStepTimeline.saw)
            state.save_steps.saw(path, done.first_seen, parse_name(Path(path).name).epoch,
                                 step_before_write(state.save_steps, written, state.last_step, now_wall))
        # The output's step when the save began (the training waits for a save; by the time the
        # watch sees it complete it may have moved on): the last source of a step.
        began = state.in_flight
        log_step = began.step if began is not None and began.path == path and began.step is not None \
            else state.last_step
        log_step = step_before_write(state.save_steps, written, log_step, now_wall)
        found = step_of_saved(path, log_step, step_from)
        later = _reported_after(found, path, step_from)
        if later:
            # Its step may be reported after it: the step "when it began" is the one reported when it
            # was first seen, never one read since (that may be its report, or later training).
            log_step = state.save_steps.reported_when_seen(path)
            found = step_of_saved(path, log_step, step_from)
        record = record_save(ctx, state, found.step, path, done.bytes, done.duration, True, "watch", now,
                             step_source=found.source, emit=not later)
        if later:
            state.awaiting_step.append(AwaitingStep(record, log_step, now))
    if activity.in_flight and activity.path is not None and str(activity.path) not in state.save_steps.saves:
        state.save_steps.saw(str(activity.path), activity.since or now, parse_name(Path(activity.path).name).epoch,
                             reported_before_written(state, str(activity.path), state.last_step))
    settle_saves(ctx, state, now)
    if activity.in_flight and state.in_flight is None and not state.aborted_save:
        state.in_flight = InFlightSave(path=str(activity.path), step=state.last_step,
                                       started_at=activity.since or now, bytes_so_far=activity.bytes,
                                       source="watch")
        ctx.emit(Ev.SAVE_BEGIN, attempt=state.attempt, path=str(activity.path), source="watch")
    elif activity.in_flight and state.in_flight is not None:
        state.in_flight = InFlightSave(path=state.in_flight.path, step=state.in_flight.step,
                                       started_at=state.in_flight.started_at, bytes_so_far=activity.bytes,
                                       source=state.in_flight.source)
    elif not activity.in_flight and state.in_flight is not None and state.in_flight.source == "watch":
        state.in_flight = None


def final_rescan(ctx: RunContext, watcher: DirWatcher, state: AttemptState, now: float) -> None:
    """After the child ended: record checkpoints that landed but were never seen complete.

    Nobody of this run writes any more, so a checkpoint newer than the last durable step is a save
    that landed between two polls: a step file, or an in-place ``last.ckpt`` whose embedded step
    (read by the inert scan, which also proves it structurally whole) is newer. A torn file has
    no readable step and is left to the next attempt's resume-point scan, which quarantines it."""
    if client_owns_saves(state):
        settle_saves(ctx, state, now, ended=True)
        return
    watch_saves(ctx, watcher, state, now)
    settle_saves(ctx, state, now, ended=True)  # no more output will come
    durable = state.last_durable_step
    try:
        entries = list(os.scandir(ctx.layout.ckpt_dir))
    except OSError:
        return
    found: list[tuple[int, str, int, str | None]] = []
    recorded = {(s.path, s.step) for s in state.saves}
    step_from = _step_rule_text(ctx)
    for entry in entries:
        if entry.name.startswith((".", "CORRUPT_")):
            continue
        named = step_from_name(entry.name)
        if named is not None and entry.path in {s.path for s in state.saves}:
            continue
        if named is None and not parse_name(entry.name).is_last and not has_checkpoint_suffix(entry.name):
            continue
        choice = step_of_saved(entry.path, None, step_from)
        step = choice.step
        if step is None or (durable is not None and step <= durable) or (entry.path, step) in recorded:
            continue
        if (named is not None and state.in_flight is not None and state.in_flight.path == entry.path
                and validate(entry.path, writers_alive=False).verdict is not Verdict.VALID):
            # A step file still being written when the child died did not land. One written to a
            # temp name and renamed in just before the death did: it is whole, and it counts.
            continue
        try:
            size = entry.stat(follow_symlinks=False).st_size
        except OSError:
            continue
        found.append((step, entry.path, size, choice.source))
    for step, path, size, source in sorted(found, key=lambda item: item[:3]):
        record_save(ctx, state, step, path, size, None, True, "rescan", now, step_source=source)


def _step_rule_text(ctx: RunContext) -> str | None:
    checkpoint = getattr(ctx.cfg, "checkpoint", None)
    return getattr(checkpoint, "step_from", None)


def recorded_steps(events: Any) -> dict[str, Any]:
    """path -> RecordedStep: the step of the last completed save of each path the event log
    records, and its size then (what the resume-point chooser may use when nothing better says)."""
    from ..checkpoints.scan import RecordedStep

    out: dict[str, Any] = {}
    for e in events:
        step = e.get("step")
        if e.event != Ev.SAVE_END.value or not e.get("ok") or not isinstance(step, int) or isinstance(step, bool):
            continue
        nbytes = e.get("bytes")
        out[str(e.get("path"))] = RecordedStep(step, nbytes if isinstance(nbytes, int) and
                                               not isinstance(nbytes, bool) else None)
    return out


def remove_stale_temp_files(ctx: RunContext, attempt_no: int, now: float) -> None:
    """Temp files of our atomic writer whose writer is dead (a kill mid-save) would pile up,
    checkpoint-sized, one per preemption. Only our own pattern, only when the writing pid is gone
    from this host and the file has not changed for a while (a writer on another node keeps its
    file fresh)."""
    removed = []
    try:
        candidates = list(ctx.layout.ckpt_dir.glob(".*.tmp-*-*"))
    except OSError:
        return
    for path in candidates:
        match = _OUR_TEMP.match(path.name)
        if not match or path.is_symlink() or not path.is_file():
            continue
        try:
            idle = now - path.stat().st_mtime
            if pid_alive(int(match.group("pid"))) or idle < STALE_TEMP_S:
                continue
            size = path.stat().st_size
            path.unlink()
            removed.append({"path": str(path), "bytes": size})
        except (OSError, ValueError):
            continue
    if removed:
        ctx.emit(Ev.WARNING, attempt=attempt_no, reason="removed temp files of dead writers", removed=removed)


def remove_our_temp_files(target: Path) -> list[Path]:
    """Remove temp files of our own atomic writer for ``target`` (``.<name>.tmp-*``), nothing else."""
    removed = []
    try:
        for p in target.parent.glob(f".{target.name}.tmp-*"):
            if p.is_file() and not p.is_symlink():
                p.unlink()
                removed.append(p)
    except OSError:
        pass
    return removed


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True
