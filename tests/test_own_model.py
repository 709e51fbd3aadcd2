"""verify_model on a user's own torch model: clean passes on every CPU path; planted faults fail with the
suites' report (a numerical perturbation of 1e-4 relative in fp32 paths, oneDNN switched off, a hand-written
cell loop); a model with no recurrent layer is refused."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pytest_lstmperf import ModelCheckFailed, verify_model  # noqa: E402
from pytest_lstmperf.numerics.tolerance import growth  # noqa: E402
from pytest_lstmperf.numerics.verify_model import envelope_spec  # noqa: E402
from pytest_lstmperf.numerics.verify_torch import layer_spec  # noqa: E402


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
    # bf16 gradients cannot be compared (their bound would reach 0.1): accepted by name, or the call raises
    outcomes = verify_model(Tagger(), x, device="cpu", accept_unchecked=["*-autocast-bf16: grad *"])
    names = {o.path for o in outcomes}
    assert {"torch-cpu-onednn", "torch-cpu-native"} <= names
    onednn = next(o for o in outcomes if o.path == "torch-cpu-onednn")
    families = {(t.phase, t.detail.split("(")[0], t.family) for t in onednn.traces}
    assert ("forward", "LSTM", "onednn") in families and ("forward", "GRU", "cpu-native") in families
    assert any(k.startswith("grad lstm.weight_hh_l1") for k in onednn.errors)
    assert "grad input 0" in onednn.errors


def _perturb_fp32_outputs(monkeypatch) -> None:
    """Every float32 ``nn.LSTM`` output sequence scaled by 1 + 1e-4 (the float64 reference untouched)."""
    original = torch.nn.LSTM.forward

    def perturbed(self, *args, **kwargs):
        out, state = original(self, *args, **kwargs)
        return (out * (1 + 1e-4) if out.dtype == torch.float32 else out), state

    monkeypatch.setattr(torch.nn.LSTM, "forward", perturbed)


def test_perturbed_fp32_outputs_fail(x, monkeypatch):
    _perturb_fp32_outputs(monkeypatch)
    torch.manual_seed(0)
    with pytest.raises(ModelCheckFailed) as failed:
        verify_model(Tagger(), x, device="cpu", paths=["torch-cpu-onednn", "torch-cpu-native"])
    text = str(failed.value)
    assert "path torch-cpu-onednn" in text and "path torch-cpu-native" in text
    assert "[tolerance] output 0: relative error" in text
    assert "the float64 run exceeds the cpu-native/fp32 forward" in text


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


def test_model_with_a_fixed_float64_state_fails_each_path_with_the_cause(x):
    """pytorch/examples' time_sequence_prediction makes its LSTMCell states with ``dtype=torch.double``: run in
    float32 on a path it raises inside torch; each path fails with what was raised and what to change."""

    class DoubleStates(CellLoop):
        def forward(self, x):
            h = c = torch.zeros(x.shape[1], 8, dtype=torch.double)
            for t in range(x.shape[0]):
                h, c = self.cell(x[t], (h, c))
            return h

    torch.manual_seed(0)
    with pytest.raises(ModelCheckFailed) as failed:
        verify_model(DoubleStates(), x.double(), device="cpu", paths=["torch-cpu-native"])
    text = str(failed.value)
    assert "[error] the model, run on cpu in float32 under this path's switches, raised RuntimeError" in text
    assert "make them like the input (dtype=input.dtype" in text


class TutorialEncoder(torch.nn.Module):
    """The pattern of pytorch/tutorials' seq2seq encoder: the first hidden state made inside, with no dtype."""

    def __init__(self, cast_to_float32: bool = False) -> None:
        super().__init__()
        self.gru = torch.nn.GRU(6, 8)
        self.cast = cast_to_float32

    def forward(self, x):
        hidden = torch.zeros(1, x.shape[1], 8)
        return self.gru(x.float() if self.cast else x, hidden)[0]


def test_tensors_made_without_a_dtype_follow_the_reference_and_a_cast_is_a_clear_error(x):
    """A state made with the default dtype is float64 in the reference run, float32 on the paths (a float32
    state would stop the GRU in the reference); a model that casts to float32 itself cannot run the float64
    reference: a clear error naming what was raised and what to change."""
    torch.manual_seed(0)
    outcomes = verify_model(TutorialEncoder(), x, device="cpu", paths=["torch-cpu-native"])
    assert outcomes[0].ok and outcomes[0].errors
    with pytest.raises(ValueError, match=r"float64 reference run of TutorialEncoder on cpu raised ValueError"):
        verify_model(TutorialEncoder(cast_to_float32=True), x, device="cpu", paths=["torch-cpu-native"])


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


def test_bound_is_that_of_what_ran_tf32_claim_kept() -> None:
    """The suites' rule for the bound of a pass: what its traces observed (bf16 claimed, fp16 ran: the fp16
    bound); fp32 kernels where TF32 is allowed keep the TF32 bound (on the H100 the cuDNN default path, traced
    fp32 per layer and held to the fp32 bound, failed falsely: 5.7e-5 against 1.1e-6); mixed layers take the
    loosest bound; nothing traced keeps the claim's; other layers than the recurrent ones add the claim's."""
    from types import SimpleNamespace

    from pytest_lstmperf.numerics.model_judge import _pass_bound
    from pytest_lstmperf.numerics.tolerance import tolerance

    spec = layer_spec(torch.nn.LSTM(6, 8, num_layers=2), seq_len=7, batch=3)

    def run(*observed: tuple[str, str]) -> SimpleNamespace:
        return SimpleNamespace(traces=[SimpleNamespace(phase="forward", family=f, precision=p) for f, p in observed])

    def bound(claim: tuple[str, str], *observed: tuple[str, str]) -> tuple[str, str]:
        tol = _pass_bound(run(*observed), "forward", claim, spec)
        return tol.family, tol.precision

    assert bound(("cudnn", "tf32"), ("cudnn", "fp32")) == ("cudnn", "tf32")
    assert bound(("cudnn", "bf16"), ("cudnn", "fp16"))[1] == "fp16"
    # a model with other layers (a Linear under bf16 autocast): they run in the claimed bf16, whose bound joins
    other = _pass_bound(run(("cudnn", "fp16")), "forward", ("cudnn", "bf16"), spec, other_layers=True)
    assert (
        other.precision == "bf16"
        and other.rel > _pass_bound(run(("cudnn", "fp16")), "forward", ("cudnn", "bf16"), spec).rel
    )
    assert bound(("onednn", "fp32")) == bound(("onednn", "fp32"), ("onednn", "fp32"))
    mixed = _pass_bound(run(("onednn", "fp32"), ("cpu-native", "fp16")), "forward", ("onednn", "fp32"), spec)
    assert mixed.rel == max(tolerance("fp32", "forward", spec, "onednn").rel,
                            tolerance("fp16", "forward", spec, "cpu-native").rel)  # fmt: skip


@pytest.fixture
def onednn_fallback_documented(monkeypatch):
    """A known finding planted for the oneDNN path (it runs the native kernels), and oneDNN switched off so
    that the path observes exactly that: the suites' rule then expects cpu-native there."""
    from pytest_lstmperf.observation import claims as known_findings

    finding = known_findings.KnownFinding("torch-cpu-onednn", "kernel", "cpu-native", "planted: documented fallback")
    monkeypatch.setattr(known_findings, "KNOWN_FINDINGS", (*known_findings.KNOWN_FINDINGS, finding))
    with torch.backends.mkldnn.flags(enabled=False):
        yield


def test_known_finding_with_good_numbers_is_reported_not_failed(x, onednn_fallback_documented):
    from pytest_lstmperf import KnownFindingWarning

    torch.manual_seed(0)
    with pytest.warns(KnownFindingWarning, match="known finding on torch-cpu-onednn.*planted: documented") as rec:
        (outcome,) = verify_model(Tagger(), x, device="cpu", paths=["torch-cpu-onednn"])
    assert outcome.ok and outcome.errors and "grad input 0" in outcome.errors
    assert outcome.known and all("[kernel: observed cpu-native]" in k for k in outcome.known)
    assert outcome.bounds["forward"].startswith("cpu-native/fp32 forward")  # the bound of what ran
    assert "numbers checked against the bound of what ran" in str(rec[0].message)


def test_known_finding_never_excuses_numbers_out_of_bound(x, onednn_fallback_documented, monkeypatch):
    _perturb_fp32_outputs(monkeypatch)
    torch.manual_seed(0)
    with pytest.raises(ModelCheckFailed) as failed:
        verify_model(Tagger(), x, device="cpu", paths=["torch-cpu-onednn"])
    text = str(failed.value)
    assert "[kernel]" not in text and "[tolerance] output 0" in text and "cpu-native/fp32 forward tolerance" in text
    assert "known finding (expected, not failed): forward Tagger.lstm call 1, T7 B3: LSTM(6, 8, num_layers=2" in text


def test_known_precision_finding_holds_numbers_to_what_ran(x, monkeypatch):
    """The H100's finding (bf16 autocast runs cuDNN in fp16), replayed on the CPU: a finding planted for the
    CPU bf16 autocast path and its traces relabelled fp16. The departure is reported as the finding, never as
    a precision failure, and every tensor is held to the fp16 bound (tighter than bf16's)."""
    import dataclasses

    from pytest_lstmperf.numerics import verify_torch as own_model
    from pytest_lstmperf.observation import claims as known_findings

    name = "torch-cpu-native-autocast-bf16"
    finding = known_findings.KnownFinding(name, "precision", "fp16", "planted: autocast runs fp16")
    monkeypatch.setattr(known_findings, "KNOWN_FINDINGS", (*known_findings.KNOWN_FINDINGS, finding))
    real_run = own_model._run

    def relabelled(model, inputs, device, dtype, path=None):
        run = real_run(model, inputs, device, dtype, path)
        if path is not None:
            run.traces = [dataclasses.replace(t, precision="fp16") for t in run.traces]
        return run

    monkeypatch.setattr(own_model, "_run", relabelled)
    torch.manual_seed(0)
    model = torch.nn.LSTM(6, 8)
    (outcome,) = verify_model(model, x, device="cpu", paths=[name], raise_on_failure=False)
    assert outcome.known and "[precision: observed fp16]" in outcome.known[0]
    assert not any(m.check in ("kernel", "precision") for m in outcome.mismatches), outcome.report
    assert "/fp16 forward" in outcome.bounds["forward"] and "/fp16 backward" in outcome.bounds["backward"]


def test_verify_model_on_an_unsupported_keras_backend_says_which_are_supported() -> None:
    """Keras on its numpy backend (inference only: no gradients): a clear error that names the backend and the
    supported ones, before any work."""
    import subprocess
    import sys

    code = (
        "import keras, numpy as np, pytest_lstmperf\n"
        "m = keras.Sequential([keras.Input((5, 3)), keras.layers.LSTM(4)])\n"
        "try:\n"
        "    pytest_lstmperf.verify_model(m, np.zeros((2, 5, 3), 'float32'))\n"
        "except ValueError as exc:\n"
        "    print('ERROR', exc)\n"
    )
    env = {**__import__("os").environ, "KERAS_BACKEND": "numpy"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert (
        "ERROR verify_model: Keras on the 'numpy' backend is not supported (supported: tensorflow, torch, jax"
        in out.stdout
    ), out.stdout + out.stderr
