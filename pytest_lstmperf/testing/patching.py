"""Patching ``torch.nn.LSTM``/``GRU`` for planted faults: the primitives every fault that changes a layer call
shares. :func:`patch_forward` wraps both classes' ``forward`` and returns the undo, :func:`map_outputs` applies a
function to the tensors of an RNN's outputs, :func:`first_tensor` finds the input tensor of a call, and
:data:`CLOCKS` names the clocks a planted slowdown measures and waits on (:func:`check_clock` refuses others).
torch is imported inside the functions that use it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

#: the clocks the slowdown measures and waits on
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "thread": time.thread_time}


def check_clock(name: str) -> str:
    """``name`` if it is a known clock, else ValueError naming the valid ones."""
    if name not in CLOCKS:
        raise ValueError(f"unknown clock {name!r} (valid: {', '.join(CLOCKS)})")
    return name


def patch_forward(
    wrap: Callable[[Callable[..., Any]], Callable[..., Any]], state: dict[str, bool] | None = None
) -> Callable[[], None]:
    """Wrap ``LSTM``/``GRU.forward``; the undo restores them and (``state``) marks the wrappers inactive, so
    hooks they left on layers stand aside."""
    import torch

    # Any: the type checker refuses assignments to methods, which is what this does
    saved: dict[Any, Any] = {cls: cls.__dict__["forward"] for cls in (torch.nn.LSTM, torch.nn.GRU)}
    for cls, original in saved.items():
        cls.forward = wrap(original)

    def undo() -> None:
        if state is not None:
            state["active"] = False
        for cls, original in saved.items():
            cls.forward = original

    return undo


def map_outputs(out: Any, fn: Callable[[Any], Any]) -> Any:
    """Apply ``fn`` to the tensors of an RNN's ``(output, h_n)`` or ``(output, (h_n, c_n))``."""
    import torch
    from torch.nn.utils.rnn import PackedSequence

    if isinstance(out, PackedSequence):
        return out._replace(data=fn(out.data))
    if isinstance(out, torch.Tensor):
        return fn(out)
    if isinstance(out, tuple):
        return type(out)(map_outputs(o, fn) for o in out)
    return out


def first_tensor(args: tuple[Any, ...]) -> Any:
    """The first tensor among a call's arguments (a PackedSequence's data), or None."""
    import torch

    for arg in args:
        if isinstance(arg, torch.Tensor):
            return arg
        data = getattr(arg, "data", None)  # PackedSequence
        if isinstance(data, torch.Tensor):
            return data
    return None
