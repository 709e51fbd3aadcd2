"""The speed gate's pytest wiring: options, the ``lstmperf_benchmark`` fixture and its parametrisation, where
``--benchmark-compare`` points, the records gathered from every worker, the baseline recorded, the gate run and
its verdict set as the session's exit status.

Hooks and fixture wiring only; the work lives in :mod:`..speed`: :mod:`..speed.runner` (one benchmark's
measurement), :mod:`..speed.timing` (clocks and the anchor), :mod:`..speed.baseline` (the store),
:mod:`..speed.policy` (the rule), :mod:`..speed.gate` (the run's state and decisions), :mod:`..speed.shapes`
(what is measured), :mod:`..speed.report` (the page); the terminal section is :mod:`.terminal`.

* ``--benchmark-compare`` with no argument is pointed at this hardware's baseline file before
  pytest-benchmark loads it, so its comparison table and ``--benchmark-compare-fail`` work as usual; the
  gate then decides by :mod:`..speed.policy` and fails the session in ``pytest_sessionfinish``.
* ``--lstmperf-save-baseline`` records missing entries, ``--lstmperf-update-baseline`` replaces them.
* ``@pytest.mark.lstmperf`` on a test using pytest-benchmark's own ``benchmark`` fixture: that test's
  ``benchmark(fn, *args, **kwargs)`` is measured as ``lstmperf_benchmark(fn)`` is (:class:`MarkedBenchmark`);
  unmarked ``benchmark`` tests are left to pytest-benchmark.
"""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest

from .. import options
from ..speed.gate import GateState, run_gate
from ..speed.provenance import benchmark_header, provenance, record_command
from ..speed.runner import BENCH_MARKER, RECORD_KEY, BenchCase, BenchRunner, MarkedBenchmark, run_spec
from ..speed.shapes import bench_set
from .terminal import outcome_lines, print_speed_section

if TYPE_CHECKING:
    from ..device import DeviceInfo


BENCH_FIXTURE = "lstmperf_benchmark"


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


STATE_KEY = pytest.StashKey[GateState]()


def _state(config: pytest.Config) -> GateState:
    if STATE_KEY not in config.stash:
        config.stash[STATE_KEY] = GateState()
    return config.stash[STATE_KEY]


def _setting(config: pytest.Config, name: str) -> options.Resolved:
    return options.resolve(config, name)


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _xdist_active(config: pytest.Config) -> bool:
    return _is_worker(config) or config.getoption("dist", "no") not in ("no", None)


def _device(config: pytest.Config) -> DeviceInfo:
    """The session's device; before the session exists (configure time), resolved the same way."""
    state = _state(config)
    if state.device is None:
        from ..session import SESSION_KEY

        if SESSION_KEY in config.stash:
            state.device = config.stash[SESSION_KEY].device
        else:  # configure time: the session is created later, from the same settings
            from ..device import DeviceError, resolve_device

            dev = _setting(config, "lstmperf_device")
            try:
                state.device = resolve_device(dev.value, dev.source)
            except DeviceError as exc:
                raise pytest.UsageError(str(exc)) from None
    return state.device


def _fields(device: DeviceInfo) -> dict[str, str]:
    return device.hardware()


def _baselines_dir(config: pytest.Config) -> Path:
    raw = _setting(config, "lstmperf_baselines").value
    return Path(raw) if raw else Path(config.rootpath) / "baselines"


def _store(config: pytest.Config):
    from ..speed.baseline import BaselineStore

    return BaselineStore(_baselines_dir(config), record_hint=record_command(config))


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
    # pytest-benchmark loads what --benchmark-compare names in its own pytest_configure (trylast): point it
    # at this device's baseline first.
    compare = config.getoption("benchmark_compare", None)
    if not _is_worker(config) and _explicit_lstmperf(config) and (compare or _saves_json(config)):
        config.stash[MACHINE_KEY] = MachineInfo.start()  # before the device's set-up, which it overlaps
    if not _is_worker(config) and _saving(config) is not None:
        _check_writable(config)
    if compare and _is_worker(config):
        config.option.benchmark_compare = []  # the controller compares; workers only measure
    elif compare and _explicit_lstmperf(config):
        _point_compare(config, compare)
    elif compare:  # maybe another project's benchmarks: pytest-benchmark's own comparison unless we find ours
        _state(config).deferred_compare = compare
    if not _is_worker(config):
        from functools import partial

        from ..session import PropertyCollector

        collector = PropertyCollector(RECORD_KEY, partial(_collect_record, config))
        config.pluginmanager.register(collector, "lstmperf-bench-collector")


def _explicit_lstmperf(config: pytest.Config) -> bool:
    """Whether a pytest-lstmperf setting was given (option, environment or ini): this is an lstmperf run."""
    for setting in options.SETTINGS.values():
        if not options.is_added(config, setting.name):
            continue
        given = config.getoption(setting.name, default=None)
        if setting.alias:  # ``--device``, where this plugin owns it (its destination is ours alone)
            given = given or config.getoption(setting.alias_dest, default=None)
        if given or os.environ.get(setting.env) or config.getini(setting.ini):
            return True
    return False


def _uses_lstmperf(config: pytest.Config) -> bool:
    """This run measures lstmperf benchmarks (records arrived, or the gate was pointed at a baseline)."""
    state = config.stash.get(STATE_KEY, None)
    return state is not None and bool(state.records or state.compare_requested or _explicit_lstmperf(config))


def _is_benchmark(item: pytest.Item) -> bool:
    return BENCH_FIXTURE in getattr(item, "fixturenames", ()) or item.get_closest_marker(BENCH_MARKER) is not None


MACHINE_LOCK_KEY = pytest.StashKey[Any]()


def _machine_lock(config: pytest.Config) -> Any:
    """This pytest-xdist worker's :class:`~..speed.machine_lock.MachineLock`, where the run times benchmarks."""
    return config.stash.get(MACHINE_LOCK_KEY, None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """Under pytest-xdist, every test (a benchmark up to its timing too) waits while another worker's benchmark
    times."""
    lock = _machine_lock(item.config)
    if lock is None:
        return (yield)
    with lock.shared():
        return (yield)


def pytest_collection_finish(session: pytest.Session) -> None:
    """A ``--benchmark-compare`` left to pytest-benchmark at configure time becomes the gate's once lstmperf
    benchmarks are collected; pytest-benchmark then reloads what it compares against. A pytest-xdist worker
    whose collection holds benchmarks opens the run's machine lock."""
    config = session.config
    if _is_worker(config) and any(_is_benchmark(item) for item in session.items):
        from ..speed.machine_lock import MachineLock

        config.stash[MACHINE_LOCK_KEY] = MachineLock(str(config.workerinput["testrunuid"]))  # type: ignore[attr-defined]  # set by pytest-xdist on its workers
    state = config.stash.get(STATE_KEY, None)
    if state is None or state.deferred_compare is None:
        return
    if not any(BENCH_FIXTURE in getattr(item, "fixturenames", ()) for item in session.items):
        return
    _take_over_compare(config)


def _take_over_compare(config: pytest.Config) -> None:
    state = _state(config)
    compare, state.deferred_compare = state.deferred_compare, None
    _point_compare(config, compare)
    bench_session = getattr(config, "_benchmarksession", None)
    if bench_session is not None and state.compare is not None:
        bench_session.compare = config.option.benchmark_compare
        bench_session.handle_loading()


def _point_compare(config: pytest.Config, compare: object) -> None:
    from ..speed.baseline import BaselineError, differences, load

    state = _state(config)
    state.compare_requested = True
    saving = _saving(config) is not None
    if compare is True:
        fields = _fields(_device(config))
        store = _store(config)
        try:
            baseline = store.find(fields)
        except BaselineError as exc:
            raise pytest.UsageError(f"--benchmark-compare: {exc}") from None
        if baseline is None:
            if saving:
                state.messages.append(f"{store.missing_message(fields)} This run records it; nothing to compare.")
                config.option.benchmark_compare = []
                return
            raise pytest.UsageError(f"--benchmark-compare: {store.missing_message(fields)}")
        state.compare, state.baseline = "device", baseline
        config.option.benchmark_compare = str(baseline.path.resolve())
        return
    candidate = Path(str(compare))
    if not candidate.is_file():
        in_baselines = [_baselines_dir(config) / str(compare), _baselines_dir(config) / f"{compare}.json"]
        found = next((p for p in in_baselines if p.is_file()), None)
        if found is None:
            if _benchmark_storage_has(config, str(compare)):
                return  # pytest-benchmark's own run number or id: its comparison, not the gate's
            raise pytest.UsageError(
                f"--benchmark-compare={compare}: matches nothing: no file {candidate.resolve()}, no "
                f"{in_baselines[0].name} or {in_baselines[1].name} in {_baselines_dir(config)}, and no "
                f"pytest-benchmark run *{compare}*.json in --benchmark-storage. Valid: an existing baseline file, a "
                f"pytest-benchmark run number or id, or no value (this hardware's baseline in "
                f"{_baselines_dir(config)})"
            )
        candidate = found
    try:
        baseline = load(candidate, record_command(config))
    except BaselineError as exc:
        if "without pytest-lstmperf's device key" in str(exc):
            return  # a plain pytest-benchmark file: pytest-benchmark compares, the gate does not
        raise pytest.UsageError(f"--benchmark-compare={compare}: {exc}") from None
    diff = differences(baseline.fields, _fields(_device(config)))
    if diff:
        raise pytest.UsageError(
            f"--benchmark-compare={compare}: refusing to compare against a baseline of other hardware: "
            f"{'; '.join(diff)}. Timings of different hardware are not comparable; compare against this "
            f"hardware's baseline (--benchmark-compare with no argument) or record one with: "
            f"{record_command(config)}"
        )
    state.compare, state.baseline = "file", baseline
    config.option.benchmark_compare = str(baseline.path.resolve())


def _benchmark_storage_has(config: pytest.Config, name: str) -> bool:
    """Whether pytest-benchmark's storage (``--benchmark-storage``, a ``file://`` folder) holds a run whose file
    name contains ``name``, as pytest-benchmark's own ``--benchmark-compare=NAME`` looks it up."""
    raw = str(config.getoption("benchmark_storage", None) or "file://./.benchmarks")
    if not raw.startswith("file://"):
        return True  # another storage (elasticsearch): pytest-benchmark looks itself
    folder = Path(raw[len("file://") :])
    if not folder.is_absolute():
        folder = Path(config.invocation_params.dir) / folder
    return folder.is_dir() and any(name in p.name for p in folder.rglob("*.json"))


def _saving(config: pytest.Config) -> str | None:
    if _setting(config, "lstmperf_update_baseline").value:
        return "update"
    if _setting(config, "lstmperf_save_baseline").value:
        return "save"
    if _setting(config, "lstmperf_add_baseline_run").value:
        return "add-run"
    return None


def bench_params(config: pytest.Config, mode: str) -> list[Any]:
    """``pytest.param`` values for the benchmark suite: available paths x the set's shapes for ``mode``.

    Paths the device cannot run are kept as skipped parameters, so that the summary says why.
    """
    from ..session import ensure_session
    from ..speed.shapes import set_shapes

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
    return params


@pytest.fixture
def lstmperf_benchmark(benchmark: Any, request: pytest.FixtureRequest, lstmperf: Any) -> BenchRunner:
    """Measure one :class:`BenchCase` through pytest-benchmark's ``benchmark`` fixture."""
    return BenchRunner(benchmark, request, lstmperf, _state(request.config), _machine_lock(request.config))


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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A marked test that uses ``benchmark`` also gets ``lstmperf_benchmark`` (measured, recorded, gated)."""
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
    plain = funcargs["benchmark"]
    runner = cast(BenchRunner, funcargs[BENCH_FIXTURE])
    funcargs["benchmark"] = MarkedBenchmark(plain, runner, label, flops)
    try:
        return (yield)
    finally:
        funcargs["benchmark"] = plain


# ------------------------------------------------------------------------------------- collecting records
def _collect_record(config: pytest.Config, value: object) -> None:
    if isinstance(value, dict):
        _state(config).records.append(value)


@pytest.hookimpl(tryfirst=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    if _is_worker(config):
        # pytest-benchmark warns from a pytest-xdist worker as it exits, onto the terminal in the middle of the
        # progress dots; the run's summary says how its figures were timed under pytest-xdist instead
        import warnings

        warnings.filterwarnings("ignore", message="Benchmarks are automatically disabled because xdist")
        lock = config.stash.get(MACHINE_LOCK_KEY, None)
        if lock is not None:
            lock.close()


# ----------------------------------------------------------------------------------- pytest-benchmark
class MachineInfo:
    """pytest-benchmark's own machine info (its default ``pytest_benchmark_generate_machine_info``), computed once
    in a thread of its own. Its CPU probe (py-cpuinfo, a subprocess) took 1.2 s of the default GPU command on
    the H100 runner, where pytest-benchmark loads the baseline it compares against, before the first test,
    and another 1.4 s where it saves JSON at the end. Started when an lstmperf run configures, it runs beside
    the device's set-up (the torch import and CUDA's start), and both uses get a copy of the one result."""

    def __init__(self) -> None:
        import threading

        self.info: dict[str, Any] | None = None
        self.failed = False
        self.thread = threading.Thread(target=self._run, name="lstmperf-machine-info", daemon=True)

    @classmethod
    def start(cls) -> MachineInfo:
        probe = cls()
        probe.thread.start()
        return probe

    def _run(self) -> None:
        try:
            from pytest_benchmark.plugin import pytest_benchmark_generate_machine_info as generate

            self.info = generate()
        except Exception:  # pytest-benchmark computes it itself then, with its own errors
            self.failed = True

    def result(self) -> dict[str, Any] | None:
        """A copy of the machine info (pytest-benchmark's update hooks add to it), or None where it failed."""
        import copy

        self.thread.join()
        return None if self.failed or self.info is None else copy.deepcopy(self.info)


MACHINE_KEY = pytest.StashKey[MachineInfo]()


def _saves_json(config: pytest.Config) -> bool:
    return bool(
        config.getoption("benchmark_json", None)
        or config.getoption("benchmark_save", None)
        or config.getoption("benchmark_autosave", None)
    )


@pytest.hookimpl(tryfirst=True)
def pytest_benchmark_generate_machine_info(config: pytest.Config) -> dict[str, Any] | None:
    """The machine info :class:`MachineInfo` computed, where pytest-benchmark's default would compute it: None
    (the next implementation decides) when no probe started, it failed, or a conftest or another plugin
    generates the machine info itself."""
    probe = config.stash.get(MACHINE_KEY, None)
    if probe is None:
        return None
    hook = config.pluginmanager.hook.pytest_benchmark_generate_machine_info
    for impl in hook.get_hookimpls():
        module = getattr(impl.plugin, "__name__", "")
        if module not in (__name__, "pytest_benchmark.plugin"):
            return None  # somebody else's machine info
    return probe.result()


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict[str, Any]) -> None:
    if not _uses_lstmperf(config):
        return  # another project's benchmarks: no device resolution (no torch import), no lstmperf section
    try:
        device = _device(config)
    except pytest.UsageError:
        return
    from ..device import hardware_key

    machine_info["lstmperf"] = {"device_key": hardware_key(_fields(device)), "fingerprint": dict(device.fingerprint)}


def pytest_benchmark_update_json(config: pytest.Config, benchmarks: Any, output_json: dict[str, Any]) -> None:
    if not _uses_lstmperf(config):
        return
    try:
        device = _device(config)
    except pytest.UsageError:
        return
    from ..device import hardware_key
    from ..speed.baseline import FORMAT

    fields = _fields(device)
    output_json["lstmperf"] = {
        "format": FORMAT,
        "device_key": hardware_key(fields),
        "hardware": fields,
        "versions": device.versions(),
        "fingerprint": dict(device.fingerprint),
        "provenance": provenance(config),
    }


@pytest.hookimpl(tryfirst=True)  # before pytest's junitxml writes its file: the gate's properties go in it
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if _is_worker(config) or STATE_KEY not in config.stash:
        return
    state = _state(config)
    if state.deferred_compare is not None and state.records:  # pytest-xdist: the controller collected nothing
        try:
            _take_over_compare(config)
        except pytest.UsageError as exc:
            state.errors.append(str(exc))
            session.exitstatus = pytest.ExitCode.USAGE_ERROR
    measured = [r for r in state.records if r.get("data")]
    if _saving(config) is not None:
        _record_baseline(config, state, session, measured)
    json_target = config.getoption("benchmark_json", None)
    if json_target and measured and _xdist_active(config):
        try:
            state.messages.append(_write_xdist_json(config, json_target, measured))
        except (OSError, TypeError, ValueError) as exc:
            name = getattr(json_target, "name", json_target)
            state.errors.append(f"--benchmark-json={name}: could not write the merged results: {exc}")
    if state.baseline is not None:
        from ..session import SESSION_KEY

        session_ = config.stash.get(SESSION_KEY, None)
        unavailable = session_.resolve_unavailable() if session_ is not None else {}
        threshold = _setting(config, "lstmperf_threshold").value
        state.gate = run_gate(state.baseline, state.records, threshold, _device(config).versions(), unavailable)
        _write_ci_summary(config, state)
    _write_report(config, state)
    failed = _gate_outcome(config, state)
    if failed and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _check_writable(config: pytest.Config) -> None:
    """A recording run whose baseline cannot be written stops before any test runs (exit 4)."""
    from ..speed.baseline import BaselineError

    try:
        _store(config).check_writable(_fields(_device(config)))
    except BaselineError as exc:
        raise pytest.UsageError(f"{_saving_flag(config)}: {exc}") from None


def _saving_flag(config: pytest.Config) -> str:
    return {"update": "--lstmperf-update-baseline", "save": "--lstmperf-save-baseline"}.get(
        _saving(config) or "", "--lstmperf-add-baseline-run"
    )


def _write_ci_summary(config: pytest.Config, state: GateState) -> None:
    """The verdict as Markdown in ``$GITHUB_STEP_SUMMARY`` (where set) and as JUnit properties of the run."""
    from .. import ci_summary

    assert state.gate is not None
    rows = []
    for d in state.gate.decisions:
        deciding = d.deciding
        kernel = d.kernel_now or d.kernel_then
        if d.kernel_then and d.kernel_now and d.kernel_then != d.kernel_now:
            kernel = f"{d.kernel_then} -> {d.kernel_now}"
        notes = [c.text() for c in d.checks if c.verdict != "unchanged"] or list(d.notes)
        rows.append(
            ci_summary.SummaryRow(
                name=d.name,
                verdict=d.verdict,
                kernel=kernel,
                ratio=deciding.ratio if deciding else None,
                limit=deciding.limit if deciding else None,
                note="; ".join(notes),
            )
        )
    headline = f"speed gate: {state.gate.summary()}"
    if state.gate.upgrade is not None:
        headline += f" ({state.gate.upgrade.headline(state.gate.decisions)})"
    try:
        written = ci_summary.write_step_summary(rows, headline)
    except ci_summary.StepSummaryError as exc:
        state.errors.append(str(exc))
        written = None
    if written is not None:
        state.messages.append(f"the gate's verdict was written to {written} (GITHUB_STEP_SUMMARY)")
    ci_summary.add_junit_properties(config, ci_summary.junit_properties(rows, headline))


def _record_baseline(config: pytest.Config, state: GateState, session: pytest.Session, measured: list) -> None:
    """Record this run's benchmarks, only when the run completed: an interrupted run (Ctrl-C, -x, a failing
    test) would leave a partial baseline, so it records nothing and says so."""
    from ..speed.baseline import BaselineError

    status = pytest.ExitCode(session.exitstatus) if isinstance(session.exitstatus, int) else session.exitstatus
    if status != pytest.ExitCode.OK or session.shouldstop or session.shouldfail:
        interrupted = status == pytest.ExitCode.INTERRUPTED
        why = "it was interrupted" if interrupted else f"it did not pass ({status.name})"
        if session.testsfailed:
            why += f": {session.testsfailed} test(s) failed"
        then = "Record again with a run that completes." if interrupted else "Fix the failure and record again."
        state.errors.append(
            f"not recording: this run did not complete ({why}); a partial baseline is never written, the "
            f"baseline folder is unchanged. {then}"
        )
        return
    if not measured:
        state.messages.append("no benchmark was measured in this run: nothing recorded")
        return
    try:
        device = _device(config)
        state.save_report = _store(config).save(
            measured,
            fields=_fields(device),
            fingerprint=device.fingerprint,
            versions=device.versions(),
            threshold=_setting(config, "lstmperf_threshold").value,
            provenance=provenance(config),
            header=benchmark_header(config),
            update=_saving(config) == "update",
            add_run=_saving(config) == "add-run",
        )
        if _xdist_active(config):
            state.messages.append("recorded under pytest-xdist: workers shared the machine while timing")
    except BaselineError as exc:
        state.errors.append(str(exc))


def _write_report(config: pytest.Config, state: GateState) -> None:
    report_dir = _setting(config, "lstmperf_report").value
    if not (report_dir and state.records):
        return
    from ..speed.report import write_report

    try:
        state.report_path = write_report(
            Path(report_dir),
            state.records,
            state.baseline.data["benchmarks"] if state.baseline else None,
            _device(config).describe(),
            state.gate,
        )
    except Exception as exc:
        state.errors.append(f"--lstmperf-report={report_dir}: could not write the report: {exc}")


STAT_REGRESSION = "speed-regression"
STAT_INCONCLUSIVE = "speed-inconclusive"


def _gate_outcome(config: pytest.Config, state: GateState) -> bool:
    """Whether the session fails; fills ``state.outcome`` (the last lines) and pytest's final-line counts."""
    tr = config.pluginmanager.get_plugin("terminalreporter")
    stats = getattr(tr, "stats", None)
    gate = state.gate
    failed = bool(state.errors)
    if gate is not None and gate.failed:
        failed = True
        if stats is not None:
            stats.setdefault(STAT_REGRESSION, []).extend(gate.failed)
    if gate is not None and gate.unsettled():
        accepted = _setting(config, "lstmperf_accept_inconclusive").value
        failed = failed or not accepted
        if stats is not None and (gate.inconclusive or not gate.compared):
            inconclusive: list[Any] = list(gate.inconclusive) or [gate]
            stats.setdefault(STAT_INCONCLUSIVE, []).extend(inconclusive)
    state.outcome = outcome_lines(config, state, failed)
    return failed


def _write_xdist_json(config: pytest.Config, target: Any, records: list[dict[str, Any]]) -> str:
    """pytest-benchmark writes no ``--benchmark-json`` under pytest-xdist (it disables itself there): write
    every worker's records into it, in pytest-benchmark's layout. ``target`` is a path (pytest-benchmark
    5.3 and later: written atomically) or the binary file pytest-benchmark opened (earlier versions)."""
    from ..speed.baseline import _atomic_write, bench_entry

    header = benchmark_header(config)
    data: dict[str, Any] = {
        "machine_info": header["machine_info"],
        "commit_info": header["commit_info"],
        "benchmarks": [bench_entry(r) for r in sorted(records, key=lambda r: r["fullname"])],
        "datetime": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "version": header["version"],
    }
    pytest_benchmark_update_json(config, data["benchmarks"], data)
    payload = json.dumps(data, indent=1, default=str) + "\n"
    if hasattr(target, "write"):
        target.write(payload.encode())
        target.flush()
        path = Path(target.name)
    else:
        path = Path(target)
        path.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(path, payload)
    devices = sorted({str(r["extra_info"].get("device", "?")) for r in records})
    return (
        f"--benchmark-json: {len(records)} benchmarks of every pytest-xdist worker written to {path} "
        f"(devices: {', '.join(devices)})"
    )


# ----------------------------------------------------------------------------------------- terminal
@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> Any:
    """The speed section after every other summary (pytest-benchmark's tables, pytest's short summary), so
    that the gate's verdict is the last thing printed before pytest's final line."""
    try:
        return (yield)
    finally:
        if not _is_worker(config) and STATE_KEY in config.stash:
            print_speed_section(terminalreporter, config, _state(config), lambda: _device(config).describe())
