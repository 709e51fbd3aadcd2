#!/usr/bin/env bash
# The speed gate validated on one GPU machine, from the repository root: the README's recipe on a subset of the
# paths (one recording command, then compares), planted faults, a busy neighbour, and the default command timed;
# or the same trials on the machine's CPU.
#
#   OUT=/tmp/g bash scripts/gpu_gate.sh cuda     # record, clean and faulty subset runs, the default command
#   OUT=/tmp/g bash scripts/gpu_gate.sh default  # the default command against the committed baselines, RUNS times (2)
#   OUT=/tmp/g bash scripts/gpu_gate.sh cpu      # the host's CPU: record, clean (one process, -n 2), slowdown, update
#
# Environment: OUT (default ./gpu-gate-out), BUDGET_S (no run starts after it, default 420), PYTHON (python3).
# Keras wheels carried in .whl/ are installed first (scripts/gpu_env.sh). Files under $OUT: trials.json (every
# verdict, resolution and wall time, written after each run), trials.log, the recorded baseline, the runs' logs
# (runs.tar.gz).
set -u
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
OUT=${OUT:-$PWD/gpu-gate-out}
BUDGET_S=${BUDGET_S:-420}
mkdir -p "$OUT"
WORK=$OUT/work
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$OUT/machine.txt" 2>&1
nproc >>"$OUT/machine.txt"
finish() {
  cp "$WORK"/baselines/*.json "$OUT/" 2>/dev/null
  tar czf "$OUT/runs.tar.gz" -C "$WORK" runs 2>/dev/null
  mv "$WORK/trials.json" "$OUT/" 2>/dev/null
  rm -rf "$WORK"
}
trap finish EXIT
case "${1:-cuda}" in
  cuda)
    timeout $((BUDGET_S + 150)) "$PYTHON" scripts/gate_trials.py --device=cuda --out="$WORK" --extra="$PLUGIN" \
      --paths=torch-cudnn-fp32,torch-cuda-generic,keras-torch-cudnn --clean=2 --xdist=1 --slow=1 \
      --faults="cudnn-off kernel-slowdown:1.25 kernel-slowdown:1.10" --busy=1 --after-update=0 --default-runs=0 \
      --budget="$BUDGET_S" 2>&1 | tee "$OUT/trials.log"
    ;;
  default)  # the default command against the committed baseline, twice (cold, warm): its wall time and phases
    mkdir -p "$WORK/baselines" "$WORK/runs"
    cp baselines/*.json "$WORK/baselines/"
    for k in $(seq 1 "${RUNS:-2}"); do
      t0=$(date +%s%N)
      timeout "$BUDGET_S" "$PYTHON" -m pytest $PLUGIN suites/ --device=cuda --benchmark-compare -p no:cacheprovider \
        --lstmperf-baselines="$WORK/baselines" >"$WORK/runs/default-$k.log" 2>&1
      rc=$?
      ms=$(( ($(date +%s%N) - t0) / 1000000 ))
      echo "default command run $k: exit $rc, wall $((ms / 1000)).$(printf %03d $((ms % 1000))) s" | tee -a "$OUT/default.txt"
      grep -E "^(speed gate|SPEED GATE|time by phase|resolution|lstmperf: wall time|=+ .* in )" "$WORK/runs/default-$k.log" \
        | tee -a "$OUT/default.txt"
    done
    ;;
  cpu)
    timeout $((BUDGET_S + 150)) "$PYTHON" scripts/gate_trials.py --device=cpu --out="$WORK" --extra="$PLUGIN" \
      --paths=torch-cpu-native,torch-cpu-onednn,torch-cpu-packed,onnxruntime-cpu --clean=5 --xdist=3 --slow=2 \
      --busy=1 --after-update=2 --budget="$BUDGET_S" 2>&1 | tee "$OUT/trials.log"
    ;;
esac
