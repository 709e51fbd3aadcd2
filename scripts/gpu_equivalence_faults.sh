#!/usr/bin/env bash
# The equivalence suite on a GPU, clean and with a numeric fault planted in every LSTM/GRU call (a forget-gate
# bias shift, the initial states ignored, every output NaN): each fault must fail every CUDA path, the
# autocast-bf16 path (whose kernel is a known finding) included, and a NaN must fail fast. From the repository
# root; about 2 minutes on an H100. Writes equivalence-faults.log to $OUT; prints one summary block per run.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-equivalence-faults-out}
mkdir -p "$OUT"
source scripts/gpu_env.sh  # .whl/ wheels, PYTHONPATH, PLUGIN
export PYTHONPATH=$PWD/scripts:$PYTHONPATH  # numeric_fault_plugin
LOG="$OUT/equivalence-faults.log"
: >"$LOG"
for fault in "" forget-bias:0.5 states-ignored nan; do
  t0=$(date +%s)
  PYTEST_LSTMPERF_NUMERIC=$fault timeout 150 $PYTHON -m pytest $PLUGIN -p numeric_fault_plugin \
    suites/test_equivalence.py --device=cuda -p no:cacheprovider -q -rfEx >"$OUT/run.log" 2>&1
  rc=$?
  wall=$(( $(date +%s) - t0 ))
  { echo "######## fault '${fault:-none}': exit $rc, ${wall} s"; cat "$OUT/run.log"; } >>"$LOG"
  echo "== fault '${fault:-none}': exit $rc, ${wall} s"
  sed -n '/lstmperf: per path/,/^$/p' "$OUT/run.log" | cut -c1-150 | head -14
  tail -1 "$OUT/run.log"
done
rm -f "$OUT/run.log"
