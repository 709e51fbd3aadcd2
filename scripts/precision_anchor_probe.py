"""Does an anchor run in a benchmark's own precision follow what moves it between processes better? In fresh
processes, one thread, the native LSTM and GRU at batch 16 under bf16 autocast (and the native LSTM in fp32, the
control), each timed after an untimed call of its own and divided by the anchor run two ways, alternately: as the
plugin runs it (fp32), and under bf16 autocast. Prints each process, then how far the processes lie apart
(1.4826 x MAD and standard deviation of the log, percent) divided by either anchor, and raw.

    SECS=0.7 BUDGET=90 python scripts/precision_anchor_probe.py 40     # writes $OUT/precision_anchor_probe.json

docs/gate-evidence.md holds what it printed on the 2-core VM.
"""

from __future__ import annotations

import json
import math
import os
import statistics as st
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

CALLS = ("bf16-lstm", "bf16-gru", "fp32-lstm")


def child() -> None:
    import torch

    from pytest_lstmperf.anchor import Anchor

    torch.set_num_threads(1)
    anchor = Anchor("cpu")
    torch.manual_seed(0)
    lstm, gru = torch.nn.LSTM(32, 64, batch_first=True), torch.nn.GRU(32, 64, batch_first=True)
    x = torch.randn(16, 20, 32)

    def fwd(m: Any, bf16: bool) -> Callable[[], None]:
        def f() -> None:
            autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)
            with torch.no_grad(), torch.backends.mkldnn.flags(enabled=False), autocast:
                m(x)

        return f

    def bf16_anchor(repeat: int) -> float:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return anchor.time(repeat)

    bf16_anchor(2)
    calls = dict(zip(CALLS, (fwd(lstm, True), fwd(gru, True), fwd(lstm, False)), strict=True))
    out: dict[str, Any] = {"capability": torch.backends.cpu.get_cpu_capability()}
    for name, call in calls.items():
        for _ in range(10):
            call()
        fp32, bf16, raw = [], [], []
        end = time.perf_counter() + float(os.environ.get("SECS", "0.8"))
        while time.perf_counter() < end:
            for ratios, anchor_time in ((fp32, anchor.time), (bf16, bf16_anchor)):
                per_rep = anchor_time(4)
                call()  # the timed call follows an untimed one, as the plugin pairs a CPU's
                start = time.perf_counter()
                call()
                took = time.perf_counter() - start
                ratios.append(took / per_rep)
                raw.append(took)
        out[name] = {"fp32_anchor": st.median(fp32), "bf16_anchor": st.median(bf16), "raw_s": st.median(raw)}
    print(json.dumps(out))


def spreads(values: list[float]) -> dict[str, float]:
    logs = [math.log(v) for v in values]
    mid = st.median(logs)
    return {
        "mad%": round(100 * 1.4826 * st.median([abs(x - mid) for x in logs]), 2),
        "sd%": round(100 * st.stdev(logs), 2),
    }


def report(stem: str, processes: list[dict[str, Any]], summary: dict[str, Any], label: str = "") -> None:
    """A probe's last lines: each summary row printed (after ``label``), then the processes and the summary written
    to ``$OUT/<stem>.json`` (the current folder without OUT). The probes in this folder share it."""
    for name, row in summary.items():
        print(name, *([label] if label else []), json.dumps(row), flush=True)
    path = os.path.join(os.environ.get("OUT", "."), f"{stem}.json")
    with open(path, "w") as handle:
        json.dump({"processes": processes, "summary": summary}, handle, indent=1)


def main(n: int) -> None:
    res: list[dict[str, Any]] = []
    t0 = time.time()
    for _ in range(n):
        p = subprocess.run([sys.executable, __file__, "child"], capture_output=True, text=True, check=True)
        row = json.loads(p.stdout.strip().splitlines()[-1])
        res.append(row)
        print(round(time.time() - t0), json.dumps(row), flush=True)
        if time.time() - t0 > float(os.environ.get("BUDGET", "1e9")):
            break
    summary = {
        name: {key: spreads([r[name][key] for r in res]) for key in ("fp32_anchor", "bf16_anchor", "raw_s")}
        for name in CALLS
    }
    report("precision_anchor_probe", res, summary)


if __name__ == "__main__":
    if sys.argv[1:2] == ["child"]:
        child()
    else:
        main(int(sys.argv[1]))
