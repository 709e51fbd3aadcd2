#!/usr/bin/env bash
# The seed workloads on a GPU: the crossover CLI on the 2-layer LSTM (input 64, hidden 256, sequence 100) and
# the workload suite (bucketing, crossover, overhead, precision) with its report. Run from the repository
# root:  OUT=/tmp/wl bash scripts/gpu_workloads.sh
# SET=thorough runs the full grids; SELECT="overhead" passes -k to the suite; CROSSOVER=0 skips the CLI.
# Keras rows need keras 3 importable (the torch backend; TensorFlow's where TensorFlow sees a GPU).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-workloads-out}
SET=${SET:-gate}
mkdir -p "$OUT"
source scripts/gpu_env.sh  # .whl/ wheels, PYTHONPATH, PLUGIN
SELECT_ARGS=()
if [ -n "${SELECT:-}" ]; then SELECT_ARGS=(-k "$SELECT"); fi
KERAS_BACKEND=torch "$PYTHON" -c "import keras; print('keras', keras.__version__, 'importable (torch backend)')" \
  2>/dev/null || echo "keras not importable on the torch backend: its Keras rows will skip with the reason"
if [ "${CROSSOVER:-1}" != 0 ]; then
  echo "== lstmperf crossover"
  t0=$(date +%s)
  "$PYTHON" -m pytest_lstmperf.cli crossover lstm input_size=64 hidden_size=256 num_layers=2 seq_len=100 \
    --device cuda --out "$OUT/crossover" 2>"$OUT/crossover-progress.log"
  echo "   exit $?, $(( $(date +%s) - t0 )) s"
  tail -3 "$OUT/crossover-progress.log"
fi
echo "== workload suite ($SET set)"
t0=$(date +%s)
"$PYTHON" -m pytest $PLUGIN suites/test_workloads.py --device=cuda -p no:cacheprovider -q -rs "${SELECT_ARGS[@]}" \
  --lstmperf-bench-set="$SET" --lstmperf-report="$OUT/report" --benchmark-json="$OUT/workloads.json" \
  >"$OUT/workloads.log" 2>&1
echo "   exit $?, $(( $(date +%s) - t0 )) s"
sed -n '/lstmperf workloads/,/workload report written/p' "$OUT/workloads.log" | cut -c1-200
grep -E "SKIPPED|FAILED|passed|failed|error" "$OUT/workloads.log" | cut -c1-300 | tail -12
