"""Keras 3 on the torch backend, on CUDA: explainer prediction vs observed kernel, equivalence, training-call time.

Run from the repository root on a GPU machine with torch + cuDNN and keras 3 (TensorFlow not needed):

    python scripts/gpu_keras_torch.py OUT_DIR [--device cuda] [--budget-s 100] [--block-tensorflow]

For every configuration (LSTM and GRU: defaults, use_cudnn True/False, implementation 1/2, relu,
hard_sigmoid, recurrent_dropout, unroll, use_bias=False, GRU reset_after=False, right- and left-padded masks,
go_backwards, return_sequences=False, bidirectional with and without a mask, cuDNN disabled in torch, and
use_cudnn=True with a blocker) it prints one row:

    config | predicted kernel/precision | observed forward/backward | match | max rel. error vs float64 | ms/train call

and writes ``OUT_DIR/gpu_keras_torch.json`` (rows + environment). Equivalence uses a small case against the
float64 reference (kernel-only configs, whose math differs on purpose, show ``n/a``); timing uses the shape of
the reference figures (LSTM/GRU(128), input 64, B=32, T=100) with synchronised calls measured in-process.
``--device cpu`` runs the same table on a CPU (all predictions ``cpu-native``) to check the script itself.
Exit status 1 when a prediction differs from the observation.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ["KERAS_BACKEND"] = "torch"  # before anything imports keras
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

QUICK = {"input_size": 16, "hidden_size": 32, "batch": 4, "seq_len": 12}
TIMED = {"input_size": 64, "hidden_size": 128, "batch": 32, "seq_len": 100}
LENGTHS_QUICK = (12, 9, 5, 2)


def configurations() -> list[tuple[str, dict, dict, dict]]:
    """(name, spec changes, KerasOptions changes, context) per cell-independent configuration."""
    packed = {"length_mode": "packed"}
    return [
        ("defaults", {}, {}, {}),
        ("use_cudnn=True", {}, {"use_cudnn": True}, {}),
        ("use_cudnn=False", {}, {"use_cudnn": False}, {}),
        ("use_cudnn=False,impl=1", {}, {"use_cudnn": False, "implementation": 1}, {}),
        ("activation=relu", {}, {"activation": "relu"}, {}),
        ("recurrent_activation=hard_sigmoid", {}, {"recurrent_activation": "hard_sigmoid"}, {}),
        ("recurrent_dropout=0.1", {}, {"recurrent_dropout": 0.1}, {}),
        ("unroll=True", {}, {"unroll": True}, {}),
        ("use_bias=False", {"bias": False}, {}, {}),
        ("reset_after=False", {"reset_after": False}, {}, {"gru_only": True}),
        ("mask right-padded", packed, {}, {}),
        ("mask left-padded", packed, {"mask": "left"}, {}),
        ("go_backwards=True", {}, {"go_backwards": True}, {}),
        ("return_sequences=False", {}, {"return_sequences": False}, {}),
        ("bidirectional", {"bidirectional": True}, {}, {}),
        ("bidirectional + mask", {"bidirectional": True, **packed}, {}, {}),
        ("torch cudnn.enabled=False", {}, {}, {"cudnn_enabled": False}),
        ("use_cudnn=True + relu", {}, {"use_cudnn": True, "activation": "relu"}, {}),
        ("use_cudnn=True + mask", packed, {"use_cudnn": True}, {}),
    ]


def rel_error(a, b) -> float:
    import numpy as np

    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--budget-s", type=float, default=100.0, help="stop timing (not checking) past this")
    parser.add_argument("--block-tensorflow", action="store_true", help="fail any import of tensorflow")
    args = parser.parse_args()
    if args.block_tensorflow:
        sys.modules["tensorflow"] = None  # type: ignore[assignment]

    import keras
    import numpy as np
    import torch

    from pytest_lstmperf.model.case import make_case
    from pytest_lstmperf.model.reference import run_reference
    from pytest_lstmperf.model.spec import LayerSpec
    from pytest_lstmperf.observation.explain import context_for, explain
    from pytest_lstmperf.paths.keras.layer import KerasOptions
    from pytest_lstmperf.paths.keras.runners import LocalKerasRun

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device visible to torch (run on a GPU machine or pass --device cpu)", file=sys.stderr)
        return 2
    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "keras": keras.__version__,
        "keras_backend": keras.backend.backend(),
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else platform.processor(),
        "tensorflow_loaded": bool(sys.modules.get("tensorflow")),
    }
    capability = torch.cuda.get_device_capability(0) if args.device == "cuda" else None
    print(json.dumps(env))
    started = time.perf_counter()
    rows, mismatches = [], 0
    header = f"{'config':<46} | {'predicted':<18} | {'observed fwd/bwd':<30} | match | {'rel.err':>8} | ms/train"
    print(header)
    print("-" * len(header))
    for cell in ("lstm", "gru"):
        for name, spec_changes, option_changes, ctx in configurations():
            if ctx.get("gru_only") and cell != "gru":
                continue
            label = f"{cell} {name}"
            row: dict = {"config": label, "cell": cell, "spec": spec_changes, "options": option_changes}
            options = KerasOptions(backend="torch", **option_changes)
            saved_cudnn = torch.backends.cudnn.enabled
            torch.backends.cudnn.enabled = ctx.get("cudnn_enabled", saved_cudnn)
            try:
                lengths = {"lengths": LENGTHS_QUICK} if spec_changes.get("length_mode") == "packed" else {}
                spec = LayerSpec(cell=cell, **QUICK, **{**spec_changes, **lengths})
                context = context_for(args.device, capability=capability, cudnn_version=env["cudnn"])
                verdict = explain(spec, "keras-torch", args.device, options, context=context)
                row["predicted"] = f"{verdict.kernel}/{verdict.precision}"
                row["predicted_raises"] = verdict.raises
                row["reasons"] = [r.change for r in verdict.reasons]
                kernel_only = options.activation != "tanh" or options.recurrent_activation != "sigmoid"
                kernel_only = kernel_only or not options.return_sequences
                case = make_case(spec)
                try:
                    result = LocalKerasRun(options, case, args.device).run()
                except Exception as exc:
                    row["observed"] = f"raises {type(exc).__name__}"
                    row["error"] = str(exc).splitlines()[0][:200]
                    row["match"] = bool(verdict.raises) and type(exc).__name__ in verdict.raises
                else:
                    fwd, bwd = result.forward_trace, result.backward_trace
                    row["observed"] = f"{fwd.family}/{fwd.precision}" + (f" | {bwd.family}" if bwd else "")
                    row["observed_ops"] = list(fwd.ops[:8])
                    row["observed_kernels"] = list(fwd.kernels[:6])
                    row["match"] = (
                        verdict.raises is None
                        and fwd.family == verdict.kernel
                        and (bwd is None or bwd.family == verdict.kernel)
                    )
                    row["precision_match"] = fwd.precision == verdict.precision
                    if not kernel_only:
                        ref = run_reference(case)
                        errors = [rel_error(result.output, ref.output), rel_error(result.h_n, ref.h_n)]
                        if ref.c_n is not None:
                            errors.append(rel_error(result.c_n, ref.c_n))
                        errors += [rel_error(result.grads[k], ref.grads[k]) for k in ref.grads]
                        row["rel_error"] = max(errors)
                    if time.perf_counter() - started < args.budget_s:
                        timed_lengths = {}
                        if spec_changes.get("length_mode") == "packed":
                            timed_lengths = {"lengths": tuple(int(x) for x in np.linspace(100, 40, 32))}
                        big = LayerSpec(cell=cell, **TIMED, **{**spec_changes, **timed_lengths})
                        timer = LocalKerasRun(options.replace(call_training=True), make_case(big), args.device)
                        first = timer.time("train_step", 1, warmup=1)[0]
                        repeats = max(3, min(30, int(0.4 / max(first, 1e-4))))
                        row["ms_per_train_call"] = 1e3 * statistics.median(timer.time("train_step", repeats, 0))
            except Exception as exc:
                row.setdefault("observed", "script error")
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                row["match"] = False
            finally:
                torch.backends.cudnn.enabled = saved_cudnn
            mismatches += not row.get("match")
            err = row.get("rel_error")
            ms = row.get("ms_per_train_call")
            print(
                f"{label:<46} | {row.get('predicted', '?'):<18} | {row.get('observed', '?'):<30} | "
                f"{'yes' if row.get('match') else 'NO':<5} | {f'{err:.1e}' if err is not None else 'n/a':>8} | "
                f"{f'{ms:.2f}' if ms is not None else '-'}" + (f"  [{row['error']}]" if row.get("error") else ""),
                flush=True,
            )
            rows.append(row)
    env["wall_s"] = round(time.perf_counter() - started, 1)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / "gpu_keras_torch.json"
    out.write_text(json.dumps({"environment": env, "rows": rows}, indent=2, default=str))
    print(f"{len(rows)} configurations, {mismatches} prediction mismatches, {env['wall_s']} s; wrote {out}")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
