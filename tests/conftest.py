"""Fixtures shared by the project's own tests.

``gate_recording``: the speed-gate project of ``test_bench_plugin`` (the real benchmark suite with the spin
path) recorded once per session with ``--lstmperf-save-baseline``. Several end-to-end tests start from a
recorded baseline; recording costs a full pytest subprocess run (torch import, every benchmark timed), so they
copy this one instead of recording their own. The lifecycle test asserts on this run's output and file.

``clean_suites_run``: the kernel and equivalence suites run clean on the CPU torch paths, once per session;
the planted-fault tests (``test_suite_checks_fail``) and the serial run of ``test_plugin`` both assert on it.

Both run once per test run: under pytest-xdist the first worker to need one runs it and the others read its
result (:func:`pytester_runs.run_once`).

``inner_env``: the environment of a test's inner pytest runs cleared of what they must not inherit
(:data:`pytester_runs.CLEARED_ENV`, the one list). ``drawn``: the figures a plotting function draws, kept open.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from pytester_runs import (
    CLEARED_ENV,
    CPU_TORCH_PATHS,
    XDIST_ENV,
    GateRecording,
    clear_inner_env,
    gate_env,
    run_once,
    run_pytest_in,
    suites_args,
    write_gate_project,
)


@pytest.fixture(scope="session")
def gate_recording(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> GateRecording:
    from test_bench_plugin import BASE_ARGS

    def record(root: Path) -> pytest.RunResult:
        write_gate_project(root)
        return run_pytest_in(root, *BASE_ARGS, "--lstmperf-save-baseline", env=gate_env())

    root, result = run_once(request, tmp_path_factory, "gate-recording", record)
    files = {p.name: p.read_text() for p in sorted((root / "baselines").glob("*.json"))}
    return GateRecording(result, files)


@pytest.fixture(scope="session")
def clean_suites_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> pytest.RunResult:
    pytest.importorskip("torch", reason="the suites run PyTorch paths (pip install 'pytest-lstmperf[torch]')")
    env = {k: v for k, v in os.environ.items() if k not in CLEARED_ENV}

    def run(root: Path) -> pytest.RunResult:
        return run_pytest_in(root, *suites_args(CPU_TORCH_PATHS), env=env, timeout=600)

    return run_once(request, tmp_path_factory, "clean-suites", run)[1]


@pytest.fixture
def inner_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """This test's inner pytest runs inherit none of :data:`pytester_runs.CLEARED_ENV`; returns ``monkeypatch``."""
    clear_inner_env(monkeypatch)
    return monkeypatch


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> Iterator[list]:
    """The figures the plotting functions draw, kept open (they close them after saving)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures: list = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: figures.append(fig))
    yield figures
    close("all")


@pytest.fixture(autouse=True)
def _inner_runs_are_not_xdist_workers(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pytest run started by a test (pytester) must not inherit this run's pytest-xdist worker variables:
    under ``-n`` it would believe itself a worker (pytest-benchmark then disables itself and writes no JSON)."""
    if "pytester" in request.fixturenames:
        for name in XDIST_ENV:
            monkeypatch.delenv(name, raising=False)


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection imported (torch, TensorFlow, Keras, JAX: about 675,000 objects) is frozen out of the
    garbage collector, which walked it in every full collection (a whole run without this: 20 of them,
    5.8 s in all, on a 2-core machine). A session-wide hook: in the README's command (``tests suites
    examples``) the suites and examples run with it too; ``pytest suites`` alone does not."""
    import gc

    gc.collect()
    gc.freeze()


def pytest_sessionfinish(session: pytest.Session) -> None:
    from forked_pytest import close_server

    close_server()
