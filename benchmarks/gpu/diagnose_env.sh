#!/usr/bin/env bash
# Issue 25 item 8 on a real GPU: a genuine out-of-bounds GPU store whose trigger is an environment
# variable (FAULT_ILLEGAL_MEMORY_AT=25, examples/train_plain.py) in attempt 1 of `supervise run`;
# then `supervise diagnose` from a shell WITHOUT that variable: the rerun runs in the environment
# attempt 1's manifest recorded, so the fault reproduces and is located. A second diagnose with
# --env FAULT_ILLEGAL_MEMORY_AT= (the trigger taken away) is not reproduced and names the variable.
#   -> diagnose_env.json, diagnose_env_off.json, diagnose_env.log
# Run from the repository root on the device machine, carrying .whl/ (see run_all.sh).
set -u
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${OUT:-$REPO/gpu-out}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/diagnose-env.XXXXXX)
exec > >(tee "$OUT/diagnose_env.log") 2>&1
cd "$REPO" || exit 1
if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
command -v compute-sanitizer || echo "no compute-sanitizer"

echo "=== run: FAULT_ILLEGAL_MEMORY_AT=25 in attempt 1's environment ==="
FAULT_ILLEGAL_MEMORY_AT=25 timeout 240 $PY -m supervisor run --quiet --run-dir "$WORK/run" \
  -- $PY examples/train_plain.py --device cuda --steps 40 --save-every 10
echo "run exit $?"
grep -o '"event":"failure"[^}]*' "$WORK/run/supervisor/events.jsonl" | head -2
$PY -c "import json,sys; m=json.load(open(sys.argv[1])); print('recorded:', {k: v for k, v in m['environment']['variables'].items() if k.startswith(('FAULT', 'CUDA'))})" "$WORK/run/supervisor/manifest-1.json"

echo "=== diagnose from a shell without FAULT_ILLEGAL_MEMORY_AT ==="
env -u FAULT_ILLEGAL_MEMORY_AT timeout 200 $PY -m supervisor diagnose "$WORK/run" --no-record --max-seconds 150 \
  --json >"$OUT/diagnose_env.json"
echo "diagnose exit $?"
$PY -c "import json,sys; d=json.load(open(sys.argv[1])); [print(k, '=', d.get(k)) for k in ('outcome','located','rerun_class','kernel','launch_site','python_frame','environment_source','environment_differences','reason')]" "$OUT/diagnose_env.json"

echo "=== diagnose with the trigger taken away (--env FAULT_ILLEGAL_MEMORY_AT=) ==="
env -u FAULT_ILLEGAL_MEMORY_AT timeout 200 $PY -m supervisor diagnose "$WORK/run" --no-record --max-seconds 150 \
  --sanitizer off --env FAULT_ILLEGAL_MEMORY_AT= --json >"$OUT/diagnose_env_off.json"
echo "diagnose exit $?"
$PY -c "import json,sys; d=json.load(open(sys.argv[1])); [print(k, '=', d.get(k)) for k in ('outcome','environment_differences','reason')]" "$OUT/diagnose_env_off.json"
