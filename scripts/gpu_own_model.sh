#!/usr/bin/env bash
# GPU check of "guarding your own model", from the repository root on a CUDA machine: the examples' tests on
# --device=cuda (kernel marker per layer call, verify_model on every CUDA path, eligibility report), then
# verify_model's per-path table for the word-language model (LSTM and GRU). Keras wheels in .whl/ are used
# when present (the Keras example is skipped, with the reason, without keras). About 1-2 minutes.
# Writes examples.log, own_model.log and own_model.json to $OUT.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-own-model-out}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 KERAS_BACKEND=torch
if ls .whl/*.whl >/dev/null 2>&1; then
  $PYTHON -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PLUGIN="-p pytest_lstmperf.plugin"
$PYTHON -c "import importlib.metadata as m; m.distribution('pytest-lstmperf')" 2>/dev/null && PLUGIN=""
echo "== 1. examples on cuda"
timeout 300 $PYTHON -m pytest $PLUGIN examples --device=cuda -p no:cacheprovider -rA -q --benchmark-disable \
  2>&1 | tee "$OUT/examples.log" | tail -25
echo "== 2. verify_model on every CUDA path"
timeout 240 $PYTHON - "$OUT/own_model.json" <<'PY' 2>&1 | tee "$OUT/own_model.log"
import json, sys, time
sys.path.insert(0, "examples/word_language_model")
import torch
from wlm_model import RNNModel
from pytest_lstmperf import verify_model
from pytest_lstmperf.numerics.tolerance import tolerance

rows = []
for rnn_type in ("LSTM", "GRU"):
    torch.manual_seed(0)
    model = RNNModel(rnn_type, 1000, 64, 256, 2, dropout=0.2).cuda()
    tokens = torch.randint(0, 1000, (35, 16), device="cuda")
    start = time.perf_counter()
    outcomes = verify_model(model, (tokens, model.init_hidden(16)), device="cuda", raise_on_failure=False)
    for o in outcomes:
        kernels = sorted({f"{t.phase[:3]} {t.family}/{t.precision}" for t in o.traces})
        worst = max(o.errors.items(), key=lambda kv: kv[1]) if o.errors else ("-", float("nan"))
        rows.append({"model": rnn_type, "path": o.path, "ok": o.ok, "skipped": o.skipped, "kernels": kernels,
                     "worst": worst[0], "error": worst[1], "mismatches": [m.message for m in o.mismatches]})
    print(f"{rnn_type}: {len(outcomes)} paths in {time.perf_counter() - start:.1f}s")
json.dump(rows, open(sys.argv[1], "w"), indent=1, default=str)
for r in rows:
    for m in r["mismatches"][:4]:
        print(f"  {r['model']} {r['path']}: {m[:220]}")
print(f"\n{'model':5} {'path':28} {'verdict':8} {'worst tensor':28} {'rel err':>9}  kernels")
for r in rows:
    verdict = "skip" if r["skipped"] else ("ok" if r["ok"] else "FAIL")
    print(f"{r['model']:5} {r['path']:28} {verdict:8} {r['worst'][:28]:28} {r['error']:9.2e}  {'; '.join(r['kernels'])}")
PY
