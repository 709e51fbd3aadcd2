"""The report's reference slowdown quotes a figure measured on the row's own cell: every recorded figure is an
LSTM's, and a GRU's cuDNN report had quoted one for a GRU."""

from __future__ import annotations

import pytest

from pytest_lstmperf.model.keras_options import KerasOptions
from pytest_lstmperf.model.spec import LayerSpec
from pytest_lstmperf.observation.eligibility import REFERENCE_SLOWDOWNS, _reference_slowdown
from pytest_lstmperf.observation.explain import explain


def _spec(cell: str) -> LayerSpec:
    return LayerSpec(cell=cell, input_size=8, hidden_size=16, num_layers=1, seq_len=10, batch=4)


@pytest.mark.parametrize("framework", ["keras-torch", "keras-tensorflow"])
def test_a_gru_off_cudnn_quotes_no_lstm_measurement(framework: str) -> None:
    verdict = explain(_spec("gru"), framework, "cuda", KerasOptions(activation="relu"))
    assert verdict.kernel != "cudnn" and verdict.reasons
    slowdown, source = _reference_slowdown(verdict)
    assert slowdown == "?"
    assert "no GRU figure recorded" in source and "LSTM(" not in source


def test_an_lstm_off_cudnn_still_quotes_its_measurement() -> None:
    verdict = explain(_spec("lstm"), "keras-torch", "cuda", KerasOptions(activation="relu"))
    slowdown, source = _reference_slowdown(verdict)
    assert (slowdown, source) == ("~23x", REFERENCE_SLOWDOWNS[("keras-torch", "cuda", "lstm", "activation")][1])


def test_every_recorded_figure_names_the_cell_it_was_measured_on() -> None:
    for (_, _, cell, _), (_, source) in REFERENCE_SLOWDOWNS.items():
        assert cell.upper() in source, source
