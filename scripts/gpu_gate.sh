#!/usr/bin/env bash
# Record this GPU's speed baseline, then measure the gate against it:
#   N clean reruns (false alarms), N runs with cuDNN disabled behind the suite's back (fallback caught?),
#   N runs with a planted 1.25x slowdown (regression caught?).
# Writes logs, pytest-benchmark JSON, reports and the recorded baseline under $OUT; the summary table is
# printed last. Needs torch with CUDA, pytest, pytest-benchmark; no network. Run from the repository root:
#
#   OUT=/tmp/gate N=2 bash scripts/gpu_gate.sh
#
# Environment: OUT (default ./gpu-gate-out), N (runs per scenario, default 2), PYTHON (default python3),
# GATE_PATHS (paths to gate, default the cuDNN, TF32-default, generic and fp16 autocast paths),
# BUDGET_S (stop starting new runs after this many seconds, default 450), WARMUP (1, default: one unrecorded
# run before recording), SLOWDOWN (the planted slowdown: kernel-slowdown:1.25 on a GPU, slowdown:1.25 on the
# CPU), HOST_SLOWDOWN=1 (one more run with the host-side slowdown:1.25). DEVICE=cpu dry-runs the script on
# a CPU (GATE_PATHS=torch-cpu-onednn,torch-cpu-native: the fallback planted is then onednn-off).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-gate-out}
N=${N:-2}
BUDGET_S=${BUDGET_S:-450}
DEVICE=${DEVICE:-cuda}
if [ "$DEVICE" = cpu ]; then
  GATE_PATHS=${GATE_PATHS:-torch-cpu-onednn,torch-cpu-native}
  SLOWDOWN=${SLOWDOWN:-slowdown:1.25}
  FALLBACK=onednn-off; FALLBACK_SEEN="expected kernel onednn/.*observed cpu-native"; FAST_PATH=torch-cpu-onednn
else
  GATE_PATHS=${GATE_PATHS:-torch-cudnn-fp32,torch-cudnn-default,torch-cuda-generic,torch-cuda-autocast-fp16}
  SLOWDOWN=${SLOWDOWN:-kernel-slowdown:1.25}
  FALLBACK=cudnn-off; FALLBACK_SEEN="expected kernel cudnn/.*observed cuda-generic"; FAST_PATH=torch-cudnn-fp32
fi
mkdir -p "$OUT/logs" "$OUT/json" "$OUT/baselines"
BASEDIR="$OUT/baselines"
START=$(date +%s)

source scripts/gpu_env.sh  # .whl/ wheels, PYTHONPATH, PLUGIN
COMMON=($PLUGIN suites/test_benchmarks.py "--device=$DEVICE" "--lstmperf-paths=$GATE_PATHS"
        "--lstmperf-baselines=$BASEDIR" -p no:cacheprovider -q
        --lstmperf-drift=probe)  # probe samples for the replay below; on a GPU the device time still decides

echo "== environment"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv 2>&1 | head -3
"$PYTHON" - <<'EOF'
import torch, pytest, pytest_benchmark
print(f"torch {torch.__version__} CUDA {torch.version.cuda} cuDNN {torch.backends.cudnn.version()} "
      f"pytest {pytest.__version__} pytest-benchmark {pytest_benchmark.__version__}")
try:
    import pynvml  # noqa: F401
    print("SM clock source: NVML (pynvml)")
except ImportError:
    print("SM clock source: nvidia-smi (pynvml not installed)")
EOF

declare -A RC WALL
run() {  # run NAME [extra pytest args...]
  local name=$1; shift
  local t0 t1
  t0=$(date +%s%N)
  "$PYTHON" -m pytest "${COMMON[@]}" --benchmark-json="$OUT/json/$name.json" "$@" >"$OUT/logs/$name.log" 2>&1
  RC[$name]=$?
  t1=$(date +%s%N)
  local ds=$(( (t1 - t0) / 100000000 ))
  WALL[$name]="$((ds / 10)).$((ds % 10))"
  echo "   $name: exit ${RC[$name]}, ${WALL[$name]} s"
}
over_budget() { [ $(( $(date +%s) - START )) -gt "$BUDGET_S" ]; }

if [ "${WARMUP:-1}" = 1 ]; then
  echo "== warm-up run (not recorded: a freshly started machine is slow on its first run)"
  run warmup
fi
echo "== recording the baseline (default gate set, paths $GATE_PATHS)"
run record --lstmperf-update-baseline --lstmperf-report="$OUT/report-record"
grep -E "baseline .* (created|written|unchanged)" "$OUT/logs/record.log" | tail -1
if [ "${RC[record]}" != 0 ]; then
  echo "recording failed; see $OUT/logs/record.log"; tail -40 "$OUT/logs/record.log"
fi

CLEAN=0; CLEAN_ALARMS=0; FALL=0; FALL_CAUGHT=0; SLOW=0; SLOW_CAUGHT=0; SLOW_CUDNN_HIT=""; SKIPPED=0
for i in $(seq 1 "$N"); do
  if over_budget; then SKIPPED=$((SKIPPED + 3)); continue; fi
  echo "== round $i of $N"
  run "clean-$i" --benchmark-compare --lstmperf-report="$OUT/report-clean-$i"
  CLEAN=$((CLEAN + 1))
  if [ "${RC[clean-$i]}" != 0 ]; then CLEAN_ALARMS=$((CLEAN_ALARMS + 1)); fi

  if over_budget; then SKIPPED=$((SKIPPED + 2)); continue; fi
  run "fallback-$i" --benchmark-compare -p pytest_lstmperf.testing.faults "--lstmperf-plant=$FALLBACK"
  FALL=$((FALL + 1))
  if [ "${RC[fallback-$i]}" != 0 ] && grep -q "$FALLBACK_SEEN" "$OUT/logs/fallback-$i.log"; then
    FALL_CAUGHT=$((FALL_CAUGHT + 1))
  fi

  if over_budget; then SKIPPED=$((SKIPPED + 1)); continue; fi
  run "slowdown-$i" --benchmark-compare -p pytest_lstmperf.testing.faults "--lstmperf-plant=$SLOWDOWN" \
      --lstmperf-report="$OUT/report-slowdown-$i"
  SLOW=$((SLOW + 1))
  hits=$(grep -cE "\[$FAST_PATH-.*regressed" "$OUT/logs/slowdown-$i.log")
  SLOW_CUDNN_HIT="$SLOW_CUDNN_HIT $hits"
  if [ "${RC[slowdown-$i]}" != 0 ] && [ "$hits" -gt 0 ]; then SLOW_CAUGHT=$((SLOW_CAUGHT + 1)); fi
done

if [ "${HOST_SLOWDOWN:-0}" = 1 ] && ! over_budget; then
  echo "== host-side slowdown:1.25 (time per call only; the device metric is not meant to see it)"
  run host-slowdown --benchmark-compare -p pytest_lstmperf.testing.faults --lstmperf-plant=slowdown:1.25
  grep -E "speed gate against" "$OUT/logs/host-slowdown.log" | tail -1
fi
cp "$BASEDIR"/*.json "$OUT/" 2>/dev/null
echo
echo "== gate tables of the planted-slowdown runs (first one)"
sed -n '/speed gate against/,/SPEED GATE\|speed gate passed/p' "$OUT/logs/slowdown-1.log" 2>/dev/null | cut -c1-220 | head -60
echo
echo "== per-benchmark summary of the clean run (first one)"
sed -n '/lstmperf speed/,/^$/p' "$OUT/logs/clean-1.log" 2>/dev/null | cut -c1-200 | head -50
grep -hE "^throttled|SM clock not sampled|CUDA graph capture failed" "$OUT"/logs/*.log 2>/dev/null | sort | uniq -c | head -10

TOTAL=$(( $(date +%s) - START ))
echo
echo "================================ SPEED GATE ON $(grep -m1 "^device:" "$OUT/logs/record.log" | cut -c9-)"
printf "%-34s %-10s %-34s %s\n" "scenario" "runs" "result" "wall s per run"
printf "%-34s %-10s %-34s %s\n" "record baseline (gate set)" 1 "exit ${RC[record]}" "${WALL[record]}"
walls() { local p=$1 out=""; for k in "${!WALL[@]}"; do [[ $k == $p-* ]] && out="$out ${WALL[$k]}"; done; echo "${out:- -}"; }
printf "%-34s %-10s %-34s %s\n" "clean rerun" "$CLEAN" "$CLEAN_ALARMS false alarm(s)" "$(walls clean)"
printf "%-34s %-10s %-34s %s\n" "planted fallback ($FALLBACK)" "$FALL" "$FALL_CAUGHT/$FALL caught" "$(walls fallback)"
printf "%-34s %-10s %-34s %s\n" "planted $SLOWDOWN" "$SLOW" "$SLOW_CAUGHT/$SLOW caught" "$(walls slowdown)"
echo "$FAST_PATH benchmarks flagged regressed per slowdown run:${SLOW_CUDNN_HIT:- -}"
[ "$SKIPPED" -eq 0 ] || echo "$SKIPPED run(s) skipped: over the ${BUDGET_S}s budget"
echo "default gate set wall time (clean run): $(walls clean) s (target < 180 s); script total ${TOTAL} s"
echo "baseline to commit: $(ls "$OUT"/*.json 2>/dev/null | grep -v /json/ | head -3 | tr '\n' ' ') -> baselines/"
echo "logs: $OUT/logs, JSON: $OUT/json, reports: $OUT/report-*/index.html"
echo
echo "== the decision with and without the drift correction, from the runs' JSON"
"$PYTHON" scripts/gate_drift_analysis.py "$BASEDIR"/*.json "$OUT"/json/clean-*.json "$OUT"/json/slowdown-*.json 2>&1 | grep -v "      regressed" | head -40
