"""The explainer: its rules, its errors, and its agreement with Keras's own eligibility checks.

Agreement: on CPU, ``keras.src.backend.tensorflow.rnn._is_gpu_available`` is replaced by ``lambda: True`` in
the TensorFlow worker while a layer is traced (nothing runs), so the graph Keras builds is the one it would
build on a GPU: its layer gate (``use_cudnn``, ``recurrent_dropout``), ``cudnn_ok`` and the ``use_cudnn=True``
error decide. The explainer must predict the same for every hypothesis-generated configuration.
"""

from __future__ import annotations

import importlib.util

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_lstmperf.model.case import make_case
from pytest_lstmperf.model.spec import LayerSpec, SpecError
from pytest_lstmperf.observation import explain as ex
from pytest_lstmperf.paths.keras.layer import KerasOptions, KerasOptionsError, unsupported
from pytest_lstmperf.paths.keras.transport import GraphProbe

GPU = ex.Context(device="cuda", gpu_visible=True, capability=(9, 0), cudnn_version=91900)


def test_eligible_layer_has_no_reasons() -> None:
    verdict = ex.explain(LayerSpec(), "keras-tensorflow", "cuda", context=GPU)
    assert verdict.kernel == "cudnn" and verdict.eligible and not verdict.reasons
    assert verdict.precision == "tf32"
    assert "keras 3.15.1" in verdict.rules_from


def test_every_reason_with_its_change_and_cost() -> None:
    options = KerasOptions(activation="relu", recurrent_dropout=0.1, unroll=True)
    verdict = ex.explain(LayerSpec(bias=False), "keras-tensorflow", "cuda", options, context=GPU)
    rules = [r.rule for r in verdict.reasons]
    assert rules == ["recurrent_dropout", "activation", "unroll", "use_bias"]
    assert verdict.kernel == "tf-generic"
    rd = verdict.reasons[0]
    assert rd.change == "recurrent_dropout=0.1 -> 0"
    assert "loses recurrent dropout" in rd.cost and "dropout" in rd.cost
    assert all(r.source.startswith("keras/src/") for r in verdict.reasons)
    text = verdict.describe()
    assert "activation='relu' -> 'tanh'" in text


def test_use_cudnn_true_raises_on_tensorflow_but_not_on_torch() -> None:
    options = KerasOptions(use_cudnn=True, activation="relu")
    tf_verdict = ex.explain(LayerSpec(), "keras-tensorflow", "cuda", options, context=GPU)
    assert tf_verdict.raises and "use_cudnn=True" in tf_verdict.raises
    torch_verdict = ex.explain(LayerSpec(), "keras-torch", "cuda", options, context=GPU)
    assert torch_verdict.raises is None and torch_verdict.kernel == "cuda-generic"
    assert any("does not raise" in n for n in torch_verdict.notes)
    # a mask does raise on the torch backend (lstm() raises NotImplementedError)
    packed = LayerSpec(length_mode="packed", lengths=(5, 4, 3, 2))
    assert ex.explain(packed, "keras-torch", "cuda", KerasOptions(use_cudnn=True), context=GPU).raises


def test_masks_per_backend() -> None:
    packed = LayerSpec(length_mode="packed", lengths=(5, 4, 3, 2))
    assert ex.explain(packed, "keras-tensorflow", "cuda", context=GPU).kernel == "cudnn"
    left = ex.explain(packed, "keras-tensorflow", "cuda", KerasOptions(mask="left"), context=GPU)
    assert left.kernel == "cudnn" and left.raises and "InvalidArgumentError" in left.raises
    torch_verdict = ex.explain(packed, "keras-torch", "cuda", context=GPU)
    assert torch_verdict.kernel == "cuda-generic" and [r.rule for r in torch_verdict.reasons] == ["torch_mask"]


def test_cpu_predictions() -> None:
    assert ex.explain(LayerSpec(), "keras-tensorflow", "cpu").kernel == "tf-generic"
    assert ex.explain(LayerSpec(), "keras-torch", "cpu").kernel == "cpu-native"
    assert ex.explain(LayerSpec(), "torch", "cpu").kernel == "onednn"
    assert ex.explain(LayerSpec(cell="gru"), "torch", "cpu").kernel == "cpu-native"
    assert ex.explain(LayerSpec(), "torch", "cuda", context=GPU).kernel == "cudnn"
    off = ex.Context(device="cuda", capability=(9, 0), cudnn_enabled=False)
    assert ex.explain(LayerSpec(), "keras-torch", "cuda", context=off).kernel == "cuda-generic"


def test_fix_all_makes_the_layer_eligible() -> None:
    spec = LayerSpec(cell="gru", bias=False, reset_after=False)
    options = KerasOptions(activation="relu", recurrent_dropout=0.2, use_cudnn=False, unroll=True)
    verdict = ex.explain(spec, "keras-tensorflow", "cuda", options, context=GPU)
    fixed_spec, fixed_options = ex.fix_all(spec, options, verdict)
    assert ex.explain(fixed_spec, "keras-tensorflow", "cuda", fixed_options, context=GPU).eligible


def test_bad_input_is_a_clear_error() -> None:
    with pytest.raises(ex.ExplainError, match="valid: keras-tensorflow, keras-torch, keras-jax, torch"):
        ex.explain(LayerSpec(), "mxnet")
    with pytest.raises(KerasOptionsError, match="not a Keras activation"):
        KerasOptions(activation="relux")
    with pytest.raises(ex.ExplainError, match="proj_size"):
        ex.explain(LayerSpec(proj_size=4), "keras-tensorflow")
    with pytest.raises(ex.ExplainError, match="reset-after only"):
        ex.explain(LayerSpec(cell="gru", reset_after=False), "torch")
    with pytest.raises(SpecError):
        LayerSpec(hidden_size=0)
    with pytest.raises(ex.ExplainError, match="unknown device"):
        ex.explain(LayerSpec(), "keras", "tpu")


def test_version_drift_is_noted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ex, "installed_versions", lambda: {"keras": "3.99.0", "tensorflow": None, "torch": None})
    verdict = ex.explain(LayerSpec(), "keras-tensorflow", "cpu")
    assert any("installed keras 3.99.0" in n for n in verdict.notes)


# ------------------------------------------------------------------------------- agreement with Keras
needs_tf = pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is None or importlib.util.find_spec("keras") is None,
    reason="TensorFlow and keras are needed to read Keras's own checks (pip install tensorflow-cpu keras)",
)

keras_configs = st.tuples(
    st.builds(
        LayerSpec,
        cell=st.sampled_from(["lstm", "gru"]),
        input_size=st.just(3),
        hidden_size=st.just(4),
        batch=st.just(3),
        seq_len=st.just(4),
        bias=st.booleans(),
        bidirectional=st.booleans(),
    ).flatmap(
        lambda s: st.tuples(st.booleans(), st.booleans()).map(
            lambda rp: s.replace(
                reset_after=rp[0] or s.cell == "lstm",
                **({"length_mode": "packed", "lengths": (4, 2, 1)} if rp[1] else {}),
            )
        )
    ),
    st.builds(
        KerasOptions,
        use_cudnn=st.sampled_from(["auto", True, False]),
        activation=st.sampled_from(["tanh", "tanh", "relu"]),
        recurrent_activation=st.sampled_from(["sigmoid", "sigmoid", "hard_sigmoid"]),
        recurrent_dropout=st.sampled_from([0.0, 0.0, 0.2]),
        unroll=st.booleans(),
    ),
)


def keras_own_verdict(spec: LayerSpec, options: KerasOptions) -> GraphProbe:
    from pytest_lstmperf.paths.keras.pool import get_worker

    return get_worker("tensorflow").request("graph_probe", options=options.to_dict(), case=make_case(spec))


def disagreement(spec: LayerSpec, options: KerasOptions, rules=None) -> str | None:
    verdict = ex.explain(spec, "keras-tensorflow", "cuda", options, context=GPU, rules=rules)
    keras = keras_own_verdict(spec, options)
    config = f"{spec.short()} [{options.short()}]"
    if verdict.raises and verdict.raises.startswith("ValueError"):
        if not (keras.error or "").startswith("ValueError"):
            return f"{config}: explainer predicts {verdict.raises!r}, Keras built {keras}"
        return None
    if keras.error:
        return f"{config}: Keras raised {keras.error}, explainer predicts {verdict.kernel}"
    if keras.family != verdict.kernel:
        return f"{config}: explainer predicts {verdict.kernel}, Keras's graph holds {keras.family}"
    function_rules = {"activation", "recurrent_activation", "unroll", "use_bias", "reset_after"}
    predicted_ok = not function_rules & {r.rule for r in verdict.reasons}
    if keras.cudnn_ok != predicted_ok:
        return f"{config}: cudnn_ok() is {keras.cudnn_ok}, explainer's function-level rules say {predicted_ok}"
    return None


@needs_tf
@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(config=keras_configs)
def test_explainer_agrees_with_keras_own_checks(config: tuple[LayerSpec, KerasOptions]) -> None:
    spec, options = config
    if unsupported(spec, options):
        return
    problem = disagreement(spec, options)
    assert problem is None, problem


@needs_tf
@pytest.mark.parametrize(
    ("rule", "spec", "options"),
    [
        ("unroll", LayerSpec(), KerasOptions(unroll=True)),
        ("recurrent_dropout", LayerSpec(), KerasOptions(recurrent_dropout=0.2)),
        ("reset_after", LayerSpec(cell="gru", reset_after=False), KerasOptions()),
        ("activation", LayerSpec(), KerasOptions(activation="relu")),
    ],
)
def test_planted_fault_a_removed_rule_disagrees(rule: str, spec: LayerSpec, options: KerasOptions) -> None:
    assert disagreement(spec, options) is None
    problem = disagreement(spec, options, rules=ex.without(rule))
    assert problem is not None and spec.short() in problem


# ------------------------------------------------------------------------------- CLI and report
def test_cli_explain_prints_reasons(capsys: pytest.CaptureFixture[str]) -> None:
    from pytest_lstmperf.cli import main

    assert main(["explain", "lstm", "units=128", "activation=relu", "-f", "keras-torch", "-d", "cuda"]) == 0
    out = capsys.readouterr().out
    assert "predicted cuda-generic" in out and "activation='relu' -> 'tanh'" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["explain", "lstm", "activation=relux"], "not a Keras activation"),
        (["explain", "lstm", "foo=1"], "unknown layer keys ['foo']"),
        (["explain", "lstm", "-f", "mxnet"], "unknown framework 'mxnet'"),
        (["explain", "lstm", "units=0"], "hidden_size=0"),
        (["explain", "lstm", "proj_size=4"], "proj_size"),
        (["report", "/nonexistent/configs.json"], "cannot read"),
    ],
)
def test_cli_bad_input_is_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    from pytest_lstmperf.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_report_table_has_sources(tmp_path) -> None:
    import json

    from pytest_lstmperf.observation.eligibility import build_report, render_table
    from pytest_lstmperf.observation.model_configs import load_configs

    configs = tmp_path / "configs.json"
    configs.write_text(json.dumps([
        {"framework": "keras-torch", "cell": "lstm", "units": 128, "recurrent_dropout": 0.1},
        {"framework": "torch", "cell": "gru"},
    ]))  # fmt: skip
    rows = build_report(load_configs(str(configs)), ex.Context(device="cuda", capability=(9, 0)).device)
    table = render_table(rows)
    assert "~126x" in table and "H100" in table
    assert "| torch gru" in table
