#!/usr/bin/env bash
# GPU verification, from the repository root: re-measure the CUDA paths' error distributions (merged into
# pytest_lstmperf/tolerances.json, with the samples and a histogram), then run the kernel-claim and
# equivalence suites on the GPU (default profile: the merge gate; gpu profile on the torch paths), then the
# Keras-on-torch explainer table. Writes at most 8 files to $OUT.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-verify-out}
mkdir -p "$OUT"
WORK=$(mktemp -d)
source scripts/gpu_env.sh  # .whl/ wheels, PYTHONPATH, PLUGIN
TORCH_CUDA=$($PYTHON -c "from pytest_lstmperf import paths; print(','.join(p.name for p in paths.for_device('cuda', paths.all_paths()) if p.framework == 'torch'))")
t0=$(date +%s)
echo "== 1. tolerance measurement: $TORCH_CUDA,keras-torch-cudnn"
timeout 150 $PYTHON tools/tolerance_calibration.py --device cuda --examples ${EXAMPLES:-25} --paths "$TORCH_CUDA,keras-torch-cudnn" \
  --out "$WORK/measure" --write 2>&1 | grep -v "^FINDING" | tee "$OUT/measure.log"
grep -c "^FINDING" "$WORK"/measure/*.json >/dev/null 2>&1
cp pytest_lstmperf/tolerances.json "$OUT/tolerances.json"
cp "$WORK"/measure/samples-*.json "$OUT/samples-cuda.json" 2>/dev/null
cp "$WORK"/measure/errors-*.png "$OUT/errors-cuda.png" 2>/dev/null
t1=$(date +%s)
echo "== 2a. pytest suites/test_kernels.py suites/test_equivalence.py --device=cuda (default profile, all CUDA paths)"
timeout 200 $PYTHON -m pytest $PLUGIN suites/test_kernels.py suites/test_equivalence.py --device=cuda -p no:cacheprovider \
  -rfEsx 2>&1 | tee "$OUT/suites-ci.log" | sed -n '/lstmperf: per path/,$p' | cut -c1-260
t2=$(date +%s)
echo "== 2b. equivalence, gpu profile, torch paths"
timeout 150 $PYTHON -m pytest $PLUGIN suites/test_equivalence.py --device=cuda -p no:cacheprovider --lstmperf-profile=gpu \
  --lstmperf-paths="$TORCH_CUDA" -rfEx 2>&1 | tee "$OUT/suites-gpu.log" | sed -n '/lstmperf: per path/,$p' | cut -c1-260
t3=$(date +%s)
echo "== 3. Keras on torch: explainer vs observed"
timeout 120 $PYTHON scripts/gpu_keras_torch.py "$WORK/keras" 2>&1 | tee "$OUT/keras.log" | tail -45
t4=$(date +%s)
echo "== wall: measure $((t1-t0))s, suites default profile $((t2-t1))s, gpu profile $((t3-t2))s, keras $((t4-t3))s"
