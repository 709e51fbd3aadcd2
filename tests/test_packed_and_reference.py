"""Packed sequences as first-class calls, and verify_model's own float64 reference (issue 41, items 1-3):

* the observer and the report describe a ``PackedSequence`` call as packed, with its real batch, its lengths in
  the batch's own order and its longest length (also a dense batch handed with ``lengths=`` to a layer that packs
  it itself, pytorch-forecasting's); a layer called on two different sequences gets a row per call;
* ``lstmperf explain ... length_mode=packed --run`` runs the packed spec; the advice to pad names what padding
  changes;
* verify_model judges the claim per call (a packed call on a oneDNN path claims the native kernels), keeps
  lengths on the CPU, and computes its float64 reference of the recurrent layers by the numpy recurrence, so that
  a fault planted in torch's own recurrent kernel (every dtype, float64 included) fails it.
"""

from __future__ import annotations

import contextlib

import pytest

torch = pytest.importorskip("torch")
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence  # noqa: E402

import pytest_lstmperf  # noqa: E402
from pytest_lstmperf.numerics import verify_torch  # noqa: E402
from pytest_lstmperf.numerics.model_judge import call_claim  # noqa: E402
from pytest_lstmperf.numerics.torch_reference import numpy_recurrence  # noqa: E402
from pytest_lstmperf.numerics.verify_model import ModelCheckFailed, verify_model  # noqa: E402

LENGTHS = [6, 3, 5, 2]


class EncoderDecoder(torch.nn.Module):
    """A packed, unsorted encoder LSTM whose state seeds a dense decoder call of the same LSTM (DeepAR's shape)."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = torch.nn.LSTM(3, 8, num_layers=2, batch_first=True)
        self.head = torch.nn.Linear(8, 1)

    def forward(self, history, lengths, horizon):
        packed = pack_padded_sequence(history, lengths, batch_first=True, enforce_sorted=False)
        _, state = self.rnn(packed)
        out, _ = self.rnn(horizon, state)
        return self.head(out)


@pytest.fixture
def inputs():
    generator = torch.Generator().manual_seed(3)
    history = torch.randn(len(LENGTHS), max(LENGTHS), 3, generator=generator)
    return history, torch.tensor(LENGTHS), torch.randn(len(LENGTHS), 4, 3, generator=generator)


def _model() -> EncoderDecoder:
    torch.manual_seed(0)
    return EncoderDecoder()


# ---------------------------------------------------------------------------------------------- observation
def test_report_gives_each_call_its_real_shape(inputs):
    rows = pytest_lstmperf.report(_model(), inputs)
    assert [row.layer for row in rows] == ["rnn", "rnn [call 2]"]
    encoder, decoder = (row.verdict.spec for row in rows)
    assert (encoder.length_mode, encoder.batch, encoder.seq_len, encoder.lengths) == ("packed", 4, 6, tuple(LENGTHS))
    assert (decoder.length_mode, decoder.batch, decoder.seq_len) == ("none", 4, 4)
    assert encoder.num_layers == 2 and rows[0].verdict.kernel == "cpu-native"
    assert not any("pass the whole sequence" in note for row in rows for note in row.verdict.notes)
    assert any("2 different sequences" in note for note in rows[0].verdict.notes)


def test_observer_records_a_packed_call_with_lengths_in_the_batchs_order(inputs):
    history, lengths, _ = inputs
    layer = torch.nn.GRU(3, 5, bidirectional=True, batch_first=True)
    with pytest_lstmperf.observe() as seen:
        layer(pack_padded_sequence(history, lengths, batch_first=True, enforce_sorted=False))
    ((framework, spec, _),) = seen.layers
    assert framework == "torch" and spec.length_mode == "packed"
    assert (spec.batch, spec.seq_len, spec.lengths) == (4, 6, tuple(LENGTHS))


def test_explain_run_runs_the_packed_spec_it_was_given(capsys):
    from pytest_lstmperf import cli

    args = ["explain", "lstm", "input_size=4", "hidden_size=8", "batch=3", "seq_len=5", "length_mode=packed",
            "lengths=5,3,2", "--framework", "torch", "--device", "cpu", "--run"]  # fmt: skip
    cli.main(args)
    out = capsys.readouterr().out
    assert "predicted cpu-native/fp32" in out and "observed: cpu-native/fp32 (matches the prediction)" in out
    assert "padding changes the final state of the shorter sequences" in out


# ---------------------------------------------------------------------------------------------- claims
def test_a_packed_call_on_a_onednn_path_claims_the_native_kernels():
    from pytest_lstmperf import paths as registry
    from pytest_lstmperf.model.spec import LayerSpec

    onednn = registry.get("torch-cpu-onednn")
    several = LayerSpec(batch=3, seq_len=5, length_mode="packed", lengths=(5, 3, 2))
    one = LayerSpec(batch=3, seq_len=5, length_mode="packed", lengths=(5, 5, 5))
    assert call_claim(onednn, several) == ("cpu-native", "fp32")
    assert call_claim(onednn, one) == ("onednn", "fp32")  # a packed batch of one length is dense for PyTorch
    assert call_claim(onednn, several.replace(length_mode="none", lengths=None)) == ("onednn", "fp32")
    assert call_claim(onednn, several.replace(cell="gru")) is None  # no oneDNN GRU: listed, not judged


def test_a_packed_batch_of_one_length_claims_onednn_from_torch_2_13_only(monkeypatch):
    """torch 2.11 ran such a batch on the native kernels (a 16-core Xeon), 2.13 hands it to oneDNN."""
    from pytest_lstmperf import paths as registry
    from pytest_lstmperf.model.spec import LayerSpec
    from pytest_lstmperf.paths import torch_paths

    one = LayerSpec(batch=1, seq_len=1, input_size=1, hidden_size=1, length_mode="packed", lengths=(1,))
    packed, onednn = registry.get("torch-cpu-packed"), registry.get("torch-cpu-onednn")
    for release, kernel in (((2, 11), "cpu-native"), ((2, 12), "cpu-native"), ((2, 13), "onednn"), ((3, 0), "onednn")):
        monkeypatch.setattr(torch_paths, "_torch_release", lambda release=release: release)
        assert packed.expected(one) == (kernel, "fp32"), release
        assert call_claim(onednn, one) == (kernel, "fp32"), release


def test_verify_model_passes_a_correct_packed_encoder_on_every_path(inputs, lstmperf_device):
    """Every path of the device (``--device=cuda``: the lengths given on the CPU stay there, the cuDNN paths run
    the packed call)."""
    outcomes = verify_model(_model(), inputs, device=lstmperf_device, accept_unchecked=["*-autocast-bf16: grad *"])
    checked = [o for o in outcomes if o.skipped is None]
    assert checked and all(o.ok for o in checked)
    if lstmperf_device == "cpu":
        assert any(o.path == "torch-cpu-onednn" for o in checked)


def test_the_dense_call_is_still_held_to_onednn(inputs):
    """oneDNN switched off: the dense decoder call fails the oneDNN claim, the packed encoder call does not."""
    with torch.backends.mkldnn.flags(enabled=False), pytest.raises(ModelCheckFailed) as failed:
        verify_model(_model(), inputs, device="cpu", paths=["torch-cpu-onednn"])
    kernel = [line for line in str(failed.value).splitlines() if "[kernel]" in line]
    assert len(kernel) == 1 and "expected kernel family 'onednn', observed 'cpu-native'" in kernel[0]
    assert "packed" not in kernel[0]


# ---------------------------------------------------------------------------------------------- inputs
def test_lengths_given_on_the_cpu_stay_there():
    lengths = torch.tensor([3, 2])
    assert verify_torch._moved(lengths, "meta", torch.float32).device.type == "cpu"
    assert verify_torch._moved(torch.zeros(2, 3, dtype=torch.long), "meta", torch.float32).device.type == "meta"
    moved = verify_torch._moved(torch.zeros(3), "meta", torch.float64)
    assert moved.device.type == "meta" and moved.dtype == torch.float64


def test_other_layers_run_ieee_fp32_on_cuda_only():
    conv = torch.backends.cudnn.conv.fp32_precision
    matmul = torch.get_float32_matmul_precision()
    with verify_torch.ieee_other_layers(torch, "cuda:0"):
        assert torch.backends.cudnn.conv.fp32_precision == "ieee"
        assert torch.get_float32_matmul_precision() == "highest"
    assert (torch.backends.cudnn.conv.fp32_precision, torch.get_float32_matmul_precision()) == (conv, matmul)
    assert isinstance(verify_torch.ieee_other_layers(torch, "cpu"), contextlib.nullcontext)


# ---------------------------------------------------------------------------------------------- reference
def _outputs_and_grads(module, args):
    module.zero_grad(set_to_none=True)
    leaves = [a.detach().clone().requires_grad_() if a.is_floating_point() else a for a in args]
    out = module(*leaves)
    flat = [t for t in torch.utils._pytree.tree_leaves(out) if torch.is_tensor(t) and t.is_floating_point()]
    weights = torch.Generator().manual_seed(0)
    sum((t * torch.randn(t.shape, generator=weights, dtype=t.dtype)).sum() for t in flat).backward()
    grads = [p.grad for p in module.parameters()] + [
        a.grad for a in leaves if torch.is_tensor(a) and a.grad is not None
    ]
    return [t.detach() for t in flat] + grads


@pytest.mark.parametrize(
    "layer",
    [
        lambda: torch.nn.LSTM(3, 5, num_layers=2, bidirectional=True, batch_first=True),
        lambda: torch.nn.GRU(3, 5, num_layers=2, bidirectional=True),
        lambda: torch.nn.LSTM(3, 5, proj_size=2, bias=False, batch_first=True),
    ],
    ids=["lstm-bi", "gru-bi-time-major", "lstm-proj-nobias"],
)
@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_numpy_recurrence_agrees_with_torchs_float64_kernel(layer, packed, inputs):
    history, lengths, _ = inputs
    torch.manual_seed(0)
    module = layer().double()
    x = history.double() if module.batch_first else history.double().transpose(0, 1)

    class Call(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = module

        def forward(self, x):
            if not packed:
                return self.layer(x)
            out, state = self.layer(pack_padded_sequence(x, lengths, module.batch_first, enforce_sorted=False))
            return pad_packed_sequence(out, module.batch_first)[0], state

    call = Call()
    expected = _outputs_and_grads(call, (x,))
    with numpy_recurrence():
        got = _outputs_and_grads(call, (x,))
    assert len(got) == len(expected)
    assert max(float((a - b).abs().max()) for a, b in zip(got, expected, strict=True)) < 1e-12


def test_numpy_recurrence_covers_cells_and_restores_torch():
    torch.manual_seed(0)
    for cell in (torch.nn.LSTMCell(3, 4).double(), torch.nn.GRUCell(3, 4).double()):
        x = torch.randn(2, 3, dtype=torch.float64)
        expected = _outputs_and_grads(cell, (x,))
        with numpy_recurrence():
            got = _outputs_and_grads(cell, (x,))
        assert max(float((a - b).abs().max()) for a, b in zip(got, expected, strict=True)) < 1e-12
    assert not {"lstm", "gru", "lstm_cell", "gru_cell"} & set(torch._VF.__dict__)


def _planted(monkeypatch, name, change):
    """``torch._VF.<name>`` wrapped by ``change(args) -> args``: a fault in torch's own recurrent kernel, for every
    dtype (the float64 runs included)."""
    original = getattr(torch._VF, name)
    monkeypatch.setattr(torch._VF, name, lambda *args: original(*change(list(args))), raising=False)


def _forget_bias_shifted(args):
    flat_at = 2 if isinstance(args[1], tuple) else 3  # dense (input, hx, flat, ...) / packed (data, sizes, hx, flat)
    flat = list(args[flat_at])
    for i in range(2, len(flat), 4):  # bias_ih of each layer: [i, f, g, o]
        hidden = flat[i].shape[0] // 4
        flat[i] = torch.cat([flat[i][:hidden], flat[i][hidden : 2 * hidden] + 0.5, flat[i][2 * hidden :]])
    args[flat_at] = flat
    return args


def _initial_state_ignored(args):
    at = 1 if isinstance(args[1], tuple) else 2
    args[at] = tuple(torch.zeros_like(h) for h in args[at])
    return args


@pytest.mark.parametrize(
    ("name", "change"),
    [("lstm", _forget_bias_shifted), ("lstm", _initial_state_ignored)],
    ids=["forget-gate-bias-changed", "initial-state-ignored"],
)
def test_a_fault_in_torchs_recurrent_kernel_fails_verify_model(monkeypatch, inputs, name, change, lstmperf_device):
    _planted(monkeypatch, name, change)
    outcomes = verify_model(_model(), inputs, device=lstmperf_device, raise_on_failure=False,
                            accept_unchecked=["*-autocast-bf16: grad *"])  # fmt: skip
    checked = [o for o in outcomes if o.skipped is None]
    assert checked
    for outcome in checked:  # every path of the device runs the planted kernel, and fails on its outputs
        assert any(m.check == "tolerance" and m.quantity == "output 0" for m in outcome.mismatches), outcome.report


def test_a_fault_in_torchs_gru_kernel_fails_verify_model(monkeypatch, inputs):
    original = torch._VF.gru
    monkeypatch.setattr(
        torch._VF, "gru", lambda *args: (lambda r: (r[0] * 1.001, r[1]))(original(*args)), raising=False
    )
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.GRU(3, 6, batch_first=True))
    with pytest.raises(ModelCheckFailed, match=r"path torch-cpu-native .*\n.*\[tolerance\] output 0"):
        verify_model(model, inputs[0], device="cpu", paths=["torch-cpu-native"])


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_a_packed_paths_timed_calls_run_the_layer_alone_on_a_batch_packed_once(cell, monkeypatch):
    """The packed benchmarks time the recurrent call: forward() and train_step() run the layer on the batch packed
    when the run was prepared, and neither packs nor pads (on the 2-core VM packing and padding took about a third
    of the packed gate benchmark, and a 1.5x slower LSTM call read 1.23x there). They compute what run() computes,
    which packs and pads on every call as a model does: the packed output's data, and the same parameter
    gradients."""
    from pytest_lstmperf import paths as registry
    from pytest_lstmperf.device import resolve_device
    from pytest_lstmperf.model.case import make_case
    from pytest_lstmperf.model.spec import LayerSpec

    spec = LayerSpec(cell=cell, input_size=3, hidden_size=4, batch=3, seq_len=5, length_mode="packed",
                     lengths=(5, 2, 4), training=True, batch_first=True)  # fmt: skip
    run = registry.get("torch-cpu-packed").prepare(make_case(spec, 0), resolve_device("cpu"))
    whole = run.run()
    import torch.nn.utils.rnn as rnn

    called: list[str] = []
    for name in ("pack_padded_sequence", "pad_packed_sequence"):
        real = getattr(rnn, name)
        monkeypatch.setattr(rnn, name, lambda *a, _real=real, _name=name, **k: called.append(_name) or _real(*a, **k))
    out, h_n, _ = run.forward()
    padded = torch.from_numpy(whole.output)
    expected = pack_padded_sequence(padded, torch.tensor([5, 2, 4]), batch_first=True, enforce_sorted=False).data
    torch.testing.assert_close(out.double(), expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(h_n.double(), torch.from_numpy(whole.h_n), rtol=1e-6, atol=1e-6)
    run.module.zero_grad(set_to_none=True)
    run.train_step()
    for name, param in run.module.named_parameters():
        torch.testing.assert_close(param.grad.double(), torch.from_numpy(whole.grads[name]), rtol=1e-5, atol=1e-6)
    assert called == []
    # the check can fail: run() packs and pads, and the patched functions see it
    run.run()
    assert called == ["pack_padded_sequence", "pad_packed_sequence"]
