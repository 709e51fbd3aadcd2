#!/usr/bin/env bash
# Tolerance samples and the sharpness table on one GPU, from the repository root (about 6 minutes on an H100):
#   python tools/tolerance_calibration.py --device cuda --sharpness: every CUDA path available without TensorFlow
#   (Keras-on-torch paths run when keras is importable or its wheels are in .whl/; unavailable paths are listed
#   with their reason), raw samples + sharpness sweep written to $OUT. Nothing in the checkout is modified:
#   the files are committed to docs/data/ and fitted afterwards with `python tools/tolerance_calibration.py --fit`.
# Files in $OUT: tolerance-samples-<device>.json, sharpness-<device>.json, errors-<device>.png, measure.log.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-measure-out}
export DEVICE=${DEVICE:-cuda}  # DEVICE=cpu: a dry run of this script on a CPU
SAMPLING_S=${SAMPLING_S:-190}   # seconds of sampling, shared by the available paths
SHARP_S=${SHARP_S:-18}          # seconds of planted-fault sweep per torch path (5 paths run it)
mkdir -p "$OUT"
source scripts/gpu_env.sh  # .whl/ wheels, PYTHONPATH, PLUGIN
t0=$(date +%s)
read -r PATHS N <<<"$($PYTHON - <<'PY'
import os, warnings; warnings.filterwarnings("ignore")
from pytest_lstmperf import paths
from pytest_lstmperf.device import resolve_device
device = resolve_device(os.environ.get("DEVICE", "cuda"))
names = [p.name for p in paths.for_device(device.kind)]
ok = [n for n in names if paths.get(n).available(device) is None]
print(",".join(names), max(1, len(ok)))
PY
)"
BUDGET=$(( SAMPLING_S / N )); [ "$BUDGET" -ge 1 ] || BUDGET=1
echo "== measuring $N available of: $PATHS ($BUDGET s sampling each, $SHARP_S s sharpness per torch path)"
timeout 420 $PYTHON tools/tolerance_calibration.py --device "${DEVICE:-cuda}" --paths "$PATHS" --examples 200 --budget "$BUDGET" \
  --sharpness --sharpness-budget "$SHARP_S" --out "$OUT" 2>&1 | grep -v Warning | tee "$OUT/measure.log"
rc=${PIPESTATUS[0]}
echo "== wall $(( $(date +%s) - t0 ))s, exit $rc; files:"
ls -la "$OUT"
exit "$rc"
