"""Numeric faults: small, named departures of the numbers an LSTM/GRU call returns (a shifted forget-gate bias,
dropped initial states, bf16-rounded weights, scaled gradients or outputs, NaN, a reversed time order), planted
in every ``torch.nn.LSTM``/``GRU`` call while :func:`numeric_fault` is active. The equivalence checks' own tests
plant them to see each check fail, and the tolerance calibration measures the smallest one each check catches
(the sharpness table). The faults the suites' pytest plugin plants (kernel fallbacks, slowdowns, host work) are
:mod:`.faults`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from .patching import map_outputs, patch_forward

#: numeric faults for the sharpness table and the equivalence suites' own tests: name -> what it does.
#: ``DELTA`` is the fault's size where it has one (the others ignore it).
NUMERIC_FAULTS = {
    "forget-bias": "the forget gate's bias (GRU: the update gate's) shifted by DELTA in every layer and direction",
    "states-ignored": "the initial states are dropped: the layer starts from zeros",
    "weights-bf16": "every weight rounded to bfloat16 before the call (an fp32 path computing with bf16 weights)",
    "grad-scale": "the gradient reaching the layer scaled by 1 + DELTA; outputs unchanged",
    "output-scale": "every output (sequence, h_n, c_n) scaled by 1 + DELTA; gradients follow",
    "nan": "every output NaN (and so every gradient)",
    "time-reversed": "the output sequence returned in the other time order (final states right; gradients follow)",
}


def _reparametrised(module: Any, original: Callable[..., Any], new: Callable[[str, Any], Any], args, kwargs) -> Any:
    """Call ``original`` with the module's parameters replaced by ``new(name, param)`` (differentiable, so the
    gradients still reach the real parameters)."""
    import torch

    params = {name: new(name, p) for name, p in module.named_parameters()}
    with torch.nn.utils.stateless._reparametrize_module(module, params):
        return original(module, *args, **kwargs)


def _forget_shift(module: Any, delta: float) -> Callable[[str, Any], Any]:
    hidden = module.hidden_size

    def new(name: str, param: Any) -> Any:
        if not name.startswith("bias_ih"):
            return param
        shift = param.new_zeros(param.shape)
        shift[hidden : 2 * hidden] = delta  # LSTM [i, f, g, o]; torch GRU [r, z, n]: index 1 is f / z
        return param + shift

    return new


def _numeric_wrap(kind: str, delta: float) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    import torch

    class _ScaleGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, tensor: Any) -> Any:
            return tensor.view_as(tensor)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            return grad * (1.0 + delta)

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def forward(self: Any, input: Any, hx: Any = None) -> Any:
            if kind == "states-ignored":
                return original(self, input, None)
            if kind == "forget-bias":
                return _reparametrised(self, original, _forget_shift(self, delta), (input, hx), {})
            if kind == "weights-bf16":
                rounded = lambda name, p: p.to(torch.bfloat16).to(p.dtype)  # noqa: E731
                return _reparametrised(self, original, rounded, (input, hx), {})
            out = original(self, input, hx)
            if kind == "time-reversed":
                return (out[0].flip(1 if self.batch_first else 0), *out[1:])
            if kind == "grad-scale":
                return map_outputs(out, _ScaleGrad.apply)
            if kind == "output-scale":
                return map_outputs(out, lambda t: t * (1.0 + delta))
            return map_outputs(out, lambda t: t * float("nan"))

        return forward

    return wrap


@contextlib.contextmanager
def numeric_fault(kind: str, delta: float = 0.0) -> Iterator[None]:
    """Plant one numeric fault (see :data:`NUMERIC_FAULTS`) in every ``torch.nn.LSTM``/``GRU`` call while the
    block runs. ValueError naming the valid kinds for an unknown one."""
    if kind not in NUMERIC_FAULTS:
        raise ValueError(f"unknown numeric fault {kind!r} (valid: {', '.join(NUMERIC_FAULTS)})")
    undo = patch_forward(_numeric_wrap(kind, float(delta)))
    try:
        yield
    finally:
        undo()
