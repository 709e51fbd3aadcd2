"""``lstmperf report module:model`` on Keras models (torch and TensorFlow backends) with the model's own input
shape, on torch models, and ``--fail-on-fallback``; the in-process ``report(model)``; the public strategies."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings

from pytest_lstmperf import layer_specs, lstm_configs, path_names

ROOT = Path(__file__).resolve().parents[1]

KERAS_MODEL = """
import keras

def model():
    inputs = keras.Input((30, 8), batch_size=1)
    x = keras.layers.LSTM(16, return_sequences=True)(inputs)
    x = keras.layers.LSTM(16, activation=ACTIVATION)(x)
    return keras.Model(inputs, x)
"""

TORCH_MODEL = """
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = torch.nn.LSTM(8, 16, 2)

    def forward(self, x):
        return self.rnn(x)[0]

model = Net()
"""


def _report(tmp_path: Path, source: str, *args: str, backend: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    if backend:
        env["KERAS_BACKEND"] = backend
    command = [sys.executable, "-m", "pytest_lstmperf.cli", "report", source, *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)


@pytest.mark.skipif(importlib.util.find_spec("keras") is None, reason="keras is not installed")
@pytest.mark.parametrize("backend", ["torch", "tensorflow"])
def test_keras_model_report_uses_its_input_shape(tmp_path: Path, backend: str) -> None:
    if importlib.util.find_spec(backend) is None:
        pytest.skip(f"{backend} is not installed")
    (tmp_path / "clean_model.py").write_text(KERAS_MODEL.replace("ACTIVATION", "'tanh'"))
    (tmp_path / "relu_model.py").write_text(KERAS_MODEL.replace("ACTIVATION", "'relu'"))
    clean = _report(tmp_path, "clean_model:model", "--device", "cuda", "--fail-on-fallback", backend=backend)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    framework = "keras-torch" if backend == "torch" else "keras-tensorflow"
    assert f"{framework} lstm-I8-H16-L1-B1-T30" in clean.stdout
    assert f"{framework} lstm-I16-H16-L1-B1-T30" in clean.stdout
    relu = _report(tmp_path, "relu_model:model", "--device", "cuda", "--fail-on-fallback", backend=backend)
    assert relu.returncode == 1, relu.stdout + relu.stderr
    assert "1 of 2 layers fall back" in relu.stdout and "activation='relu' -> 'tanh'" in relu.stdout


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_torch_model_report_and_in_process_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import torch

    from pytest_lstmperf.cli import main

    (tmp_path / "torch_model.py").write_text(TORCH_MODEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    args = ["report", "torch_model:model", "--batch", "1", "--seq-len", "30", "--fail-on-fallback"]
    assert main(args) == 0
    assert "torch lstm-I8-H16-L2-B1-T30" in capsys.readouterr().out
    with torch.backends.mkldnn.flags(enabled=False):
        assert main(args) == 1  # the LSTM falls back to the native kernels
        assert main(args[:-1]) == 0  # reported, not an error, without the option
    assert "1 of 1 layers fall back" in capsys.readouterr().out

    from pytest_lstmperf import falls_back, report

    net = torch.nn.Sequential(torch.nn.LSTM(8, 16, 2))
    rows = report(net, torch.randn(30, 1, 8))
    assert [(r.verdict.spec.batch, r.verdict.spec.seq_len, r.verdict.kernel) for r in rows] == [(1, 30, "onednn")]
    assert not falls_back(rows[0])
    with torch.backends.mkldnn.flags(enabled=False):
        assert falls_back(report(net, torch.randn(30, 1, 8))[0])


CELL_MODEL = """
import torch

class Predictor(torch.nn.Module):
    \"\"\"A hand-written loop over two LSTMCells, the style of pytorch/examples' time_sequence_prediction.\"\"\"

    def __init__(self):
        super().__init__()
        self.lstm1 = torch.nn.LSTMCell(1, 16)
        self.lstm2 = torch.nn.LSTMCell(16, 16)

    def forward(self, x):
        h = c = h2 = c2 = torch.zeros(x.shape[0], 16, dtype=x.dtype)
        for x_t in x.split(1, dim=1):
            h, c = self.lstm1(x_t, (h, c))
            h2, c2 = self.lstm2(h, (h2, c2))
        return h2
"""


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_cell_loop_model_is_reported_as_falling_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """A model of LSTMCells has no cuDNN/oneDNN kernel: one row per cell (its batch and number of calls per
    forward from the example input), falling back on both devices, with the change that reaches cuDNN. The CLI
    takes the model class itself (a callable returning the model)."""
    import torch

    from pytest_lstmperf import falls_back, report
    from pytest_lstmperf.cli import main

    (tmp_path / "cell_model.py").write_text(CELL_MODEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    from cell_model import Predictor

    for device, family in (("cuda", "cuda-generic"), ("cpu", "cpu-native")):
        rows = report(Predictor(), torch.randn(3, 25), device=device)
        assert [(r.verdict.spec.batch, r.verdict.spec.seq_len, r.verdict.kernel) for r in rows] == [(3, 25, family)] * 2
        assert all(falls_back(r) for r in rows)
        assert "run the sequence through nn.LSTM(1, 16)" in rows[0].verdict.describe()
    assert main(["report", "cell_model:Predictor", "--device", "cuda", "--fail-on-fallback"]) == 1
    assert "2 of 2 layers fall back" in capsys.readouterr().out


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_rows_name_their_layer_and_a_per_step_loop_is_noted() -> None:
    """Two GRUs of one shape (a seq2seq encoder and decoder) are told apart by their names in the model; a GRU
    called once per token (pytorch/tutorials' seq2seq pattern) is eligible, with a note that says so."""
    import torch

    from pytest_lstmperf import report

    class PerToken(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = torch.nn.Sequential(torch.nn.GRU(8, 8))
            self.decoder = torch.nn.GRU(8, 8)

        def forward(self, x):
            hidden = None
            for t in range(x.shape[0]):
                _, hidden = self.encoder[0](x[t : t + 1], hidden)
            return self.decoder(x, hidden)[0]

    rows = report(PerToken(), torch.randn(5, 2, 8), device="cuda")
    assert [(r.layer, r.verdict.spec.seq_len) for r in rows] == [("encoder.0", 1), ("decoder", 5)]
    assert rows[0].config.startswith("encoder.0: torch gru-I8-H8-L1-B2-T1")
    assert any("called 5 times in one forward" in n for n in rows[0].verdict.notes)
    assert not any("called" in n for n in rows[1].verdict.notes)


@settings(max_examples=10, deadline=None, derandomize=True)
@given(config=lstm_configs("ci"), path=path_names("cpu"))
def test_public_strategies_build_torch_layers(config: dict, path: str) -> None:
    torch = pytest.importorskip("torch")
    kwargs = {k: v for k, v in config.items() if k not in ("cell", "batch", "seq_len")}
    if config["cell"] == "gru":
        kwargs.pop("proj_size", None)
    layer = (torch.nn.LSTM if config["cell"] == "lstm" else torch.nn.GRU)(**kwargs)
    shape = (config["batch"], config["seq_len"]) if config["batch_first"] else (config["seq_len"], config["batch"])
    out, _ = layer(torch.randn(*shape, config["input_size"]))
    assert out.shape[:2] == shape
    assert path.startswith("torch-cpu")


def test_layer_specs_reject_an_unknown_profile() -> None:
    with pytest.raises(ValueError, match=r"unknown profile 'fast'.*valid: ci, gpu, nightly"):
        layer_specs("fast")


def test_report_stays_the_function_after_every_submodule_is_imported() -> None:
    """``pytest_lstmperf.report`` is the eligibility function, whatever submodules were imported before (a
    submodule of that name would replace it on the package the moment anything imported it)."""
    import importlib
    import pkgutil

    import pytest_lstmperf

    for module in pkgutil.iter_modules(pytest_lstmperf.__path__):
        assert module.name not in pytest_lstmperf.__all__, f"submodule {module.name!r} shadows a public name"
    importlib.import_module("pytest_lstmperf.speed.report")
    assert callable(pytest_lstmperf.report) and pytest_lstmperf.report.__module__.endswith("paths.config_runs")
