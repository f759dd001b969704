#!/usr/bin/env bash
# Issue #12 on a real GPU: the restart policy decides by progress.
#   A. a genuine CUDA illegal memory access at steps 120, 240, 360, 480 and 600 of 700 (each step
#      faults once), saves every 50 steps, zero-code (no client; --resume-arg) -> must COMPLETE
#   B. the same illegal memory access at step 120 every time -> must be STOPPED in 2-10 attempts
# Outputs in $OUT: progress_A_events.jsonl, progress_A_audit.json, progress_B_events.jsonl,
# progress_B_audit.json, progress_policy.log. Run from the repository root on the device machine,
# carrying .whl/ (see run_all.sh).
set -u
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${OUT:-$REPO/gpu-out}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/progress-policy.XXXXXX)

main() {
  cd "$REPO" || exit 1
  if ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
  SUP="$PY -m supervisor"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
  $SUP --version

  for case in A B; do
    local run="$WORK/$case" once=""
    [ "$case" = A ] && once="--fault-once $WORK/$case-markers"
    local steps="120,240,360,480,600"; [ "$case" = B ] && steps="120"
    echo "=== case $case: faults at $steps ${once:+(each once)} ==="
    local t0=$(date +%s)
    timeout 400 $SUP run --quiet --run-dir "$run" --resume-arg "--ckpt {path}" -- \
      $PY benchmarks/gpu/ima_loop.py --steps 700 --save-every 50 --ckpt-dir "$run/checkpoints" \
      --fault-steps "$steps" $once
    local rc=$?
    echo "case $case: supervise run exit $rc after $(( $(date +%s) - t0 )) s"
    cp "$run/supervisor/events.jsonl" "$OUT/progress_${case}_events.jsonl"
    $SUP audit --json "$run" >"$OUT/progress_${case}_audit.json"; echo "audit exit $?"
    $SUP audit "$run" | tail -n 12
    $SUP report "$run" | tail -n 25
    grep -h "illegal memory access was encountered" "$run"/supervisor/attempt-*.log | head -n 3
  done
}

main 2>&1 | tee "$OUT/progress_policy.log"
rm -rf "$WORK"
