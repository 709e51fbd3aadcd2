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
import os
import statistics as st
import subprocess
import sys
import time
from typing import Any

from jax_anchor_probe import paired  # this folder is first on sys.path when run as a script
from memory_neighbour_probe import NEIGHBOURS
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
    out: dict[str, Any] = {}
    for name, call in calls.items():
        for _ in range(20):
            call()
        for a, anchor in anchors.items():
            out[f"{name}/{a}"] = paired(call, anchor, float(os.environ.get("SECS", "1.0")))
    print(json.dumps(out))


def main(n: int) -> None:
    rows: list[dict[str, Any]] = []
    t0 = time.time()
    for _ in range(n):
        for mode in MODES:
            neighbour = subprocess.Popen([sys.executable, "-c", NEIGHBOURS[mode]]) if mode in NEIGHBOURS else None
            try:
                time.sleep(1.0 if neighbour else 0.0)
                p = subprocess.run([sys.executable, __file__, "child"], capture_output=True, text=True)
            finally:
                if neighbour is not None:
                    neighbour.kill()
                    neighbour.wait()
            if p.returncode:
                print(p.stderr[-3000:], flush=True)
                raise SystemExit(p.returncode)
            row = {"mode": mode, "t_s": round(time.time() - t0), **json.loads(p.stdout.strip().splitlines()[-1])}
            rows.append(row)
            print(json.dumps(row), flush=True)
    names = [f"{c}/{a}" for c in CALLS for a in ANCHORS]
    keys = ("call_us", "anchor_us", "ratio")
    summary: dict[str, Any] = {}
    for mode in MODES:
        mine = [r for r in rows if r["mode"] == mode]
        summary[mode] = {k: {x: round(st.mean(r[k][x] for r in mine), 4) for x in keys} for k in names}
    summary["stream/quiet"] = {
        k: {x: round(summary["stream"][k][x] / summary["quiet"][k][x], 4) for x in keys} for k in names
    }
    report("shape_anchor_probe", rows, summary)


if __name__ == "__main__":
    if sys.argv[1:2] == ["child"]:
        child()
    else:
        main(int(sys.argv[1]))
