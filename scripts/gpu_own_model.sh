#!/usr/bin/env bash
# GPU check of "guarding your own model", from the repository root on a CUDA machine: the examples' tests on
# --device=cuda (kernel marker per layer call, verify_model on every CUDA path, eligibility report), then
# verify_model's per-path table for the word-language model (LSTM and GRU; the known finding on
# torch-cuda-autocast-bf16 must be reported as known with its numbers checked against the fp16 bound, not
# failed), then the word-language example's speed test (@pytest.mark.lstmperf on pytest-benchmark's fixture):
# baseline recorded, a clean compare (must pass), a slowed forward planted (must fail), then a cell-loop model:
# its kernel claim cuda-generic and its report rows. Keras wheels in .whl/ are used when present (the Keras
# example is skipped, with the reason, without keras). About 2-3 minutes.
# Writes examples.log, own_model.log, own_model.json, speed.log, cells.log to $OUT; a summary table last.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-own-model-out}
mkdir -p "$OUT"
export KERAS_BACKEND=torch
source scripts/gpu_env.sh  # .whl/ wheels, PYTHONPATH, PLUGIN
declare -A RC
echo "== 1. examples on cuda"
timeout 300 $PYTHON -m pytest $PLUGIN examples --device=cuda -p no:cacheprovider -rA -q --benchmark-disable \
  2>&1 | tee "$OUT/examples.log" | tail -25
RC[examples]=${PIPESTATUS[0]}
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
                     "worst": worst[0], "error": worst[1], "mismatches": [m.message for m in o.mismatches],
                     "known": o.known, "bounds": o.bounds, "unchecked": o.unchecked})
    print(f"{rnn_type}: {len(outcomes)} paths in {time.perf_counter() - start:.1f}s")
json.dump(rows, open(sys.argv[1], "w"), indent=1, default=str)
for r in rows:
    for m in r["mismatches"][:4]:
        print(f"  {r['model']} {r['path']}: {m[:220]}")
    for k in r["known"][:2]:
        print(f"  {r['model']} {r['path']} known: {k[:220]}")
print(f"\n{'model':5} {'path':28} {'verdict':8} {'worst tensor':28} {'rel err':>9}  bounds; kernels")
for r in rows:
    verdict = "skip" if r["skipped"] else ("ok" if r["ok"] else "FAIL") + ("+known" if r["known"] else "")
    print(f"{r['model']:5} {r['path']:28} {verdict:8} {r['worst'][:28]:28} {r['error']:9.2e}  "
          f"{'; '.join(r['bounds'].values())}; {'; '.join(r['kernels'])}")
sys.exit(1 if any(not r["ok"] and not r["skipped"] for r in rows) else 0)
PY
RC[verify_model]=${PIPESTATUS[0]}

echo "== 3. speed test of the word-language example: record, clean compare, slowed forward"
SPEED=$(mktemp -d)
cp examples/word_language_model/*.py "$SPEED"/
speed() { (cd "$SPEED" && timeout 200 $PYTHON -m pytest $PLUGIN --device=cuda -p no:cacheprovider -q -k speed "$@"); }
speed --lstmperf-save-baseline 2>&1 | tee "$OUT/speed.log" | tail -4; RC[speed_record]=${PIPESTATUS[0]}
speed --benchmark-compare 2>&1 | tee -a "$OUT/speed.log" | tail -8; RC[speed_clean]=${PIPESTATUS[0]}
cat > "$SPEED/conftest.py" <<'CONF'
import wlm_model

original_forward = wlm_model.RNNModel.forward


def slowed_forward(self, input, hidden):
    original_forward(self, input, hidden)  # a stray extra forward pass, its result thrown away
    return original_forward(self, input, hidden)


wlm_model.RNNModel.forward = slowed_forward
CONF
speed --benchmark-compare 2>&1 | tee -a "$OUT/speed.log" | tail -8; RC[speed_slowed]=${PIPESTATUS[0]}

echo "== 4. a cell-loop model: kernel claim cuda-generic, report rows"
timeout 120 $PYTHON - <<'PY' 2>&1 | tee "$OUT/cells.log"
import sys
import torch
import pytest_lstmperf
from pytest_lstmperf import falls_back, report

cells = torch.nn.ModuleList([torch.nn.LSTMCell(1, 51), torch.nn.LSTMCell(51, 51)]).cuda()


def forward(x):
    h = c = h2 = c2 = torch.zeros(x.shape[0], 51, device=x.device)
    for x_t in x.split(1, dim=1):
        h, c = cells[0](x_t, (h, c))
        h2, c2 = cells[1](h, (h2, c2))
    return h2


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.cells = cells

    def forward(self, x):
        return forward(x)


x = torch.randn(8, 20, device="cuda")
with pytest_lstmperf.observe() as seen:
    forward(x).sum().backward()
families = sorted({f"{t.phase} {t.family}/{t.precision}" for t in seen.all_traces()})
print("observed:", families)
rows = report(Model(), x, device="cuda")
for row in rows:
    print(row.config, row.verdict.kernel, "falls back" if falls_back(row) else "eligible")
ok = families and all("cuda-generic" in f for f in families) and all(falls_back(r) for r in rows)
sys.exit(0 if ok else 1)
PY
RC[cells]=${PIPESTATUS[0]}

echo
echo "== summary (expected: every rc 0 except speed_slowed, which must be 1)"
printf '%-14s %s\n' step rc
for step in examples verify_model speed_record speed_clean speed_slowed cells; do
  printf '%-14s %s\n' "$step" "${RC[$step]:-?}"
done
