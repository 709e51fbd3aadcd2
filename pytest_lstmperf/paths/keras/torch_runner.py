"""Keras on torch: eager calls; kernels observed with the torch dispatch trace."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ...observation.torch_trace import torch_trace
from .. import PathResult
from .runners import BackendRunner, to_f64

if TYPE_CHECKING:
    from .runners import LocalKerasRun


class TorchRunner(BackendRunner):
    """Eager calls on the Keras torch backend; kernels observed with the torch dispatch trace."""

    def __init__(self, owner: LocalKerasRun) -> None:
        import torch

        self.torch = torch
        self.owner = owner
        spec = owner.spec
        self.dev = torch.device("cuda:0" if owner.device == "cuda" else "cpu")
        self.dtype = getattr(torch, spec.dtype)
        self.x = torch.tensor(owner.x_np, dtype=self.dtype, device=self.dev)
        self.mask = None if owner.mask_np is None else torch.tensor(owner.mask_np, device=self.dev)
        states = owner.states_np()
        self.states = None if states is None else [torch.tensor(s, dtype=self.dtype, device=self.dev) for s in states]
        self.seeds = [torch.tensor(s, dtype=self.dtype, device=self.dev) for s in owner.seeds_np()]

    def _call(self, x: Any, states: Any) -> Any:
        per = None if states is None else [[s[i] for i in range(s.shape[0])] for s in states]
        with self.owner._device_scope():
            return self.owner.stack.call(x, self.mask, per, self.owner.options.call_training)

    def _backward(self, out: Any, hs: Any, cs: Any) -> None:
        outs = [out, self.torch.stack(hs)] + ([self.torch.stack(cs)] if cs else [])
        self.torch.autograd.backward(outs, self.seeds[: len(outs)])

    def _params(self) -> list[Any]:
        return [v.value for v in self.owner.stack.variables()]

    def run(self) -> PathResult:
        owner, spec = self.owner, self.owner.spec
        x = self.x.detach().clone().requires_grad_(spec.training)
        states = (
            None if self.states is None else [s.detach().clone().requires_grad_(spec.training) for s in self.states]
        )
        params = self._params()
        for p in params:
            p.grad = None
        with torch_trace(owner.device, "forward") as fwd:
            out, hs, cs = self._call(x, states)
        bwd_trace = None
        grads: dict[str, np.ndarray] = {}
        if spec.training:
            with torch_trace(owner.device, "backward") as bwd:
                self._backward(out, hs, cs)
            bwd_trace = bwd[0]
            gx = to_f64(x.grad)
            gstates = [to_f64(s.grad) for s in states or []]
            gvars = [to_f64(p.grad) if p.grad is not None else np.zeros(tuple(p.shape)) for p in params]
            grads = owner.canonical_grads(gx, gstates, gvars)
        return owner.path_result(out, hs, cs, grads, fwd[0], bwd_trace)

    def forward(self) -> None:
        with self.torch.no_grad():
            self._call(self.x, self.states)

    def train_step(self) -> None:
        out, hs, cs = self._call(self.x, self.states)
        self._backward(out, hs, cs)

    def trace_forward(self) -> Any:
        with torch_trace(self.owner.device, "forward") as trace:
            self.forward()
        return trace[0]

    def synchronize(self) -> None:
        if self.dev.type == "cuda":
            self.torch.cuda.synchronize(self.dev)
