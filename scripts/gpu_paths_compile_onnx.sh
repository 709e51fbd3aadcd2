#!/usr/bin/env bash
# GPU check of the torch.compile and ONNX Runtime paths, from the repository root on a CUDA machine:
#   1. kernel claims and equivalence on --device=cuda: torch-compile-cudnn (and its pair with torch-cudnn-fp32),
#      torch-compile-reduce-overhead, onnxruntime-cuda (reported unavailable where only the CPU onnxruntime
#      package is installed);
#   2. the same on --device=cpu for onnxruntime-cpu and torch-compile-cpu (this machine's torch/onnx versions);
#   3. the gate benchmarks of torch-cudnn-fp32, torch-compile-cudnn and torch-compile-reduce-overhead;
#   4. torch-compile-inductor-graphs (allow_rnn + reduce-overhead, slow to compile) checked on a small layer:
#      kernel, precision and numbers against the float64 reference, forward and backward; then overhead against
#      the raw device cost: per-call and device time of each path on the reference shape (2-layer LSTM I=64
#      H=256 T=100) at batch 1 and 64 (the inductor path at batch 1 only: it compiles 200 unrolled cells).
# About 4-6 minutes, at most 10 (each stage has its own time limit; 4. writes its rows as it goes). Writes to $OUT:
# kernels_equivalence_cuda.log, cpu_paths.log, benchmarks.log, bench.json, overhead.log, overhead.json.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-paths-compile-onnx-out}
mkdir -p "$OUT"
source scripts/gpu_env.sh  # .whl/ wheels, PYTHONPATH, PLUGIN
$PYTHON - <<'PY'
import importlib.metadata as m
for name in ("torch", "triton", "onnx", "onnxscript", "onnxruntime", "onnxruntime-gpu"):
    try:
        print(f"{name} {m.version(name)}")
    except m.PackageNotFoundError:
        print(f"{name} not installed")
PY
CUDA_PATHS=torch-compile-cudnn,torch-cudnn-fp32,torch-compile-reduce-overhead,onnxruntime-cuda
echo "== 1. kernels and equivalence on cuda ($CUDA_PATHS)"
timeout 150 $PYTHON -m pytest $PLUGIN suites/test_kernels.py suites/test_equivalence.py --device=cuda \
  --lstmperf-paths=$CUDA_PATHS --lstmperf-profile=ci -p no:cacheprovider -q -rfEsx \
  2>&1 | tee "$OUT/kernels_equivalence_cuda.log" | tail -30
echo "== 2. onnxruntime-cpu and torch-compile-cpu on this machine's CPU"
timeout 90 $PYTHON -m pytest $PLUGIN suites/test_kernels.py suites/test_equivalence.py --device=cpu \
  --lstmperf-paths=onnxruntime-cpu,torch-compile-cpu,torch-cpu-onednn -p no:cacheprovider -q -rfEsx \
  2>&1 | tee "$OUT/cpu_paths.log" | tail -14
echo "== 3. gate benchmarks on cuda"
timeout 120 $PYTHON -m pytest $PLUGIN suites/test_benchmarks.py --device=cuda -p no:cacheprovider -q \
  --lstmperf-paths=torch-cudnn-fp32,torch-compile-cudnn,torch-compile-reduce-overhead \
  --benchmark-json="$OUT/bench.json" 2>&1 | tee "$OUT/benchmarks.log" | grep -A40 "lstmperf speed" | tail -30
echo "== 4. overhead against the raw device cost"
timeout 230 $PYTHON - "$OUT/overhead.json" <<'PY' 2>&1 | tee "$OUT/overhead.log"
import json, signal, statistics, sys, time, traceback

from pytest_lstmperf import paths
from pytest_lstmperf.model.case import make_case
from pytest_lstmperf.device import resolve_device
from pytest_lstmperf.numerics.equivalence import verify_path
from pytest_lstmperf.speed.shapes import REFERENCE
from pytest_lstmperf.model.spec import LayerSpec

dev = resolve_device("cuda")
session = type("S", (), {"seed": 0, "device": dev})()
rows, out = [], sys.argv[1]
NAMES = ("torch-cudnn-fp32", "torch-compile-cudnn", "torch-compile-reduce-overhead", "torch-compile-inductor-graphs")


def alarm(seconds):
    def fire(*_):
        raise TimeoutError(f"over {seconds} s")
    signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)


def save(row):
    rows.append(row)
    json.dump(rows, open(out, "w"), indent=1, default=str)
    print({k: v for k, v in row.items() if k != "detail"}, flush=True)


# the inductor path against the float64 reference, forward and backward, on a small layer
small = LayerSpec(input_size=32, hidden_size=64, num_layers=1, batch=4, seq_len=10, initial_state=True)
try:
    alarm(80)
    started = time.perf_counter()
    errors = verify_path(paths.get("torch-compile-inductor-graphs"), small, session)
    worst = max(errors.items(), key=lambda kv: kv[1])
    save({"check": "inductor-graphs vs float64", "shape": small.short(), "ok": True, "worst": worst,
          "grads": sum(k.startswith("grad") for k in errors), "s": round(time.perf_counter() - started, 1)})
except BaseException as exc:
    save({"check": "inductor-graphs vs float64", "shape": small.short(), "ok": False, "error": str(exc)[:1500]})
finally:
    signal.alarm(0)

for spec in (REFERENCE.replace(batch=1, training=False), REFERENCE.replace(training=False)):
    for name in NAMES:
        if "inductor" in name and spec.batch != 1:
            continue  # compiling the decomposed 2-layer T=100 layer once is enough for this check
        path = paths.get(name)
        row = {"shape": spec.short(), "path": name}
        reason = path.available(dev)
        if reason:
            save({**row, "error": f"unavailable: {reason}"})
            continue
        try:
            alarm(100 if "inductor" in name else 40)
            started = time.perf_counter()
            run = path.prepare(make_case(spec, 0), dev)
            row["prepare_s"] = round(time.perf_counter() - started, 1)
            trace = run.trace_forward()
            row.update(kernel=f"{trace.family}/{trace.precision}", detail=trace.detail, kernels=list(trace.kernels[:4]))
            times = []
            for _ in range(40):
                t0 = time.perf_counter()
                run.forward()
                run.synchronize()
                times.append(time.perf_counter() - t0)
            row["per_call_ms"] = statistics.median(times[5:]) * 1e3
            if hasattr(run, "device_time"):
                dt = run.device_time("forward", 10)
            else:
                from pytest_lstmperf.speed import timing
                dt = timing.device_time(run.forward, dev.torch_device, 10)
            row["device_ms"] = None if dt.median is None else dt.median * 1e3
            row["device_method"] = dt.method
            save(row)
        except BaseException as exc:
            save({**row, "error": f"{type(exc).__name__}: {str(exc)[:600]}"})
            traceback.print_exc(limit=2)
        finally:
            signal.alarm(0)

print("\nsummary: overhead against the raw device cost (device time of eager cuDNN, one CUDA graph replay)")
raw = {r["shape"]: r.get("device_ms") for r in rows if r.get("path") == "torch-cudnn-fp32"}
print(f"{'shape':28} {'path':32} {'kernel':14} {'per call ms':>11} {'device ms':>9} {'x raw':>6}  note")
for r in rows:
    if "check" in r:
        verdict = "ok" if r["ok"] else "FAIL"
        print(f"{r['shape']:28} {'inductor-graphs vs float64':32} {verdict:14} {r.get('worst', r.get('error', ''))}")
        continue
    base = raw.get(r["shape"])
    ratio = f"{r['per_call_ms'] / base:6.1f}" if base and r.get("per_call_ms") else "     -"
    note = r.get("error", "") or (r.get("detail", "") or "")[:90]
    print(f"{r['shape']:28} {r['path']:32} {r.get('kernel', '-'):14} {r.get('per_call_ms', float('nan')):11.3f} "
          f"{(r.get('device_ms') or float('nan')):9.3f} {ratio}  {note}")
PY
echo "== summary"
grep -h -E "^lstmperf: path .* unavailable|passed|failed|FINDINGS" "$OUT/kernels_equivalence_cuda.log" "$OUT/cpu_paths.log" \
  "$OUT/benchmarks.log" | head -20
sed -n '/^summary:/,$p' "$OUT/overhead.log"
