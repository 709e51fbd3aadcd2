"""verify_model on a user's own torch model: clean passes on every CPU path; planted faults fail with the
suites' report (a numerical perturbation of 1e-4 relative in fp32 paths, oneDNN switched off, a hand-written
cell loop); a model with no recurrent layer is refused."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pytest_lstmperf import ModelCheckFailed, verify_model  # noqa: E402
from pytest_lstmperf.numerics.tolerance import growth  # noqa: E402
from pytest_lstmperf.numerics.verify_model import envelope_spec, layer_spec  # noqa: E402


class Tagger(torch.nn.Module):
    """LSTM, then a GRU, then a linear head: two recurrent layers of different kinds."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = torch.nn.LSTM(6, 8, num_layers=2, dropout=0.3)
        self.gru = torch.nn.GRU(8, 5, bidirectional=True)
        self.head = torch.nn.Linear(10, 3)

    def forward(self, x):
        y, _ = self.lstm(x)
        z, _ = self.gru(y)
        return self.head(z)


class CellLoop(torch.nn.Module):
    """The LSTM written as a loop over an LSTMCell (the fault the oneDNN claim must catch)."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = torch.nn.LSTMCell(6, 8)

    def forward(self, x):
        h = c = torch.zeros(x.shape[1], 8, dtype=x.dtype)
        outs = []
        for t in range(x.shape[0]):
            h, c = self.cell(x[t], (h, c))
            outs.append(h)
        return torch.stack(outs)


@pytest.fixture
def x():
    return torch.randn(7, 3, 6, generator=torch.Generator().manual_seed(0))


def test_clean_model_passes_every_cpu_path(x):
    torch.manual_seed(0)
    outcomes = verify_model(Tagger(), x, device="cpu")
    names = {o.path for o in outcomes}
    assert {"torch-cpu-onednn", "torch-cpu-native"} <= names
    onednn = next(o for o in outcomes if o.path == "torch-cpu-onednn")
    families = {(t.phase, t.detail.split("(")[0], t.family) for t in onednn.traces}
    assert ("forward", "LSTM", "onednn") in families and ("forward", "GRU", "cpu-native") in families
    assert any(k.startswith("grad lstm.weight_hh_l1") for k in onednn.errors)
    assert "grad input 0" in onednn.errors


def test_perturbed_fp32_outputs_fail(x, monkeypatch):
    original = torch.nn.LSTM.forward

    def perturbed(self, *args, **kwargs):
        out, state = original(self, *args, **kwargs)
        return (out * (1 + 1e-4) if out.dtype == torch.float32 else out), state

    monkeypatch.setattr(torch.nn.LSTM, "forward", perturbed)
    torch.manual_seed(0)
    with pytest.raises(ModelCheckFailed) as failed:
        verify_model(Tagger(), x, device="cpu", paths=["torch-cpu-onednn", "torch-cpu-native"])
    text = str(failed.value)
    assert "path torch-cpu-onednn" in text and "path torch-cpu-native" in text
    assert "[tolerance] output 0: relative error" in text and "the float64 run exceeds the fp32 forward" in text


def test_onednn_switched_off_fails_the_onednn_path(x):
    torch.manual_seed(0)
    with torch.backends.mkldnn.flags(enabled=False), pytest.raises(ModelCheckFailed) as failed:
        verify_model(Tagger(), x, device="cpu", paths=["torch-cpu-onednn"])
    assert "expected kernel family 'onednn', observed 'cpu-native'" in str(failed.value)
    assert "LSTM(6, 8, num_layers=2" in str(failed.value)


def test_cell_loop_fails_the_onednn_claim(x):
    torch.manual_seed(0)
    outcomes = verify_model(CellLoop(), x, device="cpu", raise_on_failure=False)
    onednn = next(o for o in outcomes if o.path == "torch-cpu-onednn")
    assert [m.check for m in onednn.mismatches].count("kernel") == 8  # one per step, and the backward pass
    native = next(o for o in outcomes if o.path == "torch-cpu-native")
    assert native.ok, native.report


def test_model_without_recurrent_layer_is_refused():
    with pytest.raises(ValueError, match="has no recurrent layer"):
        verify_model(torch.nn.Linear(3, 3), torch.randn(2, 3))
    with pytest.raises(TypeError, match=r"torch\.nn\.Module or a Keras model"):
        verify_model(object(), None)


def test_growth_comes_from_the_recurrent_layers():
    lstm = layer_spec(torch.nn.LSTM(6, 8, num_layers=2), seq_len=7, batch=3)
    gru = layer_spec(torch.nn.GRU(8, 5, bidirectional=True), seq_len=7, batch=3)
    envelope = envelope_spec([lstm, gru])
    assert (envelope.num_layers, envelope.seq_len, envelope.hidden_size) == (4, 7, 8)
    assert growth(envelope) > max(growth(lstm), growth(gru))


def test_bf16_gradients_whose_bound_would_pass_garbage_are_listed_not_compared() -> None:
    """A 2-layer, 256-unit LSTM under bf16: the gradient bound would reach 0.1 relative error, so the gradients
    are listed as not compared (with the error and why) instead of crashing or passing; outputs are checked."""
    torch = pytest.importorskip("torch")
    from pytest_lstmperf import verify_model

    torch.manual_seed(0)
    model = torch.nn.LSTM(64, 256, 2)
    (outcome,) = verify_model(
        model, torch.randn(35, 4, 64), device="cpu", paths=["torch-cpu-native-autocast-bf16"], raise_on_failure=False
    )
    assert outcome.skipped is None and outcome.errors
    assert outcome.unchecked and all("not compared" in line and ">= 0.1" in line for line in outcome.unchecked)
    assert "not checked:" in outcome.report
    assert not any(m.quantity.startswith("output") for m in outcome.mismatches)


def test_observed_precision_keeps_a_claimed_tf32_bound() -> None:
    """On the H100 the cuDNN default path (TF32) was traced as fp32 per layer and held to the fp32 bound, a
    false failure (relative error 5.7e-5 against 1.1e-6); TF32 stays TF32, a real change of precision wins."""
    from types import SimpleNamespace

    from pytest_lstmperf.numerics.verify_model import _observed_precision

    def run(*precisions: str) -> SimpleNamespace:
        return SimpleNamespace(traces=[SimpleNamespace(phase="forward", precision=p) for p in precisions])

    assert _observed_precision(run("fp32"), "forward", "tf32") == "tf32"
    assert _observed_precision(run("fp16"), "forward", "bf16") == "fp16"
    assert _observed_precision(run("fp32", "fp16"), "forward", "fp32") == "fp32"
