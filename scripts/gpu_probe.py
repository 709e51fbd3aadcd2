"""Probe the CUDA paths: print what the kernel trace observes for each, and the error against float64 torch."""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pytest_lstmperf import paths
from pytest_lstmperf.device import resolve_device
from pytest_lstmperf.model.case import make_case
from pytest_lstmperf.model.spec import LayerSpec


def torch64(case):
    path = paths.get("torch-cpu-native")
    spec = case.spec.replace(dtype="float64")
    run = path.prepare(case, resolve_device("cpu"))
    run.module.double()
    run.x = run.x.double()
    run.h0 = None if run.h0 is None else run.h0.double()
    run.c0 = None if run.c0 is None else run.c0.double()
    run.seeds = [s.double() for s in run.seeds]
    del spec
    return run.run()


def rel(a, b):
    import numpy as np

    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    dev = resolve_device("cuda")
    print(dev.describe())
    specs = [
        LayerSpec(input_size=64, hidden_size=256, num_layers=2, batch=8, seq_len=100),
        LayerSpec(cell="gru", input_size=32, hidden_size=64, num_layers=1, bidirectional=True, batch=4, seq_len=20),
        LayerSpec(
            input_size=16,
            hidden_size=32,
            proj_size=8,
            batch=3,
            seq_len=7,
            length_mode="packed",
            lengths=(7, 4, 2),
            initial_state=True,
        ),
    ]
    rows = []
    for spec in specs:
        case = make_case(spec)
        ref = torch64(case) if spec.length_mode != "packed" else None
        for p in paths.for_device("cuda", paths.all_paths()):
            why = p.available(dev) or p.supports(spec)
            if why:
                print(f"{p.name:28s} {spec.short():40s} skipped: {why}")
                continue
            t = time.time()
            try:
                r = p.prepare(case, dev).run()
            except Exception as exc:
                print(f"{p.name:28s} {spec.short():40s} ERROR {type(exc).__name__}: {exc}")
                continue
            err = rel(r.output, ref.output) if ref is not None else float("nan")
            gerr = rel(r.grads["weight_hh_l0"], ref.grads["weight_hh_l0"]) if ref is not None else float("nan")
            row = dict(
                path=p.name,
                spec=spec.short(),
                fwd=r.forward_trace.to_dict(),
                bwd=r.backward_trace.to_dict(),
                err=err,
                gerr=gerr,
                secs=time.time() - t,
            )
            rows.append(row)
            print(
                f"{p.name:28s} {spec.short():40s} fwd {r.forward_trace.family}/{r.forward_trace.precision} "
                f"bwd {r.backward_trace.family}/{r.backward_trace.precision} out-err {err:.2e} grad-err {gerr:.2e}"
            )
            print("     fwd kernels:", r.forward_trace.kernels[:12])
            print("     bwd kernels:", r.backward_trace.kernels[:12])
    with open(os.path.join(out, "probe.json"), "w") as fh:
        json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
