"""Unit tests of the core modules: spec validation, strategies, trace classification, tolerance model, CLI."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_lstmperf.spec import LayerSpec, SpecError
from pytest_lstmperf.strategies import PROFILES, specs
from pytest_lstmperf.trace import classify_torch_ops, kernel_element_types, precision_from


# ----------------------------------------------------------------------------------------------- spec
@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"hidden_size": -3}, "hidden_size=-3 (must be an integer >= 1)"),
        ({"input_size": 0}, "input_size=0 (must be an integer >= 1)"),
        ({"proj_size": 16}, "proj_size=16 must be smaller than hidden_size=16"),
        ({"proj_size": True}, "proj_size=True (must be an integer >= 0)"),
        ({"cell": "rnn"}, "cell='rnn' (valid: lstm, gru)"),
        ({"dtype": "int8"}, "dtype='int8' (valid: float32, float64, float16, bfloat16)"),
        ({"cell": "gru", "proj_size": 2}, "proj_size=2 is only defined for LSTM"),
        ({"length_mode": "packed"}, "length_mode='packed' needs lengths"),
        ({"length_mode": "packed", "lengths": (5, 3)}, "2 lengths for batch=4"),
        ({"length_mode": "packed", "lengths": (4, 3, 2, 1)}, "the longest length 4 must equal seq_len=5"),
        ({"reset_after": False}, "reset_after=False is only defined for GRU"),
    ],
)
def test_impossible_specs_are_rejected_with_the_value(changes, message) -> None:
    with pytest.raises(SpecError, match="invalid LayerSpec") as info:
        LayerSpec(**changes)
    assert message in str(info.value)


def test_spec_round_trips_through_dict_and_stays_hashable() -> None:
    spec = LayerSpec(length_mode="packed", lengths=[5, 3, 2, 1], bidirectional=True)  # a list is accepted
    assert isinstance(spec.lengths, tuple)
    assert LayerSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert hash(spec) == hash(LayerSpec.from_dict(spec.to_dict()))
    with pytest.raises(SpecError, match="unknown LayerSpec fields"):
        LayerSpec.from_dict({"cell": "lstm", "hiden_size": 3})


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_generated_specs_are_valid_and_within_the_profile_bounds(name) -> None:
    bounds = PROFILES[name].bounds

    @settings(max_examples=60, derandomize=True, deadline=None, database=None)
    @given(spec=specs(bounds))
    def check(spec: LayerSpec) -> None:
        assert bounds.fits(spec)
        assert spec.hidden_size <= bounds.max_hidden and spec.num_layers <= bounds.max_layers
        if spec.lengths is not None:
            assert max(spec.lengths) == spec.seq_len and len(spec.lengths) == spec.batch

    check()


# ----------------------------------------------------------------------------------------------- trace
@pytest.mark.parametrize(
    ("ops", "device", "family"),
    [
        (["aten::lstm", "aten::_cudnn_rnn"], "cuda", "cudnn"),
        (["aten._cudnn_rnn_backward.default"], "cuda", "cudnn"),
        (["mkldnn_rnn_layer"], "cpu", "onednn"),
        (["mm", "_thnn_fused_lstm_cell"], "cuda", "cuda-generic"),
        (["addmm", "sigmoid_", "tanh_"], "cpu", "cpu-native"),
        (["addmm", "sigmoid_", "tanh_"], "cuda", "cuda-generic"),
        (["zeros", "transpose"], "cpu", "none"),
        (["_cudnn_rnn", "mkldnn_rnn_layer"], "cpu", "mixed"),
    ],
)
def test_kernel_family_from_ops(ops, device, family) -> None:
    assert classify_torch_ops(ops, device) == family


def test_precision_from_element_types_and_kernel_names() -> None:
    assert precision_from(["fp32"], ["void elemWiseRNNcell<float, float, float, 2, 2>"]) == "fp32"
    assert precision_from(["fp32"], ["cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4"]) == "tf32"
    assert precision_from(["fp32"], ["sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize64x64x32"]) == "tf32"
    assert precision_from(["fp16", "fp32"], []) == "fp16"
    assert precision_from([], []) == "unknown"
    assert kernel_element_types(["RNN_blockPersist_fp_GRU<__half, __half, float, 64>"]) == {"fp16"}


# ----------------------------------------------------------------------------------------------- tolerance
def test_tolerance_grows_with_the_problem_and_names_its_basis() -> None:
    from pytest_lstmperf.tolerance import UNIT_ROUNDOFF, growth, tolerance

    small, large = (
        LayerSpec(seq_len=1, hidden_size=1, input_size=1),
        LayerSpec(seq_len=100, hidden_size=256, num_layers=3, bidirectional=True),
    )
    assert growth(small) == pytest.approx(1.0)
    assert growth(large) > 5 * growth(small)
    tol = tolerance("fp32", "forward", large)
    assert tol.rel == pytest.approx(tol.constant * UNIT_ROUNDOFF["fp32"] * growth(large))
    assert "C = 4 x max measured" in tol.explain()
    assert tolerance("bf16", "backward", large).rel > 100 * tolerance("fp32", "backward", large).rel
    with pytest.raises(ValueError, match="unknown precision 'fp8' \\(valid: fp64, fp32, tf32, fp16, bf16\\)"):
        tolerance("fp8", "forward", small)


def test_excluded_family_is_measured_but_kept_out_of_the_bound(tmp_path) -> None:
    from pytest_lstmperf.device import DeviceInfo
    from pytest_lstmperf.measure import merge_into_file

    def sample(kernel: str, value: float) -> dict:
        return {"kernel": kernel, "precision": "fp32", "pass_": "forward", "normalised": value}

    target = tmp_path / "tolerances.json"
    device = DeviceInfo("cuda", 0, {"gpu": "Test GPU", "capability": "9.0", "cuda": "13", "cudnn": "9", "torch": "2"})
    data = merge_into_file(device, [sample("cuda-generic", 2.0), sample("cudnn", 140.0)], target)
    assert data["constants"]["fp32"]["forward"]["max_normalised"] == 2.0
    assert data["by_kernel"]["cudnn"]["fp32"]["forward"]["max_normalised"] == 140.0
    assert "cudnn/fp32" in data["excluded"]
    # a second device merges in; the bound is the largest over devices
    other = DeviceInfo("cpu", None, {"cpu": "Test CPU", "threads": "2", "torch": "2"})
    data = merge_into_file(other, [sample("onednn", 3.0)], target)
    assert data["constants"]["fp32"]["forward"]["max_normalised"] == 3.0
    assert json.loads(target.read_text())["constants"] == data["constants"]


# ----------------------------------------------------------------------------------------------- CLI
def test_cli_paths_lists_claims_and_availability(capsys) -> None:
    pytest.importorskip("torch")
    from pytest_lstmperf.cli import main

    assert main(["paths", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "torch-cpu-onednn" in out and "onednn" in out and "available" in out
    assert "torch-cudnn-fp32" in out and "other device" in out


def test_cli_paths_rejects_a_bad_device(capsys) -> None:
    from pytest_lstmperf.cli import main

    assert main(["paths", "--device", "tpu"]) == 2
    assert "invalid device 'tpu' (valid: auto, cpu, cuda, cuda:N)" in capsys.readouterr().err


@settings(max_examples=30, deadline=None, database=None, derandomize=True)
@given(st.floats(min_value=1e-6, max_value=1e-1))
def test_relative_error_sees_any_relative_perturbation(eps) -> None:
    import numpy as np

    from pytest_lstmperf.checks import relative_error

    ref = np.linspace(-1, 1, 50)
    assert relative_error(ref * (1 + eps), ref) == pytest.approx(eps, rel=1e-6)
