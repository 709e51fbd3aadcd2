"""The ``lstmperf_kernel`` marker and fixture, in a pytest subprocess (TensorFlow and torch stay out of this one).

One subprocess per framework keeps the cost to one TensorFlow import. The planted faults: a layer with
``activation='relu'`` marked ``cudnn`` fails with the explainer's reason; a test running no recurrent layer
fails instead of passing vacuously.
"""

from __future__ import annotations

import importlib.util

import pytest
from forked_pytest import runpytest_forked

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

FUSED = hasattr(keras.layers.Bidirectional, "_call_fused_lstm")

@pytest.mark.skipif(not FUSED, reason="this Keras has no fused bidirectional call")
def test_fused_bidirectional_call_describes_both_layers(monkeypatch):
    # Keras 3.15 runs Bidirectional(LSTM) on a GPU in one fused cuDNN call that calls neither layer
    from pytest_lstmperf.observation.calls import observe

    called = []

    def fused(self, sequences, initial_state):
        called.append(self.name)
        return keras.ops.zeros((2, 5, 8))

    monkeypatch.setattr(keras.layers.Bidirectional, "_call_fused_lstm", fused)
    with observe() as seen:
        keras.layers.Bidirectional(keras.layers.LSTM(4, return_sequences=True))(x)
    assert called  # neither layer's inner_loop ran: both were described from the fused call
    assert [options.go_backwards for _, _, options in seen.layers] == [False, True]

def test_fused_call_falling_back_counts_each_layer_once():
    from pytest_lstmperf.observation.calls import observe

    with observe() as seen:
        keras.layers.Bidirectional(keras.layers.LSTM(4))(x)
    assert [options.go_backwards for _, _, options in seen.layers] == [False, True]
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

class Mixed(torch.nn.Module):  # one oneDNN nn.LSTM, then a hand-written LSTMCell loop
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(3, 4)
        self.cell = torch.nn.LSTMCell(4, 4)

    def forward(self, x):
        y, _ = self.lstm(x)
        h = c = torch.zeros(x.shape[1], 4)
        for t in range(x.shape[0]):
            h, c = self.cell(y[t], (h, c))
        return h

@pytest.mark.lstmperf_kernel("onednn")
def test_mixed_fails():
    Mixed()(torch.randn(5, 2, 3)).sum().backward()

@pytest.mark.lstmperf_kernel("cpu-native")
def test_mlp_fails():  # Linear + tanh + sigmoid is not an LSTM
    mlp = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1), torch.nn.Sigmoid())
    mlp(torch.randn(2, 3)).sum().backward()

@pytest.mark.lstmperf_kernel(cpu="onednn", cuda="cudnn")
def test_per_device_claim():
    torch.nn.LSTM(3, 4)(torch.randn(5, 2, 3))[0].sum().backward()

@pytest.mark.lstmperf_kernel(cuda="cudnn")
def test_no_claim_for_this_device():
    torch.nn.LSTM(3, 4)(torch.randn(5, 2, 3))

@pytest.mark.lstmperf_kernel("onednn")
def test_second_call_off_onednn_fails():
    lstm = torch.nn.LSTM(3, 4)
    out = lstm(torch.randn(5, 2, 3))[0]
    with torch.backends.mkldnn.flags(enabled=False):  # the first call ran oneDNN; the second call does not
        out = out + lstm(torch.randn(5, 2, 3))[0]
    out.sum().backward()

MODES = []

@pytest.mark.lstmperf_kernel("onednn")
def test_benchmark_rounds_untraced(benchmark):
    from torch.utils._python_dispatch import _get_current_dispatch_mode
    lstm, x = torch.nn.LSTM(3, 4), torch.randn(5, 2, 3)

    def step():
        MODES.append(_get_current_dispatch_mode() is not None)
        return lstm(x)

    benchmark.pedantic(step, rounds=3, iterations=2, warmup_rounds=1)
    # timed and warm-up rounds run without the observer; the last, untimed call is observed
    assert MODES[-1] and not any(MODES[:-1]), MODES
"""

LATE_IMPORT_TESTS = """
import sys
import pytest

def test_torch_not_imported_yet():
    assert "torch" not in sys.modules

@pytest.mark.lstmperf_kernel("cudnn")
def test_torch_imported_inside_the_test_is_observed():
    import torch
    torch.nn.LSTM(3, 4)(torch.randn(5, 2, 3))
"""


def test_marker_on_keras_tensorflow(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_keras=KERAS_TESTS)
    result = runpytest_forked(pytester, "-p", "no:cacheprovider", "--strict-markers", "-rf")
    result.assert_outcomes(passed=4, failed=3)
    text = result.stdout.str()
    assert "activation='relu' -> 'tanh'" in text
    assert "TensorFlow sees no GPU" in text
    assert "no LSTM/GRU layer ran" in text
    assert "recurrent_dropout=0.1 -> 0" in text


# find_spec, not importorskip: pytester restores sys.modules after each test, and a second import of torch
# in one process crashes it
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")


@needs_torch
def test_marker_on_torch(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_torch=TORCH_TESTS)
    result = runpytest_forked(pytester, "-p", "no:cacheprovider", "--strict-markers", "-rf", "--device=cpu")
    result.assert_outcomes(passed=3, failed=6)
    text = result.stdout.str()
    assert "input on the CPU: cuDNN needs a CUDA tensor" in text
    assert "valid: cudnn, cuda-generic, onednn" in text
    result.stdout.fnmatch_lines(
        [
            "*_ test_mixed_fails _*",
            "*5 of 7 recurrent layer calls did not*",
            "*5x forward: cpu-native/fp32*LSTMCell(4, 4)*",
            "*_ test_mlp_fails _*",
            "*no LSTM/GRU layer ran*",
            "*_ test_no_claim_for_this_device _*",
            "*names no kernel for device cpu*",
            "*_ test_second_call_off_onednn_fails _*",
            "*1 of 3 recurrent layer calls did not*",
            "*forward: cpu-native/fp32*LSTM(3, 4)*",
        ]
    )


@needs_torch
def test_marker_sees_a_framework_imported_during_the_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_late=LATE_IMPORT_TESTS)
    # a real subprocess: torch must be imported by the test itself, and a forked run starts with it imported
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:lstmperf-bench", "-rf")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*expected cudnn; 1 of 1 recurrent layer calls did not*", "*forward: onednn/fp32*"])


def test_marker_is_registered(pytester: pytest.Pytester) -> None:
    result = runpytest_forked(pytester, "--markers")
    result.stdout.fnmatch_lines(["*lstmperf_kernel(kernel=None, *, precision=None, cpu=None, cuda=None)*"])


PACKED_TESTS = """
import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence


class Seq2Seq(torch.nn.Module):  # a packed encoder (the CPU's native kernel by design), a dense decoder (oneDNN)
    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.LSTM(3, 4)
        self.decoder = torch.nn.LSTM(3, 4)

    def forward(self, x, lengths):
        _, state = self.encoder(pack_padded_sequence(x, lengths, enforce_sorted=False))
        y, _ = self.decoder(x[:2], state)
        return y


def run(decoder_onednn=True):
    model, x = Seq2Seq(), torch.randn(5, 3, 3)
    with torch.backends.mkldnn.flags(enabled=decoder_onednn):
        model(x, torch.tensor([5, 2, 4])).sum().backward()


@pytest.mark.lstmperf_kernel(cpu={"*packed*": "cpu-native", "*": "onednn"}, cuda="cudnn")
def test_per_call_claim():
    run()


@pytest.mark.lstmperf_kernel(cpu=("onednn", "cpu-native"))
def test_any_of_two():
    run()


@pytest.mark.lstmperf_kernel(cpu={"*.encoder *": "cpu-native", "*.decoder *": "onednn"})
def test_per_module_claim_fails_a_decoder_off_onednn():
    run(decoder_onednn=False)


@pytest.mark.lstmperf_kernel(cpu={"*packed*": "cpu-native"})
def test_a_call_no_pattern_matches_fails():
    run()


@pytest.mark.lstmperf_kernel("onednn")
def test_encoder_and_decoder_told_apart():
    run()


@pytest.mark.lstmperf_kernel(cuda="cudnn")
def test_cuda_only_claim_skipping_itself_on_the_cpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    run()


@pytest.mark.lstmperf_kernel(cpu={"*": "bogus"})
def test_bad_family_in_a_mapping():
    pass


@pytest.mark.lstmperf_kernel(cpu={})
def test_empty_mapping():
    pass
"""


@needs_torch
def test_marker_claims_per_call_and_several_families(pytester: pytest.Pytester) -> None:
    """A packed encoder (native by PyTorch's design) and a dense decoder (oneDNN) in one test: a claim per call
    pattern, or several families, accept it; a decoder planted off oneDNN, and a call no pattern claims, fail;
    the encoder's and the decoder's calls are told apart, their recurrent ops listed first; a ``cuda=`` claim
    on a CPU run skips a test that skips itself."""
    pytester.makepyfile(test_packed=PACKED_TESTS)
    result = runpytest_forked(pytester, "-p", "no:cacheprovider", "--strict-markers", "-rfs", "--device=cpu")
    result.assert_outcomes(passed=2, failed=5, skipped=1)
    text = result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "*_ test_per_module_claim_fails_a_decoder_off_onednn _*",
            "*expected cpu-native for calls '*.encoder *'; onednn for calls '*.decoder *'; 1 of 3 recurrent*",
            "*forward: cpu-native/fp32 (ops: addmm, sigmoid*[[]Seq2Seq.decoder call 1, T2 B3: LSTM(3, 4)]*",
            "*_ test_a_call_no_pattern_matches_fails _*",
            "*[[]Seq2Seq.decoder call 1, T2 B3: LSTM(3, 4)] (no pattern of the claim matches this call)*",
            "*_ test_encoder_and_decoder_told_apart _*",
            "*expected onednn; 1 of 3 recurrent layer calls did not:*",
            "*forward: cpu-native/fp32 (ops: addmm, sigmoid*[[]Seq2Seq.encoder call 1, packed B3 T<=5: LSTM(3, 4)]*",
            "*_ test_bad_family_in_a_mapping _*",
            "*unknown kernel family 'bogus'*",
            "*_ test_empty_mapping _*",
            "*a per-call claim maps call patterns*",
        ]
    )
    result.stdout.fnmatch_lines(["SKIPPED*needs a GPU*"])
    assert "names no kernel for device cpu" not in text
