"""Fixtures shared by the project's own tests.

``gate_recording``: the speed-gate project of ``test_bench_plugin`` (the real benchmark suite with the spin
path) recorded once per session with ``--lstmperf-save-baseline``. Several end-to-end tests start from a
recorded baseline; recording costs a full pytest subprocess run (torch import, every benchmark timed), so they
copy this one instead of recording their own. The lifecycle test asserts on this run's output and file.

``clean_suites_run``: the kernel and equivalence suites run clean on the CPU torch paths, once per session;
the planted-fault tests (``test_suite_checks_fail``) and the serial run of ``test_plugin`` both assert on it.
"""

from __future__ import annotations

import os

import pytest
from pytester_runs import (
    CLEARED_ENV,
    CPU_TORCH_PATHS,
    GateRecording,
    gate_env,
    run_pytest_in,
    suites_args,
    write_gate_project,
)


@pytest.fixture(scope="session")
def gate_recording(tmp_path_factory: pytest.TempPathFactory) -> GateRecording:
    from test_bench_plugin import BASE_ARGS

    root = tmp_path_factory.mktemp("gate-recording")
    write_gate_project(root)
    result = run_pytest_in(root, *BASE_ARGS, "--lstmperf-save-baseline", env=gate_env())
    files = {p.name: p.read_text() for p in sorted((root / "baselines").glob("*.json"))}
    return GateRecording(result, files)


@pytest.fixture(scope="session")
def clean_suites_run(tmp_path_factory: pytest.TempPathFactory) -> pytest.RunResult:
    pytest.importorskip("torch", reason="the suites run PyTorch paths (pip install 'pytest-lstmperf[torch]')")
    root = tmp_path_factory.mktemp("clean-suites")
    env = {k: v for k, v in os.environ.items() if k not in CLEARED_ENV}
    return run_pytest_in(root, *suites_args(CPU_TORCH_PATHS), env=env, timeout=600)


@pytest.fixture(autouse=True)
def _inner_runs_are_not_xdist_workers(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pytest run started by a test (pytester) must not inherit this run's pytest-xdist worker variables:
    under ``-n`` it would believe itself a worker (pytest-benchmark then disables itself and writes no JSON)."""
    if "pytester" in request.fixturenames:
        for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
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
