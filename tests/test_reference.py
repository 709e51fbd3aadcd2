"""The float64 reference against PyTorch in float64, against finite differences, and against planted faults."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_lstmperf.model import reference
from pytest_lstmperf.model.case import Case, make_case, param_names
from pytest_lstmperf.model.reference import ReferenceResult, backward, forward, run_reference
from pytest_lstmperf.model.spec import LayerSpec

ATOL = RTOL = 1e-10

S = LayerSpec
#: specs checked against torch: every feature alone and in combination
TORCH_SPECS = [
    S(),
    S(cell="gru"),
    S(num_layers=2),
    S(num_layers=3, bidirectional=True),
    S(cell="gru", num_layers=3, bidirectional=True, initial_state=True),
    S(bidirectional=True, proj_size=5, initial_state=True),
    S(num_layers=2, proj_size=3, bias=False, length_mode="padded", lengths=(2, 5, 5, 3)),
    S(bias=False, initial_state=True),
    S(cell="gru", bias=False, bidirectional=True),
    S(length_mode="packed", lengths=(3, 5, 1, 4), initial_state=True),
    S(num_layers=2, bidirectional=True, proj_size=4, length_mode="packed", lengths=(5, 2, 5, 1), initial_state=True),
    S(cell="gru", num_layers=2, bidirectional=True, length_mode="packed", lengths=(2, 2, 5, 3), initial_state=True),
    S(cell="gru", num_layers=3, bidirectional=True, bias=False, length_mode="packed", lengths=(1, 5, 4, 2)),
    S(bidirectional=True, length_mode="padded", lengths=(5, 1, 3, 4), initial_state=True),
    S(cell="gru", num_layers=2, bidirectional=True, length_mode="padded", lengths=(4, 5, 2, 2)),
    S(cell="gru", input_size=3, hidden_size=7, batch=1, seq_len=1, bidirectional=True, initial_state=True),
    S(input_size=5, hidden_size=24, num_layers=2, batch=6, seq_len=12, bidirectional=True, dtype="float64"),
]


# --------------------------------------------------------------------------------------- helpers


def _torch_result(case: Case) -> ReferenceResult:
    """Run ``case`` through ``torch.nn.LSTM``/``GRU`` in float64 on the CPU, backward on the canonical loss."""
    torch = pytest.importorskip("torch", reason="torch is needed to check the reference against PyTorch")
    spec = case.spec
    if spec.cell == "lstm":
        module = torch.nn.LSTM(
            spec.input_size,
            spec.hidden_size,
            spec.num_layers,
            bias=spec.bias,
            batch_first=True,
            bidirectional=spec.bidirectional,
            proj_size=spec.proj_size,
        )
    else:
        assert spec.reset_after, "PyTorch has no reset-before GRU"
        module = torch.nn.GRU(
            spec.input_size,
            spec.hidden_size,
            spec.num_layers,
            bias=spec.bias,
            batch_first=True,
            bidirectional=spec.bidirectional,
        )
    module = module.double()
    assert [name for name, _ in module.named_parameters()] == param_names(spec)
    for name in param_names(spec):
        getattr(module, name).data.copy_(torch.tensor(case.weights[name]))

    def leaf(array: np.ndarray) -> torch.Tensor:
        return torch.tensor(np.array(array), dtype=torch.float64, requires_grad=True)

    x = leaf(case.x)
    h0 = leaf(case.h0) if case.h0 is not None else None
    c0 = leaf(case.c0) if case.c0 is not None else None
    state = h0 if spec.cell == "gru" else (None if h0 is None else (h0, c0))
    if spec.length_mode == "packed":
        packed = torch.nn.utils.rnn.pack_padded_sequence(
            x, torch.tensor(spec.lengths), batch_first=True, enforce_sorted=False
        )
        out_packed, final = module(packed, state)
        out, _ = torch.nn.utils.rnn.pad_packed_sequence(out_packed, batch_first=True, total_length=spec.seq_len)
    else:
        out, final = module(x, state)
    h_n, c_n = final if spec.cell == "lstm" else (final, None)
    loss = (out * torch.tensor(case.grad_output)).sum() + (h_n * torch.tensor(case.grad_h_n)).sum()
    if c_n is not None:
        loss = loss + (c_n * torch.tensor(case.grad_c_n)).sum()
    loss.backward()
    grads = {"x": x.grad.numpy()}
    if h0 is not None:
        grads["h0"] = h0.grad.numpy()
    if c0 is not None:
        grads["c0"] = c0.grad.numpy()
    grads.update((name, getattr(module, name).grad.numpy()) for name in param_names(spec))
    c_n_np = None if c_n is None else c_n.detach().numpy()
    return ReferenceResult(out.detach().numpy(), h_n.detach().numpy(), c_n_np, grads)


def _mismatches(expected: ReferenceResult, got: ReferenceResult, atol: float = ATOL, rtol: float = RTOL) -> list[str]:
    """Names of the arrays that differ (or are missing/extra), with the worst error."""
    pairs = {"output": (expected.output, got.output), "h_n": (expected.h_n, got.h_n), "c_n": (expected.c_n, got.c_n)}
    for key in expected.grads.keys() | got.grads.keys():
        pairs[f"grad[{key}]"] = (expected.grads.get(key), got.grads.get(key))
    bad = []
    for name, (a, b) in sorted(pairs.items()):
        if a is None or b is None:
            if a is not b:
                bad.append(f"{name}: present in only one result")
        elif a.shape != b.shape:
            bad.append(f"{name}: shape {a.shape} vs {b.shape}")
        elif not np.allclose(a, b, atol=atol, rtol=rtol):
            bad.append(f"{name}: max abs error {np.max(np.abs(a - b)):.3g}")
    return bad


def _api_result(case: Case) -> ReferenceResult:
    """The reference through the public forward/backward functions, bypassing run_reference's cache."""
    output, h_n, c_n = forward(case.spec, case.weights, case.x, case.h0, case.c0)
    grads = backward(case.spec, case.weights, case.x, case.h0, case.c0, case.grad_output, case.grad_h_n, case.grad_c_n)
    return ReferenceResult(output, h_n, c_n, grads)


def _loss(case: Case, weights: dict[str, np.ndarray], x: np.ndarray, h0: np.ndarray | None, c0: np.ndarray | None):
    output, h_n, c_n = forward(case.spec, weights, x, h0, c0)
    total = np.sum(output * case.grad_output) + np.sum(h_n * case.grad_h_n)
    if c_n is not None:
        total += np.sum(c_n * case.grad_c_n)
    return total


def _check_finite_differences(
    case: Case, grads: dict[str, np.ndarray], samples: int = 3, eps: float = 1e-5, rtol: float = 1e-6
) -> None:
    """Central differences of the canonical loss on ``samples`` random elements of each of ``grads``."""
    rng = np.random.default_rng(1234)
    errors = []
    for key, grad in grads.items():
        for flat in rng.choice(grad.size, size=min(samples, grad.size), replace=False):
            index = np.unravel_index(flat, grad.shape)
            estimates = []
            for sign in (1.0, -1.0):
                weights = dict(case.weights)
                inputs = {"x": case.x, "h0": case.h0, "c0": case.c0}
                if key in inputs:
                    array = inputs[key] = np.array(inputs[key])
                else:
                    array = weights[key] = np.array(weights[key])
                array[index] += sign * eps
                estimates.append(_loss(case, weights, inputs["x"], inputs["h0"], inputs["c0"]))
            numeric = (estimates[0] - estimates[1]) / (2 * eps)
            analytic = grad[index]
            if abs(numeric - analytic) > rtol * max(abs(analytic), 1e-2):
                errors.append(f"{key}{index}: analytic {analytic:.10g} numeric {numeric:.10g}")
    assert not errors, "\n".join(errors)


# --------------------------------------------------------------------------------------- against torch


@pytest.mark.parametrize("spec", TORCH_SPECS, ids=LayerSpec.short)
def test_matches_torch_float64(spec: LayerSpec) -> None:
    case = make_case(spec, seed=3)
    assert _mismatches(_torch_result(case), run_reference(case)) == []


@st.composite
def _specs(draw: st.DrawFn) -> LayerSpec:
    cell = draw(st.sampled_from(["lstm", "gru"]))
    hidden = draw(st.integers(1, 6))
    proj = draw(st.integers(0, hidden - 1)) if cell == "lstm" else 0
    batch, seq_len = draw(st.integers(1, 4)), draw(st.integers(1, 5))
    length_mode = draw(st.sampled_from(["none", "padded", "packed"]))
    lengths = None
    if length_mode != "none":
        drawn = draw(st.lists(st.integers(1, seq_len), min_size=batch, max_size=batch))
        drawn[draw(st.integers(0, batch - 1))] = seq_len
        lengths = tuple(drawn)
    return LayerSpec(
        cell=cell,
        input_size=draw(st.integers(1, 5)),
        hidden_size=hidden,
        num_layers=draw(st.integers(1, 3)),
        bidirectional=draw(st.booleans()),
        proj_size=proj,
        bias=draw(st.booleans()),
        batch=batch,
        seq_len=seq_len,
        length_mode=length_mode,
        lengths=lengths,
        initial_state=draw(st.booleans()),
        dtype="float64",
    )


@settings(max_examples=15, derandomize=True, deadline=None, database=None)
@given(spec=_specs(), seed=st.integers(0, 2**16))
def test_random_specs_match_torch_float64(spec: LayerSpec, seed: int) -> None:
    case = make_case(spec, seed)
    assert _mismatches(_torch_result(case), run_reference(case)) == []


# --------------------------------------------------------------------------------------- finite differences

FD_SPECS = [
    S(
        cell="lstm",
        input_size=3,
        hidden_size=4,
        num_layers=2,
        bidirectional=True,
        proj_size=2,
        batch=3,
        seq_len=4,
        length_mode="packed",
        lengths=(2, 4, 1),
        initial_state=True,
        dtype="float64",
    ),
    S(cell="lstm", input_size=3, hidden_size=4, bias=False, batch=2, seq_len=3, initial_state=True),
    S(
        cell="gru",
        input_size=3,
        hidden_size=4,
        num_layers=2,
        bidirectional=True,
        batch=3,
        seq_len=4,
        length_mode="packed",
        lengths=(4, 1, 3),
        initial_state=True,
        dtype="float64",
    ),
    S(
        cell="gru",
        input_size=3,
        hidden_size=4,
        num_layers=2,
        bidirectional=True,
        batch=3,
        seq_len=4,
        length_mode="packed",
        lengths=(3, 4, 2),
        initial_state=True,
        reset_after=False,
        dtype="float64",
    ),
    S(
        cell="gru",
        input_size=2,
        hidden_size=5,
        bidirectional=True,
        bias=False,
        batch=2,
        seq_len=4,
        length_mode="padded",
        lengths=(4, 2),
        reset_after=False,
    ),
    S(cell="gru", input_size=3, hidden_size=3, num_layers=3, batch=2, seq_len=3, reset_after=False, initial_state=True),
]


@pytest.mark.parametrize("spec", FD_SPECS, ids=LayerSpec.short)
def test_gradients_match_finite_differences(spec: LayerSpec) -> None:
    case = make_case(spec, seed=5)
    _check_finite_differences(case, run_reference(case).grads)


# --------------------------------------------------------------------------------------- contracts


@pytest.mark.parametrize("spec", [*TORCH_SPECS[:6], FD_SPECS[3]], ids=LayerSpec.short)
def test_result_shapes_and_gradient_keys(spec: LayerSpec) -> None:
    case = make_case(spec, seed=0)
    result = run_reference(case)
    states, b, t = spec.num_layers * spec.directions, spec.batch, spec.seq_len
    assert result.output.shape == (b, t, spec.output_size)
    assert result.h_n.shape == (states, b, spec.state_size)
    if spec.cell == "lstm":
        assert result.c_n is not None and result.c_n.shape == (states, b, spec.hidden_size)
    else:
        assert result.c_n is None
    keys = ["x"]
    if spec.initial_state:
        keys += ["h0", "c0"] if spec.cell == "lstm" else ["h0"]
    assert list(result.grads) == keys + param_names(spec)
    assert result.grads["x"].shape == case.x.shape
    for name in param_names(spec):
        assert result.grads[name].shape == case.weights[name].shape
    for key in ("h0", "c0"):
        if key in result.grads:
            assert result.grads[key].shape == getattr(case, key).shape
    for array in (result.output, result.h_n, *result.grads.values()):
        assert array.dtype == np.float64 and not array.flags.writeable


def test_run_reference_is_cached_per_spec_and_seed() -> None:
    spec = S(cell="gru", num_layers=2, bidirectional=True)
    first = run_reference(make_case(spec, seed=11))
    assert run_reference(make_case(spec, seed=11)) is first
    assert run_reference(make_case(spec, seed=12)) is not first
    assert _mismatches(_api_result(make_case(spec, seed=11)), first, atol=0, rtol=0) == []


def test_run_reference_computes_afresh_a_case_with_other_data() -> None:
    case = make_case(S(), seed=0)
    cached = run_reference(case)
    other = dataclasses.replace(case, x=case.x * 2.0)
    fresh = run_reference(other)
    assert not np.allclose(fresh.output, cached.output)
    assert _mismatches(_api_result(other), fresh, atol=0, rtol=0) == []
    assert run_reference(case) is cached


def test_missing_initial_states_are_zeros_and_any_float_dtype_is_accepted() -> None:
    spec = S(bidirectional=True, proj_size=3)
    case = make_case(spec, seed=0)
    states = spec.num_layers * spec.directions
    zeros_h = np.zeros((states, spec.batch, spec.state_size), dtype=np.float32)
    zeros_c = np.zeros((states, spec.batch, spec.hidden_size), dtype=np.float16)
    implicit = forward(spec, case.weights, case.x)
    explicit = forward(spec, {k: v.astype(np.float32) for k, v in case.weights.items()}, case.x, zeros_h, zeros_c)
    for a, b in zip(implicit, explicit, strict=True):
        np.testing.assert_array_equal(a, b)


def test_packed_outputs_are_zero_past_the_length_and_states_end_at_each_length() -> None:
    spec = S(num_layers=2, bidirectional=True, length_mode="packed", lengths=(3, 5, 1, 4))
    result = run_reference(make_case(spec, seed=2))
    size = spec.state_size
    top = (spec.num_layers - 1) * spec.directions
    for b, length in enumerate(spec.lengths):
        assert not result.output[b, length:].any()
        assert np.all(result.output[b, :length] != 0)
        np.testing.assert_array_equal(result.h_n[top, b], result.output[b, length - 1, :size])
        np.testing.assert_array_equal(result.h_n[top + 1, b], result.output[b, 0, size:])


def test_packed_with_full_lengths_equals_unpacked_and_padded_runs_over_padding() -> None:
    base = S(cell="gru", bidirectional=True, num_layers=2, initial_state=True)
    full = run_reference(make_case(base, seed=4))
    packed_full = run_reference(make_case(base.replace(length_mode="packed", lengths=(5,) * 4), seed=4))
    assert _mismatches(full, packed_full, atol=0, rtol=0) == []
    lengths = (5, 2, 3, 1)
    packed = run_reference(make_case(base.replace(length_mode="packed", lengths=lengths), seed=4))
    padded = run_reference(make_case(base.replace(length_mode="padded", lengths=lengths), seed=4))
    assert padded.output[1, 4].any()  # the padded layer still produces output over the zero input
    assert not np.allclose(packed.h_n, padded.h_n)


def test_gru_reset_before_differs_from_reset_after() -> None:
    spec = S(cell="gru", initial_state=True)
    after = run_reference(make_case(spec, seed=0))
    before = run_reference(make_case(spec.replace(reset_after=False), seed=0))
    assert not np.allclose(after.output, before.output)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"x": np.zeros((4, 5, 7))}, "x has shape"),
        ({"h0": np.zeros((1, 4, 15))}, "h0 has shape"),
        ({"weights": {}}, "missing"),
    ],
)
def test_mismatched_inputs_are_rejected(change: dict[str, object], message: str) -> None:
    case = make_case(S(initial_state=True), seed=0)
    args = {"weights": case.weights, "x": case.x, "h0": case.h0, "c0": case.c0, **change}
    with pytest.raises(ValueError, match=message):
        forward(case.spec, **args)


# --------------------------------------------------------------------------------------- planted faults


def _swap_lstm_gates_i_f(monkeypatch: pytest.MonkeyPatch) -> None:
    original = reference._lstm_step_forward

    def swapped(p: reference._Params, x: np.ndarray, h: np.ndarray, c: np.ndarray) -> tuple:
        def perm(a: np.ndarray) -> np.ndarray:
            i, f, g, o = np.split(a, 4, axis=0)
            return np.concatenate([f, i, g, o], axis=0)

        p = dataclasses.replace(p, w_ih=perm(p.w_ih), w_hh=perm(p.w_hh), b_ih=perm(p.b_ih), b_hh=perm(p.b_hh))
        return original(p, x, h, c)

    monkeypatch.setattr(reference, "_lstm_step_forward", swapped)


def _gru_wrong_reset_form(monkeypatch: pytest.MonkeyPatch) -> None:
    original = reference._gru_step_forward
    monkeypatch.setattr(reference, "_gru_step_forward", lambda p, x, h, reset_after: original(p, x, h, not reset_after))


def _lstm_drop_cell_carry(monkeypatch: pytest.MonkeyPatch) -> None:
    original = reference._lstm_step_backward

    def dropped(*args: object) -> tuple:
        dx, dh, dc = original(*args)
        return dx, dh, 0.0 * dc

    monkeypatch.setattr(reference, "_lstm_step_backward", dropped)


def _ignore_lengths(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reference, "_step_mask", lambda spec: np.ones((spec.batch, spec.seq_len), dtype=bool))


@pytest.mark.parametrize(
    ("fault", "spec", "forward_breaks"),
    [
        (_swap_lstm_gates_i_f, S(num_layers=2), True),
        (_gru_wrong_reset_form, S(cell="gru", bidirectional=True), True),
        (_lstm_drop_cell_carry, S(proj_size=4, initial_state=True), False),
        (_ignore_lengths, S(cell="gru", bidirectional=True, length_mode="packed", lengths=(5, 2, 3, 1)), True),
    ],
    ids=["lstm-gate-order", "gru-reset-form", "lstm-backward-cell-carry", "packed-lengths-ignored"],
)
def test_planted_fault_is_caught_by_torch(
    fault: Callable[[pytest.MonkeyPatch], None], spec: LayerSpec, forward_breaks: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = make_case(spec, seed=7)
    expected = _torch_result(case)
    assert _mismatches(expected, _api_result(case)) == []  # the intact reference passes ...
    fault(monkeypatch)
    bad = _mismatches(expected, _api_result(case))  # ... and the faulty one does not
    assert bad
    assert any(name.startswith("output") for name in bad) == forward_breaks
    assert any(name.startswith("grad[") for name in bad)


def test_planted_backward_fault_is_caught_by_finite_differences(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reset-before GRU has no torch counterpart: show that finite differences alone catch a wrong backward."""
    case = make_case(FD_SPECS[3], seed=5)
    original = reference._gru_step_backward
    # the backward of the other GRU form, with the forward left intact
    monkeypatch.setattr(
        reference, "_gru_step_backward", lambda p, cache, dh, grads, reset_after: original(p, cache, dh, grads, True)
    )
    with pytest.raises(AssertionError, match="analytic"):
        _check_finite_differences(case, _api_result(case).grads)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_forward_sequences_runs_each_sequence_over_its_own_length(cell: str) -> None:
    """A dataset's sequences in one loop over time (the longer ones a prefix of the sorted batch) give what
    the reference gives each sequence alone; a bidirectional layer is refused."""
    from pytest_lstmperf.model.reference import forward_reference, forward_sequences

    rng = np.random.default_rng(7)
    lengths = [5, 1, 9, 5, 3, 9, 2]
    spec = LayerSpec(cell=cell, input_size=6, hidden_size=4, num_layers=2, batch=1, seq_len=max(lengths))
    weights = make_case(spec, 3).weights
    sequences = [rng.standard_normal((n, 6)) for n in lengths]
    outputs = forward_sequences(spec, weights, sequences)
    for seq, out in zip(sequences, outputs, strict=True):
        alone = LayerSpec(cell=cell, input_size=6, hidden_size=4, num_layers=2, batch=1, seq_len=len(seq))
        expected, _, _ = forward_reference(alone, weights, seq[None])
        assert out.shape == (len(seq), 4)
        np.testing.assert_allclose(out, expected[0], rtol=0, atol=1e-14)
    with pytest.raises(ValueError, match="unidirectional"):
        forward_sequences(LayerSpec(cell=cell, input_size=6, hidden_size=4, bidirectional=True), weights, sequences)
    with pytest.raises(ValueError, match="missing"):
        forward_sequences(spec, {k: v for k, v in weights.items() if k != "weight_hh_l1"}, sequences)
