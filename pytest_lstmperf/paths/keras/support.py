"""Whether a Keras path can run here and on which specs: what it needs installed and on the device (Keras 3, its
backend, a GPU the backend sees, cuDNN, TF32-capable hardware), which specs it takes (float32, the options the
layer stack builds, cuDNN eligibility by the explainer, kernel-only paths), and the upstream Keras bugs a spec
would hit on a path (``KNOWN_KERAS_BUGS``, keyed by the Keras version). The registered Keras paths
(:mod:`pytest_lstmperf.paths.keras.paths`) name :func:`available` and :func:`supports` as theirs; this module
imports neither keras nor any backend at its top, nor numpy (the layer stack, the worker pool and the transport
are imported inside the functions that use them): it loads at pytest's start-up.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from typing import TYPE_CHECKING, Any

from ...model.keras_options import mask_style
from ...observation.explain import explain

if TYPE_CHECKING:
    from ...device import DeviceInfo
    from ...model.spec import LayerSpec
    from .. import ExecutionPath
    from .transport import WorkerInfo

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


_VERSION_SEEN: dict[str, str] = {}


def keras_version() -> str | None:
    """The installed keras's version, or None where no keras distribution is found. Read once and kept: in a
    whole ``-n 2`` run of the project's tests, one pytest-xdist worker once found no keras metadata late in the
    run (the cause is not known), and the known bugs then silently stopped applying to the specs drawn after it."""
    if "keras" not in _VERSION_SEEN:
        try:
            _VERSION_SEEN["keras"] = importlib.metadata.version("keras")
        except importlib.metadata.PackageNotFoundError:
            return None
    return _VERSION_SEEN["keras"]


def missing(backend: str) -> str | None:
    """Why Keras 3 or ``backend`` is not installed here, or None."""
    if importlib.util.find_spec("keras") is None:
        return "keras is not installed (pip install 'keras>=3.10')"
    version = keras_version() or "3"
    try:
        major = int(version.split(".")[0])
    except ValueError:
        major = 3
    if major < 3:
        return f"keras {version} is Keras 2; these paths need Keras 3"
    if backend == "tensorflow" and importlib.util.find_spec("tensorflow") is None:
        return "TensorFlow is not installed (pip install tensorflow-cpu, or tensorflow[and-cuda] for the GPU paths)"
    if backend == "torch" and importlib.util.find_spec("torch") is None:
        return "torch is not installed, so Keras's torch backend cannot run"
    if backend == "jax" and importlib.util.find_spec("jax") is None:
        return "JAX is not installed (pip install 'pytest-lstmperf[jax]', or 'jax[cuda13]' for the GPU paths)"
    return None


def _gpu_missing(backend: str, info: WorkerInfo) -> str:
    if backend == "tensorflow":
        built = "a CUDA build" if info.cuda_build else "a CPU-only build"
        return f"TensorFlow {info.tensorflow} ({built}) sees no GPU, so its cuDNN and GPU paths cannot run"
    if backend == "jax":
        return (
            f"JAX {info.jax} has no GPU backend (default backend {info.default_backend!r}; "
            "pip install 'jax[cuda13]' on an NVIDIA machine)"
        )
    return f"torch {info.torch} sees no CUDA device in the Keras worker"


def available(path: ExecutionPath, device: DeviceInfo) -> str | None:
    options = path.options["keras"]
    reason = missing(options.backend)
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
    if not info.gpus:
        return _gpu_missing(options.backend, info)
    if path.kernel == "cudnn" and options.backend == "torch" and not info.cudnn:
        return f"torch {info.torch} has no cuDNN"
    if path.kernel == "cudnn" and options.backend == "jax" and not info.cudnn_rnn:
        return f"jaxlib {info.jax} has no cuDNN RNN (jax.experimental.rnn needs the CUDA plugin's gpu_rnn)"
    need = path.options.get("min_capability")
    capability = (device.fingerprint or {}).get("capability")
    if need and capability:
        major, minor = (int(p) for p in capability.split(".")[:2])
        if (major, minor) < need:
            return f"compute capability {capability} has no TF32; this path claims TF32 math"
    return None


def known_bug(path: ExecutionPath, spec: LayerSpec) -> str | None:
    version = keras_version()
    if version is None:
        return None
    options = path.options["keras"]
    for key, text in KNOWN_KERAS_BUGS.get(version, []):
        if (
            key == "unroll+bidirectional+mask"
            and options.unroll
            and spec.bidirectional
            and mask_style(spec, options) != "none"
        ):
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
