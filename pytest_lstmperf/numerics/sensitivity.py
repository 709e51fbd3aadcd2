"""How sensitive a user's model is on its own data, against the data the tolerance model was measured on.

The tolerances (:mod:`pytest_lstmperf.numerics.tolerance`) were fitted on the plugin's canonical data: PyTorch's
default weight range and N(0, 1) inputs. A user's model can be worse conditioned: the word-language model of
pytorch/examples feeds its LSTM embeddings drawn from U(-0.1, 0.1), so its states are small against the sums
that produce them, and a correct cuDNN fp32 run of it on the H100 showed relative errors of its final states
4.6x the fp32 bound (the bound is sharp for the canonical data).

The measure here is first-order: perturb every parameter and every floating-point input by a random relative
amount of one fp32 unit roundoff, run the float64 computation again, and take the relative change of each
output and gradient per unit of perturbation (the quantity's *sensitivity*, a condition-number estimate; the
larger of two draws). The same is measured on the canonical data of the model's envelope spec. A quantity of
the user's model is then held to ``bound x max(1, its sensitivity / the canonical sensitivity of its pass)``,
and the report says by how much a bound was widened and why. A bound widened to
:data:`~pytest_lstmperf.numerics.tolerance.MAX_REL` or more is still refused (the check is then inconclusive,
never a pass).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import numpy as np

from ..model.case import make_case
from ..model.reference import run_reference
from ..model.spec import LayerSpec
from .checks import relative_error

#: the relative size of the perturbation: one fp32 unit roundoff (2**-24)
DELTA = 2.0**-24
DRAWS = 2


@dataclass(frozen=True)
class Sensitivity:
    """Per quantity (``output 0``, ``grad weight_ih_l0``...) of the user's model: relative change per unit of
    relative perturbation; per pass (``forward``, ``backward``) the same on the canonical data."""

    model: Mapping[str, float]
    canonical: Mapping[str, float]

    def factor(self, quantity: str, pass_: str) -> float:
        """How much wider than the canonical bound ``quantity`` is held (at least 1)."""
        mine, base = self.model.get(quantity), self.canonical.get(pass_)
        if not mine or not base or not np.isfinite(mine) or base <= 0:
            return 1.0
        return max(1.0, mine / base)

    def explain(self, quantity: str, pass_: str) -> str:
        factor = self.factor(quantity, pass_)
        return (
            f"bound widened {factor:.1f}x for this model's conditioning: under a relative perturbation of one "
            f"fp32 unit roundoff of its weights and inputs, {quantity} moves {self.model.get(quantity, 0):.2g}x "
            f"the perturbation, the canonical data's {pass_} {self.canonical.get(pass_, 0):.2g}x"
        )


def perturb(array: np.ndarray, rng: np.random.Generator, delta: float = DELTA) -> np.ndarray:
    """``array * (1 + delta * s)`` with random signs ``s`` (float64)."""
    array = np.asarray(array, dtype=np.float64)
    return np.asarray(array * (1.0 + delta * rng.choice((-1.0, 1.0), size=array.shape)))


def relative_changes(
    base: Mapping[str, np.ndarray], run: Callable[[np.random.Generator], Mapping[str, np.ndarray]]
) -> dict[str, float]:
    """Per quantity, the largest relative change over :data:`DRAWS` perturbed runs, per unit of perturbation."""
    out: dict[str, float] = {}
    for draw in range(DRAWS):
        moved = run(np.random.default_rng([0x5E45, draw]))
        for name, reference in base.items():
            if name in moved and np.asarray(reference).size:
                change = relative_error(moved[name], reference) / DELTA
                out[name] = max(out.get(name, 0.0), change)
    return out


def canonical(spec: LayerSpec, seed: int = 0) -> dict[str, float]:
    """Per pass, the largest sensitivity of the canonical data of ``spec`` (float64 reference)."""
    case = make_case(spec, seed)
    ref = _quantities(run_reference(case))

    def perturbed(rng: np.random.Generator) -> dict[str, np.ndarray]:
        weights = {name: perturb(w, rng) for name, w in case.weights.items()}
        h0 = None if case.h0 is None else perturb(case.h0, rng)
        c0 = None if case.c0 is None else perturb(case.c0, rng)
        moved = replace(case, weights=weights, x=perturb(case.x, rng), h0=h0, c0=c0)
        return _quantities(run_reference(moved))

    changes = relative_changes(ref, perturbed)
    forward = [v for k, v in changes.items() if not k.startswith("grad ")]
    backward = [v for k, v in changes.items() if k.startswith("grad ")]
    return {"forward": max(forward, default=0.0), "backward": max(backward, default=0.0)}


def _quantities(result: object) -> dict[str, np.ndarray]:
    out = {"output": result.output, "h_n": result.h_n}  # type: ignore[attr-defined]
    if getattr(result, "c_n", None) is not None:
        out["c_n"] = result.c_n  # type: ignore[attr-defined]
    out.update({f"grad {k}": v for k, v in result.grads.items()})  # type: ignore[attr-defined]
    return out
