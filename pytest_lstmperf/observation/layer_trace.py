"""Per layer call: which kernel each call of a recurrent layer ran. :func:`torch_layer_trace` buckets the ATen ops
that a ``TorchDispatchMode`` sees by the torch recurrent module (``nn.LSTM``, ``nn.GRU``, ``nn.LSTMCell``, ...)
whose call dispatched them, with one bucket per backward run, so that a model's trace says layer by layer what
ran (:class:`LayerRecorder`; other frameworks' layers, Keras on torch, bucket theirs through ``enter``/``leave``);
:func:`paused` stops it for timed code. The ops are classified as one pass is (:mod:`.torch_trace`).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from .torch_trace import (
    DTYPE_NAMES,
    MATMUL_OPS,
    RECURRENT_OPS,
    KernelTrace,
    classify_torch_ops,
    precision_from,
    short_op,
)

#: torch module classes whose calls are recurrent layers (``nn.LSTM``/``nn.GRU``/``nn.RNN`` and their cells)
_RECURRENT_MODULES = ("RNNBase", "RNNCellBase")
#: ops that only a recurrent layer's call runs (matmuls with sigmoid/tanh alone are also an MLP). Not
#: ``_cudnn_rnn_flatten_weight``: building an ``nn.LSTM`` and moving it to CUDA (``module.to("cuda")``, whose
#: ``_apply`` calls ``flatten_parameters``) runs it outside any call, and building a module is not a layer call
_RECURRENT_ONLY_OPS = (RECURRENT_OPS - {"_cudnn_rnn_flatten_weight"}) | {
    "_cudnn_rnn_backward",
    "mkldnn_rnn_layer_backward",
}


@dataclass
class LayerCall:
    """One call of a recurrent layer (or, ``phase="backward"``, the backward pass of all of them)."""

    layer: str  # "LSTM(64, 128, num_layers=2)" or a Keras layer's name
    device: str
    phase: str = "forward"
    ops: list[str] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    matmul_dtypes: list[str] = field(default_factory=list)
    #: which call of which module, with its input's shape (``"encoder.gru call 1, packed B4 T<=10"``)
    call: str = ""

    def trace(self) -> KernelTrace:
        ops = tuple(dict.fromkeys(self.ops))
        dtypes = self.dtypes or self.matmul_dtypes
        return KernelTrace(
            family=classify_torch_ops(ops, self.device),
            precision=precision_from(dtypes, ()),
            phase=self.phase,
            ops=ops,
            dtypes=tuple(dict.fromkeys(dtypes)),
            detail=self.layer,
            call=self.call,
        )


@dataclass
class LayerRecorder:
    """Ops bucketed per recurrent layer call; ops of the backward pass in one bucket per backward run."""

    calls: list[LayerCall] = field(default_factory=list)
    stack: list[LayerCall] = field(default_factory=list)
    backward: list[LayerCall] = field(default_factory=list)
    loose: LayerCall = field(default_factory=lambda: LayerCall("outside any recurrent layer", "cpu"))
    paused: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def enter(self, layer: str, device: str, label: str = "") -> None:
        call = LayerCall(layer, device, call=label)
        self.calls.append(call)
        self.stack.append(call)

    def leave(self) -> None:
        if self.stack:
            self.stack.pop()

    def record(self, name: str, dtype: str | None, in_backward: bool) -> None:
        with self.lock:
            if in_backward:
                if not self.backward:
                    self.backward.append(LayerCall("backward pass", self._device(), "backward"))
                bucket = self.backward[-1]
            else:
                bucket = self.stack[-1] if self.stack else self.loose
            bucket.ops.append(name)
            if dtype is not None:
                (bucket.dtypes if name in RECURRENT_OPS else bucket.matmul_dtypes).append(dtype)

    def _device(self) -> str:
        return self.calls[-1].device if self.calls else "cpu"

    def traces(self) -> list[KernelTrace]:
        """One trace per recurrent layer call (forward), then the backward pass when a layer ran forward.

        Recurrent ops run outside any layer (``torch.lstm_cell`` called directly) count as a layer call
        of their own; the backward pass counts only when a recurrent layer ran forward (an MLP's backward
        runs the same matmuls and pointwise ops as the native LSTM's)."""
        out = [call.trace() for call in self.calls if call.ops]
        if set(self.loose.ops) & _RECURRENT_ONLY_OPS:
            out.append(self.loose.trace())
        if out:
            out += [call.trace() for call in self.backward if call.ops]
        return out


def _in_backward(torch: object) -> bool:
    try:
        return torch._C._current_graph_task_id() != -1  # type: ignore[attr-defined]
    except AttributeError:
        return False


def _layer_dispatch_mode(recorder: LayerRecorder):
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    from ..host_counters import without_dynamo_import

    @without_dynamo_import
    class _LayerOpRecorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = short_op(str(func))
            dtype = None
            if name in RECURRENT_OPS or name in MATMUL_OPS:
                flat, _ = tree_flatten((args, kwargs or {}))
                first = next((t for t in flat if isinstance(t, torch.Tensor) and t.is_floating_point()), None)
                dtype = None if first is None else DTYPE_NAMES.get(str(first.dtype), str(first.dtype))
            recorder.record(name, dtype, _in_backward(torch))
            return func(*args, **(kwargs or {}))

    return _LayerOpRecorder()


def layer_name(module: object) -> str:
    return f"{type(module).__name__}({module.extra_repr()})"  # type: ignore[attr-defined]


@contextlib.contextmanager
def torch_layer_trace(recorder: LayerRecorder) -> Iterator[LayerRecorder]:
    """Record, per call of a torch recurrent module (``nn.LSTM``, ``nn.GRU``, ``nn.LSTMCell``, ...), the ops it
    dispatched; ``recorder.enter``/``leave`` let other frameworks' layers (Keras on torch) bucket theirs."""
    import torch

    def is_recurrent(module: object) -> bool:
        return any(cls.__name__ in _RECURRENT_MODULES for cls in type(module).__mro__)

    running: list[object] = []  # the modules whose forward is running, outermost first: a call's module path
    calls: dict[int, int] = {}  # id(module) -> its calls so far

    def pre(module: object, args: tuple) -> None:
        running.append(module)
        if is_recurrent(module) and not recorder.paused:
            first = args[0] if args else None
            data = getattr(first, "data", first)  # PackedSequence
            device = getattr(getattr(data, "device", None), "type", "cpu")
            calls[id(module)] = calls.get(id(module), 0) + 1
            label = f"{module_path(running)} call {calls[id(module)]}, {input_shape(torch, module, first)}"
            recorder.enter(layer_name(module), "cuda" if device == "cuda" else "cpu", label)

    def post(module: object, args: tuple, output: object) -> None:
        while running:  # always called, also when the forward raised: the stack stays true
            if running.pop() is module:
                break
        if is_recurrent(module) and not recorder.paused:
            recorder.leave()

    hooks = [
        torch.nn.modules.module.register_module_forward_pre_hook(pre),
        torch.nn.modules.module.register_module_forward_hook(post, always_call=True),
    ]
    try:
        with _layer_dispatch_mode(recorder):
            yield recorder
    finally:
        for handle in hooks:
            handle.remove()


def module_path(running: list[object]) -> str:
    """``"Seq2Seq.encoder.gru"``: the outermost running module's class, then each module's attribute name in
    its caller (the class name where a module was not found among the caller's submodules)."""
    names = [type(running[0]).__name__]
    for parent, child in itertools.pairwise(running):
        children = getattr(parent, "named_modules", None)
        found = next((n for n, m in children() if m is child and n), None) if children else None
        names.append(found or type(child).__name__)
    return ".".join(names)


def input_shape(torch: object, module: object, first: object) -> str:
    """``"packed B4 T<=10"``, ``"T10 B4"`` or ``"B4"`` (a cell): what one call of ``module`` was given."""
    from torch.utils._python_dispatch import _disable_current_modes

    batch_sizes = getattr(first, "batch_sizes", None)
    if batch_sizes is not None:  # a PackedSequence: its real batch and longest length
        with _disable_current_modes():  # reading the batch is no op of the layer's
            return f"packed B{int(batch_sizes[0])} T<={len(batch_sizes)}"
    shape = tuple(getattr(first, "shape", ()))
    if len(shape) == 3:
        t, b = (shape[1], shape[0]) if getattr(module, "batch_first", False) else (shape[0], shape[1])
        return f"T{t} B{b}"
    if len(shape) == 2 and type(module).__name__.endswith("Cell"):
        return f"B{shape[0]}"
    return f"T{shape[0]} unbatched" if len(shape) == 2 else "input " + "x".join(map(str, shape))


@contextlib.contextmanager
def paused(recorder: LayerRecorder) -> Iterator[None]:
    """Stop recording inside the block, with the dispatch mode off, so timed code runs at full speed."""
    recorder.paused = True
    try:
        torch_dispatch = None
        import sys

        if "torch" in sys.modules:
            from torch.utils._python_dispatch import _disable_current_modes

            torch_dispatch = _disable_current_modes()
        with torch_dispatch if torch_dispatch is not None else contextlib.nullcontext():
            yield
    finally:
        recorder.paused = False
