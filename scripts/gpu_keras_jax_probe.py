"""Keras 3 on JAX on a GPU: what the suites do not ask directly (run by scripts/gpu_keras_jax.sh).

Run with KERAS_BACKEND=jax on a machine whose JAX has a GPU backend. For a Keras LSTM and GRU it compiles the
jitted forward and prints what XLA built (custom-call targets, the dots' precision config, while loops), and
runs three behaviours the source suggests but no CPU can show:

* ``go_backwards``: the cuDNN LSTM (``backend/jax/rnn.py`` ``lstm``) flips the input, then flips the outputs
  back, where the generic loop returns them in processing order: do the two agree?
* ``mixed_float16``: ``jax.experimental.rnn``'s cuDNN lowering knows float32/float64 only: does a jitted
  mixed-precision LSTM compile, and what runs?
* a layer placed on the CPU (``keras.device("cpu:0")``) while JAX's default backend is the GPU: Keras's cuDNN
  test asks for the default backend, not the arrays' device.

Writes the facts as JSON to argv[1] and prints one line per probe.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import traceback

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax
import keras
import numpy as np

from pytest_lstmperf.observation.jax_trace import hlo_trace

GPU = jax.default_backend() == "gpu"
FACTS: dict = {"jax": jax.__version__, "keras": keras.__version__, "default_backend": jax.default_backend()}
FACTS["devices"] = [f"{d.platform}:{getattr(d, 'device_kind', '')}:cc{getattr(d, 'compute_capability', '')}"
                    for d in jax.devices()]  # fmt: skip


def _layer(cell: str, **kw):
    cls = keras.layers.LSTM if cell == "lstm" else keras.layers.GRU
    layer = cls(64, return_sequences=True, return_state=True, **kw)
    layer.build((8, 20, 32))
    return layer


def _forward(layer, x):
    variables = layer.trainable_variables

    def call(params, x):
        with keras.StatelessScope(state_mapping=list(zip(variables, params, strict=True))):
            return layer(x)[0]

    params = [v.value for v in variables]
    return jax.jit(call), params


def _hlo_facts(text: str) -> dict:
    targets = sorted(set(re.findall(r'custom_call_target="([^"]+)"', text)))
    configs = sorted(set(re.findall(r'"precision_config":\{[^}]*\}', text)))[:3]
    algos = sorted(set(re.findall(r'"algorithm":"[A-Z0-9_]+"', text)))[:4]
    highest = len(re.findall(r"operand_precision=\{highest", text))
    return {"custom_calls": targets, "gemm_precision": configs, "algorithms": algos, "highest_dots": highest,
            "while": len(re.findall(r"\swhile\(", text)), "dots": len(re.findall(r"\sdot\(", text))}  # fmt: skip


def probe(name: str, fn) -> None:
    start = time.perf_counter()
    try:
        FACTS[name] = fn()
        status = "ok"
    except Exception as exc:  # a probe's error is its finding
        FACTS[name] = {"error": f"{type(exc).__name__}: {str(exc)[:400]}", "where": traceback.format_exc()[-600:]}
        status = "error"
    print(f"{name:28} {status:5} {time.perf_counter() - start:5.1f}s  {json.dumps(FACTS[name], default=str)[:400]}")


def kernels() -> dict:
    x = np.random.default_rng(0).standard_normal((8, 20, 32)).astype("float32")
    out = {}
    for cell in ("lstm", "gru"):
        for use_cudnn in ("auto", False):
            fn, params = _forward(_layer(cell, use_cudnn=use_cudnn), x)
            text = fn.lower(params, x).compile().as_text()
            trace = hlo_trace(text, tf32_capable=GPU)
            out[f"{cell} use_cudnn={use_cudnn}"] = {"family": f"{trace.family}/{trace.precision}",
                                                    **_hlo_facts(text)}  # fmt: skip
    return out


def go_backwards() -> dict:
    x = np.random.default_rng(1).standard_normal((4, 12, 32)).astype("float32")
    cudnn = _layer("lstm", go_backwards=True)
    generic = _layer("lstm", go_backwards=True, use_cudnn=False)
    generic.set_weights(cudnn.get_weights())
    a, b = (np.asarray(layer(x)[0]) for layer in (cudnn, generic))
    return {"max_abs_diff": float(np.abs(a - b).max()),
            "max_abs_diff_time_flipped": float(np.abs(a[:, ::-1] - b).max()),
            "last_output_diff": float(np.abs(a[:, -1] - b[:, -1]).max())}  # fmt: skip


def mixed_float16() -> dict:
    keras.mixed_precision.set_dtype_policy("mixed_float16")
    try:
        x = np.random.default_rng(2).standard_normal((8, 20, 32)).astype("float16")
        result = {}
        for cell in ("lstm", "gru"):
            layer = _layer(cell)
            fn, params = _forward(layer, x)
            try:
                text = fn.lower(params, x).compile().as_text()
                trace = hlo_trace(text, tf32_capable=GPU)
                value = np.asarray(fn(params, x))
                result[cell] = {"family": f"{trace.family}/{trace.precision}", "dtype": str(value.dtype),
                                "finite": bool(np.isfinite(value).all()), **_hlo_facts(text)}  # fmt: skip
            except Exception as exc:
                result[cell] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            try:
                eager = layer(x)[0]
                result[cell]["eager"] = str(np.asarray(eager).dtype)
            except Exception as exc:
                result[cell]["eager"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        return result
    finally:
        keras.mixed_precision.set_dtype_policy("float32")


def cpu_placed() -> dict:
    x = np.random.default_rng(3).standard_normal((4, 12, 32)).astype("float32")
    cpu = jax.devices("cpu")[0]
    with keras.device("cpu:0"):
        layer = _layer("lstm")
        fn, params = _forward(layer, x)
        args = jax.device_put((params, x), cpu)
        text = fn.lower(*args).compile().as_text()
        value = np.asarray(fn(*args))
    trace = hlo_trace(text)
    return {"family": f"{trace.family}/{trace.precision}", "finite": bool(np.isfinite(value).all()),
            **_hlo_facts(text)}  # fmt: skip


if __name__ == "__main__":
    print(f"jax {FACTS['jax']} keras {FACTS['keras']} default backend {FACTS['default_backend']}: {FACTS['devices']}")
    for name, fn in (("kernels", kernels), ("go_backwards", go_backwards), ("mixed_float16", mixed_float16),
                     ("cpu_placed_on_gpu_machine", cpu_placed)):  # fmt: skip
        probe(name, fn)
    with open(sys.argv[1] if len(sys.argv) > 1 else "keras_jax_probe.json", "w") as handle:
        json.dump(FACTS, handle, indent=1, default=str)
