"""The ``lstmperf_kernel`` marker and fixture, in a pytest subprocess (TensorFlow and torch stay out of this one).

One subprocess per framework keeps the cost to one TensorFlow import. The planted faults: a layer with
``activation='relu'`` marked ``cudnn`` fails with the explainer's reason; a test running no recurrent layer
fails instead of passing vacuously.
"""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("keras") is None or importlib.util.find_spec("tensorflow") is None,
    reason="keras and TensorFlow are needed (pip install tensorflow-cpu keras)",
)

KERAS_TESTS = """
import os
os.environ["KERAS_BACKEND"] = "tensorflow"
import numpy as np
import keras
import pytest

x = np.random.default_rng(0).standard_normal((2, 5, 3)).astype("float32")

@pytest.mark.lstmperf_kernel("tf-generic")
def test_generic_on_cpu():
    keras.layers.LSTM(4)(x)

@pytest.mark.lstmperf_kernel("cudnn")
def test_relu_is_not_cudnn():
    keras.layers.LSTM(4, activation="relu")(x)

@pytest.mark.lstmperf_kernel("tf-generic")
def test_no_recurrent_layer():
    keras.layers.Dense(4)(x)

def test_fixture(lstmperf_kernel):
    with lstmperf_kernel.expect("tf-generic"):
        keras.layers.GRU(4, reset_after=False)(x)

def test_fixture_fails(lstmperf_kernel):
    with lstmperf_kernel.expect("cudnn"):
        keras.layers.GRU(4, recurrent_dropout=0.1)(x)
"""

TORCH_TESTS = """
import pytest
import torch

@pytest.mark.lstmperf_kernel("onednn")
def test_onednn():
    torch.nn.LSTM(3, 4, batch_first=True)(torch.randn(2, 5, 3))

@pytest.mark.lstmperf_kernel("cudnn")
def test_cpu_is_not_cudnn():
    torch.nn.GRU(3, 4)(torch.randn(5, 2, 3))

@pytest.mark.lstmperf_kernel("bogus")
def test_bad_family():
    pass
"""


def test_marker_on_keras_tensorflow(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_keras=KERAS_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--strict-markers", "-rf")
    result.assert_outcomes(passed=2, failed=3)
    text = result.stdout.str()
    assert "activation='relu' -> 'tanh'" in text
    assert "TensorFlow sees no GPU" in text
    assert "no LSTM/GRU kernel ran" in text
    assert "recurrent_dropout=0.1 -> 0" in text


def test_marker_on_torch(pytester: pytest.Pytester) -> None:
    pytest.importorskip("torch")
    pytester.makepyfile(test_torch=TORCH_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--strict-markers", "-rf")
    result.assert_outcomes(passed=1, failed=2)
    text = result.stdout.str()
    assert "input on the CPU: cuDNN needs a CUDA tensor" in text
    assert "valid: cudnn, tf-generic" in text


def test_marker_is_registered(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("--markers")
    result.stdout.fnmatch_lines(["*lstmperf_kernel(kernel, *, precision=None)*"])
