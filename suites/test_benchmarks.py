"""Speed benchmarks of every available execution path, through pytest-benchmark's ``benchmark`` fixture.

    pytest suites/test_benchmarks.py --device=cuda --benchmark-compare          # gate against this device's baseline
    pytest suites/test_benchmarks.py --device=cuda --lstmperf-save-baseline     # record it
    pytest suites/test_benchmarks.py --lstmperf-bench-set=thorough --lstmperf-report=report/

Each test prepares one path on one shape, fails at once when the kernel that ran is not the one the path
claims, then times inference (forward, no autograd) or a training step (forward + backward). The shapes
come from :mod:`pytest_lstmperf.speed.shapes`; pytest-benchmark's flags (--benchmark-only, --benchmark-skip,
--benchmark-json, --benchmark-histogram, --benchmark-compare-fail, ...) apply as usual.
"""

from __future__ import annotations

import pytest

from pytest_lstmperf.hooks.bench import bench_params
from pytest_lstmperf.speed.runner import BenchCase, BenchRunner


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "bench_case" in metafunc.fixturenames:
        mode = "train" if metafunc.function.__name__ == "test_training" else "forward"
        metafunc.parametrize("bench_case", bench_params(metafunc.config, mode))


def test_inference(bench_case: BenchCase, lstmperf_benchmark: BenchRunner) -> None:
    """One forward call without autograd, synchronised."""
    lstmperf_benchmark.measure(bench_case)


def test_training(bench_case: BenchCase, lstmperf_benchmark: BenchRunner) -> None:
    """One forward and backward call (the training step without the optimiser), synchronised."""
    lstmperf_benchmark.measure(bench_case)
