"""Do torch's CPU training steps fault pages on every call, and does that move them apart from the anchor? Fresh
processes, one thread as the plugin sets them, taken in turn in two modes: glibc's allocator as it comes
(``default``), or told to keep freed memory in the process (``kept``: ``MALLOC_MMAP_THRESHOLD_`` and
``MALLOC_TRIM_THRESHOLD_`` set, so that a freed block of a few hundred KiB is reused instead of unmapped and
faulted in again). Each process times the suite's shapes (I32, H64, one layer, batch 16, 20 steps) on
``torch-cpu-native`` and ``torch-cpu-onednn``, forward calls and training steps, each call paired with the plugin's
CPU anchor as the plugin pairs them, and prints per call: its time, the anchor's, their ratio, and the minor page
faults of the process per call. Then, per mode and call, the means over processes and their spread.

    python scripts/page_fault_probe.py 4       # 4 processes per mode, in turn; writes $OUT/page_fault_probe.json

docs/gate-evidence.md holds what it printed on the 2-core VM.
"""

from __future__ import annotations

import json
import os
import resource
import statistics as st
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from jax_anchor_probe import paired  # this folder is first on sys.path when run as a script
from precision_anchor_probe import report

MODES = ("default", "kept")
KEPT = {"MALLOC_MMAP_THRESHOLD_": str(64 << 20), "MALLOC_TRIM_THRESHOLD_": str(128 << 20)}
CALLS = tuple(f"{path}-{mode}" for path in ("torch-cpu-native", "torch-cpu-onednn") for mode in ("forward", "train"))


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def torch_calls() -> dict[str, Callable[[], object]]:
    """The suite's shapes (I32, H64, one layer, batch 16, 20 steps) on ``torch-cpu-native`` and
    ``torch-cpu-onednn``, forward calls and training steps, prepared as the plugin prepares them, one thread."""
    from pytest_lstmperf import paths as registry
    from pytest_lstmperf.device import apply_threads, resolve_device
    from pytest_lstmperf.model.case import make_case
    from pytest_lstmperf.model.spec import LayerSpec
    from pytest_lstmperf.paths.torch_paths import prepare

    apply_threads(1)
    device = resolve_device("cpu")
    spec = LayerSpec(cell="lstm", input_size=32, hidden_size=64, num_layers=1, batch=16, seq_len=20,
                     batch_first=True, training=True)  # fmt: skip
    calls: dict[str, Callable[[], object]] = {}
    for name in CALLS:
        path, _, mode = name.rpartition("-")
        run = prepare(registry.get(path), make_case(spec), device)
        calls[name] = run.forward if mode == "forward" else run.train_step
    return calls


def child() -> None:
    from pytest_lstmperf.anchor import Anchor

    calls = torch_calls()
    anchor = Anchor("cpu")
    out: dict[str, Any] = {"mode": os.environ.get("PROBE_MODE", "default")}
    for name, call in calls.items():
        for _ in range(20):
            call()
        faults0 = _faults()
        out[name] = paired(call, anchor, float(os.environ.get("SECS", "1.0")))
        # two calls a pair and the five that fit the anchor's repetitions; the anchor faults none
        out[name]["faults_per_call"] = round((_faults() - faults0) / (2 * out[name]["pairs"] + 5), 2)
    print(json.dumps(out))


def main(n: int) -> None:
    rows: list[dict[str, Any]] = []
    t0 = time.time()
    for _ in range(n):
        for mode in MODES:
            env = dict(os.environ, PROBE_MODE=mode, **(KEPT if mode == "kept" else {}))
            p = subprocess.run([sys.executable, __file__, "child"], capture_output=True, text=True, env=env)
            if p.returncode:
                print(p.stderr[-3000:], flush=True)
                raise SystemExit(p.returncode)
            rows.append(json.loads(p.stdout.strip().splitlines()[-1]))
            rows[-1]["t_s"] = round(time.time() - t0)
            print(json.dumps(rows[-1]), flush=True)
    keys = ("call_us", "anchor_us", "ratio", "faults_per_call")
    summary: dict[str, Any] = {}
    for mode in MODES:
        mine = [r for r in rows if r["mode"] == mode]
        summary[mode] = {name: {k: round(st.mean(r[name][k] for r in mine), 4) for k in keys} for name in CALLS}
        for name in CALLS:  # how far processes lie apart, relative to their mean
            ratios = [r[name]["ratio"] for r in mine]
            spread = st.stdev(ratios) / st.mean(ratios) if len(ratios) > 1 else None
            summary[mode][name]["ratio_spread"] = None if spread is None else round(spread, 4)
    report("page_fault_probe", rows, summary)


if __name__ == "__main__":
    if sys.argv[1:2] == ["child"]:
        child()
    else:
        main(int(sys.argv[1]))
