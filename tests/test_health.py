"""GPU health preflight: the verdict table (pure), the probe's bitwise comparison, the real probe on
this machine's CPU, and ``supervise check-gpu`` here, where there is no GPU (exit 2, a clear reason).
A real GPU run is marked ``gpu`` (skipped here, visibly; benchmarks/gpu/run_all.sh runs it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from supervisor.cli.gpu_cmd import render
from supervisor.config import GpuCheckConfig, load_config
from supervisor.errors import ConfigError
from supervisor.addons.health import (
    DEFAULT_REPEATS,
    EXIT_CANNOT_CHECK,
    EXIT_HEALTHY,
    EXIT_UNHEALTHY,
    PROBE_PATH,
    after_loss_anomaly,
    detection_power,
    judge_gpu_results,
    parse_nvidia_smi_csv,
    parse_probe_output,
    power_statement,
    probe_args_for,
    repeats_for_power,
    run_check,
)

REPO = Path(__file__).resolve().parent.parent
UUID0 = "GPU-1b2c3d4e-0000-1111-2222-333344445555"
UUID1 = "GPU-9f8e7d6c-0000-1111-2222-333344445555"


def check(name: str = "conv2d_fp32_2048", runs: int = 64, mismatches: int | None = 0, diff: float | None = 0.0,
          error: str | None = None, first_bad: int | None = None) -> dict[str, Any]:
    return {"name": name, "runs": runs, "mismatches": mismatches, "max_abs_diff": diff,
            "first_bad_run": first_bad, "seconds": 0.5, "error": error}


def gpu(index: int = 0, *checks: dict[str, Any], uuid: str | None = UUID0) -> dict[str, Any]:
    return {"index": index, "name": "NVIDIA H200", "uuid": uuid and uuid.removeprefix("GPU-"),
            "pci_bus_id": None, "checks": list(checks) or [check(), check("matmul_bf16_4096", 24)]}


def smi_row(index: int = 0, uuid: str = UUID0, ecc: int | None = 0) -> dict[str, Any]:
    return {"index": index, "name": "NVIDIA H200", "driver": "580.159.04", "uuid": uuid,
            "pci_bus_id": f"00000000:{index + 0x18:02X}:00.0", "clock_sm_mhz": 1980, "clock_mem_mhz": 3201,
            "clock_max_sm_mhz": 1980, "temperature_c": 40, "ecc_uncorrected": ecc}


def raw(*gpus: dict[str, Any], smi: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    probe = {"torch": "2.11.0+cu130", "cuda": "13.0", "device_count": len(gpus), "gpus": list(gpus),
             "error": None, "warnings": []}
    return {"probe": probe, "gpus_done": list(gpus), "nvidia_smi": smi, "timed_out": False, "timeout": 180,
            "returncode": 0, "stderr_tail": "", "python": "/usr/bin/python3", **extra}


# --------------------------------------------------------------------------- the verdict table


def test_bitwise_identical_repeats_are_healthy() -> None:
    verdict = judge_gpu_results(raw(gpu(0), smi=[smi_row(0)]))
    assert verdict.ok and verdict.checkable and verdict.exit_code == EXIT_HEALTHY
    assert "bitwise" in verdict.reason
    (report,) = verdict.gpus
    assert (report.driver, report.clock_sm_mhz, report.ecc_uncorrected) == ("580.159.04", 1980, 0)


def test_one_differing_repeat_is_unhealthy_and_named() -> None:
    bad = check("conv2d_fp32_2048", runs=64, mismatches=3, diff=0.0078125, first_bad=17)
    verdict = judge_gpu_results(raw(gpu(0), gpu(1, bad, uuid=UUID1), smi=[smi_row(0), smi_row(1, UUID1)]))
    assert not verdict.ok and verdict.checkable and verdict.exit_code == EXIT_UNHEALTHY
    assert [g.index for g in verdict.bad_gpus] == [1]
    assert verdict.reason.startswith("GPU 1 (NVIDIA H200): conv2d_fp32_2048 gave a different result in 3 of 63")
    assert "0.00781" in verdict.reason and "run 17" in verdict.reason


def test_a_mismatch_is_a_failure_however_small() -> None:
    tiny = check(mismatches=1, diff=1e-45)  # one ulp of a denormal: still not the same bits
    assert judge_gpu_results(raw(gpu(0, tiny))).exit_code == EXIT_UNHEALTHY


@pytest.mark.parametrize("error, code", [
    ("AcceleratorError: CUDA error: an illegal memory access was encountered", EXIT_UNHEALTHY),
    ("RuntimeError: CUDA error: uncorrectable ECC error encountered", EXIT_UNHEALTHY),
    ("RuntimeError: CUDA error: unspecified launch failure", EXIT_UNHEALTHY),
    ("OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB", EXIT_CANNOT_CHECK),
    ("RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable", EXIT_CANNOT_CHECK),
    ("RuntimeError: cuDNN error: CUDNN_STATUS_NOT_SUPPORTED", EXIT_CANNOT_CHECK),
])
def test_errors_during_a_check_blame_the_gpu_only_when_they_point_at_it(error: str, code: int) -> None:
    verdict = judge_gpu_results(raw(gpu(0, check(mismatches=None, diff=None, error=error))))
    assert verdict.exit_code == code
    assert error.split(": ", 1)[1][:40] in verdict.reason


def test_uncorrectable_ecc_errors_are_unhealthy_even_with_clean_checks() -> None:
    verdict = judge_gpu_results(raw(gpu(0), smi=[smi_row(0, ecc=2)]))
    assert verdict.exit_code == EXIT_UNHEALTHY and "2 uncorrectable ECC error(s)" in verdict.reason


def test_nvidia_smi_rows_are_matched_by_uuid_not_by_position() -> None:
    """CUDA_VISIBLE_DEVICES=3 makes torch's device 0 nvidia-smi's GPU 3: its ECC count must follow."""
    smi = [smi_row(i, f"GPU-0000000{i}-0000-1111-2222-333344445555") for i in range(3)] + [smi_row(3, UUID0, ecc=1)]
    verdict = judge_gpu_results(raw(gpu(0, uuid=UUID0), smi=smi))
    assert verdict.exit_code == EXIT_UNHEALTHY and verdict.gpus[0].ecc_uncorrected == 1


def test_no_torch_and_no_device_cannot_be_checked() -> None:
    no_torch = judge_gpu_results({"probe": {"error": "torch not installed (ModuleNotFoundError: No module "
                                                     "named 'torch')"}, "python": "/opt/py/bin/python"})
    assert no_torch.exit_code == EXIT_CANNOT_CHECK and no_torch.reason.startswith("torch not installed")
    assert "/opt/py/bin/python" in no_torch.reason and "--python" in no_torch.reason
    no_gpu = judge_gpu_results({"probe": {"torch": "2.13.0+cpu", "error": "no CUDA device", "gpus": []},
                                "nvidia_smi": None})
    assert no_gpu.exit_code == EXIT_CANNOT_CHECK and no_gpu.reason == "no CUDA device"
    hidden = judge_gpu_results({"probe": {"torch": "2.11", "error": "no CUDA device", "gpus": []},
                                "nvidia_smi": [smi_row(0)]})
    assert "nvidia-smi lists 1 GPU(s)" in hidden.reason and "CUDA_VISIBLE_DEVICES" in hidden.reason


def test_a_hung_probe_is_unhealthy_and_names_the_gpu_that_never_reported() -> None:
    data = {"probe": None, "gpus_done": [gpu(0)], "timed_out": True, "timeout": 120.0, "returncode": -9}
    verdict = judge_gpu_results(data)
    assert verdict.exit_code == EXIT_UNHEALTHY
    assert "did not finish within 120 s" in verdict.reason and "GPU 1 never reported" in verdict.reason
    assert [g.ok for g in verdict.gpus] == [True]


def test_a_crashed_probe_blames_the_gpu_only_on_gpu_evidence() -> None:
    base = {"probe": None, "gpus_done": [], "timed_out": False, "returncode": 1}
    broken = judge_gpu_results({**base, "stderr_tail": "Traceback ...\nImportError: libcudnn.so.9: cannot open"})
    assert broken.exit_code == EXIT_CANNOT_CHECK and "exited with status 1" in broken.reason
    lost = judge_gpu_results({**base, "stderr_tail": "RuntimeError: CUDA error: unknown error\n"
                                                     "Xid 79: GPU has fallen off the bus"})
    assert lost.exit_code == EXIT_UNHEALTHY
    killed = judge_gpu_results({**base, "returncode": -11, "stderr_tail": ""})
    assert "died of signal 11" in killed.reason and killed.exit_code == EXIT_CANNOT_CHECK


def test_verdict_json_has_the_documented_keys() -> None:
    data = judge_gpu_results(raw(gpu(0), smi=[smi_row(0)])).to_dict()
    assert {"ok", "checkable", "reason", "gpus", "exit_code"} <= set(data)
    first = data["gpus"][0]
    assert {"index", "name", "driver", "checks"} <= set(first)
    assert {"name", "ok", "max_abs_diff", "runs"} <= set(first["checks"][0])
    json.dumps(data)  # plain data


def test_human_output_says_what_failed() -> None:
    verdict = judge_gpu_results(raw(gpu(0, check(mismatches=2, diff=0.5)), smi=[smi_row(0)]))
    text = render(verdict)
    assert "GPU 0  NVIDIA H200  driver 580.159.04  SM 1980/1980 MHz" in text
    assert "MISMATCH in 2 runs" in text and text.splitlines()[-1].startswith("UNHEALTHY: GPU 0")


# --------------------------------------------------------------------------- parsing


def test_nvidia_smi_csv_unsupported_values_become_none() -> None:
    text = ("0, NVIDIA H200, 580.159.04, GPU-abc, 00000000:18:00.0, 1980, 3201, 1980, 41, 0\n"
            "1, NVIDIA H200, 580.159.04, GPU-def, 00000000:2A:00.0, [N/A], [N/A], 1980, 39, [Not Supported]\n")
    rows = parse_nvidia_smi_csv(text)
    assert rows[0]["clock_sm_mhz"] == 1980 and rows[0]["ecc_uncorrected"] == 0 and rows[0]["driver"] == "580.159.04"
    assert rows[1]["clock_sm_mhz"] is None and rows[1]["ecc_uncorrected"] is None and rows[1]["index"] == 1


def test_probe_output_keeps_finished_gpus_when_the_end_is_missing() -> None:
    stdout = 'some warning\nPROBE_GPU {"index": 0, "checks": []}\nPROBE_GPU {"index": 1, "che'
    final, done = parse_probe_output(stdout)
    assert final is None and [g["index"] for g in done] == [0]


# --------------------------------------------------------------------------- the probe for real


def test_probe_comparison_sees_every_bit() -> None:
    """-0.0 == 0.0 and NaN != NaN in float compares; the probe compares bits, so both count correctly."""
    torch = pytest.importorskip("torch")
    sys.path.insert(0, str(PROBE_PATH.parent))
    import health_probe  # the standalone script, imported for its comparison only

    outputs = iter([torch.tensor([0.0, float("nan")]), torch.tensor([0.0, float("nan")]),
                    torch.tensor([-0.0, float("nan")]), torch.tensor([0.0, float("nan")])])
    record = health_probe._repeat("signed_zero", 4, lambda: next(outputs), torch, lambda: None)
    assert record["mismatches"] == 1 and record["first_bad_run"] == 2 and record["error"] is None


def test_probe_on_cpu_runs_every_check_and_judges_healthy() -> None:
    """The real probe subprocess (on the CPU: its --device cpu mode exists for this), judged. The
    checks include the bad-card shape: a large image reduced to 1 and 4 output channels."""
    pytest.importorskip("torch")
    verdict = run_check(120, probe_args=["--device", "cpu", "--size", "64", "--large-size", "96", "--runs", "3",
                                         "--matmul-size", "64", "--matmul-runs", "3"])
    assert verdict.ok, verdict.reason
    assert [c.name for c in verdict.gpus[0].checks] == ["conv2d_fp32_64", "conv2d_fp32_96_out1", "conv2d_fp32_96_out4",
                                                        "matmul_fp32_64", "matmul_bf16_64"]
    assert all(c.mismatches == 0 and c.runs == 3 for c in verdict.gpus[0].checks)
    assert verdict.power is not None and verdict.power.repeats == 3


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has a GPU")
def test_check_gpu_without_a_gpu_exits_2_with_the_reason() -> None:
    proc = subprocess.run([sys.executable, "-m", "supervisor", "check-gpu", "--json"], capture_output=True,
                          text=True, timeout=180, cwd=REPO, check=False)
    assert proc.returncode == EXIT_CANNOT_CHECK, proc.stderr
    data = json.loads(proc.stdout)
    assert data["ok"] is False and data["checkable"] is False and data["exit_code"] == 2
    assert data["reason"] in ("no CUDA device",) or data["reason"].startswith("torch not installed")


def test_check_gpu_with_a_missing_interpreter_is_a_clear_cannot_check() -> None:
    proc = subprocess.run([sys.executable, "-m", "supervisor", "check-gpu", "--python", "/nonexistent/python"],
                          capture_output=True, text=True, timeout=60, cwd=REPO, check=False)
    assert proc.returncode == EXIT_CANNOT_CHECK
    assert proc.stdout.strip() == ("cannot check: cannot start /nonexistent/python: No such file or directory; "
                                   "pass --python with an interpreter that has torch")
    assert "Traceback" not in proc.stderr


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs an NVIDIA GPU; CI has none "
                    "(benchmarks/gpu/run_all.sh runs check-gpu on the H200)")
def test_check_gpu_on_a_real_gpu_is_healthy() -> None:
    proc = subprocess.run([sys.executable, "-m", "supervisor", "check-gpu", "--json"], capture_output=True,
                          text=True, timeout=300, cwd=REPO, check=False)
    data = json.loads(proc.stdout)
    assert proc.returncode == 0, data["reason"]
    assert all(c["mismatches"] == 0 for g in data["gpus"] for c in g["checks"])


# --------------------------------------------------------------------------- detection power


@pytest.mark.parametrize("rate, repeats", [(0.01, 100), (0.01, 300), (0.001, 3000), (0.05, 20)])
def test_detection_power_is_one_minus_the_chance_every_repeat_is_clean(rate: float, repeats: int) -> None:
    assert detection_power(rate, repeats) == pytest.approx(1 - (1 - rate) ** repeats)


def test_the_old_fixed_100_repeats_miss_a_one_percent_fault_37_percent_of_the_time() -> None:
    assert 1 - detection_power(0.01, 100) == pytest.approx(0.366, abs=0.001)
    assert detection_power(0.01, DEFAULT_REPEATS) >= 0.95


@pytest.mark.parametrize("rate, power", [(0.01, 0.95), (0.01, 0.99), (0.001, 0.9), (0.2, 0.5)])
def test_repeats_for_power_is_the_fewest_that_reach_it(rate: float, power: float) -> None:
    n = repeats_for_power(rate, power)
    assert detection_power(rate, n) >= power > detection_power(rate, n - 1)


def test_every_verdict_that_ran_checks_states_its_power() -> None:
    bad = check(runs=300, mismatches=1, diff=0.5)
    verdict = judge_gpu_results(raw(gpu(0, bad, check("matmul_bf16_4096", runs=300))), fault_rate=0.01)
    assert verdict.power is not None and verdict.power.repeats == 300
    assert verdict.power.probability == pytest.approx(detection_power(0.01, 300), abs=1e-6)
    assert verdict.power.repeats_for_target == repeats_for_power(0.01, 0.99)
    text = render(verdict)
    assert "detects a per-call fault rate >= 1 % with probability 95.1 %" in text
    assert f"99 % needs {repeats_for_power(0.01, 0.99)} repeats" in text
    assert text.splitlines()[-1].startswith("UNHEALTHY")  # the verdict stays the last line
    assert verdict.to_dict()["power"]["probability"] == verdict.power.probability
    nothing = judge_gpu_results({"probe": {"error": "no CUDA device", "gpus": []}})
    assert nothing.power is None


def test_power_is_stated_for_the_fewest_runs_any_check_made() -> None:
    verdict = judge_gpu_results(raw(gpu(0, check(runs=300), check("matmul_fp32_4096", runs=50))))
    assert verdict.power is not None and verdict.power.repeats == 50
    assert power_statement(50).probability == verdict.power.probability


def test_probe_args_give_every_check_the_repeats() -> None:
    assert probe_args_for(459, [1]) == ["--runs", "459", "--matmul-runs", "459", "--index", "1"]


def test_check_gpu_power_picks_the_repeats_and_refuses_both_options() -> None:
    both = subprocess.run([sys.executable, "-m", "supervisor", "check-gpu", "--repeats", "10", "--power", "0.9"],
                          capture_output=True, text=True, timeout=60, cwd=REPO, check=False)
    assert both.returncode == 2 and "give --repeats or --power, not both" in both.stderr
    assert "Traceback" not in both.stderr


# --------------------------------------------------------------------------- after a loss anomaly


@pytest.mark.parametrize("mode, anomalies, run", [
    ("nonfinite", ["nan"], True),
    ("nonfinite", ["spike", "inf"], True),
    ("nonfinite", ["spike", "spike"], False),
    ("any", ["spike"], True),
    ("off", ["nan", "inf"], False),
    ("any", [], False),
])
def test_a_loss_anomaly_leads_to_a_gpu_check_as_the_policy_says(mode: str, anomalies: list[str], run: bool) -> None:
    decision = after_loss_anomaly(GpuCheckConfig(after_loss_anomaly=mode), anomalies)
    assert decision.run is run and decision.reason


def test_the_default_policy_checks_the_gpu_after_a_nan_loss() -> None:
    assert after_loss_anomaly(load_config(environ={}).gpu_check, ["nan"]).run


@pytest.mark.parametrize("key, value", [("repeats", "1"), ("fault_rate", "1.5"), ("after_loss_anomaly", "always")])
def test_bad_gpu_check_settings_are_refused_with_the_key(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=f"gpu_check.{key}"):
        load_config(environ={f"SUPERVISE_GPU_CHECK__{key.upper()}": value})


# --------------------------------------------------------------------------- the preflight in the templates


def _run_template(name: str, tmp_path: Path, env_extra: dict[str, str]) -> str:
    """Run a rendered template with stand-ins for srun (drops its options) and supervise (prints the
    preflight setting it was started with); returns what supervise saw."""
    from supervisor.addons import templates

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "srun").write_text('#!/bin/bash\nwhile [ $# -gt 0 ] && [[ "$1" == -* ]]; do shift; done\nexec "$@"\n')
    (bin_dir / "supervise").write_text('#!/bin/bash\necho "preflight=${SUPERVISE_PREFLIGHT-<unset>}"\n')
    for tool in ("srun", "supervise"):
        (bin_dir / tool).chmod(0o755)
    values = {"run_dir": str(tmp_path / "run"), "command": ["python", "train.py"], "gpus_per_node": 4,
              "supervise": str(bin_dir / "supervise")}
    if name == "time_limit":
        values["time"] = "4:00:00"
    script = tmp_path / f"{name}.sbatch"
    script.write_text(templates.render(name, **values))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERVISE_", "SLURM", "CUDA_VISIBLE"))}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", SLURM_JOB_ID="7", SLURM_CPUS_ON_NODE="4",
               SLURM_JOB_NUM_NODES="1", SLURM_NODEID="0", **env_extra)
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=20, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("name", ["single_node", "multi_node", "multi_node_per_node", "preemptible", "time_limit"])
def test_gpu_templates_run_the_preflight_where_the_job_has_gpus(name: str, tmp_path: Path) -> None:
    assert _run_template(name, tmp_path, {"SLURM_GPUS_ON_NODE": "4"}) == "preflight=gpu"
    assert _run_template(name, tmp_path, {}) == "preflight=<unset>"  # no GPU: nothing to check
    # a person's choice at submission wins
    assert _run_template(name, tmp_path, {"SLURM_GPUS_ON_NODE": "4", "SUPERVISE_PREFLIGHT": "[]"}) == "preflight=[]"
    assert load_config(environ={"SUPERVISE_PREFLIGHT": "gpu"}).preflight == ("gpu",)
    assert load_config(environ={"SUPERVISE_PREFLIGHT": "[]"}).preflight == ()
