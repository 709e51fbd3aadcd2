"""What one suite example does: run a path on a spec, check the kernel it ran, its numbers, and report.

The suites stay thin: they choose specs (fixed or generated) and call :func:`verify_path` or
:func:`verify_pair`, through :func:`run_examples` for generated specs. A failed check raises
:class:`PathCheckFailed`, whose message names the path, the spec, expected vs observed and the numbers;
:func:`record_finding` files it for the run's summary.

Known findings (:mod:`pytest_lstmperf.observation.claims`) change only what a path is *expected* to run. Every
path's outputs and gradients are always checked for NaN/Inf and against the bound of the kernel family and
precision its trace *observed*; a NaN or an out-of-bound error is a failure whatever is documented. A path
whose only departure from its claim is a documented finding, and whose numbers passed on every example, ends
as an xfail naming the finding ("numbers checked ... and passed"), listed among the run's findings; a
documented finding that did not show in a run is listed too ("not observed ...; remove it").
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pytest

from ..device import DeviceInfo
from ..model.case import Case, make_case
from ..model.reference import run_reference
from ..model.spec import Cell, LayerSpec
from ..observation.claims import Finding, KnownFinding, current_versions, findings_for, known_error, lookup
from .checks import Mismatch, check_against, check_finite, format_failure, judge_trace
from .tolerance import Tolerance, bound_of_what_ran, pairwise_tolerance

if TYPE_CHECKING:
    import hypothesis
    from hypothesis.strategies import SearchStrategy


class RunSettings(Protocol):
    """What a check reads of the run (the plugin's session): the seed its inputs are drawn with, and the device."""

    @property
    def seed(self) -> int: ...
    @property
    def device(self) -> DeviceInfo: ...


#: checks whose failure is decided at once: no shrinking, no further examples (a NaN, a wrong kernel or
#: precision, a missing tensor, no memory, a bound that cannot check); an out-of-bound error may shrink
FATAL = frozenset({"nan", "kernel", "precision", "missing", "oom", "inconclusive"})
#: path runs allowed for shrinking an out-of-bound failure before the smallest failing spec so far is reported
SHRINK_RUNS = 20


# pytest.fail.Exception is an attribute set on a function: the type checker sees no class there
class PathCheckFailed(pytest.fail.Exception):  # type: ignore[name-defined,misc]
    """A path did not do what it claims; carries the finding."""

    def __init__(self, finding: Finding, fatal: bool = False) -> None:
        super().__init__(finding.message, pytrace=False)
        self.finding = finding
        self.fatal = fatal


@dataclass
class KnownTally:
    """The known findings one test confirmed (path, finding -> examples), and the examples it checked."""

    confirmed: dict[KnownFinding, list[str]] = field(default_factory=dict)
    examples: int = 0


_KNOWN = pytest.StashKey[KnownTally]()


def _tally(node: pytest.Item | None) -> KnownTally:
    if node is None:
        return KnownTally()
    return node.stash.setdefault(_KNOWN, KnownTally())


def _note(node: pytest.Item | None, key: str, value: str) -> None:
    if node is not None and (key, value) not in node.user_properties:
        node.user_properties.append((key, value))


def run_path(path: Any, case: Any, device: Any, node: pytest.Item | None = None) -> Any:
    """``path.prepare(case, device).run()``; an error a ``"raises"`` known finding documents is recorded as
    confirmed on ``node`` and gives None (nothing ran to check); any other error propagates."""
    try:
        result = path.prepare(case, device).run()
    except Exception as exc:
        known = known_error(path, exc)
        if known is None:
            raise
        _tally(node).confirmed.setdefault(known, []).append(case.spec.short())
        return None
    _tally(node).examples += 1
    return result


def _run(path: Any, spec: LayerSpec, session: RunSettings, node: pytest.Item | None = None) -> tuple[Case, Any]:
    """(case, result) of ``path`` on ``spec``; where a training step fails as a ``"raises"`` known finding
    documents, the forward pass alone is run and returned (its case an inference case), so that what does run
    is still checked; None as the result only where nothing ran."""
    case = make_case(spec, session.seed)
    try:
        result = run_path(path, case, session.device, node)
        if result is None and spec.training:
            case = make_case(dataclasses.replace(spec, training=False), session.seed)
            result = run_path(path, case, session.device, node)
            if result is not None:
                _note(node, "lstmperf_forward_only", spec.short())
        return case, result
    except Exception as exc:
        if type(exc).__name__ == "OutOfMemoryError" or "out of memory" in str(exc).lower():
            finding = Finding(
                path.name,
                "oom",
                spec.short(),
                f"{path.name} ran out of device memory on {spec.short()} "
                f"({spec.param_count} parameters, {spec.flops_forward / 1e9:.2f} GFLOP forward): {exc}",
            )
            raise PathCheckFailed(finding, fatal=True) from None
        raise


def _fail(path_name: str, spec: LayerSpec, seed: int, mismatches: list[Mismatch]) -> PathCheckFailed:
    kinds = sorted({m.check for m in mismatches})
    return PathCheckFailed(
        Finding(path_name, ",".join(kinds), spec.short(), format_failure(path_name, spec, seed, mismatches)),
        fatal=bool(FATAL.intersection(kinds)),
    )


def _trace_checks(path: Any, spec: LayerSpec, result: Any, node: pytest.Item | None) -> list[Mismatch]:
    """Kernel and precision of each pass against the claim (:func:`pytest_lstmperf.numerics.checks.judge_trace`);
    a difference known findings document is recorded as confirmed (expected), any other is a mismatch."""
    expected = path.expected(spec)
    traces = [("forward", result.forward_trace)] + ([("backward", result.backward_trace)] if spec.training else [])
    mismatches: list[Mismatch] = []
    for pass_, trace in traces:
        if trace is not None:
            _note(
                node, "lstmperf_observed", f"{'fwd' if pass_ == 'forward' else 'bwd'} {trace.family}/{trace.precision}"
            )
        found, known = judge_trace(path, expected, trace, pass_)
        for finding in known:
            _tally(node).confirmed.setdefault(finding, []).append(spec.short())
        mismatches += found
    return mismatches


def observed_tolerance(path: Any, spec: LayerSpec, result: Any) -> Callable[[str], Tolerance]:
    """pass -> the bound of the kernel family and precision that pass was observed to run
    (:func:`pytest_lstmperf.numerics.tolerance.bound_of_what_ran`; the claim's where the pass has no trace)."""
    expected = path.expected(spec)

    def bound(pass_: str) -> Tolerance:
        trace = result.forward_trace if pass_ == "forward" else result.backward_trace
        return bound_of_what_ran(expected, [] if trace is None else [(trace.family, trace.precision)], pass_, spec)

    return bound


def verify_path(
    path: Any, spec: LayerSpec, session: RunSettings, node: pytest.Item | None = None, *, numbers: bool = True
) -> dict[str, float]:
    """Run ``path`` on ``spec``; check kernel and precision of both passes, finiteness, and (``numbers``)
    every tensor against the float64 reference under the bound of what ran. Returns the relative errors."""
    case, result = _run(path, spec, session, node)
    if result is None:
        return {}
    spec = case.spec  # the forward-only case where a documented training failure left only the forward pass
    mismatches = _trace_checks(path, spec, result, node)
    mismatches += check_finite(result, spec)
    errors: dict[str, float] = {}
    if numbers:
        found, errors = _numbers(path, case, result, node)
        mismatches += found
    if mismatches:
        raise _fail(path.name, spec, session.seed, mismatches)
    return errors


def _numbers(path: Any, case: Any, result: Any, node: pytest.Item | None) -> tuple[list[Mismatch], dict[str, float]]:
    """Every tensor against the float64 reference under the bound of what ran. Where an ``"order"`` known
    finding documents time-reversed outputs and the numbers fail as they are, they are checked again, all of
    them, in the documented order; passing there confirms the finding, failing there is the first failure."""
    spec, bound = case.spec, observed_tolerance(path, case.spec, result)
    found, errors = check_against(result, run_reference(case), spec, path.expected(spec)[1], bound=bound)
    known = lookup(path, "order", "time-reversed")
    if not found or known is None or any(m.check != "tolerance" for m in found):
        return found, errors
    reversed_result = dataclasses.replace(result, output=np.ascontiguousarray(np.flip(result.output, axis=1)))
    reversed_case = dataclasses.replace(case, grad_output=np.ascontiguousarray(np.flip(case.grad_output, axis=1)))
    again, errors_again = check_against(
        reversed_result, run_reference(reversed_case), spec, path.expected(spec)[1], bound=bound
    )
    if again:
        return found, errors
    _tally(node).confirmed.setdefault(known, []).append(spec.short())
    return [], errors_again


def verify_pair(
    pair: tuple[Any, Any], spec: LayerSpec, session: RunSettings, node: pytest.Item | None = None
) -> dict[str, float]:
    """Two paths of one precision against each other (sharper where both claim the same arithmetic): the
    bound is the sum of the bounds of what each was observed to run."""
    first, second = pair
    _, a = _run(first, spec, session, node)
    _, b = _run(second, spec, session, node)
    if a is None or b is None:
        return {}
    bound_a, bound_b = observed_tolerance(first, spec, a), observed_tolerance(second, spec, b)

    def bound(pass_: str) -> Tolerance:
        ta, tb = bound_a(pass_), bound_b(pass_)
        if (ta.family, ta.precision) == (tb.family, tb.precision):
            return pairwise_tolerance(ta.precision, pass_, spec, ta.family)
        return Tolerance(ta.precision, pass_, ta.rel + tb.rel, ta.constant, f"{ta.explain()} + {tb.explain()}",
                         ta.exponent, f"{ta.family}+{tb.family}")  # fmt: skip

    mismatches = check_finite(a, spec) + check_finite(b, spec)
    found, errors = check_against(a, b, spec, first.expected(spec)[1], pairwise_with=second.name, bound=bound)
    mismatches += found
    if mismatches:
        raise _fail(f"{first.name}~{second.name}", spec, session.seed, mismatches)
    return errors


class _StopNow(BaseException):
    """Raised out of a Hypothesis example to end the run at once: Hypothesis shrinks only ``Exception`` and
    pytest's ``Failed``, so a ``BaseException`` passes straight through it."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass
class ExampleCount:
    """How many examples ran the path, and how many of them after the first failure (shrinking)."""

    runs: int = 0
    after_failure: int = 0
    failed: bool = False


def run_examples(
    strategy: SearchStrategy[LayerSpec],
    settings: hypothesis.settings,
    verify: Callable[[LayerSpec], object],
    count: ExampleCount,
) -> None:
    """Run ``verify`` on generated specs. A fatal failure (:data:`FATAL`: NaN/Inf, kernel, precision, ...)
    or an exception from the framework ends the run at once, unshrunk; an out-of-bound error is shrunk for at
    most :data:`SHRINK_RUNS` more path runs, then the smallest failing spec found so far is reported."""
    from hypothesis import given

    @settings
    @given(spec=strategy)
    def check(spec: LayerSpec) -> None:
        count.runs += 1
        if count.failed:
            count.after_failure += 1
        try:
            verify(spec)
        except PathCheckFailed as failure:
            count.failed = True
            if failure.fatal or count.after_failure >= SHRINK_RUNS:
                raise _StopNow(failure) from None
            raise
        except Exception as exc:
            # the framework's own error names no spec; the generated one is what reproduces it (a note, shown
            # under the error from Python 3.11)
            add_note = getattr(exc, "add_note", None)
            if add_note is not None:
                add_note(f"lstmperf: raised on the generated spec {spec!r}")
            raise _StopNow(exc) from exc

    try:
        check()
    except _StopNow as stop:
        raise stop.error from None


def conclude_known_findings(path: Any, node: pytest.Item, *, numbers: bool = True) -> None:
    """After every example of a test passed: xfail naming each known finding the test confirmed (its
    numbers were checked against the bound of what ran and passed), and list one that did not show."""
    tally = node.stash.get(_KNOWN, KnownTally())
    versions = current_versions(getattr(path, "framework", "torch"))
    if tally.confirmed:
        forward_only = sum(1 for key, _ in node.user_properties if key == "lstmperf_forward_only")
        checked = _what_was_checked(tally, numbers, forward_only)
        parts = []
        for finding, specs in tally.confirmed.items():
            text = (
                f"{finding.describe(versions)} [{finding.check}: observed {finding.observed!r}; "
                f"{len(specs)} example(s)]"
            )
            parts.append(text)
            message = f"known finding on {path.name} ({specs[0]}): {text}; {checked}"
            node.user_properties.append(
                ("lstmperf_finding", json.dumps(asdict(Finding(path.name, "known", specs[0], message))))
            )
        pytest.xfail(f"known finding on {path.name}: {'; '.join(parts)}; {checked}")
    for finding in findings_for(path):
        if tally.examples and (numbers or finding.check != "order"):
            message = (
                f"known finding not observed on {', '.join(f'{k} {v}' for k, v in versions.items())} over "
                f"{tally.examples} example(s): {finding.path} [{finding.check}: {finding.observed}] "
                f"'{finding.why[:100]}...'; if it stays so, remove it from pytest_lstmperf/observation/claims.py"
            )
            _note(node, "lstmperf_finding", json.dumps(asdict(Finding(path.name, "known-not-observed", "-", message))))


def _what_was_checked(tally: KnownTally, numbers: bool, forward_only: int = 0) -> str:
    if not tally.examples:
        return "the path raised the documented error on every example: nothing ran whose numbers could be checked"
    partial = (
        f" ({forward_only} of them forward only: the documented error stopped their training step)"
        if forward_only
        else ""
    )
    if numbers:
        return f"numbers checked against the bound of what ran and passed on {tally.examples} example(s){partial}"
    return f"outputs finite{partial}; the numbers are checked by test_matches_reference"


def record_finding(node: pytest.Item, failure: PathCheckFailed) -> None:
    """File the finding on the test report: the run's summary lists it (also under xdist)."""
    node.user_properties.append(("lstmperf_finding", json.dumps(asdict(failure.finding))))


def representative_spec(path: Any, cell: Cell = "lstm") -> LayerSpec | None:
    """A fixed, modest spec the path supports, for the kernel-claim tests (None if the cell does not apply)."""
    base = LayerSpec(
        cell=cell,
        input_size=32,
        hidden_size=64,
        num_layers=2,
        batch=4,
        seq_len=10,
        initial_state=True,
    )
    packed = base.replace(length_mode="packed", lengths=(10, 7, 3, 1))
    # inference forms last: for paths that run no backward pass (ONNX Runtime), whose supports() says so
    for candidate in (base, packed, base.replace(training=False), packed.replace(training=False)):
        if path.supports(candidate) is None:
            return candidate
    return None
