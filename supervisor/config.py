"""One config dataclass: defaults < YAML file < environment (``SUPERVISE_*``) < CLI flags.

Values are validated when the config is built; a bad key or value raises :class:`ConfigError` naming
the key, the value and what is allowed. Nested keys use dots in YAML paths and ``--set``
(``budget.max_total_restarts=5``) and double underscores in the environment
(``SUPERVISE_BUDGET__MAX_TOTAL_RESTARTS=5``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import shlex
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .config_values import StrictLoader, Typed, coerce, config_error, origin_of, set_dotted, typed_mapping
from .errors import ConfigError
from .failures.classes import node_kinds
from .policy import DEFAULT_POLICY, ClassPolicy, policy_for
from .states import FailureClass

ENV_PREFIX = "SUPERVISE_"
_SIGNAL_NAMES = {"TERM", "INT", "USR1", "USR2", "HUP", "QUIT", "CONT", "ALRM", "URG", "XCPU"}


@dataclass(frozen=True)
class BudgetConfig:
    """Limits on what restarts may cost (docs/policy.md). ``None`` means no limit.

    Progress means durable progress: a checkpoint the next attempt resumes from, beyond the step the
    attempt itself resumed from. ``policy.<class>.retries`` counts failures in a row *without*
    progress (a crash loop); these budgets bound everything else, and each names itself when it stops.
    """

    max_restarts_per_allocation: int | None = 10
    max_total_restarts: int | None = 50  # across requeues: the ledger lives in the run directory
    max_steps_lost: int | None = None
    max_steps_lost_fraction: float | None = 0.5  # of the progress made so far
    min_progress_between_crashes: int | None = None  # steps; an attempt between two crashes that advanced fewer: stop
    same_failure_limit: int | None = 3  # same class at the same step this many times: stop
    on_resume_mismatch: str = "stop"  # stop | warn: child started elsewhere than the resume point
    min_durable_progress: int = 1  # steps saved past its resume point for an attempt to count as progress
    min_steps_per_failure: int | None = None  # absolute failure rate (opt-in): the last failure_rate_window
    # failures need at least this many steps of durable progress each, on average (steps differ between trainings)
    failure_rate_window: int = 5
    min_kept_per_lost: float | None = 1.0  # scale-free failure rate: over the last failure_rate_window failures,
    # the steps kept (durable progress) must be at least this multiple of the steps lost
    max_requeues_without_progress: int | None = 3  # preemptions / time limits in a row that saved nothing new
    max_restarts_from_scratch: int | None = 0  # restarts from step 0 after a checkpoint was saved (only copy lost)
    results_check_crash_free_steps: int = 15000  # after a memory/device error: steps before a fix is believed


@dataclass(frozen=True)
class CheckpointConfig:
    """How checkpoints are judged and where their step comes from (docs/checkpoint-validation.md).

    Integrity (structure, trailer, CRCs, a bounded inert scan) alone decides quarantine. Trust (which
    classes a pickle names) is a separate note: a whole file naming the training's own classes stays
    a resume candidate unless ``require_trusted`` is set; one naming a code-execution primitive
    (``os.system``, ``builtins.eval``...) is hostile and never a resume point.
    """

    require_trusted: bool = False  # untrusted (names globals outside the allowlist) files are ineligible, untouched
    safe_globals: tuple[str, ...] = ()  # extra trusted globals, "pkg.mod:Class"
    step_from: str | None = None  # name:REGEX | key:NAME | log; None = the stated precedence


@dataclass(frozen=True)
class PreemptionConfig:
    """Stop notices, the grace deadline, and requeue."""

    signals: tuple[str, ...] = ("TERM", "USR1")  # signals that mean "the allocation is ending"
    poll_interval: float = 0.0  # seconds between scontrol polls for PreemptTime; 0 = off
    default_grace: float = 30.0  # deadline after a notice when Slurm tells none, seconds
    margin: float = 3.0  # seconds kept free before the deadline
    emergency_save: bool = True  # ask a client for a save when none is in flight and one fits
    requeue: str = "auto"  # auto | always | never: scontrol requeue when Slurm will not
    requeue_on_time_limit: bool = True
    time_limit_signal: str | None = "USR1"  # the signal of `#SBATCH --signal=B:USR1@N`: a time-limit warning
    time_limit_warning: float | None = None  # its N (seconds before the limit), when no EndTime is readable
    unknown_save_s: float = 60.0  # assumed save duration before any save was measured
    shield_child: bool = True  # start the child with the notice signals ignored; the supervisor ends it


@dataclass(frozen=True)
class NotifyConfig:
    """Tell a person when the run needs one (docs/report.md): run ``command`` and/or POST JSON to
    ``url`` on the chosen ``events``. Sent from a background thread with ``retries`` and a per-try
    ``timeout``; a notifier that fails is logged and counted, never a reason to stop the run."""

    # The events a notification can be asked for (supervisor.addons.notify.NotifyEvent has the same values).
    EVENTS: typing.ClassVar[tuple[str, ...]] = ("stopped", "held", "results_check", "complete", "cancelled",
                                                "resumability")
    # The variables the command gets besides the payload on stdin (not config: env_overrides skips them).
    ENV_VARS: typing.ClassVar[tuple[str, ...]] = (
        "SUPERVISE_EVENT", "SUPERVISE_REASON", "SUPERVISE_RUN_NAME", "SUPERVISE_RUN_DIR", "SUPERVISE_JOB_ID",
        "SUPERVISE_TRIGGER")

    command: str | None = None  # a program and its arguments (split like a shell, never run by one)
    url: str | None = None  # http(s); ${VAR} in it is read from the environment when sending (secrets)
    events: tuple[str, ...] = EVENTS
    timeout: float = 10.0  # seconds per try (HTTP request or command run)
    retries: int = 3  # tries after the first one fails
    backoff: float = 2.0  # seconds before the first retry, doubling each time (at most 60)
    queue_size: int = 100  # notifications waiting to be sent; more are dropped and counted

    @property
    def enabled(self) -> bool:
        return bool(self.events) and (self.command is not None or self.url is not None)

    def __post_init__(self) -> None:
        import shlex
        from urllib.parse import urlsplit

        if self.command is not None:
            try:
                argv = shlex.split(self.command)
            except ValueError as exc:
                raise ConfigError("notify.command", self.command, f"cannot be split into arguments ({exc})") from None
            if not argv:
                raise ConfigError("notify.command", self.command, "empty command; give a program and its "
                                  "arguments (e.g. '/usr/local/bin/page-me --team ml') or leave the key out")
        if self.url is not None:
            parts = urlsplit(self.url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ConfigError("notify.url", self.url, "expected an http:// or https:// URL with a host, "
                                  "e.g. https://hooks.example.org/notify")
        for name in self.events:
            if name not in self.EVENTS:
                raise ConfigError("notify.events", name, f"unknown event; allowed: {', '.join(self.EVENTS)}")
        if self.timeout <= 0:
            raise ConfigError("notify.timeout", self.timeout, "expected a number of seconds > 0")
        if self.queue_size < 1:
            raise ConfigError("notify.queue_size", self.queue_size, "expected at least 1")


@dataclass(frozen=True)
class MetricsConfig:
    """Restart metrics for the tools people watch (docs/metrics.md): a Prometheus text file
    (node_exporter's textfile collector) and OpenTelemetry-style JSON lines, kept up to date from
    the event log by a background writer. Paths are relative to the run directory; ``{name}`` is
    the run's name (one file per run in a shared textfile-collector directory)."""

    FORMATS: typing.ClassVar[tuple[str, ...]] = ("prometheus", "otel")

    enabled: bool = True  # false: no metrics files at all (the training side then sees none either)
    formats: tuple[str, ...] = FORMATS  # which files to write besides supervisor/metrics.json
    prometheus_file: str = "supervisor/metrics.prom"
    otel_file: str = "supervisor/metrics.otel.jsonl"

    def __post_init__(self) -> None:
        for name in self.formats:
            if name not in self.FORMATS:
                raise ConfigError("metrics.formats", name, f"unknown format; allowed: {', '.join(self.FORMATS)}")
        for key, value in (("metrics.prometheus_file", self.prometheus_file), ("metrics.otel_file", self.otel_file)):
            if not value.strip():
                raise ConfigError(key, value, "expected a file path (relative to the run directory, or absolute); "
                                  "to write no such file, leave its format out of metrics.formats")
            rest = value.replace("{name}", "")
            if "{" in rest or "}" in rest:
                raise ConfigError(key, value, "the only placeholder allowed is {name} (the run's name)")
        if not self.prometheus_file.endswith(".prom"):
            raise ConfigError("metrics.prometheus_file", self.prometheus_file,
                              "expected a name ending in .prom (node_exporter's textfile collector reads only those)")


@dataclass(frozen=True)
class StallConfig:
    """Stall detection while ``stall_timeout`` is 0 (the default): a timeout learned from the gaps
    between step reports (docs/node-health.md). An explicit ``stall_timeout`` > 0 always wins."""

    enabled: bool = True  # false: no stall verdict at all unless stall_timeout is set
    floor: float = 600.0  # never call a stall sooner than this many seconds without progress ...
    multiple: float = 10.0  # ... nor sooner than this multiple of the p99 gap between step reports
    warmup_reports: int = 20  # gaps seen before the learned timeout applies (the first save also ends it)
    startup_limit: float = 1800.0  # until then: seconds without progress (from the start or the last report)

    def __post_init__(self) -> None:
        if self.floor <= 0:
            raise ConfigError("stall.floor", self.floor, "expected a number of seconds > 0 (e.g. 600)")
        if self.multiple < 1:
            raise ConfigError("stall.multiple", self.multiple, "expected a number >= 1 (e.g. 10)")
        if self.warmup_reports < 1:
            raise ConfigError("stall.warmup_reports", self.warmup_reports, "expected a whole number >= 1")
        if self.startup_limit <= 0:
            raise ConfigError("stall.startup_limit", self.startup_limit,
                              "expected a number of seconds > 0 (e.g. 1800); set stall.enabled: false to turn "
                              "stall detection off")


@dataclass(frozen=True)
class SlowNodeConfig:
    """A node whose ranks step persistently slower than the ranks of the other nodes (docs/node-health.md)."""

    ACTIONS: typing.ClassVar[tuple[str, ...]] = ("off", "warn", "requeue")

    factor: float = 1.3  # the node's median step time over this multiple of its peers' median ...
    min_samples: int = 5  # ... in at least this many of its samples ...
    min_duration: float = 300.0  # ... for at least this many seconds: a slow_node event
    window: float = 600.0  # step-time samples older than this many seconds are forgotten
    action: str = "warn"  # off | warn | requeue (stop the attempt, requeue excluding the node)

    def __post_init__(self) -> None:
        if self.factor <= 1.0:
            raise ConfigError("slow_node.factor", self.factor, "expected a number > 1 (e.g. 1.3)")
        if self.min_samples < 1:
            raise ConfigError("slow_node.min_samples", self.min_samples, "expected a whole number >= 1")
        if self.window <= 0:
            raise ConfigError("slow_node.window", self.window, "expected a number of seconds > 0")
        if self.action not in self.ACTIONS:
            raise ConfigError("slow_node.action", self.action, f"allowed: {', '.join(self.ACTIONS)}")


@dataclass(frozen=True)
class GpuCheckConfig:
    """The GPU repeatability check (``supervise check-gpu``, ``preflight: [gpu]``) and when the run
    loop runs it besides the preflight (docs/node-health.md)."""

    AFTER_LOSS: typing.ClassVar[tuple[str, ...]] = ("off", "nonfinite", "any")

    repeats: int = 300  # runs of each check: a fault on 1 % of calls is caught with probability 95 %
    fault_rate: float = 0.01  # the per-call fault rate the printed detection power is stated for
    timeout: float = 600.0  # seconds for the whole check before it counts as hung
    after_loss_anomaly: str = "nonfinite"  # off | nonfinite | any: check before the next attempt

    def __post_init__(self) -> None:
        if self.repeats < 2:
            raise ConfigError("gpu_check.repeats", self.repeats, "expected a whole number >= 2 (each run is "
                              "compared bit for bit with the first)")
        if not 0.0 < self.fault_rate < 1.0:
            raise ConfigError("gpu_check.fault_rate", self.fault_rate, "expected a fraction between 0 and 1")
        if self.timeout <= 0:
            raise ConfigError("gpu_check.timeout", self.timeout, "expected a number of seconds > 0")
        if self.after_loss_anomaly not in self.AFTER_LOSS:
            raise ConfigError("gpu_check.after_loss_anomaly", self.after_loss_anomaly,
                              f"allowed: {', '.join(self.AFTER_LOSS)}")


@dataclass(frozen=True)
class NodesConfig:
    """The node health ledger shared by a user's runs, and what its evidence leads to (docs/node-health.md)."""

    # Ledger records that are not a failure class (supervisor.addons.nodes.NodeEventKind has the same values).
    NODE_KINDS: typing.ClassVar[tuple[str, ...]] = ("gpu_check", "slow_node", "loss_anomaly")

    ledger: str | None = None  # JSONL file; default ~/.cache/slurm-supervisor/nodes.jsonl
    max_bytes: int = 4 * 1024 * 1024  # the ledger is rotated past this size (one older file kept)
    window: float = 7 * 86400.0  # seconds: older records are history, not evidence
    suspect_after: int = 2  # records of any kind in `suspect` or `hardware` in the window: a suspect
    exclude_after: int = 2  # records of a `hardware` kind in the window: excluded on requeue (0 = never)
    exclude_for: float = 86400.0  # an exclusion lasts this long after the node's last hardware record
    # The classes by their node_kind in supervisor/failures/classes.py, then the other kinds of record.
    hardware: tuple[str, ...] = (*node_kinds("hardware"), "gpu_check", "slow_node")
    suspect: tuple[str, ...] = (*node_kinds("suspect"), "loss_anomaly")

    def __post_init__(self) -> None:
        if self.ledger is not None and not self.ledger.strip():
            raise ConfigError("nodes.ledger", self.ledger, "expected a file path, or leave the key out for "
                              "~/.cache/slurm-supervisor/nodes.jsonl")
        if self.max_bytes < 65536:
            raise ConfigError("nodes.max_bytes", self.max_bytes, "expected at least 65536")
        if self.window <= 0:
            raise ConfigError("nodes.window", self.window, "expected a number of seconds > 0")
        if self.suspect_after < 1:
            raise ConfigError("nodes.suspect_after", self.suspect_after, "expected a whole number >= 1")
        known = {c.value for c in FailureClass} | set(self.NODE_KINDS)
        for key, labels in (("nodes.hardware", self.hardware), ("nodes.suspect", self.suspect)):
            for label in labels:
                if label not in known:
                    raise ConfigError(key, label, f"unknown kind of record; allowed: {', '.join(sorted(known))}")


@dataclass(frozen=True)
class SupervisorConfig:
    """Everything ``supervise run`` can be told. Built by :func:`load_config`."""

    name: str | None = None
    run_dir: str | None = None  # default: ./runs/<name>
    checkpoint_dir: str | None = None  # default: <run_dir>/checkpoints
    resume_arg: str | None = None  # appended only when resuming: "--ckpt_path {path}", "--init_from=resume", ...
    resume_env: tuple[str, ...] = ()  # set only when resuming: "RESUME_FROM={path}" ({path}, {dir}, {step})
    step_regex: str | None = None  # None = the built-in patterns (supervisor.progress)
    quarantine: bool = True  # rename torn checkpoints aside before an attempt
    verify_resume_deep: bool = True  # CRC-check (L4) the chosen resume point
    stall_timeout: float = 0.0  # seconds without progress before the child is dumped and killed; 0 = learned (stall.*)
    slowdown_fraction: float = 0.5  # step rate below this fraction of its median ...
    slowdown_window: float = 300.0  # ... for this long: a slowdown event
    loss_spike_factor: float = 10.0  # loss above this multiple of its running median: an event
    loss_policy: str = "warn"  # warn | stop
    term_timeout: float = 30.0  # TERM -> KILL for the child's process group, seconds
    tail_bytes: int = 262144  # bytes of output kept in memory for classification
    max_line_bytes: int = 65536  # longer lines are cut in the tail (never in the log file)
    progress_event_interval: float = 30.0  # seconds between sampled progress events
    max_steps: int | None = None  # the training's last step, for the ETA in `supervise status`; a client's
    # heartbeat(step, max_steps=N) (the Lightning and HF callbacks send theirs) wins over it
    config_files: tuple[str, ...] = ()  # training config files hashed into the manifest
    probe_software: bool = True  # the manifest asks the child's Python for its torch/CUDA versions: one
    # interpreter start and `import torch` per attempt, in the background (1-5 s of CPU; off where that hurts)
    preflight: tuple[str, ...] = ()  # "gpu": run the GPU health check before each attempt
    policy: Mapping[FailureClass, ClassPolicy] = field(default_factory=lambda: dict(DEFAULT_POLICY))
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    preemption: PreemptionConfig = field(default_factory=PreemptionConfig)
    notify: NotifyConfig = field(default_factory=NotifyConfig)
    stall: StallConfig = field(default_factory=StallConfig)
    slow_node: SlowNodeConfig = field(default_factory=SlowNodeConfig)
    gpu_check: GpuCheckConfig = field(default_factory=GpuCheckConfig)
    nodes: NodesConfig = field(default_factory=NodesConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (enums as strings) for YAML/JSON output and hashing."""
        return _plain(self)

    def config_hash(self) -> str:
        """sha256 of the canonical JSON (sorted keys, non-JSON values as strings). Where notifications
        go is not part of the training's configuration: a webhook changed between requeues is no drift."""
        data = self.to_dict()
        data.pop("notify", None)
        data.pop("metrics", None)  # where the metrics go is not the training's configuration either
        canon = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(canon.encode()).hexdigest()

    def policy_for(self, cls: FailureClass) -> ClassPolicy:
        return policy_for(cls, self.policy)


# ---------------------------------------------------------------------------------------------
# Building and validation


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {(k.value if hasattr(k, "value") else k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "value") and isinstance(value.value, str):
        return value.value
    return value


def _deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, val in over.items():
        if isinstance(val, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _deep_merge(dict(out[key]), val)
        else:
            out[key] = val
    return out


def _source(value: Any, layer: str) -> str:
    """The layer, sharpened to the variable for the environment: ``environment variable SUPERVISE_X``."""
    origin = origin_of(value)
    return f"environment variable {origin}" if origin and layer == "environment" else layer


def _plain_text(value: Any) -> Any:
    """A value as typed, for a message (the :class:`Typed` wrapper is an implementation detail)."""
    if isinstance(value, Typed):
        return str(value)
    if isinstance(value, Mapping):
        return {k: _plain_text(v) for k, v in value.items()}
    return value


def _build_dataclass(cls: type, data: Mapping[str, Any], prefix: str, source: str) -> Any:
    if not isinstance(data, Mapping):
        raise config_error(prefix.rstrip(".") or "<top>", data, "expected a mapping of keys", source)
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in known:
            allowed = ", ".join(sorted(known))
            raise config_error(f"{prefix}{key}", _plain_text(data[key]), f"unknown key; known keys: {allowed}",
                         _source(data[key], source))
    kwargs: dict[str, Any] = {}
    for name in known:
        if name not in data:
            continue
        hint = hints[name]
        key = f"{prefix}{name}"
        value = data[name]
        where = _source(value, source)
        section = isinstance(hint, type) and dataclasses.is_dataclass(hint)
        if isinstance(value, Typed) and (section or name == "policy"):
            value = typed_mapping(value)  # a whole section in one value
        if section:
            kwargs[name] = _build_dataclass(hint, {} if value is None else value, key + ".", where)
        elif name == "policy":
            kwargs[name] = _build_policy(value, key, where)
        else:
            kwargs[name] = coerce(key, value, hint, where)
    return cls(**kwargs)


def _build_policy(value: Any, key: str, source: str) -> dict[FailureClass, ClassPolicy]:
    policy = dict(DEFAULT_POLICY)
    if value is None:
        return policy
    if not isinstance(value, Mapping):
        raise config_error(key, value, "expected a mapping from failure class to its policy", source)
    for cls_name, entry in value.items():
        try:
            cls = FailureClass(cls_name)
        except (ValueError, TypeError):
            allowed = ", ".join(c.value for c in FailureClass if c is not FailureClass.COMPLETED)
            raise config_error(f"{key}.{cls_name}", entry, f"unknown failure class; allowed: {allowed}",
                         source) from None
        if isinstance(entry, str):  # shorthand: "segfault: stop"
            entry = {"action": entry}
        if entry is not None and not isinstance(entry, Mapping):
            raise config_error(f"{key}.{cls_name}", entry, "expected an action (restart | requeue | stop) or a "
                                                     "mapping like {action: restart, retries: 3}", source)
        base = _plain(policy[cls]) if cls in policy else {}
        merged = _deep_merge(base, entry or {})
        policy[cls] = _build_dataclass(ClassPolicy, merged, f"{key}.{cls_name}.", source)
    return policy


def _validate(cfg: SupervisorConfig) -> None:
    if cfg.resume_arg is not None:
        _check_placeholders("resume_arg", cfg.resume_arg)
        try:
            parts = shlex.split(cfg.resume_arg)
        except ValueError as exc:  # an unbalanced quote: the split would be a guess
            raise ConfigError("resume_arg", cfg.resume_arg, f"cannot be split like a shell command ({exc}); "
                                                            "balance the quotes") from None
        if not parts:
            raise ConfigError("resume_arg", cfg.resume_arg, "expected a flag, e.g. '--ckpt_path {path}'")
    for item in cfg.resume_env:
        name, eq, template = item.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ConfigError("resume_env", item, "expected NAME=VALUE, e.g. RESUME_FROM={path}")
        _check_placeholders("resume_env", template)
    for item in cfg.checkpoint.safe_globals:
        module, colon, qualname = item.partition(":")
        if not colon or not module or not qualname or not all(
                re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", part) for part in (*module.split("."), *qualname.split("."))):
            raise ConfigError("checkpoint.safe_globals", item, "expected MODULE:NAME, e.g. mypkg.config:TrainConfig")
    step_from = cfg.checkpoint.step_from
    if step_from is not None:
        kind, _, arg = step_from.partition(":")
        if kind == "log" and not arg:
            pass
        elif kind == "key" and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", arg):
            pass
        elif kind == "name" and arg:
            try:
                compiled = re.compile(arg)
            except re.error as exc:
                raise ConfigError("checkpoint.step_from", step_from,
                                  f"not a valid regular expression ({exc})") from None
            if compiled.groups < 1:
                raise ConfigError("checkpoint.step_from", step_from, "name:REGEX needs one capture group for the step")
        else:
            raise ConfigError("checkpoint.step_from", step_from,
                              "expected name:REGEX (with one group), key:NAME (e.g. key:iter_num) or log")
    if cfg.step_regex is not None:
        try:
            compiled = re.compile(cfg.step_regex)
        except re.error as exc:
            raise ConfigError("step_regex", cfg.step_regex, f"not a valid regular expression ({exc})") from None
        if compiled.groups < 1:
            raise ConfigError("step_regex", cfg.step_regex, "needs one capture group for the step number")
    if not 0.0 < cfg.slowdown_fraction < 1.0:
        raise ConfigError("slowdown_fraction", cfg.slowdown_fraction, "expected a fraction between 0 and 1")
    if cfg.loss_policy not in ("warn", "stop"):
        raise ConfigError("loss_policy", cfg.loss_policy, "allowed: warn, stop")
    kept = cfg.budget.min_kept_per_lost
    if kept is not None and not (math.isfinite(kept) and kept > 0):
        raise ConfigError("budget.min_kept_per_lost", kept, "expected a number > 0 (e.g. 1.0: keep at least as many "
                                                           "steps as are lost), or null for no limit")
    if cfg.budget.on_resume_mismatch not in ("stop", "warn"):
        raise ConfigError("budget.on_resume_mismatch", cfg.budget.on_resume_mismatch, "allowed: stop, warn")
    if cfg.preemption.requeue not in ("auto", "always", "never"):
        raise ConfigError("preemption.requeue", cfg.preemption.requeue, "allowed: auto, always, never")
    limit_sig = cfg.preemption.time_limit_signal
    if limit_sig and limit_sig.upper().removeprefix("SIG") not in _SIGNAL_NAMES:
        raise ConfigError("preemption.time_limit_signal", limit_sig, f"allowed: {', '.join(sorted(_SIGNAL_NAMES))}")
    for sig in cfg.preemption.signals:
        if sig.upper().removeprefix("SIG") not in _SIGNAL_NAMES:
            raise ConfigError("preemption.signals", sig, f"allowed: {', '.join(sorted(_SIGNAL_NAMES))}")
    for item in cfg.preflight:
        if item not in ("gpu",):
            raise ConfigError("preflight", item, "allowed: gpu")
    if cfg.tail_bytes < 4096:
        raise ConfigError("tail_bytes", cfg.tail_bytes, "expected at least 4096")
    if cfg.max_line_bytes < 256:
        raise ConfigError("max_line_bytes", cfg.max_line_bytes, "expected at least 256")


_PLACEHOLDERS = ("{path}", "{dir}", "{step}")


def _check_placeholders(key: str, template: str) -> None:
    """``{path}``, ``{dir}`` and ``{step}`` are filled in when resuming; any other brace is a typo."""
    rest = template
    for ph in _PLACEHOLDERS:
        rest = rest.replace(ph, "")
    if "{" in rest or "}" in rest:
        raise ConfigError(key, template, "placeholders allowed: {path}, {dir}, {step} (or none: a fixed flag "
                                         "such as --init_from=resume, given only when resuming)")


def read_yaml(path: Path) -> dict[str, Any]:
    """Load a YAML config file, turning every failure into a one-line :class:`ConfigError`."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise config_error("--config", str(path), f"cannot read the file ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise config_error("--config", str(path), f"not UTF-8 text (byte 0x{raw[exc.start]:02x} on line {line}); "
                                            "save the file as UTF-8") from None
    try:
        data = yaml.load(text, Loader=StrictLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or getattr(exc, "reason", None) or "invalid YAML"
        raise config_error("--config", str(path), f"malformed YAML{where}: {problem}") from None
    except RecursionError:
        raise config_error("--config", str(path), "malformed YAML: nested too deeply") from None
    except (ValueError, OverflowError) as exc:  # a number PyYAML cannot build (over 4300 digits)
        raise config_error("--config", str(path), f"malformed YAML: {str(exc)[:100]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise config_error("--config", str(path), "the file must hold a mapping of keys (key: value)")
    return data


def env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """``SUPERVISE_STALL_TIMEOUT=60`` and ``SUPERVISE_BUDGET__MAX_TOTAL_RESTARTS=5`` as a nested dict."""
    out: dict[str, Any] = {}
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX) or name == "SUPERVISE_CONFIG" or name in NotifyConfig.ENV_VARS:
            continue
        dotted = name[len(ENV_PREFIX):].lower().replace("__", ".")
        set_dotted(out, dotted, Typed(raw, name), source="environment", shown=name)
    return out


def load_config(
    config_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
    cli: Mapping[str, Any] | None = None,
    sets: tuple[str, ...] = (),
) -> SupervisorConfig:
    """Merge the layers and validate. ``cli`` holds flag values (None = not given)."""
    environ = os.environ if environ is None else environ
    if config_file is None and environ.get("SUPERVISE_CONFIG"):
        config_file = Path(environ["SUPERVISE_CONFIG"])
    layers: list[tuple[str, dict[str, Any]]] = []
    if config_file is not None:
        layers.append((str(config_file), read_yaml(config_file)))
    layers.append(("environment", env_overrides(environ)))
    flags: dict[str, Any] = {k: v for k, v in (cli or {}).items() if v is not None}
    for item in sets:
        if "=" not in item:
            raise config_error("--set", item, "expected KEY=VALUE, e.g. budget.max_total_restarts=5")
        key, _, raw = item.partition("=")
        set_dotted(flags, key.strip(), Typed(raw, f"--set {key.strip()}"), source="--set", shown=item)
    layers.append(("command line", flags))

    merged: dict[str, Any] = {}
    for source, layer in layers:
        # Validate each layer on its own so the error names where the bad value came from.
        _build_dataclass(SupervisorConfig, _deep_merge(merged, layer), "", source)
        merged = _deep_merge(merged, layer)
    cfg = _build_dataclass(SupervisorConfig, merged, "", "")
    _validate(cfg)
    return cfg


def render_yaml(cfg: SupervisorConfig) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False, default_flow_style=False)
