#!/usr/bin/env bash
# GPU check of Keras 3 on the JAX backend, from the repository root on a CUDA machine with JAX's CUDA plugin
# (keras wheels in .whl/ are installed to /tmp/site when present): 1. a probe of what XLA compiles (cuDNN
# custom call or XLA loop, the dots' precision), go_backwards on the cuDNN LSTM, mixed_float16, a CPU-placed
# layer on a GPU machine; 2. the kernel-claim, equivalence and explainer suites on the keras-jax CUDA paths;
# 3. the speed gate's benchmarks and the Keras overhead workload rows for them. About 4-5 minutes (each step
# has its own timeout; at most about 10 minutes).
# Writes probe.json, probe.log, suites.log, bench.log, workloads.log to $OUT; the summary is printed last.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-keras-jax-out}
mkdir -p "$OUT"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
source scripts/gpu_env.sh  # .whl/ wheels, PYTHONPATH, PLUGIN
t0=$(date +%s)
echo "== 0. JAX"
KERAS_BACKEND=jax timeout 60 $PYTHON -c "import jax, keras; print('jax', jax.__version__, 'keras', keras.__version__, \
'default backend', jax.default_backend(), jax.devices())" 2>&1 | tail -2
PATHS=$($PYTHON -c "from pytest_lstmperf import paths; print(','.join(p.name for p in paths.for_device('cuda', paths.all_paths()) \
if p.framework == 'keras-jax'))")
GATE=$($PYTHON -c "from pytest_lstmperf import paths; print(','.join(p.name for p in paths.for_device('cuda', paths.all_paths()) \
if p.framework == 'keras-jax' and p.in_gate))")
echo "paths: $PATHS (gate: $GATE)"
echo "== 1. probe"
KERAS_BACKEND=jax timeout 150 $PYTHON scripts/gpu_keras_jax_probe.py "$OUT/probe.json" 2>&1 | grep -v "^WARNING\|^I0000\|^W0000" \
  | tee "$OUT/probe.log" | cut -c1-400
t1=$(date +%s)
echo "== 2. kernels, equivalence, explainer on cuda"
timeout 270 $PYTHON -m pytest $PLUGIN suites/test_kernels.py suites/test_equivalence.py suites/test_keras_explainer.py \
  --device=cuda --lstmperf-paths="$PATHS" -p no:cacheprovider -rfEsx 2>&1 | tee "$OUT/suites.log" \
  | sed -n '/FAILURES/,/short test summary/p' | grep -E "^\s+\[|^path |^_" | cut -c1-300 | head -40
t2=$(date +%s)
echo "== 3. speed gate benchmarks and the Keras overhead rows"
timeout 120 $PYTHON -m pytest $PLUGIN suites/test_benchmarks.py --device=cuda --lstmperf-paths="$GATE" \
  -p no:cacheprovider -q 2>&1 | tee "$OUT/bench.log" | sed -n '/lstmperf speed/,$p' | cut -c1-200; tail -1 "$OUT/bench.log"
timeout 90 $PYTHON -m pytest $PLUGIN suites/test_workloads.py --device=cuda -k "keras_overhead and jax" -p no:cacheprovider -q \
  -rs 2>&1 | tee "$OUT/workloads.log" | grep -E "keras-|passed|failed" | cut -c1-220 | tail -12
t3=$(date +%s)
echo "== summary (probe $((t1-t0))s, suites $((t2-t1))s, speed $((t3-t2))s)"
$PYTHON - "$OUT/probe.json" <<'PY'
import json, os, sys
if not os.path.exists(sys.argv[1]):
    sys.exit("probe wrote no probe.json (see probe.log)")
facts = json.load(open(sys.argv[1]))
print(f"jax {facts.get('jax')} keras {facts.get('keras')} on {facts.get('devices')}")
for name, row in (facts.get("kernels") or {}).items():
    if isinstance(row, dict):
        print(f"  {name:24} {row.get('family', row.get('error', ''))!s:22} calls={row.get('custom_calls')} "
              f"while={row.get('while')} gemm={row.get('gemm_precision')} {row.get('algorithms')}")
for name in ("go_backwards", "mixed_float16", "cpu_placed_on_gpu_machine"):
    print(f"  {name:24} {json.dumps(facts.get(name), default=str)[:300]}")
PY
sed -n '/lstmperf: per path/,/lstmperf: wall/p' "$OUT/suites.log" | cut -c1-200
tail -1 "$OUT/suites.log"
