"""How far fresh processes lie apart on a CPU, a call divided by the anchor, paired two ways: ``cold``, the timed
call right after the anchor (the pairing before the warm call); ``warm``, an untimed call of its own between them
(:class:`pytest_lstmperf.anchor.Pairs` on a CPU). Seven torch CPU calls, one thread, interleaved in blocks of 5
rounds in each process; the last ``BUSY_LAST`` processes beside ``BUSY_N`` busy Python processes.

    SECS=1.0 BUSY_LAST=5 BUSY_N=12 python scripts/pairing_probe.py 16   # writes $OUT/warm_probe.json

docs/gate-evidence.md holds what it printed on a 16-core Xeon (``xeon-2026-11-30-warm-or-cold-probe.json``).
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


def child(repeats: dict[str, int]) -> None:
    import torch

    from pytest_lstmperf.anchor import Anchor, estimate_call

    torch.set_num_threads(1)
    anchor = Anchor("cpu")
    torch.manual_seed(0)
    lstm, gru = torch.nn.LSTM(32, 64, batch_first=True), torch.nn.GRU(32, 64, batch_first=True)
    xs = {b: torch.randn(b, 20, 32) for b in (1, 16)}

    def fwd(m: Any, b: int, onednn: bool, bf16: bool = False) -> Callable[[], None]:
        def f() -> None:
            autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)
            with torch.no_grad(), torch.backends.mkldnn.flags(enabled=onednn), autocast:
                m(xs[b])

        return f

    def train(b: int, onednn: bool) -> Callable[[], None]:
        def f() -> None:
            with torch.backends.mkldnn.flags(enabled=onednn):
                out, _ = lstm(xs[b])
                out.sum().backward()
            lstm.zero_grad(set_to_none=True)

        return f

    calls = {
        "onednn-b1": fwd(lstm, 1, True),
        "onednn-b16": fwd(lstm, 16, True),
        "native-b1": fwd(lstm, 1, False),
        "native-b16": fwd(lstm, 16, False),
        "native-gru-b16": fwd(gru, 16, False),
        "bf16-native-b16": fwd(lstm, 16, False, True),
        "train-onednn-b16": train(16, True),
    }
    out = {}
    for name, call in calls.items():
        repeat = repeats.get(name) or anchor.repeat_for(estimate_call(call, 5))
        rows: dict[str, list[float]] = {"cold": [], "warm": [], "acold": [], "awarm": []}
        end = time.perf_counter() + float(os.environ.get("SECS", "1.2"))
        while time.perf_counter() < end:
            for mode in ("cold", "warm"):
                for _ in range(5):
                    per_rep = anchor.time(repeat)
                    if mode == "warm":
                        call()
                    start = time.perf_counter()
                    call()
                    took = time.perf_counter() - start
                    rows[mode].append(took / per_rep)
                    rows["a" + mode].append(took)  # the call's raw seconds
        out[name] = {m: st.median(v) for m, v in rows.items()} | {"repeat": repeat, "n": len(rows["cold"])}
    print(json.dumps(out))


def spread(values: list[float]) -> float:
    """1.4826 x the median absolute deviation of the log, in percent."""
    logs = [math.log(v) for v in values]
    mid = st.median(logs)
    return 100 * 1.4826 * st.median([abs(x - mid) for x in logs])


def main(n: int) -> None:
    res: list[dict[str, Any]] = []
    repeats: dict[str, int] = {}
    busy: list[subprocess.Popen[bytes]] = []
    t0 = time.time()
    for i in range(n):
        if i == n - int(os.environ.get("BUSY_LAST", "0")):
            loop = [
                sys.executable,
                "-c",
                "import os\nparent = os.getppid()\nwhile os.getppid() == parent: sum(range(10**6))",
            ]
            busy = [subprocess.Popen(loop) for _ in range(int(os.environ.get("BUSY_N", "12")))]
        p = subprocess.run([sys.executable, __file__, "child", json.dumps(repeats)], capture_output=True, text=True)
        row = json.loads(p.stdout.strip().splitlines()[-1])
        repeats = {k: v["repeat"] for k, v in row.items()}  # every process pairs with the first's repetitions
        row["busy"] = bool(busy)
        res.append(row)
        ratios = {k: [round(v["cold"], 3), round(v["warm"], 3)] for k, v in row.items() if k != "busy"}
        print(round(time.time() - t0), json.dumps(ratios), flush=True)
    for b in busy:
        b.kill()
    summary = {}
    for k in [k for k in res[0] if k != "busy"]:
        quiet = [r for r in res if not r["busy"]]
        summary[k] = {m: {"mad%": round(spread([r[k][m] for r in res]), 2)} for m in ("cold", "warm", "acold", "awarm")}
        summary[k]["quiet"] = {
            m: round(spread([r[k][m] for r in quiet]), 2) for m in ("cold", "warm", "acold", "awarm")
        }
        summary[k]["repeat"] = res[0][k]["repeat"]
        print(k, json.dumps(summary[k]))
    path = os.path.join(os.environ.get("OUT", "."), "warm_probe.json")
    with open(path, "w") as handle:
        json.dump({"processes": res, "summary": summary}, handle, indent=1)


if __name__ == "__main__":
    if sys.argv[1:2] == ["child"]:
        child(json.loads(sys.argv[2]))
    else:
        main(int(sys.argv[1]))
