"""The imperative shell of ``supervise run``: attempts, monitoring, decisions carried out, records.

Everything that decides lives in pure modules (failures, budget, preemption, checkpoints.resume,
progress); this module wires them to the child process, the control channel, signals, Slurm and the
event log. One ``Runner.run()`` covers one job's share of a run: a sequence of attempts ending in
complete, stop, or requeue.
"""

from __future__ import annotations

import json
import re
import logging
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from . import __version__
from .attempt import AttemptState, SaveRecord
from .checkpoints import DirWatcher, find_resume_point, quarantine_tag
from .checkpoints.naming import step_from_name
from .child import Child, ChildExit, ChildSpec, resolve_command
from .client import STACK_DUMP_SIGNAL
from .config import SupervisorConfig
from .control import ControlServer, new_token
from .errors import ExitCode, UsageError
from .events import Ev, EventLog, read_events
from .lock import RunLock
from .paths import RunPaths
from .preemption import (
    InFlightSave,
    Notice,
    SaveHistory,
    after_block,
    arbitrate,
    decide_requeue,
    notice_for,
)
from .progress import LossTracker, ProgressTracker, StepExtractor
from .signals import SignalInbox, signal_number
from .slurm import SlurmEnv, get_backend
from .states import Action, FailureClass, RunOutcome, SaveDecision

log = logging.getLogger("supervisor.run")

TICK = 0.05  # seconds between monitor passes; signals and exits wake the loop sooner
WATCH_INTERVAL = 0.25  # checkpoint-directory polls (zero-code save detection)
REFINE_INTERVAL = 0.3  # after a notice without a readable Slurm deadline: ask again this often ...
REFINE_WINDOW = 10.0  # ... for this long


class SupervisorClock:
    """Epoch seconds that never jump: the wall clock read once, advanced by the monotonic clock.

    Every timeout of the supervisor (stall, backoff, TERM -> KILL, the grace deadline) runs on it,
    so a clock step on the node (NTP, a VM resumed) neither kills a healthy child as hung nor
    stretches a 3 s backoff into hours. Slurm's EndTime is compared against it as epoch seconds.
    """

    def __init__(self) -> None:
        self._wall0, self._mono0 = time.time(), time.monotonic()

    def __call__(self) -> float:
        return self._wall0 + (time.monotonic() - self._mono0)


@dataclass(frozen=True)
class RunResult:
    outcome: RunOutcome
    exit_code: int
    reason: str


def default_run_name(argv: Sequence[str], environ: Mapping[str, str]) -> str:
    """A stable name for the run directory: the training script's stem, else the command's name."""
    for i, arg in enumerate(argv):
        if arg.endswith(".py"):
            return Path(arg).stem
        if arg == "-m" and i + 1 < len(argv):
            return argv[i + 1].rsplit(".", 1)[-1]
    return environ.get("SLURM_JOB_NAME") or (Path(argv[0]).name if argv else "run")


class Runner:
    """Runs attempts of the child until it completes, policy stops it, or the job must requeue."""

    def __init__(
        self,
        cfg: SupervisorConfig,
        argv: Sequence[str],
        *,
        environ: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        echo: bool = True,
    ) -> None:
        if not argv:
            raise UsageError("missing the training command after '--' (e.g. supervise run -- python train.py)")
        self.cfg = cfg
        self.argv = list(argv)
        self.environ = dict(os.environ if environ is None else environ)
        self.cwd = Path(cwd or os.getcwd())
        self.echo = echo
        self.slurm = SlurmEnv.from_environ(self.environ)
        name = cfg.name or default_run_name(self.argv, self.environ)
        run_dir = Path(cfg.run_dir) if cfg.run_dir else self.cwd / "runs" / name
        if not run_dir.is_absolute():
            run_dir = self.cwd / run_dir
        self.name = name
        self.paths = RunPaths(run_dir)
        ckpt = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else self.paths.default_checkpoint_dir
        self.ckpt_dir = ckpt if ckpt.is_absolute() else self.cwd / ckpt
        self.events: EventLog | None = None
        self.control: ControlServer | None = None
        self.clock = SupervisorClock()
        self.inbox = SignalInbox(self._handled_signals(), clock=self.clock)
        self._backend: Any = None
        self._interrupts = 0
        self._notice_signals = {signal_number(s) for s in cfg.preemption.signals}

    # ------------------------------------------------------------------ set-up and tear-down

    def _handled_signals(self) -> set[int]:
        sigs = {signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2}
        return sigs | {signal_number(s) for s in self.cfg.preemption.signals}

    def _check_inputs(self) -> None:
        """Bad input is found before anything is written outside the run directory."""
        if resolve_command(self.argv, self.environ) is None:
            raise UsageError(f"command not found or not executable: {self.argv[0]!r} "
                             "(check the spelling and PATH)")
        try:
            self.paths.supervisor_dir.mkdir(parents=True, exist_ok=True)
            probe = self.paths.supervisor_dir / f".write-test-{os.getpid()}"
            probe.write_text("")
            probe.unlink()
        except OSError as exc:
            raise UsageError(f"run directory {self.paths.run_dir} is not writable ({exc.strerror}); "
                             "pass a writable --run-dir") from None

    def run(self) -> RunResult:
        self._check_inputs()
        lock = RunLock(self.paths.lock, self.paths.lock_owner)
        lock.acquire(self.environ)
        self._child: Child | None = None
        self._manifest_threads: list[threading.Thread] = []
        self._noticed = False
        try:
            self.events = EventLog(self.paths.events)
            self.control = ControlServer(new_token(), environ=self.environ)
            self.control.start()
            self.inbox.install()
            try:
                result = self._run_attempts()
            except KeyboardInterrupt:
                result = RunResult(RunOutcome.INTERRUPTED, 130, "interrupted")
                self._emit(Ev.RUN_END, outcome=result.outcome, exit_code=result.exit_code,
                           reason=result.reason)
            except Exception as exc:
                # A bug of ours must not leave a training child running unsupervised.
                self._emit(Ev.RUN_END, outcome=RunOutcome.FAILED.value, exit_code=ExitCode.FAILED,
                           reason=f"supervisor internal error: {type(exc).__name__}: {exc}")
                raise
            return result
        finally:
            if self._child is not None and self._child.poll() is None:
                self._child.stop(min(self.cfg.term_timeout, 5.0))
            self._finish_manifests()
            self.inbox.uninstall()
            if self.control:
                self._record_dropped()
                self.control.close()
            if self.events:
                self.events.close()
            try:
                self.paths.stop_file.unlink()
            except OSError:
                pass
            lock.release()

    def _emit(self, event: Ev, **fields: Any) -> None:
        assert self.events is not None
        self.events.emit(event, **fields)

    # ------------------------------------------------------------------ the attempt loop

    def _run_attempts(self) -> RunResult:
        previous = read_events(self.paths.events).events
        attempt_no = max((int(e.get("attempt", 0) or 0) for e in previous
                          if e.event == Ev.ATTEMPT_START.value), default=0)
        self._emit(Ev.RUN_START, name=self.name, run_dir=str(self.paths.run_dir),
                   checkpoint_dir=str(self.ckpt_dir), argv=self.argv,
                   config_hash=self.cfg.config_hash(), host=socket.gethostname(), pid=os.getpid(),
                   job_id=self.slurm.job_id, restart_count=self.slurm.restart_count,
                   version=__version__, control=self.control.address if self.control else None)
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        while True:
            attempt_no += 1
            state = self._start_state(attempt_no)
            missing = self._check_durable_history(state)
            if missing is not None:
                return missing
            if "gpu" in self.cfg.preflight:
                failed = self._gpu_preflight(state)
                if failed is not None:
                    return failed
            child = self._launch(state)
            exit_ = self._monitor(child, state)
            child.finish()
            result = self._after_attempt(child, exit_, state)
            if result is not None:
                return result

    def _check_durable_history(self, state: AttemptState) -> RunResult | None:
        """The event log remembers every save that landed. If it says step S was saved but no valid
        checkpoint at or near S exists now, the checkpoint directory vanished, was emptied, or
        points elsewhere: restarting from scratch would silently throw the run away."""
        from .budget import audit_durable_history

        saved = [e for e in read_events(self.paths.events).events
                 if e.event == Ev.SAVE_END.value and e.get("ok") and isinstance(e.get("step"), int)]
        inside = []
        for e in saved:
            path = Path(str(e.get("path")))
            if path.parent.resolve() == self.ckpt_dir.resolve():  # saves into the watched directory
                inside.append((int(e.get("step")), str(path), os.path.lexists(path)))
        verdict = audit_durable_history(inside, state.resume_step, state.resume_path)
        if verdict.ok:
            return None
        self._emit(Ev.RESUME_MISMATCH, attempt=state.attempt, expected_step=verdict.expected_step,
                   got_step=state.resume_step, resume_path=state.resume_path, reason=verdict.reason)
        log.error("CHECKPOINTS MISSING: %s", verdict.reason)
        if self.cfg.budget.on_resume_mismatch == "stop":
            return self._end(RunOutcome.STOPPED, ExitCode.STOPPED, f"resume audit failed: {verdict.reason}",
                             state)
        return None

    def _remove_stale_temp_files(self, attempt_no: int) -> None:
        """Temp files of our atomic writer whose writer is dead (a kill mid-save) would pile up,
        checkpoint-sized, one per preemption. Only our own pattern, only when the writing pid is gone
        from this host and the file has not changed for a while (a writer on another node keeps
        its file fresh)."""
        removed = []
        try:
            candidates = list(self.ckpt_dir.glob(".*.tmp-*-*"))
        except OSError:
            return
        for path in candidates:
            match = _OUR_TEMP.match(path.name)
            if not match or path.is_symlink() or not path.is_file():
                continue
            try:
                idle = self.clock() - path.stat().st_mtime
                if _pid_alive(int(match.group("pid"))) or idle < STALE_TEMP_S:
                    continue
                size = path.stat().st_size
                path.unlink()
                removed.append({"path": str(path), "bytes": size})
            except OSError:
                continue
        if removed:
            self._emit(Ev.WARNING, attempt=attempt_no, reason="removed temp files of dead writers",
                       removed=removed)

    def _start_state(self, attempt_no: int) -> AttemptState:
        """Choose the resume point (quarantining torn checkpoints) and open the attempt's state."""
        self._remove_stale_temp_files(attempt_no)
        result = find_resume_point(self.ckpt_dir, quarantine=self.cfg.quarantine,
                                   quarantine_tag=quarantine_tag(self.environ),
                                   deep_confirm=self.cfg.verify_resume_deep)
        for q in result.quarantined:
            self._emit(Ev.QUARANTINE, attempt=attempt_no, **q.to_event())
            if q.ok:
                log.warning("quarantined torn checkpoint %s -> %s (%s)", q.path, q.dest, q.reason)
            else:
                log.error("could not quarantine %s: %s", q.path, q.error)
        self._emit(Ev.RESUME_POINT, attempt=attempt_no, **result.event_fields())
        if result.path:
            log.info("resume point: %s (step %s)", result.path, result.step)
        return AttemptState(attempt=attempt_no, started_at=self.clock(),
                            resume_path=result.path, resume_step=result.step)

    def _gpu_preflight(self, state: AttemptState) -> RunResult | None:
        """Bit-for-bit repeatability of conv2d/matmul on this node's GPUs, in a subprocess that
        imports torch with the child's interpreter. A GPU that fails is a hardware fault: requeue
        away from this node instead of training on it. 'Cannot check' only warns."""
        from .health import run_check
        from .manifest import find_child_python

        python, _how = find_child_python(self.argv)
        verdict = run_check(python=python, environ=self.environ)
        self._emit(Ev.PREFLIGHT, attempt=state.attempt, check="gpu", **verdict.to_dict())
        if verdict.ok or not verdict.checkable:
            if not verdict.ok:
                log.warning("GPU preflight could not judge this node: %s", verdict.reason)
            return None
        log.error("GPU preflight failed on %s: %s", self.slurm.nodename or socket.gethostname(), verdict.reason)
        state.nodes.add(self.slurm.nodename or socket.gethostname())
        return self._requeue(state, FailureClass.HARDWARE_FAULT, f"GPU preflight failed: {verdict.reason}")

    def _child_env(self, state: AttemptState) -> dict[str, str]:
        assert self.control is not None
        env = dict(self.environ)
        env.update({
            "SUPERVISOR_CONTROL": self.control.address,
            "SUPERVISOR_TOKEN": self.control.token,
            "SUPERVISOR_RUN_DIR": str(self.paths.run_dir),
            "SUPERVISOR_ATTEMPT": str(state.attempt),
            "SUPERVISOR_RESUME_FROM": state.resume_path or "",
            "SUPERVISOR_RESUME_STEP": "" if state.resume_step is None else str(state.resume_step),
            "SUPERVISOR_CHECKPOINT_DIR": str(self.ckpt_dir),
            "SUPERVISOR_NOTICE_SIGNALS": ",".join(self.cfg.preemption.signals),
            "PYTHONUNBUFFERED": env.get("PYTHONUNBUFFERED", "1"),
        })
        return env

    def _child_argv(self, state: AttemptState) -> list[str]:
        argv = list(self.argv)
        if self.cfg.resume_arg and state.resume_path:
            argv += [part.replace("{path}", state.resume_path).replace("{step}", str(state.resume_step))
                     for part in self.cfg.resume_arg.split()]
        return argv

    def _launch(self, state: AttemptState) -> Child:
        try:
            self.paths.stop_file.unlink()
        except OSError:
            pass
        argv = self._child_argv(state)
        spec = ChildSpec(argv=argv, env=self._child_env(state), cwd=self.cwd,
                         log_path=self.paths.attempt_log(state.attempt),
                         tail_bytes=self.cfg.tail_bytes, max_line_bytes=self.cfg.max_line_bytes,
                         echo=self.echo)
        child = Child(spec)
        child.start()
        self._child = child
        self._emit(Ev.ATTEMPT_START, attempt=state.attempt, argv=argv, pid=child.pid,
                   host=socket.gethostname(), job_id=self.slurm.job_id,
                   restart_count=self.slurm.restart_count, nodes=list(self.slurm.node_names) or None,
                   resume_path=state.resume_path, resume_step=state.resume_step)
        log.info("attempt %d started (pid %s): %s", state.attempt, child.pid, " ".join(argv))
        self._write_manifest_async(state, argv)
        return child

    def _write_manifest_async(self, state: AttemptState, argv: list[str]) -> None:
        """Provenance probes (git, the child's torch) must not delay the launch."""
        try:
            from .manifest import collect_manifest, write_manifest
        except ImportError:  # pragma: no cover - manifest is part of the package
            return

        def work() -> None:
            try:
                manifest = collect_manifest(attempt=state.attempt, argv=argv, config=self.cfg,
                                            environ=self.environ, cwd=self.cwd, child_python=None,
                                            run_dir=self.paths.run_dir)
                write_manifest(self.paths.manifest(state.attempt), manifest)
            except Exception as exc:  # provenance is best effort, never fatal
                log.debug("manifest for attempt %d failed: %s", state.attempt, exc)

        thread = threading.Thread(target=work, daemon=True, name="manifest")
        thread.start()
        self._manifest_threads.append(thread)

    def _finish_manifests(self) -> None:
        """Let provenance probes land before exiting: the attempts that die at start (an import
        error after an upgrade) are the ones whose manifest matters most. Bounded: after a stop
        notice only a second, since the deadline wins."""
        budget = 1.0 if self._noticed else 25.0
        end = time.monotonic() + budget
        for thread in self._manifest_threads:
            thread.join(max(end - time.monotonic(), 0.0))

    # ------------------------------------------------------------------ monitoring

    def _monitor(self, child: Child, state: AttemptState) -> ChildExit:
        extractor = StepExtractor(self.cfg.step_regex)
        progress = ProgressTracker(started_at=state.started_at)
        losses = LossTracker(spike_factor=self.cfg.loss_spike_factor)
        watcher = DirWatcher(self.ckpt_dir)
        next_watch = 0.0
        next_poll = self.clock() + self.cfg.preemption.poll_interval
        while True:
            exit_ = child.poll()
            now = self.clock()
            self._drain_lines(child, state, extractor, progress, now)
            self._drain_control(child, state, progress, losses, now)
            if now >= next_watch:
                self._watch_saves(watcher, state, now)
                next_watch = now + WATCH_INTERVAL
            for sig in self.inbox.drain():
                self._on_signal(child, state, sig.signum, sig.received_at, progress)
            if (self.cfg.preemption.poll_interval > 0 and self.slurm.job_id and state.notice is None
                    and now >= next_poll):
                next_poll = now + self.cfg.preemption.poll_interval
                self._poll_preemption(child, state, now, progress)
            if (state.notice is not None and state.deadline_source == "default_grace" and self.slurm.job_id
                    and exit_ is None and state.next_refine <= now < state.refine_until):
                state.next_refine = now + REFINE_INTERVAL
                self._refine_deadline(state, now)
            if state.stop_requested_at is not None and exit_ is None and now >= state.next_stop_broadcast:
                # UDP may drop a datagram: repeat the stop until the child is gone.
                state.next_stop_broadcast = now + 0.5
                assert self.control is not None
                self.control.broadcast("stop", reason="preemption" if state.notice else "stop",
                                       deadline=state.stop_deadline)
            if exit_ is not None:
                time.sleep(0.05)  # datagrams sent just before the exit are still in flight
                self._drain_lines(child, state, extractor, progress, self.clock())
                self._drain_control(child, state, progress, losses, self.clock())
                return exit_
            self._check_health(child, state, progress, now)
            self._advance_stop(child, state, now)
            self.inbox.wait(TICK)

    def _drain_lines(self, child: Child, state: AttemptState, extractor: StepExtractor,
                     progress: ProgressTracker, now: float) -> None:
        for _ in range(5000):
            try:
                _ts, _stream, line = child.lines.get_nowait()
            except Exception:
                break
            match = extractor.match(line)
            if match is None:
                continue
            if match.progress_only:
                progress.observe_counter(match.value, now)  # activity, not the global step
            else:
                self._observe_step(child, state, progress, match.value, now, "regex")

    def _observe_step(self, child: Child, state: AttemptState, progress: ProgressTracker,
                      step: int, now: float, source: str) -> None:
        first = state.observe_step(step, now, source)
        progress.observe(step, now)
        if first and not state.resume_checked:
            self._audit_resume(child, state, step if state.reported_resume_step is None
                               else state.reported_resume_step)
        if now - state.last_progress_event_at >= self.cfg.progress_event_interval:
            state.last_progress_event_at = now
            self._emit(Ev.PROGRESS, attempt=state.attempt, step=state.last_step,
                       rate=progress.rate(now), source=state.step_source)

    def _audit_resume(self, child: Child, state: AttemptState, first_step: int) -> None:
        from .budget import audit_resume

        state.resume_checked = True
        verdict = audit_resume(state.resume_step, first_step, state.resume_path)
        self._emit(Ev.RESUMED, attempt=state.attempt, step=first_step,
                   expected_step=state.resume_step, ok=verdict.ok, reason=verdict.reason)
        if verdict.ok:
            return
        self._emit(Ev.RESUME_MISMATCH, attempt=state.attempt, expected_step=state.resume_step,
                   got_step=first_step, resume_path=state.resume_path, reason=verdict.reason)
        log.error("RESUME AUDIT FAILED: %s", verdict.reason)
        if self.cfg.budget.on_resume_mismatch == "stop":
            state.stopped_reason = f"resume audit failed: {verdict.reason}"
            self._request_stop(child, state, self.clock(), self.clock() + self.cfg.term_timeout,
                               reason="resume audit failed", graceful=False)

    def _drain_control(self, child: Child, state: AttemptState, progress: ProgressTracker,
                       losses: LossTracker, now: float) -> None:
        assert self.control is not None
        for msg in self.control.poll():
            kind, f = msg.kind, msg.fields
            if msg.attempt is not None and msg.attempt != state.attempt:
                continue  # a straggler from an earlier attempt
            state.clients.add(msg.sender)
            if msg.host:
                state.nodes.add(str(msg.host))
            if kind == "heartbeat" and isinstance(f.get("step"), int):
                if msg.rank not in (None, 0):
                    progress.touch(now)  # other ranks prove liveness; rank 0 owns the step
                    continue
                self._observe_step(child, state, progress, f["step"], now, "client")
                loss = (f.get("metrics") or {}).get("loss")
                if isinstance(loss, (int, float)):
                    self._check_loss(child, state, losses, f["step"], float(loss))
            elif kind == "resumed" and isinstance(f.get("step"), int):
                state.reported_resume_step = f["step"]
                if not state.resume_checked:
                    self._audit_resume(child, state, f["step"])
            elif kind == "save_begin":
                progress.touch(now)
                state.in_flight = InFlightSave(path=str(f.get("path")), step=f.get("step"),
                                               started_at=now, bytes_so_far=None, source="client")
                self._emit(Ev.SAVE_BEGIN, attempt=state.attempt, step=f.get("step"),
                           path=f.get("path"), source="client")
            elif kind == "save_end":
                progress.touch(now)
                self._record_save(state, f.get("step"), str(f.get("path")), f.get("bytes"),
                                  f.get("duration"), bool(f.get("ok", True)), "client", now)
            elif kind == "done":
                state.client_done = True
            elif kind == "determinism":
                state.determinism = dict(f.get("settings") or f)
                self._emit(Ev.DETERMINISM, attempt=state.attempt, settings=state.determinism)

    def _record_save(self, state: AttemptState, step: Any, path: str, nbytes: Any, duration: Any,
                     ok: bool, source: str, now: float) -> None:
        step_i = step if isinstance(step, int) else None
        state.saves.append(SaveRecord(step_i, path, nbytes if isinstance(nbytes, int) else None,
                                      float(duration) if isinstance(duration, (int, float)) else None,
                                      ok, source, now))
        state.in_flight = None
        self._emit(Ev.SAVE_END, attempt=state.attempt, step=step_i, path=path, bytes=nbytes,
                   duration=duration, ok=ok, source=source)

    def _watch_saves(self, watcher: DirWatcher, state: AttemptState, now: float) -> None:
        """Zero-code mode: a temp file or a growing checkpoint means a save is in flight."""
        try:
            activity = watcher.poll(now)
        except OSError:
            return
        client_saves = any(s.source == "client" for s in state.saves) or (
            state.in_flight is not None and state.in_flight.source == "client")
        if client_saves:
            return
        for done in activity.completed:
            self._record_save(state, step_from_name(Path(done.path).name), str(done.path), done.bytes,
                              done.duration, True, "watch", now)
        if activity.in_flight and state.in_flight is None:
            state.in_flight = InFlightSave(path=str(activity.path), step=None, started_at=activity.since,
                                           bytes_so_far=activity.bytes, source="watch")
            self._emit(Ev.SAVE_BEGIN, attempt=state.attempt, path=str(activity.path), source="watch")
        elif activity.in_flight and state.in_flight is not None:
            state.in_flight = InFlightSave(path=state.in_flight.path, step=state.in_flight.step,
                                           started_at=state.in_flight.started_at,
                                           bytes_so_far=activity.bytes, source="watch")
        elif not activity.in_flight and state.in_flight is not None and state.in_flight.source == "watch":
            state.in_flight = None

    def _check_loss(self, child: Child, state: AttemptState, losses: LossTracker, step: int,
                    loss: float) -> None:
        verdict = losses.observe(step, loss)
        if verdict is None:
            return
        self._emit(Ev.LOSS_ANOMALY, attempt=state.attempt, step=step, loss=loss,
                   median=verdict.median, kind=verdict.kind, reason=verdict.reason)
        log.warning("loss anomaly at step %d: %s", step, verdict.reason)
        if self.cfg.loss_policy == "stop" and state.stopped_reason is None:
            state.stopped_reason = f"loss anomaly: {verdict.reason}"
            self._request_stop(child, state, self.clock(), self.clock() + self.cfg.term_timeout,
                               reason="loss anomaly", graceful=True)

    def _check_health(self, child: Child, state: AttemptState, progress: ProgressTracker,
                      now: float) -> None:
        if state.stop_requested_at is not None or state.hang:
            return
        if state.in_flight is not None:  # a long save is not a stall
            progress.touch(now)
            return
        stall = progress.is_stalled(now, self.cfg.stall_timeout)
        if stall is not None:
            state.hang = True
            dump = child.dump_stacks(self.paths.stack_dump(state.attempt), STACK_DUMP_SIGNAL)
            self._emit(Ev.STALL, attempt=state.attempt, last_step=state.last_step,
                       idle_s=stall.idle_s, reason=stall.reason, dump=dump)
            log.error("stall: %s; %s", stall.reason, dump)
            child.stop(min(self.cfg.term_timeout, 10.0))
            return
        slow = progress.slowdown(now, self.cfg.slowdown_fraction, self.cfg.slowdown_window)
        if slow is not None and not state.slowdown_active:
            state.slowdown_active = True
            self._emit(Ev.SLOWDOWN, attempt=state.attempt, rate=slow.rate, median_rate=slow.median_rate,
                       fraction=self.cfg.slowdown_fraction, nodes=sorted(state.nodes) or self.slurm.nodelist,
                       reason=slow.reason)
            log.warning("slowdown: %s", slow.reason)
        elif slow is None and state.slowdown_active:
            state.slowdown_active = False

    # ------------------------------------------------------------------ signals and preemption

    def _on_signal(self, child: Child, state: AttemptState, signum: int, received_at: float,
                   progress: ProgressTracker | None = None) -> None:
        if signum == signal.SIGINT:
            self._interrupts += 1
            state.cancelled = True
            if self._interrupts == 1:
                log.warning("interrupted: stopping the child (Ctrl-C again to kill it)")
                child.signal_group(signal.SIGINT)
                state.stop_requested_at = received_at
                state.stop_deadline = received_at + self.cfg.term_timeout
            else:
                child.signal_group(signal.SIGKILL)
            return
        if signum in self._notice_signals:
            self._on_notice(child, state, Notice(source="signal", signal=signal.Signals(signum).name,
                                                 received_at=received_at, deadline=None,
                                                 preempt_time=None, grace=None), progress)
            return
        child.signal_group(signum)  # anything else is the user's business: pass it on

    def _poll_preemption(self, child: Child, state: AttemptState, now: float,
                         progress: ProgressTracker | None = None) -> None:
        info = self._job_info()
        if info is not None and getattr(info, "preempt_time", None):
            self._on_notice(child, state, Notice(source="poll", signal=None, received_at=now,
                                                 deadline=None, preempt_time=None, grace=None), progress)

    def _slurm(self) -> Any:
        """The Slurm backend, created on first use (a local run never needs one)."""
        if self._backend is None:
            self._backend = get_backend()
        return self._backend

    def _job_info(self) -> Any:
        if not self.slurm.job_id:
            return None
        try:
            return self._slurm().job_info(self.slurm.job_id)
        except Exception as exc:  # Slurm unreachable: plan with the default grace
            log.warning("cannot read the Slurm job record: %s", exc)
            return None

    def _on_notice(self, child: Child, state: AttemptState, notice: Notice,
                   progress: ProgressTracker | None = None) -> None:
        """A stop notice: learn the deadline, arbitrate against any save, carry the decision out."""
        if state.notice is not None:
            return  # one notice per attempt; later ones change nothing
        pcfg = self.cfg.preemption
        info = self._job_info()
        notice, deadline = notice_for(notice.source, notice.received_at, info, pcfg.default_grace,
                                      signal_name=notice.signal, time_limit_signal=pcfg.time_limit_signal,
                                      time_limit_warning=pcfg.time_limit_warning)
        now = self.clock()
        state.notice = notice
        state.deadline_source = deadline.source
        state.refine_until, state.next_refine = now + REFINE_WINDOW, now + REFINE_INTERVAL
        self._noticed = True
        self._emit(Ev.NOTICE, attempt=state.attempt, deadline_source=deadline.source,
                   deadline_past=deadline.past, reason=deadline.reason, **notice.to_event())
        self._write_stop_file(notice, "preemption", state.attempt)
        history = SaveHistory.from_events(read_events(self.paths.events).events,
                                          unknown_save_s=pcfg.unknown_save_s)
        self._history = history
        rate = progress.rate(now) if progress is not None else None
        durable = state.last_durable_step
        decision = arbitrate(now, deadline.at, pcfg.margin, state.in_flight, history,
                             emergency_save_allowed=pcfg.emergency_save,
                             client_connected=bool(state.clients), zero_code=not state.clients,
                             step_time_s=(1.0 / rate) if rate else None,
                             steps_since_save=(state.last_step - durable)
                             if state.last_step is not None and durable is not None else None)
        self._emit(Ev.ARBITRATION, attempt=state.attempt, **decision.to_event())
        log.warning("stop notice (%s): %s", notice.signal or notice.source, decision.reason)
        usable = deadline.at - pcfg.margin
        assert self.control is not None
        if decision.decision == SaveDecision.BLOCK:
            state.blocking_until = usable
            state.stop_requested_at = now
            state.stop_deadline = deadline.at
            self.control.broadcast("stop", reason="preemption", deadline=deadline.at, after_save=True)
        elif decision.decision == SaveDecision.ABORT:
            self._abort_save(child, state, decision.reason)
            self._request_stop(child, state, now, deadline.at, reason="preemption", graceful=False)
        elif decision.decision == SaveDecision.EMERGENCY_SAVE:
            self.control.broadcast("save_now", deadline=usable)
            self._request_stop(child, state, now, deadline.at, reason="preemption", graceful=True,
                               send_term=False)
            state.emergency_save_until = usable
        else:
            self._request_stop(child, state, now, deadline.at, reason="preemption", graceful=True)

    def _refine_deadline(self, state: AttemptState, now: float) -> None:
        """Slurm may signal the step a moment before its job record shows PreemptTime/EndTime: a
        notice first planned with the default grace is re-planned once the real deadline is
        readable. Only ever earlier: the block, emergency save and kill times move up with it."""
        info = self._job_info()
        if info is None or not getattr(info, "preempt_time", None) or state.notice is None:
            return
        pcfg = self.cfg.preemption
        notice, deadline = notice_for(state.notice.source, state.notice.received_at, info,
                                      pcfg.default_grace, signal_name=state.notice.signal,
                                      time_limit_signal=pcfg.time_limit_signal,
                                      time_limit_warning=pcfg.time_limit_warning)
        state.deadline_source = deadline.source
        if state.notice.deadline is not None and deadline.at >= state.notice.deadline:
            return
        state.notice = notice
        usable = deadline.at - pcfg.margin
        if state.blocking_until is not None:
            state.blocking_until = usable
        if state.emergency_save_until is not None:
            state.emergency_save_until = min(state.emergency_save_until, usable)
        if state.stop_deadline is not None:
            state.stop_deadline = min(state.stop_deadline, deadline.at)
        state.next_stop_broadcast = now  # tell the clients the new deadline at once
        self._emit(Ev.NOTICE, attempt=state.attempt, refined=True, deadline_source=deadline.source,
                   reason=deadline.reason, **notice.to_event())
        log.warning("deadline refined from Slurm: %s", deadline.reason)

    def _write_stop_file(self, notice: Notice, reason: str, attempt: int) -> None:
        data = {"reason": reason, "deadline": notice.deadline, "signal": notice.signal, "ts": self.clock(),
                "attempt": attempt}
        tmp = self.paths.stop_file.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(data))
            os.replace(tmp, self.paths.stop_file)
        except OSError:
            pass

    def _request_stop(self, child: Child, state: AttemptState, now: float, deadline: float, *,
                      reason: str, graceful: bool, send_term: bool = True) -> None:
        """Tell the child to stop; kill it if it is still alive at the deadline."""
        assert self.control is not None
        if state.stop_requested_at is None:
            state.stop_requested_at = now
            self.control.broadcast("stop", reason=reason, deadline=deadline)
        state.stop_deadline = deadline if state.stop_deadline is None else min(state.stop_deadline, deadline)
        if send_term and state.term_sent_at is None:
            state.term_sent_at = now
            child.signal_group(signal.SIGTERM if graceful else signal.SIGKILL)

    def _abort_save(self, child: Child, state: AttemptState, reason: str) -> None:
        """Stop the writer now. The atomic protocol leaves the previous checkpoint intact; the
        partial file is the writer's temp file (removed) or, in zero-code mode, a torn target that
        the next attempt's resume-point scan quarantines."""
        assert self.control is not None
        path = state.in_flight.path if state.in_flight else None
        self.control.broadcast("abort_save", path=path, reason=reason)
        child.signal_group(signal.SIGKILL)
        state.aborted_save = True
        removed = _remove_our_temp_files(Path(path)) if path else []
        self._emit(Ev.SAVE_ABORTED, attempt=state.attempt, path=path, reason=reason,
                   removed_temp=[str(p) for p in removed])
        state.in_flight = None

    def _advance_stop(self, child: Child, state: AttemptState, now: float) -> None:
        """Carry a stop through: end a block when its save lands (or abort it), then TERM, then KILL."""
        if state.blocking_until is not None:
            if state.in_flight is None:
                state.blocking_until = None
                self._request_stop(child, state, now, state.notice.deadline if state.notice else now,
                                   reason="preemption", graceful=True)
            else:
                history = getattr(self, "_history", None)
                expected = history.expected_remaining(state.in_flight, now) if history else None
                check = after_block(now, state.notice.deadline if state.notice else now,
                                    self.cfg.preemption.margin, state.in_flight.started_at, expected,
                                    in_flight=state.in_flight)
                if check.decision == SaveDecision.ABORT:
                    self._emit(Ev.ARBITRATION, attempt=state.attempt, **check.to_event())
                    state.blocking_until = None
                    self._abort_save(child, state, check.reason)
                    self._request_stop(child, state, now, now, reason="preemption", graceful=False)
            return
        if state.emergency_save_until is not None and state.term_sent_at is None:
            saved = any(s.ok for s in state.saves if s.at >= (state.stop_requested_at or 0))
            if saved or now >= state.emergency_save_until:
                if state.in_flight is not None and now >= state.emergency_save_until:
                    self._abort_save(child, state, "emergency save did not finish before the deadline")
                state.emergency_save_until = None
                state.term_sent_at = now
                child.signal_group(signal.SIGTERM)
                # Give the client a moment to leave cleanly after its save, never past the deadline.
                if state.stop_deadline is not None:
                    state.stop_deadline = min(state.stop_deadline, now + self.cfg.term_timeout)
            return
        if state.stop_deadline is not None and now >= state.stop_deadline:
            if state.term_sent_at is None:
                state.term_sent_at = now
                child.signal_group(signal.SIGTERM)
                state.stop_deadline = now + min(self.cfg.term_timeout, 5.0)
            else:
                child.signal_group(signal.SIGKILL)
                state.stop_deadline = now + 1.0

    # ------------------------------------------------------------------ after the attempt

    def _after_attempt(self, child: Child, exit_: ChildExit, state: AttemptState) -> RunResult | None:
        from .budget import judge, ledger_from_events
        from .failures import classify, with_class
        from .policy import decide

        ended = self.clock()
        if state.notice is None and self.slurm.job_id and exit_.status != 0:
            # In a batch-step layout only the srun step is signalled at grace start: ask Slurm.
            info = self._job_info()
            if info is not None and getattr(info, "preempt_time", None):
                state.notice, _ = notice_for("poll", ended, info, self.cfg.preemption.default_grace)
                self._emit(Ev.NOTICE, attempt=state.attempt, after_exit=True, **state.notice.to_event())
        failure = classify(exit_.exit_code, exit_.signal, child.tail.text(), policy=self.cfg.policy,
                           step_regex=self.cfg.step_regex)
        cls = self._override_class(failure.cls, exit_, state)
        action = failure.action if cls == failure.cls else self.cfg.policy_for(cls).action
        self._emit(Ev.ATTEMPT_END, attempt=state.attempt, exit_code=exit_.exit_code,
                   signal=exit_.signal_name, duration=round(exit_.duration, 3),
                   first_step=state.first_step, last_step=state.last_step,
                   last_durable_step=state.last_durable_step, steps_lost=state.steps_lost()
                   if cls != FailureClass.COMPLETED else 0,
                   wall_lost=round(state.wall_lost(ended), 3) if cls != FailureClass.COMPLETED else 0.0,
                   resume_step=state.resume_step, resume_path=state.resume_path,
                   **{"class": cls.value, "action": action.value if cls != FailureClass.COMPLETED else None})
        if child.line_stats.dropped or child.line_stats.cut:
            self._emit(Ev.WARNING, attempt=state.attempt, reason="output lines not analysed",
                       dropped=child.line_stats.dropped, cut=child.line_stats.cut)
        if cls == FailureClass.COMPLETED:
            return self._end(RunOutcome.COMPLETE, ExitCode.OK, "training complete", state)

        self._emit(Ev.FAILURE, attempt=state.attempt, action=action.value, evidence=list(failure.evidence),
                   context=list(failure.context), step=failure.step if failure.step is not None
                   else state.last_step, last_step=state.last_step,
                   last_durable_step=state.last_durable_step, node=failure.node or socket.gethostname(),
                   rank=failure.rank, exit_code=exit_.exit_code, signal=exit_.signal_name,
                   reason=failure.reason if cls == failure.cls else self._override_reason(cls, state),
                   **{"class": cls.value, "classified_as": failure.cls.value})
        log.warning("attempt %d ended: %s (%s)", state.attempt, cls.value,
                    "; ".join(failure.evidence[:1]) or f"status {exit_.status}")

        if state.stopped_reason is not None:
            return self._end(RunOutcome.STOPPED, ExitCode.STOPPED, state.stopped_reason, state)
        if cls == FailureClass.CANCELLED or state.cancelled:
            return self._end(RunOutcome.INTERRUPTED, 130, "interrupted by a person", state)

        records = ledger_from_events(read_events(self.paths.events).events)
        effective = failure if cls == failure.cls else with_class(failure, cls, self._override_reason(cls, state),
                                                                  self.cfg.policy)
        decision = decide(effective, records[:-1], self.cfg.policy, self.slurm.job_id)
        if decision.action == Action.RESTART:
            verdict = judge(records, self.cfg.budget, self.slurm.job_id)
            self._emit(Ev.BUDGET, attempt=state.attempt, ok=verdict.ok, budget=verdict.budget,
                       reason=verdict.reason, numbers=verdict.numbers)
            if not verdict.ok:
                log.error("budget exhausted: %s", verdict.reason)
                return self._end(RunOutcome.STOPPED, ExitCode.STOPPED,
                                 f"budget {verdict.budget} exhausted: {verdict.reason}", state)
        self._emit(Ev.DECISION, attempt=state.attempt, action=decision.action.value,
                   reason=decision.reason, delay=decision.delay)
        if decision.action == Action.RESTART:
            log.warning("restarting in %.1fs: %s", decision.delay, decision.reason)
            if self._sleep_interruptible(decision.delay):
                return self._requeue(state, FailureClass.PREEMPTED, "notice during restart backoff")
            return None
        if decision.action == Action.REQUEUE:
            return self._requeue(state, cls, decision.reason)
        return self._end(RunOutcome.STOPPED, exit_.status, decision.reason, state)

    def _override_class(self, cls: FailureClass, exit_: ChildExit, state: AttemptState) -> FailureClass:
        """What the supervisor knows beats the text: a notice, a stall, an interrupt."""
        if state.hang:
            return FailureClass.HANG
        if state.cancelled:
            return FailureClass.CANCELLED
        if state.notice is not None:
            if cls == FailureClass.COMPLETED and state.client_done:
                return cls
            return state.notice.failure_class
        if state.stopped_reason is not None and cls == FailureClass.COMPLETED:
            return FailureClass.UNKNOWN
        return cls

    def _override_reason(self, cls: FailureClass, state: AttemptState) -> str:
        if cls == FailureClass.HANG:
            return f"no progress for {self.cfg.stall_timeout:.0f}s after step {state.last_step}"
        if cls in (FailureClass.PREEMPTED, FailureClass.TIME_LIMIT) and state.notice:
            return f"stop notice ({state.notice.signal or state.notice.source})"
        if cls == FailureClass.CANCELLED:
            return "interrupted"
        return state.stopped_reason or cls.value

    def _sleep_interruptible(self, seconds: float) -> bool:
        """Back off before a restart; True when a stop notice arrived meanwhile."""
        end = self.clock() + seconds
        while self.clock() < end:
            self.inbox.wait(min(0.2, max(end - self.clock(), 0)))
            for sig in self.inbox.drain():
                if sig.signum == signal.SIGINT:
                    raise KeyboardInterrupt
                if sig.signum in self._notice_signals:
                    return True
        return False

    def _requeue(self, state: AttemptState, cls: FailureClass, reason: str) -> RunResult:
        """Come back later: through Slurm (explicitly where Slurm will not), else exit 75."""
        info = self._job_info()
        version = None
        if self.slurm.job_id:
            try:
                version = self._slurm().version()
            except Exception:
                version = None
        policy = self.cfg.policy_for(cls)
        exclude: tuple[str, ...] = ()
        if policy.exclude_node:
            exclude = tuple(sorted(state.nodes)) or ((self.slurm.nodename,) if self.slurm.nodename else ())
        job_state = str(getattr(info, "state", "") or "") or None
        decision = decide_requeue(child_outcome=cls, in_slurm=bool(self.slurm.job_id),
                                  job_requeueable=getattr(info, "requeue", None),
                                  slurm_version=version, notice=state.notice,
                                  already_requeued=False, job_state=job_state,
                                  policy=self.cfg.preemption.requeue,
                                  requeue_on_time_limit=self.cfg.preemption.requeue_on_time_limit,
                                  exclude_nodes=exclude)
        self._emit(Ev.REQUEUE, attempt=state.attempt, job_id=self.slurm.job_id, **decision.to_event())
        result = self._end(RunOutcome.REQUEUE, ExitCode.REQUEUE, f"{cls.value}: {reason}; {decision.reason}",
                           state)
        if decision.do and decision.how == "scontrol" and self.slurm.job_id and self._backend is not None:
            # run_end is already written: scontrol requeue ends this job step at once. The exclude
            # list is changed by the facade after the requeue (22.05 refuses it on a running job).
            try:
                outcome = self._backend.requeue(self.slurm.job_id, expected_restarts=self.slurm.restart_count,
                                                exclude=list(decision.exclude))
                self._emit(Ev.REQUEUE, attempt=state.attempt, job_id=self.slurm.job_id, how="scontrol",
                           ok=outcome.ok, result=outcome.reason,
                           exclude_error=getattr(outcome, "exclude_error", None))
            except Exception as exc:
                self._emit(Ev.REQUEUE, attempt=state.attempt, job_id=self.slurm.job_id, how=decision.how,
                           ok=False, reason=str(exc))
                log.error("requeue failed: %s", exc)
        return result

    def _end(self, outcome: RunOutcome, code: int, reason: str, state: AttemptState) -> RunResult:
        self._emit(Ev.RUN_END, outcome=outcome.value, exit_code=code, reason=reason,
                   attempts=state.attempt, last_step=state.last_step)
        log.info("run %s (exit %d): %s", outcome.value, code, reason)
        return RunResult(outcome, code, reason)

    def _record_dropped(self) -> None:
        assert self.control is not None
        dropped = self.control.stats.dropped
        if sum(dropped.values()):
            self._emit(Ev.CONTROL_DROPPED, count=sum(dropped.values()), by_reason=dict(dropped))


STALE_TEMP_S = 30.0
_OUR_TEMP = re.compile(r"^\..+\.tmp-(?P<pid>\d+)-[0-9a-f]{8}$")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_our_temp_files(target: Path) -> list[Path]:
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
