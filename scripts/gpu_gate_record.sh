#!/usr/bin/env bash
# Record this GPU's baseline of the default benchmark set, starting from the committed baselines/ folder:
#   1. compare against what is committed (a format-1 file is read as format 2: kernels and host counts compared,
#      timings inconclusive until recorded);
#   2. --lstmperf-save-baseline fills the timings (and writes the hardware-keyed file, the old figures in each
#      entry's history), then RECORD_RUNS-1 more runs with --lstmperf-add-baseline-run;
#   3. copy the new file to $OUT/baseline-<key>.json and the logs to $OUT/record.log.
#
#   OUT=/tmp/rec bash scripts/gpu_gate_record.sh
#
# Environment: OUT (default ./gate-record-out), RECORD_RUNS (default 3), PYTHON, DEVICE (default cuda).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gate-record-out}
RECORD_RUNS=${RECORD_RUNS:-3}
DEVICE=${DEVICE:-cuda}
mkdir -p "$OUT"
source scripts/gpu_env.sh
BASEDIR=$(mktemp -d)/baselines
cp -r baselines "$BASEDIR"
LOG="$OUT/record.log"
: >"$LOG"
COMMON=($PLUGIN "--device=$DEVICE" "--lstmperf-baselines=$BASEDIR" -p no:cacheprovider suites/test_benchmarks.py)
step() {  # step NAME [pytest args...]
  local name=$1 t0 rc; shift
  t0=$(date +%s)
  "$PYTHON" -m pytest "${COMMON[@]}" "$@" >"$BASEDIR/../$name.log" 2>&1
  rc=$?
  { echo; echo "######## $name: exit $rc, $(( $(date +%s) - t0 )) s: pytest $*"; cat "$BASEDIR/../$name.log"; } >>"$LOG"
  echo "$name: exit $rc, $(( $(date +%s) - t0 )) s"
  grep -h "^speed gate\|^SPEED GATE\|^baseline \|RECORDING RUN REFUSED\|resolve less\|older format\|passed\|failed" "$BASEDIR/../$name.log" | tail -6
}
step compare-committed --benchmark-compare -q
step record --lstmperf-save-baseline -q
for k in $(seq 2 "$RECORD_RUNS"); do step "record$k" --lstmperf-add-baseline-run -q; done
for f in "$BASEDIR"/*.json; do
  case $(basename "$f") in *-drv*) ;; *) cp "$f" "$OUT/baseline-$(basename "$f")" ;; esac
done
ls -la "$OUT"
