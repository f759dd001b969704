"""GPU health preflight: is this node's GPU fit to train on?

The check itself runs in a subprocess (:mod:`supervisor.addons.health_probe`, started by file path with a
Python that has torch): the supervisor never imports torch and never holds a CUDA context. The probe
repeats the same deterministic conv2d and matmuls many times and reports how many results differ in
any bit from the first; :func:`judge_gpu_results` turns that (plus ``nvidia-smi``'s ECC counters)
into a :class:`GpuVerdict`. Pure decision, I/O at the edges: :func:`run_check` does the I/O.

How many repeats: a GPU that corrupts a fraction ``p`` of calls passes ``n`` clean repeats with
probability ``(1-p)**n``, so the check detects it with probability ``1-(1-p)**n``
(:func:`detection_power`); 100 repeats miss a 1 % fault 37 % of the time, 300 miss it 5 % of the
time, 459 miss it 1 % of the time (:func:`repeats_for_power`). Every verdict that ran checks states
its power (:class:`PowerStatement`).

Exit codes of ``supervise check-gpu`` (:attr:`GpuVerdict.exit_code`): 0 healthy, 1 unhealthy (a
mismatch, a CUDA error, uncorrectable ECC errors, or a hung check), 2 cannot check (no torch, no
CUDA device, GPU memory taken by someone else, the probe could not start).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..config import GpuCheckConfig

PROBE_PATH = Path(__file__).with_name("health_probe.py")
GPU_PREFIX = "PROBE_GPU "  # same markers as health_probe (not imported: it must stay standalone)
RESULT_PREFIX = "PROBE_RESULT "
DEFAULT_TIMEOUT = GpuCheckConfig().timeout  # seconds for the whole probe; an H200 needs about 10 s per GPU
DEFAULT_REPEATS = GpuCheckConfig().repeats  # runs of each check
DEFAULT_FAULT_RATE = GpuCheckConfig().fault_rate  # the per-call fault rate the power is stated for
TARGET_POWER = 0.99  # the detection probability the "repeats needed" hint is given for
SMI_TIMEOUT = 15.0

EXIT_HEALTHY = 0
EXIT_UNHEALTHY = 1
EXIT_CANNOT_CHECK = 2

# Text in a probe error that blames the GPU or its driver, not the environment.
_GPU_FAULT = re.compile(
    r"CUDA error|CUBLAS_STATUS_EXECUTION_FAILED|CUDNN_STATUS_EXECUTION_FAILED|illegal memory access|"
    r"unspecified launch failure|misaligned address|\bXid\b|uncorrectable ECC|ECC error|"
    r"fallen off the bus|GPU is lost|device-side assert|cudaErrorLaunchFailure",
    re.IGNORECASE,
)
# ... unless it only says the memory is taken (another job on the GPU): that is not a fault.
_BUSY = re.compile(r"out of memory|CUDA-capable device\(s\) is/are busy|busy or unavailable", re.IGNORECASE)

_SMI_FIELDS = ("index", "name", "driver_version", "uuid", "pci.bus_id", "clocks.sm", "clocks.mem",
               "clocks.max.sm", "temperature.gpu", "ecc.errors.uncorrected.volatile.total")
_SMI_MINIMAL = ("index", "name", "driver_version", "uuid", "pci.bus_id")
_SMI_KEYS = {"index": "index", "name": "name", "driver_version": "driver", "uuid": "uuid",
             "pci.bus_id": "pci_bus_id", "clocks.sm": "clock_sm_mhz", "clocks.mem": "clock_mem_mhz",
             "clocks.max.sm": "clock_max_sm_mhz", "temperature.gpu": "temperature_c",
             "ecc.errors.uncorrected.volatile.total": "ecc_uncorrected"}
_SMI_INTS = {"index", "clock_sm_mhz", "clock_mem_mhz", "clock_max_sm_mhz", "temperature_c", "ecc_uncorrected"}


@dataclass(frozen=True)
class CheckResult:
    """One repeated computation on one GPU. ``ok`` only when every run matched the first bit for bit."""

    name: str
    ok: bool
    runs: int
    mismatches: int | None  # runs whose result differed from the first in any bit
    max_abs_diff: float | None  # largest element difference among the mismatching runs
    first_bad_run: int | None
    seconds: float | None
    error: str | None


@dataclass(frozen=True)
class GpuReport:
    """What is known about one GPU: identity, clocks and ECC from nvidia-smi, the checks, the verdict."""

    index: int
    name: str | None
    ok: bool
    checkable: bool
    reason: str
    driver: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    clock_sm_mhz: int | None = None
    clock_mem_mhz: int | None = None
    clock_max_sm_mhz: int | None = None
    temperature_c: int | None = None
    ecc_uncorrected: int | None = None
    checks: tuple[CheckResult, ...] = ()


@dataclass(frozen=True)
class PowerStatement:
    """How likely the check was to catch an intermittent fault: with ``repeats`` runs of each check,
    a GPU that gets a fraction ``fault_rate`` of calls wrong is caught with probability
    ``probability`` = 1-(1-fault_rate)**repeats; ``repeats_for_target`` runs reach ``target``."""

    repeats: int
    fault_rate: float
    probability: float
    target: float
    repeats_for_target: int
    text: str


@dataclass(frozen=True)
class GpuVerdict:
    """The preflight's answer. ``checkable`` is False when no judgement was possible (no torch, no
    GPU, memory busy): the run loop should neither trust nor blame the node then."""

    ok: bool
    checkable: bool
    reason: str
    gpus: tuple[GpuReport, ...] = ()
    torch: str | None = None
    cuda: str | None = None
    python: str | None = None
    power: PowerStatement | None = None  # None when no check ran

    @property
    def exit_code(self) -> int:
        if self.ok:
            return EXIT_HEALTHY
        return EXIT_UNHEALTHY if self.checkable else EXIT_CANNOT_CHECK

    @property
    def bad_gpus(self) -> tuple[GpuReport, ...]:
        return tuple(g for g in self.gpus if g.checkable and not g.ok)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["exit_code"] = self.exit_code
        return out


# ---------------------------------------------------------------------------------------------
# Detection power (pure)


def _check_rate(fault_rate: float) -> None:
    if not 0.0 < fault_rate < 1.0:
        raise ValueError(f"fault rate must be between 0 and 1, got {fault_rate!r}")


def detection_power(fault_rate: float, repeats: int) -> float:
    """Probability that ``repeats`` runs catch a GPU that gets a fraction ``fault_rate`` of calls
    wrong, independently per call: 1-(1-p)**n. Any faulty run is caught, the first one included
    (then every other run differs from it)."""
    _check_rate(fault_rate)
    if repeats < 2:
        return 0.0  # nothing to compare with
    return 1.0 - (1.0 - fault_rate) ** repeats


def repeats_for_power(fault_rate: float, power: float) -> int:
    """The fewest runs that catch a per-call fault rate ``fault_rate`` with probability >= ``power``."""
    _check_rate(fault_rate)
    if not 0.0 < power < 1.0:
        raise ValueError(f"power must be between 0 and 1, got {power!r}")
    needed = math.ceil(math.log1p(-power) / math.log1p(-fault_rate) - 1e-9)
    return max(needed, 2)


def _percent(value: float) -> str:
    text = f"{value * 100:.2f}".rstrip("0").rstrip(".")
    return f"{text} %"


def power_statement(repeats: int, fault_rate: float = DEFAULT_FAULT_RATE,
                    target: float = TARGET_POWER) -> PowerStatement:
    """What ``repeats`` runs per check can promise, in numbers and in one sentence."""
    probability = detection_power(fault_rate, repeats)
    needed = repeats_for_power(fault_rate, target)
    text = (f"{repeats} repeats per check: detects a per-call fault rate >= {_percent(fault_rate)} with "
            f"probability {_percent(probability)} (1-(1-p)^n); {_percent(target)} needs {needed} repeats")
    return PowerStatement(repeats=repeats, fault_rate=fault_rate, probability=round(probability, 6),
                          target=target, repeats_for_target=needed, text=text)


def probe_args_for(repeats: int = DEFAULT_REPEATS, indices: Sequence[int] = ()) -> list[str]:
    """The probe's command line for ``repeats`` runs of every check on ``indices`` (default all GPUs)."""
    args = ["--runs", str(repeats), "--matmul-runs", str(repeats)]
    for index in indices:
        args += ["--index", str(index)]
    return args


# ---------------------------------------------------------------------------------------------
# When to check besides the preflight (pure)


@dataclass(frozen=True)
class GpuCheckDecision:
    """Whether to run the GPU check on this node before the next attempt, and why."""

    run: bool
    reason: str


def after_loss_anomaly(policy: GpuCheckConfig, anomalies: Sequence[str]) -> GpuCheckDecision:
    """Silent data corruption shows up as a loss that goes NaN/inf or spikes with no error at all.
    ``anomalies``: the kinds (``nan``, ``inf``, ``spike``) of the loss anomalies seen on this node
    since its GPUs were last checked. ``gpu_check.after_loss_anomaly``: ``nonfinite`` checks after a
    NaN or inf loss, ``any`` after a spike too, ``off`` never."""
    mode = policy.after_loss_anomaly
    nonfinite = [k for k in anomalies if k in ("nan", "inf")]
    spikes = [k for k in anomalies if k == "spike"]
    if not anomalies:
        return GpuCheckDecision(False, "no loss anomaly since the last check")
    if mode == "off":
        return GpuCheckDecision(False, f"{len(anomalies)} loss anomaly(ies), but gpu_check.after_loss_anomaly is off")
    if nonfinite:
        return GpuCheckDecision(True, f"loss was {'/'.join(sorted(set(nonfinite)))} on this node "
                                      f"({len(nonfinite)} time(s)): check the GPU before the next attempt")
    if mode == "any" and spikes:
        return GpuCheckDecision(True, f"{len(spikes)} loss spike(s) on this node: check the GPU before the next "
                                      "attempt")
    return GpuCheckDecision(False, f"{len(spikes)} loss spike(s) only; gpu_check.after_loss_anomaly is "
                                   f"{mode!r} (set 'any' to check after spikes)")


# ---------------------------------------------------------------------------------------------
# The decision (pure)


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None


def _judge_check(record: Mapping[str, Any]) -> CheckResult:
    mismatches = _int(record.get("mismatches"))
    error = record.get("error") or None
    diff = record.get("max_abs_diff")
    return CheckResult(
        name=str(record.get("name") or "?"),
        ok=error is None and mismatches == 0,
        runs=_int(record.get("runs")) or 0,
        mismatches=mismatches,
        max_abs_diff=float(diff) if isinstance(diff, (int, float)) and not isinstance(diff, bool) else None,
        first_bad_run=_int(record.get("first_bad_run")),
        seconds=record.get("seconds") if isinstance(record.get("seconds"), (int, float)) else None,
        error=str(error) if error is not None else None,
    )


def _normalize_bus(bus: Any) -> str | None:
    """``00000000:18:00.0`` and ``0000:18:00.0`` name the same device."""
    if not isinstance(bus, str) or ":" not in bus:
        return None
    domain, _, rest = bus.strip().lower().partition(":")
    try:
        return f"{int(domain, 16):x}:{rest}"
    except ValueError:
        return None


def _normalize_uuid(uuid: Any) -> str | None:
    if not isinstance(uuid, str) or not uuid.strip():
        return None
    return uuid.strip().lower().removeprefix("gpu-").removeprefix("mig-")


def _match_smi(gpu: Mapping[str, Any], smi: Sequence[Mapping[str, Any]], same_count: bool) -> Mapping[str, Any]:
    """The nvidia-smi row of a torch device: by UUID, else PCI bus id, else index when both list
    the same number of devices (torch's index is relative to CUDA_VISIBLE_DEVICES; smi's is not)."""
    uuid = _normalize_uuid(gpu.get("uuid"))
    bus = _normalize_bus(gpu.get("pci_bus_id"))
    for row in smi:
        if uuid and _normalize_uuid(row.get("uuid")) == uuid:
            return row
    for row in smi:
        if bus and _normalize_bus(row.get("pci_bus_id")) == bus:
            return row
    if same_count:
        for row in smi:
            if _int(row.get("index")) == _int(gpu.get("index")):
                return row
    return {}


def _blames_gpu(error: str) -> bool:
    """An error that points at the GPU or its driver; memory taken by another process does not."""
    return bool(_GPU_FAULT.search(error)) and not _BUSY.search(error)


def _describe_check_failure(check: CheckResult) -> str:
    if check.error:
        return f"{check.name} failed: {check.error.splitlines()[0][:300]}"
    diff = f", max abs diff {check.max_abs_diff:.3g}" if check.max_abs_diff is not None else ""
    first = f", first at run {check.first_bad_run}" if check.first_bad_run is not None else ""
    return (f"{check.name} gave a different result in {check.mismatches} of {check.runs - 1} repeats"
            f"{diff}{first} (bitwise compare with run 0)")


def _judge_gpu(gpu: Mapping[str, Any], smi_row: Mapping[str, Any]) -> GpuReport:
    index = _int(gpu.get("index"))
    index = -1 if index is None else index
    checks = tuple(_judge_check(c) for c in gpu.get("checks") or () if isinstance(c, Mapping))
    name = gpu.get("name") or smi_row.get("name")
    label = f"GPU {index} ({name})" if name else f"GPU {index}"
    ecc = _int(smi_row.get("ecc_uncorrected"))
    problems: list[str] = []  # the GPU is at fault
    unknown: list[str] = []  # no judgement possible (memory busy, a software error)
    if gpu.get("error"):
        (problems if _blames_gpu(str(gpu["error"])) else unknown).append(str(gpu["error"])[:300])
    for check in checks:
        if not check.ok:
            blamed = check.error is None or _blames_gpu(check.error)
            (problems if blamed else unknown).append(_describe_check_failure(check))
    if ecc:
        problems.append(f"{ecc} uncorrectable ECC error(s) since the driver loaded (nvidia-smi)")
    if problems:
        ok, checkable, reason = False, True, f"{label}: " + "; ".join(problems)
    elif unknown or not checks:
        ok, checkable = False, False
        reason = f"{label}: cannot check: " + ("; ".join(unknown) if unknown else "no check ran")
    else:
        total = sum(c.runs for c in checks)
        ok, checkable, reason = True, True, f"{label}: {len(checks)} checks, {total} runs, all bitwise identical"
    return GpuReport(
        index=index, name=name, ok=ok, checkable=checkable, reason=reason,
        driver=smi_row.get("driver"), uuid=gpu.get("uuid") or smi_row.get("uuid"),
        pci_bus_id=gpu.get("pci_bus_id") or smi_row.get("pci_bus_id"),
        clock_sm_mhz=_int(smi_row.get("clock_sm_mhz")), clock_mem_mhz=_int(smi_row.get("clock_mem_mhz")),
        clock_max_sm_mhz=_int(smi_row.get("clock_max_sm_mhz")),
        temperature_c=_int(smi_row.get("temperature_c")), ecc_uncorrected=ecc, checks=checks,
    )


def _last_line(text: Any) -> str:
    lines = [ln.strip() for ln in str(text or "").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def judge_gpu_results(raw: Mapping[str, Any], fault_rate: float = DEFAULT_FAULT_RATE) -> GpuVerdict:
    """Decide from what the probe and nvidia-smi reported. ``raw`` holds:

    - ``probe``: the probe's final record (``PROBE_RESULT``), or None when it gave none;
    - ``gpus_done``: per-device records printed before the end (what a timed-out probe finished);
    - ``nvidia_smi``: rows from :func:`parse_nvidia_smi_csv`, or None when nvidia-smi is missing;
    - ``timed_out``, ``timeout``, ``returncode``, ``stderr_tail``, ``start_error``, ``python``: how
      the probe ended (or why it never started).

    A bare probe record (with ``gpus``/``error`` at the top) is accepted too. Any bit that differs
    between repeats, any CUDA error, any uncorrectable ECC error or a hung probe is unhealthy; no
    torch, no device, or memory taken by another process means the GPU cannot be checked. The
    verdict states its detection power for ``fault_rate`` from the fewest runs any check made.
    """
    if "probe" not in raw and ("gpus" in raw or "error" in raw):
        raw = {"probe": raw}
    probe = raw.get("probe") if isinstance(raw.get("probe"), Mapping) else None
    smi = [r for r in raw.get("nvidia_smi") or () if isinstance(r, Mapping)]
    python = raw.get("python")
    torch_v = probe.get("torch") if probe else None
    cuda_v = probe.get("cuda") if probe else None

    def verdict(ok: bool, checkable: bool, reason: str, gpus: Sequence[GpuReport] = ()) -> GpuVerdict:
        runs = [c.runs for g in gpus for c in g.checks if c.error is None and c.runs >= 2]
        power = power_statement(min(runs), fault_rate) if runs else None
        return GpuVerdict(ok=ok, checkable=checkable, reason=reason, gpus=tuple(gpus), torch=torch_v,
                          cuda=cuda_v, python=python, power=power)

    done = [g for g in raw.get("gpus_done") or () if isinstance(g, Mapping)]
    if probe is None:
        partial = [_judge_gpu(g, _match_smi(g, smi, False)) for g in done]
        failed = [g for g in partial if g.checkable and not g.ok]
        if raw.get("timed_out"):
            hung = len(done)
            reason = (f"the GPU check did not finish within {float(raw.get('timeout') or 0):.0f} s "
                      f"(GPU {hung} never reported: a hung GPU or driver)")
            if failed:
                reason = failed[0].reason + "; and " + reason
            return verdict(False, True, reason, partial)
        if raw.get("start_error"):
            return verdict(False, False, f"{raw['start_error']}; pass --python with an interpreter that has torch")
        evidence = _last_line(raw.get("stderr_tail"))
        code = raw.get("returncode")
        how = f"died of signal {-code}" if isinstance(code, int) and code < 0 else f"exited with status {code}"
        reason = f"the GPU probe {how} without a result" + (f": {evidence}" if evidence else "")
        if failed:
            return verdict(False, True, failed[0].reason + "; then " + reason, partial)
        if evidence and _blames_gpu(evidence):
            return verdict(False, True, reason, partial)
        return verdict(False, False, reason, partial)

    error = probe.get("error")
    if error:
        text = str(error)
        if text.startswith("torch not installed"):
            where = f" for {python}" if python else ""
            return verdict(False, False, f"{text}{where}; install torch or pass --python")
        if text == "no CUDA device":
            hints = [w for w in probe.get("warnings") or () if isinstance(w, str)]
            reason = "no CUDA device"
            if hints:
                reason += f" (torch: {hints[0][:200]})"
            if smi:
                reason += (f"; nvidia-smi lists {len(smi)} GPU(s): check CUDA_VISIBLE_DEVICES and that "
                           "torch was built with CUDA")
            return verdict(False, False, reason)
        return verdict(False, _blames_gpu(text), f"GPU probe error: {text[:300]}")

    gpus = [g for g in probe.get("gpus") or () if isinstance(g, Mapping)]
    if not gpus:
        return verdict(False, False, "the probe checked no GPU")
    same_count = len(smi) == len(gpus)
    reports = [_judge_gpu(g, _match_smi(g, smi, same_count)) for g in gpus]
    bad = [g for g in reports if g.checkable and not g.ok]
    unknown = [g for g in reports if not g.checkable]
    if bad:
        more = f" (and {len(bad) - 1} more GPU(s))" if len(bad) > 1 else ""
        return verdict(False, True, bad[0].reason + more, reports)
    if unknown:
        return verdict(False, False, unknown[0].reason, reports)
    noun = "GPU" if len(reports) == 1 else "GPUs"
    return verdict(True, True, f"{len(reports)} {noun} passed every check (results bitwise repeatable)",
                   reports)


# ---------------------------------------------------------------------------------------------
# nvidia-smi (no CUDA context: NVML through a separate program)


def parse_nvidia_smi_csv(text: str, fields: Sequence[str] = _SMI_FIELDS) -> list[dict[str, Any]]:
    """Rows of ``nvidia-smi --query-gpu=... --format=csv,noheader,nounits``; ``[N/A]``,
    ``[Not Supported]`` and friends become None."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(fields):
            continue
        row: dict[str, Any] = {}
        for name, value in zip(fields, parts):
            key = _SMI_KEYS.get(name, name)
            if not value or value.startswith("[") or value.upper() in ("N/A", "NOT SUPPORTED"):
                row[key] = None
            elif key in _SMI_INTS:
                row[key] = _int(value.split(".")[0])
            else:
                row[key] = value
        rows.append(row)
    return rows


def query_nvidia_smi(timeout: float = SMI_TIMEOUT) -> list[dict[str, Any]] | None:
    """GPU identity, clocks, temperature and ECC counters; None when nvidia-smi is absent or fails."""
    for fields in (_SMI_FIELDS, _SMI_MINIMAL):
        try:
            proc = subprocess.run(
                ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
                check=False, capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if proc.returncode == 0:
            return parse_nvidia_smi_csv(proc.stdout, fields)
    return None


# ---------------------------------------------------------------------------------------------
# Running the probe


def parse_probe_output(stdout: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """(final record or None, per-device records) from the probe's stdout; other lines ignored."""
    final: dict[str, Any] | None = None
    done: list[dict[str, Any]] = []
    for line in stdout.splitlines():
        for prefix in (RESULT_PREFIX, GPU_PREFIX):
            if line.startswith(prefix):
                try:
                    record = json.loads(line[len(prefix):])
                except ValueError:
                    break
                if isinstance(record, dict):
                    if prefix == RESULT_PREFIX:
                        final = record
                    else:
                        done.append(record)
                break
    return final, done


def collect_raw(timeout: float = DEFAULT_TIMEOUT, *, python: str | None = None,
                probe_args: Sequence[str] = (), environ: Mapping[str, str] | None = None,
                smi: bool = True) -> dict[str, Any]:
    """Run nvidia-smi and the probe (killed as a process group at ``timeout``); the raw observations."""
    python = python or sys.executable
    raw: dict[str, Any] = {"python": python, "timeout": timeout, "timed_out": False, "returncode": None,
                           "stderr_tail": "", "probe": None, "gpus_done": [],
                           "nvidia_smi": query_nvidia_smi() if smi else None}
    env = dict(os.environ if environ is None else environ)
    env["PYTHONUNBUFFERED"] = "1"
    try:
        proc = subprocess.Popen([python, str(PROBE_PATH), *probe_args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    except OSError as exc:
        raw["start_error"] = f"cannot start {python}: {exc.strerror or exc}"
        return raw
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raw["timed_out"] = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            stdout, stderr = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # stuck in the kernel (D state): report what we have
            stdout, stderr = "", ""
    raw["returncode"] = proc.returncode
    raw["stderr_tail"] = (stderr or "")[-4000:]
    raw["probe"], raw["gpus_done"] = parse_probe_output(stdout or "")
    return raw


def run_check(timeout: float = DEFAULT_TIMEOUT, *, python: str | None = None,
              probe_args: Sequence[str] | None = None, environ: Mapping[str, str] | None = None,
              fault_rate: float = DEFAULT_FAULT_RATE) -> GpuVerdict:
    """The preflight for ``preflight: [gpu]``: probe in a subprocess, bounded by ``timeout`` seconds.

    ``python`` is the interpreter that has torch (default: the supervisor's own); pass the training
    command's interpreter when the supervisor lives in a torch-less environment. ``probe_args``
    default to :func:`probe_args_for` with :data:`DEFAULT_REPEATS`."""
    args = probe_args_for() if probe_args is None else list(probe_args)
    return judge_gpu_results(collect_raw(timeout, python=python, probe_args=args, environ=environ), fault_rate)
