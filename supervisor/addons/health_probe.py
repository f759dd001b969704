"""GPU repeatability probe, run as a separate process by :mod:`supervisor.addons.health` (never imported by
the supervisor: it imports torch and touches CUDA).

Why repeatability: a GPU with a marginal SM, bad HBM or an overheating part often still runs every
kernel without error but returns slightly different numbers now and then (silent data corruption).
With deterministic algorithms the same kernel on the same input must give the same bits every time,
so any difference at all between repeats is a fault, never a tolerance question.

The shapes include the case known to catch bad cards that pass everything else: a conv2d on a large
image with few output channels (1 and 4), whose result differed on well under 1 % of calls on a
faulty GPU. Intermittent faults are why the run count matters: ``--runs 300`` catches a fault on
1 % of calls with probability 1-0.99**300 = 95 %.

Self-contained on purpose (stdlib + torch, no package imports): :func:`supervisor.addons.health.run_check`
runs this file by path with whatever Python holds torch, even one where ``supervisor`` is not installed.

Output: one ``PROBE_GPU <json>`` line per device as soon as it is done (so a timeout still shows which
device hung) and one ``PROBE_RESULT <json>`` line at the end, both on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from typing import Any

GPU_PREFIX = "PROBE_GPU "
RESULT_PREFIX = "PROBE_RESULT "


def _emit(prefix: str, record: dict[str, Any]) -> None:
    sys.stdout.write(prefix + json.dumps(record, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def _bits(tensor: Any, torch: Any) -> Any:
    """The tensor's raw bits as integers, so that NaN, -0.0 and every ulp compare exactly."""
    width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()]
    return tensor.contiguous().view(width)


def _repeat(name: str, runs: int, compute: Any, torch: Any, sync: Any) -> dict[str, Any]:
    """Run ``compute`` ``runs`` times; count results that differ in any bit from the first one."""
    started = time.monotonic()
    record: dict[str, Any] = {"name": name, "runs": runs, "mismatches": None, "max_abs_diff": None,
                              "first_bad_run": None, "seconds": None, "error": None}
    try:
        reference = compute()
        ref_bits = _bits(reference, torch)
        ref_float = reference.float()
        # Counted on the device, read back once: a per-run sync would slow the check for nothing.
        bad_runs = torch.zeros((), dtype=torch.int64, device=reference.device)
        max_diff = torch.zeros((), dtype=torch.float32, device=reference.device)
        first_bad = torch.full((), runs, dtype=torch.int64, device=reference.device)
        for index in range(1, runs):
            out = compute()
            differs = (_bits(out, torch) != ref_bits).any()
            bad_runs += differs.to(torch.int64)
            first_bad = torch.where(differs & (first_bad == runs), torch.full_like(first_bad, index), first_bad)
            diff = (out.float() - ref_float).abs().nan_to_num(nan=float("inf")).max()
            max_diff = torch.maximum(max_diff, torch.where(differs, diff, torch.zeros_like(diff)))
        sync()
        record["mismatches"] = int(bad_runs.item())
        record["max_abs_diff"] = float(max_diff.item())
        record["first_bad_run"] = None if int(first_bad.item()) == runs else int(first_bad.item())
    except Exception as exc:  # noqa: BLE001 - a GPU that errors while computing is the finding
        record["error"] = f"{type(exc).__name__}: {exc}".strip()[:2000]
    record["seconds"] = round(time.monotonic() - started, 4)
    return record


def _checks_for(device: Any, args: argparse.Namespace, torch: Any) -> list[dict[str, Any]]:
    """The checks on one device: conv2d (cuDNN) with 8, 1 and 4 output channels, fp32 and bf16
    matmul (cuBLAS)."""
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    size, msize, large = args.size, args.matmul_size, args.large_size
    matmul_runs = args.matmul_runs if args.matmul_runs is not None else args.runs

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def conv2d() -> dict[str, Any]:
        # Few channels on a large image: many output pixels, each from the same small kernel.
        image = torch.randn(1, 3, size, size, generator=gen).to(device)
        weight = torch.randn(8, 3, 3, 3, generator=gen).to(device)
        bias = torch.randn(8, generator=gen).to(device)
        return _repeat(f"conv2d_fp32_{size}", args.runs,
                       lambda: torch.nn.functional.conv2d(image, weight, bias, padding=1), torch, sync)

    def conv2d_few_out(out_channels: int) -> dict[str, Any]:
        # The bad-card case: a large image reduced to 1-4 output channels. cuDNN picks other kernels
        # for so few outputs (long reductions per output pixel), and those were the ones that erred.
        image = torch.randn(1, args.large_channels, large, large, generator=gen).to(device)
        weight = torch.randn(out_channels, args.large_channels, 3, 3, generator=gen).to(device)
        return _repeat(f"conv2d_fp32_{large}_out{out_channels}", args.runs,
                       lambda: torch.nn.functional.conv2d(image, weight, None, padding=1), torch, sync)

    def matmul(dtype: Any, label: str) -> dict[str, Any]:
        a = torch.randn(msize, msize, generator=gen).to(device, dtype)
        b = torch.randn(msize, msize, generator=gen).to(device, dtype)
        return _repeat(f"matmul_{label}_{msize}", matmul_runs, lambda: a @ b, torch, sync)

    results = []
    for run in (conv2d, lambda: conv2d_few_out(1), lambda: conv2d_few_out(4),
                lambda: matmul(torch.float32, "fp32"), lambda: matmul(torch.bfloat16, "bf16")):
        try:
            results.append(run())
        except Exception as exc:  # noqa: BLE001 - allocation or transfer failed before the check ran
            results.append({"name": "setup", "runs": 0, "mismatches": None, "max_abs_diff": None,
                            "first_bad_run": None, "seconds": None,
                            "error": f"{type(exc).__name__}: {exc}".strip()[:2000]})
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return results


def _device_record(index: int, torch: Any, device_type: str) -> dict[str, Any]:
    record: dict[str, Any] = {"index": index, "name": None, "uuid": None, "pci_bus_id": None,
                              "capability": None, "multiprocessors": None, "memory_bytes": None}
    if device_type != "cuda":
        record["name"] = "cpu"
        return record
    try:
        props = torch.cuda.get_device_properties(index)
        record["name"] = props.name
        record["capability"] = f"{props.major}.{props.minor}"
        record["multiprocessors"] = props.multi_processor_count
        record["memory_bytes"] = props.total_memory
        uuid = getattr(props, "uuid", None)
        record["uuid"] = str(uuid) if uuid is not None else None
        bus = getattr(props, "pci_bus_id", None)
        if bus is not None:
            domain = getattr(props, "pci_domain_id", 0) or 0
            device = getattr(props, "pci_device_id", 0) or 0
            record["pci_bus_id"] = f"{domain:08X}:{bus:02X}:{device:02X}.0"
    except Exception as exc:  # noqa: BLE001
        record["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu exists to test the probe itself on machines without a GPU")
    parser.add_argument("--index", type=int, action="append", help="device index (repeatable; default all)")
    parser.add_argument("--size", type=int, default=4096, help="conv2d input is 1x3xSIZExSIZE")
    parser.add_argument("--large-size", type=int, default=4096,
                        help="few-output-channel conv2d input is 1xCHANNELSxSIZExSIZE")
    parser.add_argument("--large-channels", type=int, default=8)
    parser.add_argument("--runs", type=int, default=300, help="runs of every check (matmuls too, unless "
                        "--matmul-runs); 300 catch a 1 %% per-call fault with probability 95 %%")
    parser.add_argument("--matmul-size", type=int, default=4096)
    parser.add_argument("--matmul-runs", type=int, default=None, help="[--runs]")
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args(argv)

    result: dict[str, Any] = {"torch": None, "cuda": None, "cudnn": None, "device_count": 0,
                              "gpus": [], "error": None, "warnings": []}
    # Before torch loads cuBLAS: a fixed workspace makes cuBLAS reductions repeatable.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - ImportError, or a broken install raising anything
        result["error"] = f"torch not installed ({type(exc).__name__}: {exc})"[:2000]
        _emit(RESULT_PREFIX, result)
        return 0
    result["torch"] = torch.__version__
    result["cuda"] = torch.version.cuda
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    if args.device == "cuda":
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            available = torch.cuda.is_available()
            count = torch.cuda.device_count() if available else 0
        result["warnings"] = [str(w.message)[:500] for w in caught][:5]
        if not count:
            result["error"] = "no CUDA device"
            _emit(RESULT_PREFIX, result)
            return 0
        try:
            result["cudnn"] = torch.backends.cudnn.version()
        except Exception as exc:  # noqa: BLE001 - the version is informational
            result["warnings"].append(f"cudnn version unknown: {exc}"[:500])
    else:
        count = 1
    result["device_count"] = count
    indices = args.index if args.index else list(range(count))
    for index in indices:
        record = _device_record(index, torch, args.device)
        if "error" not in record:
            device = torch.device(args.device, index) if args.device == "cuda" else torch.device("cpu")
            if args.device == "cuda":
                torch.cuda.set_device(device)
            record["checks"] = _checks_for(device, args, torch)
        else:
            record["checks"] = []
        _emit(GPU_PREFIX, record)
        result["gpus"].append(record)
    _emit(RESULT_PREFIX, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
