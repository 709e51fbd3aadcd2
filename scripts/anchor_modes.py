"""Does an anchor that runs backward follow a training step better than the gate's anchor does? A probe, not the rule.

    python scripts/anchor_modes.py [--processes=16] [--seconds=8] [--out=FILE.jsonl]

Times, in each of ``--processes`` fresh processes one after another (one CPU thread, the native and the oneDNN
kernel in turn), a torch LSTM training step (batch 16, 20 steps, 32 inputs, 64 hidden: the gate's CPU training
benchmark) and a forward call at batch 1, interleaved with two anchors: the gate's (:class:`Anchor`: ten steps of
``tanh(x @ W + h @ U)`` under ``no_grad``) and a training anchor (the same ops with ``W`` and ``U`` requiring grad,
then ``backward``). Each process gives one median of every ratio; the spread of those medians across processes
(standard deviation of their logs) is the between-process noise each anchor leaves. Prints a table; ``--out``
keeps the per-process medians. The rule divides every figure by the gate's anchor (docs/speed-gate.md); on the
quiet 2-core VM the training steps moved more between runs than any other benchmark (docs/gate-evidence.md).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path


def one_process(kernel: str, seconds: float) -> dict[str, float]:
    import torch

    from pytest_lstmperf.anchor import Anchor

    torch.set_num_threads(1)
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(32, 64, batch_first=True)
    x = torch.randn(16, 20, 32)
    onednn = kernel == "onednn"

    def step() -> None:
        with torch.backends.mkldnn.flags(enabled=onednn):
            out, _ = lstm(x)
            out.sum().backward()
        lstm.zero_grad(set_to_none=True)

    def forward() -> None:
        with torch.no_grad(), torch.backends.mkldnn.flags(enabled=onednn):
            lstm(x[:1])

    gen = torch.Generator().manual_seed(0)
    ax, aw, au = ((torch.randn(*s, generator=gen) / 8) for s in ((16, 64), (64, 64), (64, 64)))
    aw.requires_grad_(True)
    au.requires_grad_(True)

    def backward_anchor() -> None:
        h = ax
        for _ in range(Anchor.STEPS):
            h = torch.tanh(torch.addmm(h @ au, ax, aw))
        h.sum().backward()
        aw.grad = au.grad = None

    def per_repeat(fn: object, repeat: int) -> float:
        start = time.perf_counter()
        for _ in range(repeat):
            fn()  # type: ignore[operator]
        return (time.perf_counter() - start) / repeat

    anchor = Anchor("cpu")
    for _ in range(5):
        step()
        forward()
        backward_anchor()
    pairs = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a = anchor.time(4)
        start = time.perf_counter()
        step()
        s = time.perf_counter() - start
        t = per_repeat(backward_anchor, 2)
        start = time.perf_counter()
        forward()
        f = time.perf_counter() - start
        pairs.append((a, s, t, f))

    def median(values: list[float]) -> float:
        return statistics.median(values)

    return {
        "pairs": len(pairs),
        "step raw": median([p[1] for p in pairs]),
        "step / anchor": median([p[1] / p[0] for p in pairs]),
        "step / backward anchor": median([p[1] / p[2] for p in pairs]),
        "forward raw": median([p[3] for p in pairs]),
        "forward / anchor": median([p[3] / p[0] for p in pairs]),
        "forward / backward anchor": median([p[3] / p[2] for p in pairs]),
    }


FIGURES = (
    "step raw",
    "step / anchor",
    "step / backward anchor",
    "forward raw",
    "forward / anchor",
    "forward / backward anchor",
)


def spread(rows: list[dict[str, float]], key: str) -> float:
    """Standard deviation of the processes' log medians, in percent."""
    logs = [math.log(r[key]) for r in rows if r.get(key, 0) > 0]
    return 100 * statistics.stdev(logs) if len(logs) > 1 else math.nan


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--processes", type=int, default=16)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--out", type=Path)
    p.add_argument("--one", choices=("native", "onednn"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.one:
        print(json.dumps(one_process(a.one, a.seconds)))
        return 0
    rows: dict[str, list[dict[str, float]]] = {"native": [], "onednn": []}
    for k in range(a.processes):
        for kernel in rows:
            done = subprocess.run(
                [sys.executable, __file__, f"--one={kernel}", f"--seconds={a.seconds}"],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            rows[kernel].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"process {k + 1}/{a.processes} {kernel}: {rows[kernel][-1]['pairs']} pairs", file=sys.stderr)
    if a.out:
        a.out.write_text("".join(json.dumps({"kernel": k, **r}) + "\n" for k, rs in rows.items() for r in rs))
    print("| kernel | " + " | ".join(FIGURES) + " |")
    print("|---|" + "---|" * len(FIGURES))
    for kernel, rs in rows.items():
        print(f"| {kernel} ({len(rs)} processes) | " + " | ".join(f"{spread(rs, f):.2f}%" for f in FIGURES) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
