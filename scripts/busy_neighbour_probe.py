"""Beside a busy process, does Keras on JAX's LSTM call move with the anchor, and does JAX's asynchronous dispatch
on the CPU decide it? Fresh processes, one thread as the plugin sets them, taken in turn in four modes: quiet or
beside a spinning process (``gate_trials.SPIN``), with JAX's CPU dispatch asynchronous (its default) or not
(``jax_cpu_enable_async_dispatch``). Each times Keras on JAX's LSTM forward call at batch 16 and at batch 1, each
call paired with the plugin's CPU anchor as ``jax_anchor_probe`` pairs them, and prints the call's time, the
anchor's, their ratio and the process's CPU time per wall second; then, per mode, the means over processes.

    python scripts/busy_neighbour_probe.py 3        # 3 processes per mode; writes $OUT/busy_neighbour_probe.json

docs/gate-evidence.md holds what it printed on the 2-core VM.
"""

from __future__ import annotations

import itertools
import json
import os
import statistics as st
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from gate_trials import SPIN  # this folder is first on sys.path when run as a script
from jax_anchor_probe import _cpu, paired  # this folder is first on sys.path when run as a script
from precision_anchor_probe import report

MODES = [f"{where}-{dispatch}" for where, dispatch in itertools.product(("quiet", "busy"), ("async", "sync"))]
CALLS = ("forward-B16", "forward-B1")


def child(mode: str) -> None:
    from pytest_lstmperf.device import apply_threads

    apply_threads(1)
    os.environ["KERAS_BACKEND"] = "jax"
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax

    if mode.endswith("-sync"):
        jax.config.update("jax_cpu_enable_async_dispatch", False)
    from pytest_lstmperf.anchor import Anchor
    from pytest_lstmperf.model.case import make_case
    from pytest_lstmperf.model.keras_options import KerasOptions
    from pytest_lstmperf.model.spec import LayerSpec
    from pytest_lstmperf.paths.keras.runners import LocalKerasRun

    spec = LayerSpec(cell="lstm", input_size=32, hidden_size=64, num_layers=1, batch=16, seq_len=20,
                     batch_first=True, training=True)  # fmt: skip
    opts = KerasOptions(backend="jax")
    calls: dict[str, Callable[[], None]] = {
        "forward-B16": LocalKerasRun(opts, make_case(spec), "cpu")._timed("forward"),
        "forward-B1": LocalKerasRun(opts, make_case(spec.replace(batch=1)), "cpu")._timed("forward"),
    }
    anchor = Anchor("cpu")
    out: dict[str, Any] = {"mode": mode}
    for name, call in calls.items():
        for _ in range(5):
            call()
        cpu0, wall0 = _cpu(), time.perf_counter()
        out[name] = paired(call, anchor, float(os.environ.get("SECS", "1.0")))
        out[name]["cpu_per_wall"] = round((_cpu() - cpu0) / (time.perf_counter() - wall0), 3)
    print(json.dumps(out))


def main(n: int) -> None:
    rows: list[dict[str, Any]] = []
    t0 = time.time()
    for _ in range(n):
        for mode in MODES:
            busy = subprocess.Popen([sys.executable, "-c", SPIN]) if mode.startswith("busy") else None
            try:
                p = subprocess.run([sys.executable, __file__, "child", mode], capture_output=True, text=True)
            finally:
                if busy is not None:
                    busy.kill()
                    busy.wait()
            if p.returncode:
                print(p.stderr[-3000:], flush=True)
                raise SystemExit(p.returncode)
            rows.append(json.loads(p.stdout.strip().splitlines()[-1]))
            print(round(time.time() - t0), json.dumps(rows[-1]), flush=True)
    keys = ("call_us", "anchor_us", "ratio", "cpu_per_wall")
    summary: dict[str, Any] = {}
    for mode in MODES:
        mine = [r for r in rows if r["mode"] == mode]
        summary[mode] = {name: {k: round(st.mean(r[name][k] for r in mine), 4) for k in keys} for name in CALLS}
    report("busy_neighbour_probe", rows, summary)


if __name__ == "__main__":
    if sys.argv[1:2] == ["child"]:
        child(sys.argv[2])
    else:
        main(int(sys.argv[1]))
