"""Per layer call: which kernel each call of a recurrent layer ran. :func:`torch_layer_trace` buckets the ATen ops
that a ``TorchDispatchMode`` sees by the torch recurrent module (``nn.LSTM``, ``nn.GRU``, ``nn.LSTMCell``, ...)
whose call dispatched them, with one bucket per backward run, so that a model's trace says layer by layer what
ran (:class:`LayerRecorder`; other frameworks' layers, Keras on torch, bucket theirs through ``enter``/``leave``);
:func:`paused` stops it for timed code. The ops are classified as one pass is (:mod:`.torch_trace`).
"""

from __future__ import annotations

import contextlib
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

    def enter(self, layer: str, device: str) -> None:
        call = LayerCall(layer, device)
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

    def pre(module: object, args: tuple) -> None:
        if is_recurrent(module) and not recorder.paused:
            first = args[0] if args else None
            data = getattr(first, "data", first)  # PackedSequence
            device = getattr(getattr(data, "device", None), "type", "cpu")
            recorder.enter(layer_name(module), "cuda" if device == "cuda" else "cpu")

    def post(module: object, args: tuple, output: object) -> None:
        if is_recurrent(module) and not recorder.paused:
            recorder.leave()

    hooks = [
        torch.nn.modules.module.register_module_forward_pre_hook(pre),
        torch.nn.modules.module.register_module_forward_hook(post),
    ]
    try:
        with _layer_dispatch_mode(recorder):
            yield recorder
    finally:
        for handle in hooks:
            handle.remove()


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
