"""The examples' tests must fail when the fault they guard against is planted: each run copies an example into
a fresh project, plants one fault in a conftest (the example's code is not edited) and runs its tests.

Faults: oneDNN switched off; the LSTM replaced by a hand-written LSTMCell loop with the same weights; a slowed
forward (the model's forward run twice per call, as a stray extra call would: caught by the speed test against
the baseline recorded before, through the exact ATen op count, whatever the machine's load); a Keras LSTM built
with ``activation="relu"`` (leaves cuDNN on a GPU; caught on any machine by the eligibility test). Packing faults
(the chatbot tutorial's encoder and DeepAR's LSTM): packing removed, an unsorted batch packed as if sorted, wrong
lengths; each is caught by the example's packing test (the observed call is packed, with the batch's own lengths
in its order), not only by the speed gate's op counts.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
from forked_pytest import runpytest_forked

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")

ONEDNN_OFF = """
import torch
torch.backends.mkldnn.enabled = False
"""

CELL_LOOP = """
import pytest
import torch
import wlm_model


class CellLoopLSTM(torch.nn.Module):
    \"\"\"nn.LSTM's computation as a Python loop over LSTMCells holding the same weights.\"\"\"

    def __init__(self, lstm):
        super().__init__()
        self.cells = torch.nn.ModuleList()
        for layer in range(lstm.num_layers):
            cell = torch.nn.LSTMCell(lstm.input_size if layer == 0 else lstm.hidden_size, lstm.hidden_size)
            for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                setattr(cell, name, getattr(lstm, f"{name}_l{layer}"))
            self.cells.append(cell)

    def forward(self, x, hidden):
        h0, c0 = hidden
        hs, cs = [], []
        for layer, cell in enumerate(self.cells):
            h, c, outs = h0[layer], c0[layer], []
            for t in range(x.shape[0]):
                h, c = cell(x[t], (h, c))
                outs.append(h)
            x = torch.stack(outs)
            hs.append(h)
            cs.append(c)
        return x, (torch.stack(hs), torch.stack(cs))


original_init = wlm_model.RNNModel.__init__


def planted_init(self, *args, **kwargs):
    original_init(self, *args, **kwargs)
    self.rnn = CellLoopLSTM(self.rnn)


wlm_model.RNNModel.__init__ = planted_init
"""

SLOWED_FORWARD = """
import wlm_model

original_forward = wlm_model.RNNModel.forward


def slowed_forward(self, input, hidden):
    original_forward(self, input, hidden)  # a stray extra forward pass, its result thrown away
    return original_forward(self, input, hidden)


wlm_model.RNNModel.forward = slowed_forward
"""

RELU_ACTIVATION = """
import os

os.environ.setdefault("KERAS_BACKEND", "torch")
import keras

original_init = keras.layers.LSTM.__init__


def planted_init(self, *args, **kwargs):
    kwargs["activation"] = "relu"
    original_init(self, *args, **kwargs)


keras.layers.LSTM.__init__ = planted_init
"""


CHATBOT_PACKING_REMOVED = """
import chatbot_model


def unpacked_forward(self, input_seq, input_lengths, hidden=None):
    outputs, hidden = self.gru(self.embedding(input_seq), hidden)  # the padded batch, padding run as steps
    return outputs[:, :, : self.hidden_size] + outputs[:, :, self.hidden_size :], hidden


chatbot_model.EncoderRNN.forward = unpacked_forward
"""

CHATBOT_WRONG_LENGTHS = """
import torch
import chatbot_model


def forward_with_wrong_lengths(self, input_seq, input_lengths, hidden=None):
    lengths = torch.full_like(input_lengths, input_seq.size(0))  # every sentence as long as the longest
    packed = torch.nn.utils.rnn.pack_padded_sequence(self.embedding(input_seq), lengths)
    outputs, hidden = self.gru(packed, hidden)
    outputs, _ = torch.nn.utils.rnn.pad_packed_sequence(outputs)
    return outputs[:, :, : self.hidden_size] + outputs[:, :, self.hidden_size :], hidden


chatbot_model.EncoderRNN.forward = forward_with_wrong_lengths
"""

DEEPAR_PACKING_REMOVED = """
import torch
import deepar_model


def unpacked(self, x, hx=None, lengths=None, enforce_sorted=True):
    return torch.nn.LSTM.forward(self, x, hx)  # lengths dropped: the padded batch, padding run as steps


deepar_model.LSTM.forward = unpacked
"""

DEEPAR_UNSORTED = """
import deepar_model

original = deepar_model.LSTM.forward


def packed_as_if_sorted(self, x, hx=None, lengths=None, enforce_sorted=True):
    if lengths is not None:  # the lengths sorted, the series left in the loader's order
        lengths, enforce_sorted = lengths.sort(descending=True).values, True
    return original(self, x, hx, lengths=lengths, enforce_sorted=enforce_sorted)


deepar_model.LSTM.forward = packed_as_if_sorted
"""

DEEPAR_WRONG_LENGTHS = """
import torch
import deepar_model

original = deepar_model.LSTM.forward


def full_lengths(self, x, hx=None, lengths=None, enforce_sorted=True):
    if lengths is not None:  # every series as long as the padded batch
        lengths = torch.full_like(lengths, x.size(1))
    return original(self, x, hx, lengths=lengths, enforce_sorted=enforce_sorted)


deepar_model.LSTM.forward = full_lengths
"""


def _project(pytester: pytest.Pytester, example: str, fault: str) -> None:
    for source in (EXAMPLES / example).glob("*.py"):
        target = pytester.path / source.name
        if source.name == "conftest.py":
            fault = source.read_text() + "\n" + fault
            continue
        shutil.copy(source, target)
    (pytester.path / "conftest.py").write_text(fault)


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return runpytest_forked(pytester,
        "-p", "no:cacheprovider", "--device=cpu", "-rf", *(args or ("--benchmark-disable",))
    )  # fmt: skip


@needs_torch
def test_word_language_model_fails_with_onednn_off(pytester: pytest.Pytester) -> None:
    _project(pytester, "word_language_model", ONEDNN_OFF)
    result = _run(pytester)
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*lstmperf_kernel: expected onednn; 2 of 2 recurrent layer calls did not:*",
            "*path torch-cpu-onednn on lstm-I16-H32-L2-B4-T12 (seed 0): 2 check(s) failed*",
            # the call is named by module path, call number and shape
            "*[[]kernel[]] forward RNNModel.rnn call 1, T12 B4: LSTM(16, 32, num_layers=2): expected kernel family "
            "'onednn', observed 'cpu-native'*",
            "FAILED *test_training_step_runs_the_fast_kernel*",
            "FAILED *test_every_path_matches_float64*",
        ]
    )


@needs_torch
def test_word_language_model_fails_with_a_cell_loop(pytester: pytest.Pytester) -> None:
    _project(pytester, "word_language_model", CELL_LOOP)
    result = _run(pytester)
    result.assert_outcomes(passed=1, failed=3)
    text = result.stdout.str()
    assert "LSTMCell(16, 32)" in text and "expected kernel family 'onednn', observed 'cpu-native'" in text
    # the eligibility test sees the two cells (rows of their own) where the model had one 2-layer LSTM
    result.stdout.fnmatch_lines(["FAILED *test_layers_are_cudnn_eligible*"])


@needs_torch
def test_word_language_model_speed_test_fails_with_a_slowed_forward(pytester: pytest.Pytester) -> None:
    _project(pytester, "word_language_model", "")
    # what fails is the call's host work (its ATen op count), which a recording of one process holds as well as
    # one of several: the processes that show how far the figures lie apart (up to 8 for a lone benchmark) are
    # tested in test_bench_plugin and test_measurement
    assert _run(pytester, "-k", "speed", "--lstmperf-save-baseline", "--lstmperf-record-processes=1").ret == 0
    (pytester.path / "conftest.py").write_text(SLOWED_FORWARD)
    result = _run(pytester, "-k", "speed", "--benchmark-compare")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines(["*test_forward_speed*", "*host: host-work-changed (aten_ops *", "*SPEED GATE FAILED*"])


@pytest.mark.skipif(importlib.util.find_spec("keras") is None, reason="keras is not installed")
@needs_torch
def test_keras_classifier_fails_with_a_relu_activation(pytester: pytest.Pytester) -> None:
    _project(pytester, "keras_bidirectional", RELU_ACTIVATION)
    result = _run(pytester)
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*activation='relu' -> 'tanh'*"])
    result.stdout.fnmatch_lines(["FAILED *test_every_lstm_is_cudnn_eligible*"])


@needs_torch
@pytest.mark.parametrize(
    ("fault", "seen"),
    [
        (CHATBOT_PACKING_REMOVED, "*the encoder's GRU ran gru-I16-H16-L2-bi-B4-T7, not packed*"),
        (CHATBOT_WRONG_LENGTHS, "*assert (4, 7, (7, 7, 7, 7)) == (4, 7, (7, 6, 4, 2))*"),
    ],
    ids=["packing-removed", "wrong-lengths"],
)
def test_chatbot_packing_faults_fail_its_packing_test(pytester: pytest.Pytester, fault: str, seen: str) -> None:
    _project(pytester, "chatbot", fault)
    result = _run(pytester, "--benchmark-disable", "-k", "packed")
    result.assert_outcomes(failed=1, deselected=3)
    result.stdout.fnmatch_lines([seen, "FAILED *test_encoder_runs_packed_over_each_sentences_length*"])


@needs_torch
@pytest.mark.parametrize(
    ("fault", "seen"),
    [
        (DEEPAR_PACKING_REMOVED, "*AssertionError: [[]'lstm-I3-H10-L2-B5-T12', 'lstm-I3-H10-L2-B5-T4'[]]*"),
        (DEEPAR_UNSORTED, "*assert ((12, 12, 10, 8, 4) == (12, 8, 10, 4, 12)*"),
        (DEEPAR_WRONG_LENGTHS, "*assert ((12, 12, 12, 12, 12) == (12, 8, 10, 4, 12)*"),
    ],
    ids=["packing-removed", "unsorted-batch", "wrong-lengths"],
)
def test_deepar_packing_faults_fail_its_packing_test(pytester: pytest.Pytester, fault: str, seen: str) -> None:
    _project(pytester, "deepar", fault)
    result = _run(pytester, "--benchmark-disable", "-k", "packed")
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines([seen, "FAILED *test_history_and_horizon_run_packed_over_each_series_length*"])
