"""Kernel trace for TensorFlow: which recurrent kernel family a graph holds or an eager call ran.

Keras 3 on TensorFlow decides between cuDNN and its generic loop in Python, while tracing: the graph it builds
holds either ``CudnnRNNV3`` (backward ``CudnnRNNBackpropV3``, GPU-only kernels) or the generic loop, a
``While`` (or, unrolled, a chain) of ``MatMul`` with ``Sigmoid``/``Tanh``. So the family is read from the op
types, two ways:

* :func:`function_trace`: the graph of a ``tf.function`` (walking every nested function: ``While`` bodies,
  ``If`` branches, gradient functions). Tracing executes nothing, so a graph holding the cuDNN op can be
  inspected on a machine with no GPU; this is how the detector is proven on CPU.
* :func:`tf_trace`: an op callback (``tensorflow.python.framework.op_callbacks``) recording every op executed
  eagerly and every op added to a graph inside the block (what a user's eager test runs).

The precision is the element type (attribute ``T``) of the recurrent op, else of the ``MatMul``s; fp32 is
reported as ``tf32`` when the caller says TF32 math applies (TensorFlow enables it by default on Ampere
and newer GPUs).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from ..model.precision import DTYPE_PRECISION, narrowest
from .torch_trace import KernelTrace

CUDNN_FORWARD_OPS = frozenset({"CudnnRNN", "CudnnRNNV2", "CudnnRNNV3"})
CUDNN_BACKWARD_OPS = frozenset({"CudnnRNNBackprop", "CudnnRNNBackpropV2", "CudnnRNNBackpropV3"})
CUDNN_OPS = CUDNN_FORWARD_OPS | CUDNN_BACKWARD_OPS
MATMUL_OPS = frozenset({"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "_FusedMatMul", "Einsum"})
# gate and candidate non-linearities (and their gradients) that mark a recurrent cell in the generic loop
CELL_OPS = frozenset(
    {"Sigmoid", "Tanh", "Relu", "Elu", "Selu", "Softsign", "Softplus", "Relu6", "LeakyRelu", "Gelu",
     "SigmoidGrad", "TanhGrad", "ReluGrad", "EluGrad", "SeluGrad", "SoftsignGrad", "SoftplusGrad", "Relu6Grad",
     "Minimum", "Maximum", "ClipByValue"}
)  # fmt: skip
LOOP_OPS = frozenset({"While", "StatelessWhile"})
#: TensorFlow dtype names -> precision (TensorFlow calls float16 also ``half``)
_TF_DTYPES = {**DTYPE_PRECISION, "half": "fp16"}


def classify_tf_ops(ops: Iterable[str]) -> str:
    """Kernel family from TensorFlow op types: ``cudnn``, ``tf-generic``, ``mixed`` or ``none``."""
    names = set(ops)
    cudnn = bool(names & CUDNN_OPS)
    generic = bool(names & MATMUL_OPS) and bool(names & CELL_OPS)
    if cudnn and generic:
        return "mixed"
    if cudnn:
        return "cudnn"
    if generic:
        return "tf-generic"
    return "none"


def _precision(dtypes: Iterable[str], tf32: bool) -> str:
    found = narrowest(_TF_DTYPES.get(d, d) for d in dtypes)
    if found is None:
        return "unknown"
    return "tf32" if found == "fp32" and tf32 else found


def _make_trace(phase: str, ops: list[str], dtypes: list[str], tf32: bool, detail: str = "") -> KernelTrace:
    unique = tuple(dict.fromkeys(ops))
    loops = sum(1 for o in ops if o in LOOP_OPS)
    parts = [detail] if detail else []
    if loops:
        parts.append(f"{loops} while loop{'s' if loops != 1 else ''}")
    return KernelTrace(
        family=classify_tf_ops(unique),
        precision=_precision(dtypes, tf32),
        phase=phase,
        ops=tuple(o for o in unique if o in CUDNN_OPS | MATMUL_OPS | CELL_OPS | LOOP_OPS),
        dtypes=tuple(dict.fromkeys(_TF_DTYPES.get(d, d) for d in dtypes)),
        detail="; ".join(parts),
    )


# ------------------------------------------------------------------------------------------ graphs
def graph_def_ops(graph_def: Any) -> list[tuple[str, str]]:
    """``(op type, element type)`` of every node of a GraphDef and of every function in its library."""
    from tensorflow.python.framework import dtypes as tf_dtypes

    found: list[tuple[str, str]] = []

    def dtype_of(node: Any) -> str:
        attr = node.attr.get("T") if "T" in node.attr else None
        if attr is None or not attr.type:
            return ""
        return tf_dtypes.as_dtype(attr.type).name

    for node in graph_def.node:
        found.append((node.op, dtype_of(node)))
    for function in graph_def.library.function:
        for node in function.node_def:
            found.append((node.op, dtype_of(node)))
    return found


def _recurrent_dtypes(pairs: list[tuple[str, str]], backward: bool) -> list[str]:
    key = CUDNN_BACKWARD_OPS if backward else CUDNN_FORWARD_OPS
    dtypes = [d for op, d in pairs if op in key and d]
    if not dtypes:
        dtypes = [d for op, d in pairs if op in MATMUL_OPS and d]
    return dtypes


def graph_trace(graph_def: Any, phase: str = "forward", tf32: bool = False) -> KernelTrace:
    """Trace of a GraphDef. For ``phase="backward"`` only the gradient part decides the family."""
    pairs = graph_def_ops(graph_def)
    ops = [op for op, _ in pairs]
    if phase == "backward":
        # the gradient graph also holds the forward ops: the cuDNN backward op decides when present
        if set(ops) & CUDNN_BACKWARD_OPS:
            ops = [o for o in ops if o not in CUDNN_FORWARD_OPS]
        else:
            ops = [o for o in ops if o not in CUDNN_OPS]
        return _make_trace(phase, ops, _recurrent_dtypes(pairs, True), tf32, "from graph")
    return _make_trace(phase, ops, _recurrent_dtypes(pairs, False), tf32, "from graph")


def function_trace(function: Any, *args: Any, phase: str = "forward", tf32: bool = False) -> KernelTrace:
    """Trace the graph of ``tf.function`` ``function`` for ``args`` without executing it."""
    concrete = function.get_concrete_function(*args)
    return graph_trace(concrete.graph.as_graph_def(), phase=phase, tf32=tf32)


# ------------------------------------------------------------------------------------------ eager
@contextlib.contextmanager
def tf_trace(phase: str = "forward", tf32: bool = False) -> Iterator[list[KernelTrace]]:
    """Record the TensorFlow ops executed eagerly or added to graphs inside the block.

    The yielded list receives one :class:`KernelTrace` when the block ends.
    """
    from tensorflow.python.framework import op_callbacks

    lock = threading.Lock()
    ops: list[str] = []
    dtypes: list[tuple[str, str]] = []  # (op, element type) of the recurrent and matmul ops

    def callback(op_type, inputs, attrs, outputs, op_name=None, graph=None):
        op = op_type.decode() if isinstance(op_type, bytes) else str(op_type)
        dtype = ""
        if op in CUDNN_OPS or op in MATMUL_OPS:
            try:
                dtype = outputs[0].dtype.name
            except (AttributeError, IndexError, TypeError):
                dtype = ""
        with lock:
            ops.append(op)
            if dtype:
                dtypes.append((op, dtype))

    out: list[KernelTrace] = []
    op_callbacks.add_op_callback(callback)
    try:
        yield out
    finally:
        op_callbacks.remove_op_callback(callback)
    pairs = list(dtypes)
    rec = [d for o, d in pairs if o in CUDNN_OPS] or [d for o, d in pairs if o in MATMUL_OPS]
    out.append(_make_trace(phase, ops, rec, tf32, "eager ops and graphs built in the block"))
