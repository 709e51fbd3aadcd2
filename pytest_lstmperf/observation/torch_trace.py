"""Kernel trace: which kernel family actually ran, and in which element type.

For PyTorch two observers run together:

* a ``TorchDispatchMode`` sees every ATen op below the composite ``aten::lstm``/``aten::gru``
  (``aten._cudnn_rnn``, ``aten.mkldnn_rnn_layer``, ``aten._thnn_fused_lstm_cell``, ...) with the dtypes of
  its tensor arguments, after autocast has cast them; it works on the CPU and in the backward pass
  (the mode is propagated to autograd's worker threads);
* on CUDA, ``torch.profiler`` adds the GPU kernel names (``RNN_blockPersist_fp_LSTM<__half...>``,
  ``lstm_cell_forward<float...>``), whose template arguments name the element type, and whose GEMM names
  say whether tensor-core TF32 math ran.

The family is decided from the ops (see ``classify_torch_ops``); the precision from the element type of the
recurrent op's inputs, refined to ``tf32`` when a TF32 kernel ran.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from ..host_counters import cuda_profile, profiled_events, without_dynamo_import
from ..model.precision import DTYPE_PRECISION, narrowest


@dataclass(frozen=True)
class KernelTrace:
    """What one pass (forward or backward) ran."""

    family: str
    precision: str
    phase: str = "forward"
    ops: tuple[str, ...] = ()
    kernels: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ()
    detail: str = ""
    #: which call of which module (``"encoder.gru call 1, packed B2 T<=5"``): two calls of one module class, an
    #: encoder's and a decoder's, are told apart in every message; empty where not known
    call: str = ""

    @property
    def label(self) -> str:
        """The layer and, where known, which call of which module: ``"encoder.gru call 1 ...: GRU(...)"``."""
        return f"{self.call}: {self.detail}" if self.call and self.detail else self.call or self.detail

    def describe(self) -> str:
        kernels = ", ".join(self.kernels[:6]) + (" ..." if len(self.kernels) > 6 else "")
        shown = ops_that_matter(self.ops)
        ops = ", ".join(shown[:8]) + (f" ... (+{len(shown) - 8})" if len(shown) > 8 else "")
        text = f"{self.phase}: {self.family}/{self.precision} (ops: {ops or '-'}"
        if self.kernels:
            text += f"; kernels: {kernels}"
        text += ")"
        if self.label:
            text += f" [{self.label}]"
        return text

    def to_dict(self) -> dict[str, object]:
        return {
            "family": self.family,
            "precision": self.precision,
            "phase": self.phase,
            "ops": list(self.ops),
            "kernels": list(self.kernels),
            "dtypes": list(self.dtypes),
            "detail": self.detail,
            "call": self.call,
        }


def ops_that_matter(ops: tuple[str, ...]) -> list[str]:
    """``ops`` with the ones that decide the family first: the recurrent kernels, then the matmuls and the gate
    activations, then the rest (indexing, zeros, the packing's bookkeeping) in the order they ran; a packed
    call's first eight ops are bookkeeping, and a list cut after them showed nothing of the recurrence."""
    rank = {**dict.fromkeys(_NATIVE_CELL_OPS, 2), **dict.fromkeys(MATMUL_OPS, 1), **dict.fromkeys(RECURRENT_OPS, 0)}
    return sorted(ops, key=lambda op: rank.get(op, 3))  # a stable sort: each rank keeps the order the ops ran


# ----------------------------------------------------------------------------------------- torch ops
# Op name fragments (after stripping "aten::"/"aten." and overload) that identify each family.
_CUDNN_OPS = {"_cudnn_rnn", "_cudnn_rnn_backward", "_cudnn_rnn_flatten_weight"}
_ONEDNN_OPS = {"mkldnn_rnn_layer", "mkldnn_rnn_layer_backward"}
_GENERIC_CELL_OPS = {
    "_thnn_fused_lstm_cell",
    "_thnn_fused_lstm_cell_backward_impl",
    "_thnn_fused_lstm_cell_backward",
    "_thnn_fused_gru_cell",
    "_thnn_fused_gru_cell_backward",
    "_thnn_differentiable_lstm_cell_backward",
    "_thnn_differentiable_gru_cell_backward",
}
_NATIVE_CELL_OPS = {"sigmoid", "sigmoid_", "tanh", "tanh_", "sigmoid_backward", "tanh_backward"}
MATMUL_OPS = {"mm", "addmm", "matmul", "linear", "bmm", "baddbmm"}
# the recurrent op whose input dtype is the path's precision
RECURRENT_OPS = _CUDNN_OPS | _ONEDNN_OPS | _GENERIC_CELL_OPS | {"lstm", "gru", "lstm_cell", "gru_cell"}

#: torch's dtypes (``str(torch.float16)``) -> precision
DTYPE_NAMES = {f"torch.{dtype}": precision for dtype, precision in DTYPE_PRECISION.items()}


def short_op(name: str) -> str:
    name = name.split("::")[-1]
    if name.startswith("aten."):
        name = name[5:]
    return name.split(".")[0]


def classify_torch_ops(ops: Sequence[str], device: str) -> str:
    """The kernel family from the ATen ops seen in one pass.

    cuDNN and oneDNN have their own ops. The generic CUDA path runs the fused cell kernels per step;
    the native CPU path runs per-step matmuls with pointwise sigmoid/tanh (LSTM, GRU) and, for GRU on the
    CPU, no fused cell op.
    """
    names = {short_op(o) for o in ops}
    found = []
    if names & _CUDNN_OPS - {"_cudnn_rnn_flatten_weight"}:
        found.append("cudnn")
    if names & _ONEDNN_OPS:
        found.append("onednn")
    if names & _GENERIC_CELL_OPS or (not found and names & MATMUL_OPS and names & _NATIVE_CELL_OPS):
        found.append("cuda-generic" if device == "cuda" else "cpu-native")
    if not found:
        return "none"
    if len(found) > 1:
        return "mixed"
    return found[0]


_TF32_KERNEL = re.compile(r"tf32|s1688|s16816|tensorop_s|_tf32", re.IGNORECASE)
_KERNEL_ELEMENT = [
    (re.compile(r"__half|\bhalf\b|_fp16|f16f16|h1688|h16816|_hmma", re.IGNORECASE), "fp16"),
    (re.compile(r"bfloat16|__nv_bfloat16|bf16", re.IGNORECASE), "bf16"),
    (re.compile(r"\bdouble\b|_fp64|d884|dgemm", re.IGNORECASE), "fp64"),
]


def precision_from(dtypes: Sequence[str], kernels: Sequence[str]) -> str:
    """Precision of a pass: the recurrent op's input element type, ``tf32`` when a TF32 kernel ran."""
    # the lowest precision the recurrent op computed in
    base = narrowest(dtypes)
    if base is None:
        return "unknown"
    if base == "fp32" and any(_TF32_KERNEL.search(k) for k in kernels):
        return "tf32"
    return base


def kernel_element_types(kernels: Sequence[str]) -> set[str]:
    seen = set()
    for kernel in kernels:
        for pattern, name in _KERNEL_ELEMENT:
            if pattern.search(kernel):
                seen.add(name)
    return seen


@dataclass
class _Recorder:
    ops: list[str] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)  # element types entering the recurrent ops
    matmul_dtypes: list[str] = field(default_factory=list)  # ... entering matrix products (native paths)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _dispatch_mode(recorder: _Recorder):
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    @without_dynamo_import
    class _OpRecorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = short_op(str(func))
            target = (
                recorder.dtypes if name in RECURRENT_OPS else recorder.matmul_dtypes if name in MATMUL_OPS else None
            )
            if target is not None:
                flat, _ = tree_flatten((args, kwargs or {}))
                # the first floating tensor is the input (or, backward, the incoming gradient)
                for item in flat:
                    if isinstance(item, torch.Tensor) and item.is_floating_point():
                        with recorder.lock:
                            target.append(DTYPE_NAMES.get(str(item.dtype), str(item.dtype)))
                        break
            with recorder.lock:
                recorder.ops.append(name)
            return func(*args, **(kwargs or {}))

    return _OpRecorder()


@contextlib.contextmanager
def torch_trace(device: str, phase: str, profile_kernels: bool | None = None) -> Iterator[list[KernelTrace]]:
    """Trace the PyTorch work inside the block; the yielded list receives one :class:`KernelTrace`.

    ``profile_kernels`` (default: on CUDA) also collects GPU kernel names with ``torch.profiler``.
    ``device`` is a kind (``cpu``, ``cuda``) or a torch device string (``cuda:1``).
    """
    import torch

    device = device.split(":")[0]

    recorder = _Recorder()
    out: list[KernelTrace] = []
    if profile_kernels is None:
        profile_kernels = device == "cuda"
    profiler = None
    if profile_kernels:
        from torch.profiler import ProfilerActivity, profile

        # GPU activity alone: the ops come from the dispatch mode, and recording every op on the CPU side too
        # made a traced Keras-on-torch loop 1.6x as slow (H100: 0.31 s against 0.20 s per example, with the
        # same kernel names either way)
        profiler = profile(activities=[ProfilerActivity.CUDA])
    with contextlib.ExitStack() as stack:
        if profiler is not None:
            stack.enter_context(profiler)
        stack.enter_context(_dispatch_mode(recorder))
        yield out
        if device == "cuda":
            torch.cuda.synchronize()
    kernels: list[str] = []
    if profiler is not None:
        kernels = list(dict.fromkeys(name for name, on_gpu in profiled_events(profiler) if on_gpu))
    ops = tuple(dict.fromkeys(recorder.ops))
    family = classify_torch_ops(ops, device)
    precision = precision_from(recorder.dtypes or recorder.matmul_dtypes, kernels)
    detail = ""
    if kernels:
        elements = kernel_element_types(kernels)
        if elements - {precision, "fp32"} and precision in ("fp32", "tf32"):
            detail = f"kernel names show element types {sorted(elements)}"
    out.append(
        KernelTrace(
            family=family,
            precision=precision,
            phase=phase,
            ops=ops,
            kernels=tuple(kernels),
            dtypes=tuple(dict.fromkeys(recorder.dtypes or recorder.matmul_dtypes)),
            detail=detail,
        )
    )


# ------------------------------------------------------------------------------ compiled code (profiler)
#: profiler event names that mark compiled code running (``torch.compile``'s region and its compiled graphs)
_COMPILED_MARKS = ("Torch-Compiled Region", "CompiledFxGraph", "CompiledFunction")
#: CUDA runtime calls that replay a captured CUDA graph (``mode="reduce-overhead"``'s cudagraph trees)
_GRAPH_LAUNCH = ("cudaGraphLaunch", "cuGraphLaunch")
#: GPU kernel name fragments of each family, for work the profiler sees only as kernels (a replayed graph)
_KERNEL_FAMILIES = (
    (re.compile(r"RNN_blockPersist|elemWiseRNNcell|LSTM_elementWise|GRU_elementWise|cudnn::rnn", re.I), "cudnn"),
    (re.compile(r"lstm_cell_forward|lstm_cell_backward|gru_cell_forward|gru_cell_backward"), "cuda-generic"),
    (re.compile(r"^triton_"), "inductor"),
)


def kernel_family(kernels: Sequence[str]) -> str | None:
    """The kernel family that GPU kernel names alone show (``cudnn``, ``cuda-generic``, ``inductor``, ``mixed``
    where several do), or None where none does."""
    seen = {fam for k in kernels for pattern, fam in _KERNEL_FAMILIES if pattern.search(k)}
    if not seen:
        return None
    return seen.pop() if len(seen) == 1 else "mixed"


def gpu_kernel_names(block: Callable[[], object]) -> list[str] | None:
    """The names of the GPU kernels launched in this process while ``block`` runs (:func:`cuda_profile`); copies
    and memsets left out. None where torch has no CUDA profiling."""
    prof = cuda_profile(block)
    if prof is None:
        return None
    return [name for name, on_gpu in profiled_events(prof) if on_gpu and not name.startswith(("Memcpy", "Memset"))]


#: the profiler's element type names -> precision
_PROFILER_DTYPES = {"float": "fp32", "double": "fp64", "c10::Half": "fp16", "c10::BFloat16": "bf16"}


@dataclass(frozen=True)
class CompiledRun:
    """What the profiler saw of compiled code in one pass: compiled regions entered, CUDA graphs replayed."""

    compiled_regions: int = 0
    graph_replays: int = 0

    def describe(self) -> str:
        return f"compiled regions run: {self.compiled_regions}; CUDA graph replays: {self.graph_replays}"


def classify_compiled(ops: Sequence[str], kernels: Sequence[str], device: str, compiled: CompiledRun) -> str:
    """The family of a pass that may have run compiled code.

    ATen ops decide first (an eager LSTM after a graph break, or an op inductor calls as an extern kernel:
    ``aten::mkldnn_rnn_layer`` on the CPU); then GPU kernel names (a replayed CUDA graph dispatches no ATen
    op); a compiled graph that ran matrix products and no recurrent op is inductor's decomposition of the
    cell loop (``inductor``: cuBLAS/MKL products plus generated pointwise kernels)."""
    family = classify_torch_ops(ops, device)
    names = {short_op(o) for o in ops}
    if family == "none":
        by_name = kernel_family(kernels)
        if by_name:
            family = by_name
        elif compiled.compiled_regions and names & MATMUL_OPS:
            family = "inductor"
    elif compiled.compiled_regions and any(k.startswith("triton_") for k in kernels) and family != "cudnn":
        # a fused cell loop: inductor's kernels beside matmuls that the native classifier also matches
        family = "inductor"
    return family


@contextlib.contextmanager
def profiler_trace(device: str, phase: str) -> Iterator[list[KernelTrace]]:
    """Trace the block with ``torch.profiler`` alone (no ``TorchDispatchMode``).

    Dynamo does not run compiled code while a dispatch mode is active (it falls back to eager: "non-infra
    torch dispatch mode present"), so :func:`torch_trace` would observe the eager layer, not what
    ``torch.compile`` runs. The profiler records the ATen ops the compiled code calls (extern kernels),
    the GPU kernels (inductor's ``triton_*``, cuDNN's, those of a replayed CUDA graph), the compiled
    regions entered and the CUDA graphs launched; the input element types of recurrent ops and products
    give the precision."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    kind = device.split(":")[0]
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if kind == "cuda" else [])
    out: list[KernelTrace] = []
    with profile(activities=activities, record_shapes=True) as prof:
        yield out
        if kind == "cuda":
            torch.cuda.synchronize()
    ops: list[str] = []
    kernels: list[str] = []
    rec_dtypes: list[str] = []
    mm_dtypes: list[str] = []
    any_dtypes: list[str] = []  # element types entering any ATen op (a replayed graph's input copies)
    regions = launches = 0
    from torch.autograd import DeviceType

    cuda = DeviceType.CUDA
    for event in prof.profiler.kineto_results.events():  # type: ignore[union-attr]
        name = event.name()
        if any(mark in name for mark in _COMPILED_MARKS):
            regions += 1
        elif name in _GRAPH_LAUNCH:
            launches += 1
        elif event.device_type() == cuda:
            if name not in kernels:
                kernels.append(name)
        elif name.startswith("aten::"):
            short = short_op(name)
            ops.append(short)
            target = rec_dtypes if short in RECURRENT_OPS else mm_dtypes if short in MATMUL_OPS else any_dtypes
            first = next((d for d in event.dtypes() if d in _PROFILER_DTYPES), None)
            if first is not None:
                target.append(_PROFILER_DTYPES[first])
    compiled = CompiledRun(regions, launches)
    unique = tuple(dict.fromkeys(ops))
    dtypes = rec_dtypes or mm_dtypes
    note = compiled.describe()
    if not dtypes and launches and any_dtypes:
        # a replayed CUDA graph dispatches no recurrent op or product: its inputs' element types (the copies into
        # the graph's static buffers), unless a kernel name shows a narrower type
        narrower = kernel_element_types(kernels) - {"fp32", "fp64"}
        dtypes = sorted(narrower) or any_dtypes
        note += "; precision from the element types entering the replayed graph and its kernel names"
    out.append(
        KernelTrace(
            family=classify_compiled(unique, kernels, kind, compiled),
            precision=precision_from(dtypes, kernels),
            phase=phase,
            ops=unique,
            kernels=tuple(kernels),
            dtypes=tuple(dict.fromkeys(dtypes)),
            detail=note,
        )
    )
