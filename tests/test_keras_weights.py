"""Canonical <-> Keras weight conversion: exact round trips, the GRU gate reorder, and the gradient mapping."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_lstmperf.model.case import make_case
from pytest_lstmperf.model.spec import LayerSpec
from pytest_lstmperf.paths.keras import weights as kw

specs = st.builds(
    LayerSpec,
    cell=st.sampled_from(["lstm", "gru"]),
    input_size=st.integers(1, 6),
    hidden_size=st.integers(1, 6),
    num_layers=st.integers(1, 3),
    bidirectional=st.booleans(),
    bias=st.booleans(),
).flatmap(lambda s: st.just(s) if s.cell == "lstm" else st.booleans().map(lambda r: s.replace(reset_after=r)))


def _random_keras(spec: LayerSpec, rng: np.random.Generator) -> dict:
    return {
        (layer, d): [rng.standard_normal(shape) for shape in kw.expected_keras_shapes(spec, layer)]
        for layer in range(spec.num_layers)
        for d in range(spec.directions)
    }


@settings(max_examples=60, deadline=None)
@given(spec=specs, seed=st.integers(0, 2**16))
def test_keras_to_canonical_to_keras_is_exact(spec: LayerSpec, seed: int) -> None:
    keras = _random_keras(spec, np.random.default_rng(seed))
    back = kw.to_keras(spec, kw.from_keras(spec, keras))
    for key, arrays in keras.items():
        for a, b in zip(arrays, back[key], strict=True):
            assert np.array_equal(a, b)


@settings(max_examples=60, deadline=None)
@given(spec=specs, seed=st.integers(0, 100))
def test_canonical_to_keras_to_canonical(spec: LayerSpec, seed: int) -> None:
    weights = make_case(spec, seed).weights
    back = kw.from_keras(spec, kw.to_keras(spec, weights))
    assert set(back) == set(weights)
    for name, value in weights.items():
        if name.startswith("bias") and not (spec.cell == "gru" and spec.reset_after):
            continue
        assert np.array_equal(back[name], value), name
    if spec.bias and not (spec.cell == "gru" and spec.reset_after):
        # single-bias layouts keep the sum exactly (float64 sum of float32 values)
        for sfx in {n[len("bias_ih") :] for n in weights if n.startswith("bias_ih")}:
            total = weights["bias_ih" + sfx] + weights["bias_hh" + sfx]
            assert np.array_equal(back["bias_ih" + sfx] + back["bias_hh" + sfx], total)
            assert not back["bias_hh" + sfx].any()
    # the normal form is a fixed point
    normal = kw.canonical_normal_form(spec, weights)
    again = kw.canonical_normal_form(spec, normal)
    assert all(np.array_equal(normal[k], again[k]) for k in normal)


def test_gru_gate_order_is_z_r_h() -> None:
    spec = LayerSpec(cell="gru", input_size=1, hidden_size=1)
    weights = {
        "weight_ih_l0": np.array([[1.0], [2.0], [3.0]]),  # canonical r, z, n
        "weight_hh_l0": np.array([[4.0], [5.0], [6.0]]),
        "bias_ih_l0": np.array([7.0, 8.0, 9.0]),
        "bias_hh_l0": np.array([10.0, 11.0, 12.0]),
    }
    kernel, recurrent, bias = kw.layer_to_keras(spec, weights, 0, 0)
    assert kernel.tolist() == [[2.0, 1.0, 3.0]]  # Keras z, r, h
    assert recurrent.tolist() == [[5.0, 4.0, 6.0]]
    assert bias.tolist() == [[8.0, 7.0, 9.0], [11.0, 10.0, 12.0]]


def test_lstm_layout_and_summed_bias() -> None:
    spec = LayerSpec(cell="lstm", input_size=2, hidden_size=1)
    weights = {
        k: np.arange(np.prod(s), dtype=float).reshape(s) + 1
        for k, s in {"weight_ih_l0": (4, 2), "weight_hh_l0": (4, 1), "bias_ih_l0": (4,), "bias_hh_l0": (4,)}.items()
    }
    kernel, recurrent, bias = kw.layer_to_keras(spec, weights, 0, 0)
    assert np.array_equal(kernel, weights["weight_ih_l0"].T)
    assert np.array_equal(recurrent, weights["weight_hh_l0"].T)
    assert np.array_equal(bias, weights["bias_ih_l0"] + weights["bias_hh_l0"])


def test_a_wrong_gate_order_is_caught() -> None:
    """The planted fault: a converter that forgets the GRU reorder breaks the known layout."""
    spec = LayerSpec(cell="gru", input_size=1, hidden_size=1)
    w = np.array([[1.0], [2.0], [3.0]])
    assert (
        kw.layer_to_keras(
            spec, {"weight_ih_l0": w, "weight_hh_l0": w, "bias_ih_l0": w[:, 0], "bias_hh_l0": w[:, 0]}, 0, 0
        )[0].tolist()
        != w.T.tolist()
    )


def test_bias_gradients_go_to_both_canonical_biases() -> None:
    for spec in (LayerSpec(), LayerSpec(cell="gru", reset_after=False)):
        rng = np.random.default_rng(0)
        grads = _random_keras(spec, rng)
        canonical = kw.grads_to_canonical(spec, grads)
        assert np.array_equal(canonical["bias_ih_l0"], canonical["bias_hh_l0"])
    spec = LayerSpec(cell="gru")
    grads = _random_keras(spec, np.random.default_rng(1))
    canonical = kw.grads_to_canonical(spec, grads)
    assert not np.array_equal(canonical["bias_ih_l0"], canonical["bias_hh_l0"])


def test_projection_and_bad_shapes_are_clear_errors() -> None:
    with pytest.raises(kw.KerasLayoutError, match="proj_size"):
        kw.to_keras(LayerSpec(proj_size=4), {})
    spec = LayerSpec()
    bad = {(0, 0): [np.zeros((3, 3))]}
    with pytest.raises(kw.KerasLayoutError, match="expected"):
        kw.from_keras(spec, bad)


def test_a_case_crosses_the_worker_pipe_narrowed_and_comes_back_bit_for_bit() -> None:
    """A case's float64 arrays travel to a Keras worker as float32 where float32 holds their values exactly
    (half the bytes), and come back as the same float64 arrays; an array float32 cannot hold goes as it is."""
    import pickle

    from pytest_lstmperf.paths.keras.transport import narrow, widen

    arrays = ("weights", "x", "h0", "c0", "grad_output", "grad_h_n", "grad_c_n")
    for dtype in ("float32", "bfloat16", "float16"):
        spec = LayerSpec(
            cell="lstm",
            input_size=64,
            hidden_size=128,
            num_layers=2,
            batch=4,
            seq_len=9,
            dtype=dtype,
            initial_state=True,
        )
        case = make_case(spec, 3)
        sent = narrow(case)
        back = pickle.loads(pickle.dumps(widen(pickle.loads(pickle.dumps(sent)))))
        assert len(pickle.dumps(sent)) < 0.6 * len(pickle.dumps(case))
        assert back.spec == case.spec and back.seed == case.seed
        for key in arrays:
            value, came = getattr(case, key), getattr(back, key)
            if key == "weights":
                assert came.keys() == value.keys()
                for name, weight in value.items():
                    assert came[name].dtype == np.float64 and np.array_equal(came[name], weight), name
            elif value is None:
                assert came is None, key
            else:
                assert came.dtype == np.float64 and np.array_equal(came, value), key
        assert case.h0 is not None and case.c0 is not None  # the initial states travel too
    wide = {"x": np.array([0.1, 1.0 / 3.0]), "n": None}  # float32 cannot hold these: sent unchanged
    assert narrow(wide)["x"] is wide["x"] and widen(narrow(wide))["x"] is wide["x"]


def test_the_workers_pipe_carries_typed_requests_and_replies() -> None:
    """A request and a reply round-trip the pipe as themselves; a reply where a request is read (or the reverse)
    is an error naming what came, and a pipe closed mid-message is EOFError."""
    import io

    from pytest_lstmperf.paths.keras.transport import Reply, Request, recv_reply, recv_request, send

    pipe = io.BytesIO()
    send(pipe, Request("build", {"handle": 3}))
    send(pipe, Reply.failed(ValueError("bad shape"), "Traceback ..."))
    pipe.seek(0)
    assert recv_request(pipe) == Request("build", {"handle": 3})
    failed = recv_reply(pipe)
    assert (failed.ok, failed.error, failed.kind, failed.traceback) == (
        False, "ValueError: bad shape", "ValueError", "Traceback ...",
    )  # fmt: skip
    pipe = io.BytesIO()
    send(pipe, Reply(True, {"gpus": []}))
    pipe.seek(0)
    with pytest.raises(TypeError, match="not a request of the Keras worker's pipe: Reply"):
        recv_request(pipe)
    with pytest.raises(EOFError):
        recv_reply(io.BytesIO(pipe.getvalue()[:-3]))


def test_a_worker_answering_with_untyped_records_is_refused_by_name(tmp_path) -> None:
    """The test process reads the worker's hello as a WorkerInfo and a run's answer as a PathResult: a worker of
    another version sending the old string-keyed dicts is refused with what it sent, not read by keys that may be
    missing (a hello of the right type is taken and kept)."""
    import io

    from pytest_lstmperf.paths.keras.paths import KerasRun
    from pytest_lstmperf.paths.keras.pool import WorkerClient
    from pytest_lstmperf.paths.keras.transport import KerasUnavailable, Reply, WorkerInfo, send

    class Exited:
        def __init__(self, reply: Reply) -> None:
            self.stdout = io.BytesIO()
            send(self.stdout, reply)
            self.stdout.seek(0)

        def poll(self) -> int:
            return 0

    def client(reply: Reply) -> WorkerClient:
        worker = object.__new__(WorkerClient)
        worker.backend, worker.info, worker.exit_asked = "torch", None, False
        worker.process = Exited(reply)  # type: ignore[assignment]
        worker.log = open(tmp_path / "worker.log", "w")  # noqa: SIM115 - closed by the client
        return worker

    old = client(Reply(True, {"keras": "3.15.1", "backend": "torch", "gpus": []}))
    with pytest.raises(KerasUnavailable, match=r"said hello with dict, not its WorkerInfo"):
        old.handshake()
    info = WorkerInfo("3.15.1", "torch", gpus=("NVIDIA H200",), torch="2.11.0", cudnn=91900)
    new = client(Reply(True, info))
    assert new.handshake() == info and new.handshake() is new.info  # read once, kept

    class Answers:
        def request(self, cmd: str, **args: object) -> object:
            return {"output": np.zeros(1), "notes": []}

    run = object.__new__(KerasRun)
    run.worker, run.handle = Answers(), None  # type: ignore[assignment]
    with pytest.raises(TypeError, match="the Keras worker's run answered dict, not a PathResult"):
        run.run()
