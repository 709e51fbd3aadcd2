"""Keras 3 execution paths, on the TensorFlow, torch and JAX backends, in the same registry as PyTorch's.

Each path is one :class:`~pytest_lstmperf.paths.keras.layer.KerasOptions` (``options["keras"]``) on one device. The
layer runs in the session's Keras worker for its backend (:mod:`pytest_lstmperf.paths.keras.pool`), so this module
and the test process import neither keras nor tensorflow. This module loads at pytest's start-up (the registry's),
so the worker pool, the runners and the transport (numpy; the pool's exit hook) are imported inside the functions
that use them. This module holds the registry entries, the workers' start-up and the run; what decides whether a
path can run here and on which specs, the known Keras bugs included, is :mod:`pytest_lstmperf.paths.keras.support`
(each path's ``available`` and ``supports``).

* Paths whose claimed kernel is cuDNN accept only specs the explainer finds eligible; ``supports()`` returns
  the explainer's reasons for the others (a packed spec on the torch backend, ``bias=False``, ...).
* Kernel-only paths (``options["kernel_only"]``): options that change the layer's math on purpose
  (``activation='relu'``) or its outputs (``return_sequences=False``) have no float64 reference, so
  ``supports()`` refuses every spec with a reason starting ``"kernel-only:"`` (the equivalence suite reports the
  skip); ``suites/test_keras_explainer.py`` runs them and checks the observed kernel against the explainer.
* JAX paths (``keras-jax-*``): Keras 3.15's JAX backend sends an eligible LSTM to cuDNN through
  ``jax.experimental.rnn.lstm`` when JAX's default backend is a GPU, and runs every GRU (JAX has no cuDNN GRU)
  and every other layer as an XLA-compiled loop (``jax-generic``). ``keras-jax-cuda-scan`` takes exactly the
  specs the explainer sends off cuDNN with default options (``options["off_cudnn"]``), so the GPU's default
  GRU is checked too.
* ``recurrent_dropout`` paths run in inference, where the math is the plain layer's; the option still keeps
  the layer off cuDNN, which is what they check.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, cast

from ...anchor import WARM_SUFFIX
from ...model.keras_options import KerasOptions
from .. import ExecutionPath, PathResult, register_path
from . import support
from .support import missing

if TYPE_CHECKING:
    from ...device import DeviceInfo
    from ...model.case import Case
    from ...model.keras_options import Backend
    from ...observation.torch_trace import KernelTrace
    from .. import PathOptions

_HERE = __name__
#: where the paths' ``available`` and ``supports`` live
_SUPPORT = support.__name__

_GATE = {
    "keras-tf-cpu",
    "keras-torch-cpu",
    "keras-tf-cudnn",
    "keras-tf-cuda-generic",
    "keras-torch-cudnn",
    "keras-torch-cuda-generic",
    "keras-jax-cpu",
    "keras-jax-cudnn",
    "keras-jax-cuda-scan",
    "keras-jax-cuda-generic",
}


def _entry(name: str, backend: Backend, device: str, kernel: str, precision: str, description: str, **kw: Any) -> None:
    extra = {k: kw.pop(k) for k in ("kernel_only", "min_capability", "off_cudnn") if k in kw}
    # the quick merge gate times each backend's default and its generic fallback; variants run in the thorough set
    in_gate = kw.pop("in_gate", name in _GATE)
    extended = kw.pop("extended", "")
    options = cast("PathOptions", {"keras": KerasOptions(backend=backend, **kw), **extra})
    register_path(ExecutionPath(
        name, f"keras-{backend}", device, kernel, precision, description,
        prepare_ref=f"{_HERE}:prepare", available_ref=f"{_SUPPORT}:available", supports_ref=f"{_SUPPORT}:supports",
        options=options, in_gate=in_gate and "kernel_only" not in extra, extended=extended,
    ))  # fmt: skip


_RELU = "activation='relu' changes the layer's math; no float64 reference implements it"
_LAST = "return_sequences=False returns the last step only; h_n is checked by the full-sequence paths"

# ------------------------------------------------------------------ TensorFlow backend, CPU (runs in CI)
_TF: Backend = "tensorflow"
_TO: Backend = "torch"
_entry("keras-tf-cpu", _TF, "cpu", "tf-generic", "fp32", "Keras on TensorFlow, defaults (use_cudnn='auto')")
_entry("keras-tf-cpu-generic", _TF, "cpu", "tf-generic", "fp32", "use_cudnn=False, implementation=2", use_cudnn=False)
_entry(
    "keras-tf-cpu-impl1",
    _TF,
    "cpu",
    "tf-generic",
    "fp32",
    "use_cudnn=False, implementation=1 (per-gate products)",
    use_cudnn=False,
    implementation=1,
)
_entry("keras-tf-cpu-unroll", _TF, "cpu", "tf-generic", "fp32", "unroll=True", unroll=True)
_entry(
    "keras-tf-cpu-backwards", _TF, "cpu", "tf-generic", "fp32", "go_backwards=True on reversed input", go_backwards=True
)
_entry(
    "keras-tf-cpu-recurrent-dropout",
    _TF,
    "cpu",
    "tf-generic",
    "fp32",
    "recurrent_dropout=0.25, called in inference",
    recurrent_dropout=0.25,
)
_entry(
    "keras-tf-cpu-mask-left",
    _TF,
    "cpu",
    "tf-generic",
    "fp32",
    "packed specs with a left-padded mask",
    mask="left",
    in_gate=False,
)
_entry(
    "keras-tf-cpu-mask-holes",
    _TF,
    "cpu",
    "tf-generic",
    "fp32",
    "packed specs with a mask with gaps",
    mask="holes",
    in_gate=False,
)
_entry(
    "keras-tf-cpu-relu",
    _TF,
    "cpu",
    "tf-generic",
    "fp32",
    "activation='relu' (kernel check only)",
    activation="relu",
    kernel_only=_RELU,
)
_entry(
    "keras-tf-cpu-last",
    _TF,
    "cpu",
    "tf-generic",
    "fp32",
    "return_sequences=False (kernel check only)",
    return_sequences=False,
    kernel_only=_LAST,
)
# ------------------------------------------------------------------ TensorFlow backend, GPU
_entry(
    "keras-tf-cudnn",
    _TF,
    "cuda",
    "cudnn",
    "tf32",
    "Keras on TensorFlow, cuDNN (use_cudnn='auto'; TF32 default)",
    min_capability=(8, 0),
)
_entry(
    "keras-tf-cudnn-forced",
    _TF,
    "cuda",
    "cudnn",
    "tf32",
    "use_cudnn=True (raises instead of falling back)",
    use_cudnn=True,
    min_capability=(8, 0),
)
_entry(
    "keras-tf-cuda-generic",
    _TF,
    "cuda",
    "tf-generic",
    "tf32",
    "use_cudnn=False on the GPU (TF32 MatMul)",
    use_cudnn=False,
    min_capability=(8, 0),
)
_entry(
    "keras-tf-cuda-recurrent-dropout",
    _TF,
    "cuda",
    "tf-generic",
    "tf32",
    "recurrent_dropout=0.25 on the GPU, called in inference",
    recurrent_dropout=0.25,
    min_capability=(8, 0),
)
_entry(
    "keras-tf-cuda-relu",
    _TF,
    "cuda",
    "tf-generic",
    "tf32",
    "activation='relu' on the GPU (kernel check only)",
    activation="relu",
    kernel_only=_RELU,
    min_capability=(8, 0),
)
# ------------------------------------------------------------------ torch backend (its own worker process)
_entry("keras-torch-cpu", _TO, "cpu", "cpu-native", "fp32", "Keras on torch, defaults (Keras's own torch loop)")
_entry(
    "keras-torch-cpu-generic",
    _TO,
    "cpu",
    "cpu-native",
    "fp32",
    "use_cudnn=False (Keras RNN cell loop)",
    use_cudnn=False,
)
_entry(
    "keras-torch-cpu-impl1",
    _TO,
    "cpu",
    "cpu-native",
    "fp32",
    "use_cudnn=False, implementation=1",
    use_cudnn=False,
    implementation=1,
)
_entry(
    "keras-torch-cudnn",
    _TO,
    "cuda",
    "cudnn",
    "tf32",
    "Keras on torch, torch._VF cuDNN (cudnn.allow_tf32 default)",
    min_capability=(8, 0),
)
_entry(
    "keras-torch-cudnn-forced",
    _TO,
    "cuda",
    "cudnn",
    "tf32",
    "use_cudnn=True on the torch backend",
    use_cudnn=True,
    min_capability=(8, 0),
)
_entry(
    "keras-torch-cuda-generic",
    _TO,
    "cuda",
    "cuda-generic",
    "fp32",
    "use_cudnn=False on CUDA (Keras cell loop)",
    use_cudnn=False,
)
_entry("keras-torch-cuda-unroll", _TO, "cuda", "cuda-generic", "fp32", "unroll=True on CUDA", unroll=True)
_entry(
    "keras-torch-cuda-recurrent-dropout",
    _TO,
    "cuda",
    "cuda-generic",
    "fp32",
    "recurrent_dropout=0.25 on CUDA, called in inference",
    recurrent_dropout=0.25,
)
_entry("keras-torch-cuda-relu", _TO, "cuda", "cuda-generic", "fp32", "activation='relu' on CUDA (kernel check only)",
       activation="relu", kernel_only=_RELU)  # fmt: skip


# ------------------------------------------------------------------ JAX backend (its own worker process)
_JX: Backend = "jax"
_SLOW_XLA = "XLA compiles the recurrent loop for every shape: 5-17 s per test on an H100"
_entry("keras-jax-cpu", _JX, "cpu", "jax-generic", "fp32",
       "Keras on JAX, defaults: XLA loop (LSTM: Keras's cell loop; GRU: the backend's fused scan)")  # fmt: skip
# no use_cudnn=False path on the CPU: the LSTM default already is Keras's cell loop there, and a masked or
# reset_after=False GRU of keras-jax-cpu runs the cell loop too (the JAX suites cost CI minutes of compilation)
_entry("keras-jax-cpu-mixed-bf16", _JX, "cpu", "jax-generic", "bf16",
       "dtype policy mixed_bfloat16: float32 variables, bfloat16 compute in the XLA loop",
       dtype_policy="mixed_bfloat16", in_gate=False)  # fmt: skip
_entry("keras-jax-cudnn", _JX, "cuda", "cudnn", "tf32",
       "Keras on JAX, LSTM through jax.experimental.rnn.lstm (cuDNN; TF32 allowed by JAX's default precision)",
       min_capability=(8, 0))  # fmt: skip
_entry("keras-jax-cudnn-backwards", _JX, "cuda", "cudnn", "tf32", "go_backwards=True on the cuDNN LSTM",
       go_backwards=True, min_capability=(8, 0))  # fmt: skip
_entry("keras-jax-cudnn-mixed-fp16", _JX, "cuda", "cudnn", "fp16",
       "dtype policy mixed_float16: Keras's cuDNN test ignores the dtype, so the LSTM goes to "
       "jax.experimental.rnn.lstm in float16", dtype_policy="mixed_float16", in_gate=False)  # fmt: skip
_entry("keras-jax-cuda-scan", _JX, "cuda", "jax-generic", "tf32",
       "defaults on specs kept off cuDNN (GRU, masks): the XLA loop on the GPU", off_cudnn=True,
       min_capability=(8, 0), extended=_SLOW_XLA)  # fmt: skip
_entry("keras-jax-cuda-generic", _JX, "cuda", "jax-generic", "tf32",
       "use_cudnn=False on the GPU (XLA loop; fp32 dots at JAX's default precision may use TF32)",
       use_cudnn=False, min_capability=(8, 0), extended=_SLOW_XLA)  # fmt: skip
_entry("keras-jax-cuda-relu", _JX, "cuda", "jax-generic", "tf32", "activation='relu' on the GPU (kernel check only)",
       activation="relu", kernel_only=_RELU, min_capability=(8, 0), extended=_SLOW_XLA)  # fmt: skip


# ---------------------------------------------------------------------------------------------- workers
def prestart_workers(paths: list[ExecutionPath]) -> list[ExecutionPath]:
    """Start the Keras workers that ``paths`` (GPU Keras paths) will ask for, side by side, without waiting
    for them (:func:`.pool.prestart`). Returns the paths whose availability waits for a worker's hello: the
    GPU Keras paths whose Keras and backend are installed (the others say why at once)."""
    from .pool import prestart

    waiting = [p for p in paths if p.device == "cuda" and "keras" in p.options]
    waiting = [p for p in waiting if missing(str(p.options["keras"].backend)) is None]
    prestart(_backends(waiting))
    return waiting


def _backends(paths: list[ExecutionPath]) -> list[str]:
    """The Keras backends of ``paths``, once each, those whose Keras is installed."""
    backends: list[str] = [str(p.options["keras"].backend) for p in paths if "keras" in p.options]
    return [b for b in dict.fromkeys(backends) if missing(b) is None]


def start_workers_for(paths: list[ExecutionPath]) -> None:
    """Start the workers of the Keras paths among ``paths``, on any device, side by side, and wait until each is
    ready (:func:`.pool.start_workers`): on a 2-core CPU one after another cost 3-4 s each."""
    from .pool import start_workers

    start_workers(_backends(paths))


# ---------------------------------------------------------------------------------------------- runner
class KerasRun:
    """A Keras stack prepared in the worker of its backend; each call is one round trip."""

    def __init__(self, path: ExecutionPath, case: Case, device: DeviceInfo) -> None:
        from .pool import get_worker
        from .transport import narrow

        self.path = path
        self.options = path.options["keras"]
        self.worker = get_worker(self.options.backend)
        self.handle = self.worker.request(
            "prepare",
            options=self.options.to_dict(),
            case=narrow(case),
            device=device.kind,
        )

    def _call(self, method: str, *args: Any) -> Any:
        return self.worker.request("call", handle=self.handle, method=method, args=args)

    def run(self) -> PathResult:
        result = self._call("run")
        if not isinstance(result, PathResult):
            raise TypeError(f"the Keras worker's run answered {type(result).__name__}, not a PathResult")
        return result

    def forward(self) -> object:
        return self._call("forward")

    def train_step(self) -> object:
        return self._call("train_step")

    def trace_forward(self) -> KernelTrace:
        return self._call("trace_forward")

    def synchronize(self) -> None:
        self._call("synchronize")

    def pairs(self, kind: str, device: str) -> WorkerPairs | None:
        """On a CPU, the call of ``kind`` timed inside the worker beside an anchor there (:class:`WorkerPairs`);
        None on a GPU, where the test process's anchor holds the device part the figures are divided by."""
        return WorkerPairs(self, kind) if device == "cpu" else None

    def time(self, kind: str, repeats: int, warmup: int = 1) -> list[float]:
        """Seconds per synchronised call measured inside the worker (no pipe round trip in the figure)."""
        return self._call("time", kind, repeats, warmup)

    def device_time(self, kind: str, samples: int) -> Any:
        """:class:`pytest_lstmperf.meters.DeviceTime` of ``forward`` or ``train_step``, measured in the worker,
        whose process launches the kernels (a CUDA graph captured here would be empty)."""
        return self._call("device_time", kind, samples)

    def host_counters(self, kind: str) -> dict[str, Any]:
        """Host counters of ``forward`` or ``train_step``, counted in the worker, which dispatches the ops."""
        return self._call("host_counters", kind)

    def close(self) -> None:
        """Free the worker's copy (deferred to the next request: no pipe traffic from a finaliser)."""
        handle = getattr(self, "handle", None)  # None also where "prepare" raised in __init__
        if handle is not None:
            self.worker.defer_release(handle)
        self.handle = None

    def __del__(self) -> None:
        self.close()


class WorkerPairs:
    """A Keras benchmark's call timed where it runs, in its worker, each paired with a run of the same anchor
    workload there (:class:`pytest_lstmperf.anchor.Pairs`, whose methods these are, each one request).

    Timed from the test process, a call on a CPU held the pipe's two round trips and the worker's wake-ups: on
    the 2-core VM a Keras-on-JAX LSTM at batch 1 took 319-448 us so, 0.66-0.95 of the test process's anchor
    over six fresh processes, a layer 1.5x slower reads about 1.16x, and the recording named it blind; timed
    in the worker, 124-128 us, 0.279-0.284 of the worker's anchor (docs/gate-evidence.md). The anchor's kind
    says where it ran (``torch-cpu-backward-warm-in-worker``): a baseline timed from the test process is not
    comparable."""

    SUFFIX = "-in-worker"

    def __init__(self, run: KerasRun, kind: str) -> None:
        self.run = run
        self.mode = kind
        self.clock = time.perf_counter  # the worker's clock too
        self.kind = str(run._call("pairs", kind, "kind")) + self.SUFFIX
        # as the worker's pairs time it: each timed call after an untimed one on a CPU (:class:`..anchor.Pairs`)
        self.calls = 2 if WARM_SUFFIX in self.kind else 1

    def estimate(self, warmup: int) -> float:
        return float(self.run._call("pairs", self.mode, "estimate", warmup))

    def repeat_for(self, call_s: float | None, baseline: int | None = None) -> int:
        return int(self.run._call("pairs", self.mode, "repeat_for", call_s, baseline))

    def warm(self) -> None:
        self.run._call("pairs", self.mode, "warm")

    def rounds(self, repeat: int, rounds: int) -> tuple[list[float], list[float]]:
        data, anchors = self.run._call("pairs", self.mode, "rounds", repeat, rounds)
        return [float(x) for x in data], [float(x) for x in anchors]


def prepare(path: ExecutionPath, case: Case, device: DeviceInfo) -> KerasRun:
    return KerasRun(path, case, device)
