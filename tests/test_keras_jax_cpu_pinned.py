"""Keras on JAX, ``--device=cpu`` on a GPU machine: with a CUDA build of JAX, Keras's cuDNN test
(``_is_gpu_available``: JAX's *default* backend is ``gpu``) sent the keras-jax-cpu run's LSTM to the cuDNN
primitive, which has no CPU lowering (``NotImplementedError: MLIR translation rule for primitive 'rnn_fwd' not
found for platform cpu``). The CPU run is pinned to the CPU. This machine's JAX has no GPU: the GPU machine's
answer is faked (``_is_gpu_available`` says yes) and ``jax.experimental.rnn.lstm`` is a recorder that fails
as the cuDNN primitive does there; the run must neither call it nor fail, and leave the test as it found it."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import importlib, json, sys
import keras

rnn = importlib.import_module("keras.src.backend.jax.rnn")
jax_rnn = importlib.import_module("jax.experimental.rnn")
attempts = []

def gpu_primitive(*args, **kwargs):  # what the cuDNN primitive does on CPU arrays on the GPU machine
    attempts.append(1)
    raise RuntimeError("MLIR translation rule for primitive 'rnn_fwd' not found for platform cpu")

gpu_here = lambda: True  # a CUDA build of JAX on a GPU machine: the default backend is "gpu"
rnn._is_gpu_available, jax_rnn.lstm = gpu_here, gpu_primitive

from pytest_lstmperf.model.case import make_case
from pytest_lstmperf.model.keras_options import KerasOptions
from pytest_lstmperf.model.spec import LayerSpec
from pytest_lstmperf.paths.keras.runners import LocalKerasRun

out = {}
for cell in ("lstm", "gru"):
    spec = LayerSpec(cell=cell, input_size=3, hidden_size=4, batch=2, seq_len=5)
    attempts.clear()
    try:
        run = LocalKerasRun(KerasOptions(backend="jax"), make_case(spec), "cpu")
        result = run.run()
        run.train_step()
        families = [result.forward_trace.family, result.backward_trace.family]
        out[cell] = {"ok": True, "families": families, "attempts": len(attempts)}
    except Exception as exc:
        out[cell] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:400], "attempts": len(attempts)}
out["restored"] = rnn._is_gpu_available is gpu_here
print("RESULT " + json.dumps(out))
"""


@pytest.mark.skipif(
    importlib.util.find_spec("jax") is None or importlib.util.find_spec("keras") is None,
    reason="JAX or keras is not installed (pip install 'pytest-lstmperf[jax]')",
)
def test_keras_jax_cpu_run_never_reaches_the_cudnn_primitive_where_jax_defaults_to_a_gpu(tmp_path: Path) -> None:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)  # keep where keras is
    env = {**os.environ, "KERAS_BACKEND": "jax", "PYTHONPATH": path, "JAX_PLATFORMS": "cpu"}
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env,
                            cwd=tmp_path, timeout=300)  # fmt: skip
    line = next((x for x in result.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, result.stderr[-3000:]
    out = json.loads(line[len("RESULT ") :])
    for cell in ("lstm", "gru"):
        assert out[cell]["ok"], out[cell]
        assert out[cell]["attempts"] == 0  # the cuDNN primitive was never called
        assert out[cell]["families"] == ["jax-generic", "jax-generic"]  # XLA's loop on the CPU, both passes
    assert out["restored"]  # Keras's own test is put back (the cuDNN decision probe replaces it for its block)
