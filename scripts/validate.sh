#!/usr/bin/env bash
# Validate a change on a GPU machine: one entry point, one subcommand per batched run (docs/validation.md,
# "Validating a change on a GPU"). From the repository root or anywhere:
#
#   OUT=/tmp/v bash scripts/validate.sh SUBCOMMAND [ARGS]   # or: bash scripts/validate.sh --out /tmp/v SUBCOMMAND
#   bash scripts/validate.sh --dry-run SUBCOMMAND           # print what would run, run nothing
#   bash scripts/validate.sh help                           # the subcommands
#
# Each subcommand writes its logs and JSON under $OUT/SUBCOMMAND/ (OUT defaults to /tmp/validate-out), with
# steps.json (every step's exit status and wall time), and prints a summary last; it exits 1 when a step's exit
# status is not the one expected. Every step has its own time limit, so that one subcommand fits in one
# 10-minute command. The machine needs no network and no TensorFlow: Keras wheels carried in .whl/ are installed
# into /tmp/site by scripts/gpu_env.sh, which every subcommand sources (PYTHON, PYTHONPATH, PLUGIN).
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
DRY=""
OUT=${OUT:-${TMPDIR:-/tmp}/validate-out}
while [ $# -gt 0 ]; do
  case $1 in
    -n | --dry-run) DRY=1; shift ;;
    --out) OUT=$2; shift 2 ;;
    --out=*) OUT=${1#--out=}; shift ;;
    *) break ;;
  esac
done
SUB=${1:-help}
shift || true
OUT=$(realpath -m "$OUT")
DIR=$OUT/$SUB

usage() {
  cat <<'EOF'
usage: [OUT=dir] bash scripts/validate.sh [--dry-run] [--out DIR] SUBCOMMAND [ARGS]

  env                   versions, the GPUs and their links, every CUDA path and why one is unavailable
  gate                  the default speed-gate command against the committed baselines (scripts/gpu_gate.sh default)
  gate-trials [cuda|cpu]  the gate's trials: record, clean and planted-fault compares (scripts/gpu_gate.sh,
                        scripts/gate_trials.py)
  record                this GPU's baseline of the default benchmark set, recorded from a copy of baselines/
  upgrade               the gate across a Keras upgrade (older wheels in .whl-old/, newer in .whl/)
  numerics              equivalence on cuda (ci and gpu profiles) and with numeric faults planted in every call
  tolerances            error samples of every CUDA path and the planted-fault sharpness sweep
  kernels               the kernel suite on cuda, the compiled/ONNX paths, the device meters' guarantees
  keras                 the Keras paths on cuda: kernels, equivalence, explainer, the Keras-on-torch table
  models                users' own models and the examples on cuda (verify_model, markers, speed test, report)
  workloads             the crossover CLI and the workload suite (SET, SELECT, CROSSOVER=0)
  ci-recipe             the GPU jobs of examples/ci/lstmperf.yml run as written (JOBS=speed-gate: that one only)
  scaling               workloads/scalebench on every GPU of the host (BENCH_ARGS; SUITE=1: xdist and the suite)
  same-outcome BEFORE   the default command on the tree BEFORE and on this one, per-test outcomes compared
                        (DEVICE=cpu: the suites on the host's CPU, benchmarks run once, -n XDIST)
EOF
}

# ---------------------------------------------------------------------------------------------------- the steps
declare -A RC WALL EXPECT
ORDER=()
PYTHON=${PYTHON:-python3}
PLUGIN="-p pytest_lstmperf.plugin"
setup() {  # the output folder and the environment: scripts/gpu_env.sh (wheels, PYTHONPATH, PYTHON, PLUGIN)
  if [ -n "$DRY" ]; then
    echo "(dry run: nothing runs; output would go to $DIR)"
    return
  fi
  mkdir -p "$DIR"
  case $SUB in
    # these source it themselves (scripts/gpu_gate.sh, each tree of same-outcome), or must not (ci-recipe: the
    # jobs make their own environment)
    gate | gate-trials | same-outcome | ci-recipe) ;;
    # shellcheck source=scripts/gpu_env.sh
    *) source scripts/gpu_env.sh ;;
  esac
}
pytest_cmd() {  # the pytest command line every suite step starts with, into the array PYTEST
  # shellcheck disable=SC2206
  PYTEST=("$PYTHON" -m pytest $PLUGIN -p no:cacheprovider)
}
step() {  # step NAME SECONDS COMMAND...: COMMAND under a time limit, its output in $DIR/NAME.log
  local name=$1 limit=$2 t0 rc
  shift 2
  ORDER+=("$name")
  if [ -n "$DRY" ]; then
    echo "[$name, at most $limit s] $(printf '%q ' "$@")"
    RC[$name]=0
    WALL[$name]=0
    return 0
  fi
  echo "== $name"
  t0=$(date +%s)
  timeout -k 15 "$limit" "$@" >"$DIR/$name.log" 2>&1
  rc=$?
  RC[$name]=$rc
  WALL[$name]=$(($(date +%s) - t0))
  echo "   exit $rc, ${WALL[$name]} s${EXPECT[$name]:+ (expected exit ${EXPECT[$name]})}"
  return 0
}
say() { [ -n "$DRY" ] || echo "$@"; }
show() {  # show NAME PATTERN [N]: the last N (1) lines of NAME.log that match, or its last lines where none do
  [ -n "$DRY" ] && return 0
  local log="$DIR/$1.log"
  [ -f "$log" ] || return 0
  grep -E "$2" "$log" | tail -n "${3:-1}" | cut -c1-240 | sed 's/^/  /' | grep . \
    || tail -n 3 "$log" | cut -c1-240 | sed 's/^/  (no match) /'
}
finish() {  # the table of steps, steps.json, and the exit status: 1 where a step did not exit as expected
  local status=0 name sep=""
  [ -n "$DRY" ] && exit 0
  echo
  echo "== $SUB: steps (logs in $DIR)"
  printf '%-22s %5s %8s %s\n' step exit seconds expected
  {
    printf '{"subcommand": "%s", "steps": [' "$SUB"
    for name in "${ORDER[@]}"; do
      printf '%s{"name": "%s", "exit": %s, "expected": %s, "seconds": %s}' "$sep" "$name" "${RC[$name]}" \
        "${EXPECT[$name]:-0}" "${WALL[$name]}"
      sep=", "
    done
    printf ']}\n'
  } >"$DIR/steps.json"
  for name in "${ORDER[@]}"; do
    printf '%-22s %5s %8s %s\n' "$name" "${RC[$name]}" "${WALL[$name]}" "${EXPECT[$name]:-0}"
    [ "${RC[$name]}" = "${EXPECT[$name]:-0}" ] || status=1
  done
  exit "$status"
}
cuda_paths() {  # cuda_paths FILTER: comma-separated names of the CUDA paths for which FILTER (a Python
  # expression in p) holds; every registered path, the extended ones included
  [ -n "$DRY" ] && { echo "<cuda paths where $1>"; return; }
  "$PYTHON" -c "from pytest_lstmperf import paths
print(','.join(p.name for p in paths.for_device('cuda', sorted(paths.all_paths())) if $1))"
}

# ------------------------------------------------------------------------------------------------ subcommands
sub_env() {
  step gpus 60 bash -c "nvidia-smi; nvidia-smi topo -m; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv"
  step env 180 "$PYTHON" scripts/validate_checks.py env "$DIR/env.json"
  [ -n "$DRY" ] || cat "$DIR/env.log"
}

sub_gate() {  # delegated: scripts/gpu_gate.sh writes default.txt (wall time and phases per run) and runs.tar.gz
  step default $((${BUDGET_S:-420} * ${RUNS:-2} + 120)) env OUT="$DIR" bash scripts/gpu_gate.sh default
  [ -n "$DRY" ] || cat "$DIR/default.txt" 2>/dev/null
}

sub_gate_trials() {  # delegated: scripts/gpu_gate.sh (scripts/gate_trials.py) writes trials.json, trials.log, ...
  local where=${1:-cuda}
  case $where in cuda | cpu) ;; *) echo "gate-trials: cuda or cpu, not '$where'" >&2; exit 2 ;; esac
  step "trials-$where" $((${BUDGET_S:-420} + 200)) env OUT="$DIR" bash scripts/gpu_gate.sh "$where"
  [ -n "$DRY" ] || tail -n 40 "$DIR/trials.log" 2>/dev/null
}

sub_record() {
  # 1. compare against what is committed; 2. --lstmperf-save-baseline fills the timings (the old figures in each
  # entry's history), then RECORD_RUNS-1 runs added; 3. the new file copied to $DIR/baseline-<key>.json
  local base runs=${RECORD_RUNS:-3} k f
  base=$DIR/work/baselines
  [ -n "$DRY" ] || { rm -rf "$DIR/work" && mkdir -p "$DIR/work" && cp -r baselines "$base"; }
  pytest_cmd
  local common=("${PYTEST[@]}" "--device=${DEVICE:-cuda}" "--lstmperf-baselines=$base" suites/test_benchmarks.py)
  step compare-committed 240 "${common[@]}" --benchmark-compare -q
  step record 240 "${common[@]}" --lstmperf-save-baseline -q
  for k in $(seq 2 "$runs"); do step "record$k" 240 "${common[@]}" --lstmperf-add-baseline-run -q; done
  for name in "${ORDER[@]}"; do
    say "$name:"
    show "$name" "^speed gate|^SPEED GATE|^baseline |RECORDING RUN REFUSED|resolve less|older format|passed|failed" 6
  done
  if [ -z "$DRY" ]; then
    for f in "$base"/*.json; do
      case $(basename "$f") in *-drv*) ;; *) cp "$f" "$DIR/baseline-$(basename "$f")" ;; esac
    done
    rm -rf "$DIR/work"
  fi
}

sub_upgrade() {  # Keras-on-torch benchmarks recorded with the older Keras (.whl-old/), compared with the newer
  local old base paths=${PATHS:-keras-torch-cudnn,keras-torch-cuda-generic}
  old=$DIR/keras-old
  base=$DIR/work/baselines
  step install-old 120 "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$old" \
    .whl-old/keras-*.whl
  pytest_cmd
  local common=("${PYTEST[@]}" "--device=${DEVICE:-cuda}" "--lstmperf-baselines=$base" "--lstmperf-paths=$paths"
    suites/test_benchmarks.py)
  step record 240 env PYTHONPATH="$old:${PYTHONPATH:-}" "${common[@]}" --lstmperf-save-baseline -q
  step compare 240 "${common[@]}" --benchmark-compare -v
  show record "^baseline " 3
  show compare "^upgrade|^speed gate|^SPEED GATE|regressed|kernel-changed" 20
  [ -n "$DRY" ] || rm -rf "$DIR/work" "$old"
}

sub_numerics() {
  local torch_cuda fault
  torch_cuda=$(cuda_paths "p.framework == 'torch'")
  pytest_cmd
  step equivalence-ci 200 "${PYTEST[@]}" suites/test_equivalence.py --device=cuda -rfEsx \
    --junitxml="$DIR/equivalence-ci.xml"
  step equivalence-gpu 150 "${PYTEST[@]}" suites/test_equivalence.py --device=cuda --lstmperf-profile=gpu \
    "--lstmperf-paths=$torch_cuda" -rfEx
  # each numeric fault planted in every LSTM/GRU call (scripts/numeric_fault_plugin.py) must fail every CUDA path
  for fault in forget-bias:0.5 states-ignored nan; do
    EXPECT[fault-${fault%%:*}]=1
    step "fault-${fault%%:*}" 150 env PYTHONPATH="$ROOT/scripts:${PYTHONPATH:-}" PYTEST_LSTMPERF_NUMERIC="$fault" \
      "${PYTEST[@]}" -p numeric_fault_plugin suites/test_equivalence.py --device=cuda -q -rfEx
  done
  for name in "${ORDER[@]}"; do
    say "$name:"
    show "$name" "passed|failed|error"
  done
}

sub_tolerances() {  # nothing in the checkout changes: the files go to docs/data/, then `--fit` (docs/tolerances.md)
  local sampling=${SAMPLING_S:-190} sharp=${SHARP_S:-18} names n budget
  if [ -n "$DRY" ]; then
    names="<every cuda path>" n=1
  else
    read -r names n <<<"$("$PYTHON" - <<'PY'
import warnings; warnings.filterwarnings("ignore")
from pytest_lstmperf import paths
from pytest_lstmperf.device import resolve_device
device = resolve_device("cuda")
names = [p.name for p in paths.for_device(device.kind)]
ok = [n for n in names if paths.get(n).available(device) is None]
print(",".join(names), max(1, len(ok)))
PY
)"
  fi
  budget=$((sampling / n))
  [ "$budget" -ge 1 ] || budget=1
  echo "sampling $n available path(s) of $names, $budget s each; sharpness sweep $sharp s per torch path"
  step measure 480 "$PYTHON" tools/tolerance_calibration.py --device cuda --paths "$names" --examples 200 \
    --budget "$budget" --sharpness --sharpness-budget "$sharp" --out "$DIR"
  show measure "." 20
}

sub_kernels() {
  pytest_cmd
  step kernels-cuda 240 "${PYTEST[@]}" suites/test_kernels.py --device=cuda -rfEsx --junitxml="$DIR/kernels-cuda.xml"
  step compiled-onnx-cuda 150 "${PYTEST[@]}" suites/test_kernels.py suites/test_equivalence.py --device=cuda \
    --lstmperf-paths=torch-compile-cudnn,torch-cudnn-fp32,torch-compile-reduce-overhead,onnxruntime-cuda -q -rfEsx
  step compiled-onnx-cpu 90 "${PYTEST[@]}" suites/test_kernels.py suites/test_equivalence.py --device=cpu \
    --lstmperf-paths=onnxruntime-cpu,torch-compile-cpu,torch-cpu-onednn -q -rfEsx
  step meters 90 "$PYTHON" scripts/validate_checks.py meters "$DIR/meters.json"
  for name in kernels-cuda compiled-onnx-cuda compiled-onnx-cpu; do
    say "$name:"
    show "$name" "unavailable|passed|failed" 3
  done
  show meters '"ok"'
}

sub_keras() {
  local keras
  keras=$(cuda_paths "p.framework.startswith('keras-')")
  export XLA_PYTHON_CLIENT_PREALLOCATE=false
  pytest_cmd
  # keras-tensorflow paths report themselves unavailable (no TensorFlow); keras-jax ones need JAX's CUDA plugin
  step suites 300 "${PYTEST[@]}" suites/test_kernels.py suites/test_equivalence.py suites/test_keras_explainer.py \
    --device=cuda "--lstmperf-paths=$keras" -rfEsx --junitxml="$DIR/suites.xml"
  step keras-torch-table 150 "$PYTHON" scripts/gpu_keras_torch.py "$DIR/keras-torch"
  show suites "unavailable|passed|failed" 6
  show keras-torch-table "." 45
}

sub_models() {
  local marker seed speed
  export KERAS_BACKEND=torch
  pytest_cmd
  marker=$DIR/work/marker
  seed=$DIR/work/seed
  speed=$DIR/work/speed
  if [ -z "$DRY" ]; then
    rm -rf "$DIR/work" && mkdir -p "$marker" "$seed" "$speed"
    cat >"$marker/test_build_inside.py" <<'EOF'
import pytest
import torch


@pytest.mark.lstmperf_kernel("cudnn")
def test_builds_and_moves_inside_the_test():
    lstm = torch.nn.LSTM(16, 32, num_layers=2).to("cuda")
    lstm(torch.randn(10, 4, 16, device="cuda"))[0].sum().backward()


@pytest.mark.lstmperf_kernel("cudnn")
def test_cell_loop_fails_cudnn():  # planted: must fail, naming the cell
    cell = torch.nn.LSTMCell(16, 32).to("cuda")
    h = c = torch.zeros(4, 32, device="cuda")
    for _ in range(3):
        h, c = cell(torch.randn(4, 16, device="cuda"), (h, c))
EOF
    cat >"$seed/seedmodel.py" <<'EOF'
import keras


def model():
    inputs = keras.Input((30, 16), batch_size=1)
    x = keras.layers.LSTM(64, activation=keras.layers.ReLU(negative_slope=0.05))(inputs)
    return keras.Model(inputs, keras.layers.Dense(1)(x))
EOF
    cp examples/word_language_model/*.py "$speed"/
  fi
  # 1. the examples on cuda (kernel marker per layer call, verify_model on every CUDA path, eligibility report)
  step examples 300 "${PYTEST[@]}" examples --device=cuda -rfs -q --benchmark-disable --junitxml="$DIR/examples.xml"
  # 2. the kernel marker: a module built and moved to CUDA inside the marked test is a layer call; a cell loop fails
  EXPECT[marker]=1
  step marker 120 "${PYTEST[@]}" -q -rf --device=cuda "$marker" --junitxml="$DIR/marker.xml"
  # 3. verify_model on the word-language model (LSTM, GRU) and the translation model, on every CUDA path
  step own-model 240 "$PYTHON" scripts/validate_checks.py own-model "$DIR/own-model.json"
  step translation 150 "$PYTHON" scripts/validate_checks.py translation "$DIR/translation.json"
  # 4. the word-language example's speed test: recorded, a clean compare, a slowed forward planted (must fail)
  step speed-record 200 bash -c 'cd "$1" && shift && "$@" --device=cuda -q -k speed --lstmperf-save-baseline' _ \
    "$speed" "${PYTEST[@]}"
  step speed-clean 200 bash -c 'cd "$1" && shift && "$@" --device=cuda -q -k speed --benchmark-compare' _ \
    "$speed" "${PYTEST[@]}"
  if [ -z "$DRY" ]; then
    cat >"$speed/conftest.py" <<'EOF'
import wlm_model

original_forward = wlm_model.RNNModel.forward


def slowed_forward(self, input, hidden):
    original_forward(self, input, hidden)  # a stray extra forward pass, its result thrown away
    return original_forward(self, input, hidden)


wlm_model.RNNModel.forward = slowed_forward
EOF
  fi
  EXPECT[speed-slowed]=1
  step speed-slowed 200 bash -c 'cd "$1" && shift && "$@" --device=cuda -q -k speed --benchmark-compare' _ \
    "$speed" "${PYTEST[@]}"
  # 5. a cell-loop model (observed cuda-generic); report --run on a Keras model (torch backend) and on a cell loop
  step cells 120 "$PYTHON" scripts/validate_checks.py cells "$DIR/cells.json"
  step seed-report 150 bash -c 'cd "$1" && "$2" -m pytest_lstmperf.cli report seedmodel:model --device cuda --run \
    --json "$3"' _ "$seed" "$PYTHON" "$DIR/seed-report.json"
  step cell-report 150 bash -c 'cd examples/time_sequence_prediction && "$1" -m pytest_lstmperf.cli report \
    sine_model:Sequence --device cuda --run --batch 3 --seq-len 100 --json "$2"' _ "$PYTHON" "$DIR/cell-report.json"
  say "examples (expect all passed):"
  show examples "passed|failed|error"
  say "marker (expect 1 passed, 1 failed: the cell loop, named; no 'outside any recurrent layer'):"
  show marker "passed|failed"
  show marker "outside any recurrent layer|LSTMCell\(16, 32\)" 3
  say "own-model (a known finding reported as known, not failed):"
  show own-model "^(LSTM|GRU) " 40
  say "translation (every path ok, or not compared only where accepted):"
  show translation "^torch-" 8
  say "speed (record passes, clean compare passes, slowed forward fails):"
  show speed-clean "passed|failed"
  show speed-slowed "passed|failed"
  say "seed-report (predicted cuda-generic, observed a kernel, not 'error'):"
  show seed-report "^\| 1 \|"
  say "cell-report (two torch-cell rows, observed cuda-generic, a measured slowdown):"
  show cell-report "^\| [0-9]" 2
  [ -n "$DRY" ] || rm -rf "$DIR/work"
}

sub_workloads() {  # SET=thorough: the full grids; SELECT: -k for the suite; CROSSOVER=0: no CLI run
  local select=()
  [ -n "${SELECT:-}" ] && select=(-k "$SELECT")
  pytest_cmd
  if [ "${CROSSOVER:-1}" != 0 ]; then
    step crossover 240 "$PYTHON" -m pytest_lstmperf.cli crossover lstm input_size=64 hidden_size=256 num_layers=2 \
      seq_len=100 --device cuda --out "$DIR/crossover"
  fi
  step workloads 480 "${PYTEST[@]}" suites/test_workloads.py --device=cuda -q -rs \
    "${select[@]}" "--lstmperf-bench-set=${SET:-gate}" --lstmperf-report="$DIR/report" \
    --benchmark-json="$DIR/workloads.json"
  [ -n "$DRY" ] || sed -n '/lstmperf workloads/,/workload report written/p' "$DIR/workloads.log" | cut -c1-200
  show workloads "SKIPPED|FAILED|passed|failed|error" 12
}

sub_scaling() {  # NVLink multicast stays off (it can take a shared host's GPUs out of service)
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  step gpus 60 bash -c "date -u +%Y-%m-%dT%H:%M:%SZ; nvidia-smi -L; nvidia-smi topo -m; \"\$0\" -c \"import torch; \
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), \
'nccl', torch.cuda.nccl.version(), 'gpus', torch.cuda.device_count())\"" "$PYTHON"
  # BENCH_LIMIT bounds the benchmark (SIGTERM); 15 s later SIGKILL ends an elastic agent still waiting for ranks
  # shellcheck disable=SC2086
  step scalebench "${BENCH_LIMIT:-480}" "$PYTHON" -m pytest_lstmperf.workloads.scalebench --out "$DIR" ${BENCH_ARGS:-}
  if [ -n "${SUITE:-}" ]; then
    pytest_cmd
    step xdist "${XDIST_LIMIT:-150}" "${PYTEST[@]}" suites/test_benchmarks.py --device=cuda -n auto \
      --lstmperf-paths=torch-cudnn-fp32 -k test_inference --benchmark-json="$DIR/xdist.json"
    step scaling-suite "${SCALING_LIMIT:-420}" "${PYTEST[@]}" suites/test_scaling.py --device=cuda -v -rA \
      --lstmperf-report="$DIR/report"
    show xdist "pinned|passed|failed|error" 8
    show scaling-suite "PASSED|FAILED|SKIPPED|passed|failed" 12
  fi
  [ -n "$DRY" ] || { cat "$DIR/gpus.log"; [ -f "$DIR/summary.md" ] && cat "$DIR/summary.md"; }
  show scalebench "sizing|size used|scaling|micro-batches|failed|Error" 20
}

sub_same_outcome() {  # each tree runs its own plugin against its own committed baselines
  local before=${1:-${BEFORE:-}} side tree
  [ -n "$before" ] || { echo "same-outcome: name the tree to compare against (BEFORE)" >&2; exit 2; }
  before=$(realpath -m "$before")
  # DEVICE=cpu: the host's CPU, without a baseline to compare with (none is committed for it), the benchmarks
  # run once as tests (their kernel checks), under pytest-xdist (XDIST workers, default 14)
  local how="--device=cuda --benchmark-compare"
  [ "${DEVICE:-cuda}" = cpu ] && how="--device=cpu --benchmark-disable -n ${XDIST:-14}"
  for side in before after; do
    tree=$ROOT
    [ "$side" = before ] && tree=$before
    # shellcheck disable=SC2086  # $3: the run's options, split into words
    step "$side" "${RUN_S:-280}" bash -c 'cd "$1" && source scripts/gpu_env.sh && "$PYTHON" -m pytest $PLUGIN suites/ \
      $3 -p no:cacheprovider -rfEx --junitxml="$2"' _ "$tree" "$DIR/$side.xml" "$how"
    show "$side" "^lstmperf gate|speed gate|passed|failed" 3
  done
  step compare 60 "$PYTHON" scripts/compare_outcomes.py "$DIR/before.xml" "$DIR/after.xml"
  show compare "." 30
}

sub_ci_recipe() {
  # Each job's steps run as written in a fresh copy of this checkout (its files, tracked or not yet but not
  # ignored). What differs from a runner, and only that: pip runs offline (PIP_NO_INDEX=1) from the carried wheels
  # (build/ci-wheels/: setuptools, wheel, pytest-xdist, ruff, mypy and their dependencies; .whl/: Keras and its
  # dependencies), and `python3 -m venv .venv` makes the environment with --system-site-packages (a python3 shim
  # first on PATH), so the machine's CUDA builds of torch and JAX stand for the downloads. The update-baseline job
  # writes into its copy, never into this checkout. Writes versions.txt, <job>.log, junit-gate.xml,
  # lstmperf-report/, update-baseline/*.json and summary.md (what the jobs wrote to $GITHUB_STEP_SUMMARY).
  local real work job copy n name start rc status=0
  real=$(command -v python3)
  work=${WORK:-/tmp/ci-gpu-recipe}
  if [ -n "$DRY" ]; then
    for job in ${JOBS:-speed-gate update-baseline}; do
      echo "[$job] the steps of examples/ci/lstmperf.yml's $job job (tests/ci_recipe.py), each in a copy of the checkout:"
      "$real" tests/ci_recipe.py examples/ci/lstmperf.yml "$job" | grep '^# step:' | sed 's/^/  /'
    done
    return
  fi
  rm -rf "$work" && mkdir -p "$work/shim"
  export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
  export PIP_NO_INDEX=1 PIP_FIND_LINKS="$ROOT/build/ci-wheels $ROOT/.whl" PIP_NO_CACHE_DIR=1
  export GITHUB_STEP_SUMMARY="$DIR/summary.md" GITHUB_RUN_ID=local
  cat >"$work/shim/python3" <<SHIM
#!/usr/bin/env bash
if [ "\${1:-}" = -m ] && [ "\${2:-}" = venv ]; then
  shift 2
  "$real" -m venv --system-site-packages "\$@" || exit \$?
  # where the machine's python is itself a virtual environment, --system-site-packages reaches its base
  # interpreter only: its own site-packages (CUDA torch, JAX) go on the new environment's path too
  dir="\${@: -1}"
  site=\$("\$dir/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  "$real" -c "import site, sysconfig; print('\\n'.join(dict.fromkeys([*site.getsitepackages(), sysconfig.get_paths()['purelib']])))" > "\$site/machine-site.pth"
  # pip finds pytest installed there and writes no .venv/bin/pytest, which a runner's fresh install would have
  printf '#!/bin/sh\\nexec "\$(dirname "\$0")/python" -m pytest "\$@"\\n' > "\$dir/bin/pytest" && chmod +x "\$dir/bin/pytest"
  exit 0
fi
exec "$real" "\$@"
SHIM
  chmod +x "$work/shim/python3"
  {
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    "$real" -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
    "$real" -c "import jax; print('jax', jax.__version__, jax.default_backend())" 2>&1 | tail -1
    "$real" -m pip list 2>/dev/null | grep -i -E "^(jax|keras|pytest|nvidia-cudnn)"
  } | tee "$DIR/versions.txt"
  for job in ${JOBS:-speed-gate update-baseline}; do
    copy=$work/$job
    mkdir -p "$copy"
    if git rev-parse --git-dir >/dev/null 2>&1; then
      git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
        [ -f "$f" ] && mkdir -p "$copy/$(dirname "$f")" && cp -p "$f" "$copy/$f"
      done
    else # a copy of the working tree without .git: all of it but the carried and built folders
      tar --exclude=./build --exclude=./.whl --exclude=./.venv -cf - . | tar -xf - -C "$copy"
    fi
    "$real" tests/ci_recipe.py examples/ci/lstmperf.yml "$job" >"$work/$job.sh"
    echo "== $job (steps: $(grep -c '^# step:' "$work/$job.sh"))" | tee "$DIR/$job.log"
    # 'jax[cuda13]' pulls JAX's CUDA wheels, which a machine without network cannot fetch: there, and only there,
    # the machine's installed CUDA JAX stands for it (said in the log)
    if [ -n "${OFFLINE_JAX:-1}" ] && grep -q "'jax\[cuda13\]'" "$work/$job.sh"; then
      sed -i "s/'jax\[cuda13\]'/jax/" "$work/$job.sh"
      echo "== $job: 'jax[cuda13]' read as jax (the machine's CUDA build; no network to fetch its CUDA wheels)" >>"$DIR/$job.log"
    fi
    # the job's steps, each a script: the workflow's env, then the step's command
    "$real" - "$work/$job.sh" "$work/$job" >"$work/$job.names" <<'PY'
import re, sys
head, *steps = re.split(r"^# step: (.*)$", open(sys.argv[1]).read(), flags=re.M)
for i in range(0, len(steps), 2):
    with open(f"{sys.argv[2]}.step{i // 2}.sh", "w") as f:
        f.write(head + steps[i + 1])
    print(steps[i])
PY
    n=0
    while IFS= read -r name; do
      start=$(date +%s)
      (cd "$copy" && PATH="$work/shim:$PATH" timeout 1500 bash --noprofile --norc -eo pipefail "$work/$job.step$n.sh") \
        >>"$DIR/$job.log" 2>&1
      rc=$?
      echo "== $job / $name: exit $rc in $(($(date +%s) - start)) s" | tee -a "$DIR/$job.log"
      ORDER+=("$job/$name")
      RC[$job/$name]=$rc
      WALL[$job/$name]=$(($(date +%s) - start))
      [ $rc -ne 0 ] && { status=1; break; }
      n=$((n + 1))
    done <"$work/$job.names"
    grep -E "^(lstmperf: device|speed gate|upgrade:)|passed|failed|error" "$DIR/$job.log" | cut -c1-240 | tail -12
  done
  cp -r "$work/speed-gate/junit-gate.xml" "$work/speed-gate/lstmperf-report" "$DIR/" 2>/dev/null
  mkdir -p "$DIR/update-baseline" && cp "$work"/update-baseline/baselines/*.json "$DIR/update-baseline/" 2>/dev/null
  return $status
}

# --------------------------------------------------------------------------------------------------------- main
case $SUB in
  help | -h | --help) usage; exit 0 ;;
  env | gate | gate-trials | record | upgrade | numerics | tolerances | kernels | keras | models | workloads | \
    ci-recipe | scaling | same-outcome) ;;
  *) echo "unknown subcommand '$SUB'" >&2; usage >&2; exit 2 ;;
esac
setup
"sub_${SUB//-/_}" "$@"
finish
