"""The tolerance model: how far a path of a given precision may stray from the float64 reference.

Errors are relative L2 norms, ``||a - ref|| / ||ref||``, per tensor (output, h_n, c_n, each gradient).
The bound for a tensor of a problem is::

    tol = C[precision][pass] * u[precision] * growth(spec)

``u`` is the unit roundoff of the precision's significand (fp32 2^-24, tf32 and fp16 2^-11, bf16 2^-8);
``growth`` is how the error grows with the problem: sqrt of the depth (layers x directions) times the log
of the sequence length and of the reduction length (input + state size), normalised to 1 for the smallest
problem. The measured errors grow far slower than the sqrt(T * K) of a worst-case random walk (recurrent
LSTM/GRU dynamics are contractive), which is why the model is logarithmic.

``C`` is per precision, over the kernel families whose arithmetic is faithful to it; a family that errs far
beyond the others of its precision is measured and documented but kept out (``excluded`` in
tolerances.json: cuDNN's fp32 RNN), so that its error is reported as a finding instead of loosening the bound
of every path. ``C`` is measured, not guessed: ``python -m pytest_lstmperf.measure`` runs every path over generated
shapes on a device, records ``err / (u * growth)`` per tensor, and the constants below are the largest
normalised error seen over all paths of a precision, times :data:`SAFETY`. The measurements and their
distributions are in ``docs/tolerances.md``; ``tolerances.json`` holds the numbers with their provenance.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .spec import LayerSpec

UNIT_ROUNDOFF = {"fp64": 2.0**-53, "fp32": 2.0**-24, "tf32": 2.0**-11, "fp16": 2.0**-11, "bf16": 2.0**-8}
#: margin over the largest normalised error measured for a precision
SAFETY = 4.0
PASSES = ("forward", "backward")
DATA_FILE = Path(__file__).with_name("tolerances.json")


def growth(spec: LayerSpec) -> float:
    """How the expected error grows with the problem (1.0 for a one-step, one-layer, tiny layer)."""
    reduction = max(spec.layer_input_size(layer) for layer in range(spec.num_layers)) + spec.state_size
    depth = spec.num_layers * spec.directions
    return math.sqrt(depth * math.log2(1 + spec.seq_len) * math.log2(1 + reduction) / math.log2(3))


@dataclass(frozen=True)
class Tolerance:
    precision: str
    pass_: str
    rel: float
    constant: float
    basis: str

    def explain(self) -> str:
        return (
            f"{self.rel:.2e} = C {self.constant:.3g} x u({self.precision}) {UNIT_ROUNDOFF[self.precision]:.2e} "
            f"x growth ({self.basis})"
        )


@lru_cache(maxsize=1)
def _data() -> dict:
    with open(DATA_FILE, encoding="utf-8") as handle:
        return json.load(handle)


def measured_constants() -> dict[str, dict[str, dict[str, object]]]:
    """``{precision: {pass: {"max_normalised": x, "samples": n, "source": "..."}}}`` from tolerances.json."""
    return _data()["constants"]


def excluded() -> dict[str, str]:
    """Kernel families measured but kept out of their precision's bound (``"cudnn/fp32"``), with why."""
    return dict(_data().get("excluded", {}))


def tolerance(precision: str, pass_: str, spec: LayerSpec) -> Tolerance:
    if precision not in UNIT_ROUNDOFF:
        raise ValueError(f"unknown precision {precision!r} (valid: {', '.join(UNIT_ROUNDOFF)})")
    if pass_ not in PASSES:
        raise ValueError(f"unknown pass {pass_!r} (valid: {', '.join(PASSES)})")
    constants = measured_constants()
    if precision not in constants or pass_ not in constants[precision]:
        raise LookupError(
            f"no measured tolerance for {precision} {pass_}: run `python -m pytest_lstmperf.measure` on a "
            f"device that has a {precision} path and commit the updated tolerances.json"
        )
    entry = constants[precision][pass_]
    constant = float(entry["max_normalised"]) * SAFETY  # type: ignore[arg-type]
    g = growth(spec)
    return Tolerance(
        precision,
        pass_,
        constant * UNIT_ROUNDOFF[precision] * g,
        constant,
        f"growth {g:.2f}; C = {SAFETY:g} x max measured {float(entry['max_normalised']):.3g} "  # type: ignore[arg-type]
        f"over {entry['samples']} tensors, {entry['source']}",
    )


def pairwise_tolerance(precision: str, pass_: str, spec: LayerSpec) -> Tolerance:
    """Two paths of one precision, each within ``tol`` of the truth, differ by at most ``2 tol``."""
    single = tolerance(precision, pass_, spec)
    return Tolerance(
        precision, pass_, 2 * single.rel, 2 * single.constant, "sum of both paths' bounds; " + single.basis
    )
