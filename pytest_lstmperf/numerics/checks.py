"""The checks the suites make, as pure functions over results: kernel, precision, finiteness, tolerance.

Each returns a list of :class:`Mismatch` (empty when the path did what it claims); the suites turn a
non-empty list into a test failure whose message names the path, the spec, expected vs observed, and the
numbers. Nothing here runs a framework.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..model.spec import LayerSpec
from ..observation.claims import KnownFinding, differences, explain_trace
from ..observation.torch_trace import ops_that_matter
from .tolerance import Tolerance, ToleranceTooLoose, pairwise_tolerance, tolerance


@dataclass(frozen=True)
class Mismatch:
    check: str  # "kernel", "precision", "nan", "tolerance", "pairwise", "missing", "inconclusive"
    quantity: str  # "forward", "backward", "output", "grad weight_hh_l0", ...
    message: str


def relative_error(value: np.ndarray, reference: np.ndarray) -> float:
    """``||value - reference|| / ||reference||``; the absolute norm when the reference is zero."""
    value = np.asarray(value, dtype=np.float64)
    reference = np.asarray(reference, dtype=np.float64)
    if value.shape != reference.shape:
        raise ValueError(f"shape {value.shape} vs reference {reference.shape}")
    diff = float(np.linalg.norm((value - reference).ravel()))
    norm = float(np.linalg.norm(reference.ravel()))
    return diff / norm if norm > 0 else diff


def check_trace(expected: tuple[str, str], trace: object | None, pass_: str) -> list[Mismatch]:
    """The observed kernel family and precision of one pass against the path's claim for the spec (what departs
    from it: :func:`pytest_lstmperf.observation.claims.differences`)."""
    if trace is None:
        return [Mismatch("kernel", pass_, f"no {pass_} trace was recorded")]
    found: list[Mismatch] = []
    expected_family, expected_precision = expected
    kernels = ", ".join(k[:90] for k in trace.kernels[:8]) or "-"  # type: ignore[attr-defined]
    ops = ", ".join(ops_that_matter(trace.ops)[:12]) or "-"  # type: ignore[attr-defined]
    departs = dict(differences(expected, (trace.family, trace.precision)))  # type: ignore[attr-defined]
    if "kernel" in departs:
        found.append(
            Mismatch(
                "kernel",
                pass_,
                f"{pass_}: expected kernel family {expected_family!r}, observed {trace.family!r} "  # type: ignore[attr-defined]
                f"(ops seen: {ops}; GPU kernels seen: {kernels})",
            )
        )
    if "precision" in departs:
        found.append(
            Mismatch(
                "precision",
                pass_,
                f"{pass_}: expected precision {expected_precision!r}, observed {trace.precision!r} "  # type: ignore[attr-defined]
                f"(element types entering the recurrent op: {', '.join(trace.dtypes) or '-'}; "  # type: ignore[attr-defined]
                f"GPU kernels seen: {kernels})",
            )
        )
    return found


def judge_trace(
    path: Any, expected: tuple[str, str], trace: Any, pass_: str
) -> tuple[list[Mismatch], list[KnownFinding]]:
    """One pass's trace against the claim ``expected``, with the known findings applied: the one decision the
    suites (:mod:`.equivalence`) and ``verify_model`` make. ``([], findings)`` where known findings of ``path``
    explain every difference (:func:`pytest_lstmperf.observation.claims.explain_trace`); ``(mismatches, [])``
    otherwise (:func:`check_trace`; ``([], [])`` where the trace meets the claim, and a missing trace is a
    mismatch, never explained)."""
    found = check_trace(expected, trace, pass_)
    explained = explain_trace(path, expected, trace) if found and trace is not None else None
    return ([], explained) if explained else (found, [])


def _quantities(result: object, spec: LayerSpec) -> Iterable[tuple[str, str, np.ndarray | None]]:
    yield "forward", "output", result.output  # type: ignore[attr-defined]
    yield "forward", "h_n", result.h_n  # type: ignore[attr-defined]
    if spec.cell == "lstm":
        yield "forward", "c_n", result.c_n  # type: ignore[attr-defined]
    for name, grad in result.grads.items():  # type: ignore[attr-defined]
        yield "backward", f"grad {name}", grad


def check_finite(result: object, spec: LayerSpec) -> list[Mismatch]:
    found = []
    for _, quantity, value in _quantities(result, spec):
        if value is None:
            continue
        bad = ~np.isfinite(value)
        if bad.any():
            found.append(
                Mismatch("nan", quantity, f"{quantity}: {int(bad.sum())} of {value.size} values are NaN or Inf")
            )
    return found


def check_against(
    result: object,
    reference: object,
    spec: LayerSpec,
    precision: str,
    *,
    pairwise_with: str | None = None,
    family: str | None = None,
    bound: Callable[[str], Tolerance] | None = None,
) -> tuple[list[Mismatch], dict[str, float]]:
    """Every tensor of ``result`` against ``reference`` (the float64 reference, or another path).

    The bound of a pass is ``bound(pass_)`` when given, else the ``family``/``precision`` tolerance (doubled
    for a pair). A bound that would pass garbage (:class:`ToleranceTooLoose`) is an ``inconclusive``
    mismatch: a failure, never a pass. Returns the mismatches and the relative error of every tensor compared.
    """
    if bound is None:
        single = pairwise_tolerance if pairwise_with else tolerance
        bound = lambda pass_: single(precision, pass_, spec, family)  # noqa: E731
    found: list[Mismatch] = []
    errors: dict[str, float] = {}
    ref_values = {q: v for _, q, v in _quantities(reference, spec)}
    compared_grads = spec.training and bool(result.grads)  # type: ignore[attr-defined]
    if spec.training and not result.grads:  # type: ignore[attr-defined]
        found.append(Mismatch("missing", "backward", "training spec but the path returned no gradients"))
    bounds: dict[str, Tolerance | ToleranceTooLoose] = {}
    for pass_, quantity, value in _quantities(result, spec):
        ref = ref_values.get(quantity)
        if value is None or ref is None:
            if (pass_ == "forward" or compared_grads) and value is None and ref is not None:
                found.append(Mismatch("missing", quantity, f"{quantity}: the path returned none"))
            continue
        if value.shape != ref.shape:
            found.append(Mismatch("tolerance", quantity, f"{quantity}: shape {value.shape} vs {ref.shape}"))
            continue
        err = relative_error(value, ref)
        errors[quantity] = err
        if pass_ not in bounds:
            try:
                bounds[pass_] = bound(pass_)
            except ToleranceTooLoose as exc:
                bounds[pass_] = exc
                found.append(Mismatch("inconclusive", pass_, f"{pass_}: no check possible: {exc}"))
        tol = bounds[pass_]
        if isinstance(tol, ToleranceTooLoose):
            continue
        if not np.isfinite(err) or err > tol.rel:
            against = f"path {pairwise_with}" if pairwise_with else "the float64 reference"
            worst = np.unravel_index(int(np.argmax(np.abs(value - ref))), value.shape) if value.size else ()
            found.append(
                Mismatch(
                    "pairwise" if pairwise_with else "tolerance",
                    quantity,
                    f"{quantity}: relative error {err:.3e} against {against} exceeds the {tol.family}/{tol.precision} "
                    f"{pass_} tolerance {tol.rel:.3e} ({err / tol.rel:.1f}x; tolerance {tol.explain()}); "
                    f"largest difference at index {tuple(int(i) for i in worst)}: "
                    f"{value[worst]:.6g} vs {ref[worst]:.6g}",
                )
            )
    if compared_grads:
        missing = sorted(set(k for k in ref_values if k.startswith("grad ")) - {f"grad {k}" for k in result.grads})  # type: ignore[attr-defined]
        for quantity in missing:
            found.append(Mismatch("missing", quantity, f"{quantity}: the path returned no such gradient"))
    return found, errors


def format_failure(path_name: str, spec: LayerSpec, seed: int, mismatches: list[Mismatch]) -> str:
    lines = [f"path {path_name} on {spec.short()} (seed {seed}): {len(mismatches)} check(s) failed"]
    lines += [f"  [{m.check}] {m.message}" for m in mismatches]
    lines.append(f"  spec: {spec.to_dict()}")
    return "\n".join(lines)
