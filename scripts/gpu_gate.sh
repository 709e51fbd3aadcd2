#!/usr/bin/env bash
# The speed gate validated on one GPU machine, from the repository root: the README's recipe taken literally on
# the GPU (one recording command of the default command, then the default command timed twice), planted faults on
# a subset of the paths, or the same trials on the machine's CPU.
#
#   OUT=/tmp/g bash scripts/gpu_gate.sh cuda     # record, 2 default-command compares, clean and faulty subset runs
#   OUT=/tmp/g bash scripts/gpu_gate.sh cpu      # the host's CPU: record, clean (one process, -n 2), slowdown, update
#
# Environment: OUT (default ./gpu-gate-out), BUDGET_S (no run starts after it, default 540), PYTHON (python3).
# Keras wheels carried in .whl/ are installed first (scripts/gpu_env.sh). Files under $OUT: trials.json (every
# verdict, resolution and wall time), trials.log, the recorded baseline, and the logs of the default command.
set -u
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
OUT=${OUT:-$PWD/gpu-gate-out}
BUDGET_S=${BUDGET_S:-540}
mkdir -p "$OUT"
WORK=$(mktemp -d)
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader >"$OUT/machine.txt" 2>&1
nproc >>"$OUT/machine.txt"
case "${1:-cuda}" in
  cuda)
    "$PYTHON" scripts/gate_trials.py --device=cuda --out="$WORK" --extra="$PLUGIN" --record-target=suites/ \
      --default-runs=2 --paths=torch-cudnn-fp32,torch-cuda-generic,keras-torch-cudnn --clean=2 --xdist=0 \
      --slow=1 --faults="cudnn-off kernel-slowdown:1.25 kernel-slowdown:1.10" --busy=1 --after-update=0 \
      --budget="$BUDGET_S" 2>&1 | tee "$OUT/trials.log"
    cp "$WORK"/runs/default-command-1.log "$OUT/" 2>/dev/null
    ;;
  cpu)
    "$PYTHON" scripts/gate_trials.py --device=cpu --out="$WORK" --extra="$PLUGIN" \
      --paths=torch-cpu-native,torch-cpu-onednn,torch-cpu-packed,onnxruntime-cpu --clean=6 --xdist=4 --slow=3 \
      --busy=2 --after-update=3 --budget="$BUDGET_S" 2>&1 | tee "$OUT/trials.log"
    ;;
esac
cp "$WORK"/trials.json "$OUT/" 2>/dev/null
cp "$WORK"/baselines/*.json "$OUT/" 2>/dev/null
cp "$WORK"/runs/record.log "$OUT/" 2>/dev/null
ls "$OUT"
