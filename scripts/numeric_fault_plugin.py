"""A pytest plugin for checking the equivalence suite on a device: plant one numeric fault in every
``torch.nn.LSTM``/``GRU`` call of the run, named by ``PYTEST_LSTMPERF_NUMERIC=KIND[:DELTA]`` (kinds:
``pytest_lstmperf.testing.numeric_faults.NUMERIC_FAULTS``). Used by ``scripts/validate.sh numerics``::

    PYTEST_LSTMPERF_NUMERIC=forget-bias:0.5 pytest -p numeric_fault_plugin suites/test_equivalence.py --device=cuda
"""

from __future__ import annotations

import os
from typing import Any

_active: list[Any] = []


def pytest_configure(config: Any) -> None:
    spec = os.environ.get("PYTEST_LSTMPERF_NUMERIC", "")
    if not spec:
        return
    from pytest_lstmperf.testing.numeric_faults import numeric_fault

    kind, _, delta = spec.partition(":")
    context = numeric_fault(kind, float(delta or 0.0))
    context.__enter__()
    _active.append(context)


def pytest_report_header(config: Any) -> str | None:
    spec = os.environ.get("PYTEST_LSTMPERF_NUMERIC", "")
    return f"planted numeric fault in every LSTM/GRU call: {spec}" if spec else None


def pytest_unconfigure(config: Any) -> None:
    while _active:
        _active.pop().__exit__(None, None, None)
