"""``supervise diagnose``: the output parsers on text captured from real failures (compute-sanitizer
on the H200, a real device-side assert), the planning from an event log, and the whole command on
this CPU machine against a real ``supervise run`` whose training fails with CUDA's error text.

No GPU and no compute-sanitizer here: the training stand-in prints CUDA's message and exits like
PyTorch does, and one test puts a compute-sanitizer stand-in on PATH that replays the records the
real sanitizer printed on the H200 (benchmarks/gpu/results/2026-12-01-h200/) before running the
command. The rerun, its bounds, the checkpoint choice and the event log are all real.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from supervisor.addons.diagnose import (
    DIAGNOSABLE,
    CheckpointCandidate,
    DiagnosisOutcome,
    FailureToDiagnose,
    checkpoint_candidates,
    parse_kernel_asserts,
    parse_sanitizer,
    parse_tracebacks,
    pick_failure,
    pick_traceback,
    plan_diagnosis,
    redirect_checkpoint_args,
    sanitizer_api_errors,
    sanitizer_refused,
    snapshot_dir,
)
from supervisor.errors import UsageError
from supervisor.events import Event, read_events

REPO = Path(__file__).resolve().parent.parent
H200 = REPO / "benchmarks" / "gpu" / "results" / "2026-12-01-h200"
SANITIZER_LOG = H200 / "diagnose_ima_rerun.log"
DEVICE_ASSERT_LOG = REPO / "tests" / "data" / "logs" / "h200_real_device_assert.log"
IMA_LOG = REPO / "benchmarks" / "gpu" / "results" / "2026-11-30-h200" / "ima_attempt1.log"


# --------------------------------------------------------------------------- parsing real output


def test_memcheck_output_names_the_kernel_the_access_and_the_launching_python_line() -> None:
    (finding,) = parse_sanitizer(SANITIZER_LOG.read_text())
    assert finding.error == "Invalid __global__ write of size 4 bytes"
    assert finding.kernel == "oob_store" and finding.source is None
    assert finding.launch_site == "_ptx_store in train_plain.py:112"
    assert any("out of bounds" in d for d in finding.details)
    assert any("bytes after the nearest allocation" in d for d in finding.details)


def test_memcheck_api_errors_and_no_false_refusal() -> None:
    text = SANITIZER_LOG.read_text()
    errors = sanitizer_api_errors(text)
    assert errors[0].startswith("Program hit CUDA_ERROR_LAUNCH_FAILED (error 719)") and "cuLaunchKernel" in errors[0]
    assert sanitizer_refused(text) is None  # "Target application returned an error" is the app, not the tool


@pytest.mark.parametrize("line, kernel, source", [
    ("=========     at 0x00000170 in /src/kern.cu:12:oob_kernel(float*)", "oob_kernel(float*)", "/src/kern.cu:12"),
    ("=========     at 0x170 in oob_kernel", "oob_kernel", None),
    ("=========     at void k<float>(float*, int)+0x1a0 in /src/kern.cu:88", "void k<float>(float*, int)",
     "/src/kern.cu:88"),
])
def test_memcheck_location_formats_of_other_sanitizer_versions(line: str, kernel: str, source: str | None) -> None:
    text = f"========= Invalid __global__ read of size 8 bytes\n{line}\n=========     by thread (3,0,0) in block (1,0,0)\n"
    (finding,) = parse_sanitizer(text)
    assert (finding.kernel, finding.source) == (kernel, source)
    assert finding.error == "Invalid __global__ read of size 8 bytes"


def test_a_sanitizer_that_cannot_instrument_the_gpu_is_recognised() -> None:
    text = ("========= COMPUTE-SANITIZER\n========= Error: Device not supported. Please refer to the "
            "\"Supported Devices\" section of the sanitizer documentation\n")
    assert "Device not supported" in (sanitizer_refused(text) or "") and parse_sanitizer(text) == []


def test_a_real_device_side_assert_names_the_kernel_source_and_assertion() -> None:
    text = DEVICE_ASSERT_LOG.read_text()
    (found,) = parse_kernel_asserts(text)  # 32 threads printed the same assertion: one finding
    assert found.source.endswith("IndexKernelUtils.cu:16") and found.function == "vectorized_gather_kernel"
    assert "index out of bounds" in found.assertion
    tb = pick_traceback(parse_tracebacks(text))
    assert tb is not None and tb.error == "torch.AcceleratorError: CUDA error: device-side assert triggered"
    assert tb.user_frame is not None and tb.user_frame.file.endswith("gpu_device_assert.py")


def test_the_traceback_frame_is_the_users_not_the_librarys() -> None:
    tb = pick_traceback(parse_tracebacks(IMA_LOG.read_text()))
    assert tb is not None and tb.error.endswith("an illegal memory access was encountered")
    frame = tb.user_frame
    assert frame is not None and frame.file.endswith("examples/train_plain.py") and frame.line == 77
    assert frame.function == "illegal_memory_access" and frame.code and "synchronize" in frame.code
    assert all("site-packages" not in f.file for f in tb.frames)


def test_a_chained_exception_is_judged_by_its_cause() -> None:
    """Under the sanitizer the failed launch raised first, then the fallback failed during its
    handling: the first traceback is the root cause."""
    tracebacks = parse_tracebacks(SANITIZER_LOG.read_text())
    assert len(tracebacks) == 2
    root = pick_traceback(tracebacks)
    assert root is tracebacks[0] and root.error == "OSError: cuLaunchKernel returned CUDA driver status 719"
    assert [f.function for f in root.frames][-2:] == ["_ptx_store", "check"]


# --------------------------------------------------------------------------- planning (pure)


def ev(name: str, ts: float, **fields: object) -> Event:
    return Event(name, ts, dict(fields))


EVENTS = [
    ev("run_start", 1.0, argv=["python", "train.py", "--ckpt-dir", "/runs/x/checkpoints", "--lr", "3e-4"],
       checkpoint_dir="/runs/x/checkpoints"),
    ev("resume_point", 2.0, attempt=1, path=None, step=None),
    ev("save_end", 10.0, attempt=1, step=100, path="/runs/x/checkpoints/step=100.ckpt", ok=True),
    ev("save_end", 20.0, attempt=1, step=200, path="/runs/x/checkpoints/step=200.ckpt", ok=True),
    ev("save_end", 25.0, attempt=1, step=250, path="/runs/x/checkpoints/step=250.ckpt", ok=False),
    ev("failure", 30.0, attempt=1, step=260, evidence=["torch.AcceleratorError: CUDA error: an illegal memory access"],
       **{"class": "native_crash"}),
    ev("resume_point", 31.0, attempt=2, path="/runs/x/checkpoints/step=200.ckpt", step=200),
    ev("save_end", 40.0, attempt=2, step=300, path="/runs/x/checkpoints/step=300.ckpt", ok=True),
    ev("failure", 50.0, attempt=2, step=333, evidence=["CUDA error: an illegal memory access was encountered"],
       **{"class": "illegal_memory_access"}),
    ev("save_end", 60.0, attempt=3, step=400, path="/runs/x/checkpoints/step=400.ckpt", ok=True),
]


def test_the_first_gpu_failure_is_picked_unless_an_attempt_is_named() -> None:
    failure = pick_failure(EVENTS)
    assert (failure.attempt, failure.cls, failure.step) == (2, "illegal_memory_access", 333)
    assert pick_failure(EVENTS, attempt=1).cls == "native_crash"
    with pytest.raises(UsageError, match="no failure of attempt 7"):
        pick_failure(EVENTS, attempt=7)
    with pytest.raises(UsageError, match=r"no illegal memory access.*attempt 1: native_crash.*--attempt N"):
        pick_failure(EVENTS[:6])
    assert {c.value for c in DIAGNOSABLE} >= {"illegal_memory_access", "device_assert"}


def test_checkpoints_before_the_failure_newest_first_and_never_one_saved_after() -> None:
    cands = checkpoint_candidates(EVENTS, pick_failure(EVENTS))
    assert [c.path.rsplit("/", 1)[1] for c in cands] == ["step=300.ckpt", "step=200.ckpt", "step=100.ckpt"]
    assert "step=250.ckpt" not in str(cands) and "step=400.ckpt" not in str(cands)  # failed save; after it


def test_checkpoint_arguments_are_redirected_and_the_resume_file_is_kept() -> None:
    argv = ["python", "t.py", "--ckpt-dir", "/runs/x/checkpoints", "--out=/runs/x/checkpoints/last.ckpt",
            "--ckpt", "/runs/x/checkpoints/step=200.ckpt", "--data", "/data/x", "--rel", "ck"]
    out, changed = redirect_checkpoint_args(argv, "/runs/x/checkpoints", "/s/checkpoints",
                                            keep=["/runs/x/checkpoints/step=200.ckpt"])
    assert out == ["python", "t.py", "--ckpt-dir", "/s/checkpoints", "--out=/s/checkpoints/last.ckpt",
                   "--ckpt", "/runs/x/checkpoints/step=200.ckpt", "--data", "/data/x", "--rel", "ck"]
    assert len(changed) == 2
    rel, _ = redirect_checkpoint_args(["x", "runs/x/checkpoints"], "/w/runs/x/checkpoints", "/s/c", cwd="/w")
    assert rel == ["x", "/s/c"]


def test_the_plan_is_bounded_blocking_redirected_and_has_no_control_channel() -> None:
    failure = pick_failure(EVENTS)
    manifest = {"cwd": "/work/exp", "config": {"resume_arg": "--ckpt {path}", "step_regex": None},
                "determinism": {"CUDA_VISIBLE_DEVICES": "3", "NCCL_ALGO": "Ring", "PYTHONHASHSEED": None}}
    environ = {"PATH": "/usr/bin", "SUPERVISOR_CONTROL": "udp://10.0.0.1:5000", "SUPERVISOR_KEY": "k",
               "SUPERVISOR_PROCESS_TREE": "t", "HOME": "/home/me"}
    plan = plan_diagnosis(EVENTS, failure, checkpoint=CheckpointCandidate("/runs/x/checkpoints/step=300.ckpt", 300,
                                                                          "save_end"),
                          checkpoint_reason="newest", manifest=manifest, environ=environ, scratch="/s",
                          cwd=None, max_seconds=120.0, max_steps=None, sanitizer="/usr/local/cuda/bin/compute-sanitizer")
    assert plan.argv[:2] == ("/usr/local/cuda/bin/compute-sanitizer", "--tool")
    assert plan.command == ("python", "train.py", "--ckpt-dir", "/s/checkpoints", "--lr", "3e-4", "--ckpt",
                            "/runs/x/checkpoints/step=300.ckpt")
    env = plan.env
    assert env["CUDA_LAUNCH_BLOCKING"] == "1" and env["PYTORCH_NO_CUDA_MEMORY_CACHING"] == "1"
    assert env["SUPERVISOR_CHECKPOINT_DIR"] == "/s/checkpoints" and env["SUPERVISOR_ATTEMPT"] == "2"
    assert env["SUPERVISOR_RESUME_FROM"] == "/runs/x/checkpoints/step=300.ckpt" and env["SUPERVISOR_RESUME_STEP"] == "300"
    assert not {"SUPERVISOR_CONTROL", "SUPERVISOR_KEY", "SUPERVISOR_PROCESS_TREE"} & set(env)
    assert env["CUDA_VISIBLE_DEVICES"] == "3" and env["NCCL_ALGO"] == "Ring" and env["HOME"] == "/home/me"
    assert plan.cwd == "/work/exp" and plan.max_seconds == 120.0
    assert plan.stop_at_step == 300 + 33 + 33  # to the failure step and as many again (at least 20)


def test_the_rerun_resumes_the_way_the_run_did_including_fixed_flags_and_the_environment_form() -> None:
    failure = pick_failure(EVENTS)
    manifest = {"cwd": "/work/exp", "config": {"resume_arg": "+trainer.ckpt_path={path} --resume",
                                               "resume_env": ["RESUME_FROM={path}", "RESUME_STEP={step}"]}}
    plan = plan_diagnosis(EVENTS, failure, checkpoint=CheckpointCandidate("/runs/x/my ckpts/step=300.ckpt", 300,
                                                                          "save_end"),
                          checkpoint_reason="newest", manifest=manifest, environ={"PATH": "/usr/bin"}, scratch="/s",
                          cwd=None, max_seconds=60.0, max_steps=None, sanitizer=None)
    assert plan.command[-2:] == ("+trainer.ckpt_path=/runs/x/my ckpts/step=300.ckpt", "--resume")
    assert plan.env["RESUME_FROM"] == "/runs/x/my ckpts/step=300.ckpt" and plan.env["RESUME_STEP"] == "300"


# --------------------------------------------------------------------------- the command, end to end

TRAIN = textwrap.dedent('''
    """A GPU training stand-in: safetensors checkpoints, CUDA's error text at --fail-at."""
    import argparse, json, os, struct, sys, time

    def save(path, step):
        header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                             "__metadata__": {"step": str(step)}}).encode()
        tmp = path + ".tmp"
        with open(tmp, "wb") as fh:
            fh.write(struct.pack("<Q", len(header)) + header + bytes(4))
        os.replace(tmp, path)

    def launch_kernel(step):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")  # THE LINE

    p = argparse.ArgumentParser()
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--ckpt")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--fail-at", type=int, default=12)
    a = p.parse_args()
    mode = os.environ.get("FAULT_MODE", "first_attempt")
    step = 0
    if a.ckpt:
        with open(a.ckpt, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            step = int(json.loads(fh.read(n))["__metadata__"]["step"])
        print(f"resumed at step {step}", flush=True)
    while step < a.steps:
        step += 1
        print(f"step {step} loss 0.5", flush=True)
        if step == a.fail_at:
            if mode == "always" or (mode == "first_attempt" and os.environ.get("SUPERVISOR_ATTEMPT") == "1"):
                launch_kernel(step)
            if mode == "hang":
                time.sleep(3600)
        if step % 5 == 0:
            save(os.path.join(a.ckpt_dir, f"step={step}.safetensors"), step)
        time.sleep(0.01)
    print("training complete", flush=True)
''')


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERVISE_", "SUPERVISOR_", "FAULT_"))}
    env.update(PYTHONPATH=str(REPO), **extra)
    return env


def _supervise(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor", *args], capture_output=True, text=True, cwd=cwd,
                          env=_env(**env), timeout=180, check=False)


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real supervised run: attempt 1 fails with an illegal memory access at step 12 (after
    step=10 was saved), attempt 2 resumes from step 10 and completes."""
    work = tmp_path_factory.mktemp("diagnose")
    (work / "train.py").write_text(TRAIN)
    run = work / "run"
    proc = _supervise("run", "--quiet", "--run-dir", str(run), "--resume-arg", "--ckpt {path}", "--", sys.executable,
                      "train.py", "--ckpt-dir", str(run / "checkpoints"), cwd=work, FAULT_MODE="first_attempt")
    assert proc.returncode == 0, proc.stderr[-2000:]
    failures = [e for e in read_events(run / "supervisor" / "events.jsonl").events if e.event == "failure"]
    assert [(f.get("class"), f.get("step")) for f in failures] == [("illegal_memory_access", 12)]
    return run


def _the_line() -> int:
    return next(i for i, line in enumerate(TRAIN.splitlines(), 1) if "# THE LINE" in line)


def test_diagnose_reproduces_names_the_line_records_it_and_leaves_the_checkpoints_alone(gpu_run: Path) -> None:
    ckpt = gpu_run / "checkpoints"
    before = snapshot_dir(str(ckpt))
    proc = _supervise("diagnose", str(gpu_run), "--json", cwd=gpu_run.parent, FAULT_MODE="first_attempt")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    diag = json.loads(proc.stdout)
    assert diag["outcome"] == "reproduced" and diag["located"] is True
    assert diag["checkpoint"] == str(ckpt / "step=10.safetensors") and diag["checkpoint_step"] == 10
    assert diag["python_frame"]["file"].endswith("train.py") and diag["python_frame"]["line"] == _the_line()
    assert diag["python_frame"]["function"] == "launch_kernel"
    assert diag["tools"] == ["CUDA_LAUNCH_BLOCKING=1"] and diag["last_step"] == 12
    argv = diag["argv"]
    assert argv[argv.index("--ckpt-dir") + 1] == str(Path(diag["scratch"]) / "checkpoints")  # redirected
    assert diag["redirected"] == [f"{ckpt} -> {Path(diag['scratch']) / 'checkpoints'}"]
    assert snapshot_dir(str(ckpt)) == before and diag["checkpoint_dir_changes"] == []
    recorded = [e for e in read_events(gpu_run / "supervisor" / "events.jsonl").events if e.event == "diagnosis"]
    assert recorded and recorded[-1].get("python_line") == _the_line() and recorded[-1].get("attempt") == 1
    assert recorded[-1].get("class") == "illegal_memory_access" and recorded[-1].get("outcome") == "reproduced"


def test_a_failure_that_does_not_recur_is_reported_as_not_reproduced_at_the_step_bound(gpu_run: Path) -> None:
    ckpt = gpu_run / "checkpoints"
    before = snapshot_dir(str(ckpt))
    scratch = gpu_run.parent / "scratch-not-reproduced"
    proc = _supervise("diagnose", str(gpu_run), "--json", "--no-record", "--scratch", str(scratch),
                      "--env", "FAULT_MODE=never", cwd=gpu_run.parent)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    diag = json.loads(proc.stdout)
    assert diag["outcome"] == DiagnosisOutcome.NOT_REPRODUCED.value and not diag["located"]
    assert diag["last_step"] >= 12 + 20 and "not reproduced" in diag["reason"]
    # the one variable changed on purpose is named as the difference from the recording
    assert "differs from the recording in: CUDA_LAUNCH_BLOCKING, FAULT_MODE" in diag["reason"]
    assert "FAULT_MODE: recorded 'first_attempt', 'never' in the rerun" in diag["environment_differences"]
    # it saved as it went: into the scratch directory, never into the run's
    assert (scratch / "checkpoints" / "step=30.safetensors").exists()
    assert snapshot_dir(str(ckpt)) == before


def test_the_rerun_is_stopped_at_the_time_bound_and_leaves_no_process(gpu_run: Path) -> None:
    scratch = gpu_run.parent / "scratch-hang"
    started = time.monotonic()
    proc = _supervise("diagnose", str(gpu_run), "--json", "--no-record", "--max-seconds", "4", "--scratch",
                      str(scratch), "--env", "FAULT_MODE=hang", cwd=gpu_run.parent)
    took = time.monotonic() - started
    assert proc.returncode == 1
    diag = json.loads(proc.stdout)
    assert diag["outcome"] == "bound_reached" and "--max-seconds" in diag["reason"]
    assert took < 60
    leftover = [p for p in Path("/proc").iterdir() if p.name.isdigit() and str(scratch).encode() in
                _cmdline(p)]
    assert leftover == []


def _cmdline(proc_dir: Path) -> bytes:
    try:
        return (proc_dir / "cmdline").read_bytes()
    except OSError:
        return b""


def test_under_the_sanitizer_the_kernel_and_its_launch_site_are_named(gpu_run: Path, tmp_path: Path) -> None:
    """compute-sanitizer cannot run here: a stand-in on PATH replays the record the real one
    printed on the H200, then runs the command as the sanitizer would."""
    records = [line for line in SANITIZER_LOG.read_text().splitlines() if line.startswith("=========")][:20]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "compute-sanitizer"
    fake.write_text("#!/bin/bash\n# args: --tool memcheck --print-limit N CMD...\nshift 4\n"
                    "cat <<'EOF'\n" + "\n".join(records) + "\nEOF\nexec \"$@\"\n")
    fake.chmod(0o755)
    proc = _supervise("diagnose", str(gpu_run), "--json", "--no-record", cwd=gpu_run.parent,
                      FAULT_MODE="first_attempt", PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    diag = json.loads(proc.stdout)
    assert diag["tools"] == ["CUDA_LAUNCH_BLOCKING=1", "compute-sanitizer --tool memcheck"]
    assert diag["kernel"] == "oob_store" and diag["access"] == "Invalid __global__ write of size 4 bytes"
    assert diag["launch_site"] == "_ptx_store in train_plain.py:112"
    assert diag["argv"][0] == str(fake)


def test_a_directory_that_is_not_a_run_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = _supervise("diagnose", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith("supervise: error: ") and "not a run directory" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_dry_run_plans_without_running(gpu_run: Path) -> None:
    proc = _supervise("diagnose", str(gpu_run), "--dry-run", "--json", cwd=gpu_run.parent)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["checkpoint_step"] == 10 and plan["failure_step"] == 12 and plan["stop_at_step"] == 10 + 2 + 20
    assert not Path(plan["scratch"]).exists()
    assert FailureToDiagnose  # the plan's failure type is public


def test_two_diagnoses_in_the_same_second_never_share_a_scratch_directory(tmp_path: Path) -> None:
    from supervisor.addons.diagnose import unused_path

    first = tmp_path / "diagnose-1-20261201-182708"
    assert unused_path(first) == first
    first.mkdir()
    second = unused_path(first)
    assert second == tmp_path / "diagnose-1-20261201-182708-2" and not second.exists()
    second.mkdir()
    assert unused_path(first) == tmp_path / "diagnose-1-20261201-182708-3"
    claimed = unused_path(first, claim=True)  # a real run takes the name by creating it
    assert claimed == tmp_path / "diagnose-1-20261201-182708-3" and claimed.is_dir()
    assert unused_path(first, claim=True) == tmp_path / "diagnose-1-20261201-182708-4"


# --------------------------------------------------------------------------- the attempt's environment

ENV_TRAIN = textwrap.dedent('''
    """A fault that depends on the environment: a segfault at step 3, only when TRIGGER=1."""
    import os, signal, time
    for step in range(1, 6):
        print(f"step {step}", flush=True)
        if step == 3 and os.environ.get("TRIGGER") == "1":
            os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(0.01)
    print("training complete", flush=True)
''')


def test_diagnose_reruns_in_the_attempts_recorded_environment_and_names_what_differs(tmp_path: Path) -> None:
    """Attempt 1 ran with TRIGGER=1 and segfaulted; diagnose from a shell without TRIGGER still
    reproduces it (the manifest recorded the variable), and with TRIGGER overridden it does not and
    names TRIGGER as the difference. A credential in the environment is never written, and the
    rerun takes it from the shell."""
    (tmp_path / "train.py").write_text(ENV_TRAIN)
    run = tmp_path / "run"
    proc = _supervise("run", "--quiet", "--run-dir", str(run), "--set", "budget.max_total_restarts=0", "--",
                      sys.executable, "train.py", cwd=tmp_path, TRIGGER="1", HF_TOKEN="hf_SECRETSECRETSECRETSECRETSECRET1")
    assert proc.returncode != 0
    manifest = json.loads((run / "supervisor" / "manifest-1.json").read_text())
    assert manifest["environment"]["variables"]["TRIGGER"] == "1"
    assert manifest["environment"]["variables"]["HF_TOKEN"] == "[REDACTED]"
    assert "HF_TOKEN" in manifest["environment"]["redacted"]

    shell = {k: v for k, v in _env().items() if k not in ("TRIGGER", "HF_TOKEN")}
    rerun = subprocess.run([sys.executable, "-m", "supervisor", "diagnose", str(run), "--attempt", "1", "--json",
                            "--no-record", "--sanitizer", "off"], capture_output=True, text=True, cwd=tmp_path,
                           env=shell, timeout=180, check=False)
    diag = json.loads(rerun.stdout)
    assert diag["outcome"] == "reproduced", diag["reason"]
    assert diag["rerun_class"] == "native_crash" and diag["signal"] == 11
    assert diag["environment_source"] == "recorded by attempt 1"
    assert "HF_TOKEN: redacted in the record, unset in the rerun" in diag["environment_differences"]

    rerun = subprocess.run([sys.executable, "-m", "supervisor", "diagnose", str(run), "--attempt", "1", "--json",
                            "--no-record", "--sanitizer", "off", "--env", "TRIGGER=0"], capture_output=True,
                           text=True, cwd=tmp_path, env={**shell, "HF_TOKEN": "hf_FROMTHESHELLFROMTHESHELLFROMTHE"},
                           timeout=180, check=False)
    assert rerun.returncode == 1
    diag = json.loads(rerun.stdout)
    assert diag["outcome"] == "not_reproduced"
    assert "TRIGGER: recorded '1', '0' in the rerun" in diag["environment_differences"]
    assert "HF_TOKEN: redacted in the record, this shell's value used" in diag["environment_differences"]
    assert "TRIGGER" in diag["reason"].partition("differs from the recording in:")[2]
