"""Kernel trace for JAX: which recurrent kernel family an XLA executable holds, read from its compiled HLO.

Keras 3 on JAX decides between cuDNN and its own loop in Python, while the function is traced; XLA then
compiles what was traced. The compiled module (``jax.jit(f).lower(*args).compile().as_text()``, every
computation, fused ones included) therefore says what runs, without running it:

* ``cudnn``: a custom call to jaxlib's cuDNN RNN (``cudnn_rnn_ffi``, backward ``cudnn_rnn_bwd_ffi``), which
  ``jax.experimental.rnn.lstm`` lowers to on CUDA (ROCm's ``hipdnn_rnn_ffi`` counts too);
* ``jax-generic``: no such call, and ``dot`` ops with the cell's non-linearities: ``tanh``, ``logistic`` (XLA's
  CPU compiler expands it into ``exponential``/``divide``), or ``maximum`` for ``relu``; in a ``while`` loop
  (``lax.scan``) or unrolled. The ops' metadata say whose loop it is: Keras's cell loop (``lstm_cell``/
  ``gru_cell``) or the JAX backend's fused GRU scan (input projection hoisted out of the loop). A ``dot`` that
  XLA simplified into a ``multiply`` (a contraction of length 1) still carries its ``op_name=".../dot_general"``
  metadata, which counts as the matmul.

Precision: the element type of the recurrent op (the cuDNN call's output, else the ``dot``s), read from the
module as lowered where the caller gives it (XLA's CPU compiler upcasts bfloat16 dots to float32). On a
TF32-capable GPU, fp32 counts as ``tf32`` where XLA may use TF32: a ``dot`` without ``operand_precision=
{highest,...}`` (JAX's default matmul precision), and a cuDNN call built with ``cudnn_allow_tf32`` (JAX's
default unless ``jax_default_matmul_precision`` is ``highest``), which the caller passes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ..model.precision import narrowest
from .torch_trace import KernelTrace

CUDNN_FORWARD_TARGETS = ("cudnn_rnn_ffi", "hipdnn_rnn_ffi")
CUDNN_BACKWARD_TARGETS = ("cudnn_rnn_bwd_ffi", "hipdnn_rnn_bwd_ffi")
#: HLO ops of a cell's gates and candidate (logistic is expanded on XLA's CPU backend)
CELL_OPS = frozenset({"tanh", "logistic", "exponential", "maximum"})
MATMUL_OPS = frozenset({"dot", "convolution"})
LOOP_OPS = frozenset({"while"})
#: HLO element types -> precision
_HLO_DTYPES = {"f32": "fp32", "f64": "fp64", "f16": "fp16", "bf16": "bf16"}
_OP = re.compile(r"\s(while|dot|convolution|tanh|logistic|exponential|maximum|custom-call)\(")
_TARGET = re.compile(r'custom_call_target="([^"]+)"')
_RESULT_TYPE = re.compile(r"=\s*\(?\s*(f64|f32|f16|bf16)\[")
_HIGHEST = re.compile(r"operand_precision=\{highest", re.IGNORECASE)
_FROM_DOT = re.compile(r'op_name="[^"]*/dot_general"')
_CELL_SCOPE = re.compile(r'op_name="[^"]*/(lstm_cell|gru_cell)/')


def hlo_ops(text: str) -> list[tuple[str, str, bool]]:
    """``(op, element type, highest precision)`` of each matmul, cell op, loop and custom call of an HLO
    module's text; a custom call is named by its target."""
    found = []
    for line in text.splitlines():
        match = _OP.search(line)
        if match is not None:
            op = match.group(1)
        elif _FROM_DOT.search(line):
            op = "dot"  # XLA rewrote a degenerate dot (a 1-wide contraction) into a multiply or a reduce
        else:
            continue
        if op == "custom-call":
            target = _TARGET.search(line)
            op = target.group(1) if target else "custom-call"
        dtype = _RESULT_TYPE.search(line)
        found.append((op, _HLO_DTYPES.get(dtype.group(1), "") if dtype else "", bool(_HIGHEST.search(line))))
    return found


def classify_hlo_ops(ops: set[str] | frozenset[str], phase: str = "forward") -> str:
    """Kernel family from the op names of :func:`hlo_ops`: ``cudnn``, ``jax-generic``, ``mixed`` or ``none``.

    A training step's module holds the forward too: for ``phase="backward"`` the backward cuDNN call stands
    for cuDNN, and a forward cuDNN call alone does not (the gradient of a generic loop is generic)."""
    forward, backward = bool(ops & set(CUDNN_FORWARD_TARGETS)), bool(ops & set(CUDNN_BACKWARD_TARGETS))
    cudnn = backward if phase == "backward" else forward
    generic = bool(ops & MATMUL_OPS) and bool(ops & CELL_OPS)
    if cudnn and generic:
        return "mixed"  # Keras adds no cell math around its cuDNN call: dots with tanh are a second loop
    if cudnn:
        return "cudnn"
    return "jax-generic" if generic else "none"


def _precision(pairs: list[tuple[str, str, bool]], family: str, tf32_capable: bool, cudnn_tf32: bool) -> str:
    if family == "cudnn":
        rec = [(d, not cudnn_tf32) for op, d, _ in pairs if op in CUDNN_FORWARD_TARGETS + CUDNN_BACKWARD_TARGETS]
    else:
        rec = [(d, highest) for op, d, highest in pairs if op in MATMUL_OPS]
    found = narrowest(d for d, _ in rec if d)
    if found is None:
        return "unknown"
    loose = any(d == "fp32" and not highest for d, highest in rec)
    return "tf32" if found == "fp32" and tf32_capable and loose else found


def hlo_trace(
    text: str,
    phase: str = "forward",
    *,
    tf32_capable: bool = False,
    cudnn_tf32: bool = True,
    program: str | None = None,
    detail: str = "",
) -> KernelTrace:
    """Trace of one compiled HLO module's text (see the module docstring for the rules).

    ``program``: the module as lowered, before XLA's passes, whose element types decide the precision when
    given: XLA's CPU compiler computes a bfloat16 ``dot`` in float32 between conversions, so the compiled
    module shows f32 dots for data that are rounded to bfloat16 at every step."""
    pairs = hlo_ops(text)
    names = frozenset(op for op, _, _ in pairs)
    family = classify_hlo_ops(names, phase)
    loops = sum(1 for op, _, _ in pairs if op in LOOP_OPS)
    cell_loop = sorted(set(_CELL_SCOPE.findall(text)))
    parts = [detail] if detail else []
    if family == "jax-generic":
        parts.append(f"Keras's {'/'.join(cell_loop)} loop" if cell_loop else "the JAX backend's fused scan")
        parts.append(
            f"{loops} while loop{'s' if loops != 1 else ''}"
            if loops
            else "no while loop (unrolled, or a one-step loop XLA removed)"
        )
    shown = CELL_OPS | MATMUL_OPS | LOOP_OPS | set(CUDNN_FORWARD_TARGETS + CUDNN_BACKWARD_TARGETS)
    return KernelTrace(
        family=family,
        precision=_precision(hlo_ops(program) if program else pairs, family, tf32_capable, cudnn_tf32),
        phase=phase,
        ops=tuple(dict.fromkeys(op for op, _, _ in pairs if op in shown)),
        dtypes=tuple(dict.fromkeys(d for _, d, _ in pairs if d)),
        detail="; ".join(parts),
    )


def tf32_capable(device: Any) -> bool:
    """Compute capability >= 8.0 (Ampere or newer), where XLA's and cuDNN's fp32 may run TF32."""
    capability = getattr(device, "compute_capability", None)
    try:
        return device.platform == "gpu" and float(str(capability)) >= 8.0
    except (TypeError, ValueError):
        return device.platform == "gpu"


def cudnn_allows_tf32() -> bool:
    """Whether ``jax.experimental.rnn.lstm`` builds its cuDNN call with TF32 math allowed (JAX's default)."""
    import jax

    # jax.config's flags are attributes it sets at run time (config.read() refuses this context-manager flag)
    setting = jax.config.jax_default_matmul_precision  # type: ignore[attr-defined]
    return str(setting or "").lower() not in ("highest", "float32", "tensorfloat32_off")


def compiled_trace(
    function: Callable[..., Any], *args: Any, phase: str = "forward", tf32_capable: bool = False, detail: str = ""
) -> KernelTrace:
    """Trace of what XLA compiles ``jax.jit(function)`` to for ``args`` (arrays, or ``jax.ShapeDtypeStruct``s:
    compiled, not run), its precision read from the module as lowered (see :func:`hlo_trace`)."""
    import jax

    jitted = function if hasattr(function, "lower") else jax.jit(function)
    lowered = jitted.lower(*args)
    return hlo_trace(
        str(lowered.compile().as_text() or ""),
        phase,
        tf32_capable=tf32_capable,
        cudnn_tf32=cudnn_allows_tf32(),
        program=lowered.as_text(dialect="hlo"),
        detail=detail,
    )
