#!/usr/bin/env bash
# Issue #17 on a real GPU: the repeatability check with its stated power, and `supervise diagnose`
# on genuine illegal memory accesses.
#   1. `supervise check-gpu --json` (default repeats, the large-image few-output-channel conv2d
#      shapes included), power stated                       -> check_gpu_power.json
#   2. a client run (examples/train_plain.py) with a real out-of-bounds GPU store at step 25 of
#      attempt 1: restarted and completed by `supervise run`; then `supervise diagnose` reruns
#      attempt 1 from step=20.ckpt under CUDA_LAUNCH_BLOCKING=1 (+ compute-sanitizer memcheck
#      when it runs here)                                  -> diagnose_ima.json, diagnose_ima_events.jsonl,
#                                                             diagnose_ima_rerun.log
#   3. a zero-code run (benchmarks/gpu/ima_loop.py, --ckpt-dir naming the run's checkpoint
#      directory, --resume-arg) faulting at step 120 every time: stopped as a crash loop; then
#      `supervise diagnose` (the --ckpt-dir argument must be redirected to the scratch directory and
#      the run's checkpoint directory must stay untouched) -> diagnose_zero_code.json,
#                                                             diagnose_zero_code_rerun.log
#   and health_diagnose.log (everything printed). At most 8 files in $OUT.
#
# Run from the repository root on the device machine, carrying .whl/ (see run_all.sh):
#   bash benchmarks/gpu/health_diagnose.sh
set -u
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${OUT:-$REPO/gpu-out}
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}   # cpu only to dry-run the plumbing (parts 2-3 then find no GPU failure)
DIAG_SECONDS=${DIAG_SECONDS:-90}
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/health-diagnose.XXXXXX)
START=$(date +%s)
elapsed() { echo $(( $(date +%s) - START )); }
part() { echo; echo "=== $* (t=$(elapsed) s) ==="; }

show_diagnosis() {  # $1: diagnosis JSON; prints the fields that matter
  $PY - "$1" <<'EOF' || true
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as exc:
    print("no diagnosis JSON:", exc); sys.exit(0)
frame = d.get("python_frame") or {}
for key in ("outcome", "located", "tools", "sanitizer_note", "checkpoint", "checkpoint_step", "rerun_class",
            "exit_code", "first_step", "last_step", "kernel", "access", "kernel_source", "python_error",
            "api_errors", "redirected", "checkpoint_dir_changes", "duration", "reason"):
    print(f"  {key}: {d.get(key)}")
print(f"  python_frame: {frame.get('file')}:{frame.get('line')} in {frame.get('function')}: {frame.get('code')}")
for f in (d.get("sanitizer_findings") or [])[:2]:
    print(f"  sanitizer: {f.get('error')} | {f.get('kernel')} | {f.get('source')} | {f.get('details')}")
EOF
}

main() {
  cd "$REPO" || exit 1
  part "0. environment"
  if ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
  SUP="$PY -m supervisor"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader || true
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  command -v compute-sanitizer && compute-sanitizer --version | tail -n 2
  $SUP --version

  part "1. check-gpu: default repeats, few-output-channel shapes, stated power"
  timeout 100 $SUP check-gpu --json --timeout 90 >"$OUT/check_gpu_power.json"
  echo "check-gpu exit $?"
  $PY - "$OUT/check_gpu_power.json" <<'EOF' || true
import json, sys
d = json.load(open(sys.argv[1]))
for g in d.get("gpus", []):
    print(f"GPU {g['index']} {g['name']} driver {g['driver']} ECC {g['ecc_uncorrected']}")
    for c in g.get("checks", []):
        print(f"  {c['name']:<24} runs {c['runs']:>4}  mismatches {c['mismatches']}  {c['seconds']} s  {c['error'] or ''}")
print("power:", (d.get("power") or {}).get("text"))
print("verdict:", d.get("ok"), d.get("reason"))
EOF

  part "2. client run with an illegal memory access at step 25 of attempt 1, then diagnose"
  local run="$WORK/ima"
  FAULT_ILLEGAL_MEMORY_AT=25 timeout 90 $SUP run --quiet --run-dir "$run" -- \
    $PY examples/train_plain.py --device "$DEVICE" --steps 60 --save-every 10 --log-every 5 --step-time 0.02 --hidden 512
  echo "supervise run exit $?"
  ls "$run/checkpoints" | tr '\n' ' '; echo
  FAULT_ILLEGAL_MEMORY_AT=25 timeout $(( DIAG_SECONDS + 20 )) $SUP diagnose "$run" --max-seconds "$DIAG_SECONDS" --json \
    >"$OUT/diagnose_ima.json"
  echo "supervise diagnose exit $?"
  show_diagnosis "$OUT/diagnose_ima.json"
  cp "$run/supervisor/events.jsonl" "$OUT/diagnose_ima_events.jsonl"
  cp "$run"/supervisor/diagnose-*/supervisor/diagnose.log "$OUT/diagnose_ima_rerun.log" 2>/dev/null
  ls "$run/checkpoints" | tr '\n' ' '; echo "(checkpoints after diagnose)"

  part "3. zero-code run faulting at step 120 every time, then diagnose"
  run="$WORK/zero"
  timeout 90 $SUP run --quiet --run-dir "$run" --resume-arg "--ckpt {path}" -- \
    $PY benchmarks/gpu/ima_loop.py --steps 200 --save-every 50 --ckpt-dir "$run/checkpoints" --fault-steps 120
  echo "supervise run exit $?"
  timeout $(( DIAG_SECONDS + 20 )) $SUP diagnose "$run" --max-seconds "$DIAG_SECONDS" --json \
    >"$OUT/diagnose_zero_code.json"
  echo "supervise diagnose exit $?"
  show_diagnosis "$OUT/diagnose_zero_code.json"
  cp "$run"/supervisor/diagnose-*/supervisor/diagnose.log "$OUT/diagnose_zero_code_rerun.log" 2>/dev/null
  $SUP report "$run" | tail -n 8
  echo "total $(elapsed) s; files: $(ls "$OUT" | tr '\n' ' ')"
}

main 2>&1 | tee "$OUT/health_diagnose.log"
rm -rf "$WORK"
