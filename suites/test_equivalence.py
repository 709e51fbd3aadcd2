"""Every path against the float64 reference, on generated shapes: outputs, final states, every gradient.

Each example also checks the kernel and precision the path ran (the cuDNN algorithm changes with the shape)
and that nothing is NaN or Inf. Numbers are held to the bound of the kernel family and precision the trace
observed (pytest_lstmperf.numerics.tolerance), whatever a known finding documents; a NaN or a wrong kernel fails at
once, unshrunk. Pairs of paths that claim the same arithmetic are also compared with each other.
"""

import pytest
from hypothesis.errors import Unsatisfiable

from pytest_lstmperf.model.spec import LayerSpec
from pytest_lstmperf.numerics.equivalence import (
    ExampleCount,
    PathCheckFailed,
    conclude_known_findings,
    record_finding,
    representative_spec,
    run_examples,
    verify_pair,
    verify_path,
)
from pytest_lstmperf.numerics.path_specs import specs_for_path


def test_matches_reference(lstmperf_path, lstmperf, request):
    profile = lstmperf.hypothesis_profile
    strategy = specs_for_path(lstmperf_path, profile.bounds)
    try:
        run_examples(
            strategy,
            profile.hypothesis_settings(),
            lambda spec: verify_path(lstmperf_path, spec, lstmperf, request.node),
            ExampleCount(),
        )
    except PathCheckFailed as failure:
        record_finding(request.node, failure)
        raise
    except Unsatisfiable:
        reason = lstmperf_path.supports(representative_spec(lstmperf_path) or LayerSpec())
        pytest.skip(f"{lstmperf_path.name}: no generated shape can be compared with the reference ({reason})")
    conclude_known_findings(lstmperf_path, request.node)


def test_pair_agrees(lstmperf_pair, lstmperf, request):
    first, second = lstmperf_pair
    profile = lstmperf.hypothesis_profile
    strategy = specs_for_path(first, profile.bounds).filter(lambda s: second.supports(s) is None)
    try:
        run_examples(
            strategy,
            profile.hypothesis_settings(),
            lambda spec: verify_pair(lstmperf_pair, spec, lstmperf, request.node),
            ExampleCount(),
        )
    except PathCheckFailed as failure:
        record_finding(request.node, failure)
        raise
