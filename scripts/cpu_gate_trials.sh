#!/usr/bin/env bash
# The speed gate on a CPU runner, as the README's recipe uses it: record the baseline of the torch benchmarks
# (--lstmperf-save-baseline, then RECORD_RUNS-1 runs added with --lstmperf-add-baseline-run), then N clean
# compares and N compares with a time-only slowdown of every torch LSTM/GRU call (slowdown:F, no extra op), in
# one process and under pytest-xdist (-n 2, beside the kernel suite's tests). Each compare writes its JSON
# (--benchmark-json --benchmark-save-data) for scripts/gate_replay.py; the table of verdicts is printed last.
#
#   OUT=/tmp/trials N=10 bash scripts/cpu_gate_trials.sh
#
# Environment: OUT (default ./gate-trials-out), N (default 10), F (default 1.5), PATHS (default
# torch-cpu-onednn,torch-cpu-native), RECORD_RUNS (default 3), MODES (default "one xdist"), PYTHON.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gate-trials-out}
N=${N:-10}
F=${F:-1.5}
PATHS=${PATHS:-torch-cpu-onednn,torch-cpu-native}
RECORD_RUNS=${RECORD_RUNS:-3}
MODES=${MODES:-one xdist}
PYTHON=${PYTHON:-.venv/bin/python}
mkdir -p "$OUT/runs"
BASEDIR="$OUT/baselines"
rm -rf "$BASEDIR"
COMMON=(-p no:cacheprovider --device=cpu "--lstmperf-paths=$PATHS" "--lstmperf-baselines=$BASEDIR")
LOG="$OUT/trials.log"
: >"$LOG"
run() {  # run NAME [pytest args...]
  local name=$1 t0 rc; shift
  t0=$(date +%s)
  "$PYTHON" -m pytest "${COMMON[@]}" "$@" >"$OUT/runs/$name.log" 2>&1
  rc=$?
  echo "$name: exit $rc, $(( $(date +%s) - t0 )) s: $(grep -h "^speed gate\|^SPEED GATE\|^baseline " "$OUT/runs/$name.log" | head -2 | tr '\n' ' ' | cut -c1-200)" | tee -a "$LOG"
}
run record suites/test_benchmarks.py --lstmperf-save-baseline -q
for k in $(seq 2 "$RECORD_RUNS"); do run "record$k" suites/test_benchmarks.py --lstmperf-add-baseline-run -q; done
BASE=$(ls "$BASEDIR"/*.json | head -1)
cp "$BASE" "$OUT/baseline.json"
REPLAY=()
for mode in $MODES; do
  extra=(suites/test_benchmarks.py)
  [ "$mode" = xdist ] && extra=(-n 2 suites/test_benchmarks.py suites/test_kernels.py -k torch-cpu)
  for k in $(seq 1 "$N"); do
    run "$mode-clean-$k" "${extra[@]}" --benchmark-compare -v --benchmark-json="$OUT/runs/$mode-clean-$k.json" --benchmark-save-data
    REPLAY+=("clean#$mode$k=$OUT/runs/$mode-clean-$k.json")
    run "$mode-slow-$k" "${extra[@]}" --benchmark-compare -v --benchmark-json="$OUT/runs/$mode-slow-$k.json" \
      --benchmark-save-data -p pytest_lstmperf.testing.faults "--lstmperf-plant=slowdown:$F"
    REPLAY+=("slowdown:$F#$mode$k=$OUT/runs/$mode-slow-$k.json")
  done
done
{
  echo
  echo "== verdicts (exit 0: passed; exit 1: the gate failed)"
  for mode in $MODES; do
    for kind in clean slow; do
      pass=$(grep -c "^$mode-$kind-[0-9]*: exit 0" "$LOG")
      fail=$(grep -c "^$mode-$kind-[0-9]*: exit 1" "$LOG")
      other=$(grep -c "^$mode-$kind-[0-9]*: exit [^01]" "$LOG")
      echo "$mode $kind: $pass passed, $fail failed, $other other"
    done
  done
  echo
  PYTHONPATH=$PWD "$PYTHON" scripts/gate_replay.py "$OUT/baseline.json" "${REPLAY[@]}" --markdown
} | tee "$OUT/summary.txt"
