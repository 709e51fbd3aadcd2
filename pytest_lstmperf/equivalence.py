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
from .tolerance import pairwise_tolerance, tolerance


class PathCheckFailed(pytest.fail.Exception):  # type: ignore[name-defined,misc]
    """A path did not do what it claims; carries the finding."""

    def __init__(self, finding: Finding) -> None:
        super().__init__(finding.message, pytrace=False)
        self.finding = finding


def _note(node: pytest.Item | None, key: str, value: str) -> None:
    if node is not None and (key, value) not in node.user_properties:
        node.user_properties.append((key, value))


def _run(path: object, spec: LayerSpec, session: LstmPerfSession):
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
    return PathCheckFailed(
        Finding(path_name, ",".join(kinds), spec.short(), format_failure(path_name, spec, seed, mismatches))
    )


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
            _note(
                node,
                "lstmperf_observed",
                f"{'fwd' if trace.phase == 'forward' else 'bwd'} {trace.family}/{trace.precision}",
            )
    _known_finding(path, spec, mismatches, traces, node)
    mismatches += check_finite(result, spec)
    errors: dict[str, float] = {}
    if numbers:
        found, errors = check_against(result, run_reference(case), spec, expected[1])
        if not mismatches:
            _known_numeric_finding(path, spec, found, errors, node)
        mismatches += found
    if mismatches:
        raise _fail(path.name, spec, session.seed, mismatches)  # type: ignore[attr-defined]
    return errors


def _known_finding(path: object, spec: LayerSpec, mismatches: list[Mismatch], traces: list, node) -> None:
    """A documented upstream behaviour (``ExecutionPath.options["known_findings"]``) turns the run into an
    xfail that names it; it is still listed among the run's findings. Anything else stays a failure."""
    known = getattr(path, "options", {}).get("known_findings") or {}
    if not mismatches or not known:
        return
    explanations = []
    for mismatch in mismatches:
        trace = next((t for t in traces if t is not None and t.phase == mismatch.quantity), None)
        observed = None if trace is None else (trace.family if mismatch.check == "kernel" else trace.precision)
        why = known.get((mismatch.check, observed))
        if why is None:
            return
        explanations.append(why)
    message = f"known finding on {path.name} ({spec.short()}): {explanations[0]}"  # type: ignore[attr-defined]
    if node is not None:
        finding = Finding(path.name, "known", spec.short(), message)  # type: ignore[attr-defined]
        node.user_properties.append(("lstmperf_finding", json.dumps(asdict(finding))))
    pytest.xfail(message)


def _known_numeric_finding(
    path: object, spec: LayerSpec, found: list[Mismatch], errors: dict[str, float], node, *, pairwise: bool = False
) -> None:
    """``known_findings[("tolerance", P)]``: errors beyond the path's own precision but within precision P's
    bound are a documented finding (xfail, listed); an error beyond P's bound still fails."""
    known = getattr(path, "options", {}).get("known_findings") or {}
    entries = [(p, why) for (check, p), why in known.items() if check == "tolerance"]
    if not found or not entries or any(m.check not in ("tolerance", "pairwise") for m in found):
        return
    looser, why = entries[0]
    bound = pairwise_tolerance if pairwise else tolerance
    for mismatch in found:
        pass_ = "backward" if mismatch.quantity.startswith("grad ") else "forward"
        err = errors.get(mismatch.quantity)
        if err is None or not err <= bound(looser, pass_, spec).rel:
            return
    worst = max(found, key=lambda m: errors[m.quantity])
    message = (
        f"known finding on {path.name} ({spec.short()}): {why} [here {worst.quantity} "  # type: ignore[attr-defined]
        f"{errors[worst.quantity]:.2e}, within the {looser} bound]"
    )
    if node is not None:
        finding = Finding(path.name, "known", spec.short(), message)  # type: ignore[attr-defined]
        node.user_properties.append(("lstmperf_finding", json.dumps(asdict(finding))))
    pytest.xfail(message)


def verify_pair(
    pair: tuple[object, object], spec: LayerSpec, session: LstmPerfSession, node: pytest.Item | None = None
) -> dict[str, float]:
    """Two paths of one precision against each other (sharper where both claim the same arithmetic)."""
    first, second = pair
    _, a = _run(first, spec, session)
    _, b = _run(second, spec, session)
    precision = first.expected(spec)[1]  # type: ignore[attr-defined]
    mismatches = check_finite(a, spec) + check_finite(b, spec)
    found, errors = check_against(a, b, spec, precision, pairwise_with=second.name)  # type: ignore[attr-defined]
    if not mismatches:
        _known_numeric_finding(first, spec, found, errors, node, pairwise=True)
    mismatches += found
    if mismatches:
        raise _fail(f"{first.name}~{second.name}", spec, session.seed, mismatches)  # type: ignore[attr-defined]
    return errors


def record_finding(node: pytest.Item, failure: PathCheckFailed) -> None:
    """File the finding on the test report: the run's summary lists it (also under xdist)."""
    node.user_properties.append(("lstmperf_finding", json.dumps(asdict(failure.finding))))


def representative_spec(path: object, cell: str = "lstm") -> LayerSpec | None:
    """A fixed, modest spec the path supports, for the kernel-claim tests (None if the cell does not apply)."""
    base = LayerSpec(
        cell=cell,
        input_size=32,
        hidden_size=64,
        num_layers=2,
        batch=4,
        seq_len=10,  # type: ignore[arg-type]
        initial_state=True,
    )
    for candidate in (base, base.replace(length_mode="packed", lengths=(10, 7, 3, 1))):
        if path.supports(candidate) is None:  # type: ignore[attr-defined]
            return candidate
    return None
