"""``lstmperf report`` on users' own models as a maintainer runs it: from the folder that holds the model's
module, without ``:attribute``, a cell loop measured against nn.LSTM on the same weights, a Keras model whose
batch and length are open (None), example inputs for a Keras model, and a Keras layer given a layer object as
activation (seed 000's ``LSTM(64, activation=ReLU(negative_slope=0.05))``) run by ``--run``."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SINE = """
import torch

class Sequence(torch.nn.Module):  # pytorch/examples time_sequence_prediction's structure, small
    def __init__(self):
        super().__init__()
        self.lstm1 = torch.nn.LSTMCell(1, 8)
        self.lstm2 = torch.nn.LSTMCell(8, 8)
        self.linear = torch.nn.Linear(8, 1)

    def forward(self, input):
        h_t = c_t = h_t2 = c_t2 = torch.zeros(input.size(0), 8, dtype=input.dtype)
        outputs = []
        for input_t in input.split(1, dim=1):
            h_t, c_t = self.lstm1(input_t, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            outputs.append(self.linear(h_t2))
        return torch.cat(outputs, dim=1)
"""

SEED_MODEL = """
import keras

def model():  # seed 000's model, small: a layer object as activation, batch 1
    inputs = keras.Input((30, 4), batch_size=1)
    x = keras.layers.LSTM(8, activation=keras.layers.ReLU(negative_slope=0.05))(inputs)
    return keras.Model(inputs, keras.layers.Dense(1)(x))
"""


def _cli(cwd: Path, *args: str, backend: str | None = None, timeout: int = 400) -> subprocess.CompletedProcess:
    """``lstmperf`` as a user runs it: the console script's entry, cwd the model's folder, no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if backend:
        env["KERAS_BACKEND"] = backend
    code = "import sys; from pytest_lstmperf.cli import main; sys.argv[0] = 'lstmperf'; sys.exit(main())"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=timeout)  # fmt: skip


needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
needs_keras = pytest.mark.skipif(importlib.util.find_spec("keras") is None, reason="needs keras")


@needs_torch
def test_report_finds_the_module_in_the_current_folder_and_measures_a_cell_loop(tmp_path: Path) -> None:
    (tmp_path / "sine.py").write_text(SINE)
    # `python -c` puts '' on sys.path like the console script does not: take it out for this run
    code = (
        "import sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')]; "
        "from pytest_lstmperf.cli import main; sys.exit(main())"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    args = ["report", "sine:Sequence", "--run", "--batch", "2", "--seq-len", "6"]
    result = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                            cwd=tmp_path, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if "torch-cell" in line]
    assert len(rows) == 2 and all("cpu-native/fp32 | cpu-native/fp32" in row for row in rows), result.stdout
    assert "? " not in result.stdout and "not measured" not in result.stdout
    assert result.stdout.count("x [") == 2  # a measured factor per cell row
    assert "6-step cell loop" in result.stdout and "vs nn.LSTM on the same weights" in result.stdout


@needs_torch
def test_report_without_an_attribute_names_the_candidates(tmp_path: Path) -> None:
    (tmp_path / "sine.py").write_text(SINE)
    result = _cli(tmp_path, "report", "sine")
    assert result.returncode == 2
    assert "name what to report as sine:ATTRIBUTE" in result.stderr and "candidates: sine:Sequence" in result.stderr
    result = _cli(tmp_path, "report", "sine:Sequense")
    assert result.returncode == 2 and "no attribute 'Sequense' (candidates: Sequence)" in result.stderr


@needs_torch
def test_a_cell_loop_measurement_refuses_a_loop_that_is_not_the_layer() -> None:
    import torch

    from pytest_lstmperf.model.spec import LayerSpec
    from pytest_lstmperf.observation import eligibility

    spec = LayerSpec(cell="gru", input_size=3, hidden_size=4, batch=2, seq_len=5)
    observed, factor, (loop, whole) = eligibility.measure_cell_loop(spec, "cpu", repeats=3)
    assert observed == "cpu-native/fp32" and factor == pytest.approx(loop / whole) and loop > 0 and whole > 0
    real = torch.nn.GRU.forward
    try:  # planted: the whole-sequence layer computes something else than the loop
        torch.nn.GRU.forward = lambda self, x, h=None: (real(self, x, h)[0] * 2, None)
        with pytest.raises(RuntimeError, match="disagree"):
            eligibility.measure_cell_loop(spec, "cpu", repeats=1)
    finally:
        torch.nn.GRU.forward = real


KERAS_SHAPES = """
import json, numpy as np, keras
from pytest_lstmperf import report

inputs = keras.Input((None, 3))  # batch and length open
states = [keras.Input((5,)), keras.Input((5,))]
x = keras.layers.LSTM(5, return_sequences=True, name="decoder")(inputs, initial_state=states)
model = keras.Model([inputs, *states], x)
open_rows = report(model)
data = [np.zeros((2, 7, 3), "float32"), np.zeros((2, 5), "float32"), np.zeros((2, 5), "float32")]
given_rows = report(model, data)
print("RESULT " + json.dumps({
    "open": [[r.verdict.spec.batch, r.verdict.spec.seq_len, list(r.verdict.notes)] for r in open_rows],
    "given": [[r.verdict.spec.batch, r.verdict.spec.seq_len, r.verdict.spec.initial_state, list(r.verdict.notes)]
              for r in given_rows],
}))
"""


@needs_keras
def test_a_keras_model_with_open_dimensions_says_it_guessed_and_example_inputs_decide(tmp_path: Path) -> None:
    env = {**os.environ, "KERAS_BACKEND": "torch", "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", KERAS_SHAPES], capture_output=True, text=True, env=env,
                            cwd=tmp_path, timeout=300)  # fmt: skip
    line = next((x for x in result.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, result.stderr[-3000:]
    data = json.loads(line[len("RESULT ") :])
    ((batch, length, notes),) = data["open"]
    assert (batch, length) == (4, 10)
    assert any("leaves its batch and length open (None): reported at batch 4, length 10" in n for n in notes)
    ((batch, length, state, notes),) = data["given"]
    assert (batch, length, state) == (2, 7, True)  # the decoder was given the encoder's states
    assert not any("open (None)" in n for n in notes)


@needs_keras
def test_a_layer_object_as_activation_runs_in_the_worker(tmp_path: Path) -> None:
    """Seed 000: the observed column said ``error`` ("Could not interpret activation function identifier:
    custom:...ReLU"), then "Exception ignored in KerasRun.__del__ ... no attribute 'handle'"."""
    (tmp_path / "seedmodel.py").write_text(SEED_MODEL)
    result = _cli(tmp_path, "report", "seedmodel:model", "--run", backend="torch", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    (row,) = [line for line in result.stdout.splitlines() if line.startswith("| 1 |")]
    assert '"class_name":"ReLU"' in row and '"negative_slope":0.05' in row
    assert "| cpu-native/fp32 | cpu-native/fp32 |" in row, row
    assert "error" not in result.stdout and "Exception ignored" not in result.stderr


def test_a_failed_prepare_leaves_no_finaliser_error() -> None:
    from pytest_lstmperf.paths.keras.paths import KerasRun

    run = KerasRun.__new__(KerasRun)  # as when the worker's "prepare" raised inside __init__
    run.close()  # no AttributeError
    assert run.handle is None


KERAS_SEQ2SEQ = """
import json, numpy as np, keras
from pytest_lstmperf import observe

# keras-io's lstm_seq2seq (character-level translation, Apache-2.0): the encoder's states feed the decoder
num_encoder_tokens, num_decoder_tokens, latent_dim = 7, 9, 6
encoder_inputs = keras.Input(shape=(None, num_encoder_tokens))
encoder = keras.layers.LSTM(latent_dim, return_state=True)
encoder_outputs, state_h, state_c = encoder(encoder_inputs)
encoder_states = [state_h, state_c]
decoder_inputs = keras.Input(shape=(None, num_decoder_tokens))
decoder_lstm = keras.layers.LSTM(latent_dim, return_sequences=True, return_state=True)
decoder_outputs, _, _ = decoder_lstm(decoder_inputs, initial_state=encoder_states)
decoder_dense = keras.layers.Dense(num_decoder_tokens, activation="softmax")
decoder_outputs = decoder_dense(decoder_outputs)
model = keras.Model([encoder_inputs, decoder_inputs], decoder_outputs)

data = [np.zeros((1, 11, num_encoder_tokens), "float32"), np.zeros((1, 4, num_decoder_tokens), "float32")]
with observe() as seen:
    model(data)
print("RESULT " + json.dumps([[s.batch, s.seq_len, s.initial_state] for _, s, _ in seen.layers]))
"""


@needs_keras
def test_seen_layers_of_a_keras_encoder_decoder_carry_each_calls_shapes_and_states(tmp_path: Path) -> None:
    """The lstm_seq2seq decoder is given the encoder's states: ``seen.layers`` said ``initial_state=False``
    for it; now each call says whether it was given states, with its own batch and length."""
    env = {**os.environ, "KERAS_BACKEND": "torch", "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", KERAS_SEQ2SEQ], capture_output=True, text=True, env=env,
                            cwd=tmp_path, timeout=300)  # fmt: skip
    line = next((x for x in result.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, result.stderr[-3000:]
    assert json.loads(line[len("RESULT ") :]) == [[1, 11, False], [1, 4, True]]
