"""Does an anchor timed in JAX follow what moves a Keras-on-JAX call between processes better than the plugin's
torch anchor? In fresh processes, threads fixed as a CPU run fixes them (``device.apply_threads``), Keras on
JAX's LSTM training step and GRU forward call at batch 16 and LSTM forward call at batch 1 (the gate set's CPU
shapes), and the native torch LSTM's training step (the control), each timed after an untimed call of its own,
after an anchor run three ways in turn: the plugin's torch anchor, and two JAX anchors on the same tensors (the
same ten steps ``h = tanh(x @ W + h @ U)`` and their gradient, one jitted executable: unrolled, and as a
``lax.scan`` loop, as Keras's JAX backend runs a layer's time steps). Each process also reports its threads and
the CPU time its calls took per wall second (above 1: more than one thread worked).

Prints each process, then for each call how far the processes lie apart (1.4826 x MAD and standard deviation
of the log, percent) divided by each anchor and raw, and the slope of the log raw time on the log of each
anchor's (near 1: the call moves as the anchor does).

    SECS=0.6 BUDGET=240 python scripts/jax_anchor_probe.py 16      # writes $OUT/jax_anchor_probe.json
"""

from __future__ import annotations

import json
import math
import os
import resource
import statistics as st
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from precision_anchor_probe import report, spreads  # this folder is first on sys.path when run as a script

CALLS = ("keras-jax-lstm-train-B16", "keras-jax-gru-forward-B16", "keras-jax-lstm-forward-B1", "torch-lstm-train-B16")
ANCHORS = ("torch", "jax-unrolled", "jax-scan")


class JaxAnchor:
    """The anchor's ten steps and their gradient as one jitted JAX executable on the CPU."""

    def __init__(self, scan: bool) -> None:
        import jax
        import jax.numpy as jnp
        import numpy as np

        rng = np.random.default_rng(0)
        cpu = jax.devices("cpu")[0]
        self.jax = jax
        self.args = tuple(
            jax.device_put((rng.standard_normal(s) / 8).astype("float32"), cpu) for s in ((64, 64), (64, 64), (16, 64))
        )

        def unrolled(w: Any, u: Any, x: Any) -> Any:
            h = x
            for _ in range(10):
                h = jnp.tanh(x @ w + h @ u)
            return h.sum()

        def scanned(w: Any, u: Any, x: Any) -> Any:
            def step(h: Any, _: Any) -> tuple[Any, None]:
                return jnp.tanh(x @ w + h @ u), None

            h, _ = jax.lax.scan(step, x, None, length=10)
            return h.sum()

        self.fn = jax.jit(jax.grad(scanned if scan else unrolled, argnums=(0, 1)))
        self.once()

    def once(self) -> None:
        self.jax.block_until_ready(self.fn(*self.args))

    def time(self, repeat: int) -> float:
        start = time.perf_counter()
        for _ in range(repeat):
            self.once()
        return (time.perf_counter() - start) / repeat


def fit_repeat(one: float, call_s: float) -> int:
    repeat = 1
    while repeat * one < min(call_s, 0.005) and repeat < 256:
        repeat *= 2
    return repeat


def paired(call: Callable[[], object], anchor: Any, secs: float) -> dict[str, float]:
    """Time ``call`` beside ``anchor`` (anything with ``time(repeat)``) for ``secs`` seconds as the plugin pairs a
    CPU's: the anchor, an untimed call, the timed call. The medians of the call's time, the anchor's and their
    ratio, and the number of pairs. The probes in this folder share it."""
    repeat = fit_repeat(min(anchor.time(1) for _ in range(3)), min(_timed(call) for _ in range(5)))
    raw: list[float] = []
    anchors: list[float] = []
    end = time.perf_counter() + secs
    while time.perf_counter() < end:
        anchors.append(anchor.time(repeat))
        call()  # the timed call follows an untimed one, as the plugin pairs a CPU's
        raw.append(_timed(call))
    return {
        "call_us": round(st.median(raw) * 1e6, 2),
        "anchor_us": round(st.median(anchors) * 1e6, 2),
        "ratio": round(st.median([r / a for r, a in zip(raw, anchors, strict=True)]), 5),
        "pairs": len(raw),
    }


def child() -> None:
    from pytest_lstmperf.device import apply_threads

    apply_threads(int(os.environ.get("THREADS", "1")))
    os.environ["KERAS_BACKEND"] = "jax"
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # as the plugin's Keras workers start
    import torch

    from pytest_lstmperf.anchor import Anchor
    from pytest_lstmperf.model.case import make_case
    from pytest_lstmperf.model.keras_options import KerasOptions
    from pytest_lstmperf.model.spec import LayerSpec
    from pytest_lstmperf.paths.keras.runners import LocalKerasRun

    small = LayerSpec(cell="lstm", input_size=32, hidden_size=64, num_layers=1, batch=16, seq_len=20,
                      batch_first=True, training=True)  # fmt: skip
    opts = KerasOptions(backend="jax")

    def keras_call(spec: LayerSpec, kind: str) -> Callable[[], None]:
        run = LocalKerasRun(opts, make_case(spec), "cpu")
        return run._timed(kind)

    lstm = torch.nn.LSTM(32, 64, batch_first=True)
    x = torch.randn(16, 20, 32)

    def torch_train() -> None:
        out, _ = lstm(x)
        out.sum().backward()

    calls = {
        "keras-jax-lstm-train-B16": keras_call(small, "train_step"),
        "keras-jax-gru-forward-B16": keras_call(small.replace(cell="gru"), "forward"),
        "keras-jax-lstm-forward-B1": keras_call(small.replace(batch=1), "forward"),
        "torch-lstm-train-B16": torch_train,
    }
    torch_anchor = Anchor("cpu")
    anchors: dict[str, Any] = {"torch": torch_anchor, "jax-unrolled": JaxAnchor(False), "jax-scan": JaxAnchor(True)}
    out: dict[str, Any] = {"threads": len(os.listdir("/proc/self/task"))}
    for name, call in calls.items():
        for _ in range(5):
            call()
        call_s = min(_timed(call) for _ in range(5))
        repeats = {a: fit_repeat(min(anchor.time(1) for _ in range(3)), call_s) for a, anchor in anchors.items()}
        raw: list[float] = []
        per: dict[str, list[float]] = {a: [] for a in anchors}
        end = time.perf_counter() + float(os.environ.get("SECS", "0.6"))
        cpu0, wall0 = _cpu(), time.perf_counter()
        while time.perf_counter() < end:
            for a, anchor in anchors.items():
                per[a].append(anchor.time(repeats[a]))
                call()  # the timed call follows an untimed one, as the plugin pairs a CPU's
                raw.append(_timed(call))
        cpu_per_wall = (_cpu() - cpu0) / (time.perf_counter() - wall0)
        out[name] = {
            "raw_s": st.median(raw),
            "anchor_s": {a: st.median(v) for a, v in per.items()},
            "ratio": {
                a: st.median([r / t for r, t in zip(raw[i :: len(anchors)], v, strict=True)])
                for i, (a, v) in enumerate(per.items())
            },
            "repeat": repeats,
            "cpu_per_wall": round(cpu_per_wall, 3),
        }
    out["threads_after"] = len(os.listdir("/proc/self/task"))
    print(json.dumps(out))


def _timed(call: Callable[[], None]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def slope(ys: list[float], xs: list[float]) -> float:
    ly, lx = [math.log(v) for v in ys], [math.log(v) for v in xs]
    my, mx = st.mean(ly), st.mean(lx)
    sxx = sum((a - mx) ** 2 for a in lx)
    return round(sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sxx, 2) if sxx else float("nan")


def main(n: int) -> None:
    res: list[dict[str, Any]] = []
    t0 = time.time()
    for _ in range(n):
        p = subprocess.run([sys.executable, __file__, "child"], capture_output=True, text=True)
        if p.returncode:
            print(p.stderr[-3000:], flush=True)
            raise SystemExit(p.returncode)
        row = json.loads(p.stdout.strip().splitlines()[-1])
        res.append(row)
        brief = {k: (v["ratio"], v["cpu_per_wall"]) if isinstance(v, dict) else v for k, v in row.items()}
        print(round(time.time() - t0), json.dumps(brief), flush=True)
        if time.time() - t0 > float(os.environ.get("BUDGET", "1e9")):
            break
    summary: dict[str, Any] = {}
    for name in CALLS:
        rows = [r[name] for r in res]
        summary[name] = {
            **{f"/{a}": spreads([r["ratio"][a] for r in rows]) for a in ANCHORS},
            "raw": spreads([r["raw_s"] for r in rows]),
            "slope": {a: slope([r["raw_s"] for r in rows], [r["anchor_s"][a] for r in rows]) for a in ANCHORS},
            "cpu_per_wall": [min(r["cpu_per_wall"] for r in rows), max(r["cpu_per_wall"] for r in rows)],
        }
    report("jax_anchor_probe", res, summary)


if __name__ == "__main__":
    if sys.argv[1:2] == ["child"]:
        child()
    else:
        main(int(sys.argv[1]))
