"""Does running torch.compile in a process move the anchor, and through what? Fresh processes, one thread, taken in
turn in two modes: each times, before and after running a native LSTM (batch 16) twice, either eagerly or
torch.compile'd, the plugin's CPU anchor (its steps run through ``backward``), the LSTM's forward call divided by it,
and ten steps of ``h = tanh(x @ W + h @ U)`` run forward only and through ``backward``. Prints each process's
after/before ratios, then their means per mode.

    python scripts/compile_beside_probe.py 4        # 4 processes per mode; writes $OUT/compile_beside_probe.json

docs/gate-evidence.md holds what it printed on the 2-core VM.
"""

from __future__ import annotations

import json
import statistics as st
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from precision_anchor_probe import report  # this folder is first on sys.path when run as a script

MODES = ("eager", "compile")


def child(mode: str) -> None:
    import torch

    from pytest_lstmperf.anchor import Anchor

    torch.set_num_threads(1)
    anchor = Anchor("cpu")
    lstm = torch.nn.LSTM(32, 64, batch_first=True)
    xs = torch.randn(16, 20, 32)
    x, W, U = torch.randn(16, 64), torch.randn(64, 64, requires_grad=True), torch.randn(64, 64, requires_grad=True)

    def call() -> None:
        with torch.no_grad():
            lstm(xs)

    def steps(backward: bool) -> Callable[[], None]:
        def run() -> None:
            with torch.set_grad_enabled(backward):
                h = torch.zeros(16, 64)
                for _ in range(10):
                    h = torch.tanh(x @ W + h @ U)
                if backward:
                    h.sum().backward()

        return run

    def loop(f: Callable[[], None], n: int = 200) -> float:
        times = []
        for _ in range(7):
            start = time.perf_counter()
            for _ in range(n):
                f()
            times.append(time.perf_counter() - start)
        return st.median(times)

    def measure() -> dict[str, float]:
        anchor.time(4)
        per_rep, ratios = [], []
        end = time.perf_counter() + 2.0
        while time.perf_counter() < end:
            t = anchor.time(4)
            call()  # the timed call follows an untimed one, as the plugin pairs a CPU's
            start = time.perf_counter()
            call()
            ratios.append((time.perf_counter() - start) / t)
            per_rep.append(t)
        return {
            "anchor": st.median(per_rep),
            "lstm/anchor": st.median(ratios),
            "steps forward": loop(steps(False)),
            "steps backward": loop(steps(True)),
        }

    before = measure()
    target = torch.compile(lstm) if mode == "compile" else lstm
    with torch.no_grad():
        target(xs)
        target(xs)
    after = measure()
    print(json.dumps({"mode": mode} | {k: after[k] / before[k] for k in before}))


def main(n: int) -> None:
    rows: list[dict[str, Any]] = []
    for k in range(n):
        for mode in MODES:
            p = subprocess.run([sys.executable, __file__, "child", mode], capture_output=True, text=True, check=True)
            row = json.loads(p.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(k + 1, json.dumps(row), flush=True)
    keys = [k for k in rows[0] if k != "mode"]
    summary = {
        mode: {key: round(st.fmean(r[key] for r in rows if r["mode"] == mode), 4) for key in keys} for mode in MODES
    }
    report("compile_beside_probe", rows, summary, "after / before, mean:")


if __name__ == "__main__":
    if sys.argv[1:2] == ["child"]:
        child(sys.argv[2])
    else:
        main(int(sys.argv[1]))
