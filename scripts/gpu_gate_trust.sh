#!/usr/bin/env bash
# Can the speed gate be trusted? On one GPU, from the repository root:
#   1. record this device's baseline of the default benchmark set (suites/test_benchmarks.py) into a fresh folder,
#      from RECORD_RUNS runs (--lstmperf-save-baseline, then --lstmperf-add-baseline-run: more recording runs);
#   2. time one full `pytest suites/ --device=cuda --benchmark-compare` against it (also a clean run of the set);
#   3. run a subset of the benchmarks (GATE_PATHS) clean N times and with planted faults: a kernel fallback
#      (cuDNN off), device-side slowdowns of 1.10x and 1.25x (kernel-slowdown:F), a host-side slowdown
#      (host-work:K, K extra ATen ops and one allocation per LSTM/GRU call);
#   4. print detections and false alarms per benchmark-run (scripts/gate_trust.py), the table last.
#
#   OUT=/tmp/trust bash scripts/gpu_gate_trust.sh                 # the H100 run (about 8 minutes)
#   OUT=/tmp/trust DEVICE=cpu N=1 bash scripts/gpu_gate_trust.sh  # dry run on a CPU (oneDNN off, slowdown:F)
#
# Environment: OUT (default ./gate-trust-out), N (clean runs, default 5), PYTHON (default python3), GATE_PATHS,
# SLOW110_RUNS (runs with the 1.10x slowdown, default 2), HOST_WORK (default 40), BUDGET_S (no run starts after
# this many seconds, default 470; runs not started are listed), FULL_SUITE (default suites/; none: not run),
# BASELINE (a baseline file recorded earlier on this device: used instead of recording one).
# Keras wheels carried in .whl/ are installed first (no TensorFlow on the device machine: Keras on torch only).
# Files under $OUT (8 at most): runs.log (every run's output), full-suite.log, baseline.json, trust.json
# (every verdict), summary.txt (the table).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gate-trust-out}
N=${N:-5}
BUDGET_S=${BUDGET_S:-470}
DEVICE=${DEVICE:-cuda}
SLOW110_RUNS=${SLOW110_RUNS:-2}
HOST_WORK=${HOST_WORK:-40}
RECORD_RUNS=${RECORD_RUNS:-3}  # the baseline: one recording run, then RECORD_RUNS-1 added with --lstmperf-add-baseline-run
FULL_SUITE=${FULL_SUITE:-suites/}
if [ "$DEVICE" = cpu ]; then
  GATE_PATHS=${GATE_PATHS:-torch-cpu-onednn,torch-cpu-native}
  FALLBACK=onednn-off; SLOW=slowdown  # no GPU: the host-side slowdown stands in for the device one
else
  GATE_PATHS=${GATE_PATHS:-torch-cudnn-fp32,torch-cuda-generic,keras-torch-cudnn}
  FALLBACK=cudnn-off; SLOW=kernel-slowdown
fi
mkdir -p "$OUT"
WORK=$(mktemp -d)
BASEDIR="$WORK/baselines"
LOG="$OUT/runs.log"
: >"$LOG"
START=$(date +%s)

source scripts/gpu_env.sh  # .whl/ wheels, PYTHONPATH, PLUGIN
COMMON=($PLUGIN "--device=$DEVICE" "--lstmperf-baselines=$BASEDIR" -p no:cacheprovider)
FAULTS=(-p pytest_lstmperf.testing.faults)

{
  echo "== environment"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | head -2
  "$PYTHON" -c "import torch, pytest_benchmark as b; print('torch', torch.__version__, 'cuDNN', torch.backends.cudnn.version(), 'pytest-benchmark', b.__version__)"
  "$PYTHON" -c "import keras; print('keras', keras.__version__)" 2>&1 | tail -1
} | tee -a "$LOG"

declare -A WALL
RUNS=()
SKIPPED=()
run() {  # run NAME SCENARIO [pytest args...]: output appended to runs.log (or NAME.log for the full suite)
  local name=$1 scenario=$2; shift 2
  if [ "${name#record}" = "$name" ] && [ $(( $(date +%s) - START )) -gt "$BUDGET_S" ]; then SKIPPED+=("$name"); return; fi
  local file="$WORK/$name.log" t0 t1 rc
  t0=$(date +%s%N)
  "$PYTHON" -m pytest "${COMMON[@]}" "$@" >"$file" 2>&1
  rc=$?
  t1=$(date +%s%N)
  WALL[$name]=$(awk "BEGIN {printf \"%.1f\", ($t1 - $t0) / 1e9}")
  { echo; echo "######## $name ($scenario): exit $rc, ${WALL[$name]} s: pytest $*"; cat "$file"; } >>"$LOG"
  echo "   $name: exit $rc, ${WALL[$name]} s"
  RUNS+=("$scenario=$file")
}

if [ -n "${BASELINE:-}" ]; then  # a baseline recorded earlier on this device (e.g. the committed one)
  mkdir -p "$BASEDIR" && cp "$BASELINE" "$BASEDIR/" && BASE="$BASEDIR/$(basename "$BASELINE")"
  echo "== using the recorded baseline $BASELINE"
  : >"$WORK/record.log"
else
  echo "== recording the baseline of the default benchmark set from $RECORD_RUNS runs"
  run record record suites/test_benchmarks.py --lstmperf-update-baseline -q
  BASE=$(ls "$BASEDIR"/*.json 2>/dev/null | head -1)
  if [ -z "$BASE" ]; then
    echo "no baseline was recorded; see $LOG"; tail -30 "$WORK/record.log"; exit 1
  fi
  for k in $(seq 2 "$RECORD_RUNS"); do  # more recording runs (an outlier is refused and named)
    run "record$k" record suites/test_benchmarks.py --lstmperf-add-baseline-run -q
  done
  grep -h "RECORDING RUN REFUSED\|resolve less" "$WORK"/record*.log | head -20
  cp "$BASE" "$OUT/baseline.json"
fi
RUNS=()

if [ "$FULL_SUITE" != none ]; then
  echo "== one full run: pytest $FULL_SUITE --device=$DEVICE --benchmark-compare"
  run full full-suite "$FULL_SUITE" --benchmark-compare -v
  cp "$WORK/full.log" "$OUT/full-suite.log" 2>/dev/null
fi

SUBSET=(suites/test_benchmarks.py "--lstmperf-paths=$GATE_PATHS" --benchmark-compare -v)
echo "== $N clean runs and the planted faults on $GATE_PATHS"
# every kind of run once first (so that a budget cut leaves repeats out, never a kind), then the repeats
PLAN=("clean#1" "fallback" "$SLOW:1.25" "$SLOW:1.10#1" "host-work:$HOST_WORK" "clean#2" "clean#3")
for k in $(seq 2 "$SLOW110_RUNS"); do PLAN+=("$SLOW:1.10#$k"); done
for k in $(seq 4 "$N"); do PLAN+=("clean#$k"); done
for step in "${PLAN[@]}"; do
  name=${step//[:#]/-}
  case $step in
    clean*) [ "${step#clean#}" -le "$N" ] && run "$name" clean "${SUBSET[@]}" ;;
    fallback) run "$name" fallback "${SUBSET[@]}" "${FAULTS[@]}" "--lstmperf-plant=$FALLBACK" ;;
    host-work*) run "$name" "$step" "${SUBSET[@]}" "${FAULTS[@]}" "--lstmperf-plant=${step%%#*}" ;;
    *) run "$name" "device-slowdown:${step#*:}" "${SUBSET[@]}" "${FAULTS[@]}" "--lstmperf-plant=${step%%#*}" ;;
  esac
done

TOTAL=$(( $(date +%s) - START ))
{
  echo
  echo "================ SPEED GATE TRUST on $(cat "$WORK"/*.log | grep -m1 "^lstmperf: device " | cut -c18-)"
  echo "wall time, pytest $FULL_SUITE --device=$DEVICE --benchmark-compare: ${WALL[full]:+${WALL[full]} s}${WALL[full]:-not run} (target <= 120 s on one H100)"
  echo "wall time per subset run: $(for k in "${!WALL[@]}"; do [ "$k" != full ] && [ "${k#record}" = "$k" ] && printf '%s=%s ' "$k" "${WALL[$k]}"; done)"
  if [ -n "${BASELINE:-}" ]; then
    echo "baseline: $BASELINE (recorded earlier, not here); script total: ${TOTAL} s"
  else
    echo "record: ${WALL[record]} s (+ $(( RECORD_RUNS - 1 )) added run(s): $(for k in $(seq 2 "$RECORD_RUNS"); do printf '%s ' "${WALL[record$k]:-}"; done)s); script total: ${TOTAL} s"
  fi
  [ ${#SKIPPED[@]} -eq 0 ] || echo "not run (over the ${BUDGET_S} s budget): ${SKIPPED[*]}"
  "$PYTHON" scripts/gate_trust.py "$BASE" "$OUT/trust.json" "${RUNS[@]}"
} | tee "$OUT/summary.txt"
rm -rf "$WORK"
