"""pytest entry point: hooks and fixture wiring only; the run's state lives in :class:`LstmPerfSession`.

Nothing here imports torch or TensorFlow at import time or for ``--help``. The device is resolved at
session start when a setting was given explicitly (so ``--device=cuda`` without a GPU is a usage error,
exit code 4, before anything runs), otherwise once collection has found tests that use the plugin.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Generator
from typing import TYPE_CHECKING

import pytest

from . import options
from . import paths as registry
from .run_report import build_report
from .session import (
    LstmPerfSession,
    ensure_session,
    requested_device,
    run_session,
    started_session,
)

if TYPE_CHECKING:
    from .paths import ExecutionPath

pytest_plugins = [
    name
    for name in (
        "pytest_lstmperf.hooks.kernel_marker",
        "pytest_lstmperf.hooks.bench",
        "pytest_lstmperf.hooks.workloads",
    )
    if importlib.util.find_spec(name) is not None
]

CORE_SETTINGS = [
    "lstmperf_device",
    "lstmperf_paths",
    "lstmperf_profile",
    "lstmperf_seed",
    "lstmperf_xla_cache",
    "lstmperf_threads",
]
PATH_FIXTURE = "lstmperf_path"
PAIR_FIXTURE = "lstmperf_pair"


@pytest.hookimpl(optionalhook=True, tryfirst=True)  # before pytest-xdist's own (one worker per CPU)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto`` on a GPU run: one worker per usable GPU (each worker is pinned to its own, see device.py)."""
    if not requested_device(config).startswith(("cuda", "auto")):
        return None
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return max(torch.cuda.device_count(), 1)


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser, names=CORE_SETTINGS)


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(
    early_config: pytest.Config, parser: pytest.Parser, args: list[str]
) -> Generator[None, object, object]:
    """``--device`` is the plugin's only where the project's conftests (loaded inside this hook) do not
    declare their own: a project with its own ``--device`` keeps it, and reaches the plugin's device
    setting as ``--lstmperf-device``."""
    try:
        return (yield)
    finally:
        options.add_aliases(parser, names=CORE_SETTINGS)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "lstmperf_paths(*names): run this test only on the named execution paths (others are deselected)",
    )
    # the run's session resolves every setting once, now: a bad value (syntax, a path name the registry lacks) is a
    # usage error before collection, and no framework is imported
    config.pluginmanager.register(run_session(config).tally, "lstmperf-tally")


def _explicit(config: pytest.Config) -> bool:
    for name in CORE_SETTINGS:
        setting = options.SETTINGS[name]
        given = config.getoption(setting.name, default=None)
        if setting.alias:
            given = given or config.getoption(setting.alias_dest, default=None)
        if given or os.environ.get(setting.env) or config.getini(setting.ini):
            return True
    return False


_ensure_session = ensure_session


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    if _explicit(session.config):
        _ensure_session(session.config)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    config = metafunc.config
    if PATH_FIXTURE in metafunc.fixturenames:
        names = run_session(config).settings["lstmperf_paths"].value or registry.default_names()
        marker = metafunc.definition.get_closest_marker("lstmperf_paths")
        if marker is not None:
            names = [n for n in names if n in marker.args]
        if not names:
            reason = (
                f"none of this test's {len(marker.args)} paths ({_short_list(marker.args)}) is in the selection "
                f"{run_session(config).settings['lstmperf_paths'].where()}"
                if marker is not None
                else "no execution path selected"
            )
            _parametrize_nothing(metafunc, PATH_FIXTURE, reason, "no-path-selected")
            return
        metafunc.parametrize(PATH_FIXTURE, names, indirect=True, ids=names)
    if PAIR_FIXTURE in metafunc.fixturenames:
        names = run_session(config).settings["lstmperf_paths"].value or registry.default_names()
        pairs = [(a, b) for a in names for b in registry.get(a).pair_with if b in names]
        if not pairs:
            reason = "no two selected paths claim the same arithmetic (see ExecutionPath.pair_with)"
            _parametrize_nothing(metafunc, PAIR_FIXTURE, reason, "no-pair-selected")
            return
        ids = [f"{a}~{b}" for a, b in pairs]
        metafunc.parametrize(PAIR_FIXTURE, pairs, indirect=True, ids=ids)


def _short_list(names: tuple[str, ...], shown: int = 3) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _parametrize_nothing(metafunc: pytest.Metafunc, fixture: str, reason: str, test_id: str) -> None:
    """One skipped case that says why, instead of pytest's empty parameter set (which reaches the
    fixture as a ``NOTSET`` value)."""
    metafunc.parametrize(
        fixture, [pytest.param(None, marks=pytest.mark.skip(reason=reason))], indirect=True, ids=[test_id]
    )


def _item_paths(item: pytest.Item) -> list[str]:
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return []
    if isinstance(callspec.params.get(PATH_FIXTURE), str):
        return [callspec.params[PATH_FIXTURE]]
    if isinstance(callspec.params.get(PAIR_FIXTURE), tuple):
        return list(callspec.params[PAIR_FIXTURE])
    return []


def _workers_last(items: list[pytest.Item], awaiting: set[str]) -> list[pytest.Item]:
    """``items`` with, in each file, the tests of paths in ``awaiting`` (GPU Keras paths whose worker is still
    starting) after the others, in their order: the workers' imports then run beside the other tests. Files
    keep their order."""
    files: dict[str, int] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], len(files))

    def key(item: pytest.Item) -> tuple[int, bool]:
        names = _item_paths(item)
        callspec = getattr(item, "callspec", None)
        case = callspec.params.get("bench_case") if callspec is not None else None  # the benchmark suite's
        path = getattr(case, "path", None)
        if isinstance(path, str):
            names.append(path)
        return files[item.nodeid.split("::")[0]], any(n in awaiting for n in names)

    return sorted(items, key=key)  # stable: the order within each group is kept


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the parametrisations whose paths run on the selected device; deselect (and count) the rest."""
    uses = [item for item in items if _item_paths(item) or "lstmperf" in getattr(item, "fixturenames", ())]
    if not uses:
        return
    session = _ensure_session(config)
    keep, drop = [], []
    for item in items:
        names = _item_paths(item)
        if names and any(registry.get(n).device != session.device.kind for n in names):
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        session.deselected_other_device += len(drop)
        config.hook.pytest_deselected(items=drop)
    items[:] = _workers_last(keep, session.awaiting_worker) if session.awaiting_worker else keep


def pytest_report_collectionfinish(config: pytest.Config) -> list[str]:
    session = started_session(config)
    if session is None:
        return []
    return session.header_lines()


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Under pytest-xdist the controller collects nothing (no collection-finish report): the header lines go
    at the top instead."""
    if config.getoption("dist", "no") == "no" or hasattr(config, "workerinput"):
        return []
    session = started_session(config)
    return [] if session is None else session.header_lines()


# ------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="session")
def lstmperf(pytestconfig: pytest.Config) -> LstmPerfSession:
    """The run's LstmPerfSession: device, selected paths, settings, findings."""
    return _ensure_session(pytestconfig)


@pytest.fixture
def lstmperf_path(request: pytest.FixtureRequest, lstmperf: LstmPerfSession) -> ExecutionPath:
    """One execution path (parametrised by the plugin); skips with the reason when it cannot run here."""
    path = registry.get(request.param)
    request.node.user_properties.append(("lstmperf_path", path.name))
    reason = lstmperf.unavailable_reason(path) or path.available(lstmperf.device)
    if reason:
        pytest.skip(f"{path.name}: {reason}")
    return path


@pytest.fixture
def lstmperf_pair(request: pytest.FixtureRequest, lstmperf: LstmPerfSession) -> tuple[ExecutionPath, ...]:
    """Two paths of one precision whose results should agree closely (``ExecutionPath.pair_with``)."""
    pair = tuple(registry.get(n) for n in request.param)
    request.node.user_properties.append(("lstmperf_path", "~".join(request.param)))
    for path in pair:
        reason = lstmperf.unavailable_reason(path) or path.available(lstmperf.device)
        if reason:
            pytest.skip(f"{path.name}: {reason}")
    return pair


# ------------------------------------------------------------------------------------------ reporting
@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The run's report, where the speed gate (which builds it with its verdict) took no part."""
    run = run_session(session.config)
    if run.report is None:
        run.report = build_report(run)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    run = run_session(config)
    for line in run.report.paths if run.report is not None else run.tally.summary_lines():
        terminalreporter.write_line(line)


@pytest.hookimpl(trylast=True, specname="pytest_terminal_summary")  # after pytest-benchmark's tables
def pytest_terminal_summary_wall_time(
    terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config
) -> None:
    tally = run_session(config).tally
    if tally.outcomes:
        terminalreporter.write_line(tally.wall_time_line())
