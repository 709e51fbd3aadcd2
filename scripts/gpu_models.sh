#!/usr/bin/env bash
# Users' own models on a CUDA machine (torch + cuDNN, keras, no TensorFlow needed): the kernel marker on a
# test that builds an nn.LSTM and moves it to CUDA inside the test; verify_model on the translation
# tutorial's model (its decoder's first input made on the module-level CUDA device: the float64 reference
# runs on the GPU); seed 000's Keras model (a ReLU layer object as activation) through `lstmperf report --run`
# on the torch backend; the examples on CUDA. Logs and JSON under "$OUT/models/"; a summary is printed last.
# Usage: OUT=dir bash scripts/gpu_models.sh
set -u
OUT="${OUT:-out}"
PY="${PYTHON:-python}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$OUT/models"
DIR="$(cd "$OUT/models" && pwd)"  # absolute: the steps below run from other folders
export DIR
cd "$ROOT"
# the checkout on PYTHONPATH (the plugin and the CLI import from it, from any folder) and the pytest arguments that
# load the plugin where no installed distribution registers it (scripts/gpu_env.sh)
PYTHON="$PY" source scripts/gpu_env.sh
if ls .whl/keras-*.whl >/dev/null 2>&1; then "$PY" -m pip install -q --no-deps .whl/keras-*.whl >"$DIR/pip.log" 2>&1; fi
export KERAS_BACKEND=torch
declare -A RC

step() {  # step NAME COMMAND...: runs it, logs to $DIR/NAME.log, records its exit code, never stops the script
    local name="$1"; shift
    echo "== $name: $*" >&2
    "$@" >"$DIR/$name.log" 2>&1
    RC[$name]=$?
    echo "== $name: exit ${RC[$name]}" >&2
}

"$PY" - >"$DIR/versions.json" 2>&1 <<'PYEOF'
import json, torch
info = {"torch": torch.__version__, "cuda": torch.cuda.is_available()}
if torch.cuda.is_available():
    info.update(gpu=torch.cuda.get_device_name(0), cudnn=torch.backends.cudnn.version())
print(json.dumps(info))
PYEOF

# 1. the kernel marker: a module built and moved to CUDA inside the marked test is not a layer call
MARKER_DIR="$(mktemp -d)"
cat >"$MARKER_DIR/test_build_inside.py" <<'PYEOF'
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
PYEOF
step marker "$PY" -m pytest $PLUGIN -p no:cacheprovider -q -rf --device=cuda "$MARKER_DIR" --junitxml="$DIR/marker.xml"

# 2. verify_model on the translation model, on CUDA (the reference runs where the model made its tensors)
step verify_translation "$PY" - <<'PYEOF'
import json, os, sys, warnings
sys.path.insert(0, "examples/seq2seq_translation")
import torch
from seq2seq_model import AttnDecoderRNN, EncoderRNN, Translator, MAX_LENGTH
import pytest_lstmperf

torch.manual_seed(0)
model = Translator(EncoderRNN(30, 16), AttnDecoderRNN(16, 25)).to("cuda")
g = torch.Generator().manual_seed(1)
pair = (torch.randint(1, 30, (3, 6), generator=g).cuda(), torch.randint(1, 25, (3, MAX_LENGTH), generator=g).cuda())
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    outcomes = pytest_lstmperf.verify_model(model, pair, device="cuda", raise_on_failure=False)
rows = [{"path": o.path, "ok": o.ok, "skipped": o.skipped, "mismatches": [str(m) for m in o.mismatches],
         "not_compared": o.not_compared, "known": o.known, "bounds": o.bounds,
         "max_error": max(o.errors.values()) if o.errors else None} for o in outcomes]
json.dump({"outcomes": rows, "warnings": [str(w.message) for w in caught]}, open(os.environ["DIR"] + "/verify_translation.json", "w"), indent=2, default=str)
for r in rows:
    print(r["path"], "ok" if r["ok"] else "NOT OK", r["skipped"] or "", r["mismatches"][:2], "not compared:", len(r["not_compared"]))
sys.exit(0 if all(r["ok"] or r["skipped"] or (not r["mismatches"] and r["not_compared"]) for r in rows) else 1)
PYEOF

# 3. seed 000's Keras model through report --run on the GPU (torch backend)
SEED_DIR="$(mktemp -d)"
cat >"$SEED_DIR/seedmodel.py" <<'PYEOF'
import keras

def model():
    inputs = keras.Input((30, 16), batch_size=1)
    x = keras.layers.LSTM(64, activation=keras.layers.ReLU(negative_slope=0.05))(inputs)
    return keras.Model(inputs, keras.layers.Dense(1)(x))
PYEOF
step seed_report bash -c "cd '$SEED_DIR' && '$PY' -c 'import sys; from pytest_lstmperf.cli import main; sys.exit(main())' report seedmodel:model --device cuda --run --json '$DIR/seed_report.json'"

# 4. the cell loop measured by report --run on the GPU
step cell_report bash -c "cd examples/time_sequence_prediction && '$PY' -c 'import sys; from pytest_lstmperf.cli import main; sys.exit(main())' report sine_model:Sequence --device cuda --run --batch 3 --seq-len 100 --json '$DIR/cell_report.json'"

# 5. the examples on CUDA (TensorFlow absent: the Keras example runs on the torch backend)
step examples "$PY" -m pytest $PLUGIN -p no:cacheprovider -q -rfs examples --device=cuda --junitxml="$DIR/examples.xml"

echo
echo "== summary (logs under $DIR)"
cat "$DIR/versions.json"
for name in marker verify_translation seed_report cell_report examples; do
    echo "$name: exit ${RC[$name]:-not run}"
done
show() {  # show LOG PATTERN: the matching lines, or the log's last lines where none match
    grep -E "$2" "$DIR/$1.log" 2>/dev/null | tail -${3:-1} | sed 's/^/  /' | grep . || tail -3 "$DIR/$1.log" | sed 's/^/  (no match) /'
}
echo "marker (expect 1 passed, 1 failed: the planted cell loop fails cudnn; no 'outside any recurrent layer'):"
show marker "passed|failed"
show marker "outside any recurrent layer|LSTMCell\(16, 32\)" 3
echo "verify_translation (expect every path ok, or not compared only where accepted; max error per path):"
show verify_translation "^torch-" 8
echo "seed_report (expect predicted cuda-generic, observed a kernel, not 'error'):"
show seed_report "^\| 1 \|"
echo "cell_report (expect two torch-cell rows, observed cuda-generic, a measured slowdown):"
show cell_report "^\| [0-9]" 2
show cell_report "^\[[0-9]\] measured" 2
echo "examples (expect all passed):"
show examples "passed|failed|error"
