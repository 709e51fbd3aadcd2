"""The cuDNN eligibility explainer: which kernel a layer will run, and every reason it is not cuDNN.

``explain(spec, framework, device, options)`` predicts the kernel family and precision of a layer and lists
each reason that keeps it off cuDNN, with the change that would make it eligible and what that change costs.
The rules are read from the library source named in each rule (``source``) at the version in
:data:`RULES_READ_FROM`; :func:`explain` notes when the installed version differs. Frameworks:

* ``keras-tensorflow``: Keras 3 on TensorFlow. The layer (``keras/src/layers/rnn/lstm.py``/``gru.py``,
  ``inner_loop``) tries ``backend.lstm/gru`` when ``use_cudnn in ("auto", True)`` and ``recurrent_dropout == 0``;
  ``keras/src/backend/tensorflow/rnn.py`` ``cudnn_ok`` then needs tanh/sigmoid, no unroll, a bias, for GRU
  ``reset_after=True``, and a GPU TensorFlow can see; otherwise ``NotImplementedError`` -> the generic loop, or,
  with ``use_cudnn=True``, a ``ValueError``. A mask that is not strictly right-padded fails the cuDNN path's
  ``tf.Assert`` (inside ``tf.function``; an eager call falls back).
* ``keras-torch``: Keras 3 on PyTorch (``keras/src/backend/torch/rnn.py``). Same layer gate; the backend's
  ``lstm``/``gru`` raise ``NotImplementedError`` for any mask (and GRU ``reset_after=False``), and otherwise run
  ``torch._VF.lstm/gru`` only for CUDA inputs passing ``cudnn_ok``; every other case runs Keras's own torch loop
  *without raising*, so ``use_cudnn=True`` does not guarantee cuDNN there.
* ``keras-jax``: Keras 3 on JAX (``keras/src/backend/jax/rnn.py``). Same layer gate; ``lstm`` raises
  ``NotImplementedError`` for any mask and unless ``cudnn_ok`` (tanh/sigmoid, no unroll, a bias, and JAX's
  *default* backend a GPU), and otherwise calls ``jax.experimental.rnn.lstm``, which lowers to cuDNN (TF32
  allowed unless ``jax_default_matmul_precision`` is ``highest``). JAX has no cuDNN GRU: ``gru`` runs the
  backend's own fused ``lax.scan`` (input projection hoisted) for ``reset_after=True`` without mask or unroll,
  on any device, and raises ``NotImplementedError`` otherwise. Every non-cuDNN layer is an XLA-compiled loop
  (``jax-generic``). With ``use_cudnn=True`` each ``NotImplementedError`` becomes the layer's ``ValueError``.
* ``torch``: ``torch.nn.LSTM``/``GRU`` (aten/src/ATen/native/RNN.cpp): cuDNN for CUDA inputs when
  ``cudnn.enabled`` (bfloat16 needs cuDNN >= 9.13); on the CPU oneDNN for dense float32/bfloat16 LSTM without
  projections, else the native kernels.
* ``torch-compile``: ``torch.compile`` of the torch layer. Dynamo graph-breaks on RNN modules unless
  ``torch._dynamo.config.allow_rnn`` (``Context.compile_allow_rnn``) is set, so the layer runs eagerly on
  the kernel the ``torch`` rules pick, and ``mode="reduce-overhead"`` has no graph to capture around it
  (torch/_dynamo/variables/builder.py). With ``allow_rnn`` on CUDA ``aten::lstm``/``gru`` is decomposed
  (torch/_decomp/decompositions.py ``lstm_impl``) into matmuls and inductor kernels: it leaves cuDNN. On
  the CPU inductor keeps oneDNN's ``mkldnn_rnn_layer`` for an LSTM oneDNN takes.
* ``onnxruntime``: ``torch.onnx.export`` (dynamo exporter) then ONNX Runtime. Not a cuDNN question: the
  rules say what makes the export or the session fail (a packed sequence, ``proj_size``) and which
  execution provider runs the ONNX ``LSTM``/``GRU`` node (``ort-rnn`` on the CPU, ``ort-cuda-rnn`` with
  onnxruntime-gpu's CUDA provider; the routine inside the provider's kernel is not observable).

Each rule is an entry of :data:`RULES`; a rule removed from the table (``explain(..., rules=...)``) makes the
explainer disagree with the library, which the tests use to show the agreement check can fail.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..model.keras_options import Backend, KerasOptions, mask_style
from ..model.precision import DTYPE_PRECISION
from ..model.spec import Cell, LayerSpec
from .torch_trace import torch_trace

#: the library versions the rules below were read from (installed source, keras/src/..., torch RNN.cpp docs)
RULES_READ_FROM = {"keras": "3.15.1", "tensorflow": "2.21.0", "torch": "2.13.0", "jax": "0.10.2", "onnxscript": "0.7.2"}

FRAMEWORKS = ("keras-tensorflow", "keras-torch", "keras-jax", "torch", "torch-compile", "onnxruntime")
_ALIASES = {
    "keras-tensorflow": "keras-tensorflow", "keras-tf": "keras-tensorflow", "keras": "keras-tensorflow",
    "tensorflow": "keras-tensorflow", "tf": "keras-tensorflow",
    "keras-torch": "keras-torch", "keras-pytorch": "keras-torch",
    "keras-jax": "keras-jax", "jax": "keras-jax",
    "torch": "torch", "pytorch": "torch",
    "torch-compile": "torch-compile", "torch.compile": "torch-compile", "compile": "torch-compile",
    "onnxruntime": "onnxruntime", "onnx": "onnxruntime", "ort": "onnxruntime",
}  # fmt: skip
_KERAS_LSTM = "keras/src/layers/rnn/lstm.py LSTM.inner_loop (gru.py GRU.inner_loop)"
_TF_RNN = "keras/src/backend/tensorflow/rnn.py"
_TORCH_RNN = "keras/src/backend/torch/rnn.py"
_JAX_RNN = "keras/src/backend/jax/rnn.py"
_ATEN = "aten/src/ATen/native/RNN.cpp (use_cudnn / use_mkldnn)"
_DYNAMO = "torch/_dynamo/variables/builder.py (allow_rnn); torch/_decomp/decompositions.py lstm_impl/gru_impl"
_ONNX = "torch/onnx/_internal/exporter (dynamo exporter) with onnxscript's aten::lstm/gru -> ONNX LSTM/GRU"
_TORCHES = ("torch", "torch-compile")


class ExplainError(ValueError):
    """An input the explainer cannot judge (unknown framework, a spec the framework cannot express)."""


@dataclass(frozen=True)
class Context:
    """Facts about the machine the layer runs on (defaults: what a healthy GPU or CPU machine has)."""

    device: str = "cpu"  # "cpu" or "cuda"
    gpu_visible: bool | None = None  # TensorFlow lists a GPU / torch.cuda.is_available(); None: device=="cuda"
    cudnn_available: bool = True
    cudnn_enabled: bool = True  # torch.backends.cudnn.enabled
    cudnn_version: int | None = None
    capability: tuple[int, int] | None = None  # None: assumed >= 8.0 (TF32-capable) on CUDA
    tf32: bool = True  # TF tensor_float_32_execution / torch cudnn.allow_tf32 (both default on)
    torch_matmul_tf32: bool = False  # torch.backends.cuda.matmul.allow_tf32 (default off)
    mkldnn_enabled: bool = True
    compiling: bool = False  # inside torch.compile / torch.jit tracing
    compile_allow_rnn: bool = False  # torch._dynamo.config.allow_rnn (framework torch-compile)
    ort_cuda_provider: bool = True  # onnxruntime lists CUDAExecutionProvider (framework onnxruntime, device cuda)

    @property
    def sees_gpu(self) -> bool:
        return self.device == "cuda" if self.gpu_visible is None else self.gpu_visible

    @property
    def tf32_capable(self) -> bool:
        return self.device == "cuda" and (self.capability is None or self.capability >= (8, 0))


@dataclass(frozen=True)
class Reason:
    """One thing keeping the layer off cuDNN."""

    rule: str
    finding: str
    change: str
    cost: str
    source: str
    effect: str = "fallback"  # "fallback" (another kernel runs) or "error" (the call raises)

    def describe(self) -> str:
        text = f"{self.finding}\n    change: {self.change}\n    cost: {self.cost}\n    source: {self.source}"
        if self.effect == "error":
            text += "\n    effect: the call raises instead of falling back"
        return text

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Verdict:
    """The explainer's prediction for one layer on one framework and device."""

    framework: str
    device: str
    spec: LayerSpec
    options: KerasOptions | None
    kernel: str
    precision: str
    reasons: tuple[Reason, ...]
    raises: str | None = None
    notes: tuple[str, ...] = ()
    rules_from: str = ""

    @property
    def eligible(self) -> bool:
        return self.kernel == "cudnn" and not self.reasons and self.raises is None

    def config(self) -> str:
        text = f"{self.framework} {self.spec.short()}"
        if self.options is not None:
            text += f" [{self.options.short()}]"
        return text

    def describe(self) -> str:
        lines = [f"{self.config()} on {self.device}: predicted {self.kernel}/{self.precision}"]
        if self.raises:
            lines.append(f"  raises: {self.raises}")
        if not self.reasons:
            if self.kernel == "cudnn":
                lines.append("  eligible for cuDNN")
            elif self.kernel == "onednn":
                lines.append("  runs oneDNN, the CPU's fast kernel (cuDNN needs a GPU)")
            else:
                lines.append("  no reason found")
        for i, reason in enumerate(self.reasons, 1):
            lines.append(f"  {i}. " + reason.describe())
        lines += [f"  note: {n}" for n in self.notes]
        lines.append(f"  rules read from {self.rules_from}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "framework": self.framework,
            "device": self.device,
            "spec": self.spec.to_dict(),
            "options": None if self.options is None else self.options.to_dict(),
            "kernel": self.kernel,
            "precision": self.precision,
            "reasons": [r.to_dict() for r in self.reasons],
            "raises": self.raises,
            "notes": list(self.notes),
            "rules_from": self.rules_from,
        }


# ------------------------------------------------------------------------------------------------ rules
Check = Callable[[LayerSpec, KerasOptions, Context], "str | None"]


@dataclass(frozen=True)
class Rule:
    """``check`` returns the finding (or None); ``change``/``cost`` may use ``{finding}``-free format keys."""

    id: str
    frameworks: tuple[str, ...]
    check: Check
    change: Callable[[LayerSpec, KerasOptions, Context], str]
    cost: str
    source: str
    effect: str = "fallback"
    raises_when_forced: tuple[str, ...] = ()  # frameworks where use_cudnn=True turns this into a ValueError


def _no_mask_rule(backend: str, name: str, source: str, loop: str) -> Rule:
    """Keras's torch and JAX backends have no masked cuDNN or fused path: any mask sends the layer to ``loop``."""
    framework = f"keras-{backend}"
    return Rule(
        f"{backend}_mask", (framework,),
        lambda s, o, c: (
            f"a {mask_style(s, o)}-padded mask: Keras's {name} backend has no masked cuDNN or fused path "
            f"(lstm()/gru() raise NotImplementedError) and runs {loop}"
            if mask_style(s, o) != "none" else None
        ),
        lambda s, o, c: "drop the mask: batch sequences of equal length (bucketing), or use the TensorFlow backend, "
        "whose cuDNN path takes right-padded masks",
        "without a mask padded steps update the state; bucketing changes how batches are formed",
        f"{source} lstm/gru: `if mask is not None: raise NotImplementedError`",
        raises_when_forced=(framework,),
    )  # fmt: skip


_K = ("keras-tensorflow", "keras-torch", "keras-jax")
_KJ = ("keras-tensorflow", "keras-jax")  # backends whose lstm() raises where cudnn_ok fails (ValueError if forced)
RULES: tuple[Rule, ...] = (
    Rule(
        "use_cudnn", _K,
        lambda s, o, c: "use_cudnn=False: the layer never tries the cuDNN kernel" if o.use_cudnn is False else None,
        lambda s, o, c: "use_cudnn=False -> 'auto'",
        "none for the math (results change within float tolerance); on TensorFlow the cuDNN op is not XLA-"
        "compilable, so Keras turns jit_compile off for the model",
        _KERAS_LSTM,
    ),
    Rule(
        "recurrent_dropout", _K,
        lambda s, o, c: (
            f"recurrent_dropout={o.recurrent_dropout}: the layer skips cuDNN whenever it is non-zero (inference too)"
            if o.recurrent_dropout else None
        ),
        lambda s, o, c: f"recurrent_dropout={o.recurrent_dropout} -> 0",
        "loses recurrent dropout (regularisation of the state); use dropout= on the inputs or Dropout layers "
        "between recurrent layers instead",
        _KERAS_LSTM + ": `if not self.recurrent_dropout`",
        raises_when_forced=_K,
    ),
    Rule(
        "activation", _K,
        lambda s, o, c: f"activation={o.activation!r} is not tanh" if o.activation != "tanh" else None,
        lambda s, o, c: f"activation={o.activation!r} -> 'tanh'",
        "changes the layer's function: weights trained with the other activation do not carry over; retrain",
        f"{_TF_RNN} _do_{{lstm,gru}}_arguments_support_cudnn; {_TORCH_RNN} cudnn_ok; {_JAX_RNN} cudnn_ok",
        raises_when_forced=_KJ,
    ),
    Rule(
        "recurrent_activation", _K,
        lambda s, o, c: (
            f"recurrent_activation={o.recurrent_activation!r} is not sigmoid"
            if o.recurrent_activation != "sigmoid" else None
        ),
        lambda s, o, c: f"recurrent_activation={o.recurrent_activation!r} -> 'sigmoid'",
        "changes the gates' function: retrain (hard_sigmoid models lose their cheap gate, no gain on GPU)",
        f"{_TF_RNN} _do_{{lstm,gru}}_arguments_support_cudnn; {_TORCH_RNN} cudnn_ok; {_JAX_RNN} cudnn_ok",
        raises_when_forced=_KJ,
    ),
    Rule(
        "unroll", _K,
        lambda s, o, c: "unroll=True: cuDNN runs the rolled loop only" if o.unroll else None,
        lambda s, o, c: "unroll=True -> False",
        "none for the math; unrolling only pays off for very short sequences and grows the graph",
        f"{_TF_RNN} cudnn_ok; {_TORCH_RNN} cudnn_ok; {_JAX_RNN} cudnn_ok",
        raises_when_forced=_KJ,
    ),
    Rule(
        "use_bias", _K,
        lambda s, o, c: "use_bias=False: cuDNN needs the bias" if not s.bias else None,
        lambda s, o, c: "use_bias=False -> True",
        "adds a bias per gate; with bias_initializer='zeros' (and unit_forget_bias=False) it starts as the same "
        "function and is then trained",
        f"{_TF_RNN} cudnn_ok; {_TORCH_RNN} cudnn_ok; {_JAX_RNN} cudnn_ok",
        raises_when_forced=_KJ,
    ),
    Rule(
        "reset_after", _K,
        lambda s, o, c: (
            "GRU reset_after=False: cuDNN implements the reset-after GRU only"
            if s.cell == "gru" and not s.reset_after else None
        ),
        lambda s, o, c: "reset_after=False -> True",
        "a different GRU (reset gate applied after the recurrent product, a second bias): weights do not carry "
        "over exactly; retrain",
        f"{_TF_RNN} _do_gru_arguments_support_cudnn; {_TORCH_RNN} gru, {_JAX_RNN} gru (raise NotImplementedError)",
        raises_when_forced=_K,
    ),
    Rule(
        "tf_gpu", ("keras-tensorflow",),
        lambda s, o, c: (
            "TensorFlow sees no GPU (tf.config.list_logical_devices('GPU') is empty)" if not c.sees_gpu else None
        ),
        lambda s, o, c: "run where TensorFlow sees a GPU (pip install 'tensorflow[and-cuda]' on an NVIDIA machine)",
        "none for the layer; needs a GPU machine",
        f"{_TF_RNN} cudnn_ok -> _is_gpu_available",
        raises_when_forced=("keras-tensorflow",),
    ),
    Rule(
        "tf_mask", ("keras-tensorflow",),
        lambda s, o, c: (
            f"mask is {mask_style(s, o)}-padded, not strictly right-padded: the cuDNN path's tf.Assert fails inside "
            "tf.function (InvalidArgumentError); an eager call falls back to the generic loop"
            if mask_style(s, o) in ("left", "holes") else None
        ),
        lambda s, o, c: f"mask {mask_style(s, o)}-padded -> right-padded (pad_sequences(padding='post'))",
        "none when the data can be re-padded at the end; masks with holes must be compacted first",
        f"{_TF_RNN} _assert_valid_mask / _is_sequence_right_padded",
        effect="error",
    ),
    _no_mask_rule("torch", "torch", _TORCH_RNN, "the generic RNN loop"),
    Rule(
        "torch_device", ("keras-torch",),
        lambda s, o, c: (
            "inputs on the CPU: Keras's torch backend calls torch._VF.lstm/gru (where cuDNN runs) only for CUDA "
            "tensors; on the CPU it runs its own per-step loop (not even oneDNN)"
            if c.device != "cuda" else None
        ),
        lambda s, o, c: "run on a CUDA device (keras.device('cuda') / a GPU runner)",
        "none for the layer; needs a GPU machine",
        f"{_TORCH_RNN} lstm: `device.type == 'cuda'`",
    ),
    Rule(
        "torch_cudnn_available", ("keras-torch",),
        lambda s, o, c: (
            "torch has no usable cuDNN (torch.backends.cudnn.is_available() is False)"
            if c.device == "cuda" and (not c.cudnn_available or not c.sees_gpu) else None
        ),
        lambda s, o, c: "install a CUDA build of torch with cuDNN",
        "none for the layer",
        f"{_TORCH_RNN} _is_cuda_cudnn_available",
    ),
    Rule(
        "torch_compiling", ("keras-torch",),
        lambda s, o, c: "inside torch.compile / torch.jit tracing: Keras skips cuDNN" if c.compiling else None,
        lambda s, o, c: "call the layer eagerly (outside torch.compile)",
        "loses whatever compilation gained elsewhere in the model",
        f"{_TORCH_RNN} lstm: `torch.compiler.is_compiling()`",
    ),
    Rule(
        "jax_gru", ("keras-jax",),
        lambda s, o, c: (
            "GRU on JAX: jax.experimental.rnn has a cuDNN LSTM but no GRU, so Keras's JAX backend never runs a GRU "
            "on cuDNN; reset_after=True without mask or unroll runs its fused lax.scan (input projection hoisted "
            "out of the loop), anything else Keras's cell loop"
            if s.cell == "gru" else None
        ),
        lambda s, o, c: "KERAS_BACKEND=jax -> tensorflow or torch (both run GRU(reset_after=True) on cuDNN), or "
        "GRU -> LSTM on JAX",
        "another backend changes the whole program's framework (weights carry over through keras.saving); an LSTM "
        "is a different layer (about 4/3 the parameters): retrain",
        f"{_JAX_RNN} gru (no cuDNN call), bidirectional_gru (raises NotImplementedError)",
    ),
    Rule(
        "jax_gpu", ("keras-jax",),
        lambda s, o, c: (
            "JAX's default backend is not a GPU (jax.default_backend() != 'gpu'): Keras's JAX backend tries cuDNN "
            "only when it is"
            if not c.sees_gpu and s.cell == "lstm" else None
        ),
        lambda s, o, c: "run where JAX's default backend is a GPU (pip install 'jax[cuda13]' on an NVIDIA machine)",
        "none for the layer; needs a GPU machine",
        f"{_JAX_RNN} cudnn_ok -> _is_gpu_available",
        raises_when_forced=("keras-jax",),
    ),
    _no_mask_rule("jax", "JAX", _JAX_RNN, "Keras's cell loop"),
    Rule(
        "cudnn_disabled", ("keras-torch", *_TORCHES),
        lambda s, o, c: (
            "torch.backends.cudnn.enabled is False: torch._VF.lstm/gru runs PyTorch's generic CUDA kernels"
            if c.device == "cuda" and not c.cudnn_enabled else None
        ),
        lambda s, o, c: "torch.backends.cudnn.enabled=False -> True",
        "none (results change within float tolerance; cudnn.deterministic if bitwise reproducibility matters)",
        _ATEN,
    ),
    Rule(
        "bf16_cudnn", ("keras-torch", *_TORCHES),
        lambda s, o, c: (
            f"bfloat16 with cuDNN {c.cudnn_version}: cuDNN RNNs take bfloat16 from 9.13 on"
            if c.device == "cuda" and s.dtype == "bfloat16" and (c.cudnn_version or 0) < 91300 else None
        ),
        lambda s, o, c: "dtype bfloat16 -> float16 (or cuDNN >= 9.13)",
        "float16 has less range than bfloat16: loss scaling may be needed",
        _ATEN,
    ),
    Rule(
        "torch_cpu_onednn", _TORCHES,
        lambda s, o, c: _off_onednn(s, c),
        lambda s, o, c: _onto_onednn(s, c),
        "the CPU's fastest LSTM kernel is oneDNN's; a GRU, a projection or a packed sequence has none there",
        _ATEN,
    ),
    Rule(
        "compile_allow_rnn", ("torch-compile",),
        lambda s, o, c: (
            "torch._dynamo.config.allow_rnn=True: Dynamo traces the layer and aten::lstm/gru is decomposed into "
            "per-step matmuls and inductor's generated kernels (family inductor), off cuDNN"
            if c.compile_allow_rnn and c.device == "cuda" else None
        ),
        lambda s, o, c: "allow_rnn=True -> False (the default): Dynamo graph-breaks on the layer, which runs cuDNN",
        "the layer is no longer compiled: no fusion across it, and mode='reduce-overhead' replays no CUDA graph "
        "of it (the eager call's host overhead stays)",
        _DYNAMO,
    ),
    Rule(
        "onnx_packed", ("onnxruntime",),
        lambda s, o, c: (
            "a PackedSequence: torch.export cannot trace pack_padded_sequence (data-dependent batch sizes), so "
            "torch.onnx.export raises TorchExportError"
            if s.length_mode == "packed" else None
        ),
        lambda s, o, c: "export the layer on padded input (length_mode packed -> padded); mask or slice the outputs "
        "after the session",
        "padded steps update the state (the ONNX LSTM's sequence_lens input is not filled by the exporter)",
        _ONNX, effect="error",
    ),
    Rule(
        "onnx_proj", ("onnxruntime",),
        lambda s, o, c: (
            f"proj_size={s.proj_size}: ONNX's LSTM has no projection; the exporter emits a plain LSTM node without "
            "weight_hr, and the session fails at run time (\"Input initial_c must have shape ...\")"
            if s.proj_size else None
        ),
        lambda s, o, c: f"proj_size={s.proj_size} -> 0 (or a Linear after an LSTM without projection)",
        "changes the layer: a projected LSTM's weights do not carry over; retrain",
        _ONNX, effect="error",
    ),
    Rule(
        "onnx_cuda_provider", ("onnxruntime",),
        lambda s, o, c: (
            "onnxruntime lists no CUDAExecutionProvider (the CPU package is installed): the session runs on "
            "the CPU provider" if c.device == "cuda" and not c.ort_cuda_provider else None
        ),
        lambda s, o, c: "pip install onnxruntime-gpu (it replaces onnxruntime) on a machine with CUDA",
        "none for the layer; a GPU build of ONNX Runtime matching the machine's CUDA",
        "onnxruntime.get_available_providers()",
    ),
)  # fmt: skip


# ------------------------------------------------------------------------------------------------ explain
def normalize_framework(framework: str) -> str:
    key = str(framework).strip().lower()
    if key not in _ALIASES:
        raise ExplainError(
            f"unknown framework {framework!r} (valid: {', '.join(FRAMEWORKS)}; aliases: "
            f"{', '.join(sorted(set(_ALIASES) - set(FRAMEWORKS)))})"
        )
    return _ALIASES[key]


def installed_versions() -> dict[str, str | None]:
    """Installed versions, read from package metadata (imports nothing)."""
    out: dict[str, str | None] = {}
    for name, dist in (("keras", "keras"), ("tensorflow", "tensorflow"), ("torch", "torch"), ("jax", "jax")):
        version = None
        for candidate in (dist, f"{dist}-cpu"):
            try:
                version = importlib.metadata.version(candidate)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
        out[name] = version
    return out


def _off_onednn(spec: LayerSpec, ctx: Context) -> str | None:
    """Why a torch layer on the CPU does not run oneDNN (the CPU's fast kernel; ``use_mkldnn`` in RNN.cpp), or
    ``None`` where it does or the device is a GPU. On the CPU the question is oneDNN, not cuDNN."""
    if ctx.device == "cuda":
        return None
    if spec.cell == "gru":
        return "GRU on the CPU: PyTorch's oneDNN RNN is LSTM-only, a GRU runs the native CPU kernels"
    if spec.proj_size:
        return f"proj_size={spec.proj_size}: PyTorch's oneDNN LSTM has no projection"
    uniform = spec.lengths is not None and len(set(spec.lengths)) == 1
    if spec.length_mode == "packed" and not uniform:
        # a packed batch of one length is a dense batch: PyTorch hands it to oneDNN (seen with torch 2.13)
        return "a PackedSequence of several lengths: PyTorch's oneDNN LSTM runs dense sequences only"
    if not ctx.mkldnn_enabled:
        return "torch.backends.mkldnn.enabled is False"
    if spec.dtype not in ("float32", "bfloat16"):
        return f"dtype {spec.dtype}: PyTorch's oneDNN LSTM takes float32 or bfloat16 on the CPU"
    return None


def _onto_onednn(spec: LayerSpec, ctx: Context) -> str:
    if spec.cell == "gru":
        return "none for nn.GRU on the CPU (a GPU runs it on cuDNN); nn.LSTM runs oneDNN"
    if spec.proj_size:
        return f"proj_size={spec.proj_size} -> 0 (a Linear after the LSTM)"
    if spec.length_mode == "packed":
        return (
            "pad the batch and pass the padded tensor; padding changes the final state of the shorter sequences "
            "(h_n/c_n then hold the state after their padded steps, not at each sequence's end, and a reverse "
            "direction starts in the padding): take each sequence's output at its own last step "
            "(output[b, length_b - 1]) where h_n was used, and mask the padded steps in the loss"
        )
    if not ctx.mkldnn_enabled:
        return "torch.backends.mkldnn.enabled=False -> True"
    return f"dtype {spec.dtype} -> float32 (or bfloat16)"


def context_for(device: Any, **overrides: Any) -> Context:
    """A :class:`Context` from ``"cpu"``/``"cuda"``/a DeviceInfo, reading torch's switches if torch is loaded."""
    kind = getattr(device, "kind", None) or str(device).split(":")[0].strip().lower()
    if kind not in ("cpu", "cuda"):
        raise ExplainError(f"unknown device {device!r} (valid: cpu, cuda, cuda:N)")
    values: dict[str, Any] = {"device": kind}
    fingerprint = getattr(device, "fingerprint", None) or {}
    if fingerprint.get("capability"):
        try:
            major, minor = (int(p) for p in str(fingerprint["capability"]).split(".")[:2])
            values["capability"] = (major, minor)
        except ValueError:
            pass
    if str(fingerprint.get("cudnn", "")).isdigit():
        values["cudnn_version"] = int(fingerprint["cudnn"])
    torch = sys.modules.get("torch")
    if torch is not None:  # read the switches only where torch is already loaded (never import it here)
        try:
            values["cudnn_enabled"] = bool(torch.backends.cudnn.enabled)
            values["tf32"] = bool(torch.backends.cudnn.allow_tf32)
            values["torch_matmul_tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)
            values["mkldnn_enabled"] = bool(torch.backends.mkldnn.enabled)
            if kind == "cuda" and "cudnn_version" not in values and torch.backends.cudnn.is_available():
                values["cudnn_version"] = torch.backends.cudnn.version()
        except AttributeError:  # pragma: no cover - partial torch builds
            pass
    values.update(overrides)
    return Context(**values)


def explain(
    spec: LayerSpec,
    framework: str = "keras-tensorflow",
    device: Any = "cpu",
    options: KerasOptions | None = None,
    *,
    context: Context | None = None,
    rules: Sequence[Rule] | None = None,
) -> Verdict:
    """Predict the kernel family and precision of ``spec`` and list every reason it is not cuDNN."""
    framework = normalize_framework(framework)
    ctx = context if context is not None else context_for(device)
    table = RULES if rules is None else tuple(rules)
    notes: list[str] = []
    if framework in ("torch-compile", "onnxruntime"):
        if options is not None and options.differences():
            raise ExplainError(f"Keras options {options.short()} given for framework {framework!r}")
        return _explain_exported(spec, framework, ctx, table)
    if framework == "torch":
        if spec.cell == "gru" and not spec.reset_after:
            raise ExplainError("PyTorch's GRU is reset-after only: reset_after=False exists in Keras alone")
        if options is not None and options.differences():
            raise ExplainError(f"Keras options {options.short()} given for framework 'torch'")
        opts = KerasOptions()
    else:
        keras_backends: dict[str, Backend] = {"keras-tensorflow": "tensorflow", "keras-jax": "jax"}
        backend = keras_backends.get(framework, "torch")
        opts = (options or KerasOptions(backend=backend)).replace(backend=backend)
        if spec.proj_size:
            raise ExplainError(f"proj_size={spec.proj_size}: Keras's LSTM has no projection (PyTorch-only feature)")
    reasons = []
    forced_error = False
    for rule in table:
        if framework not in rule.frameworks:
            continue
        finding = rule.check(spec, opts, ctx)
        if finding is None:
            continue
        reasons.append(Reason(rule.id, finding, rule.change(spec, opts, ctx), rule.cost, rule.source, rule.effect))
        if framework in rule.raises_when_forced and not _jax_gru_runs_fused(framework, spec, rule.id):
            forced_error = True
    blocking = [r for r in reasons if r.effect == "fallback"]
    raises = None
    if framework == "torch":
        kernel = _torch_kernel(spec, ctx, blocking)
    elif blocking:
        if framework == "keras-tensorflow":
            kernel = "tf-generic"
        elif framework == "keras-jax":
            kernel = "jax-generic"
        elif ctx.device == "cuda" and {r.rule for r in blocking} == {"cudnn_disabled"}:
            kernel = "cuda-generic"  # torch._VF.lstm with cuDNN off: PyTorch's generic CUDA kernels
        else:
            kernel = "cuda-generic" if ctx.device == "cuda" else "cpu-native"
        if opts.use_cudnn is True and forced_error:
            raises = (
                "ValueError: use_cudnn=True was specified, but cuDNN is not supported for this layer "
                "configuration with this backend"
            )
        elif opts.use_cudnn is True and framework == "keras-torch":
            notes.append("use_cudnn=True does not raise here: Keras's torch backend falls back to its own loop")
        elif opts.use_cudnn is True and framework == "keras-jax":
            notes.append("use_cudnn=True does not raise here: Keras's JAX backend counts its fused GRU scan as the "
                         "fast path")  # fmt: skip
    else:
        kernel = "cudnn"
        errors = [r for r in reasons if r.effect == "error"]
        if errors:
            raises = "InvalidArgumentError (tf.Assert in the cuDNN path): " + errors[0].finding.split(":")[0]
    precision = _precision(framework, spec, kernel, ctx, opts.dtype_policy)
    if framework != "torch" and spec.bidirectional and kernel == "cudnn":
        notes.append(
            "bidirectional: two cuDNN calls on TensorFlow; one fused call on the torch and JAX backends when the "
            "layer has no mask, dropout or initial-state mismatch"
        )
    if framework == "keras-torch" and kernel != "cudnn" and opts.implementation == 1 and opts.use_cudnn != False:  # noqa: E712
        notes.append("implementation=1 is ignored where Keras's torch backend runs its own fused loop")
    if ctx.device == "cuda" and ctx.capability is None and precision == "tf32":
        notes.append("compute capability unknown: TF32 assumed (Ampere or newer)")
    return Verdict(
        framework=framework,
        device=ctx.device,
        spec=spec,
        options=None if framework == "torch" else opts,
        kernel=kernel,
        precision=precision,
        reasons=tuple(reasons),
        raises=raises,
        notes=tuple(notes + _version_notes(framework)),
        rules_from=_rules_from(framework),
    )


def _jax_gru_runs_fused(framework: str, spec: LayerSpec, rule_id: str) -> bool:
    """A GRU on JAX whose ``gru()`` does not raise for this rule (it checks reset_after, unroll and the mask
    only, not the activations, the bias or the device): the fused scan runs, so ``use_cudnn=True`` is silent."""
    return framework == "keras-jax" and spec.cell == "gru" and rule_id not in ("unroll", "reset_after", "jax_mask",
                                                                                "recurrent_dropout")  # fmt: skip


def _explain_exported(spec: LayerSpec, framework: str, ctx: Context, table: Sequence[Rule]) -> Verdict:
    """torch.compile and ONNX Runtime: the rules of the table that apply to ``framework``."""
    if spec.cell == "gru" and not spec.reset_after:
        raise ExplainError("PyTorch's GRU is reset-after only: reset_after=False exists in Keras alone")
    reasons = [
        Reason(rule.id, finding, rule.change(spec, KerasOptions(), ctx), rule.cost, rule.source, rule.effect)
        for rule in table
        if framework in rule.frameworks and (finding := rule.check(spec, KerasOptions(), ctx)) is not None
    ]
    notes: list[str] = []
    raises = next((f"{r.finding.split(':')[0]}: the export or the session fails" for r in reasons
                   if r.effect == "error"), None)  # fmt: skip
    ids = {r.rule for r in reasons}
    if framework == "torch-compile":
        blocking = [r for r in reasons if r.rule != "compile_allow_rnn"]
        kernel = "inductor" if "compile_allow_rnn" in ids else _torch_kernel(spec, ctx, blocking)
        if not ctx.compile_allow_rnn:
            notes.append(
                "Dynamo graph-breaks on the layer (allow_rnn=False): it runs eagerly; mode='reduce-overhead' "
                "captures no CUDA graph around it"
            )
        elif ctx.device == "cpu" and kernel != "onednn":
            kernel = "inductor"  # decomposed cells as inductor's C++ kernels
    else:
        kernel = "ort-cuda-rnn" if ctx.device == "cuda" and "onnx_cuda_provider" not in ids else "ort-rnn"
        notes.append("ONNX Runtime runs inference only: no backward pass")
    precision = _precision("torch", spec, kernel, ctx) if framework == "torch-compile" else "fp32"
    return Verdict(
        framework=framework, device=ctx.device, spec=spec, options=None, kernel=kernel, precision=precision,
        reasons=tuple(reasons), raises=raises, notes=tuple(notes + _version_notes("torch")),
        rules_from=_rules_from(framework),
    )  # fmt: skip


def onnx_export_problems(spec: LayerSpec) -> list[str]:
    """Why ``spec`` cannot be exported to ONNX and run by ONNX Runtime (the ``onnxruntime`` rules whose
    effect is an error), as short findings; empty when it can."""
    ctx = Context()
    return [
        f"{rule.id}: {finding}"
        for rule in RULES
        if "onnxruntime" in rule.frameworks and rule.effect == "error"
        and (finding := rule.check(spec, KerasOptions(), ctx)) is not None
    ]  # fmt: skip


def _torch_kernel(spec: LayerSpec, ctx: Context, blocking: list[Reason]) -> str:
    if ctx.device == "cuda":
        return "cuda-generic" if blocking else "cudnn"
    # a packed batch whose sequences all have one length is dense: PyTorch hands it to oneDNN like a padded one
    dense = spec.length_mode != "packed" or (spec.lengths is not None and len(set(spec.lengths)) == 1)
    if (
        spec.cell == "lstm"
        and dense
        and not spec.proj_size
        and ctx.mkldnn_enabled
        and spec.dtype
        in (
            "float32",
            "bfloat16",
        )
    ):
        return "onednn"
    return "cpu-native"


_POLICY_PRECISION = {"mixed_float16": "fp16", "mixed_bfloat16": "bf16"}


def _precision(framework: str, spec: LayerSpec, kernel: str, ctx: Context, policy: str = "float32") -> str:
    base = _POLICY_PRECISION.get(policy) or DTYPE_PRECISION.get(spec.dtype, spec.dtype)
    if base != "fp32" or not ctx.tf32_capable:
        return base
    if framework in ("keras-tensorflow", "keras-jax"):
        # TF32 on by default for TF's cuDNN RNNs and MatMul alike; on JAX for XLA's fp32 dots at the default
        # precision and for jax.experimental.rnn's cuDNN call (cudnn_allow_tf32)
        return "tf32" if ctx.tf32 else base
    if kernel == "cudnn":
        return "tf32" if ctx.tf32 else base  # torch.backends.cudnn.allow_tf32 (default True)
    return "tf32" if ctx.torch_matmul_tf32 else base  # generic loops: torch matmul TF32 (default off)


def _rules_from(framework: str) -> str:
    if framework in _TORCHES:
        return f"torch {RULES_READ_FROM['torch']}"
    if framework == "onnxruntime":
        return f"torch {RULES_READ_FROM['torch']}, onnxscript {RULES_READ_FROM['onnxscript']}"
    backend = {"keras-tensorflow": "tensorflow", "keras-jax": "jax"}.get(framework, "torch")
    return f"keras {RULES_READ_FROM['keras']} ({backend} backend), {backend} {RULES_READ_FROM[backend]}"


def _version_notes(framework: str) -> list[str]:
    """Nothing where the installed release is the one the rules were read from. For torch on another release
    (with torch imported), the rules are checked against it (:func:`torch_rules_check`): a note only where a
    prediction disagrees with what the installed release runs, or where it could not be checked."""
    installed = installed_versions()
    libs = ["torch"] if framework == "torch" else ["keras"]
    notes = []
    for lib in libs:
        have = installed.get(lib)
        if have is None or have.split("+")[0] == RULES_READ_FROM[lib]:
            continue
        if lib == "torch" and "torch" in sys.modules and not _PROBING:
            check = torch_rules_check()
            if check.agrees:
                continue  # checked against the installed release: it runs what the rules predict
            notes.append(f"rules read from torch {RULES_READ_FROM['torch']}, installed torch {have}: {check.summary}")
            continue
        notes.append(f"rules read from {lib} {RULES_READ_FROM[lib]}, installed {lib} {have}: re-check the source")
    return notes


@dataclass(frozen=True)
class RulesCheck:
    """The torch rules against the installed release: each probe's prediction and what ran."""

    version: str
    results: tuple[tuple[str, str, str], ...]  # (probe, predicted, observed)
    error: str = ""

    @property
    def agrees(self) -> bool:
        return not self.error and all(p == o for _, p, o in self.results)

    @property
    def summary(self) -> str:
        if self.error:
            return f"the rules could not be checked against it ({self.error}): re-check the source"
        if self.agrees:
            return f"checked against it: {len(self.results)} probes ran what the rules predict"
        wrong = [f"{name}: predicted {p}, ran {o}" for name, p, o in self.results if p != o]
        return "the rules disagree with it (" + "; ".join(wrong) + "): re-check the source"


_PROBING = False
_RULES_CHECKS: dict[str, RulesCheck] = {}


def torch_rules_check() -> RulesCheck:
    """Check the torch rules against the installed torch, once per process and device setting: tiny
    ``nn.LSTM``/``nn.GRU`` calls on the CPU (and, where torch sees a GPU, on it, with cuDNN on and off), each
    observed from the ATen ops it dispatches and compared with :func:`explain`'s prediction. The calls run
    outside any observer of the caller (the caller's dispatch modes are off, module hooks are not called)."""
    global _PROBING
    import torch
    from torch.utils._python_dispatch import _disable_current_modes

    version = str(torch.__version__)
    cuda = torch.cuda.is_available()
    key = f"{version} cuda={cuda}"
    if key in _RULES_CHECKS:
        return _RULES_CHECKS[key]
    probes: list[tuple[Cell, str, bool]] = [("lstm", "cpu", True), ("gru", "cpu", True)]
    if cuda:
        probes += [("lstm", "cuda", True), ("gru", "cuda", True), ("lstm", "cuda", False)]
    results = []
    _PROBING = True
    try:
        with _disable_current_modes(), torch.no_grad():
            for cell, device, cudnn in probes:
                spec = LayerSpec(cell=cell, input_size=4, hidden_size=4, batch=2, seq_len=3)
                predicted = explain(spec, "torch", device, context=context_for(device, cudnn_enabled=cudnn)).kernel
                layer = (torch.nn.LSTM if cell == "lstm" else torch.nn.GRU)(4, 4).to(device)
                x = torch.randn(3, 2, 4, device=device)
                with torch.backends.cudnn.flags(enabled=cudnn), torch_trace(device, "forward", False) as out:
                    layer.forward(x)  # forward, not __call__: no module hook of the caller runs
                name = f"{cell.upper()} on {device}" + ("" if cudnn else " with cuDNN off")
                results.append((name, predicted, out[0].family))
        check = RulesCheck(version, tuple(results))
    except Exception as exc:
        check = RulesCheck(version, tuple(results), f"{type(exc).__name__}: {exc}")
    finally:
        _PROBING = False
    _RULES_CHECKS[key] = check
    return check


def fix_all(spec: LayerSpec, options: KerasOptions | None, verdict: Verdict) -> tuple[LayerSpec, KerasOptions | None]:
    """The spec and options with every reason's change applied (the cuDNN-eligible variant)."""
    rules = {r.rule for r in verdict.reasons}
    changes: dict[str, Any] = {}
    if "use_bias" in rules:
        spec = spec.replace(bias=True)
    if "reset_after" in rules:
        spec = spec.replace(reset_after=True)
    if rules & {"torch_mask", "jax_mask"} and spec.length_mode == "packed":
        spec = spec.replace(length_mode="none", lengths=None)
    if options is None:
        return spec, None
    if "use_cudnn" in rules:
        changes["use_cudnn"] = "auto"
    if "recurrent_dropout" in rules:
        changes["recurrent_dropout"] = 0.0
    if "activation" in rules:
        changes["activation"] = "tanh"
    if "recurrent_activation" in rules:
        changes["recurrent_activation"] = "sigmoid"
    if "unroll" in rules:
        changes["unroll"] = False
    if rules & {"tf_mask"}:
        changes["mask"] = "auto"
    return spec, options.replace(**changes)


def without(rule_id: str) -> tuple[Rule, ...]:
    """The rule table minus one rule (to show that agreement checks fail when a rule is missing)."""
    if rule_id not in {r.id for r in RULES}:
        raise ExplainError(f"unknown rule {rule_id!r} (valid: {', '.join(r.id for r in RULES)})")
    return tuple(r for r in RULES if r.id != rule_id)


__all__ = [
    "FRAMEWORKS",
    "RULES",
    "RULES_READ_FROM",
    "Context",
    "ExplainError",
    "Reason",
    "Rule",
    "Verdict",
    "context_for",
    "explain",
    "fix_all",
    "installed_versions",
    "normalize_framework",
    "onnx_export_problems",
    "without",
]
