"""Keras 3 on the JAX backend, inside the Keras worker whose ``KERAS_BACKEND`` is ``jax``.

The layer stack is called functionally: its variables are bound to explicit arrays through
``keras.StatelessScope`` (as Keras's own JAX trainer does), so that the forward call and the training step
are ``jax.jit`` functions of (weights, input, initial states), and gradients come from ``jax.vjp`` against
the case's output seeds. What each compiles to is read from the compiled HLO
(:mod:`pytest_lstmperf.observation.jax_trace`), so the trace is of the very executable that is timed.

Placement: every argument is committed to the path's device (``jax.devices("gpu"|"cpu")[0]``), so XLA
compiles for it. Keras's cuDNN test (``keras/src/backend/jax/rnn.py`` ``_is_gpu_available``) asks for JAX's
*default* backend, not for the arrays' device: on a GPU machine with a CUDA build of JAX it answers yes for a
CPU run too, and the CPU run's LSTM went to the cuDNN primitive, which has no CPU lowering (``NotImplementedError:
MLIR translation rule for primitive 'rnn_fwd' not found for platform cpu``). A CPU run is therefore pinned to the
CPU (:func:`.runners.jax_pinned`): JAX's default device is the CPU, and Keras's cuDNN test answers no, while the
layer is built and traced.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from ...host_counters import cuda_profile
from ...meters import xla_device_time
from ...model.case import make_case
from ...model.keras_options import KerasOptions
from ...model.spec import LayerSpec
from ...observation.jax_trace import cudnn_allows_tf32, hlo_trace, tf32_capable
from .. import PathResult
from .runners import BackendRunner, LocalKerasRun, jax_pinned
from .transport import JaxAttempt, WorkerInfo


def hello() -> WorkerInfo:
    """What the worker reports at start: versions, devices, and whether jaxlib's cuDNN RNN is linked."""
    import jax
    import keras

    gpus = [d for d in jax.devices() if d.platform == "gpu"] if jax.default_backend() == "gpu" else []
    try:
        from jax._src.lib import gpu_rnn

        # defined only where the CUDA (or ROCm) plugin's RNN library loaded
        cudnn_rnn = bool(gpus) and hasattr(gpu_rnn, "compute_rnn_workspace_reserve_space_sizes")
    except ImportError:
        cudnn_rnn = False
    return WorkerInfo(
        keras.__version__,
        keras.backend.backend(),
        gpus=tuple(getattr(d, "device_kind", str(d)) for d in gpus),
        jax=jax.__version__,
        default_backend=jax.default_backend(),
        cudnn_rnn=cudnn_rnn,
    )


def preload_device_timing() -> None:
    """Prepare what a GPU call's device time needs here, once the worker has said hello and while the session
    runs its other tests, rather than inside the first Keras-on-JAX benchmark's measurement: torch's profiler
    (about 3 s of imports on the H100) and CUPTI's first start (one empty profiling session: 1-2 s there).
    Without torch or its CUDA profiling nothing is done (the device time then says why it fell back)."""
    try:
        cuda_profile(lambda: None)
    except Exception:  # any failure is the device time's to report, when it is asked for
        return


def _device(kind: str) -> Any:
    import jax

    return jax.devices("gpu" if kind == "cuda" else "cpu")[0]


class JaxRunner(BackendRunner):
    """``forward``/``train_step`` as jitted functions of explicit arrays; the owner is a ``LocalKerasRun``."""

    def __init__(self, owner: LocalKerasRun) -> None:
        import jax
        import keras

        self.jax = jax
        self.owner = owner
        dtype = owner.spec.dtype
        self.dev = _device(owner.device)
        self.tf32 = tf32_capable(self.dev)
        put = lambda a: jax.device_put(np.asarray(a, dtype=dtype), self.dev)  # noqa: E731
        self.variables = owner.stack.variables()
        self.params = [jax.device_put(v.value, self.dev) for v in self.variables]
        self.x = put(owner.x_np)
        self.mask = None if owner.mask_np is None else jax.device_put(owner.mask_np, self.dev)
        states = owner.states_np()
        self.states = None if states is None else [put(s) for s in states]
        self.seeds = [put(s) for s in owner.seeds_np()]
        stack, training, variables = owner.stack, owner.options.call_training, self.variables

        def call(params: list, x: Any, states: list | None) -> tuple:
            per = None if states is None else [[s[i] for i in range(s.shape[0])] for s in states]
            with keras.StatelessScope(state_mapping=list(zip(variables, params, strict=True))):
                out, hs, cs = stack.call(x, self.mask, per, training)
            return out, hs, cs

        def train(params: list, x: Any, states: list | None) -> tuple:
            outs, pullback = jax.vjp(call, params, x, states)
            out, hs, cs = outs
            seeds = (self.seeds[0], [self.seeds[1][i] for i in range(len(hs))],
                     [self.seeds[2][i] for i in range(len(cs))] if cs else [])  # fmt: skip
            # a mixed-precision layer returns 16-bit tensors: each seed takes its output's dtype
            cotangent = jax.tree.map(lambda seed, value: seed.astype(value.dtype), seeds, (out, hs, cs))
            return outs, pullback(cotangent)

        self.functions = {"forward": jax.jit(call), "backward": jax.jit(train)}
        self.args = (self.params, self.x, self.states)
        self.compiled: dict[str, Any] = {}
        self.lowered_text: dict[str, str] = {}
        self.last: Any = None

    def _executable(self, phase: str) -> Any:
        """The XLA executable of the forward call or the training step, compiled once: the trace reads the
        same executable that runs and is timed."""
        if phase not in self.compiled:
            with jax_pinned(self.owner.device):  # tracing runs the layer's Python: Keras's cuDNN test among it
                lowered = self.functions[phase].lower(*self.args)
            self.compiled[phase] = lowered.compile()
            self.lowered_text[phase] = lowered.as_text(dialect="hlo")
        return self.compiled[phase]

    def _trace(self, phase: str) -> Any:
        text = self._executable(phase).as_text()
        return hlo_trace(text, phase, tf32_capable=self.tf32, cudnn_tf32=cudnn_allows_tf32(),
                         program=self.lowered_text[phase], detail="from compiled HLO")  # fmt: skip

    def run(self) -> PathResult:
        owner, spec = self.owner, self.owner.spec
        fwd_trace = self._trace("forward")
        bwd_trace = self._trace("backward") if spec.training else None
        if spec.training:
            (out, hs, cs), (g_params, g_x, g_states) = self._executable("backward")(*self.args)
        else:
            out, hs, cs = self._executable("forward")(*self.args)
        grads: dict[str, np.ndarray] = {}
        if spec.training:
            gstates = [_f64(g) for g in g_states or []]
            grads = owner.canonical_grads(_f64(g_x), gstates, [_f64(g) for g in g_params])
        return owner.path_result(out, hs, cs, grads, fwd_trace, bwd_trace)

    def forward(self) -> None:
        self.last = self._executable("forward")(*self.args)

    def train_step(self) -> None:
        self.last = self._executable("backward")(*self.args)

    def trace_forward(self) -> Any:
        return self._trace("forward")

    def synchronize(self) -> None:
        if self.last is not None:
            self.jax.block_until_ready(self.last)

    def device_time(self, kind: str, samples: int) -> Any:
        """Device seconds per call of the forward executable or the training step's. XLA runs them on JAX's own
        CUDA streams, which torch's CUDA graphs and events do not see; CUPTI records their kernels all the same
        (:func:`pytest_lstmperf.meters.cupti_device_time`, through torch's profiler where torch is
        installed). Without it, calls queued back to back are timed until the last result is ready
        (:func:`pytest_lstmperf.meters.pipelined_device_time`): on the H100 a Keras-on-JAX cuDNN call
        waits on a copy to the host inside it, so that figure is host-bound there and the gate says so."""
        executable = self._executable("forward" if kind == "forward" else "backward")
        return xla_device_time(lambda: executable(*self.args), self.jax.block_until_ready, samples)


def _f64(value: Any) -> np.ndarray:
    return np.asarray(value, dtype=np.float64)


# ------------------------------------------------------------------------------------------- cuDNN decision probe
def cudnn_attempts(configs: list[tuple[dict, dict]]) -> list[JaxAttempt]:
    """For each ``(spec dict, options dict)``: would Keras's JAX backend call ``jax.experimental.rnn.lstm``
    (cuDNN) on a GPU? Runs on any machine: ``_is_gpu_available`` is replaced by ``lambda: True`` and
    ``jax.experimental.rnn.lstm`` by a recorder that raises ``RuntimeError`` (which ``lstm()`` turns into its
    fallback), while the forward call is traced (``jax.jit(...).lower``: nothing runs). Returns, per config,
    whether it was attempted, the error the layer raised (``use_cudnn=True``), and whose loop the lowered module
    holds."""

    # patched below: the attributes of these modules are not known to the type checker
    backend_rnn: Any = importlib.import_module("keras.src.backend.jax.rnn")
    jax_rnn: Any = importlib.import_module("jax.experimental.rnn")
    originals = (backend_rnn._is_gpu_available, jax_rnn.lstm)
    calls: list[int] = []

    def recorder(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        raise RuntimeError("cuDNN decision probe: no GPU here")

    backend_rnn._is_gpu_available, jax_rnn.lstm = (lambda: True), recorder
    results: list[JaxAttempt] = []
    try:
        for spec_dict, options_dict in configs:
            calls.clear()
            spec, options = LayerSpec.from_dict(spec_dict), KerasOptions.from_dict(options_dict)
            error = loop = None
            try:
                run = LocalKerasRun(options, make_case(spec), "cpu")
                impl: JaxRunner = run._impl  # type: ignore[assignment]
                text = impl.functions["forward"].lower(*impl.args).as_text(dialect="hlo")
                loop = "cell" if ("lstm_cell" in text or "gru_cell" in text) else "backend"
            except Exception as exc:  # the layer's own error is the observation
                error = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            results.append(JaxAttempt(bool(calls), error, loop))
    finally:
        backend_rnn._is_gpu_available, jax_rnn.lstm = originals
    return results
