"""The tolerance model: how far a path may stray from the float64 reference, per kernel family and precision.

Errors are relative L2 norms, ``||a - ref|| / ||ref||``, per tensor (output, h_n, c_n, each gradient).
The bound for a tensor of a problem, run by kernel family ``k`` in precision ``p``, is::

    tol = a[k][p][pass] * u[p] * growth(spec) ** b[k][p][pass]

``u`` is the unit roundoff of the precision's significand (fp32 2^-24, tf32 and fp16 2^-11, bf16 2^-8);
``growth`` is a size measure of the problem: sqrt of the depth (layers x directions) times the log of the
sequence length and of the reduction length (input + state size), normalised to 1 for the smallest problem.
The measured error grows sub-linearly in it (exponents 0.1-0.6), so the exponent ``b`` is fitted per group.

``a`` and ``b`` are fitted from raw samples (``python tools/tolerance_calibration.py --fit`` in the repository, see
:func:`fit_group`): ``b`` is the least-squares slope of ``log(err/u)`` on ``log growth``; ``a`` is
:data:`MARGIN` times the :data:`QUANTILE` quantile of the residual ratio ``err / (u growth^b)``; the
largest sample's ratio to the bound and the bootstrap spread of the quantile are stored with it. A kernel
family with enough samples gets its own constants (cuDNN's fp32 RNN, which errs ~100x more than faithful fp32
kernels, is held to its own, not to TF32's);
other families use the fit over every family of the precision (cuDNN fp32 kept out of that pool). Families
measured before raw samples were stored keep their earlier linear constants (``b = 1``, ``a`` = 4 x the
largest normalised error), labelled ``legacy``.

A bound that reaches :data:`MAX_REL` (0.1 relative error) is refused (:class:`ToleranceTooLoose`): a zero or
garbage tensor errs by ~1, and a check that would pass it is no check. Such specs are not generated for the
path (:mod:`pytest_lstmperf.numerics.path_specs`), and a check handed one fails as inconclusive.

A pass is held to the bound of what it ran (:func:`bound_of_what_ran`): the kernel family and precision its
traces observed, not what the path claims; the suites (:mod:`.equivalence`) and ``verify_model`` both ask it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from ..model.precision import PRECISIONS
from ..model.spec import LayerSpec
from ..observation.claims import satisfies

UNIT_ROUNDOFF = {"fp64": 2.0**-53, "fp32": 2.0**-24, "tf32": 2.0**-11, "fp16": 2.0**-11, "bf16": 2.0**-8}
#: the quantile of the residual ratio a constant is set from, and the margin over it
QUANTILE = 0.999
MARGIN = 2.0
#: errors below this many units of roundoff are exact results (a one-step gradient, a zero bias), which say
#: nothing about the size of rounding errors: they are left out of the fit
EXACT = 1e-3
#: fewest samples, and fewest distinct specs, for a group (kernel family, precision, pass) to get its own fit
MIN_SAMPLES = 40
MIN_SPECS = 20
#: a bound at or above this relative error is refused: a zero tensor (error 1) would nearly pass
MAX_REL = 0.1
#: the smallest bound, in units of roundoff, where every operation rounds at the precision's own u (fp32): a
#: one-element, one-step problem (growth 1) goes through a handful of roundings (two products, the bias adds,
#: sigmoid and tanh of 1-2 ulp each on a GPU, the cell update), and its relative error is one scalar's, so the
#: fit's extrapolation to growth 1 must not fall below this. Seen on the H100: the generic CUDA kernel on
#: lstm-I1-H1-L1-B1-T1 erred 4.1 u where the fit alone gave 3.3 u. (fp16/bf16/tf32 paths accumulate in fp32
#: and round once to their own u, which the fit covers: no floor there.)
MIN_UNITS = {"fp32": 8.0}
PASSES = ("forward", "backward")
DATA_FILE = Path(__file__).with_name("tolerances.json")


class ToleranceTooLoose(ValueError):
    """The bound for a spec would reach :data:`MAX_REL`: the check cannot tell a right tensor from garbage."""


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
    exponent: float = 1.0
    family: str = "*"

    def explain(self) -> str:
        return (
            f"{self.rel:.2e} = a {self.constant:.3g} x u({self.precision}) {UNIT_ROUNDOFF[self.precision]:.2e} "
            f"x growth^{self.exponent:.2f} ({self.basis})"
        )


@lru_cache(maxsize=1)
def _data() -> dict[str, Any]:
    with open(DATA_FILE, encoding="utf-8") as handle:
        data: dict[str, Any] = json.load(handle)
    return data


def fitted(precision: str, pass_: str, family: str | None = None) -> tuple[str, dict[str, Any]]:
    """(family the constants belong to, or "*" for the precision-wide fit; the fit entry)."""
    data = _data()
    entry = data.get("by_kernel", {}).get(family or "", {}).get(precision, {}).get(pass_)
    if entry is not None:
        return str(family), entry
    entry = data.get("by_precision", {}).get(precision, {}).get(pass_)
    if entry is None:
        raise LookupError(
            f"no measured tolerance for {precision} {pass_}: run the repository's `python "
            f"tools/tolerance_calibration.py` on a device that has a {precision} path, then `--fit`, and commit "
            "the updated tolerances.json"
        )
    return "*", entry


def tolerance(precision: str, pass_: str, spec: LayerSpec, family: str | None = None) -> Tolerance:
    """The bound of one tensor of ``spec`` for a pass run by ``family`` in ``precision``.

    Raises :class:`ToleranceTooLoose` when the bound reaches :data:`MAX_REL`."""
    if precision not in UNIT_ROUNDOFF:
        raise ValueError(f"unknown precision {precision!r} (valid: {', '.join(UNIT_ROUNDOFF)})")
    if pass_ not in PASSES:
        raise ValueError(f"unknown pass {pass_!r} (valid: {', '.join(PASSES)})")
    tol = tolerance_at(precision, pass_, growth(spec), family)
    if tol.rel >= MAX_REL:
        raise ToleranceTooLoose(
            f"the {tol.family}/{precision} {pass_} bound for {spec.short()} would be {tol.rel:.3g} relative error "
            f"(>= {MAX_REL}: a zero tensor would nearly pass); tolerance {tol.explain()}"
        )
    return tol


def tolerance_at(precision: str, pass_: str, g: float, family: str | None = None) -> Tolerance:
    """The bound at growth ``g``, without the :data:`MAX_REL` refusal (for tables and the fit's report)."""
    owner, entry = fitted(precision, pass_, family)
    a, b = float(entry["a"]), float(entry["b"])
    fit = a * UNIT_ROUNDOFF[precision] * g**b
    floor = MIN_UNITS.get(precision, 0.0) * UNIT_ROUNDOFF[precision]
    basis = f"growth {g:.2f}; {owner}/{precision}: {entry['basis']}"
    if fit < floor:
        basis += f"; raised to the floor of {MIN_UNITS[precision]:g} u (the fit gives {fit:.2e} here)"
    return Tolerance(precision, pass_, max(fit, floor), a, basis, b, owner)


def bound_precision(claimed: str, observed: str) -> str:
    """The precision whose bound a pass is held to: the one it was observed to run in (autocast that ran
    fp16 where bf16 was claimed is held to fp16); an observation that satisfies the claim (fp32 kernels
    where TF32 is allowed) or that the trace could not tell (``unknown``) keeps the claimed precision."""
    if satisfies(claimed, observed) or observed not in PRECISIONS:
        return claimed
    return observed


def bound_of_what_ran(
    claimed: tuple[str, str], ran: Iterable[tuple[str, str]], pass_: str, spec: LayerSpec
) -> Tolerance:
    """The bound of what ran: the tolerance of ``pass_`` for each (kernel family, precision) it was observed to
    run (``ran``), at the precision it is held to (:func:`bound_precision` against the ``claimed`` precision);
    the loosest of them where they differ (a model errs no less than its least precise layer); the claim's
    (family, precision) where nothing was observed. Raises :class:`ToleranceTooLoose` as :func:`tolerance` does."""
    held = {(family, bound_precision(claimed[1], precision)) for family, precision in ran}
    bounds = [tolerance(precision, pass_, spec, family) for family, precision in sorted(held or {claimed})]
    return max(bounds, key=lambda b: b.rel)


def pairwise_tolerance(precision: str, pass_: str, spec: LayerSpec, family: str | None = None) -> Tolerance:
    """Two paths of one precision, each within ``tol`` of the truth, differ by at most ``2 tol``."""
    single = tolerance(precision, pass_, spec, family)
    return Tolerance(
        precision, pass_, 2 * single.rel, 2 * single.constant, "sum of both paths' bounds; " + single.basis,
        single.exponent, single.family,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------------- the fit
def fit_group(
    growths: Sequence[float], normalised_u: Sequence[float], *, seed: int = 0, boots: int = 200
) -> dict[str, float]:
    """Fit ``err/u ~ a growth^b`` to one group's samples (``normalised_u`` = err / u).

    ``b``: least-squares slope of log(err/u) on log(growth), clamped to [0, 1]; exact results (below
    :data:`EXACT` u) are left out. ``a``: :data:`MARGIN` x the :data:`QUANTILE` empirical quantile of the
    residual ratios ``err / (u growth^b)``. Returns ``a``, ``b``, the quantile, the largest residual ratio,
    how many samples exceed the quantile and the bound, and the bootstrap 5-95% range of the quantile (its
    stability: how much the constant would move with another draw of as many samples)."""
    g = np.asarray(growths, dtype=float)
    r = np.asarray(normalised_u, dtype=float)
    exact = r < EXACT
    g, r = g[~exact], r[~exact]
    b = _slope(g, r)
    q = float(np.quantile(r / g**b, QUANTILE))
    rng = np.random.default_rng(seed)
    boot = []
    for _ in range(boots):
        pick = rng.integers(0, g.size, g.size)
        bb = _slope(g[pick], r[pick])
        boot.append(float(np.quantile(r[pick] / g[pick] ** bb, QUANTILE)))
    ratio = r / g**b
    a = MARGIN * q
    return {
        "a": a,
        "b": b,
        "n": int(g.size),
        "exact": int(exact.sum()),
        "quantile": q,
        "max_ratio": float(ratio.max()),
        "over_quantile": int((ratio > q).sum()),
        "over_bound": int((ratio > a).sum()),
        "boot_p5": float(np.quantile(boot, 0.05)),
        "boot_p95": float(np.quantile(boot, 0.95)),
    }


def _slope(g: np.ndarray, r: np.ndarray) -> float:
    x = np.log(g)
    if np.ptp(x) < 1e-9:
        return 1.0
    slope = float(np.polyfit(x, np.log(r), 1)[0])
    return min(max(slope, 0.0), 1.0)
