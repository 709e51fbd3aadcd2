"""Framework overhead: what an eager ``nn.LSTM``/``nn.GRU`` forward call costs above the ATen op it calls and,
on CUDA, above a CUDA-graph replay of the same call (the device-only cost); :class:`Overhead` holds one shape's
three costs and the ratios read from them. torch is imported by :func:`measure_overhead`, which runs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from ..meters import device_time
from ..observation.torch_trace import torch_trace
from .timing import paired_median_times, sync


@dataclass(frozen=True)
class Overhead:
    """One shape's cost at three levels: the module call, the raw ATen op, and (CUDA) a graph replay."""

    module_s: float
    op_s: float
    graph_s: float | None
    kernels: int  # GPU kernels (CPU: ATen ops) one module call launched
    ran: str = ""  # observed kernel family/precision of the module call

    @property
    def raw_s(self) -> float:
        """The device-only cost where a graph replay exists, else the raw op."""
        return self.graph_s if self.graph_s else self.op_s

    @property
    def ratio(self) -> float:
        """module / raw: 1.0 is no framework overhead (the literature's "53% slower" is 1.53)."""
        return self.module_s / self.raw_s

    @property
    def host_s(self) -> float:
        return max(self.module_s - self.raw_s, 0.0)

    @property
    def python_s(self) -> float:
        """The module's own Python work (argument checks, flattening) above the raw op."""
        return max(self.module_s - self.op_s, 0.0)


def measure_overhead(cell: str, input_size: int, hidden: int, layers: int, batch: int, seq: int, device: str,
                     repeats: int = 15) -> Overhead:  # fmt: skip
    """Eager ``nn.LSTM``/``nn.GRU`` forward against the ATen op it calls (``torch._VF.lstm``/``gru`` with the
    module's flat weights) and, on CUDA, a CUDA-graph replay of the same call (the device-only cost)."""
    import torch

    dev = torch.device(device)
    cls = torch.nn.LSTM if cell == "lstm" else torch.nn.GRU
    module = cls(input_size, hidden, layers, batch_first=True).to(dev)
    x = torch.randn(batch, seq, input_size, device=dev)
    h0 = torch.zeros(layers, batch, hidden, device=dev)
    weights = cast("list[torch.Tensor]", module._flat_weights)  # None only for absent biases; this layer has them
    synchronize = sync(torch, dev)

    def call_module() -> None:
        with torch.no_grad():
            module(x)

    def call_op() -> None:
        with torch.no_grad():
            if cell == "lstm":
                torch._VF.lstm(x, (h0, h0), weights, True, layers, 0.0, False, False, True)
            else:
                torch._VF.gru(x, h0, weights, True, layers, 0.0, False, False, True)

    module_s, op_s = paired_median_times([call_module, call_op], synchronize, repeats)
    graph_s = None
    if dev.type == "cuda":
        measured = device_time(call_module, device)
        graph_s = measured.median if measured.method == "cuda-graph" else None
    with torch_trace(device, "forward") as trace:
        call_module()
    kernels = len(trace[0].kernels) if dev.type == "cuda" else len(trace[0].ops)
    return Overhead(module_s, op_s, graph_s, kernels, f"{trace[0].family}/{trace[0].precision}")
