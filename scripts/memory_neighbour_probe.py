"""Beside a process that streams memory, do torch's CPU training steps move further than the anchor? Fresh
processes, one thread as the plugin sets them, taken in turn in three modes: ``quiet``; ``spin``, beside
a spinning process (``gate_trials.SPIN``: a busy core, the planted busy neighbour); ``stream``, beside a process
that copies a 256 MiB array into another without end (a neighbour that takes the memory bandwidth and the shared
cache, as another tenant of a shared host may). Each process times the suite's shapes (I32, H64, one layer,
batch 16, 20 steps) on ``torch-cpu-native`` and ``torch-cpu-onednn``, forward calls and training steps, each call
paired with the plugin's CPU anchor as the plugin pairs them, and prints per call its time, the anchor's and their
ratio. Then, per mode and call, the means over processes, and each mode's ratios against quiet's.

    python scripts/memory_neighbour_probe.py 3      # 3 processes per mode; writes $OUT/memory_neighbour_probe.json

docs/gate-evidence.md holds what it printed on the 2-core VM.
"""

from __future__ import annotations

import json
import os
import statistics as st
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gate_trials import SPIN, STREAM
from jax_anchor_probe import paired  # this folder is first on sys.path when run as a script
from page_fault_probe import CALLS, torch_calls
from precision_anchor_probe import report

MODES = ("quiet", "spin", "stream")
NEIGHBOURS = {"spin": SPIN, "stream": STREAM}  # each stops once the probe is gone


def child() -> None:
    from pytest_lstmperf.anchor import Anchor

    calls = torch_calls()
    anchor = Anchor("cpu")
    out: dict[str, Any] = {}
    for name, call in calls.items():
        for _ in range(20):
            call()
        out[name] = paired(call, anchor, float(os.environ.get("SECS", "1.0")))
    print(json.dumps(out))


def paired_each(calls: Mapping[str, Callable[[], object]], anchors: Mapping[str, Any], warm: int) -> dict[str, Any]:
    """Each call, after ``warm`` untimed ones, paired in turn with each anchor (:func:`jax_anchor_probe.paired`,
    ``SECS`` seconds each): ``call/anchor`` -> its medians."""
    out: dict[str, Any] = {}
    for name, call in calls.items():
        for _ in range(warm):
            call()
        for a, anchor in anchors.items():
            out[f"{name}/{a}"] = paired(call, anchor, float(os.environ.get("SECS", "1.0")))
    return out


def rounds(script: str, n: int, modes: tuple[str, ...]) -> list[dict[str, Any]]:
    """``n`` rounds of fresh ``script child`` processes, one per mode in turn, each beside the neighbour its mode
    names (none for ``quiet``); per process, its mode, its start and what it printed last (JSON). The neighbour
    probes in this folder share it."""
    rows: list[dict[str, Any]] = []
    t0 = time.time()
    for _ in range(n):
        for mode in modes:
            neighbour = subprocess.Popen([sys.executable, "-c", NEIGHBOURS[mode]]) if mode in NEIGHBOURS else None
            try:
                time.sleep(1.0 if neighbour else 0.0)  # the neighbour's arrays allocated and touched
                p = subprocess.run([sys.executable, script, "child"], capture_output=True, text=True)
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
    return rows


def summarise(rows: list[dict[str, Any]], names: Sequence[str], modes: tuple[str, ...]) -> dict[str, Any]:
    """Per mode and name, the means over processes of the call's time, the anchor's and their ratio; then how far
    each moved in every other mode against the first's (``quiet``)."""
    keys = ("call_us", "anchor_us", "ratio")
    summary: dict[str, Any] = {}
    for mode in modes:
        mine = [r for r in rows if r["mode"] == mode]
        summary[mode] = {name: {k: round(st.mean(r[name][k] for r in mine), 4) for k in keys} for name in names}
    for mode in modes[1:]:
        summary[f"{mode}/{modes[0]}"] = {
            name: {k: round(summary[mode][name][k] / summary[modes[0]][name][k], 4) for k in keys} for name in names
        }
    return summary


def main(n: int) -> None:
    rows = rounds(__file__, n, MODES)
    report("memory_neighbour_probe", rows, summarise(rows, CALLS, MODES))


if __name__ == "__main__":
    if sys.argv[1:2] == ["child"]:
        child()
    else:
        main(int(sys.argv[1]))
