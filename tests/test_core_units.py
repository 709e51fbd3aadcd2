"""Unit tests of the core modules: spec validation, strategies, trace classification, tolerance model, CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_lstmperf.model.spec import LayerSpec, SpecError
from pytest_lstmperf.model.strategies import PROFILES, specs
from pytest_lstmperf.observation.torch_trace import classify_torch_ops, kernel_element_types, precision_from


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
    from pytest_lstmperf.numerics.tolerance import UNIT_ROUNDOFF, growth, tolerance

    small, large = (
        LayerSpec(seq_len=1, hidden_size=1, input_size=1),
        LayerSpec(seq_len=100, hidden_size=256, num_layers=3, bidirectional=True),
    )
    assert growth(small) == pytest.approx(1.0)
    assert growth(large) > 5 * growth(small)
    tol = tolerance("fp32", "forward", large)
    assert tol.rel == pytest.approx(tol.constant * UNIT_ROUNDOFF["fp32"] * growth(large) ** tol.exponent)
    assert "growth^" in tol.explain() and tol.family == "*"
    assert tolerance("fp32", "forward", large, "cpu-native").family == "cpu-native"
    assert tolerance("bf16", "forward", small).rel > 100 * tolerance("fp32", "forward", small).rel
    with pytest.raises(ValueError, match="unknown precision 'fp8' \\(valid: fp64, fp32, tf32, fp16, bf16\\)"):
        tolerance("fp8", "forward", small)


def test_family_fits_and_the_pool_that_keeps_cudnn_fp32_out() -> None:
    from tools.tolerance_calibration import fit_all

    rng = np.random.default_rng(0)

    def samples(kernel: str, scale: float, n: int = 60) -> list[dict]:
        g = rng.uniform(1, 10, n)
        err = scale * 2.0**-24 * g**0.5 * rng.lognormal(0, 0.3, n)
        return [{"kernel": kernel, "precision": "fp32", "pass_": "forward", "growth": float(x), "err": float(e),
                 "spec": f"spec{i}", "normalised": float(e / 2.0**-24 / x)}
                for i, (x, e) in enumerate(zip(g, err, strict=True))]  # fmt: skip

    loaded = {"dev": {"device": "d", "date": "t", "samples": samples("cuda-generic", 1.0) + samples("cudnn", 100.0)}}
    data = fit_all(loaded, {})
    cudnn = data["by_kernel"]["cudnn"]["fp32"]["forward"]
    generic = data["by_kernel"]["cuda-generic"]["fp32"]["forward"]
    pooled = data["by_precision"]["fp32"]["forward"]
    assert cudnn["a"] > 50 * generic["a"]
    assert pooled["n"] == 60 and pooled["a"] == pytest.approx(generic["a"])  # cudnn/fp32 kept out of the pool
    assert "cudnn/fp32" in data["pool_excluded"]
    # a family measured before raw samples were stored keeps its linear constant, labelled legacy
    legacy = {"old": {"device": "o", "date": "t", "by_kernel": {"cudnn": {"fp16": {"forward": {"n": 9, "max": 2.0}}}}}}
    entry = fit_all(loaded, legacy)["by_kernel"]["cudnn"]["fp16"]["forward"]
    assert (entry["a"], entry["b"], entry["legacy"]) == (8.0, 1.0, True)


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

    from pytest_lstmperf.numerics.checks import relative_error

    ref = np.linspace(-1, 1, 50)
    assert relative_error(ref * (1 + eps), ref) == pytest.approx(eps, rel=1e-6)


# ----------------------------------------------------------------------------------------- observation
def test_an_import_blocked_with_none_is_not_taken_for_an_imported_framework(monkeypatch) -> None:
    """``sys.modules[name] = None`` makes ``import name`` fail (a project may block TensorFlow so): the
    observer must not start TensorFlow's trace for it, and still sees the torch layer that ran."""
    import sys

    torch = pytest.importorskip("torch")
    from pytest_lstmperf.observation.calls import observe

    monkeypatch.setitem(sys.modules, "tensorflow", None)
    lstm = torch.nn.LSTM(3, 4)
    with torch.no_grad(), observe() as seen:
        lstm(torch.randn(5, 2, 3))
    assert [t.family for t in seen.all_traces()] in (["onednn"], ["cpu-native"])  # oneDNN where torch has it
    assert seen.traces == [] and seen.problems == []


def test_tolerance_page_is_its_prose_then_what_the_data_hold(tmp_path) -> None:
    """docs/tolerances.md's generated part is what tolerances.json and the sharpness sweeps render (a stale page
    fails), and rendering keeps the page's own prose: an edit of the prose survives a rewrite."""
    from pathlib import Path

    from tools.tolerance_calibration import (
        DATA_FILE,
        GENERATED_FROM,
        SAMPLES_DIR,
        doc_intro,
        load_sharpness,
        render_doc,
    )

    page = Path(__file__).resolve().parents[1] / "docs" / "tolerances.md"
    data, sharpness = json.loads(DATA_FILE.read_text()), load_sharpness(SAMPLES_DIR)
    assert render_doc(data, sharpness, doc_intro(page)) == page.read_text()
    edited = tmp_path / "tolerances.md"
    edited.write_text(page.read_text().replace("# Tolerance model", "# Tolerance model\n\nA new sentence.", 1))
    assert "A new sentence." in render_doc(data, sharpness, doc_intro(edited))
    data["model"]["margin"] = 3.5
    assert "`a` = 3.5 x" in render_doc(data, sharpness, doc_intro(page)).partition(GENERATED_FROM)[2]


DISPATCH_MODES_PROBE = """
import sys
import torch
from pytest_lstmperf.host_counters import host_counters
from pytest_lstmperf.observation.layer_trace import LayerRecorder, torch_layer_trace
from pytest_lstmperf.observation.torch_trace import torch_trace

lstm, x = torch.nn.LSTM(4, 8), torch.randn(3, 2, 4)
seen = []
with torch_trace("cpu", "forward") as traced:
    lstm(x)
seen.append(("kernel trace", traced[0].family != "unknown", "torch._dynamo" in sys.modules))
with torch_layer_trace(LayerRecorder()) as recorder:
    lstm(x)
seen.append(("layer trace", len(recorder.calls), "torch._dynamo" in sys.modules))
counts = host_counters(lambda: lstm(x)[0].sum().backward(), "cpu")
seen.append(("host counters", counts["aten_ops"] > 0, "torch._dynamo" in sys.modules))
print(seen)
"""


def test_tracing_and_counting_a_torch_call_does_not_import_dynamo() -> None:
    """The kernel trace, the layer trace and the host counters dispatch through a ``TorchDispatchMode`` without
    the ``torch._dynamo`` import torch's wrapper of a mode makes on its first op (2.5 s of every fresh process on
    2 cores, a recording's further processes among them). Checked in a fresh interpreter, after each of the
    three: this one imported Dynamo long ago, and where it is imported the wrapper runs as torch made it (every
    other trace and counter test here)."""
    import subprocess
    import sys

    pytest.importorskip("torch")
    done = subprocess.run([sys.executable, "-c", DISPATCH_MODES_PROBE], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == str(
        [("kernel trace", True, False), ("layer trace", 1, False), ("host counters", True, False)]
    ), done.stdout
