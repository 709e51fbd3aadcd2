"""Keras 3 on the JAX backend: the compiled-HLO kernel trace, the paths, the explainer's JAX rules, and the
planted faults each check must catch (a cuDNN claim on the CPU's XLA loop, a perturbed weight)."""

from __future__ import annotations

import dataclasses
import importlib.util

import numpy as np
import pytest
from forked_pytest import runpytest_forked

from pytest_lstmperf import paths as registry
from pytest_lstmperf.model.spec import LayerSpec
from pytest_lstmperf.numerics.checks import check_against, check_trace
from pytest_lstmperf.observation.explain import explain
from pytest_lstmperf.observation.jax_trace import classify_hlo_ops, hlo_ops, hlo_trace
from pytest_lstmperf.paths.keras.layer import KerasOptions
from pytest_lstmperf.paths.keras.transport import JaxAttempt

_CUDNN_FWD = (
    "  %custom-call.1 = (f32[4,5,16]{2,1,0}, f32[1,4,16]{2,1,0}, f32[1,4,16]{2,1,0}, f32[96]{0}, f32[512]{0}) "
    'custom-call(%x, %h0, %c0, %w, %len), custom_call_target="cudnn_rnn_ffi", api_version=API_VERSION_TYPED_FFI'
)
_CUDNN_BWD = (
    "  %custom-call.2 = (f32[4,5,8]{2,1,0}, f32[1,4,16]{2,1,0}, f32[1,4,16]{2,1,0}, f32[1600]{0}, f32[96]{0}) "
    'custom-call(%dy, %dh, %dc, %x), custom_call_target="cudnn_rnn_bwd_ffi"'
)
_DOT = '  %dot.3 = f32[4,64]{1,0} dot(%h, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, ' \
       'metadata={op_name="jit(call)/while/body/closed_call/lstm_cell/dot_general"}'  # fmt: skip
_DOT_HIGHEST = '  %dot.4 = f32[4,64]{1,0} dot(%h, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, ' \
               'operand_precision={highest,highest}'  # fmt: skip
_TANH = "  %tanh.1 = f32[4,16]{1,0} tanh(%a)"
# a 1x1 layer: XLA rewrites the 1-wide dot into a multiply, whose metadata still names the dot_general
_DOT_AS_MULTIPLY = (
    '  %multiply.2 = f32[1,4]{1,0} multiply(%b, %c), metadata={op_name="jit(call)/lstm_cell/dot_general"}'
)

_LOOP = "  %while.1 = (s32[], f32[4,16]{1,0}) while(%tuple), condition=%cond, body=%body"

needs_jax = pytest.mark.skipif(
    importlib.util.find_spec("jax") is None or importlib.util.find_spec("keras") is None,
    reason="JAX or keras is not installed (pip install 'pytest-lstmperf[jax]')",
)


# ------------------------------------------------------------------------------------------- HLO reading
def test_hlo_ops_name_custom_calls_by_target_and_read_element_types() -> None:
    ops = hlo_ops("\n".join([_CUDNN_FWD, _DOT, _DOT_HIGHEST, _TANH, _LOOP]))
    assert ops == [
        ("cudnn_rnn_ffi", "fp32", False),
        ("dot", "fp32", False),
        ("dot", "fp32", True),
        ("tanh", "fp32", False),
        ("while", "", False),
    ]


@pytest.mark.parametrize(
    "lines, phase, family",
    [
        ([_CUDNN_FWD], "forward", "cudnn"),
        ([_CUDNN_FWD, _CUDNN_BWD], "backward", "cudnn"),
        ([_DOT, _TANH, _LOOP], "forward", "jax-generic"),
        ([_DOT, _TANH], "forward", "jax-generic"),  # unrolled: no while loop, still XLA's loop body
        ([_DOT_AS_MULTIPLY, _TANH], "forward", "jax-generic"),  # T=1, I=H=1: loop and dot simplified away
        ([_CUDNN_FWD, _DOT, _TANH, _LOOP], "forward", "mixed"),
        ([_CUDNN_FWD, _DOT, _TANH, _LOOP], "backward", "jax-generic"),  # forward call alone: generic gradient
        ([_DOT], "forward", "none"),  # a matmul without a cell's non-linearity is no recurrent layer
        ([_LOOP, _TANH], "forward", "none"),
    ],
)
def test_family_from_compiled_hlo(lines: list[str], phase: str, family: str) -> None:
    assert hlo_trace("\n".join(lines), phase).family == family
    assert classify_hlo_ops(frozenset(op for op, _, _ in hlo_ops("\n".join(lines))), phase) == family


def test_precision_tf32_only_where_xla_or_cudnn_may_use_it() -> None:
    generic = "\n".join([_DOT, _TANH, _LOOP])
    assert hlo_trace(generic, tf32_capable=False).precision == "fp32"
    assert hlo_trace(generic, tf32_capable=True).precision == "tf32"
    assert hlo_trace("\n".join([_DOT_HIGHEST, _TANH]), tf32_capable=True).precision == "fp32"
    assert hlo_trace(_CUDNN_FWD, tf32_capable=True, cudnn_tf32=True).precision == "tf32"
    assert hlo_trace(_CUDNN_FWD, tf32_capable=True, cudnn_tf32=False).precision == "fp32"
    assert hlo_trace(_CUDNN_FWD.replace("f32[4,5,16]", "f16[4,5,16]"), tf32_capable=True).precision == "fp16"


# ------------------------------------------------------------------------------------------- explainer
def test_explainer_jax_lstm_is_cudnn_on_a_gpu_and_gru_never() -> None:
    lstm, gru = LayerSpec(cell="lstm"), LayerSpec(cell="gru")
    assert explain(lstm, "keras-jax", "cuda").kernel == "cudnn"
    assert explain(lstm, "jax", "cpu").kernel == "jax-generic"
    verdict = explain(gru, "keras-jax", "cuda")
    assert verdict.kernel == "jax-generic" and [r.rule for r in verdict.reasons] == ["jax_gru"]
    assert "tensorflow or torch" in verdict.reasons[0].change
    masked = LayerSpec(cell="lstm", length_mode="packed", lengths=(5, 5, 3, 1))
    assert [r.rule for r in explain(masked, "keras-jax", "cuda").reasons] == ["jax_mask"]


def test_explainer_jax_use_cudnn_true_raises_for_lstm_not_for_the_fused_gru() -> None:
    forced = KerasOptions(backend="jax", use_cudnn=True, activation="relu")
    assert explain(LayerSpec(cell="lstm"), "keras-jax", "cuda", forced).raises
    gru = explain(LayerSpec(cell="gru"), "keras-jax", "cuda", forced)
    assert gru.raises is None and any("fused GRU scan" in n for n in gru.notes)
    unrolled = KerasOptions(backend="jax", use_cudnn=True, unroll=True)
    assert explain(LayerSpec(cell="gru"), "keras-jax", "cuda", unrolled).raises  # gru() raises for unroll


def test_jax_paths_are_registered_with_a_known_family() -> None:
    names = {n for n, p in registry.all_paths().items() if p.framework == "keras-jax"}
    assert {"keras-jax-cpu", "keras-jax-cudnn", "keras-jax-cuda-generic", "keras-jax-cuda-scan"} <= names
    assert registry.get("keras-jax-cpu").kernel == "jax-generic"
    cudnn = registry.get("keras-jax-cudnn")
    assert cudnn.supports(LayerSpec(cell="lstm")) is None
    assert "not eligible" in (cudnn.supports(LayerSpec(cell="gru")) or "")
    scan = registry.get("keras-jax-cuda-scan")
    assert scan.supports(LayerSpec(cell="gru")) is None and scan.supports(LayerSpec(cell="lstm"))


# ------------------------------------------------------------------------------------------- running paths
def _run(name: str, spec: LayerSpec, case=None):
    from pytest_lstmperf.device import resolve_device
    from pytest_lstmperf.model.case import make_case

    path = registry.get(name)
    device = resolve_device("cpu")
    reason = path.available(device) or path.supports(spec)
    assert reason is None, reason
    return path, path.prepare(case or make_case(spec), device).run()


def _errors(path, spec, result, case=None):
    from pytest_lstmperf.model.case import make_case
    from pytest_lstmperf.model.reference import run_reference
    from pytest_lstmperf.numerics.equivalence import observed_tolerance

    reference = run_reference(case or make_case(spec))
    return check_against(result, reference, spec, "fp32", bound=observed_tolerance(path, spec, result))


SPEC = LayerSpec(cell="lstm", input_size=6, hidden_size=8, num_layers=2, batch=3, seq_len=5, initial_state=True)


@needs_jax
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_cpu_path_runs_an_xla_loop_and_matches_the_reference(cell: str) -> None:
    spec = SPEC.replace(cell=cell)
    path, result = _run("keras-jax-cpu", spec)
    for trace in (result.forward_trace, result.backward_trace):
        assert (trace.family, trace.precision) == ("jax-generic", "fp32"), trace.describe()
        assert "while" in trace.ops and "dot" in trace.ops
    # whose loop ran: Keras's cell loop for the LSTM, the JAX backend's own fused scan for the GRU
    assert ("lstm_cell" in result.forward_trace.detail) == (cell == "lstm"), result.forward_trace.detail
    mismatches, errors = _errors(path, spec, result)
    assert not mismatches, [m.message for m in mismatches]
    assert set(errors) >= {"output", "h_n", "grad x", "grad weight_hh_l1", "grad h0"}


@needs_jax
def test_planted_cudnn_claim_on_the_jax_cpu_path_fails() -> None:
    """A path claiming cuDNN where Keras on JAX runs its XLA loop: the kernel check names what ran."""
    path, result = _run("keras-jax-cpu", SPEC)
    liar = dataclasses.replace(path, kernel="cudnn")
    for trace, pass_ in ((result.forward_trace, "forward"), (result.backward_trace, "backward")):
        found = check_trace(liar.expected(SPEC), trace, pass_)
        assert [m.check for m in found] == ["kernel"]
        assert "expected kernel family 'cudnn', observed 'jax-generic'" in found[0].message


@needs_jax
@pytest.mark.parametrize("eps, fails", [(0.0, False), (2e-5, True)])
def test_planted_weight_perturbation_fails_equivalence(eps: float, fails: bool) -> None:
    """One recurrent weight scaled by 1 + eps before the JAX path gets it, compared with the reference of the
    unperturbed case. Measured on this spec: the output's error is 1.3e-7 clean, 2.4e-7 at 3e-6, 7.0e-7 at 1e-5
    (caught: the fp32 forward bound is 6.6e-7) and 1.4e-6 at 2e-5 (9 tensors out of bound), which the test uses
    to stay clear of the threshold."""
    from pytest_lstmperf.model.case import make_case

    case = make_case(SPEC)
    weights = dict(case.weights)
    weights["weight_hh_l0"] = weights["weight_hh_l0"] * (1 + eps)
    path, result = _run("keras-jax-cpu", SPEC, dataclasses.replace(case, weights=weights))
    mismatches, errors = _errors(path, SPEC, result, case)
    assert bool(mismatches) == fails, (errors, [m.message for m in mismatches])
    if fails:
        assert any(m.check == "tolerance" and m.quantity in ("output", "h_n") for m in mismatches)
    assert np.isfinite(list(errors.values())).all()


# ------------------------------------------------------------------------------------------- explainer vs Keras
_BASE = LayerSpec(cell="lstm", input_size=6, hidden_size=8, batch=3, seq_len=5)
_VARIANTS = [
    ({}, {}),
    ({}, {"use_cudnn": False}),
    ({}, {"use_cudnn": True, "activation": "relu"}),
    ({}, {"recurrent_activation": "hard_sigmoid"}),
    ({}, {"unroll": True}),
    ({"bias": False}, {}),
    ({}, {"recurrent_dropout": 0.25}),
    ({"length_mode": "packed", "lengths": (5, 3, 1)}, {}),
    ({"bidirectional": True}, {}),
    ({"reset_after": False}, {"use_cudnn": True}),
    ({}, {"use_cudnn": True, "unroll": True}),
]
CONFIGS = [
    (_BASE.replace(cell=cell, **spec_changes), KerasOptions(backend="jax", **option_changes))
    for cell in ("lstm", "gru")
    for spec_changes, option_changes in _VARIANTS
    if not (cell == "lstm" and "reset_after" in spec_changes)
]


def _disagreements(observed: list[JaxAttempt], rules=None) -> list[str]:
    found = []
    for (spec, options), seen in zip(CONFIGS, observed, strict=True):
        verdict = explain(spec, "keras-jax", "cuda", options, rules=rules)
        label = f"{spec.short()} [{options.short()}]"
        forced_ok = options.use_cudnn is True and verdict.kernel == "cudnn"  # the recorder's failure would raise
        if not forced_ok and seen.attempted != (verdict.kernel == "cudnn"):
            found.append(f"{label}: predicted {verdict.kernel}, Keras attempted cuDNN: {seen.attempted}")
        if not forced_ok and bool(seen.error) != bool(verdict.raises):
            found.append(f"{label}: predicted raises={verdict.raises!r}, Keras raised {seen.error!r}")
    return found


@pytest.fixture(scope="module")
def keras_decisions() -> list[JaxAttempt]:
    from pytest_lstmperf.paths.keras.pool import get_worker

    configs = [(spec.to_dict(), options.to_dict()) for spec, options in CONFIGS]
    return get_worker("jax").request("jax_probe", configs=configs)


@needs_jax
def test_explainer_agrees_with_keras_jax_cudnn_decision(keras_decisions: list[JaxAttempt]) -> None:
    """On the CPU, Keras's JAX backend is made to believe a GPU is there (and jax.experimental.rnn.lstm is a
    recorder): whether it attempts cuDNN, and whether use_cudnn=True raises, must match the explainer."""
    assert not _disagreements(keras_decisions), "\n".join(_disagreements(keras_decisions))
    attempted = [spec.short() for (spec, _), seen in zip(CONFIGS, keras_decisions, strict=True) if seen.attempted]
    assert attempted and all(s.startswith("lstm") for s in attempted), attempted  # never a GRU
    gru_default = keras_decisions[CONFIGS.index((_BASE.replace(cell="gru"), KerasOptions(backend="jax")))]
    assert gru_default.loop == "backend", gru_default  # the GRU default is the backend's fused scan


@needs_jax
@pytest.mark.parametrize("rule", ["jax_gru", "jax_mask", "unroll"])
def test_explainer_without_a_jax_rule_disagrees_with_keras(keras_decisions: list[dict], rule: str) -> None:
    from pytest_lstmperf.observation.explain import without

    assert _disagreements(keras_decisions, rules=without(rule))


@needs_jax
def test_known_keras_bug_mixed_gru_without_bias_still_raises() -> None:
    """The mixed-precision path refuses GRU(use_bias=False) with the upstream bug's description; this keeps the
    refusal honest: run anyway, the installed keras must still raise the scan's carry TypeError."""
    from pytest_lstmperf.device import resolve_device
    from pytest_lstmperf.model.case import make_case
    from pytest_lstmperf.paths.keras.transport import KerasWorkerError

    path = registry.get("keras-jax-cpu-mixed-bf16")
    spec = LayerSpec(cell="gru", input_size=6, hidden_size=8, batch=3, seq_len=4, bias=False)
    assert "GRU(use_bias=False) under a mixed dtype policy" in (path.supports(spec) or "")
    assert path.supports(spec.replace(bias=True)) is None
    with pytest.raises(KerasWorkerError, match="carry input and carry output must have equal types"):
        path.prepare(make_case(spec), resolve_device("cpu")).run()


def test_prestarted_workers_start_side_by_side_and_fail_with_their_reason() -> None:
    """On a GPU the session starts every Keras worker it will need at once (their imports take seconds each);
    the worker prestarted is the one get_worker hands out, and one that cannot start says why when asked."""
    pytest.importorskip("keras")
    pytest.importorskip("jax")
    from pytest_lstmperf.paths.keras import pool
    from pytest_lstmperf.paths.keras.transport import KerasUnavailable

    pool.prestart(["jax", "no-such-backend"])
    started = pool._STARTING.get("jax") or pool._WORKERS.get("jax")
    assert started is not None
    worker = pool.get_worker("jax")
    assert worker is started and worker.info and worker.info.backend == "jax"
    with pytest.raises(KerasUnavailable, match="no-such-backend"):
        pool.get_worker("no-such-backend")
    assert "no-such-backend" in pool._FAILED
    pool._FAILED.pop("no-such-backend")


def test_shutdown_tells_every_worker_to_exit_before_waiting_for_any(monkeypatch: pytest.MonkeyPatch) -> None:
    """The workers' teardowns run side by side: each is told to exit before the first is waited for."""
    from pytest_lstmperf.paths.keras import pool

    calls = []

    class Worker:
        def __init__(self, name: str) -> None:
            self.name = name

        def ask_to_exit(self) -> None:
            calls.append(("ask", self.name))

        def close(self) -> None:
            calls.append(("close", self.name))

    monkeypatch.setattr(pool, "_WORKERS", {"torch": Worker("torch"), "jax": Worker("jax")})
    monkeypatch.setattr(pool, "_STARTING", {"tensorflow": Worker("tensorflow")})
    pool.shutdown_workers()
    assert [c[0] for c in calls] == ["ask"] * 3 + ["close"] * 3
    assert pool._WORKERS == {} and pool._STARTING == {}


def test_workers_started_together_are_all_ready_and_a_failure_is_kept_for_its_paths(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``start_workers`` (the workload suite's Keras rows) returns only once every worker answered; one that
    cannot start does not stop the others, and its reason waits for the path that asks for it. A pool of its
    own: no worker of an earlier test is already there."""
    pytest.importorskip("keras")
    pytest.importorskip("jax")
    from pytest_lstmperf.paths.keras import pool
    from pytest_lstmperf.paths.keras.transport import KerasUnavailable

    monkeypatch.setattr(pool, "_WORKERS", {})
    monkeypatch.setattr(pool, "_STARTING", {})
    monkeypatch.setattr(pool, "_FAILED", {})
    try:
        pool.start_workers(["no-such-backend", "jax"])
        assert pool._STARTING == {} and set(pool._WORKERS) == {"jax"}
        assert pool._WORKERS["jax"].info.backend == "jax"  # answered before start_workers returned
        assert "no-such-backend" in pool._FAILED
        with pytest.raises(KerasUnavailable, match="no-such-backend"):
            pool.get_worker("no-such-backend")
    finally:
        pool.shutdown_workers()


def test_a_worker_told_to_exit_takes_no_more_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    """Between being told to exit and exiting, a request would read the worker's exit reply as its own."""
    pytest.importorskip("keras")
    from pytest_lstmperf.paths.keras import pool
    from pytest_lstmperf.paths.keras.transport import KerasWorkerError

    monkeypatch.setattr(pool, "_WORKERS", {})
    monkeypatch.setattr(pool, "_STARTING", {})
    try:
        worker = pool.get_worker("torch")
        worker.ask_to_exit()
        with pytest.raises(KerasWorkerError, match="was told to exit"):
            worker.request("hello")
    finally:
        pool.shutdown_workers()


@pytest.mark.parametrize("backend_path", ["keras-torch-cpu", "keras-jax-cpu"])
def test_a_released_run_is_freed_and_the_worker_heap_frozen(backend_path: str) -> None:
    """A Keras worker freezes its long-lived objects (its imports, then what survives each release that leaves
    no run) so that Keras's per-release full collection scans only new objects; a released run must still be
    freed at once, and one still held must not be touched."""
    pytest.importorskip("keras")
    from pytest_lstmperf.device import resolve_device
    from pytest_lstmperf.model.case import make_case

    path = registry.get(backend_path)
    if path.available(resolve_device("cpu")):
        pytest.skip(f"{backend_path}: {path.available(resolve_device('cpu'))}")
    device = resolve_device("cpu")
    spec = LayerSpec(cell="lstm", input_size=4, hidden_size=6, batch=2, seq_len=3)
    held = path.prepare(make_case(spec), device)
    released = path.prepare(make_case(spec.replace(hidden_size=5)), device)
    worker = released.worker
    released.run()
    released.close()  # sent with the next request
    state = worker.request("gc_state")
    assert state.runs >= 1 and state.released_alive == 0, state
    result = held.run()  # the run still held works after a release beside it
    assert result.output.shape == (2, 3, 6)
    held.close()
    state = worker.request("gc_state")
    assert state.released_alive == 0 and state.frozen > 0, state


@needs_jax
def test_xla_cache_hands_a_new_worker_the_executables_an_earlier_one_compiled(tmp_path, monkeypatch) -> None:
    """``--lstmperf-xla-cache``: a second worker process (the next run) loads every executable the first one
    compiled, runs the same numbers, and the kernel trace still reads the loaded executable's HLO."""
    from pytest_lstmperf.paths.keras import pool

    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    folder = tmp_path / "xla"
    monkeypatch.setattr(pool, "_XLA_CACHE", [str(folder)])
    runs = []
    for _ in range(2):  # two workers of their own, not the session's
        monkeypatch.setattr(pool, "_WORKERS", {})
        monkeypatch.setattr(pool, "_STARTING", {})
        try:
            _, result = _run("keras-jax-cpu", SPEC)
        finally:
            pool.shutdown_workers()
        runs.append((sorted(p.name for p in folder.glob("*-cache")), result))
    (first, one), (second, two) = runs
    assert len(first) >= 2, "the first worker cached no forward and training executables"
    assert second == first, "the second worker compiled executables the cache should have served"
    np.testing.assert_array_equal(one.output, two.output)
    assert (two.forward_trace.family, two.backward_trace.family) == ("jax-generic", "jax-generic")
    assert "while" in two.forward_trace.ops


def test_xla_cache_setting_and_header(pytester: pytest.Pytester, monkeypatch, tmp_path) -> None:
    from pytest_lstmperf.paths.keras import pool

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert pool.resolve_xla_cache("auto") == str(tmp_path / "pytest-lstmperf" / "xla")
    assert pool.resolve_xla_cache("off") is None
    monkeypatch.setattr(pool, "_XLA_CACHE", ["/cache"])
    assert pool.xla_cache_env({})["JAX_COMPILATION_CACHE_DIR"] == "/cache"
    assert pool.xla_cache_env({"JAX_COMPILATION_CACHE_DIR": "/mine"}) == {}  # the environment's own wins
    monkeypatch.setattr(pool, "_XLA_CACHE", [None])
    assert pool.xla_cache_env({}) == {}
    # a folder JAX cannot write into: it would compile afresh and keep nothing without a word; the header says so
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    (tmp_path / "a-file").write_text("")
    monkeypatch.setattr(pool, "_XLA_CACHE", [str(tmp_path / "a-file" / "xla")])
    assert f"cannot be used: {tmp_path / 'a-file'} is not a folder" in pool.xla_cache_description()
    monkeypatch.setattr(pool, "_XLA_CACHE", [str(tmp_path / "new" / "xla")])
    assert pool.xla_cache_description().endswith("(empty)")
    monkeypatch.setattr(pool.os, "access", lambda path, mode: False)
    assert f"cannot be created ({tmp_path} is not writable)" in pool.xla_cache_description()
    monkeypatch.setattr(pool, "_XLA_CACHE", [str(tmp_path)])
    description = pool.xla_cache_description()
    assert description.endswith("; not writable: every executable is compiled afresh and none is kept)")
    monkeypatch.undo()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    if importlib.util.find_spec("jax") is None or importlib.util.find_spec("keras") is None:
        return
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    args = ["-p", "no:cacheprovider", "--collect-only", "--device=cpu", "--lstmperf-paths=keras-jax-cpu"]
    result = runpytest_forked(pytester, *args, "--lstmperf-xla-cache=off")
    result.stdout.fnmatch_lines(["*XLA compilation cache of the Keras-on-JAX worker: off*[--lstmperf-xla-cache=off]"])
    result = runpytest_forked(pytester, *args, f"--lstmperf-xla-cache={tmp_path / 'x'}")
    result.stdout.fnmatch_lines([f"*XLA compilation cache of the Keras-on-JAX worker: {tmp_path / 'x'} (empty)*"])
