"""A user's own Keras model on the JAX backend: the kernel marker observes each LSTM/GRU call from the HLO that
XLA compiles it to (eagerly called, or inside Keras's jitted ``predict``), and ``verify_model`` runs the model
against its float64 clone with JAX's 64-bit mode on. Planted faults fail: a claim of another kernel family, an
output error 4x the fp32 bound, a layer call that could not be observed, a model whose recurrent layers were
not seen."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from forked_pytest import runpytest_forked

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("keras") is None or importlib.util.find_spec("jax") is None,
    reason="keras and JAX are needed (pip install keras jax)",
)

ROOT = Path(__file__).resolve().parents[1]

#: ``keras.utils.set_random_seed`` imports TensorFlow where it is installed, to seed it as well (3-4 s of each
#: script on a 2-core machine); these scripts run Keras on JAX, so TensorFlow is marked as not importable
#: (the marker test keeps it: a TensorFlow imported inside an observed block is part of what it checks)
NO_TENSORFLOW = 'import sys\nsys.modules.setdefault("tensorflow", None)\n'


def _run_jax_script(script: str, what: str) -> dict:
    """Run ``script`` in a fresh interpreter with Keras on JAX, pinned to the CPU (Keras fixes its backend at
    its first import), and return the JSON it prints after ``RESULT ``; a script that does not get there fails
    the test with its output."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [sys.executable, "-c", NO_TENSORFLOW + script], env=env, capture_output=True, text=True, timeout=300
    )
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    if not lines:
        pytest.fail(f"the {what} script did not finish:\n{done.stdout}\n{done.stderr[-3000:]}")
    return json.loads(lines[0][len("RESULT ") :])


MARKER_TESTS = """
import os
os.environ["KERAS_BACKEND"] = "jax"
os.environ["JAX_PLATFORMS"] = "cpu"  # the CPU verdicts below, on a machine with a GPU too
import numpy as np
import keras
import pytest

x = np.random.default_rng(0).standard_normal((2, 5, 3)).astype("float32")

def model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((5, 3)), keras.layers.LSTM(4, return_sequences=True), keras.layers.GRU(3)])

def test_generic_on_cpu_eager_and_jitted(lstmperf_kernel):
    m = model()
    with lstmperf_kernel.expect(cpu="jax-generic", precision="fp32") as seen:
        m(x)
        m.predict(x, verbose=0)
    assert len(seen.layers) == 4 and len(seen.all_traces()) == 4

@pytest.mark.lstmperf_kernel(cpu="cudnn")
def test_cudnn_claim_fails_on_the_cpu():
    model()(x)

@pytest.mark.lstmperf_kernel("jax-generic", precision="bf16")
def test_precision_claim_fails():
    model()(x)

@pytest.mark.lstmperf_kernel("jax-generic")
def test_no_recurrent_layer():
    keras.layers.Dense(4)(x)
"""


def test_marker_on_keras_jax(pytester: pytest.Pytester) -> None:
    # TensorFlow stays importable here: keras.utils.set_random_seed imports it inside the first test's observed
    # block, a TensorFlow imported mid-test that must add no trace to a JAX model's
    pytester.makepyfile(test_keras_jax=MARKER_TESTS)
    result = runpytest_forked(pytester, "-p", "no:cacheprovider", "--strict-markers", "-rf", "--device=cpu")
    result.assert_outcomes(passed=1, failed=3)
    result.stdout.fnmatch_lines([
        "*lstmperf_kernel: expected cudnn; 2 of 2 recurrent layer calls did not:*",
        "*forward: jax-generic/fp32*keras LSTM 'lstm*'; Keras's lstm_cell loop*",
        "*forward: jax-generic/fp32*keras GRU 'gru*'; the JAX backend's fused scan*",
    ], consecutive=False)  # fmt: skip
    text = result.stdout.str()
    assert "expected jax-generic/bf16; 2 of 2 recurrent layer calls did not" in text
    assert "explainer:" in text and "JAX's default backend is not a GPU" in text
    assert "no LSTM/GRU layer ran" in text


VERIFY = """
import json, os
os.environ["KERAS_BACKEND"] = "jax"
import numpy as np, keras
import pytest_lstmperf
from pytest_lstmperf.numerics import verify_keras as vk, verify_model as vm
from pytest_lstmperf.observation import calls

keras.utils.set_random_seed(0)
inputs = keras.Input((7, 3))
y = keras.layers.LSTM(6, return_sequences=True)(inputs)
y = keras.layers.GRU(5)(y)
model = keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(y))
x = np.random.default_rng(0).standard_normal((2, 7, 3)).astype("float32")
out = {}

def summary(outcomes):
    (o,) = outcomes
    return {"path": o.path, "ok": o.ok, "errors": o.errors, "bounds": o.bounds,
            "traces": [t.describe() for t in o.traces], "mismatches": [m.message for m in o.mismatches]}

measured = []
sensitivity = vk._keras_sensitivity
vk._keras_sensitivity = lambda *args: measured.append(sensitivity(*args)) or measured[-1]
out["clean"] = summary(vm.verify_model(model, x, device="cpu", raise_on_failure=False))
# the faults below are in the path's run: the model's measured sensitivity is reused, not measured again
vk._keras_sensitivity = lambda *args: measured[0]

import jax
original = vk._keras_jax_run
def perturbed(m, data):
    run = original(m, data)
    if not jax.config.jax_enable_x64:  # the path's run, not the float64 reference
        run.outputs = [o * (1 + 2.6e-6) for o in run.outputs]
    return run
vk._keras_jax_run = perturbed
out["perturbed"] = summary(vm.verify_model(model, x, device="cpu", raise_on_failure=False))
vk._keras_jax_run = original

def unobservable(seen, layer, *args):
    if layer.name.startswith("gru"):
        raise_problem = f"could not trace keras GRU {layer.name!r} on JAX: planted"
        seen.problems.append(raise_problem)
        return
    return traced(seen, layer, *args)
traced = calls._jax_layer_traces
calls._jax_layer_traces = unobservable
out["unobserved"] = summary(vm.verify_model(model, x, device="cpu", raise_on_failure=False))
calls._jax_layer_traces = lambda *args: None
out["unseen"] = summary(vm.verify_model(model, x, device="cpu", raise_on_failure=False))
calls._jax_layer_traces = traced
print("RESULT " + json.dumps(out))
"""


def test_verify_model_on_keras_jax() -> None:
    out = _run_jax_script(VERIFY, "Keras-on-JAX")
    clean = out["clean"]
    assert clean["path"] == "keras-jax-cpu" and clean["ok"], clean
    assert [t.split(" (")[0] for t in clean["traces"]] == [
        "forward: jax-generic/fp32",
        "backward: jax-generic/fp32",
    ] * 2
    # a float64 reference that is float64: the fp32 run differs from it, within the bound
    bound = float(clean["bounds"]["forward"].split()[-1])  # "*/fp32 forward 6.68e-07"
    assert 0 < clean["errors"]["output 0"] < bound < 1e-6, clean["bounds"]
    assert all(0 < e < 1e-5 for name, e in clean["errors"].items() if name.startswith("grad")), clean["errors"]
    # an output error of 2.6e-06 (about 4x the bound) fails
    assert 3 * bound < 2.6e-6
    perturbed = out["perturbed"]
    assert not perturbed["ok"] and any(
        m.startswith("output 0: relative error") and "exceeds the */fp32 forward tolerance" in m
        for m in perturbed["mismatches"]
    ), perturbed["mismatches"]
    assert out["unobserved"]["mismatches"] == ["could not trace keras GRU 'gru' on JAX: planted"]
    assert out["unseen"]["mismatches"] == ["no recurrent layer ran in the model's forward pass"]


#: a plain LSTM over a batch-first sequence in JAX (the scripts' stand-ins for Keras's GPU-only cuDNN calls)
SCAN_LSTM = """
def scan_lstm(kernel, recurrent_kernel, bias, h, c, sequences, reverse=False):
    k, rk, b = (jnp.asarray(keras.ops.convert_to_tensor(v)) for v in (kernel, recurrent_kernel, bias))
    def step(carry, xt):
        h, c = carry
        i, f, g, o = jnp.split(xt @ k + h @ rk + b, 4, -1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), h
    (h, c), ys = jax.lax.scan(step, (h, c), jnp.swapaxes(sequences, 0, 1), reverse=reverse)
    return jnp.swapaxes(ys, 0, 1), h, c
"""

FUSED = (
    """
import json, os
os.environ["KERAS_BACKEND"] = "jax"
os.environ["JAX_PLATFORMS"] = "cpu"
import numpy as np, keras, jax, jax.numpy as jnp
from keras.src import backend
from pytest_lstmperf.observation import calls, jax_trace

"""
    + SCAN_LSTM
    + """
def fused(sequences, fh, fc, bh, bc, mask=None, fwd_kernel=None, fwd_recurrent_kernel=None, fwd_bias=None,
          bwd_kernel=None, bwd_recurrent_kernel=None, bwd_bias=None, return_sequences=False, **_):
    # stands in for Keras's cuDNN call (GPU only): both directions in one call, without either layer's loop
    def run(k, rk, b, h, c, reverse):
        ys, h, c = scan_lstm(k, rk, b, h, c, sequences, reverse)
        return (ys[:, 0] if reverse else ys[:, -1]), ys, [h, c]
    return (run(fwd_kernel, fwd_recurrent_kernel, fwd_bias, fh, fc, False),
            run(bwd_kernel, bwd_recurrent_kernel, bwd_bias, bh, bc, True))

backend.bidirectional_lstm = fused
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((5, 3)), keras.layers.Bidirectional(keras.layers.LSTM(4))])
x = np.random.default_rng(0).standard_normal((2, 5, 3)).astype("float32")
out = {}
with calls.observe(jax_backward=True) as seen:
    model(x)
out["clean"] = {"layers": len(seen.layers), "problems": seen.problems,
                "traces": [f"{t.phase}: {t.family}/{t.precision} ({t.detail})" for t in seen.all_traces()]}
calls._JAX_TRACES.clear()
def broken(*args, **kwargs):
    raise RuntimeError("planted")
jax_trace.compiled_trace = broken
with calls.observe() as seen:
    model(x)
out["broken"] = {"layers": len(seen.layers), "problems": seen.problems, "traces": len(seen.all_traces())}
print("RESULT " + json.dumps(out))
"""
)


def test_a_fused_bidirectional_call_on_jax_is_traced() -> None:
    """Keras 3.15 runs both directions of an eligible Bidirectional LSTM in one cuDNN call on a GPU, without
    either layer's ``inner_loop`` (on the H100 the kernel marker said "no LSTM/GRU layer ran"). The fused call is
    traced like a layer call: here a stand-in for the GPU-only cuDNN call, so it runs on the CPU; a fused call
    that cannot be traced is a problem, not a pass."""
    out = _run_jax_script(FUSED, "fused-call")
    clean = out["clean"]
    assert clean["layers"] == 2 and clean["problems"] == [], clean
    assert [t.split(" (")[0] for t in clean["traces"]] == ["forward: jax-generic/fp32", "backward: jax-generic/fp32"]
    assert all("keras Bidirectional 'bidirectional' (fused)" in t for t in clean["traces"]), clean
    broken = out["broken"]
    assert broken["traces"] == 0 and broken["problems"] == [
        "could not trace keras Bidirectional 'bidirectional' (fused) on JAX: RuntimeError: planted"
    ], broken


SWITCH = (
    """
import json, os
os.environ["KERAS_BACKEND"] = "jax"
os.environ["JAX_PLATFORMS"] = "cpu"
import numpy as np, keras, jax, jax.numpy as jnp
from keras.src import backend
from pytest_lstmperf.observation import calls
from pytest_lstmperf.numerics import verify_keras as vk

"""
    + SCAN_LSTM
    + """
def fast(inputs, h0, c0, mask, kernel=None, recurrent_kernel=None, bias=None, return_sequences=False, **_):
    # stands in for the cuDNN call Keras makes where use_cudnn allows it (GPU only): here it doubles the
    # outputs, so that which computation ran shows in the numbers
    ys, h, c = scan_lstm(kernel, recurrent_kernel, bias, h0, c0, inputs)
    ys = 2 * ys
    return ys[:, -1], (ys if return_sequences else ys[:, -1:]), [h, c]

backend.lstm = fast
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((5, 3)), keras.layers.LSTM(4)])
x = np.random.default_rng(0).standard_normal((2, 5, 3)).astype("float32")
loop = vk._keras_variant(model, use_cudnn=False)
as_built, looped = vk._keras_jax_run(model, x), vk._keras_jax_run(loop, x)
out = {"ratio": float(np.max(np.abs(as_built.outputs[0])) / np.max(np.abs(looped.outputs[0]))),
       "steps": len(vk._JAX_STEPS), "traces": len(calls._JAX_TRACES),
       "switches": [calls.unserialized_switches(model), calls.unserialized_switches(loop)]}
print("RESULT " + json.dumps(out))
"""
)


def test_a_clone_with_cudnn_off_is_not_given_the_models_compiled_step() -> None:
    """Keras leaves ``use_cudnn`` out of a layer's config, so the compiled steps and layer traces of verify_model
    on JAX, keyed by config, gave its cuDNN-off clone the as-built model's cuDNN computation (H100: the
    cuda-generic path observed cudnn and matched the cuDNN path's errors to the digit). The key now holds the
    switches; a stand-in for the GPU's cuDNN call shows which computation ran."""
    out = _run_jax_script(SWITCH, "use_cudnn")
    assert out["ratio"] == pytest.approx(2.0), out  # each ran its own computation
    assert out["steps"] == 2 and out["traces"] == 2, out
    assert out["switches"] == [["auto"], [False]]


MASKED = """
import json, os
os.environ["KERAS_BACKEND"] = "jax"
os.environ["JAX_PLATFORMS"] = "cpu"
import numpy as np, keras
from pytest_lstmperf.observation import calls

keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((5, 3)), keras.layers.Masking(0.0), keras.layers.LSTM(4), keras.layers.Dense(1)])
x = np.random.default_rng(0).standard_normal((2, 5, 3)).astype("float32")
x[0, 3:] = 0.0  # a padded tail: the LSTM gets a boolean mask
with calls.observe(jax_backward=True) as seen:
    model(x)
print("RESULT " + json.dumps({"problems": seen.problems, "layers": len(seen.layers),
                              "traces": [f"{t.phase}: {t.family}/{t.precision}" for t in seen.all_traces()]}))
"""


def test_a_masked_layer_on_jax_is_traced_forward_and_backward() -> None:
    """The backward trace differentiates the weights and the sequences, never the boolean mask (``jax.grad``
    refuses it: every masked model's layers were untraceable backward, and verify_model failed them)."""
    out = _run_jax_script(MASKED, "masked-layer")
    assert out["problems"] == [] and out["layers"] == 1, out
    assert out["traces"] == ["forward: jax-generic/fp32", "backward: jax-generic/fp32"], out


def test_trace_keys_drop_layer_names_but_keep_the_dtype_policy() -> None:
    from pytest_lstmperf.observation.calls import _without_names

    def config(name: str, policy: str) -> dict:
        dtype = {"module": "keras", "class_name": "DTypePolicy", "config": {"name": policy}, "registered_name": None}
        return {"name": name, "units": 4, "dtype": dtype, "layer": {"class_name": "LSTM", "config": {"name": "x"}}}

    assert _without_names(config("lstm", "float32")) == _without_names(config("lstm_7", "float32"))
    assert _without_names(config("lstm", "float32")) != _without_names(config("lstm", "mixed_bfloat16"))
