"""pytest-benchmark's ``benchmark`` fixture in a test marked ``@pytest.mark.lstmperf``.

In such a test the test function gets :class:`MarkedBenchmark` in place of pytest-benchmark's fixture: a call
``benchmark(fn, *args, **kwargs)`` is measured by :class:`~.runner.BenchRunner` as ``lstmperf_benchmark(fn)`` is
(one record, baseline entry and gate verdict), ``benchmark.pedantic`` fails with what to call instead, and every
other attribute is pytest-benchmark's own.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest

from .runner import BENCH_MARKER, BenchRunner


class MarkedBenchmark:
    """pytest-benchmark's ``benchmark`` in a test marked ``@pytest.mark.lstmperf``: ``benchmark(fn, *args,
    **kwargs)`` is measured by :meth:`BenchRunner.__call__` (one record, baseline entry and gate verdict like
    ``lstmperf_benchmark(fn)``); every other attribute (``extra_info``, ``group``, ...) is pytest-benchmark's."""

    def __init__(self, benchmark: Any, runner: BenchRunner, label: str, flops: float | None) -> None:
        object.__setattr__(self, "_parts", (benchmark, runner, label, flops))

    def __call__(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        _, runner, label, flops = self._parts
        return runner(partial(fn, *args, **kwargs) if args or kwargs else fn, label=label, flops=flops)

    def pedantic(self, *args: Any, **kwargs: Any) -> Any:
        pytest.fail(
            f"@pytest.mark.{BENCH_MARKER}: benchmark.pedantic(...) is not measured by pytest-lstmperf, which chooses "
            "its own rounds (about 0.25 s of timed work) and synchronises after each call; call "
            "benchmark(fn, *args, **kwargs) instead, or remove the marker to keep pytest-benchmark's pedantic mode",
            pytrace=False,
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._parts[0], name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._parts[0], name, value)
