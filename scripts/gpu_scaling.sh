#!/usr/bin/env bash
# Scale-out on a multi-GPU host: pytest-xdist with one worker per GPU (-n auto) on a few benchmarks, the
# torchrun entry point, and the scaling suite (DDP and the layer pipeline on 1..N GPUs) with its report.
# Run from the repository root:  OUT=/tmp/scale bash scripts/gpu_scaling.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-scaling-out}
mkdir -p "$OUT"
source scripts/gpu_env.sh  # .whl/ wheels, PYTHONPATH, PLUGIN
nvidia-smi -L
nvidia-smi topo -m >"$OUT/topo.txt" 2>&1
GPUS=$("$PYTHON" -c "import torch; print(torch.cuda.device_count())")

echo "== pytest-xdist -n auto ($GPUS GPUs): one worker per GPU"
t0=$(date +%s)
timeout "${XDIST_LIMIT:-150}" "$PYTHON" -m pytest $PLUGIN suites/test_benchmarks.py --device=cuda -n auto \
  -p no:cacheprovider --lstmperf-paths=torch-cudnn-fp32 -k test_inference --benchmark-json="$OUT/xdist.json" \
  >"$OUT/xdist.log" 2>&1
echo "   exit $?, $(( $(date +%s) - t0 )) s"
grep -E "pinned|passed|failed|error|benchmark-json" "$OUT/xdist.log" | head -8
"$PYTHON" - "$OUT/xdist.json" <<'PY'
import collections, json, sys
try:
    data = json.load(open(sys.argv[1]))
except (OSError, ValueError) as exc:
    sys.exit(f"   no benchmark JSON: {exc}")
where = collections.Counter(b["extra_info"].get("device", "?") for b in data["benchmarks"])
print(f"   {len(data['benchmarks'])} benchmarks in one JSON, by device: {dict(where)}")
PY

echo "== torchrun --nproc-per-node $GPUS (pipeline, 8 layers)"
timeout 120 torchrun --nproc-per-node "$GPUS" -m pytest_lstmperf.workloads.rank --strategy pipeline --layers 8 \
  --input-size 256 --hidden 512 --seq-len 100 --batch 64 --steps 8 --timed-passes 3 --out "$(mktemp -d)/torchrun.pt" \
  >"$OUT/torchrun.log" 2>&1
echo "   exit $?"; grep -E "time steps|Error" "$OUT/torchrun.log" | tail -2

echo "== scaling suite"
t0=$(date +%s)
timeout "${SCALING_LIMIT:-420}" "$PYTHON" -m pytest $PLUGIN suites/test_scaling.py --device=cuda \
  -p no:cacheprovider -v -rA --lstmperf-report="$OUT/report" >"$OUT/scaling.log" 2>&1
echo "   exit $?, $(( $(date +%s) - t0 )) s"
sed -n '/lstmperf workloads/,/workload report written/p' "$OUT/scaling.log" | cut -c1-220
grep -E "PASSED|FAILED|SKIPPED|passed|failed" "$OUT/scaling.log" | tail -12
