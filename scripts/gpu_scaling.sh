#!/usr/bin/env bash
# Measured scale-out on a multi-GPU host (docs/scaling.md), one command:
#   OUT=/tmp/scale bash scripts/gpu_scaling.sh
# 1. the GPUs, their links and the software versions (gpus.txt);
# 2. python -m pytest_lstmperf.workloads.scalebench: the sizing (per-layer forward+backward time, issue time and a
#    micro-batch's send/recv between GPUs 0 and 1 for each candidate size), DDP, the pipeline and the pipeline on
#    length-bucketed data on 1..N GPUs against plain single-GPU training (3 timed passes each), and the
#    micro-batch sweep with the measured bubble. Each run lands in $OUT/scalebench.jsonl as it ends, the tables
#    in $OUT/summary.md; BENCH_ARGS passes further options (e.g. "--size thorough --parts scaling");
# 3. with SUITE=1, also pytest-xdist with one worker per GPU and the scaling suite (suites/test_scaling.py).
# NVLink multicast stays off (it can take a shared host's GPUs out of service). BENCH_LIMIT (480 s) bounds the
# benchmark (SIGTERM), and 15 s later SIGKILL ends it if the elastic agent is still waiting for its ranks.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-scaling-out}
mkdir -p "$OUT"
source scripts/gpu_env.sh  # .whl/ wheels, PYTHONPATH, PLUGIN, PYTHON
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi -L
  nvidia-smi topo -m
  "$PYTHON" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn',
torch.backends.cudnn.version(), 'nccl', torch.cuda.nccl.version(), 'gpus', torch.cuda.device_count())"
} >"$OUT/gpus.txt" 2>&1
cat "$OUT/gpus.txt"

echo "== scalebench"
t0=$(date +%s)
# shellcheck disable=SC2086
timeout -k 15 "${BENCH_LIMIT:-480}" "$PYTHON" -m pytest_lstmperf.workloads.scalebench --out "$OUT" ${BENCH_ARGS:-} \
  >"$OUT/scalebench.log" 2>&1
echo "   exit $?, $(( $(date +%s) - t0 )) s"
grep -vE "^\|" "$OUT/scalebench.log" | grep -E "sizing|size used|scaling|micro-batches|failed|Error" | cut -c1-200
[ -f "$OUT/summary.md" ] && cat "$OUT/summary.md"

if [ -n "${SUITE:-}" ]; then
  echo "== pytest-xdist -n auto: one worker per GPU"
  t0=$(date +%s)
  timeout "${XDIST_LIMIT:-150}" "$PYTHON" -m pytest $PLUGIN suites/test_benchmarks.py --device=cuda -n auto \
    -p no:cacheprovider --lstmperf-paths=torch-cudnn-fp32 -k test_inference --benchmark-json="$OUT/xdist.json" \
    >"$OUT/xdist.log" 2>&1
  echo "   exit $?, $(( $(date +%s) - t0 )) s"
  grep -E "pinned|passed|failed|error|benchmark-json" "$OUT/xdist.log" | head -8
  echo "== scaling suite"
  t0=$(date +%s)
  timeout "${SCALING_LIMIT:-420}" "$PYTHON" -m pytest $PLUGIN suites/test_scaling.py --device=cuda \
    -p no:cacheprovider -v -rA --lstmperf-report="$OUT/report" >"$OUT/scaling.log" 2>&1
  echo "   exit $?, $(( $(date +%s) - t0 )) s"
  grep -E "PASSED|FAILED|SKIPPED|passed|failed" "$OUT/scaling.log" | tail -12
fi
