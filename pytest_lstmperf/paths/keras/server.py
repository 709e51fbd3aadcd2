"""The Keras worker process: ``python -m pytest_lstmperf.paths.keras.server BACKEND`` serves requests from its stdin
and answers on its stdout (see :mod:`.transport`), keeping the prepared runs by handle.
"""

from __future__ import annotations

import gc
import importlib
import os
import pickle
import sys
import traceback
import weakref
from typing import Any

from ...device import cpu_threads
from ...model.case import Case
from ...model.keras_options import KerasOptions
from ...observation.tf_trace import function_trace
from . import jax_runner
from .runners import LocalKerasRun
from .transport import GcState, GraphProbe, JaxAttempt, Reply, WorkerInfo, recv_request, send, widen


class Server:
    """The worker's requests: ``hello``, ``prepare`` (returns a handle), ``call``, ``release``, ``graph_probe``,
    ``jax_probe``, ``gc_state``."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.runs: dict[int, LocalKerasRun] = {}
        self.next_handle = 1
        self.released: list[weakref.ref] = []  # the runs released since the last full collection

    def hello(self) -> WorkerInfo:
        import keras

        if self.backend == "jax":
            return jax_runner.hello()
        keras_version, backend = keras.__version__, keras.backend.backend()
        if self.backend == "tensorflow":
            import tensorflow as tf

            return WorkerInfo(
                keras_version,
                backend,
                gpus=tuple(d.name for d in tf.config.list_logical_devices("GPU")),
                tensorflow=tf.__version__,
                cuda_build=bool(tf.test.is_built_with_cuda()),
            )
        import torch

        gpus = (
            [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            if torch.cuda.is_available()
            else []
        )
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        return WorkerInfo(keras_version, backend, gpus=tuple(gpus), torch=torch.__version__, cudnn=cudnn)

    def prepare(self, options: dict, case: Case, device: str) -> int:
        if self.backend == "torch" and device == "cuda":
            own_stream()
        run = LocalKerasRun(KerasOptions.from_dict(options), widen(case), device)
        handle = self.next_handle
        self.next_handle += 1
        self.runs[handle] = run
        return handle

    def release(self, handles: list[int]) -> None:
        """Forget the runs of ``handles`` and free them at once (a Keras layer holds reference cycles: without a
        collection its tensors live on until Python's next full one). Once no run is left, Keras's global
        state is reset too.

        A full collection scans every object the imports of torch, Keras and JAX created: 0.25 s each in the
        torch worker on the H100 (``clear_session`` collects on every release that leaves no run: 17 s of the
        43 s that worker spent in the suites' Keras-on-torch numerics). So the worker freezes its long-lived
        objects (``gc.freeze()``): its imports once they are done, then whatever survives a release that
        leaves no run. Collections then scan only the objects created since."""
        for handle in handles:
            run = self.runs.pop(handle, None)
            if run is not None:
                self.released.append(weakref.ref(run))
            del run
        if self.runs:
            gc.collect()
        else:
            import keras

            keras.backend.clear_session()  # resets the name counters and, on torch, Dynamo; then gc.collect()
            gc.freeze()
        self.released = [ref for ref in self.released if ref() is not None]

    def gc_state(self) -> GcState:
        """The collector's view: objects frozen, runs held, released runs still alive (none, after a release)."""
        return GcState(gc.get_freeze_count(), len(self.runs), sum(ref() is not None for ref in self.released))

    def call(self, handle: int, method: str, args: tuple = ()) -> Any:
        return getattr(self.runs[handle], method)(*args)

    def jax_probe(self, configs: list) -> list[JaxAttempt]:
        """JAX only: Keras's cuDNN decision per config (:func:`.jax_runner.cudnn_attempts`)."""
        return jax_runner.cudnn_attempts(configs)

    def graph_probe(self, options: dict, case: Case) -> GraphProbe:
        """TF only: the family of the graph Keras builds for this layer when it believes a GPU is present.

        ``keras.src.backend.tensorflow.rnn._is_gpu_available`` is replaced by ``lambda: True`` while the
        layer is traced (nothing executes), so Keras's own checks (the layer's ``use_cudnn`` and
        ``recurrent_dropout`` gate, ``cudnn_ok``) choose the graph. Returns the forward family, Keras's own
        ``cudnn_ok`` verdict, or the error the layer raised.
        """
        import importlib

        tf_rnn: Any = importlib.import_module("keras.src.backend.tensorflow.rnn")  # patched below
        original = tf_rnn._is_gpu_available
        tf_rnn._is_gpu_available = lambda: True
        try:
            try:
                run = LocalKerasRun(KerasOptions.from_dict(options), case, "cpu")
                cell = run.stack.layers[0]
                cell = cell.forward_layer if case.spec.bidirectional else cell
                args = (cell.cell.activation, cell.cell.recurrent_activation, cell.unroll, cell.cell.use_bias)
                if case.spec.cell == "gru":
                    cudnn_ok = bool(tf_rnn.cudnn_ok(*args, reset_after=cell.cell.reset_after))
                else:
                    cudnn_ok = bool(tf_rnn.cudnn_ok(*args))
                family = function_trace(run._impl.fwd, phase="forward").family  # type: ignore[attr-defined]
            except Exception as exc:
                return GraphProbe(error=f"{type(exc).__name__}: {exc}".splitlines()[0])
            return GraphProbe(cudnn_ok, family)
        finally:
            tf_rnn._is_gpu_available = original


_STREAM: list[Any] = []  # the worker's own CUDA stream, once made


def own_stream() -> Any:
    """Make Keras on torch run on a CUDA stream of the worker's own, not on the legacy default stream (once; the
    requests are served on one thread, whose current stream this sets). Returns that stream.

    A Keras layer's autograd nodes record the stream they were made on. Made on the legacy default stream, a
    CUDA-graph capture of the training step failed in its backward: ``InputBuffer::add`` would make the legacy
    stream wait on the capturing one ("operation would make the legacy stream depend on a capturing blocking
    stream", cudaErrorStreamCaptureImplicit), and the capture reported "operation failed due to a previous
    error during capture". On the H100 (torch 2.11, Keras 3.15) it failed in some runs and not in others: the
    generic LSTM step in 4 of 4 attempts, the cuDNN step in the first 2 of 4, each run a fresh process; so
    its device time fell back to CUDA events in some runs and the baseline mixed two timing methods. On a
    stream of its own, 4 of 4 attempts captured for both."""
    import torch

    if not _STREAM:
        _STREAM.append(torch.cuda.Stream())
    torch.cuda.set_stream(_STREAM[0])
    return _STREAM[0]


#: ``module:function:ARGUMENT``: a function the worker calls with ARGUMENT once its imports are done, before its first
#: request (the planted faults' ``slowdown:F`` reaches the workers' calls so: ``testing.slowdowns``)
WORKER_HOOK_ENV = "PYTEST_LSTMPERF_WORKER_HOOK"


def run_hook(raw: str) -> None:
    """Call the hook named by ``raw`` (:data:`WORKER_HOOK_ENV`), if any: imported by name, so that no module
    installed here depends on the one that sets it."""
    if not raw:
        return
    module, function, argument = [*raw.split(":", 2), "", ""][:3]
    getattr(importlib.import_module(module), function)(argument)


def one_thread_dispatch() -> None:
    """A CPU run fixes every framework's threads (``device.apply_threads``); JAX's CPU client would still hand each
    call to a thread of its own and wait for it (asynchronous dispatch). That thread competes with whatever else
    runs on the machine, and the anchor beside the call does not: on the 2-core VM, beside a busy process, Keras
    on JAX's LSTM at batch 16 read 4-5% slower while the anchor in this worker read 7-9% faster. Run inline,
    call and anchor moved together (scripts/busy_neighbour_probe.py). Before JAX's CPU client exists."""
    import jax

    jax.config.update("jax_cpu_enable_async_dispatch", False)


def serve(backend: str) -> int:
    """The worker's main loop (run as ``python -m pytest_lstmperf.paths.keras.server BACKEND``)."""
    if backend != "jax":
        # Keras imports JAX, when installed, for its Orbax checkpoint callback alone: seconds of start-up in a
        # worker that never uses it
        sys.modules.setdefault("jax", None)  # type: ignore[arg-type]
    # and scikit-learn, when installed, for its scikit-learn wrappers (1.5 s of the torch worker's start on
    # the H100); Keras takes the ImportError as "not installed"
    sys.modules.setdefault("sklearn", None)  # type: ignore[arg-type]
    if backend == "jax" and cpu_threads() is not None:
        one_thread_dispatch()
    channel = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints from the libraries go to the log, never into the protocol
    inbox = sys.stdin.buffer
    server = Server(backend)
    try:
        info = server.hello()
    except BaseException as exc:
        send(channel, Reply.failed(exc))
        return 1
    run_hook(os.environ.get(WORKER_HOOK_ENV, ""))
    gc.freeze()  # the imports' objects: long-lived, never scanned again by a collection (see Server.release)
    send(channel, Reply(True, info))
    if backend == "jax" and info.gpus:
        jax_runner.preload_device_timing()  # before the first request is read: the session runs other tests meanwhile
        gc.freeze()
    while True:
        try:
            message = recv_request(inbox)
        except EOFError:
            return 0
        if message.cmd == "exit":
            send(channel, Reply(True))
            return 0
        try:
            reply = Reply(True, getattr(server, message.cmd)(**message.args))
        except BaseException as exc:
            reply = Reply.failed(exc, traceback.format_exc()[-4000:])
        try:
            send(channel, reply)
        except (pickle.PicklingError, TypeError) as exc:
            send(channel, Reply(False, error=f"unpicklable reply: {exc}", kind="PicklingError"))


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("KERAS_BACKEND", "tensorflow")))
