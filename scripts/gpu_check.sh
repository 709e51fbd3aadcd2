#!/usr/bin/env bash
# One GPU session's checks of the core and the Keras paths, from the repository root:
#   1. measure the error distributions of every CUDA path (merged into pytest_lstmperf/tolerances.json),
#   2. run the kernel-claim and equivalence suites on the GPU (default profile, then the gpu profile),
#   3. the Keras-on-torch explainer table (needs keras wheels in .whl/ when keras is not installed).
# Results go to $OUT as a few files (logs, tolerances.json, one tarball of the rest).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
WORK=$(mktemp -d)
source scripts/gpu_env.sh  # .whl/ wheels, PYTHONPATH, PLUGIN
CUDA_PATHS=$($PYTHON - <<'PY'
from pytest_lstmperf import paths
print(",".join(p.name for p in paths.for_device("cuda") if p.framework in ("torch", "keras-torch")))
PY
)
echo "== CUDA paths: $CUDA_PATHS"
t0=$(date +%s)
echo "== 1. tolerance measurement"
$PYTHON tools/tolerance_calibration.py --device cuda --examples ${EXAMPLES:-20} --paths "$CUDA_PATHS" \
  --out "$WORK/measure" --write 2>&1 | grep -v Warning | tee "$OUT/measure.log"
cp pytest_lstmperf/tolerances.json "$OUT/tolerances.json"
t1=$(date +%s)
echo "== 2a. suites, default profile (the merge gate's equivalence run)"
timeout 400 $PYTHON -m pytest $PLUGIN suites/test_kernels.py suites/test_equivalence.py --device=cuda -p no:cacheprovider \
  -rfEsx --junitxml="$WORK/suites-ci.xml" 2>&1 | tee "$OUT/suites-ci.log" | tail -60
t2=$(date +%s)
echo "== 2b. suites, gpu profile, torch paths"
timeout 300 $PYTHON -m pytest $PLUGIN suites/test_equivalence.py --device=cuda -p no:cacheprovider --lstmperf-profile=gpu \
  -k "torch-" -q -rfEx 2>&1 | tee "$WORK/suites-gpu.log" | tail -25
t3=$(date +%s)
echo "== 3. Keras on torch: explainer vs observed"
timeout 150 $PYTHON scripts/gpu_keras_torch.py "$WORK/keras" 2>&1 | tee "$WORK/keras.log" | tail -45
t4=$(date +%s)
echo "== wall: measure $((t1-t0))s, suites ci $((t2-t1))s, suites gpu $((t3-t2))s, keras $((t4-t3))s"
tar czf "$OUT/rest.tar.gz" -C "$WORK" .
