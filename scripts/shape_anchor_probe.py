"""Does an anchor shaped like the benchmark follow its training step beside a memory-streaming neighbour, where the
plugin's anchor does not? Fresh processes, one thread, in turn ``quiet`` and beside a neighbour that streams memory
(``stream``, as scripts/memory_neighbour_probe.py plants it). Each process times torch's native and oneDNN LSTM,
forward calls and training steps at the suite's shapes (I32, H64, batch 16, 20 steps), each paired with two anchors:
the plugin's (ten 16x64 steps through backward), and ``shaped``: an LSTM cell written out in plain tensor ops at the
call's shape (batch 16, input 32, hidden 64, 20 steps) through backward, touching no LSTM layer.

    python scripts/shape_anchor_probe.py 4      # 4 processes per mode; writes $OUT/shape_anchor_probe.json
"""

from __future__ import annotations

import json
import sys
import time

from memory_neighbour_probe import paired_each, rounds, summarise
from page_fault_probe import CALLS, torch_calls
from precision_anchor_probe import report

MODES = ("quiet", "stream")
ANCHORS = ("plugin", "shaped")


class ShapedAnchor:
    """An LSTM cell in plain tensor ops at the benchmark's shape, through backward."""

    def __init__(self, batch: int = 16, input_size: int = 32, hidden: int = 64, steps: int = 20) -> None:
        import torch

        gen = torch.Generator().manual_seed(0)
        self.torch = torch
        self.x = torch.randn(steps, batch, input_size, generator=gen) / 8
        self.w = (torch.randn(input_size, 4 * hidden, generator=gen) / 8).requires_grad_(True)
        self.u = (torch.randn(hidden, 4 * hidden, generator=gen) / 8).requires_grad_(True)
        self.b = torch.zeros(4 * hidden).requires_grad_(True)
        self.h0 = torch.zeros(batch, hidden)
        self.once()

    def once(self) -> None:
        torch = self.torch
        h = c = self.h0
        for x in self.x:
            i, f, g, o = torch.addmm(self.b, x, self.w).add_(h @ self.u).chunk(4, 1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
        h.sum().backward()
        self.w.grad = self.u.grad = self.b.grad = None

    def time(self, repeat: int) -> float:
        start = time.perf_counter()
        for _ in range(repeat):
            self.once()
        return (time.perf_counter() - start) / repeat


def child() -> None:
    from pytest_lstmperf.anchor import Anchor

    calls = torch_calls()
    anchors = {"plugin": Anchor("cpu"), "shaped": ShapedAnchor()}
    print(json.dumps(paired_each(calls, anchors, 20)))


def main(n: int) -> None:
    rows = rounds(__file__, n, MODES)
    report("shape_anchor_probe", rows, summarise(rows, [f"{c}/{a}" for c in CALLS for a in ANCHORS], MODES))


if __name__ == "__main__":
    if sys.argv[1:2] == ["child"]:
        child()
    else:
        main(int(sys.argv[1]))
