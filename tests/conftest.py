"""Fixtures shared by the project's own tests.

``gate_recording``: the speed-gate project of ``test_bench_plugin`` (the real benchmark suite with the spin
path) recorded once per session with ``--lstmperf-save-baseline``. Several end-to-end tests start from a
recorded baseline; recording costs a full pytest subprocess run (torch import, every benchmark timed), so they
copy this one instead of recording their own. The lifecycle test asserts on this run's output and file.

``clean_suites_run``: the kernel and equivalence suites run clean on the CPU torch paths, once per session;
the planted-fault tests (``test_suite_checks_fail``) and the serial run of ``test_plugin`` both assert on it.

Both run once per test run, in the background from the end of collection (the tests that read them run last):
under pytest-xdist the first worker to start one runs it and the others read its result
(:class:`pytester_runs.SessionRun`).

What a test's inner pytest runs must not inherit from this run's environment is one list,
:data:`pytester_runs.CLEARED_ENV` (:func:`pytester_runs.clear_inner_env` clears it for a test). ``drawn``: the
figures a plotting function draws, kept open.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator

import pytest
from pytester_runs import (
    CLEARED_ENV,
    CPU_TORCH_PATHS,
    XDIST_ENV,
    GateRecording,
    SessionRun,
    gate_env,
    suites_args,
    write_gate_project,
)


def _start_gate_recording(config: pytest.Config, factory: pytest.TempPathFactory) -> SessionRun:
    from test_bench_plugin import BASE_ARGS

    run = SessionRun.of(config, factory, "gate-recording")
    run.start([*BASE_ARGS, "--lstmperf-save-baseline"], gate_env(), 600, write_gate_project)
    return run


def _start_clean_suites(config: pytest.Config, factory: pytest.TempPathFactory) -> SessionRun:
    run = SessionRun.of(config, factory, "clean-suites")
    env = {k: v for k, v in os.environ.items() if k not in CLEARED_ENV}
    run.start(suites_args(CPU_TORCH_PATHS), env, 600, lambda root: None)
    return run


#: the session fixtures whose inner run starts in the background as collection ends
SESSION_RUNS = {"gate_recording": _start_gate_recording, "clean_suites_run": _start_clean_suites}


@pytest.fixture(scope="session")
def gate_recording(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> GateRecording:
    run = _start_gate_recording(request.config, tmp_path_factory)  # started already where collection saw it
    result = run.result(timeout=900)
    files = {p.name: p.read_text() for p in sorted((run.root / "baselines").glob("*.json"))}
    return GateRecording(result, files)


@pytest.fixture(scope="session")
def clean_suites_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> pytest.RunResult:
    pytest.importorskip("torch", reason="the suites run PyTorch paths (pip install 'pytest-lstmperf[torch]')")
    return _start_clean_suites(request.config, tmp_path_factory).result(timeout=1200)


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


def _session_run_of(item: pytest.Item) -> str | None:
    return next((name for name in SESSION_RUNS if name in getattr(item, "fixturenames", ())), None)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that read a session run go last (in their order): their run starts in the background as
    collection ends, and the other tests run meanwhile instead of waiting for it."""
    items[:] = [i for i in items if _session_run_of(i) is None] + [i for i in items if _session_run_of(i)]


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection imported (torch, TensorFlow, Keras, JAX: about 675,000 objects) is frozen out of the
    garbage collector, which walked it in every full collection (a whole run without this: 20 of them,
    5.8 s in all, on a 2-core machine). A session-wide hook: in the README's command (``tests suites
    examples``) the suites and examples run with it too; ``pytest suites`` alone does not."""
    import gc

    gc.collect()
    gc.freeze()
    # the session runs that a collected test needs start now (the clean suites only where torch is installed)
    factory = getattr(session.config, "_tmp_path_factory", None)  # the tmp_path_factory fixture's object
    needed = {_session_run_of(item) for item in session.items} - {None}
    if factory is not None and not session.config.option.collectonly:
        for name in sorted(n for n in needed if n is not None):
            if name != "clean_suites_run" or importlib.util.find_spec("torch") is not None:
                SESSION_RUNS[name](session.config, factory)


def pytest_sessionfinish(session: pytest.Session) -> None:
    from forked_pytest import close_server

    close_server()
    interrupted = session.shouldstop or session.shouldfail or session.exitstatus == pytest.ExitCode.INTERRUPTED
    for run in SessionRun.runs.values():
        run.stop(wait=not interrupted)
