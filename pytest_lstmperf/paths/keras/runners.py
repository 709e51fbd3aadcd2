"""Run a Keras layer in this process: :class:`LocalKerasRun` holds the stack, its inputs and the conversions to
the canonical (PyTorch-layout, float64) results; one runner class per Keras backend does the calls.

The process's Keras backend must be the path's (``KERAS_BACKEND``); the worker server uses this, and so does a
script whose process already has the right backend (``scripts/gpu_keras_torch.py``). A new backend is one module
with a :class:`BackendRunner` subclass and one entry in :data:`BACKEND_RUNNERS`.
"""

from __future__ import annotations

import contextlib
import importlib
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from ... import host_counters, meters
from ...model.case import Case
from ...model.keras_options import KerasOptions, mask_style
from .. import PathResult
from .layer import KerasStack, place, unplace, valid_positions
from .transport import KerasUnavailable
from .weights import grads_to_canonical

#: Keras backend -> ``module:class`` of its runner (relative to this package; imported when a run is built)
BACKEND_RUNNERS = {
    "tensorflow": ".tensorflow_runner:TensorFlowRunner",
    "torch": ".torch_runner:TorchRunner",
    "jax": ".jax_runner:JaxRunner",
}


def _backend_runner(backend: str) -> type[BackendRunner]:
    module, _, name = BACKEND_RUNNERS.get(backend, BACKEND_RUNNERS["torch"]).partition(":")
    return getattr(importlib.import_module(module, __package__), name)


#: the worker's anchor (:meth:`LocalKerasRun.pairs`), made at its first use
_ANCHOR: list[Any] = []


@contextlib.contextmanager
def jax_pinned(kind: str) -> Iterator[None]:
    """Inside the block, a CPU run (``kind`` ``"cpu"``) is the CPU's whatever JAX's default backend is: JAX's
    default device is the CPU (arrays Keras makes itself, such as zero initial states, go there), and Keras's
    cuDNN test (``_is_gpu_available``) answers no, so its LSTM traces its own loop, not the cuDNN primitive
    that has no CPU lowering. A GPU run (``"cuda"``) is left as it is. The test is put back as it was (the
    cuDNN decision probe replaces it for its own block)."""
    if kind == "cuda":
        yield
        return
    import jax

    rnn: Any = importlib.import_module("keras.src.backend.jax.rnn")
    before = getattr(rnn, "_is_gpu_available", None)
    if before is not None:
        rnn._is_gpu_available = lambda: False
    try:
        with jax.default_device(jax.devices("cpu")[0]):
            yield
    finally:
        if before is not None:
            rnn._is_gpu_available = before


class LocalKerasRun:
    """A Keras stack and its inputs in this process (whose Keras backend must be ``options.backend``).

    ``device`` is ``"cpu"`` or ``"cuda"``. ``run()`` returns a :class:`~pytest_lstmperf.paths.PathResult`
    (canonical float64 arrays and kernel traces).
    """

    def __init__(self, options: KerasOptions, case: Case, device: str) -> None:
        import keras

        backend = keras.backend.backend()
        if backend != options.backend:
            raise KerasUnavailable(
                f"this process runs Keras on {backend!r}, the path needs {options.backend!r} "
                f"(set KERAS_BACKEND={options.backend} before keras is imported)"
            )
        self.keras = keras
        self.case = case
        self.spec = spec = case.spec
        self.options = options
        self.device = device
        self.notes: list[str] = []
        self.style = mask_style(spec, options)
        self.positions = valid_positions(spec, self.style)
        self.mask_np = None if self.style == "none" else self.positions
        self.x_np = place(np.asarray(case.x), self.positions)
        self.g_out_np = place(np.asarray(case.grad_output), self.positions)
        if self.style != "none":
            self.notes.append(
                f"mask {self.style}-padded; outputs past each length reported as zero (Keras's generic loop "
                "repeats the last output there, its cuDNN path writes zeros)"
            )
        if options.recurrent_dropout or options.dropout:
            mode = "training (dropout active)" if options.call_training else "inference (dropout inactive)"
            self.notes.append(
                f"dropout={options.dropout}, recurrent_dropout={options.recurrent_dropout}: called in {mode}"
            )
        with self._device_scope():
            self.stack = KerasStack(spec, options, case.weights)
        self._impl: BackendRunner = _backend_runner(backend)(self)

    def _device_scope(self) -> Any:
        name = "gpu:0" if self.device == "cuda" and self.options.backend == "tensorflow" else None
        if self.options.backend == "torch":
            name = "cuda:0" if self.device == "cuda" else "cpu"
        if self.options.backend == "jax":
            stack = contextlib.ExitStack()
            stack.enter_context(self.keras.device("gpu:0" if self.device == "cuda" else "cpu:0"))
            stack.enter_context(jax_pinned(self.device))  # a CPU run stays on the CPU on a GPU machine too
            return stack
        return self.keras.device(name)

    # -- conversions shared by both backends
    def states_np(self) -> list[np.ndarray] | None:
        h0, c0 = self.case.h0, self.case.c0
        if h0 is None:
            return None
        return [np.asarray(h0)] + ([np.asarray(c0)] if c0 is not None else [])

    def seeds_np(self) -> list[np.ndarray]:
        seeds = [self.g_out_np if self.options.return_sequences else self.g_out_np[:, -1], self.case.grad_h_n]
        if self.case.grad_c_n is not None:
            seeds.append(self.case.grad_c_n)
        return [np.asarray(s) for s in seeds]

    def path_result(
        self, out: Any, hs: Any, cs: Any, grads: dict[str, np.ndarray], forward_trace: Any, backward_trace: Any
    ) -> PathResult:
        """A run's result in the canonical layouts: any backend's output and final states (tensors, arrays) as
        float64 numpy, with the canonical gradients and the traces."""
        return PathResult(
            output=self.canonical_output(to_f64(out)),
            h_n=np.stack([to_f64(h) for h in hs]),
            c_n=np.stack([to_f64(c) for c in cs]) if cs else None,
            grads=grads,
            forward_trace=forward_trace,
            backward_trace=backward_trace,
        )

    def canonical_output(self, out: np.ndarray) -> np.ndarray:
        if out.ndim == 2:  # return_sequences=False: only the last step exists
            full = np.full((self.spec.batch, self.spec.seq_len, out.shape[-1]), np.nan)
            full[:, -1] = out
            self.notes.append("return_sequences=False: only the last output exists (steps before it are NaN)")
            return full
        if self.style == "none":
            return out
        return unplace(out, self.positions)

    def canonical_grads(self, gx: np.ndarray, gstates: list[np.ndarray], gvars: list[np.ndarray]) -> dict:
        grads: dict[str, np.ndarray] = {"x": gx if self.style == "none" else unplace(gx, self.positions)}
        if gstates:
            grads["h0"] = gstates[0]
            if len(gstates) > 1:
                grads["c0"] = gstates[1]
        groups: dict[tuple[int, int], list[np.ndarray]] = {}
        i = 0
        for key, count in self.stack.variable_groups():
            groups[key] = gvars[i : i + count]
            i += count
        grads.update(grads_to_canonical(self.spec, groups))
        return grads

    # -- the PreparedRun calls
    def run(self) -> PathResult:
        result = self._impl.run()
        result.notes[:0] = self.notes
        return result

    def forward(self) -> None:
        self._impl.forward()

    def train_step(self) -> None:
        self._impl.train_step()

    def trace_forward(self) -> Any:
        return self._impl.trace_forward()

    def synchronize(self) -> None:
        self._impl.synchronize()

    def _timed(self, kind: str) -> Any:
        call = self.forward if kind == "forward" else self.train_step

        def timed() -> None:
            call()
            self.synchronize()

        return timed

    def pairs(self, kind: str, op: str, *args: Any) -> Any:
        """What :class:`pytest_lstmperf.anchor.Pairs` does for ``forward`` or ``train_step``, here, beside
        this process's own anchor (made once, on the CPU): ``op`` is ``kind`` (the anchor's kind), ``estimate``,
        ``repeat_for``, ``warm`` or ``rounds``."""
        from ... import anchor

        if not _ANCHOR:
            _ANCHOR.append(anchor.Anchor("cpu"))
        pairs = anchor.Pairs(self._timed(kind), _ANCHOR[0])
        return pairs.kind if op == "kind" else getattr(pairs, op)(*args)

    def time(self, kind: str, repeats: int, warmup: int = 1) -> list[float]:
        """Seconds per call of ``forward`` or ``train_step``, each synchronised, measured in this process."""
        timed = self._timed(kind)
        for _ in range(warmup):
            timed()
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            timed()
            samples.append(time.perf_counter() - start)
        return samples

    def device_time(self, kind: str, samples: int) -> Any:
        """Device seconds per call of ``forward`` or ``train_step`` (``meters.device_time``)."""
        if self.options.backend == "jax" and self.device == "cuda":
            return self._impl.device_time(kind, samples)  # type: ignore[attr-defined]
        if self.options.backend != "torch" and self.device == "cuda":
            return meters.DeviceTime(
                "none",
                (),
                "Keras on TensorFlow launches its kernels on TensorFlow's own CUDA streams, which torch's CUDA "
                "graphs and events do not see: no device time (the time per call decides)",
            )
        call = self.forward if kind == "forward" else self.train_step
        return meters.device_time(call, "cuda:0" if self.device == "cuda" else "cpu", samples)

    def host_counters(self, kind: str) -> dict[str, Any]:
        """Host counters of one ``forward`` or ``train_step`` (:func:`pytest_lstmperf.host_counters.host_counters`),
        counted in this process, which dispatches the ops; TensorFlow's ops are no ATen ops: a note only."""
        if self.options.backend != "torch":
            return {
                "note": f"Keras on {self.options.backend} dispatches "
                f"{'XLA executables' if self.options.backend == 'jax' else 'TensorFlow ops'}, which the ATen counters "
                "do not see: "
                "no host counters (the time per call decides)"
            }
        call = self.forward if kind == "forward" else self.train_step
        return host_counters.host_counters(call, "cuda:0" if self.device == "cuda" else "cpu")


class BackendRunner:
    """The calls of one Keras backend on a :class:`LocalKerasRun`'s stack and inputs."""

    def __init__(self, owner: LocalKerasRun) -> None:
        self.owner = owner

    def run(self) -> PathResult:
        raise NotImplementedError

    def forward(self) -> None: ...
    def train_step(self) -> None: ...
    def trace_forward(self) -> Any: ...
    def synchronize(self) -> None: ...


def to_f64(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):
        value = value.detach().to("cpu").double().numpy()
    elif hasattr(value, "numpy"):
        value = value.numpy()
    return np.asarray(value, dtype=np.float64)
