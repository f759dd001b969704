#!/usr/bin/env bash
# GPU proofs of slurm-supervisor on one lent NVIDIA H200 (the device machine of this workplace):
#   1. `supervise check-gpu --json`                            -> check_gpu.json
#   2. a real CUDA illegal memory access in attempt 1 of `supervise run`: classified, restarted,
#      resumed from the last checkpoint, finished             -> ima_attempt1.log, ima_events.jsonl,
#                                                                 ima_report.json
#   3. supervision overhead: bare vs supervised steps/s on a bf16 MLP (~20-30 ms a step)
#                                                              -> overhead.json
#   then summary.md (benchmarks/gpu/summarize.py) and run_all.log (everything printed).
# At most 7 files in $OUT. Finishes within ~9 minutes: each part is bounded by `timeout`, a failed
# part is reported and the next one still runs.
#
# Run from the repository root on the device machine, carrying .whl/ (tenacity is not in the
# device image, and nothing can be fetched there):
#   bash benchmarks/gpu/run_all.sh
# Here, the wheel comes from:  python3 -m pip download --no-deps --only-binary=:all: \
#   --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 -d .whl tenacity==9.2.1
set -u

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${OUT:-$REPO/gpu-out}
PY=${PYTHON:-python3}
TOTAL_BUDGET=${TOTAL_BUDGET:-530}   # seconds for the whole script (the device allows 600 a command)
# Overridable only to dry-run the plumbing on a CPU machine (part 2 then fails by design: no GPU fault).
DEVICE=${DEVICE:-cuda}
OVERHEAD_TRAIN_ARGS=${OVERHEAD_TRAIN_ARGS:---dtype bf16 --dim 1024 --hidden 4096 --layers 8 --batch 16384}
OVERHEAD_TARGET_SECONDS=${OVERHEAD_TARGET_SECONDS:-20}
OVERHEAD_ROUNDS=${OVERHEAD_ROUNDS:-5}
# Steps left out of steps/s: start-up, and the supervisor's one-time provenance collection at attempt
# start (a subprocess that imports torch); both are in the wall times instead.
OVERHEAD_WARMUP=${OVERHEAD_WARMUP:-200}
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/gpu-proof.XXXXXX)
START=$(date +%s)
declare -a SUMMARY=()

elapsed() { echo $(( $(date +%s) - START )); }
part() { echo; echo "=== $* (t=$(elapsed) s) ==="; }
record() { SUMMARY+=("$1"); echo ">>> $1"; }

main() {
  cd "$REPO" || exit 1

  part "0. environment"
  if ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
  export PYTHONUNBUFFERED=1
  # The editable install gives the `supervise` script; the parts below use `python -m supervisor`,
  # which needs only PYTHONPATH, so a failed install (no network there) costs nothing.
  $PY -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 \
    || echo "note: pip install -e . failed (offline?); using PYTHONPATH=$REPO"
  SUP="$PY -m supervisor"
  if ! $PY -c "import click, yaml, tenacity, filelock" 2>/dev/null; then
    record "environment: FAIL core dependencies missing ($($PY -c 'import click, yaml, tenacity, filelock' 2>&1 | tail -1)); carry .whl"
  fi
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.sm,clocks.max.sm,temperature.gpu \
    --format=csv || echo "nvidia-smi failed"
  $PY -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"
  $SUP --version || record "environment: FAIL supervise does not start"

  part "1. GPU health check"
  timeout 150 $SUP check-gpu --json --timeout 120 >"$OUT/check_gpu.json"
  local rc=$?
  $PY - "$OUT/check_gpu.json" <<'EOF' || true
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as exc:
    print("no JSON:", exc); sys.exit(0)
for g in d.get("gpus", []):
    print(f"GPU {g['index']} {g['name']} driver {g['driver']} SM {g['clock_sm_mhz']} MHz ECC {g['ecc_uncorrected']}")
    for c in g.get("checks", []):
        print(f"  {c['name']:<20} runs {c['runs']:>3}  mismatches {c['mismatches']}  max|diff| {c['max_abs_diff']}  {c['seconds']} s  {c['error'] or ''}")
print("verdict:", d.get("ok"), d.get("reason"))
EOF
  if [ $rc -eq 0 ]; then record "check-gpu: PASS (exit 0, healthy)"; else record "check-gpu: FAIL (exit $rc)"; fi

  part "2. real illegal memory access -> classify -> restart -> resume"
  local run="$WORK/ima"
  FAULT_ILLEGAL_MEMORY_AT=25 timeout 180 $SUP run --run-dir "$run" -- \
    $PY examples/train_plain.py --device "$DEVICE" --steps 60 --save-every 10 --log-every 5 --step-time 0.02 --hidden 512
  rc=$?
  echo "supervise run exit status: $rc"
  cp "$run/supervisor/attempt-1.log" "$OUT/ima_attempt1.log" 2>/dev/null || echo "no attempt-1.log"
  cp "$run/supervisor/events.jsonl" "$OUT/ima_events.jsonl" 2>/dev/null || echo "no events.jsonl"
  echo "--- attempt 2 log (tail) ---"; tail -n 15 "$run/supervisor/attempt-2.log" 2>/dev/null
  timeout 60 $SUP report --json "$run" >"$OUT/ima_report.json" 2>"$WORK/report.err" \
    || { echo "supervise report exit $?:"; tail -n 5 "$WORK/report.err"; }
  $PY - "$run" "$rc" <<'EOF'
import json, sys
from pathlib import Path
run, rc = Path(sys.argv[1]), int(sys.argv[2])
log = (run / "supervisor" / "attempt-1.log").read_text(errors="replace") if (run / "supervisor" / "attempt-1.log").exists() else ""
events = []
for line in (run / "supervisor" / "events.jsonl").read_text().splitlines() if (run / "supervisor" / "events.jsonl").exists() else []:
    try: events.append(json.loads(line))
    except ValueError: pass
fail = [e for e in events if e.get("event") == "failure"]
resume = [e for e in events if e.get("event") == "resume_point" and (e.get("attempt") or 0) >= 2]
end = [e for e in events if e.get("event") == "run_end"]
checks = {
    "CUDA's illegal-memory-access text in attempt 1": "an illegal memory access was encountered" in log,
    "classified illegal_memory_access": bool(fail) and fail[0].get("class") == "illegal_memory_access",
    "action restart": bool(fail) and fail[0].get("action") == "restart",
    "attempt 2 resumed from step 20": bool(resume) and resume[0].get("step") == 20,
    "run complete, exit 0": rc == 0 and bool(end) and end[-1].get("outcome") == "complete",
}
for name, ok in checks.items():
    print(("PASS " if ok else "FAIL ") + name)
if fail:
    print("first failure:", json.dumps({k: fail[0].get(k) for k in ("attempt", "class", "action", "step", "evidence")})[:600])
sys.exit(0 if all(checks.values()) else 1)
EOF
  if [ $? -eq 0 ]; then record "illegal-memory restart+resume: PASS"; else record "illegal-memory restart+resume: FAIL (see above)"; fi

  part "3. supervision overhead (bare vs supervised)"
  local remain=$(( TOTAL_BUDGET - $(elapsed) - 15 ))
  if [ $remain -lt 120 ]; then
    record "overhead: SKIPPED (only ${remain} s left)"
  else
    # shellcheck disable=SC2086  # OVERHEAD_TRAIN_ARGS is a list of words
    timeout $remain $PY benchmarks/gpu/overhead.py --device "$DEVICE" --rounds "$OVERHEAD_ROUNDS" \
      --target-seconds "$OVERHEAD_TARGET_SECONDS" --budget-seconds $(( remain - 40 )) --warmup "$OVERHEAD_WARMUP" \
      --out "$OUT/overhead.json" -- $OVERHEAD_TRAIN_ARGS
    if [ $? -eq 0 ]; then
      record "overhead: $($PY -c "import json; d=json.load(open('$OUT/overhead.json')); print(f\"bare {d['bare']['median']} vs supervised {d['supervised']['median']} steps/s (n={d['bare']['n']}), overhead {d['overhead_pct']} %\")")"
    else
      record "overhead: FAIL (see above)"
    fi
  fi

  part "summary"
  $PY benchmarks/gpu/summarize.py "$OUT" >"$OUT/summary.md" && cat "$OUT/summary.md"
  echo
  for line in "${SUMMARY[@]}"; do echo "  $line"; done
  echo "total $(elapsed) s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
}

main 2>&1 | tee "$OUT/run_all.log"
rm -rf "$WORK"
