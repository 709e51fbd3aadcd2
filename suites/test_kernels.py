"""Each execution path runs the kernel family and precision it claims, forward and backward.

One fixed, modest layer per path and cell: the claim is checked from the kernel trace (and the outputs
checked for NaN/Inf), so a path that left its kernel (cuDNN or oneDNN disabled behind the suite's back,
autocast not applied) fails here with the ops and GPU kernels that did run. A departure a known finding
documents is an xfail naming it; the path's numbers are checked by test_equivalence.py.
"""

import pytest

from pytest_lstmperf.model.spec import LayerSpec
from pytest_lstmperf.numerics.equivalence import (
    PathCheckFailed,
    conclude_known_findings,
    record_finding,
    representative_spec,
    verify_path,
)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_kernel_claim(lstmperf_path, cell, lstmperf, request):
    spec = representative_spec(lstmperf_path, cell)
    if spec is None:
        reason = lstmperf_path.supports(LayerSpec(cell=cell))
        pytest.skip(f"{lstmperf_path.name} runs no {cell.upper()} spec of this suite: {reason}")
    try:
        verify_path(lstmperf_path, spec, lstmperf, request.node, numbers=False)
    except PathCheckFailed as failure:
        record_finding(request.node, failure)
        raise
    conclude_known_findings(lstmperf_path, request.node, numbers=False)
