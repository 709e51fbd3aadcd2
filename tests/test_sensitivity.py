"""verify_model widens a bound only as far as the model's own conditioning asks, and still catches faults."""

import pytest

torch = pytest.importorskip("torch")

from pytest_lstmperf.numerics import model_judge as vm  # noqa: E402
from pytest_lstmperf.numerics import verify_torch as vt  # noqa: E402
from pytest_lstmperf.numerics.sensitivity import Sensitivity  # noqa: E402


class Offset(torch.nn.Module):
    """An LSTM whose output is read after two large, separate parameters are added and subtracted: the float64
    result is the LSTM's, but the output now sits on cancellation (a badly conditioned way to compute it)."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = torch.nn.LSTM(8, 16, batch_first=True)
        self.up = torch.nn.Parameter(torch.full((16,), 1e3))
        self.down = torch.nn.Parameter(torch.full((16,), 1e3))

    def forward(self, x):
        y, _ = self.rnn(x)
        return (y + self.up) - self.down


def _sensitivity(model, x):
    ref = vt._run(model, (x,), "cpu", torch.float64)
    spec = vm.envelope_spec(list(ref.layer_shapes.values()))
    return vt._sensitivity(model, (x,), ref, spec)


def test_a_well_conditioned_model_keeps_the_canonical_bounds():
    torch.manual_seed(0)
    s = _sensitivity(torch.nn.LSTM(8, 16, batch_first=True), torch.randn(3, 10, 8))
    assert s.canonical["forward"] > 0 and s.canonical["backward"] > 0
    assert all(s.factor(q, "backward" if q.startswith("grad") else "forward") < 1.5 for q in s.model), s


def test_cancellation_widens_the_bound_and_says_so():
    torch.manual_seed(0)
    s = _sensitivity(Offset(), torch.randn(3, 10, 8))
    assert s.factor("output 0", "forward") > 10
    assert "bound widened" in s.explain("output 0", "forward")


def test_widened_bound_still_fails_a_planted_fault():
    """States ignored (a wrong result, not rounding) fails the model's fp32 check whatever its conditioning."""
    torch.manual_seed(0)
    model = torch.nn.LSTM(8, 16, batch_first=True)
    x, h0 = torch.randn(3, 10, 8), (0.5 * torch.randn(1, 3, 16), 0.5 * torch.randn(1, 3, 16))
    ref = vt._run(model, (x, h0), "cpu", torch.float64)
    wrong = vt._run(model, (x, (torch.zeros(1, 3, 16), torch.zeros(1, 3, 16))), "cpu", torch.float32)
    spec = vm.envelope_spec(list(ref.layer_shapes.values()))
    wide = Sensitivity({q: 1e6 for q in ("output 0",)}, {"forward": 1.0, "backward": 1.0})
    found = vm._check_numbers(wrong, ref, ("onednn", "fp32"), spec, vm.PathOutcome("cpu"), _sensitivity(model, x))
    assert any(m.check == "tolerance" and m.quantity == "output 0" for m in found)
    # a bound widened past MAX_REL is refused: inconclusive, never a pass
    found = vm._check_numbers(wrong, ref, ("onednn", "fp32"), spec, vm.PathOutcome("cpu"), wide)
    assert any(m.check == "inconclusive" and m.quantity == "output 0" for m in found)


KERAS_SCRIPT = """
import os, sys
os.environ["KERAS_BACKEND"] = "torch"
sys.modules.setdefault("tensorflow", None)  # keras.utils.set_random_seed would import it (3-4 s) to seed it too
import re
import numpy as np
import keras
from pytest_lstmperf.numerics.verify_keras import verify_keras_model

def build(offset):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((10, 8), batch_size=3)
    y = keras.layers.LSTM(16, return_sequences=True)(inputs)
    for bias in (offset, -offset):  # y + offset - offset: the float64 result is the LSTM's, on cancellation
        y = keras.layers.Dense(16, kernel_initializer="identity", bias_initializer=keras.initializers.Constant(bias))(y)
    return keras.Model(inputs, y)

x = np.random.default_rng(0).standard_normal((3, 10, 8)).astype("float32")
for offset in (0.0, 1e3):
    (outcome,) = verify_keras_model(build(offset), x, device="cpu")
    widened = re.search(r"output 0 \\S+ \\(bound widened ([0-9.]+)x", outcome.report)
    print("RESULT", offset, outcome.ok, outcome.errors["output 0"], widened.group(1) if widened else 1.0)
"""


def test_keras_model_bounds_are_widened_by_its_conditioning_too() -> None:
    """A Keras model on cancellation passes with a bound widened (and says so in its report); a plain one
    keeps about the canonical bounds. The float64 run really is float64 on the torch backend (Keras computes
    64-bit products in 32 bits there unless told otherwise): the offset model's fp32 error is far above fp32
    rounding of the LSTM alone. Its own process: Keras fixes its backend at first import."""
    pytest.importorskip("keras")
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", KERAS_SCRIPT], capture_output=True, text=True, timeout=600)
    results = [line.split()[1:] for line in done.stdout.splitlines() if line.startswith("RESULT")]
    assert len(results) == 2, done.stdout + done.stderr[-3000:]
    (_, plain_ok, plain_err, plain_factor), (_, offset_ok, offset_err, offset_factor) = results
    assert plain_ok == offset_ok == "True"
    assert float(plain_factor) < 1.5 and float(plain_err) < 1e-6
    assert float(offset_factor) > 100 and float(offset_err) > 1e-5
