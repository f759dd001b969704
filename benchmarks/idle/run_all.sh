#!/usr/bin/env bash
# The CPU benchmarks whose targets are stated for a machine where the supervisor has a core to
# itself, run on an idle many-core machine (the lent H200 host: its GPU is not used). The 2-core
# development machine, shared with other test runs, cannot show them (docs/benchmarks.md says
# which figures came from where):
#   1. output at any rate: bench_output_rate.py (bare vs supervised lines/s)  -> output_rate.md
#   2. quarantine of 10,000 and 100,000 torn files: bench_quarantine.py      -> quarantine.md
#   3. the inert pickle scan, 13 MB of small objects up to 1 GB: bench_picklescan.py -> picklescan.md
# Run from the repository root, carrying .whl/ (see benchmarks/gpu/run_all.sh: tenacity is not in
# that machine's image):  bash benchmarks/idle/run_all.sh   (writes to $OUT)
set -u
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${OUT:-$REPO/idle-out}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
cd "$REPO" || exit 1
if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
{
  echo "date: $(date -u +%FT%TZ)"; echo "nproc: $(nproc)"; uptime; $PY --version
  grep -m1 "model name" /proc/cpuinfo; df -hT /tmp | tail -1
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
$PY -m supervisor run --run-dir /tmp/probe-run -- $PY -c "print('step 1')" > "$OUT/probe.txt" 2>&1; echo "probe exit $?"; tail -5 "$OUT/probe.txt"
timeout 200 $PY benchmarks/bench_output_rate.py --pairs 3 > "$OUT/output_rate.md" 2>&1; echo "output_rate exit $?"
mkdir -p /tmp/bench-q
timeout 200 $PY benchmarks/bench_quarantine.py --counts 10000,100000 --dir /tmp/bench-q > "$OUT/quarantine.md" 2>&1; echo "quarantine exit $?"
timeout 150 $PY benchmarks/bench_picklescan.py --sizes 13MB,100MB,1GB > "$OUT/picklescan.md" 2>&1; echo "picklescan exit $?"
tail -n 30 "$OUT"/*.md
