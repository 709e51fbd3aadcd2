"""The speed gate's pytest wiring: options, the ``lstmperf_benchmark`` fixture and its parametrisation, the
``@pytest.mark.lstmperf`` marker on pytest-benchmark's ``benchmark``, the records gathered from every worker, and
the hooks through which pytest-benchmark and the session's end reach the gate.

Hooks and fixture wiring only. What they call: :mod:`.gate_context` (the gate's state and settings as the
config holds them), :mod:`.compare_target` (where ``--benchmark-compare`` points), :mod:`.benchmark_json` (the
``lstmperf`` sections of pytest-benchmark's JSON, the JSON written under pytest-xdist), :mod:`.gate_finish` (the
baseline recorded, the gate run and its verdict set as the session's exit status), :mod:`.terminal` (the
terminal section); :mod:`..speed.machine_info` (pytest-benchmark's machine info, computed in a thread) and the
work in :mod:`..speed`. Every access to pytest-benchmark beyond its public hooks, options and fixture attributes
goes through :mod:`..speed.benchmark_adapter`.

* ``--benchmark-compare`` with no argument is pointed at this hardware's baseline file before
  pytest-benchmark loads it, so its comparison table works as usual (its ``--benchmark-compare-fail``, a
  second rule on raw means, is refused there: :mod:`..speed.verdict`); the gate then decides by
  :mod:`..speed.policy` and fails the session in ``pytest_sessionfinish``.
* ``--lstmperf-save-baseline`` records missing entries, ``--lstmperf-update-baseline`` replaces them.
* ``@pytest.mark.lstmperf`` on a test using pytest-benchmark's own ``benchmark`` fixture: that test's
  ``benchmark(fn, *args, **kwargs)`` is measured as ``lstmperf_benchmark(fn)`` is
  (:class:`~..speed.marked.MarkedBenchmark`); unmarked ``benchmark`` tests are left to pytest-benchmark.
"""

from __future__ import annotations

from typing import Any, cast

import pytest

from .. import options
from ..run_report import build_report
from ..session import PropertyCollector, ensure_session, run_session
from ..speed.benchmark_adapter import (
    benchmark_replaced,
    machine_info_generated_elsewhere,
    quiet_xdist_warning,
    set_compare,
)
from ..speed.machine_info import MachineInfo
from ..speed.machine_lock import MachineLock
from ..speed.marked import MarkedBenchmark
from ..speed.records import RECORD_KEY, BenchRecord
from ..speed.runner import BENCH_MARKER, BenchCase, BenchRunner, run_spec
from ..speed.shapes import bench_set, set_shapes
from ..speed.sweep import Sweep
from .benchmark_json import json_section, machine_info_section
from .compare_target import point_compare, take_over_compare
from .gate_context import (
    BENCH_FIXTURE,
    explicit_lstmperf,
    gate_state,
    gate_used,
    is_benchmark,
    is_worker,
    judges,
    machine_lock,
    saving,
    setting,
    sweeps,
)
from .gate_finish import check_writable, finish, show_swept, sweep, take_swept
from .recording import REPEATS_KEY, handed_repeats, keep_benchmarks, process_folder, quiet, swept_only
from .terminal import print_speed_section

JUDGED_KEY = "lstmperf_judged"  # in a pytest-xdist worker's workerinput: the controller's baseline's entries


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser, names=[n for n in options.BENCH_SETTINGS if n not in options.BENCH_FLAGS])
    group = parser.getgroup("lstmperf")
    for name in options.BENCH_FLAGS:
        setting = options.SETTINGS[name]
        group.addoption(
            setting.option,
            dest=setting.name,
            action="store_const",
            const="true",
            default=None,
            help=f"{setting.help} [env {setting.env}, ini {setting.ini}]",
        )
        parser.addini(setting.ini, help=setting.help, default=None)


# ------------------------------------------------------------------------------------------- configure
@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "lstmperf_threshold(ratio): per-test threshold of the speed gate (a figure more than this ratio above its "
        "baseline's is slower, where the benchmark resolves it)",
    )
    config.addinivalue_line(
        "markers",
        f"{BENCH_MARKER}(label='call', *, flops=None): measure this test's pytest-benchmark `benchmark(fn, *args, "
        "**kwargs)` as lstmperf_benchmark(fn) does: device time, observed kernel, host counters, the device's "
        "baseline (--lstmperf-save-baseline) and the speed gate (--benchmark-compare); flops= per call",
    )
    if process_folder() is not None:
        quiet(config)  # a recording process: its recording command writes every file
    # pytest-benchmark loads what --benchmark-compare names in its own pytest_configure (trylast): point it
    # at this device's baseline first.
    compare = config.getoption("benchmark_compare", None)
    if not is_worker(config) and explicit_lstmperf(config) and (compare or _saves_json(config)):
        run_session(config).machine_probe = MachineInfo.start()  # before the device's set-up, which it overlaps
    if not is_worker(config) and saving(config) is not None:
        check_writable(config)
    run_session(config).judges = judges(config)  # before a worker's --benchmark-compare is cleared below
    # the anchor repetitions the run's first process decided (pytest-xdist's controller, a recording's first process)
    gate_state(config).anchor_repeats.update(handed_repeats(config))
    gate_state(config).recording = saving(config) is not None or process_folder() is not None
    judged = getattr(config, "workerinput", {}).get(JUDGED_KEY)  # a worker: what its controller's baseline holds
    if isinstance(judged, list):
        gate_state(config).judged = frozenset(str(name) for name in judged)
    if sweeps(config):
        run_session(config).gate.sweep = Sweep(float(setting(config, "lstmperf_sweep").value), only=swept_only())
    if compare and is_worker(config):
        set_compare(config, [])  # the controller compares; workers only measure
    elif compare and explicit_lstmperf(config):
        point_compare(config, compare)
    elif compare:  # maybe another project's benchmarks: pytest-benchmark's own comparison unless we find ours
        gate_state(config).deferred_compare = compare
    if not is_worker(config):
        from functools import partial

        collector = PropertyCollector(RECORD_KEY, partial(_collect_record, config))
        config.pluginmanager.register(collector, "lstmperf-bench-collector")


def _saves_json(config: pytest.Config) -> bool:
    return bool(
        config.getoption("benchmark_json", None)
        or config.getoption("benchmark_save", None)
        or config.getoption("benchmark_autosave", None)
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """Under pytest-xdist, every test (a benchmark up to its timing too) waits while another worker's benchmark
    times."""
    lock = machine_lock(item.config)
    if lock is None:
        return (yield)
    with lock.shared():
        return (yield)


def pytest_collection_finish(session: pytest.Session) -> None:
    """A ``--benchmark-compare`` left to pytest-benchmark at configure time becomes the gate's once lstmperf
    benchmarks are collected; pytest-benchmark then reloads what it compares against. A pytest-xdist worker
    whose collection holds benchmarks opens the run's machine lock, where the run's figures are judged or kept
    (:func:`.gate_context.judges`, read at configure time)."""
    config = session.config
    if is_worker(config) and run_session(config).judges and any(is_benchmark(item) for item in session.items):
        run_session(config).machine_lock = MachineLock(str(config.workerinput["testrunuid"]))  # type: ignore[attr-defined]  # set by pytest-xdist on its workers
    if not gate_used(config) or gate_state(config).deferred_compare is None:
        return
    if not any(BENCH_FIXTURE in getattr(item, "fixturenames", ()) for item in session.items):
        return
    take_over_compare(config)


# ------------------------------------------------------------------------------------------- fixtures
def bench_params(config: pytest.Config, mode: str) -> list[Any]:
    """``pytest.param`` values for the benchmark suite: available paths x the set's shapes for ``mode``.

    Paths the device cannot run are kept as skipped parameters, so that the summary says why.
    """
    session = ensure_session(config)
    set_name = bench_set(config)
    shapes = [s for s in set_shapes(set_name, session.device.kind) if mode in s.modes]
    params = []
    for path in session.selected:
        if set_name == "gate" and not getattr(path, "in_gate", True):
            continue
        reason = session.unavailable.get(path.name)
        for shape in shapes:
            not_run = reason
            if reason is None and path.supports(run_spec(path, shape.spec, mode)) is not None:
                if not (mode == "train" and path.options.get("inference_only")):
                    continue
                not_run = path.supports(shape.spec)  # said once per shape: this path has no training step
            case = BenchCase(path.name, shape, mode, set_name)
            marks = [pytest.mark.skip(reason=f"{path.name}: {not_run}")] if not_run else []
            params.append(pytest.param(case, id=case.id, marks=marks))
    if not params and session.selected:
        # said instead of pytest's "got empty parameter set": which paths, which set, and what runs them
        names = ", ".join(p.name for p in session.selected)
        if set_name == "gate" and not any(getattr(p, "in_gate", True) for p in session.selected):
            reason = f"{names}: not in the gate set of benchmarks; --lstmperf-bench-set=thorough times them"
        else:
            reason = f"none of the {set_name} set's {mode} shapes runs on {names}" + (
                "; --lstmperf-bench-set=thorough has more shapes" if set_name == "gate" else ""
            )
        params.append(pytest.param(None, id="no-shape", marks=[pytest.mark.skip(reason=reason)]))
    return params


@pytest.fixture
def lstmperf_benchmark(benchmark: Any, request: pytest.FixtureRequest, lstmperf: Any) -> BenchRunner:
    """Measure one :class:`BenchCase` through pytest-benchmark's ``benchmark`` fixture."""
    return BenchRunner(benchmark, request, lstmperf, gate_state(request.config), machine_lock(request.config))


def _marked_options(item: pytest.Item) -> tuple[str, float | None]:
    """``(label, flops)`` of ``@pytest.mark.lstmperf``, or a test failure naming what is wrong."""
    marker = item.get_closest_marker(BENCH_MARKER)
    kwargs = dict(marker.kwargs) if marker is not None else {}
    label = kwargs.pop("label", marker.args[0] if marker is not None and marker.args else "call")
    flops = kwargs.pop("flops", None)
    problem = ""
    extra_args = list(marker.args[1:]) if marker is not None else []
    if kwargs or extra_args:
        problem = f"unknown arguments {sorted(kwargs) or extra_args} (valid: label, flops=)"
    elif not isinstance(label, str) or not label:
        problem = f"label={label!r}: a non-empty string"
    elif flops is not None and (not isinstance(flops, (int, float)) or flops <= 0):
        problem = f"flops={flops!r}: a positive number of floating-point operations per call"
    if problem:
        pytest.fail(f"@pytest.mark.{BENCH_MARKER}: {problem}", pytrace=False)
    return label, flops


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A marked test that uses ``benchmark`` also gets ``lstmperf_benchmark`` (measured, recorded, gated); a
    recording process runs the benchmarks alone (:mod:`.recording`)."""
    keep_benchmarks(config, items)
    for item in items:
        names = getattr(item, "fixturenames", None)
        if names is None or item.get_closest_marker(BENCH_MARKER) is None:
            continue
        if "benchmark" in names and BENCH_FIXTURE not in names:
            names.append(BENCH_FIXTURE)


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Any:
    """In a marked test, the test function gets :class:`MarkedBenchmark` as ``benchmark`` (pytest-benchmark
    gets its own fixture back for its report)."""
    if pyfuncitem.get_closest_marker(BENCH_MARKER) is None:
        return (yield)
    funcargs = pyfuncitem.funcargs
    if "benchmark" not in funcargs:
        pytest.fail(
            f"@pytest.mark.{BENCH_MARKER} marks a pytest-benchmark test, and {pyfuncitem.name} uses no "
            f"`benchmark` fixture: add it (benchmark(fn, *args)) or use the `{BENCH_FIXTURE}` fixture",
            pytrace=False,
        )
    label, flops = _marked_options(pyfuncitem)
    runner = cast(BenchRunner, funcargs[BENCH_FIXTURE])
    with benchmark_replaced(pyfuncitem, MarkedBenchmark(funcargs["benchmark"], runner, label, flops)):
        return (yield)


# ------------------------------------------------------------------------------------- collecting records
def _collect_record(config: pytest.Config, value: object) -> None:
    """A benchmark's record as it arrived (from this process or a pytest-xdist worker)."""
    if isinstance(value, dict):
        gate_state(config).records.append(BenchRecord.from_json(value))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist's controller, as it starts a worker: the run's id, whose lock folder it removes at the end,
    the anchor repetitions every benchmark is timed with (:meth:`..speed.gate.GateState.anchor_repeat`): the
    baseline's, which the workers do not load, and the benchmarks it has entries for
    (:meth:`..speed.gate.GateState.judges_benchmark`)."""
    run_session(node.config).xdist_run = str(node.workerinput["testrunuid"])
    node.workerinput[REPEATS_KEY] = gate_state(node.config).known_repeats()
    baseline = gate_state(node.config).baseline
    if baseline is not None:  # which benchmarks the gate judges (GateState.judges_benchmark)
        node.workerinput[JUDGED_KEY] = sorted(baseline.benchmarks)


@pytest.hookimpl(tryfirst=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    session = run_session(config)
    run_id = session.xdist_run
    if run_id is not None:  # the controller, its workers gone
        MachineLock.remove(run_id)
    if is_worker(config):
        # pytest-benchmark warns from a pytest-xdist worker as it exits, onto the terminal in the middle of the
        # progress dots; the run's summary says how its figures were timed under pytest-xdist instead
        quiet_xdist_warning()
        if session.machine_lock is not None:
            session.machine_lock.close()


# ----------------------------------------------------------------------------------- pytest-benchmark
@pytest.hookimpl(tryfirst=True)
def pytest_benchmark_generate_machine_info(config: pytest.Config) -> dict[str, Any] | None:
    """The machine info :class:`MachineInfo` computed, where pytest-benchmark's default would compute it: None
    (the next implementation decides) when no probe started, it failed, or a conftest or another plugin
    generates the machine info itself."""
    probe = run_session(config).machine_probe
    if probe is None or machine_info_generated_elsewhere(config, __name__):
        return None
    return probe.result()


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict[str, Any]) -> None:
    section = machine_info_section(config)
    if section is not None:
        machine_info["lstmperf"] = section


def pytest_benchmark_update_json(config: pytest.Config, benchmarks: Any, output_json: dict[str, Any]) -> None:
    section = json_section(config)
    if section is not None:
        output_json["lstmperf"] = section


# ------------------------------------------------------------------------------------------ session end
@pytest.hookimpl(wrapper=True, tryfirst=True, specname="pytest_sessionfinish")
def pytest_sessionfinish_sweep(session: pytest.Session, exitstatus: int) -> Any:
    """The sweep, before every other plugin's session end: pytest-benchmark's (a wrapper too) groups and writes
    its results as it starts, and they show the swept figures (:func:`.gate_finish.show_swept`)."""
    config = session.config
    sweep(config)
    if not is_worker(config):
        show_swept(config)
    return (yield)


@pytest.hookimpl(tryfirst=True)  # before pytest's junitxml writes its file: the gate's properties go in it
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if is_worker(config) or not gate_used(config):
        return
    finish(session)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """pytest-xdist's controller, as a worker finishes: what its sweep measured."""
    take_swept(node.config, getattr(node, "workeroutput", None))


# ----------------------------------------------------------------------------------------- terminal
@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> Any:
    """The speed section after every other summary (pytest-benchmark's tables, pytest's short summary), so
    that the gate's verdict is the last thing printed before pytest's final line."""
    try:
        return (yield)
    finally:
        if not is_worker(config) and gate_used(config):
            run = run_session(config)
            print_speed_section(terminalreporter, (run.report or build_report(run)).speed)
