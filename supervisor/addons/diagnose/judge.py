"""The verdict on a rerun (pure): reproduced or not, where, and how to say it to a person."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ...states import FailureClass
from .parse import (
    KernelAssert,
    PythonFrame,
    SanitizerFinding,
    parse_kernel_asserts,
    parse_sanitizer,
    parse_tracebacks,
    pick_traceback,
    sanitizer_api_errors,
)
from ...redact import redact_text
from ...textsafe import printable
from .environment import env_differences
from .plan import DIAGNOSABLE, EXIT_LOCATED, EXIT_NOT_LOCATED, DiagnosisOutcome, DiagnosisPlan


@dataclass(frozen=True)
class RerunResult:
    """How the bounded rerun ended (what :func:`run_bounded` observed)."""

    started: bool
    exit_code: int | None
    signal: int | None
    duration: float
    first_step: int | None
    last_step: int | None
    stopped_by: str | None  # "steps" | "time" when a bound ended it; None when it ended by itself
    output: str  # the tail of the output (and the sanitizer records)
    log_path: str
    start_error: str | None = None


@dataclass(frozen=True)
class Diagnosis:
    """What the rerun showed, next to the original failure."""

    outcome: DiagnosisOutcome
    located: bool
    reason: str
    attempt: int
    original_class: str
    original_step: int | None
    original_evidence: tuple[str, ...]
    checkpoint: str | None
    checkpoint_step: int | None
    rerun_class: str | None
    exit_code: int | None
    signal: int | None
    duration: float
    first_step: int | None
    last_step: int | None
    kernel: str | None
    access: str | None  # the sanitizer's error line, or the kernel assertion
    kernel_source: str | None
    launch_site: str | None  # the Python line that launched the kernel, from the sanitizer's host backtrace
    python_frame: PythonFrame | None
    python_stack: tuple[PythonFrame, ...]
    python_error: str | None
    sanitizer_findings: tuple[SanitizerFinding, ...]
    kernel_asserts: tuple[KernelAssert, ...]
    api_errors: tuple[str, ...]
    tools: tuple[str, ...]
    sanitizer_note: str | None
    scratch: str
    log_path: str
    argv: tuple[str, ...]
    redirected: tuple[str, ...]
    checkpoint_dir_changes: tuple[str, ...]
    environment_source: str | None = None  # "recorded by attempt 1", or why this shell's was used
    environment_differences: tuple[str, ...] = ()  # variables whose rerun value differs from the recording
    redacted_args: tuple[str, ...] = ()  # the command's arguments recorded only as [REDACTED]

    @property
    def exit_code_for_cli(self) -> int:
        return EXIT_LOCATED if self.located else EXIT_NOT_LOCATED

    def to_event(self) -> dict[str, Any]:
        """The ``diagnosis`` event's fields (docs/node-health.md lists them)."""
        frame = self.python_frame
        return {
            "attempt": self.attempt, "class": self.original_class, "failure_step": self.original_step,
            "evidence": list(self.original_evidence[:3]), "outcome": self.outcome.value, "located": self.located,
            "reason": self.reason, "checkpoint": self.checkpoint, "checkpoint_step": self.checkpoint_step,
            "rerun_class": self.rerun_class, "exit_code": self.exit_code, "signal": self.signal,
            "duration": round(self.duration, 3), "first_step": self.first_step, "last_step": self.last_step,
            "kernel": self.kernel, "access": self.access, "kernel_source": self.kernel_source,
            "launch_site": self.launch_site,
            "python_file": frame.file if frame else None, "python_line": frame.line if frame else None,
            "python_function": frame.function if frame else None, "python_code": frame.code if frame else None,
            "python_stack": [f"{f.file}:{f.line} in {f.function}" for f in self.python_stack[-4:]],
            "python_error": self.python_error, "api_errors": list(self.api_errors[:3]), "tools": list(self.tools),
            "sanitizer_note": self.sanitizer_note, "scratch": self.scratch, "log": self.log_path,
            "argv": list(self.argv), "redirected": list(self.redirected),
            "checkpoint_dir_changes": list(self.checkpoint_dir_changes),
            "environment_source": self.environment_source,
            "environment_differences": list(self.environment_differences), "redacted_args": list(self.redacted_args),
        }

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["outcome"] = self.outcome.value
        data["exit_code_for_cli"] = self.exit_code_for_cli
        return data


def judge_rerun(plan: DiagnosisPlan, result: RerunResult, *, sanitizer_note: str | None = None,
                checkpoint_dir_changes: Sequence[str] = (), tools: Sequence[str] | None = None,
                argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> Diagnosis:
    """Compare the rerun with the failure it was meant to reproduce, and say where it failed.
    ``tools``/``argv``/``env``: what the judged run really ran with, when not the plan's (a plain
    rerun after the sanitizer could not run). The same failure class recurring is a reproduction
    too (a segfault rerun with ``--attempt``), as is any GPU failure."""
    from ...failures import classify

    text = result.output
    findings = tuple(parse_sanitizer(text))
    asserts = tuple(parse_kernel_asserts(text))
    tb = pick_traceback(parse_tracebacks(text))
    failure = plan.failure
    rerun_class: str | None = None
    if not result.started:
        outcome = DiagnosisOutcome.COULD_NOT_RUN
    elif result.stopped_by == "steps":
        outcome = DiagnosisOutcome.NOT_REPRODUCED
    elif result.stopped_by == "time":
        outcome = DiagnosisOutcome.BOUND_REACHED
    else:
        cls = classify(result.exit_code, result.signal, text, step_regex=plan.step_regex).cls
        rerun_class = cls.value
        if cls in DIAGNOSABLE or findings or (cls.value == failure.cls and cls is not FailureClass.COMPLETED):
            outcome = DiagnosisOutcome.REPRODUCED
        elif cls is FailureClass.COMPLETED:
            outcome = DiagnosisOutcome.NOT_REPRODUCED
        else:
            outcome = DiagnosisOutcome.FAILED_OTHERWISE
    first = findings[0] if findings else None
    kernel = first.kernel if first else (asserts[0].function or asserts[0].source if asserts else None)
    access = first.error if first else (f"Assertion `{asserts[0].assertion}` failed" if asserts else None)
    source = first.source if first else (asserts[0].source if asserts else None)
    frame = tb.user_frame if tb else None
    launch = first.launch_site if first else None
    located = outcome is DiagnosisOutcome.REPRODUCED and (kernel is not None or frame is not None)
    where = []
    if kernel:
        where.append(f"kernel {kernel}" + (f" ({source})" if source else "") + (f": {access}" if access else ""))
    if launch:
        where.append(f"launched from {launch}")
    if frame:
        where.append(f"Python {frame.file}:{frame.line} in {frame.function}")
    start = (f"from {Path(plan.checkpoint).name} (step {plan.checkpoint_step})" if plan.checkpoint
             else "from the start (no checkpoint before the failure)")
    ran = f"steps {result.first_step}..{result.last_step}" if result.last_step is not None else "no step reported"
    if outcome is DiagnosisOutcome.COULD_NOT_RUN:
        reason = f"the rerun did not start: {result.start_error}"
    elif outcome is DiagnosisOutcome.REPRODUCED:
        reason = (f"reproduced {rerun_class or failure.cls} {start}, {ran}, under {', '.join(tools or plan.tools)}"
                  + (": " + "; ".join(where) if where else "; neither the kernel nor a Python line could be read "
                     "from the output"))
    elif outcome is DiagnosisOutcome.NOT_REPRODUCED:
        why = ("finished" if result.stopped_by is None else
               f"reached step {result.last_step}, past the failure step {failure.step}, and was stopped")
        what = "a GPU failure" if failure.cls in {c.value for c in DIAGNOSABLE} else failure.cls
        reason = (f"not reproduced: the rerun {start} {why} without {what} ({ran}); an intermittent "
                  "fault, or one that depends on state not in the checkpoint (a data order, another node)")
    elif outcome is DiagnosisOutcome.BOUND_REACHED:
        reason = (f"stopped at the time bound of {plan.max_seconds:.0f} s ({ran}, failure was at step "
                  f"{failure.step}) before the failure step: raise --max-seconds (the sanitizer is slow)")
    else:
        reason = (f"the rerun {start} failed differently: {rerun_class} ({ran})"
                  + (": " + "; ".join(where) if where else ""))
    renv = plan.environment
    differences = env_differences(renv, env if env is not None else plan.env) if renv is not None else ()
    if outcome in (DiagnosisOutcome.NOT_REPRODUCED, DiagnosisOutcome.FAILED_OTHERWISE) and renv is not None:
        names = [d.partition(":")[0] for d in differences]
        shown = ", ".join(names[:12]) + (f" and {len(names) - 12} more" if len(names) > 12 else "")
        reason += (f"; the rerun's environment ({renv.source}) differs from the recording in: {shown}" if names
                   else f"; the rerun's environment ({renv.source}) matches the recording")
        if plan.redacted_args:
            reason += f"; the command's {', '.join(plan.redacted_args)} were recorded redacted and rerun so"
    if checkpoint_dir_changes:
        reason += f"; WARNING: the run's checkpoint directory changed during the rerun ({len(checkpoint_dir_changes)})"
    return Diagnosis(
        outcome=outcome, located=located, reason=reason, attempt=failure.attempt, original_class=failure.cls,
        original_step=failure.step, original_evidence=failure.evidence, checkpoint=plan.checkpoint,
        checkpoint_step=plan.checkpoint_step, rerun_class=rerun_class, exit_code=result.exit_code,
        signal=result.signal, duration=result.duration, first_step=result.first_step, last_step=result.last_step,
        kernel=kernel, access=access, kernel_source=source, launch_site=launch, python_frame=frame,
        python_stack=tb.frames if tb else (),
        python_error=tb.error if tb else None, sanitizer_findings=findings[:5], kernel_asserts=asserts[:5],
        api_errors=tuple(sanitizer_api_errors(text)), tools=tuple(tools or plan.tools), sanitizer_note=sanitizer_note,
        scratch=plan.scratch, log_path=result.log_path, argv=tuple(argv or plan.argv), redirected=plan.redirected,
        checkpoint_dir_changes=tuple(checkpoint_dir_changes),
        environment_source=renv.source if renv is not None else None, environment_differences=differences,
        redacted_args=plan.redacted_args)


def render(diag: Diagnosis) -> str:
    """The diagnosis for a person, next to the original failure."""
    lines = [f"original failure: attempt {diag.attempt}, {diag.original_class} at step {diag.original_step}"]
    if diag.original_evidence:
        lines.append(f"  {diag.original_evidence[0]}")
    start = f"{diag.checkpoint} (step {diag.checkpoint_step})" if diag.checkpoint else "the start (no checkpoint)"
    lines.append(f"rerun from {start} with {', '.join(diag.tools)}")
    lines.append(f"  {' '.join(diag.argv)[:400]}")
    for change in diag.redirected:
        lines.append(f"  checkpoint argument redirected: {change}")
    if diag.sanitizer_note:
        lines.append(f"  sanitizer: {diag.sanitizer_note}")
    if diag.environment_source:
        lines.append(f"environment: {diag.environment_source}"
                     + (f"; differs from the recording in {len(diag.environment_differences)} variable(s):"
                        if diag.environment_differences else "; as recorded"))
        lines.extend(f"  {d}" for d in diag.environment_differences[:12])
    if diag.redacted_args:
        lines.append(f"  recorded redacted, rerun with the placeholder: {', '.join(diag.redacted_args)}")
    took = f"{diag.duration:.1f} s"
    status = f"exit {diag.exit_code}" if diag.exit_code is not None else (
        f"signal {diag.signal}" if diag.signal is not None else "no exit status")
    lines.append(f"rerun ended: {diag.outcome.value} ({status}, {took}, steps {diag.first_step}..{diag.last_step})")
    if diag.kernel or diag.access:
        src = f" [{diag.kernel_source}]" if diag.kernel_source else ""
        lines.append(f"kernel: {diag.kernel or '?'}{src}  {diag.access or ''}".rstrip())
    for finding in diag.sanitizer_findings[:1]:
        for detail in finding.details[:3]:
            lines.append(f"  {detail}")
    if diag.launch_site:
        lines.append(f"launched from: {diag.launch_site}")
    for api in diag.api_errors[:1]:
        lines.append(f"  {api}")
    if diag.python_frame:
        f = diag.python_frame
        lines.append(f"python: {f.file}:{f.line} in {f.function}")
        if f.code:
            lines.append(f"  {f.code}")
    if diag.python_error:
        lines.append(f"  {diag.python_error}")
    for change in diag.checkpoint_dir_changes[:5]:
        lines.append(f"WARNING checkpoint directory changed: {change}")
    lines.append(f"log: {diag.log_path}")
    lines.append(("located: " if diag.located else "not located: ") + diag.reason)
    # Output of the rerun and names from the run: shown, never obeyed (no escape sequence, no forged line).
    return "\n".join(printable(redact_text(line)) for line in lines)
