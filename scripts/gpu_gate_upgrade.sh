#!/usr/bin/env bash
# The speed gate across a real Keras upgrade on one GPU, from the repository root: the Keras-on-torch benchmarks
# recorded with the older Keras (wheels in .whl-old/), then compared with the newer one (wheels in .whl/, as
# scripts/gpu_env.sh installs them). The compare must say "upgrade: keras A -> B: ..." first and decide every
# benchmark by the same rule. OUT gets record.log and compare.log.
#
#   OUT=/tmp/upgrade bash scripts/gpu_gate_upgrade.sh
#
# Environment: OUT (default ./gate-upgrade-out), PATHS (default keras-torch-cudnn,keras-torch-cuda-generic),
# PYTHON, DEVICE (default cuda).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gate-upgrade-out}
PATHS=${PATHS:-keras-torch-cudnn,keras-torch-cuda-generic}
DEVICE=${DEVICE:-cuda}
mkdir -p "$OUT"
source scripts/gpu_env.sh  # the newer Keras (.whl/) on PYTHONPATH
OLD=$(mktemp -d)
"$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$OLD" .whl-old/keras-*.whl
BASEDIR=$(mktemp -d)/baselines
COMMON=($PLUGIN "--device=$DEVICE" "--lstmperf-baselines=$BASEDIR" "--lstmperf-paths=$PATHS" -p no:cacheprovider
  suites/test_benchmarks.py)
keras_version() { KERAS_BACKEND=torch "$PYTHON" -c "import keras; print(keras.__version__)" 2>/dev/null | tail -1; }
echo "record with keras $(PYTHONPATH=$OLD:$PYTHONPATH keras_version)"
PYTHONPATH=$OLD:$PYTHONPATH "$PYTHON" -m pytest "${COMMON[@]}" --lstmperf-save-baseline -q >"$OUT/record.log" 2>&1
echo "record: exit $?"
grep -h "^baseline " "$OUT/record.log"
echo "compare with keras $(keras_version)"
"$PYTHON" -m pytest "${COMMON[@]}" --benchmark-compare -v >"$OUT/compare.log" 2>&1
echo "compare: exit $?"
grep -h "^upgrade\|^speed gate\|^SPEED GATE\|regressed\|kernel-changed" "$OUT/compare.log" | head -20
