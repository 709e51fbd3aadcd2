"""What one suite example does: run a path on a spec, check the kernel it ran, its numbers, and report.

The suites stay thin: they choose specs (fixed or generated) and call :func:`verify_path` or
:func:`verify_pair`. A failed check raises :class:`PathCheckFailed`, whose message names the path, the
spec, expected vs observed and the numbers; :func:`record_finding` files it for the run's summary.
"""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from .case import make_case
from .checks import Mismatch, check_against, check_finite, check_trace, format_failure
from .reference import run_reference
from .session import Finding, LstmPerfSession
from .spec import LayerSpec


class PathCheckFailed(pytest.fail.Exception):  # type: ignore[name-defined,misc]
    """A path did not do what it claims; carries the finding."""

    def __init__(self, finding: Finding) -> None:
        super().__init__(finding.message, pytrace=False)
        self.finding = finding


def _note(node: pytest.Item | None, key: str, value: str) -> None:
    if node is not None and (key, value) not in node.user_properties:
        node.user_properties.append((key, value))


def _run(path: object, spec: LayerSpec, session: LstmPerfSession):  # noqa: ANN202
    case = make_case(spec, session.seed)
    try:
        return case, path.prepare(case, session.device).run()  # type: ignore[attr-defined]
    except Exception as exc:
        if type(exc).__name__ == "OutOfMemoryError" or "out of memory" in str(exc).lower():
            finding = Finding(
                path.name,  # type: ignore[attr-defined]
                "oom",
                spec.short(),
                f"{path.name} ran out of device memory on {spec.short()} "  # type: ignore[attr-defined]
                f"({spec.param_count} parameters, {spec.flops_forward / 1e9:.2f} GFLOP forward): {exc}",
            )
            raise PathCheckFailed(finding) from None
        raise


def _fail(path_name: str, spec: LayerSpec, seed: int, mismatches: list[Mismatch]) -> PathCheckFailed:
    kinds = sorted({m.check for m in mismatches})
    return PathCheckFailed(Finding(path_name, ",".join(kinds), spec.short(), format_failure(path_name, spec, seed,
                                                                                              mismatches)))


def verify_path(
    path: object, spec: LayerSpec, session: LstmPerfSession, node: pytest.Item | None = None, *, numbers: bool = True
) -> dict[str, float]:
    """Run ``path`` on ``spec``; check kernel and precision of both passes, finiteness, and (``numbers``)
    every tensor against the float64 reference. Returns the relative errors."""
    case, result = _run(path, spec, session)
    expected = path.expected(spec)  # type: ignore[attr-defined]
    mismatches = check_trace(expected, result.forward_trace, "forward")
    traces = [result.forward_trace]
    if spec.training:
        mismatches += check_trace(expected, result.backward_trace, "backward")
        traces.append(result.backward_trace)
    for trace in traces:
        if trace is not None:
            _note(node, "lstmperf_observed", f"{'fwd' if trace.phase == 'forward' else 'bwd'} {trace.family}/{trace.precision}")
    mismatches += check_finite(result, spec)
    errors: dict[str, float] = {}
    if numbers:
        found, errors = check_against(result, run_reference(case), spec, expected[1], kernels=(expected[0], None))
        mismatches += found
    if mismatches:
        raise _fail(path.name, spec, session.seed, mismatches)  # type: ignore[attr-defined]
    return errors


def verify_pair(pair: tuple[object, object], spec: LayerSpec, session: LstmPerfSession,
                node: pytest.Item | None = None) -> dict[str, float]:
    """Two paths of one precision against each other (sharper where both claim the same arithmetic)."""
    first, second = pair
    _, a = _run(first, spec, session)
    _, b = _run(second, spec, session)
    kernel, precision = first.expected(spec)  # type: ignore[attr-defined]
    mismatches = check_finite(a, spec) + check_finite(b, spec)
    found, errors = check_against(
        a, b, spec, precision, pairwise_with=second.name, kernels=(kernel, second.expected(spec)[0])  # type: ignore[attr-defined]
    )
    mismatches += found
    if mismatches:
        raise _fail(f"{first.name}~{second.name}", spec, session.seed, mismatches)  # type: ignore[attr-defined]
    return errors


def record_finding(node: pytest.Item, failure: PathCheckFailed) -> None:
    """File the finding on the test report: the run's summary lists it (also under xdist)."""
    node.user_properties.append(("lstmperf_finding", json.dumps(asdict(failure.finding))))


def representative_spec(path: object, cell: str = "lstm") -> LayerSpec | None:
    """A fixed, modest spec the path supports, for the kernel-claim tests (None if the cell does not apply)."""
    base = LayerSpec(cell=cell, input_size=32, hidden_size=64, num_layers=2, batch=4, seq_len=10,  # type: ignore[arg-type]
                     initial_state=True)
    if getattr(path, "options", {}).get("packed"):
        base = base.replace(length_mode="packed", lengths=(10, 7, 3, 1))
    return base if path.supports(base) is None else None  # type: ignore[attr-defined]
