#!/usr/bin/env bash
# One GPU session's gate checks, from the repository root: one more recording run added to the committed
# baseline (a copy), then scripts/gpu_gate_trust.sh against it (the default command once, N clean runs and the
# planted faults). OUT gets baseline.json (the copy with the added run), add-run.log and trust/.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gate-call-out}
mkdir -p "$OUT"
source scripts/gpu_env.sh
DIR=$(mktemp -d)/baselines
mkdir -p "$DIR"
cp baselines/*.json "$DIR/"
t0=$(date +%s)
"$PYTHON" -m pytest $PLUGIN --device=cuda "--lstmperf-baselines=$DIR" -p no:cacheprovider suites/test_benchmarks.py \
  --lstmperf-add-baseline-run -q >"$OUT/add-run.log" 2>&1
echo "add-run: exit $?, $(( $(date +%s) - t0 )) s"
grep -h "^baseline \|RECORDING RUN" "$OUT/add-run.log" | cut -c1-220
B=$(ls "$DIR"/*.json | head -1)
cp "$B" "$OUT/baseline.json"
OUT=$OUT/trust BASELINE=$B N=${N:-5} BUDGET_S=${BUDGET_S:-330} bash scripts/gpu_gate_trust.sh
