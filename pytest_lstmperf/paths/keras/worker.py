"""Run Keras layers in a process of their own, one persistent worker per Keras backend.

Keras fixes its backend when first imported (``KERAS_BACKEND``), so the torch backend cannot share the test
process with the TensorFlow backend, and the test process (which imports torch for the PyTorch paths) must not
have TensorFlow's import order imposed on it. :func:`get_worker` starts ``python -m
pytest_lstmperf.paths.keras.worker <backend>`` once per backend and session and talks to it over its stdin/stdout
pipes (length-prefixed pickles); the worker keeps the prepared layers by handle, so one
prepare + many run/forward/train_step calls cost one round trip each (tens of microseconds, reported in the
timing notes). The worker writes its logs to a temporary file, whose tail is shown when it fails.

:class:`LocalKerasRun` is the in-process runner the worker uses; a script whose process already has the
right ``KERAS_BACKEND`` (``scripts/gpu_keras_torch.py``) uses it directly.
"""

from __future__ import annotations

import atexit
import os
import pickle
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from ...model.spec import LayerSpec
from .layer import KerasOptions, KerasStack, mask_style, place, unplace, valid_positions


class KerasUnavailable(RuntimeError):
    """Keras or its backend cannot be imported in a worker; the message says what is missing."""


class KerasWorkerError(RuntimeError):
    """The worker raised while running a request; the message carries its error and traceback tail."""


# ------------------------------------------------------------------------------------------- in-process run
def _case_arrays(case: Any) -> dict[str, Any]:
    return {
        "weights": dict(case.weights),
        "x": case.x,
        "h0": case.h0,
        "c0": case.c0,
        "grad_output": case.grad_output,
        "grad_h_n": case.grad_h_n,
        "grad_c_n": case.grad_c_n,
    }


class LocalKerasRun:
    """A Keras stack and its inputs in this process (whose Keras backend must be ``options.backend``).

    ``device`` is ``"cpu"`` or ``"cuda"``. ``run()`` returns a dict with the fields of
    :class:`~pytest_lstmperf.paths.PathResult` (canonical float64 arrays and kernel traces).
    """

    def __init__(self, spec: LayerSpec, options: KerasOptions, arrays: dict[str, Any], device: str) -> None:
        import keras

        backend = keras.backend.backend()
        if backend != options.backend:
            raise KerasUnavailable(
                f"this process runs Keras on {backend!r}, the path needs {options.backend!r} "
                f"(set KERAS_BACKEND={options.backend} before keras is imported)"
            )
        self.keras = keras
        self.spec = spec
        self.options = options
        self.device = device
        self.notes: list[str] = []
        self.style = mask_style(spec, options)
        self.positions = valid_positions(spec, self.style)
        self.mask_np = None if self.style == "none" else self.positions
        self.x_np = place(np.asarray(arrays["x"]), self.positions)
        self.g_out_np = place(np.asarray(arrays["grad_output"]), self.positions)
        self.arrays = arrays
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
            self.stack = KerasStack(spec, options, arrays["weights"])
        if backend == "tensorflow":
            self._impl: _Impl = _TensorFlowImpl(self)
        else:
            self._impl = _TorchImpl(self)

    def _device_scope(self) -> Any:
        name = "gpu:0" if self.device == "cuda" and self.options.backend == "tensorflow" else None
        if self.options.backend == "torch":
            name = "cuda:0" if self.device == "cuda" else "cpu"
        return self.keras.device(name)

    # -- conversions shared by both backends
    def states_np(self) -> list[np.ndarray] | None:
        h0, c0 = self.arrays["h0"], self.arrays["c0"]
        if h0 is None:
            return None
        return [np.asarray(h0)] + ([np.asarray(c0)] if c0 is not None else [])

    def seeds_np(self) -> list[np.ndarray]:
        seeds = [self.g_out_np if self.options.return_sequences else self.g_out_np[:, -1], self.arrays["grad_h_n"]]
        if self.arrays["grad_c_n"] is not None:
            seeds.append(self.arrays["grad_c_n"])
        return [np.asarray(s) for s in seeds]

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
        from .weights import grads_to_canonical

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
    def run(self) -> dict[str, Any]:
        result = self._impl.run()
        result["notes"] = list(self.notes) + result.get("notes", [])
        return result

    def forward(self) -> None:
        self._impl.forward()

    def train_step(self) -> None:
        self._impl.train_step()

    def trace_forward(self) -> Any:
        return self._impl.trace_forward()

    def synchronize(self) -> None:
        self._impl.synchronize()

    def time(self, kind: str, repeats: int, warmup: int = 1) -> list[float]:
        """Seconds per call of ``forward`` or ``train_step``, each synchronised, measured in this process."""
        call = self.forward if kind == "forward" else self.train_step
        for _ in range(warmup):
            call()
        self.synchronize()
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            call()
            self.synchronize()
            samples.append(time.perf_counter() - start)
        return samples

    def device_time(self, kind: str, samples: int) -> Any:
        """Device seconds per call of ``forward`` or ``train_step`` (``speed.timing.device_time``)."""
        from ...speed.timing import DeviceTime, device_time

        if self.options.backend != "torch" and self.device == "cuda":
            return DeviceTime(
                "none",
                (),
                "Keras on TensorFlow launches its kernels on TensorFlow's own CUDA streams, which torch's CUDA "
                "graphs and events do not see: no device time (the time per call decides)",
            )
        call = self.forward if kind == "forward" else self.train_step
        return device_time(call, "cuda:0" if self.device == "cuda" else "cpu", samples)

    def host_counters(self, kind: str) -> dict[str, Any]:
        """Host counters of one ``forward`` or ``train_step`` (:func:`pytest_lstmperf.speed.timing.host_counters`),
        counted in this process, which dispatches the ops; TensorFlow's ops are no ATen ops: a note only."""
        if self.options.backend != "torch":
            return {
                "note": "Keras on TensorFlow dispatches TensorFlow ops, which the ATen counters do not see: "
                "no host counters (the time per call decides)"
            }
        from ...speed.timing import host_counters

        call = self.forward if kind == "forward" else self.train_step
        return host_counters(call, "cuda:0" if self.device == "cuda" else "cpu")


class _Impl:
    def run(self) -> dict[str, Any]: ...
    def forward(self) -> None: ...
    def train_step(self) -> None: ...
    def trace_forward(self) -> Any: ...
    def synchronize(self) -> None: ...


class _TensorFlowImpl(_Impl):
    """Calls compiled into ``tf.function`` (as ``model.fit`` does); kernels read from their graphs."""

    def __init__(self, owner: LocalKerasRun) -> None:
        import tensorflow as tf

        self.tf = tf
        self.owner = owner
        spec = owner.spec
        dtype = spec.dtype
        self.tf32 = owner.device == "cuda" and dtype == "float32" and _tf32_enabled(tf)
        with owner._device_scope():
            self.x = tf.constant(owner.x_np.astype(dtype))
            self.mask = None if owner.mask_np is None else tf.constant(owner.mask_np)
            states = owner.states_np()
            self.states = None if states is None else [tf.constant(s.astype(dtype)) for s in states]
            self.seeds = [tf.constant(s.astype(dtype)) for s in owner.seeds_np()]
        stack, training = owner.stack, owner.options.call_training

        def call() -> Any:
            states = None if self.states is None else [[s[i] for i in range(s.shape[0])] for s in self.states]
            return stack.call(self.x, self.mask, states, training)

        def fwd() -> Any:
            out, hs, cs = call()
            return out, hs, cs

        def train() -> Any:
            with tf.GradientTape() as tape:
                tape.watch(self.x)
                if self.states is not None:
                    tape.watch(self.states)
                out, hs, cs = call()
                loss = tf.reduce_sum(out * self._seed_out(out)) + tf.reduce_sum(tf.stack(hs) * self.seeds[1])
                if cs:
                    loss += tf.reduce_sum(tf.stack(cs) * self.seeds[2])
            sources = [self.x, *(self.states or []), *stack.variables()]
            return out, hs, cs, tape.gradient(loss, sources)

        self.fwd = tf.function(fwd)
        self.train = tf.function(train)

    def _seed_out(self, out: Any) -> Any:
        return self.seeds[0]

    def _scope(self) -> Any:
        return self.owner._device_scope()

    def run(self) -> dict[str, Any]:
        from ...observation.tf_trace import function_trace

        owner, spec = self.owner, self.owner.spec
        with self._scope():
            fwd_trace = function_trace(self.fwd, phase="forward", tf32=self.tf32)
            if spec.training:
                bwd_trace = function_trace(self.train, phase="backward", tf32=self.tf32)
                out, hs, cs, grads = self.train()
            else:
                bwd_trace = None
                out, hs, cs = self.fwd()
                grads = None
        result: dict[str, Any] = {
            "output": owner.canonical_output(_f64(out)),
            "h_n": np.stack([_f64(h) for h in hs]),
            "c_n": np.stack([_f64(c) for c in cs]) if cs else None,
            "grads": {},
            "forward_trace": fwd_trace,
            "backward_trace": bwd_trace,
        }
        if grads is not None:
            n_states = len(self.states or [])
            gx = _f64(grads[0])
            gstates = [_f64(g) for g in grads[1 : 1 + n_states]]
            gvars = [_f64(g) for g in grads[1 + n_states :]]
            result["grads"] = owner.canonical_grads(gx, gstates, gvars)
        return result

    def forward(self) -> None:
        with self._scope():
            self.last = self.fwd()

    def train_step(self) -> None:
        with self._scope():
            self.last = self.train()

    def trace_forward(self) -> Any:
        from ...observation.tf_trace import function_trace

        with self._scope():
            return function_trace(self.fwd, phase="forward", tf32=self.tf32)

    def synchronize(self) -> None:
        sync = getattr(getattr(self.tf.test, "experimental", None), "sync_devices", None)
        if self.owner.device == "cuda" and sync is not None:
            sync()
        elif getattr(self, "last", None) is not None:
            self.tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, self.last)


def _tf32_enabled(tf: Any) -> bool:
    try:
        return bool(tf.config.experimental.tensor_float_32_execution_enabled())
    except AttributeError:  # pragma: no cover - very old TensorFlow
        return False


class _TorchImpl(_Impl):
    """Eager calls on the Keras torch backend; kernels observed with the torch dispatch trace."""

    def __init__(self, owner: LocalKerasRun) -> None:
        import torch

        self.torch = torch
        self.owner = owner
        spec = owner.spec
        self.dev = torch.device("cuda:0" if owner.device == "cuda" else "cpu")
        self.dtype = getattr(torch, spec.dtype)
        self.x = torch.tensor(owner.x_np, dtype=self.dtype, device=self.dev)
        self.mask = None if owner.mask_np is None else torch.tensor(owner.mask_np, device=self.dev)
        states = owner.states_np()
        self.states = None if states is None else [torch.tensor(s, dtype=self.dtype, device=self.dev) for s in states]
        self.seeds = [torch.tensor(s, dtype=self.dtype, device=self.dev) for s in owner.seeds_np()]

    def _call(self, x: Any, states: Any) -> Any:
        per = None if states is None else [[s[i] for i in range(s.shape[0])] for s in states]
        with self.owner._device_scope():
            return self.owner.stack.call(x, self.mask, per, self.owner.options.call_training)

    def _backward(self, out: Any, hs: Any, cs: Any) -> None:
        outs = [out, self.torch.stack(hs)] + ([self.torch.stack(cs)] if cs else [])
        self.torch.autograd.backward(outs, self.seeds[: len(outs)])

    def _params(self) -> list[Any]:
        return [v.value for v in self.owner.stack.variables()]

    def run(self) -> dict[str, Any]:
        from ...observation.torch_trace import torch_trace

        owner, spec = self.owner, self.owner.spec
        x = self.x.detach().clone().requires_grad_(spec.training)
        states = (
            None if self.states is None else [s.detach().clone().requires_grad_(spec.training) for s in self.states]
        )
        params = self._params()
        for p in params:
            p.grad = None
        with torch_trace(owner.device, "forward") as fwd:
            out, hs, cs = self._call(x, states)
        bwd_trace = None
        result: dict[str, Any] = {"grads": {}}
        if spec.training:
            with torch_trace(owner.device, "backward") as bwd:
                self._backward(out, hs, cs)
            bwd_trace = bwd[0]
            gx = _f64(x.grad)
            gstates = [_f64(s.grad) for s in states or []]
            gvars = [_f64(p.grad) if p.grad is not None else np.zeros(tuple(p.shape)) for p in params]
            result["grads"] = owner.canonical_grads(gx, gstates, gvars)
        result.update(
            output=owner.canonical_output(_f64(out)),
            h_n=np.stack([_f64(h) for h in hs]),
            c_n=np.stack([_f64(c) for c in cs]) if cs else None,
            forward_trace=fwd[0],
            backward_trace=bwd_trace,
        )
        return result

    def forward(self) -> None:
        with self.torch.no_grad():
            self._call(self.x, self.states)

    def train_step(self) -> None:
        out, hs, cs = self._call(self.x, self.states)
        self._backward(out, hs, cs)

    def trace_forward(self) -> Any:
        from ...observation.torch_trace import torch_trace

        with torch_trace(self.owner.device, "forward") as trace:
            self.forward()
        return trace[0]

    def synchronize(self) -> None:
        if self.dev.type == "cuda":
            self.torch.cuda.synchronize(self.dev)


def _f64(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):
        value = value.detach().to("cpu").double().numpy()
    elif hasattr(value, "numpy"):
        value = value.numpy()
    return np.asarray(value, dtype=np.float64)


# ------------------------------------------------------------------------------------------- worker side
def _send(stream: Any, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(data)))
    stream.write(data)
    stream.flush()


def _recv(stream: Any) -> Any:
    header = stream.read(8)
    if len(header) < 8:
        raise EOFError("worker pipe closed")
    (size,) = struct.unpack("<Q", header)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("worker pipe closed mid-message")
    return pickle.loads(data)


class _Server:
    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.runs: dict[int, LocalKerasRun] = {}
        self.next_handle = 1

    def hello(self) -> dict[str, Any]:
        import keras

        info: dict[str, Any] = {"keras": keras.__version__, "backend": keras.backend.backend(), "gpus": []}
        if self.backend == "tensorflow":
            import tensorflow as tf

            info["tensorflow"] = tf.__version__
            info["gpus"] = [d.name for d in tf.config.list_logical_devices("GPU")]
            info["cuda_build"] = bool(tf.test.is_built_with_cuda())
        else:
            import torch

            info["torch"] = torch.__version__
            if torch.cuda.is_available():
                info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            info["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        return info

    def prepare(self, spec: dict, options: dict, arrays: dict, device: str) -> int:
        run = LocalKerasRun(LayerSpec.from_dict(spec), KerasOptions.from_dict(options), arrays, device)
        handle = self.next_handle
        self.next_handle += 1
        self.runs[handle] = run
        return handle

    def release(self, handles: list[int]) -> None:
        for handle in handles:
            self.runs.pop(handle, None)
        if not self.runs:
            import keras

            keras.backend.clear_session()

    def call(self, handle: int, method: str, args: tuple = ()) -> Any:
        return getattr(self.runs[handle], method)(*args)

    def graph_probe(self, spec: dict, options: dict, arrays: dict) -> dict[str, Any]:
        """TF only: the family of the graph Keras builds for this layer when it believes a GPU is present.

        ``keras.src.backend.tensorflow.rnn._is_gpu_available`` is replaced by ``lambda: True`` while the
        layer is traced (nothing executes), so Keras's own checks (the layer's ``use_cudnn`` and
        ``recurrent_dropout`` gate, ``cudnn_ok``) choose the graph. Returns the forward family, Keras's own
        ``cudnn_ok`` verdict, or the error the layer raised.
        """
        import importlib

        from ...observation.tf_trace import function_trace

        tf_rnn = importlib.import_module("keras.src.backend.tensorflow.rnn")
        original = tf_rnn._is_gpu_available
        tf_rnn._is_gpu_available = lambda: True
        try:
            spec_obj, opts = LayerSpec.from_dict(spec), KerasOptions.from_dict(options)
            result: dict[str, Any] = {"cudnn_ok": None, "family": None, "error": None}
            try:
                run = LocalKerasRun(spec_obj, opts, arrays, "cpu")
                cell = run.stack.layers[0]
                cell = cell.forward_layer if spec_obj.bidirectional else cell
                args = (cell.cell.activation, cell.cell.recurrent_activation, cell.unroll, cell.cell.use_bias)
                if spec_obj.cell == "gru":
                    result["cudnn_ok"] = bool(tf_rnn.cudnn_ok(*args, reset_after=cell.cell.reset_after))
                else:
                    result["cudnn_ok"] = bool(tf_rnn.cudnn_ok(*args))
                result["family"] = function_trace(run._impl.fwd, phase="forward").family  # type: ignore[attr-defined]
            except Exception as exc:
                result["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
            return result
        finally:
            tf_rnn._is_gpu_available = original


def serve(backend: str) -> int:
    """The worker's main loop (run as ``python -m pytest_lstmperf.paths.keras.worker BACKEND``)."""
    if backend != "jax":
        # Keras imports JAX, when installed, for its Orbax checkpoint callback alone: seconds of start-up in a
        # worker that never uses it
        sys.modules.setdefault("jax", None)  # type: ignore[arg-type]
    channel = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints from the libraries go to the log, never into the protocol
    inbox = sys.stdin.buffer
    server = _Server(backend)
    try:
        info = server.hello()
    except BaseException as exc:
        _send(channel, {"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        return 1
    _send(channel, {"ok": True, "result": info})
    while True:
        try:
            message = _recv(inbox)
        except EOFError:
            return 0
        if message.get("cmd") == "exit":
            _send(channel, {"ok": True, "result": None})
            return 0
        try:
            result = getattr(server, message["cmd"])(**message.get("args", {}))
            reply = {"ok": True, "result": result}
        except BaseException as exc:
            reply = {
                "ok": False,
                "error": f"{type(exc).__name__}: {exc}",
                "kind": type(exc).__name__,
                "traceback": traceback.format_exc()[-4000:],
            }
        try:
            _send(channel, reply)
        except (pickle.PicklingError, TypeError) as exc:
            _send(channel, {"ok": False, "error": f"unpicklable reply: {exc}", "kind": "PicklingError"})


# ------------------------------------------------------------------------------------------- client side
class WorkerClient:
    """A persistent worker process for one Keras backend."""

    def __init__(self, backend: str, startup_timeout: float = 120.0) -> None:
        self.backend = backend
        self.lock = threading.Lock()
        self.pending_release: list[int] = []
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - kept open for the worker's lifetime
            prefix=f"lstmperf-keras-{backend}-", suffix=".log", delete=False
        )
        env = dict(os.environ)
        env["KERAS_BACKEND"] = backend
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        root = str(Path(__file__).resolve().parents[3])
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pytest_lstmperf.paths.keras.worker", backend],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=env,
        )
        try:
            hello = _recv(self.process.stdout)
        except EOFError:
            raise KerasUnavailable(f"Keras worker ({backend}) exited at start: {self.log_tail()}") from None
        if not hello["ok"]:
            self.close()
            raise KerasUnavailable(f"Keras on the {backend} backend cannot start: {hello['error']}")
        self.info: dict[str, Any] = hello["result"]

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return Path(self.log.name).read_text(errors="replace")[-chars:].strip() or "(no output)"
        except OSError:
            return "(log unreadable)"

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def defer_release(self, handle: int) -> None:
        self.pending_release.append(handle)  # list.append is atomic; sent with the next request

    def request(self, cmd: str, **args: Any) -> Any:
        with self.lock:
            if self.pending_release and self.alive:
                handles, self.pending_release[:] = list(self.pending_release), []
                _send(self.process.stdin, {"cmd": "release", "args": {"handles": handles}})
                _recv(self.process.stdout)
            if not self.alive:
                raise KerasWorkerError(f"Keras worker ({self.backend}) is not running: {self.log_tail()}")
            try:
                _send(self.process.stdin, {"cmd": cmd, "args": args})
                reply = _recv(self.process.stdout)
            except (EOFError, BrokenPipeError, OSError):
                raise KerasWorkerError(
                    f"Keras worker ({self.backend}) died during {cmd!r} (exit {self.process.poll()}): {self.log_tail()}"
                ) from None
        if not reply["ok"]:
            detail = reply.get("traceback", "")
            raise KerasWorkerError(f"{reply['error']}" + (f"\n--- worker traceback ---\n{detail}" if detail else ""))
        return reply["result"]

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                with self.lock:
                    _send(self.process.stdin, {"cmd": "exit"})
                self.process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired, EOFError):
                self.process.kill()
                self.process.wait(timeout=10)
        try:
            self.log.close()
            os.unlink(self.log.name)
        except OSError:
            pass


_WORKERS: dict[str, WorkerClient] = {}
_FAILED: dict[str, str] = {}
_POOL_LOCK = threading.Lock()


def get_worker(backend: str) -> WorkerClient:
    """The session's worker for ``backend``, started on first use (and restarted if it died)."""
    with _POOL_LOCK:
        if backend in _FAILED:
            raise KerasUnavailable(_FAILED[backend])
        worker = _WORKERS.get(backend)
        if worker is None or not worker.alive:
            try:
                worker = WorkerClient(backend)
            except KerasUnavailable as exc:
                _FAILED[backend] = str(exc)
                raise
            _WORKERS[backend] = worker
        return worker


def shutdown_workers() -> None:
    with _POOL_LOCK:
        for worker in _WORKERS.values():
            worker.close()
        _WORKERS.clear()


atexit.register(shutdown_workers)


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("KERAS_BACKEND", "tensorflow")))
