"""Keras 3 execution paths, on the TensorFlow, torch and JAX backends, in the same registry as PyTorch's.

Each path is one :class:`~pytest_lstmperf.paths.keras.layer.KerasOptions` (``options["keras"]``) on one device.
The layer runs in the session's Keras worker for its backend (:mod:`pytest_lstmperf.paths.keras.pool`), so this
module and the test process import neither keras nor tensorflow.

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

import importlib.metadata
import importlib.util
from typing import TYPE_CHECKING, Any

from .. import ExecutionPath, PathResult, register_from

if TYPE_CHECKING:
    from ...device import DeviceInfo
    from ...model.case import Case
    from ...model.keras_options import Backend
    from ...model.spec import LayerSpec
    from ...observation.torch_trace import KernelTrace

_HERE = __name__

#: upstream bugs a path would hit, keyed by keras version: (path option predicate, spec predicate, description)
KNOWN_KERAS_BUGS: dict[str, list[tuple[str, str]]] = {
    "3.15.1": [
        (
            "unroll+bidirectional+mask",
            "Keras 3.15.1 bug with unroll=True, a mask and go_backwards (Bidirectional's backward layer): the "
            "TensorFlow backend zeroes the backward outputs with the un-reversed mask (wrong outputs), the torch "
            "backend raises AttributeError (torch.flip on a tuple) in keras/src/backend/*/rnn.py rnn()",
        ),
        (
            "jax+mixed+gru-no-bias",
            "Keras 3.15.1 bug on the JAX backend: GRU(use_bias=False) under a mixed dtype policy raises TypeError "
            "('scan body function carry input and carry output must have equal types'): the fused scan of "
            "keras/src/backend/jax/rnn.py gru() makes its missing biases with jnp.zeros in float32, which promotes "
            "the 16-bit step to float32",
        ),
        (
            "jax+cudnn+backwards+stacked",
            "Keras 3.15.1 bug on the JAX backend (the known finding 'order' of keras-jax-cudnn-backwards): the cuDNN "
            "LSTM with go_backwards=True returns its outputs in input order, so a second layer is fed them in the "
            "other order and runs a different network that no reference computes; the finding is confirmed, with "
            "every number checked, on single-layer stacks",
        ),
    ]
}


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
    from ...model.keras_options import KerasOptions

    extra = {k: kw.pop(k) for k in ("kernel_only", "min_capability", "off_cudnn") if k in kw}
    # the quick merge gate times each backend's default and its generic fallback; variants run in the thorough set
    in_gate = kw.pop("in_gate", name in _GATE)
    extended = kw.pop("extended", "")
    options = KerasOptions(backend=backend, **kw)
    register_from(
        _HERE, name, f"keras-{backend}", device, kernel, precision, description,
        options={"keras": options, **extra}, in_gate=in_gate and "kernel_only" not in extra, extended=extended,
    )  # fmt: skip


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


# ---------------------------------------------------------------------------------------------- checks
def _missing(backend: str) -> str | None:
    if importlib.util.find_spec("keras") is None:
        return "keras is not installed (pip install 'keras>=3.10')"
    try:
        major = int(importlib.metadata.version("keras").split(".")[0])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        major = 3
    if major < 3:
        return f"keras {importlib.metadata.version('keras')} is Keras 2; these paths need Keras 3"
    if backend == "tensorflow" and importlib.util.find_spec("tensorflow") is None:
        return "TensorFlow is not installed (pip install tensorflow-cpu, or tensorflow[and-cuda] for the GPU paths)"
    if backend == "torch" and importlib.util.find_spec("torch") is None:
        return "torch is not installed, so Keras's torch backend cannot run"
    if backend == "jax" and importlib.util.find_spec("jax") is None:
        return "JAX is not installed (pip install 'pytest-lstmperf[jax]', or 'jax[cuda13]' for the GPU paths)"
    return None


def _gpu_missing(backend: str, info: dict) -> str:
    if backend == "tensorflow":
        built = "a CUDA build" if info.get("cuda_build") else "a CPU-only build"
        return f"TensorFlow {info.get('tensorflow')} ({built}) sees no GPU, so its cuDNN and GPU paths cannot run"
    if backend == "jax":
        return (
            f"JAX {info.get('jax')} has no GPU backend (default backend {info.get('default_backend')!r}; "
            "pip install 'jax[cuda13]' on an NVIDIA machine)"
        )
    return f"torch {info.get('torch')} sees no CUDA device in the Keras worker"


def prestart_workers(paths: list[ExecutionPath]) -> list[ExecutionPath]:
    """Start the Keras workers that ``paths`` (GPU Keras paths) will ask for, side by side, without waiting
    for them (:func:`.pool.prestart`). Returns the paths whose availability waits for a worker's hello: the
    GPU Keras paths whose Keras and backend are installed (the others say why at once)."""
    from .pool import prestart

    waiting = [p for p in paths if p.device == "cuda" and "keras" in p.options]
    waiting = [p for p in waiting if _missing(str(p.options["keras"].backend)) is None]
    prestart(_backends(waiting))
    return waiting


def _backends(paths: list[ExecutionPath]) -> list[str]:
    """The Keras backends of ``paths``, once each, those whose Keras is installed."""
    backends: list[str] = [str(p.options["keras"].backend) for p in paths if "keras" in p.options]
    return [b for b in dict.fromkeys(backends) if _missing(b) is None]


def start_workers_for(paths: list[ExecutionPath]) -> None:
    """Start the workers of the Keras paths among ``paths``, on any device, side by side, and wait until each is
    ready (:func:`.pool.start_workers`): on a 2-core CPU one after another cost 3-4 s each."""
    from .pool import start_workers

    start_workers(_backends(paths))


def available(path: ExecutionPath, device: DeviceInfo) -> str | None:
    options = path.options["keras"]
    reason = _missing(options.backend)
    if reason:
        return reason
    if path.device != "cuda":
        return None
    from .pool import get_worker
    from .transport import KerasUnavailable

    try:
        info = get_worker(options.backend).handshake()
    except KerasUnavailable as exc:
        return str(exc)
    if not info.get("gpus"):
        return _gpu_missing(options.backend, info)
    if path.kernel == "cudnn" and options.backend == "torch" and not info.get("cudnn"):
        return f"torch {info.get('torch')} has no cuDNN"
    if path.kernel == "cudnn" and options.backend == "jax" and not info.get("cudnn_rnn"):
        return f"jaxlib {info.get('jax')} has no cuDNN RNN (jax.experimental.rnn needs the CUDA plugin's gpu_rnn)"
    need = path.options.get("min_capability")
    capability = (device.fingerprint or {}).get("capability")
    if need and capability:
        major, minor = (int(p) for p in capability.split(".")[:2])
        if (major, minor) < need:
            return f"compute capability {capability} has no TF32; this path claims TF32 math"
    return None


def known_bug(path: ExecutionPath, spec: LayerSpec) -> str | None:
    try:
        version = importlib.metadata.version("keras")
    except importlib.metadata.PackageNotFoundError:
        return None
    options = path.options["keras"]
    for key, text in KNOWN_KERAS_BUGS.get(version, []):
        if key == "unroll+bidirectional+mask" and options.unroll and spec.bidirectional:
            from .layer import mask_style

            if mask_style(spec, options) != "none":
                return text
        if key == "jax+mixed+gru-no-bias" and _runs_fused_jax_gru(options, spec) and not spec.bias:
            return text
        if key == "jax+cudnn+backwards+stacked" and _is_jax_cudnn_backwards(path) and spec.num_layers > 1:
            return text
    return None


def _is_jax_cudnn_backwards(path: ExecutionPath) -> bool:
    options = path.options["keras"]
    return options.backend == "jax" and options.go_backwards and path.kernel == "cudnn"


def _runs_fused_jax_gru(options: Any, spec: LayerSpec) -> bool:
    """A GRU that Keras's JAX backend sends to its fused scan, under a mixed dtype policy."""
    from .layer import mask_style

    return (
        options.backend == "jax"
        and options.dtype_policy != "float32"
        and spec.cell == "gru"
        and spec.reset_after
        and not options.unroll
        and not options.recurrent_dropout
        and options.use_cudnn is not False
        and mask_style(spec, options) == "none"
    )


def supports_kernel(path: ExecutionPath, spec: LayerSpec) -> str | None:
    """Whether the path can run ``spec`` at all (kernel-only paths included)."""
    from ...observation.explain import explain
    from .layer import unsupported

    options = path.options["keras"]
    if spec.dtype != "float32":
        return (
            f"Keras paths run float32 specs (got {spec.dtype}); mixed precision is a Keras dtype policy, which the "
            "keras-jax-*-mixed-* paths set on float32 specs"
        )
    reason = unsupported(spec, options)
    if reason:
        return reason
    bug = known_bug(path, spec)
    if bug:
        return bug
    if path.kernel == "cudnn":
        verdict = explain(spec, path.framework, path.device, options)
        if verdict.kernel != "cudnn" or verdict.raises:
            why = "; ".join(r.finding for r in verdict.reasons) or verdict.raises
            return f"{path.name} claims cuDNN; this spec is not eligible: {why}"
    if path.options.get("off_cudnn") and explain(spec, path.framework, path.device, options).kernel == "cudnn":
        return f"{path.name} takes the specs kept off cuDNN; this one is eligible (the cuDNN path checks it)"
    return None


def supports(path: ExecutionPath, spec: LayerSpec) -> str | None:
    kernel_only = path.options.get("kernel_only")
    if kernel_only:
        return f"kernel-only: {kernel_only} (suites/test_keras_explainer.py checks its kernel)"
    return supports_kernel(path, spec)


# ---------------------------------------------------------------------------------------------- runner
class KerasRun:
    """A Keras stack prepared in the worker of its backend; each call is one round trip."""

    def __init__(self, path: ExecutionPath, case: Case, device: DeviceInfo) -> None:
        from .pool import get_worker
        from .runners import case_arrays
        from .transport import narrow

        self.path = path
        self.options = path.options["keras"]
        self.worker = get_worker(self.options.backend)
        self.handle = self.worker.request(
            "prepare",
            spec=case.spec.to_dict(),
            options=self.options.to_dict(),
            arrays=narrow(case_arrays(case)),
            device=device.kind,
        )

    def _call(self, method: str, *args: Any) -> Any:
        return self.worker.request("call", handle=self.handle, method=method, args=args)

    def run(self) -> PathResult:
        result = self._call("run")
        notes = result.pop("notes", [])
        return PathResult(notes=notes, **result)

    def forward(self) -> object:
        return self._call("forward")

    def train_step(self) -> object:
        return self._call("train_step")

    def trace_forward(self) -> KernelTrace:
        return self._call("trace_forward")

    def synchronize(self) -> None:
        self._call("synchronize")

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


def prepare(path: ExecutionPath, case: Case, device: DeviceInfo) -> KerasRun:
    return KerasRun(path, case, device)
