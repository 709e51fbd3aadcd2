"""Does pinning a benchmark's process to one core bring processes closer together? In fresh processes, one thread,
the native LSTM at batch 16 (forward, no grad) and its training step, each timed after an untimed call of its own and
divided by the plugin's anchor, as the plugin times a CPU benchmark. Processes run one at a time, in three modes
taken in turn so that a drift of the machine falls on each alike:

* `free`: the process runs where the scheduler puts it (the plugin's behaviour);
* `same`: every process pinned to one core (the first of this process's affinity mask);
* `core-K`: pinned to core K, every core of the mask in turn, each twice, so that the spread between cores and the
  spread between processes on one core can be told apart.

Prints each process, then how far the processes lie apart (1.4826 x MAD and standard deviation of the log,
percent) per mode, divided by the anchor and raw, and for the per-core mode the spread of the per-core means and of
the two processes within each core.

    SECS=0.8 BUDGET=200 python scripts/pinning_probe.py 12     # writes $OUT/pinning_probe.json

docs/gate-evidence.md holds what it printed on a 16-core Xeon.
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

from precision_anchor_probe import report, spreads

CALLS = ("lstm-fwd", "lstm-train")


def child() -> None:
    import torch

    from pytest_lstmperf.anchor import Anchor

    torch.set_num_threads(1)
    anchor = Anchor("cpu")
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(32, 64, batch_first=True)
    x = torch.randn(16, 20, 32)
    opt = torch.optim.SGD(lstm.parameters(), lr=1e-3)

    def fwd() -> None:
        with torch.no_grad(), torch.backends.mkldnn.flags(enabled=False):
            lstm(x)

    def train() -> None:
        with torch.backends.mkldnn.flags(enabled=False):
            opt.zero_grad()
            lstm(x)[0].sum().backward()
            opt.step()

    anchor.time(2)
    calls: dict[str, Callable[[], None]] = dict(zip(CALLS, (fwd, train), strict=True))
    out: dict[str, Any] = {"cpu": sorted(os.sched_getaffinity(0))}
    for name, call in calls.items():
        for _ in range(10):
            call()
        ratios, raw = [], []
        end = time.perf_counter() + float(os.environ.get("SECS", "0.8"))
        while time.perf_counter() < end:
            per_rep = anchor.time(4)
            call()  # the timed call follows an untimed one, as the plugin pairs a CPU's
            start = time.perf_counter()
            call()
            took = time.perf_counter() - start
            ratios.append(took / per_rep)
            raw.append(took)
        out[name] = {"anchored": st.median(ratios), "raw_s": st.median(raw)}
    print(json.dumps(out))


def _spread_of(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {name: {key: spreads([r[name][key] for r in rows]) for key in ("anchored", "raw_s")} for name in CALLS}


def main(rounds: int) -> None:
    cores = sorted(os.sched_getaffinity(0))
    plan: list[tuple[str, int | None]] = []
    per_core = [(f"core-{c}", c) for c in cores] * 2
    for k in range(max(rounds, len(per_core))):
        if k < rounds:
            plan += [("free", None), ("same", cores[0])]
        if k < len(per_core):
            plan.append(per_core[k])
    res: list[dict[str, Any]] = []
    t0 = time.time()
    for mode, core in plan:
        pin = ["taskset", "-c", str(core)] if core is not None else []
        p = subprocess.run([*pin, sys.executable, __file__, "child"], capture_output=True, text=True, check=True)
        row = json.loads(p.stdout.strip().splitlines()[-1]) | {"mode": mode}
        res.append(row)
        print(round(time.time() - t0), json.dumps(row), flush=True)
        if time.time() - t0 > float(os.environ.get("BUDGET", "1e9")):
            break
    summary: dict[str, Any] = {}
    for mode in ("free", "same"):
        rows = [r for r in res if r["mode"] == mode]
        if len(rows) > 2:
            summary[mode] = {"n": len(rows)} | _spread_of(rows)
    pinned = [r for r in res if r["mode"].startswith("core-")]
    by_core: dict[str, list[dict[str, Any]]] = {}
    for r in pinned:
        by_core.setdefault(r["mode"], []).append(r)
    if len(pinned) > 2:
        summary["each-core"] = {"n": len(pinned)} | _spread_of(pinned)
        pairs = [rows for rows in by_core.values() if len(rows) == 2]
        for name in CALLS:
            # within a core: the two processes' log difference / sqrt(2) estimates one process's spread there
            within = [abs(math.log(a[name]["anchored"] / b[name]["anchored"])) / math.sqrt(2) for a, b in pairs]
            means = [st.fmean(math.log(r[name]["anchored"]) for r in rows) for rows in by_core.values()]
            summary["each-core"][name]["within-core rms%"] = (
                round(100 * math.sqrt(st.fmean(w * w for w in within)), 2) if within else None
            )
            summary["each-core"][name]["between-core-means sd%"] = (
                round(100 * st.stdev(means), 2) if len(means) > 2 else None
            )
    report("pinning_probe", res, summary)


if __name__ == "__main__":
    if sys.argv[1:2] == ["child"]:
        child()
    else:
        main(int(sys.argv[1]))
