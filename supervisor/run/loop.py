"""The run loop: set up, run attempts until the training completes, policy stops it, or the job
must come back later; then tear down. One ``Runner.run()`` covers one job's share of a run.

Everything that decides is pure and lives elsewhere (:mod:`.stop`, :mod:`.judge`, the policy,
budget and preemption modules); this module carries decisions out. The world reaches it only
through the seams of :mod:`.seams`, which tests replace with fakes (``tests/fakes.py``).
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from .. import __version__
from ..child import ChildExit, ChildSpec, resolve_command
from ..config import SupervisorConfig
from ..control import ControlServer, new_token
from ..errors import ExitCode, UsageError
from ..events import Ev, EventLog
from ..failures import classify
from ..ledger import newest_save
from ..lock import RunLock
from ..signals import SignalInbox, signal_number
from ..slurm.requeue_policy import (
    STAY_AFTER_DEADLINE_S, RequeueCallPlan, RequeueFacts, RequeueFallback, RequeueHow, call_deadline, plan_requeue_call,
    requeue_decision, settle_read_timeout,
)
from ..slurm.stop_cause import StopCause
from ..slurm.version import version_or_none
from ..slurm import SlurmEnv, get_backend
from ..states import Action, FailureClass, RunOutcome
from . import notice as notices
from .attempt import AttemptState
from .context import EventSink, RunContext
from .hooks import AddOn, AddOns
from .judge import AttemptFacts, AttemptVerdict, child_exit_text, failure_step, judge_attempt
from .layout import child_plan, layout_for
from .monitor import monitor
from .seams import BackgroundSlurm, ChildHandle, ChildStarter, Clock, InboxWaker, SlurmView, SupervisorClock, Waker
from .seams import start_process
from .start import check_durable_history, start_state
from .stop import CauseKind

log = logging.getLogger("supervisor.run")

SETTLE_TIMEOUT = 5.0  # seconds to wait for Slurm's job record after the child ended


@dataclass(frozen=True)
class RunResult:
    outcome: RunOutcome
    exit_code: int
    reason: str


class Runner:
    """Runs attempts of the child until it completes, policy stops it, or the job must requeue.

    ``clock``, ``waker``, ``start_child``, ``slurm`` and ``channel`` are the seams; left out, the
    real ones are used (the supervisor's monotonic clock, the signal inbox, real processes, Slurm's
    CLI on a worker thread, the UDP control channel). ``add_ons``: what the run reaches through the
    hooks of :mod:`.hooks` (the GPU check, the node ledger, the manifest); none by default, and the
    loop runs the same without them (``supervisor/cli/run_cmd.py`` gives a full run its add-ons)."""

    def __init__(self, cfg: SupervisorConfig, argv: Sequence[str], *, environ: Mapping[str, str] | None = None,
                 cwd: Path | None = None, echo: bool = True, clock: Clock | None = None,
                 waker: Waker | None = None, start_child: ChildStarter | None = None,
                 slurm: SlurmView | None = None, channel: Any = None, sinks: Sequence[EventSink] = (),
                 add_ons: Sequence[AddOn] = ()) -> None:
        if not argv:
            raise UsageError("missing the training command after '--' (e.g. supervise run -- python train.py)")
        env = dict(os.environ if environ is None else environ)
        cwd = Path(cwd or os.getcwd())
        slurm_env = SlurmEnv.from_environ(env)
        self._clock = clock or SupervisorClock()
        self._inbox: SignalInbox | None = None
        if waker is None:
            sigs: set[int] = {signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2}
            sigs |= {signal_number(s) for s in cfg.preemption.signals}
            self._inbox = SignalInbox(sigs, clock=self._clock.now)
            waker = InboxWaker(self._inbox)
        self._own_channel = channel is None
        self._server: ControlServer | None = None  # the channel run() opened (own channel); teardown closes it
        self.add_ons = AddOns(add_ons)
        self.ctx = RunContext(cfg=cfg, argv=list(argv), environ=env, layout=layout_for(cfg, argv, env, cwd),
                              slurm_env=slurm_env, clock=self._clock, waker=waker,
                              start_child=start_child or start_process,
                              slurm=slurm or BackgroundSlurm(slurm_env.job_id, get_backend), channel=channel,
                              echo=echo, host=socket.gethostname(), cwd=cwd, sinks=list(sinks))
        self.cwd = cwd
        self._child: ChildHandle | None = None

    @property
    def paths(self) -> Any:
        return self.ctx.layout.paths

    # ------------------------------------------------------------------ set-up and tear-down

    def _check_inputs(self) -> None:
        """Bad input is found before anything is written outside the run directory."""
        ctx = self.ctx
        if resolve_command(ctx.argv, ctx.environ) is None:
            raise UsageError(f"command not found or not executable: {ctx.argv[0]!r} (check the spelling and PATH)")
        ckpt = ctx.layout.ckpt_dir
        if ckpt.exists() and not ckpt.is_dir():
            raise UsageError(f"checkpoint directory {ckpt} exists and is not a directory; "
                             "pass --checkpoint-dir pointing to a directory")
        try:
            self.paths.supervisor_dir.mkdir(parents=True, exist_ok=True)
            probe = self.paths.supervisor_dir / f".write-test-{os.getpid()}"
            probe.write_text("")
            probe.unlink()
        except OSError as exc:
            raise UsageError(f"run directory {self.paths.run_dir} is not writable ({exc.strerror}); "
                             "pass a writable --run-dir") from None

    def run(self) -> RunResult:
        ctx = self.ctx
        self._check_inputs()
        lock = RunLock(self.paths.lock, self.paths.lock_owner)
        lock.acquire(ctx.environ)
        ctx.lock = lock
        try:
            ctx.events = EventLog(self.paths.events, clock=self._clock.now)
            if self._own_channel:
                server = ControlServer(new_token(), environ=ctx.environ, clock=self._clock.now)
                server.start()
                self._server = server
                ctx.channel, ctx.control_key = server, server.token
            if self._inbox is not None:
                self._inbox.install()
            try:
                result = self._run_attempts()
            except KeyboardInterrupt:
                result = self._end(RunOutcome.INTERRUPTED, 130, "interrupted", None)
            except Exception as exc:
                # A bug of ours must not leave a training child running unsupervised.
                ctx.emit(Ev.RUN_END, outcome=RunOutcome.FAILED.value, exit_code=ExitCode.FAILED,
                         reason=f"supervisor internal error: {type(exc).__name__}: {exc}")
                raise
            return result
        finally:
            self._teardown(lock)

    def _teardown(self, lock: RunLock) -> None:
        ctx = self.ctx
        child = self._child
        if child is not None and child.poll() is None:
            child.signal_group(signal.SIGKILL)
        self.add_ons.at_teardown(ctx.noticed)  # background work of the add-ons lands, bounded
        if self._inbox is not None:
            self._inbox.uninstall()
            for signum in ctx.notice_signals | {signal.SIGUSR2}:
                # A late notice (a warning that lands after "run complete") must not kill the
                # supervisor on its way out: that turns a finished job into a FAILED one.
                try:
                    signal.signal(signum, signal.SIG_IGN)
                except (OSError, ValueError):
                    pass
        if self._server is not None:
            self._record_dropped()
            self._server.close()
        if ctx.events is not None:
            ctx.events.close()
        try:
            self.paths.stop_file.unlink()
        except OSError:
            pass
        lock.release()

    # ------------------------------------------------------------------ the attempt loop

    def _run_attempts(self) -> RunResult:
        ctx = self.ctx
        previous = ctx.read_events()
        ctx.begin(previous)  # the ledger, the save history and the history sinks, from this one read
        attempt_no = max((e.get("attempt") for e in previous if e.event == Ev.ATTEMPT_START.value
                          and isinstance(e.get("attempt"), int)), default=0)
        del previous  # the ledger, the save history and the sinks hold what the run needs of it
        # What was read at start lives as long as the run: out of the collector's sight, so that a
        # collection on the notice path does not walk a long run's history (docs/benchmarks.md).
        gc.freeze()
        ctx.emit(Ev.RUN_START, name=ctx.layout.name, run_dir=str(self.paths.run_dir),
                 checkpoint_dir=str(ctx.layout.ckpt_dir), argv=ctx.argv, config_hash=ctx.cfg.config_hash(),
                 host=ctx.host, pid=os.getpid(), job_id=ctx.slurm_env.job_id,
                 restart_count=ctx.slurm_env.restart_count, version=__version__,
                 control=getattr(ctx.channel, "address", None), **_backend_fields(ctx.slurm))
        ctx.layout.ckpt_dir.mkdir(parents=True, exist_ok=True)
        while True:
            attempt_no += 1
            state = start_state(ctx, attempt_no)
            if state.resume_path is None:  # nothing to hand over: a start from scratch must not lose a save
                state.elsewhere_before = newest_save(ctx.save_events())
            missing = check_durable_history(ctx, state)
            if missing is not None:
                return self._end(RunOutcome.STOPPED, ExitCode.STOPPED, missing, state, stopped_by="resume_audit")
            fault = self.add_ons.before_attempt(ctx, state)  # the GPU preflight, where it is wired
            if fault is not None:
                state.peers.nodes.add(fault.node)
                state.health.exclude.add(fault.node)
                return self._requeue(state, FailureClass.HARDWARE_FAULT, fault.reason)
            child = self._launch(state)
            exit_ = monitor(ctx, child, state, self.add_ons)
            child.finish()
            result = self._after_attempt(child, exit_, state)
            if result is not None:
                return result

    def _launch(self, state: AttemptState) -> ChildHandle:
        ctx = self.ctx
        try:
            self.paths.stop_file.unlink()
        except OSError:
            pass
        plan = child_plan(ctx.cfg, ctx.argv, ctx.environ, ctx.layout, attempt=state.attempt,
                          resume_path=state.resume_path, resume_step=state.resume_step,
                          control_address=getattr(ctx.channel, "address", ""), control_key=ctx.control_key)
        spec = ChildSpec(argv=list(plan.argv), env=plan.env, cwd=self.cwd,
                         log_path=self.paths.attempt_log(state.attempt),
                         tail_bytes=ctx.cfg.tail_bytes, max_line_bytes=ctx.cfg.max_line_bytes, echo=ctx.echo,
                         **_shield_kwargs(plan.shield_signals))
        child = ctx.start_child(spec)
        self._child = child
        ctx.emit(Ev.ATTEMPT_START, attempt=state.attempt, argv=list(plan.argv), pid=child.pid, host=ctx.host,
                 job_id=ctx.slurm_env.job_id, restart_count=ctx.slurm_env.restart_count,
                 nodes=list(ctx.slurm_env.node_names) or None, resume_path=state.resume_path,
                 resume_step=state.resume_step, resume_note=plan.resume_note)
        log.info("attempt %d started (pid %s): %s", state.attempt, child.pid, " ".join(plan.argv))
        self.add_ons.on_launch(ctx, state, list(plan.argv))  # the manifest, where it is wired
        return child

    # ------------------------------------------------------------------ after the attempt

    def _after_attempt(self, child: ChildHandle, exit_: ChildExit, state: AttemptState) -> RunResult | None:
        ctx = self.ctx
        ended = ctx.clock.now()
        if state.stop.is_(CauseKind.LOCK_LOST):
            return self._end(RunOutcome.STOPPED, ExitCode.LOCKED, f"run directory taken over: {state.stop.why}",
                             state, stopped_by="lock")
        if ctx.slurm_env.job_id and (state.notice is not None or exit_.status != 0):
            info = ctx.slurm.job_info_now(self._settle_timeout(state))
            if state.notice is None and info is not None and getattr(info, "preempt_time", None):
                # In a batch-step layout only the srun step is signalled at grace start.
                notices.on_notice(ctx, child, state, "poll", None, ended, None)
            state.slurm.verdict = notices.read_stop_cause(ctx, state.notice, self._settle_timeout(state))
            if state.slurm.verdict is not None:
                ctx.emit(Ev.STOP_CAUSE, attempt=state.attempt, **state.slurm.verdict.to_event())
        notice_cls, notice_reason = notices.settle_cause(state.notice, state.slurm.verdict, exit_.status)
        evidence = notices.slurm_evidence(state.notice, state.slurm.verdict, notice_cls, bool(ctx.slurm_env.job_id))
        failure = classify(exit_.exit_code, exit_.signal, child.tail_text(),
                           step_regex=ctx.cfg.step_regex, slurm=evidence)
        facts = AttemptFacts(cause=state.stop.cause, notice_class=notice_cls, notice_reason=notice_reason,
                             client_done=state.peers.client_done)
        # attempt_end first, so the ledger the decision reads includes this attempt.
        from .judge import effective_class

        cls, _ = effective_class(failure, facts)
        done = cls is FailureClass.COMPLETED
        ctx.emit(Ev.ATTEMPT_END, attempt=state.attempt, exit_code=exit_.exit_code, signal=exit_.signal_name,
                 duration=round(exit_.duration, 3), first_step=state.first_step, last_step=state.last_step,
                 last_durable_step=state.last_durable_step, steps_lost=0 if done else state.steps_lost(),
                 wall_lost=0.0 if done else round(state.wall_lost(ended), 3), resume_step=state.resume_step,
                 resume_path=state.resume_path, step_source=state.step_source,
                 **{"class": cls.value, "action": None}, **_claim(failure))
        dropped, cut = child.lines_not_analysed()
        if dropped or cut:
            ctx.emit(Ev.WARNING, attempt=state.attempt, reason="output lines not analysed", dropped=dropped, cut=cut)
        records = ctx.ledger_now().records()  # from memory: the log is not read again
        verdict = judge_attempt(failure, facts, records[:-1], records, ctx.cfg.policy, ctx.cfg.budget,
                                ctx.slurm_env.job_id, exit_.status)
        if not done:
            self._record_failure(state, exit_, failure, verdict)
        return self._carry_out(state, verdict, exit_)

    def _record_failure(self, state: AttemptState, exit_: ChildExit, failure: Any, verdict: AttemptVerdict) -> None:
        ctx = self.ctx
        eff = verdict.failure
        action = Action.STOP if verdict.outcome in (RunOutcome.STOPPED, RunOutcome.INTERRUPTED) else verdict.action
        ctx.emit(Ev.FAILURE, attempt=state.attempt, action=(action or Action.STOP).value,
                 evidence=list(failure.evidence), context=list(failure.context),
                 step=failure_step(failure.step, state.last_step), last_step=state.last_step,
                 last_durable_step=state.last_durable_step, node=failure.node or ctx.host, rank=failure.rank,
                 exit_code=exit_.exit_code, signal=exit_.signal_name, reason=eff.reason,
                 **{"class": verdict.cls.value, "classified_as": failure.cls.value}, **_claim(failure))
        log.warning("attempt %d ended: %s (%s)", state.attempt, verdict.cls.value,
                    "; ".join(failure.evidence[:1]) or f"status {exit_.status}")
        self.add_ons.on_failure_recorded(ctx, state, failure, verdict.cls, eff.reason)

    def _carry_out(self, state: AttemptState, verdict: AttemptVerdict, exit_: ChildExit | None = None
                   ) -> RunResult | None:
        ctx = self.ctx
        if verdict.budget is not None:
            b = verdict.budget
            ctx.emit(Ev.BUDGET, attempt=state.attempt, ok=b.ok, budget=b.budget, reason=b.reason, numbers=b.numbers)
            if not b.ok:
                log.error("budget exhausted: %s", b.reason)
        if verdict.decision is not None and (verdict.budget is None or verdict.budget.ok):
            ctx.emit(Ev.DECISION, attempt=state.attempt, action=verdict.decision.action.value,
                     reason=verdict.decision.reason, delay=verdict.decision.delay)
        if verdict.outcome is None:
            log.warning("restarting in %.1fs: %s", verdict.delay, verdict.reason)
            if self._backoff(verdict.delay):
                return self._requeue(state, FailureClass.PREEMPTED, "notice during restart backoff")
            return None
        if verdict.outcome is RunOutcome.REQUEUE:
            return self._requeue(state, verdict.cls, verdict.reason)
        exceeded = verdict.budget.budget if verdict.outcome is RunOutcome.COMPLETE and verdict.budget is not None \
            and not verdict.budget.ok else None
        return self._end(verdict.outcome, verdict.exit_code, verdict.reason, state, stopped_by=verdict.stopped_by,
                         child=exit_, budget_exceeded=exceeded)

    def _backoff(self, seconds: float) -> bool:
        """Wait before a restart; True when a stop notice arrived meanwhile."""
        ctx = self.ctx
        end = ctx.clock.now() + seconds
        while ctx.clock.now() < end:
            ctx.waker.wait(min(0.2, max(end - ctx.clock.now(), 0.0)))
            for sig in ctx.waker.drain():
                if sig.signum == signal.SIGINT:
                    raise KeyboardInterrupt
                if sig.signum in ctx.notice_signals:
                    ctx.noticed = True
                    return True
        return False

    def _requeue(self, state: AttemptState, cls: FailureClass, reason: str) -> RunResult:
        """Come back later: through Slurm (explicitly where Slurm will not), else exit 75."""
        ctx = self.ctx
        job_id = ctx.slurm_env.job_id
        info = ctx.slurm.job_info_now(self._settle_timeout(state)) if job_id else None
        version = ctx.slurm.version() if job_id else None
        policy = ctx.cfg.policy_for(cls)
        exclude: tuple[str, ...] = ()
        if state.health.exclude:  # the supervisor named the node (a failed GPU check, a slow node)
            exclude = tuple(sorted(state.health.exclude))
        elif policy.exclude_node:
            exclude = tuple(sorted(state.peers.nodes)) or ((ctx.slurm_env.nodename,) if ctx.slurm_env.nodename else ())
        if job_id:
            exclude = self.add_ons.nodes_to_exclude(ctx, state, exclude)  # the node ledger's, where it is wired
        verdict = state.slurm.verdict
        already = verdict is not None and verdict.cause is StopCause.REQUEUED
        known = version_or_none(version)
        notice = state.notice
        decision = requeue_decision(RequeueFacts(
            child_outcome=cls, in_slurm=bool(job_id), job_requeueable=getattr(info, "requeue", None),
            slurm_version=known, notice_class=notice.failure_class if notice is not None else None,
            already_requeued=already, policy=ctx.cfg.preemption.requeue,
            requeue_on_time_limit=ctx.cfg.preemption.requeue_on_time_limit, exclude_nodes=exclude,
            job_state=str(getattr(info, "state", "") or "") or None,
            restarts=(getattr(info, "restarts", 0) or 0) if info is not None else None,
            job_id=getattr(info, "job_id", "JOB") if info is not None else None))
        held_next = decision.held
        if held_next:
            ctx.emit(Ev.WARNING, attempt=state.attempt, reason=held_next, held=True,
                     command=f"scontrol release {job_id}")
            log.error("%s", held_next)
        ctx.emit(Ev.REQUEUE, attempt=state.attempt, job_id=job_id,
                 held=bool(getattr(info, "is_held", False)) or bool(held_next), **decision.to_event())
        result = self._end(RunOutcome.REQUEUE, ExitCode.REQUEUE, f"{cls.value}: {reason}; {decision.reason}", state)
        if decision.do and decision.how is RequeueHow.SCONTROL and job_id:
            # run_end is already written: scontrol requeue ends this job step at once. The exclude
            # list is changed by the facade after the requeue (22.05 refuses it on a running job).
            plan = plan_requeue_call(ctx.clock.now(), notice.deadline if notice is not None else None,
                                     ctx.cfg.preemption.margin, notice.failure_class if notice is not None else cls,
                                     known, getattr(info, "requeue", None))
            self._call_requeue(state, decision.exclude, plan)
        return result

    def _settle_timeout(self, state: AttemptState) -> float:
        """A job-record read after the child ended: bounded so that the requeue call still has its
        time before the grace deadline (supervisor/slurm/requeue_policy.py)."""
        notice = state.notice
        if notice is None or notice.deadline is None:
            return SETTLE_TIMEOUT
        deadline = call_deadline(notice.deadline, self.ctx.cfg.preemption.margin)
        return min(SETTLE_TIMEOUT, settle_read_timeout(self.ctx.clock.now(), deadline))

    def _call_requeue(self, state: AttemptState, exclude: tuple[str, ...], plan: RequeueCallPlan) -> None:
        """``scontrol requeue``, done by the plan's deadline; where it cannot be, what Slurm will do
        is relied on, and on 22.05-23.11 that means staying alive until the grace ends."""
        ctx = self.ctx
        job_id = ctx.slurm_env.job_id
        call: _RequeueCall | None = None
        if plan.call:
            call = _RequeueCall(ctx.slurm, ctx.slurm_env.restart_count, exclude)
            self._wait_for_call(call, ctx.clock.now() + plan.timeout)
            if call.outcome is not None:
                outcome = call.outcome
                ctx.emit(Ev.REQUEUE, attempt=state.attempt, job_id=job_id, how="scontrol", ok=outcome.ok,
                         result=outcome.reason, exclude_error=getattr(outcome, "exclude_error", None))
                if outcome.ok or plan.fallback is not RequeueFallback.STAY_FOR_SLURM:
                    return
            else:
                why = str(call.error) if call.error is not None else (
                    f"scontrol requeue did not answer within {plan.timeout:g} s (its deadline, before the grace ends)")
                ctx.emit(Ev.REQUEUE, attempt=state.attempt, job_id=job_id, how="scontrol", ok=False, reason=why,
                         fallback=plan.fallback.value, deadline=plan.deadline)
                log.error("requeue failed: %s", why)
        else:
            ctx.emit(Ev.REQUEUE, attempt=state.attempt, job_id=job_id, how="scontrol", ok=False, called=False,
                     reason=plan.reason, fallback=plan.fallback.value, deadline=plan.deadline)
            log.error("requeue not called: %s", plan.reason)
        if plan.fallback is RequeueFallback.STAY_FOR_SLURM:
            self._stay_for_slurm(state, call, exclude, plan)
        elif plan.fallback is RequeueFallback.SLURM_REQUEUES_EXIT:
            log.warning("relying on Slurm: %s", plan.reason)

    def _wait_for_call(self, call: _RequeueCall, until: float) -> None:
        """Wait for the call on the run's clock; a person's Ctrl-C ends the wait (other signals change nothing:
        the stop is already under way)."""
        ctx = self.ctx
        while not call.finished() and ctx.clock.now() < until:
            ctx.waker.wait(min(0.1, max(until - ctx.clock.now(), 0.0)))
            if any(sig.signum == signal.SIGINT for sig in ctx.waker.drain()):
                return

    def _stay_for_slurm(self, state: AttemptState, call: _RequeueCall | None, exclude: tuple[str, ...],
                        plan: RequeueCallPlan) -> None:
        """On 22.05-23.11 a preempted job that exits during its grace is finished, not requeued; one
        still running when the grace ends is requeued by Slurm. So the supervisor stays, asking
        again for the requeue, until the call succeeds, Slurm's end-of-grace kill comes (a signal
        after the deadline, or SIGKILL), a person interrupts, or ``stay_until`` passes."""
        ctx = self.ctx
        job_id = ctx.slurm_env.job_id
        until = plan.stay_until if plan.stay_until is not None else ctx.clock.now()
        notice = state.notice
        grace_end = notice.deadline if notice is not None and notice.deadline is not None else ctx.clock.now()
        ctx.emit(Ev.REQUEUE, attempt=state.attempt, job_id=job_id, how="slurm_end_of_grace", staying=True,
                 reason=plan.reason, grace_deadline=grace_end, stay_until=until)
        log.warning("staying until the grace ends so that Slurm requeues the job: %s", plan.reason)
        next_try = ctx.clock.now()
        while ctx.clock.now() < until:
            if call is not None and call.outcome is not None and call.outcome.ok:
                ctx.emit(Ev.REQUEUE, attempt=state.attempt, job_id=job_id, how="scontrol", ok=True, late=True,
                         result=call.outcome.reason, exclude_error=getattr(call.outcome, "exclude_error", None))
                return
            if (call is None or call.finished()) and ctx.clock.now() >= next_try:
                call = _RequeueCall(ctx.slurm, ctx.slurm_env.restart_count, exclude)  # idempotent: asked again
                next_try = ctx.clock.now() + STAY_RETRY_S
            ctx.waker.wait(0.2)
            for sig in ctx.waker.drain():
                if sig.signum == signal.SIGINT or (sig.signum in ctx.notice_signals
                                                   and ctx.clock.now() >= grace_end - 1.0):
                    what = "interrupted by a person" if sig.signum == signal.SIGINT else \
                        f"{signal.Signals(sig.signum).name} at the end of the grace: Slurm's own requeue"
                    ctx.emit(Ev.REQUEUE, attempt=state.attempt, job_id=job_id, how="slurm_end_of_grace",
                             staying=False, reason=what)
                    return
        ctx.emit(Ev.REQUEUE, attempt=state.attempt, job_id=job_id, how="slurm_end_of_grace", staying=False,
                 reason=f"stayed {STAY_AFTER_DEADLINE_S:g} s past the grace deadline and neither the requeue call "
                        "nor Slurm's kill came: leaving (exit 75 for a resubmission loop)")

    def _end(self, outcome: RunOutcome, code: int, reason: str, state: AttemptState | None,
             stopped_by: str | None = None, child: ChildExit | None = None,
             budget_exceeded: str | None = None) -> RunResult:
        """``exit_code`` is supervise's own (errors.ExitCode); the child's status, when it has one,
        goes beside it as ``child_exit_code`` / ``child_signal``, never in its place."""
        extra: dict[str, Any] = {}
        if child is not None:
            extra = {"child_exit_code": child.exit_code, "child_signal": child.signal_name}
        if budget_exceeded:
            extra["budget_exceeded"] = budget_exceeded
        self.ctx.emit(Ev.RUN_END, outcome=outcome.value, exit_code=code, reason=reason,
                      attempts=state.attempt if state else None, last_step=state.last_step if state else None,
                      stopped_by=stopped_by, **extra)
        said = f"; {child_exit_text(child.exit_code, child.signal)}" if child is not None and \
            (child.exit_code or child.signal) and "the child " not in reason else ""
        if budget_exceeded:
            log.error("TRAINING COMPLETE WITH A BUDGET EXCEEDED: %s", reason)
        log.info("run %s: %s%s; supervise exits %d", outcome.value, reason, said, code)
        return RunResult(outcome, code, reason)

    def _record_dropped(self) -> None:
        stats = getattr(self.ctx.channel, "stats", None)
        dropped = getattr(stats, "dropped", None) or {}
        if sum(dropped.values()):
            self.ctx.emit(Ev.CONTROL_DROPPED, count=sum(dropped.values()), by_reason=dict(dropped))


STAY_RETRY_S = 2.0  # while staying for Slurm: ask for the requeue again this often (it is idempotent)


class _RequeueCall:
    """One ``scontrol requeue`` on a daemon thread: the loop waits for it on its own clock, so a
    hanging controller holds nothing, and a late answer is still seen."""

    def __init__(self, slurm: SlurmView, restart_count: int | None, exclude: tuple[str, ...]) -> None:
        self.outcome: Any = None
        self.error: BaseException | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._work, args=(slurm, restart_count, exclude), daemon=True,
                                        name="requeue-call")
        self._thread.start()

    def _work(self, slurm: SlurmView, restart_count: int | None, exclude: tuple[str, ...]) -> None:
        try:
            self.outcome = slurm.requeue(restart_count, exclude)
        except Exception as exc:
            self.error = exc
        finally:
            self._done.set()

    def finished(self) -> bool:
        return self._done.is_set()


def _claim(failure: Any) -> dict[str, Any]:
    """The event field for a scheduler cause the output printed and Slurm did not confirm."""
    claim = getattr(failure, "text_claim", None)
    return {"text_claim": claim} if claim else {}


def _shield_kwargs(signals: tuple[int, ...]) -> dict[str, Any]:
    """``ChildSpec``'s shield option, where the child module offers it."""
    fields = getattr(ChildSpec, "__dataclass_fields__", {})
    return {"shield_signals": signals} if "shield_signals" in fields and signals else {}


def _backend_fields(slurm: Any) -> dict[str, str]:
    """``slurm_backend`` / ``slurm_backend_reason`` for run_start: which Slurm backend (cli, pyslurm)
    this run uses and why (supervisor/slurm/choice.py); nothing in a local run."""
    ask = getattr(slurm, "backend_choice", None)
    choice = ask() if callable(ask) else None
    if choice is None:
        return {}
    return {"slurm_backend": choice.name, "slurm_backend_reason": choice.reason}
