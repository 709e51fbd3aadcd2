"""A planted device slowdown on the Keras-on-JAX benchmarks, on a GPU, from the repository root:

    source scripts/gpu_env.sh && $PYTHON scripts/gpu_keras_jax_fault.py

For each `keras-jax-cudnn` entry of the committed baseline of this GPU: the CUPTI device time of its executable
(``meters.cupti_device_time``, as the Keras-on-JAX worker takes it), then of the executable followed by extra XLA
matmuls worth 10% and 25% of its GPU time, each put through the gate's device decision against the entry. The
speed suite's planted faults patch torch's layers and never reach the Keras worker: this plants on the JAX side.
Needs JAX with its CUDA plugin, torch (its profiler records the GPU's activities) and Keras 3.
"""

from __future__ import annotations

import glob
import json
import os
import sys
from typing import Any


def main() -> None:
    os.environ["KERAS_BACKEND"] = "jax"
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    sys.modules.setdefault("tensorflow", None)  # type: ignore[arg-type]
    import jax
    import jax.numpy as jnp
    from pytest_lstmperf.speed.regression import Thresholds, pooled_spread

    from pytest_lstmperf import meters
    from pytest_lstmperf import paths as registry
    from pytest_lstmperf.model.case import make_case
    from pytest_lstmperf.paths.keras.runners import LocalKerasRun, case_arrays
    from pytest_lstmperf.speed import gate
    from pytest_lstmperf.speed.runner import run_spec
    from pytest_lstmperf.speed.shapes import set_shapes

    (base_file,) = glob.glob("baselines/NVIDIA_H100*.json")
    with open(base_file) as fh:
        entries = {b["name"]: b for b in json.load(fh)["benchmarks"]}
    pooled, pooled_from = pooled_spread(entries.values())
    knobs = gate.GateKnobs("auto", 1.10, 0.002, False, pooled_spread=pooled, pooled_from=pooled_from)
    path = registry.get("keras-jax-cudnn")
    wait = jax.block_until_ready
    square = jax.device_put(jnp.ones((1024, 1024), jnp.float32), jax.devices("gpu")[0])
    matmul = jax.jit(lambda x: (x @ x) * 1e-3)
    wait(matmul(square))
    matmul_s = meters.cupti_device_time(lambda: matmul(square), wait, 12).median
    print(f"extra matmul: {matmul_s * 1e6:.1f} us of GPU time each")
    for shape in set_shapes("gate", "cuda"):
        for mode in shape.modes:
            name = f"test_{'inference' if mode == 'forward' else 'training'}[keras-jax-cudnn-{shape.spec.short()}]"
            entry = entries.get(name)
            if entry is None:
                continue
            spec = run_spec(path, shape.spec, mode)
            run = LocalKerasRun(spec, path.options["keras"], case_arrays(make_case(spec, 0)), "cuda")
            executable = run._impl._executable("forward" if mode == "forward" else "backward")
            args = run._impl.args

            def call(executable: Any = executable, args: Any = args) -> Any:
                return executable(*args)

            clean = meters.cupti_device_time(call, wait, 12)
            base_s = clean.median
            per_call = gate.per_call_threshold(entry, 1.10, knobs)[0]
            limit = gate.device_limit(entry["extra_info"], 1.10, per_call=per_call)[0]
            row = [
                f"{name}: clean {base_s * 1e3:.3f} ms (entry {entry['extra_info']['device_time_s'] * 1e3:.3f} ms, "
                f"{entry['extra_info']['device_time_method']})"
            ]
            for share in (0.0, 0.10, 0.25):
                extra = round(share * base_s / matmul_s)

                def planted(call: Any = call, extra: int = extra) -> Any:
                    return call(), [matmul(square) for _ in range(extra)]

                got = meters.cupti_device_time(planted, wait, 12) if extra else clean
                decision = gate._device_decision(
                    name, entry["extra_info"], list(got.samples), Thresholds(), {}, per_call=per_call
                )
                row.append(
                    f"+{share:.0%} ({extra} matmuls): {got.median / base_s:.3f}x measured, gate {decision.verdict} "
                    f"at {(decision.ratio or 0):.3f}x (threshold {limit:.3f})"
                )
            print("\n   ".join(row), flush=True)


if __name__ == "__main__":
    main()
