"""The torch.compile and ONNX Runtime paths: their traces, their availability reasons, the explainer's rules
for them, and planted faults that each check must catch (a wrong kernel claim, oneDNN disabled behind the
suite's back, a perturbed exported weight)."""

from __future__ import annotations

import dataclasses
import importlib.util
import types
from pathlib import Path

import pytest
from forked_pytest import runpytest_forked

from pytest_lstmperf.model.spec import LayerSpec
from pytest_lstmperf.observation.ort_trace import classify_ort_nodes, trace_from_profile
from pytest_lstmperf.observation.torch_trace import CompiledRun, classify_compiled

REPO = Path(__file__).resolve().parents[1]
SUITES = [str(REPO / "suites" / "test_kernels.py"), str(REPO / "suites" / "test_equivalence.py")]
HAS_ONNX = all(importlib.util.find_spec(n) for n in ("onnx", "onnxscript", "onnxruntime"))
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
needs_onnx = pytest.mark.skipif(
    not HAS_ONNX or importlib.util.find_spec("torch") is None,
    reason="onnx, onnxscript and onnxruntime are not installed (pip install 'pytest-lstmperf[onnx]')",
)


# ------------------------------------------------------------------------------------- classification
# ops and kernels as the profiler reported them (CPU ops from torch 2.13 runs; CUDA kernel names from the
# REFERENCE table of an H100 run)
_EAGER_ONEDNN = ("zeros", "transpose", "clone", "lstm", "mkldnn_rnn_layer", "stack")
_INDUCTOR_CPU_GRU = ("mm", "resolve_conj", "addmm", "expand", "as_strided", "copy_")


def test_compiled_trace_families() -> None:
    ran = CompiledRun(compiled_regions=1)
    # a graph break: the layer ran eagerly (or oneDNN as inductor's extern kernel)
    assert classify_compiled(_EAGER_ONEDNN, (), "cpu", ran) == "onednn"
    # decomposed cells: products inside a compiled graph, no recurrent op
    assert classify_compiled(_INDUCTOR_CPU_GRU, (), "cpu", ran) == "inductor"
    # ... but the same products outside compiled code are no recurrent layer at all
    assert classify_compiled(_INDUCTOR_CPU_GRU, (), "cpu", CompiledRun()) == "none"
    cuda_inductor = ("triton_poi_fused_add_mul_sigmoid_tanh_0", "ampere_sgemm_64x32_sliced1x4_tn")
    assert classify_compiled(("mm",), cuda_inductor, "cuda", ran) == "inductor"
    # a replayed CUDA graph dispatches no ATen op: the kernel names decide
    replay = CompiledRun(compiled_regions=1, graph_replays=1)
    assert classify_compiled((), ("RNN_blockPersist_fp_LSTM<float, float, float>",), "cuda", replay) == "cudnn"
    assert classify_compiled((), ("triton_poi_fused_0",), "cuda", replay) == "inductor"
    assert classify_compiled((), ("elemWiseRNNcell<float>", "triton_poi_fused_0"), "cuda", replay) == "mixed"


def test_ort_node_families() -> None:
    cpu, cuda = "CPUExecutionProvider", "CUDAExecutionProvider"
    assert classify_ort_nodes([("Transpose", cpu), ("LSTM", cpu)]) == "ort-rnn"
    assert classify_ort_nodes([("GRU", cuda), ("Transpose", cpu)]) == "ort-cuda-rnn"
    assert classify_ort_nodes([("LSTM", cuda), ("LSTM", cpu)]) == "mixed"
    assert classify_ort_nodes([("Loop", cpu), ("MatMul", cpu), ("Sigmoid", cpu)]) == "ort-decomposed"
    assert classify_ort_nodes([("Transpose", cpu)]) == "none"
    profile = [
        {"cat": "Session", "name": "model_run"},
        {"cat": "Node", "args": {"op_name": "LSTM", "provider": cpu, "input_type_shape": [{"float": [5, 3, 8]}]}},
    ]
    trace = trace_from_profile(profile)
    assert (trace.family, trace.precision, trace.ops) == ("ort-rnn", "fp32", ("LSTM@CPUExecutionProvider",))
    assert "not observable" in trace.detail


# ------------------------------------------------------------------------------------------- explainer
def test_explainer_torch_compile_rules() -> None:
    from pytest_lstmperf.observation.explain import Context, explain

    spec = LayerSpec()
    cpu = explain(spec, "torch.compile", "cpu")
    assert (cpu.kernel, cpu.precision) == ("onednn", "fp32")
    assert any("graph-breaks on the layer" in n for n in cpu.notes)
    gpu = explain(spec, "torch-compile", "cuda")
    assert gpu.kernel == "cudnn" and gpu.eligible
    decomposed = explain(spec, "torch-compile", "cuda", context=Context(device="cuda", compile_allow_rnn=True))
    assert decomposed.kernel == "inductor"
    assert [r.rule for r in decomposed.reasons] == ["compile_allow_rnn"]
    assert "allow_rnn=True -> False" in decomposed.reasons[0].change


def test_explainer_onnx_rules() -> None:
    from pytest_lstmperf.observation.explain import Context, explain, onnx_export_problems

    assert explain(LayerSpec(training=False), "onnx", "cpu").kernel == "ort-rnn"
    assert onnx_export_problems(LayerSpec()) == []
    packed = LayerSpec(length_mode="packed", lengths=(5, 3, 2, 1))
    assert [p.split(":")[0] for p in onnx_export_problems(packed)] == ["onnx_packed"]
    proj = explain(LayerSpec(hidden_size=16, proj_size=4), "onnxruntime", "cpu")
    assert proj.raises and [r.rule for r in proj.reasons] == ["onnx_proj"]
    no_gpu = explain(LayerSpec(), "onnxruntime", "cuda", context=Context(device="cuda", ort_cuda_provider=False))
    assert no_gpu.kernel == "ort-rnn" and "onnxruntime-gpu" in no_gpu.reasons[0].change


@needs_onnx
@pytest.mark.parametrize(
    ("rule", "spec"),
    [
        ("onnx_packed", LayerSpec(length_mode="packed", lengths=(5, 3, 2, 1), training=False)),
        ("onnx_proj", LayerSpec(hidden_size=16, proj_size=4, training=False)),
    ],
)
def test_onnx_rules_agree_with_the_library(rule: str, spec: LayerSpec) -> None:
    """The export (packed) or the session (proj_size) fails where the rule says so; without the rule the
    explainer would predict a working path, which the library contradicts."""
    from pytest_lstmperf.observation.explain import explain, without

    assert rule in [r.rule for r in explain(spec, "onnxruntime", "cpu").reasons]
    assert explain(spec, "onnxruntime", "cpu", rules=without(rule)).raises is None
    with pytest.raises(Exception) as failure:
        _export_and_run(spec)
    expected = "TorchExportError" if rule == "onnx_packed" else "initial_c"
    assert expected in f"{type(failure.value).__name__} {failure.value}"


def _export_and_run(spec: LayerSpec) -> None:
    import contextlib
    import io
    import tempfile
    import warnings

    import onnxruntime
    import torch
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    lstm = torch.nn.LSTM(spec.input_size, spec.hidden_size, proj_size=spec.proj_size, batch_first=True).eval()

    class Layer(torch.nn.Module):
        def forward(self, x, lengths):  # type: ignore[no-untyped-def]
            if spec.length_mode == "packed":
                packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
                out, _ = lstm(packed)
                return pad_packed_sequence(out, batch_first=True, total_length=spec.seq_len)[0]
            return lstm(x)[0]

    x = torch.randn(spec.batch, spec.seq_len, spec.input_size)
    lengths = torch.tensor(spec.lengths or [spec.seq_len] * spec.batch)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        target = f"{tmp}/layer.onnx"
        torch.onnx.export(Layer(), (x, lengths), target, dynamo=True, verbose=False)
        session = onnxruntime.InferenceSession(target, providers=["CPUExecutionProvider"])
        feed = dict(zip([i.name for i in session.get_inputs()], [x.numpy(), lengths.numpy()], strict=False))
        session.run(None, feed)


# ------------------------------------------------------------------------------------------ availability
@needs_torch
def test_onnx_unavailable_says_which_package_is_missing(monkeypatch) -> None:
    from pytest_lstmperf import paths
    from pytest_lstmperf.device import DeviceInfo
    from pytest_lstmperf.paths import onnx_runtime

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "onnxscript" else real(n, *a))
    reason = paths.get("onnxruntime-cpu").available(DeviceInfo("cpu"))
    assert reason == "onnxscript not installed (pip install 'pytest-lstmperf[onnx]')"
    monkeypatch.undo()
    if HAS_ONNX:
        import onnxruntime

        if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
            reason = onnx_runtime.available(paths.get("onnxruntime-cuda"), DeviceInfo("cuda", 0))
            assert "has no CUDAExecutionProvider" in reason and "onnxruntime-gpu" in reason


@needs_torch
def test_unavailable_onnx_path_is_reported_not_silently_skipped(pytester, monkeypatch) -> None:
    """A machine without the packages: the header names the path and the reason, and each test skips
    with it (a skip, never a pass)."""
    pytester.makepyfile(
        hide_ort="import importlib.util\n"
        "_real = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda n, *a: None if n == 'onnxruntime' else _real(n, *a)\n"
    )
    result = runpytest_forked(pytester,
        "-p", "hide_ort", "-p", "no:cacheprovider", SUITES[0], "--device=cpu", "--lstmperf-paths=onnxruntime-cpu",
        "-rs",
    )  # fmt: skip
    out = result.stdout.str()
    assert "lstmperf: path onnxruntime-cpu unavailable: onnxruntime not installed" in out
    result.assert_outcomes(skipped=2)
    assert "passed" not in out.splitlines()[-1]


# ----------------------------------------------------------------------------- real runs, planted faults
class _Session:
    seed = 0

    def __init__(self) -> None:
        from pytest_lstmperf.device import DeviceInfo

        self.device = DeviceInfo("cpu")


@needs_torch
def test_compiled_path_keeps_onednn_and_reports_the_graph_break() -> None:
    from pytest_lstmperf import paths
    from pytest_lstmperf.model.case import make_case
    from pytest_lstmperf.numerics.equivalence import verify_path

    path = paths.get("torch-compile-cpu")
    spec = LayerSpec(num_layers=2, initial_state=True)
    errors = verify_path(path, spec, _Session())  # kernel, precision and numbers forward and backward
    assert errors["output"] < 1e-5 and "grad weight_hh_l0" in errors
    run = path.prepare(make_case(spec), _Session().device)
    trace = run.trace_forward()
    assert trace.family == "onednn"
    # the finding: a bare layer graph-breaks, so no compiled graph runs at all
    assert "compiled regions run: 0" in trace.detail
    assert "graph breaks while compiling: 1" in trace.detail and "Attempted to wrap RNN" in trace.detail


@needs_torch
def test_profiler_trace_sees_compiled_code_that_a_dispatch_mode_would_turn_off() -> None:
    """Dynamo runs no compiled code under a TorchDispatchMode; the profiler-only trace sees it run."""
    import torch

    from pytest_lstmperf.observation.torch_trace import profiler_trace, torch_trace

    torch._dynamo.reset()
    weight = torch.randn(4, 4)
    fn = torch.compile(lambda x: torch.sigmoid(x @ weight), backend="eager")  # no C++ compiler involved
    x = torch.randn(2, 4)
    fn(x)
    with profiler_trace("cpu", "forward") as traced:
        fn(x)
    assert "compiled regions run: 1" in traced[0].detail and "mm" in traced[0].ops
    from torch._dynamo.utils import counters

    before = dict(counters["stats"])
    with torch_trace("cpu", "forward"):
        torch.compile(lambda x: torch.tanh(x @ weight), backend="eager")(x)
    assert counters["stats"]["unique_graphs"] == before.get("unique_graphs", 0)  # nothing was compiled


@needs_torch
def test_wrong_kernel_claim_fails() -> None:
    from pytest_lstmperf import paths
    from pytest_lstmperf.numerics.equivalence import PathCheckFailed, verify_path

    claims_inductor = dataclasses.replace(paths.get("torch-compile-cpu"), name="claims-inductor", kernel="inductor")
    with pytest.raises(PathCheckFailed) as failure:
        verify_path(claims_inductor, LayerSpec(), _Session(), numbers=False)
    assert "expected kernel family 'inductor', observed 'onednn'" in str(failure.value)


@needs_torch
def test_onednn_disabled_behind_the_back_of_the_compiled_path_fails(pytester) -> None:
    result = runpytest_forked(pytester,
        "-p", "no:cacheprovider", SUITES[0], "--device=cpu", "--lstmperf-paths=torch-compile-cpu",
        "-p", "pytest_lstmperf.testing.faults", "--lstmperf-plant=onednn-off",
        "-x",  # the first kernel test that fails says it; the others would compile more layers to say it again
    )  # fmt: skip
    assert result.ret == 1
    assert "expected kernel family 'onednn', observed 'cpu-native'" in result.stdout.str()


@needs_onnx
def test_onnx_path_matches_the_reference_and_names_what_ran() -> None:
    from pytest_lstmperf import paths
    from pytest_lstmperf.model.case import make_case
    from pytest_lstmperf.numerics.equivalence import verify_path

    path = paths.get("onnxruntime-cpu")
    spec = LayerSpec(num_layers=2, bidirectional=True, initial_state=True, batch_first=False, training=False)
    errors = verify_path(path, spec, _Session())
    assert set(errors) == {"output", "h_n", "c_n"}  # inference: no gradient is claimed checked
    result = path.prepare(make_case(spec), _Session().device).run()
    assert result.backward_trace is None and result.grads == {}
    assert "LSTM@CPUExecutionProvider" in result.forward_trace.ops
    assert any("inference only" in note for note in result.notes)
    assert path.supports(spec.replace(training=True)).startswith("ONNX Runtime runs inference only")


@needs_onnx
def test_wrong_provider_claim_fails() -> None:
    from pytest_lstmperf import paths
    from pytest_lstmperf.numerics.equivalence import PathCheckFailed, verify_path

    claims_cuda = dataclasses.replace(paths.get("onnxruntime-cpu"), name="claims-cuda-ep", kernel="ort-cuda-rnn")
    with pytest.raises(PathCheckFailed) as failure:
        verify_path(claims_cuda, LayerSpec(training=False), _Session(), numbers=False)
    assert "expected kernel family 'ort-cuda-rnn', observed 'ort-rnn'" in str(failure.value)


@needs_onnx
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_perturbed_exported_weight_fails_the_tolerance_check(cell: str) -> None:
    """A 1e-5 relative change of the recurrent weight after export (about 4x the fp32 bound of this shape
    in the output's error) fails; the torch layer itself is untouched."""
    from pytest_lstmperf import paths
    from pytest_lstmperf.numerics.equivalence import PathCheckFailed, verify_path
    from pytest_lstmperf.testing.faults import planted

    path = paths.get("onnxruntime-cpu")
    spec = LayerSpec(cell=cell, num_layers=2, training=False)  # type: ignore[arg-type]
    verify_path(path, spec, _Session())
    with planted("onnx-weight:1e-5"), pytest.raises(PathCheckFailed) as failure:
        verify_path(path, spec, _Session())
    message = str(failure.value)
    assert "[tolerance] output: relative error" in message and "the float64 reference exceeds the" in message


def test_onnx_weight_fault_needs_a_number() -> None:
    from pytest_lstmperf.testing.faults import parse_faults

    assert str(parse_faults("onnx-weight:1e-5")[0]) == "onnx-weight:1e-05"
    with pytest.raises(ValueError, match=r"onnx-weight needs a number, e.g. onnx-weight:1e-3"):
        parse_faults("onnx-weight:x")


@needs_torch
def test_inference_only_path_gets_inference_specs() -> None:
    from hypothesis import given, settings

    from pytest_lstmperf import paths
    from pytest_lstmperf.model.strategies import PROFILES
    from pytest_lstmperf.numerics.equivalence import representative_spec
    from pytest_lstmperf.numerics.path_specs import specs_for_path

    path = paths.get("onnxruntime-cpu")
    assert representative_spec(path) == representative_spec(paths.get("torch-cpu-native")).replace(training=False)
    seen: list[LayerSpec] = []

    @settings(max_examples=10, derandomize=True, database=None)
    @given(specs_for_path(path, PROFILES["ci"].bounds))
    def draw(spec: LayerSpec) -> None:
        seen.append(spec)

    draw()
    assert seen and not any(s.training for s in seen)
    assert all(path.supports(s) is None for s in seen)


def test_bench_params_say_why_an_inference_path_has_no_training_benchmark() -> None:
    from pytest_lstmperf.hooks.bench import run_spec

    path = types.SimpleNamespace(options={"inference_only": True})
    spec = LayerSpec(training=True)
    assert run_spec(path, spec, "forward") == spec.replace(training=False)  # type: ignore[arg-type]
    assert run_spec(path, spec, "train") == spec  # type: ignore[arg-type]


@needs_onnx
def test_explain_run_observes_the_kernel_of_each_new_framework() -> None:
    """``lstmperf explain --run``: each framework's layer runs on its own runner (not Keras's), and the observed
    kernel matches the prediction."""
    from pytest_lstmperf.device import DeviceInfo
    from pytest_lstmperf.paths.config_runs import build_report

    spec = LayerSpec(training=False)
    rows = build_report([("onnxruntime", spec, None), ("torch-compile", spec, None)], DeviceInfo("cpu"), run=True)
    assert [(r.verdict.kernel, r.observed) for r in rows] == [
        ("ort-rnn", "ort-rnn/fp32"),
        ("onednn", "onednn/fp32"),
    ]
