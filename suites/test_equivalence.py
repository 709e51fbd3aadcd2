"""Every path against the float64 reference, on generated shapes: outputs, final states, every gradient.

Each example also checks the kernel and precision the path ran (the cuDNN algorithm changes with the shape)
and that nothing is NaN or Inf. Tolerances come from the measured model in pytest_lstmperf.tolerance.
Pairs of paths that claim the same arithmetic are also compared with each other.
"""

import pytest
from hypothesis import given
from hypothesis.errors import Unsatisfiable

from pytest_lstmperf.equivalence import (
    PathCheckFailed,
    record_finding,
    representative_spec,
    verify_pair,
    verify_path,
)
from pytest_lstmperf.spec import LayerSpec
from pytest_lstmperf.strategies import specs_for_path


def test_matches_reference(lstmperf_path, lstmperf, request):
    profile = lstmperf.hypothesis_profile

    @profile.hypothesis_settings()
    @given(spec=specs_for_path(lstmperf_path, profile.bounds))
    def check(spec):
        verify_path(lstmperf_path, spec, lstmperf, request.node)

    try:
        check()
    except PathCheckFailed as failure:
        record_finding(request.node, failure)
        raise
    except Unsatisfiable:
        reason = lstmperf_path.supports(representative_spec(lstmperf_path) or LayerSpec())
        pytest.skip(f"{lstmperf_path.name}: no generated shape can be compared with the reference ({reason})")


def test_pair_agrees(lstmperf_pair, lstmperf, request):
    first, second = lstmperf_pair
    profile = lstmperf.hypothesis_profile

    @profile.hypothesis_settings()
    @given(spec=specs_for_path(first, profile.bounds).filter(lambda s: second.supports(s) is None))
    def check(spec):
        verify_pair(lstmperf_pair, spec, lstmperf, request.node)

    try:
        check()
    except PathCheckFailed as failure:
        record_finding(request.node, failure)
        raise
