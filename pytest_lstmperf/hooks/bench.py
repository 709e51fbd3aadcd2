"""The speed gate: benchmarks through pytest-benchmark, baselines keyed by device, and the regression verdict.

Hooks and fixture wiring only; the work lives in :mod:`.timing` (measuring), :mod:`.baseline` (the store),
:mod:`.regression` (the decision), :mod:`.shapes` (what is measured) and :mod:`.report` (the page).

* ``lstmperf_benchmark`` (fixture) wraps pytest-benchmark's ``benchmark``: it prepares a path, checks the
  kernel it ran against the path's claim (failing at once on a mismatch), times the call with
  ``benchmark.pedantic`` (a synchronising callable, bounded rounds), measures device time, SM clock and
  FLOP/s into ``extra_info``, and attaches a record to the test report (so pytest-xdist brings it to the
  controller).
* ``--benchmark-compare`` with no argument is pointed at this device's baseline file before
  pytest-benchmark loads it, so its comparison table and ``--benchmark-compare-fail`` work as usual; the
  gate then compares raw samples (:mod:`.regression`) and fails the session in ``pytest_sessionfinish``.
* ``--lstmperf-save-baseline`` records missing entries, ``--lstmperf-update-baseline`` replaces them.
* ``@pytest.mark.lstmperf`` on a test using pytest-benchmark's own ``benchmark`` fixture: that test's
  ``benchmark(fn, *args, **kwargs)`` is measured as ``lstmperf_benchmark(fn)`` is (:class:`MarkedBenchmark`);
  unmarked ``benchmark`` tests are left to pytest-benchmark.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import shlex
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from .. import options
from ..options import Setting, add_setting, parse_bool, parse_choice, parse_float

if TYPE_CHECKING:
    from ..device import DeviceInfo
    from ..paths import ExecutionPath
    from ..speed.baseline import Baseline, SaveReport
    from ..speed.regression import Decision, GateResult
    from ..speed.shapes import BenchShape
    from ..speed.timing import ClockSampler

RECORD_KEY = "lstmperf_bench"
BENCH_FIXTURE = "lstmperf_benchmark"
#: the marker that makes a plain ``benchmark`` test an lstmperf benchmark
BENCH_MARKER = "lstmperf"
GENERIC_FAMILIES = ("cuda-generic", "cpu-native")


def _parse_threshold(raw: str) -> float:
    value = parse_float()(raw)
    if not 1.0 < value < 100.0:
        raise ValueError(f"{raw!r} must be a ratio above 1.0 (e.g. 1.10: 10% slower counts)")
    return value


def _parse_pvalue(raw: str) -> float:
    value = parse_float(0.0, 1.0)(raw)
    if not 0.0 < value < 1.0:
        raise ValueError(f"{raw!r} must be strictly between 0 and 1 (e.g. 0.002)")
    return value


def _parse_dir(raw: str) -> str:
    return raw.strip()


SETTING_NAMES = [
    add_setting(s).name
    for s in (
        Setting(
            "lstmperf_bench_set",
            "--lstmperf-bench-set",
            "PYTEST_LSTMPERF_BENCH_SET",
            "lstmperf_bench_set",
            "gate",
            parse_choice(("gate", "thorough")),
            "benchmark shapes: gate (quick, for merge gating) or thorough (DeepBench shapes, batch, hidden "
            "and sequence-length sweeps)",
            "SET",
        ),
        Setting(
            "lstmperf_save_baseline",
            "--lstmperf-save-baseline",
            "PYTEST_LSTMPERF_SAVE_BASELINE",
            "lstmperf_save_baseline",
            "false",
            parse_bool,
            "record this run's benchmarks missing from this device's baseline (existing entries are kept)",
        ),
        Setting(
            "lstmperf_update_baseline",
            "--lstmperf-update-baseline",
            "PYTEST_LSTMPERF_UPDATE_BASELINE",
            "lstmperf_update_baseline",
            "false",
            parse_bool,
            "record this run's benchmarks into this device's baseline, replacing existing entries",
        ),
        Setting(
            "lstmperf_add_baseline_run",
            "--lstmperf-add-baseline-run",
            "PYTEST_LSTMPERF_ADD_BASELINE_RUN",
            "lstmperf_add_baseline_run",
            "false",
            parse_bool,
            "add this run to the recorded baseline's noise band (its per-call and device medians and host counters) "
            "without replacing any entry: record with --lstmperf-save-baseline, then add 2 or more runs, so that "
            "the per-call threshold covers how much clean runs differ from each other",
        ),
        Setting(
            "lstmperf_accept_inconclusive",
            "--lstmperf-accept-inconclusive",
            "PYTEST_LSTMPERF_ACCEPT_INCONCLUSIVE",
            "lstmperf_accept_inconclusive",
            "false",
            parse_bool,
            "let --benchmark-compare pass when benchmarks are inconclusive (too few usable samples, not timed) or "
            "nothing was compared (every benchmark skipped or deselected); by default such a run fails",
        ),
        Setting(
            "lstmperf_baselines",
            "--lstmperf-baselines",
            "PYTEST_LSTMPERF_BASELINES",
            "lstmperf_baselines",
            "",
            _parse_dir,
            "folder of the device-keyed baselines (default: baselines/ at the rootdir)",
            "DIR",
        ),
        Setting(
            "lstmperf_threshold",
            "--lstmperf-threshold",
            "PYTEST_LSTMPERF_THRESHOLD",
            "lstmperf_threshold",
            "1.10",
            _parse_threshold,
            "minimum slowdown that counts as a regression, as a ratio of medians (marker lstmperf_threshold "
            "overrides per test)",
            "RATIO",
        ),
        Setting(
            "lstmperf_pvalue",
            "--lstmperf-pvalue",
            "PYTEST_LSTMPERF_PVALUE",
            "lstmperf_pvalue",
            "0.002",
            _parse_pvalue,
            "level of the one-sided Mann-Whitney U test on raw samples",
            "P",
        ),
        Setting(
            "lstmperf_drift",
            "--lstmperf-drift",
            "PYTEST_LSTMPERF_DRIFT",
            "lstmperf_drift",
            "off",
            parse_choice(("probe", "off")),
            "machine-drift correction of per-call decisions: probe (divide the host part of each time by the "
            "now/baseline ratio of a fixed host-bound probe timed between the benchmark's rounds) or off",
            "MODE",
        ),
        Setting(
            "lstmperf_metric",
            "--lstmperf-metric",
            "PYTEST_LSTMPERF_METRIC",
            "lstmperf_metric",
            "auto",
            parse_choice(("auto", "device", "per-call")),
            "what the speed gate compares: auto (device time from CUDA-graph replay where both runs have it, "
            "else the per-call time), device, or per-call (host overhead included)",
            "METRIC",
        ),
        Setting(
            "lstmperf_report",
            "--lstmperf-report",
            "PYTEST_LSTMPERF_REPORT",
            "lstmperf_report",
            "",
            _parse_dir,
            "write a markdown and HTML speed report with PNG plots into DIR",
            "DIR",
        ),
    )
]
FLAGS = (
    "lstmperf_save_baseline",
    "lstmperf_update_baseline",
    "lstmperf_add_baseline_run",
    "lstmperf_accept_inconclusive",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser, names=[n for n in SETTING_NAMES if n not in FLAGS])
    group = parser.getgroup("lstmperf")
    for name in FLAGS:
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


# ------------------------------------------------------------------------------------------------ state
@dataclass
class GateState:
    compare: str | None = None  # "device" (no argument), "file" (an lstmperf baseline named), None
    compare_requested: bool = False
    baseline: Baseline | None = None
    records: list[dict[str, Any]] = field(default_factory=list)
    save_report: SaveReport | None = None
    gate: GateResult | None = None
    messages: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    sampler: ClockSampler | None = None
    report_path: Path | None = None
    device: DeviceInfo | None = None
    deferred_compare: object = None  # --benchmark-compare's value, until collection shows lstmperf benchmarks
    outcome: list[str] = field(default_factory=list)  # the gate's last lines, printed after every other summary


STATE_KEY = pytest.StashKey[GateState]()


def _state(config: pytest.Config) -> GateState:
    if STATE_KEY not in config.stash:
        config.stash[STATE_KEY] = GateState()
    return config.stash[STATE_KEY]


def _setting(config: pytest.Config, name: str) -> options.Resolved:
    return options.resolve(config, name)


def bench_set(config: pytest.Config) -> str:
    """The selected benchmark set: ``gate`` (quick) or ``thorough``."""
    return str(_setting(config, "lstmperf_bench_set").value)


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
    from ..speed.baseline import comparable_fields

    return comparable_fields(device.kind, device.fingerprint)


def _baselines_dir(config: pytest.Config) -> Path:
    raw = _setting(config, "lstmperf_baselines").value
    return Path(raw) if raw else Path(config.rootpath) / "baselines"


def record_command(config: pytest.Config, flag: str = "--lstmperf-save-baseline") -> str:
    args = [a for a in config.invocation_params.args if not str(a).startswith("--benchmark-compare")]
    args = [a for a in args if a not in ("--lstmperf-save-baseline", "--lstmperf-update-baseline")]
    return shlex.join(["pytest", *map(str, args), flag])


def _store(config: pytest.Config):
    from ..speed.baseline import BaselineStore

    return BaselineStore(_baselines_dir(config), record_hint=record_command(config))


# ------------------------------------------------------------------------------------------- configure
@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "lstmperf_threshold(ratio=None, pvalue=None): per-test regression threshold for the speed gate "
        "(ratio of medians above which a significant slowdown fails; p-value level of the rank test)",
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
    metric = _setting(config, "lstmperf_metric")
    if compare and metric.value == "device" and _device(config).kind != "cuda":
        raise pytest.UsageError(
            f"{metric.where()}: the device metric compares CUDA-graph replay times, which a "
            f"{_device(config).kind} run does not have (valid here: auto, per-call)"
        )
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


def pytest_collection_finish(session: pytest.Session) -> None:
    """A ``--benchmark-compare`` left to pytest-benchmark at configure time becomes the gate's once lstmperf
    benchmarks are collected; pytest-benchmark then reloads what it compares against."""
    config = session.config
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
        if candidate.suffix == ".json" or os.sep in str(compare):
            raise pytest.UsageError(
                f"--benchmark-compare={compare}: no such file ({candidate.resolve()}). Valid: an existing baseline "
                f"file, a pytest-benchmark run number or id from --benchmark-storage, or no value (this device's "
                f"baseline in {_baselines_dir(config)})"
            )
        return  # pytest-benchmark's own run number or id: its comparison, not the gate's
    try:
        baseline = load(candidate, record_command(config))
    except BaselineError as exc:
        if "without pytest-lstmperf's device key" in str(exc):
            return  # a plain pytest-benchmark file: pytest-benchmark compares, the gate does not
        raise pytest.UsageError(f"--benchmark-compare={compare}: {exc}") from None
    diff = differences(baseline.fields, _fields(_device(config)))
    if diff:
        raise pytest.UsageError(
            f"--benchmark-compare={compare}: refusing to compare against a baseline of another device: "
            f"{'; '.join(diff)}. Timings of different devices are not comparable; compare against this "
            f"device's baseline (--benchmark-compare with no argument) or record one with: "
            f"{record_command(config)}"
        )
    state.compare, state.baseline = "file", baseline


def _saving(config: pytest.Config) -> str | None:
    if _setting(config, "lstmperf_update_baseline").value:
        return "update"
    if _setting(config, "lstmperf_save_baseline").value:
        return "save"
    if _setting(config, "lstmperf_add_baseline_run").value:
        return "add-run"
    return None


# -------------------------------------------------------------------------------------- parametrisation
@dataclass(frozen=True)
class BenchCase:
    """One benchmark: a path, a shape and a mode (``forward`` or ``train``)."""

    path: str
    shape: BenchShape
    mode: str
    set_name: str

    @property
    def id(self) -> str:
        return f"{self.path}-{self.shape.id}"

    def __repr__(self) -> str:
        return self.id


def bench_params(config: pytest.Config, mode: str) -> list[Any]:
    """``pytest.param`` values for the benchmark suite: available paths x the set's shapes for ``mode``.

    Paths the device cannot run are kept as skipped parameters, so that the summary says why.
    """
    from ..speed.shapes import bench_set

    session = _session(config)
    set_name = _setting(config, "lstmperf_bench_set").value
    shapes = [s for s in bench_set(set_name, session.device.kind) if mode in s.modes]
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


def run_spec(path: ExecutionPath, spec: Any, mode: str) -> Any:
    """The spec a benchmark prepares: the shape's own, or its inference form for an inference-only path's
    forward benchmark (ONNX Runtime; the shape keeps its id, so one shape is timed on every path)."""
    if mode == "forward" and path.options.get("inference_only") and spec.training:
        return spec.replace(training=False)
    return spec


# ---------------------------------------------------------------------------------------------- fixture
class BenchRunner:
    """What ``lstmperf_benchmark`` gives a test: ``measure(case)``."""

    def __init__(self, benchmark: Any, request: pytest.FixtureRequest) -> None:
        self.benchmark = benchmark
        self.request = request
        self.config = request.config

    def measure(self, case: BenchCase) -> dict[str, Any]:
        from .. import paths as registry
        from ..model.case import make_case
        from ..speed.shapes import ROUNDS

        session = _session(self.config)
        device = session.device
        path = registry.get(case.path)
        self.request.node.user_properties.append(("lstmperf_path", path.name))
        reason = path.available(device)
        if reason:
            pytest.skip(f"{path.name}: {reason}")
        from ..device import shared_gpu

        shared = shared_gpu(device)
        if shared:
            pytest.skip(f"not timed: {shared}; a benchmark needs a GPU of its own (use -n auto or fewer workers)")
        spec = case.shape.spec
        thresholds = self._thresholds()
        phases = self.benchmark.extra_info.setdefault("phase_s", {})
        started = time.perf_counter()
        run = path.prepare(make_case(run_spec(path, spec, case.mode), session.seed), device)
        call = run.forward if case.mode == "forward" else run.train_step
        extra = self.benchmark.extra_info
        extra.update(
            path=path.name,
            framework=path.framework,
            device=device.name,
            mode=case.mode,
            shape=spec.short(),
            spec=spec.to_dict(),
            set=case.set_name,
            sweeps=list(case.shape.sweeps),
            expected_kernel=path.kernel,
            expected_precision=path.precision,
        )
        self.benchmark.group = f"{case.mode} {spec.short()}"
        phases["prepare"] = time.perf_counter() - started
        started = time.perf_counter()
        trace = run.trace_forward()
        phases["trace"] = time.perf_counter() - started
        extra.update(
            kernel=trace.family, precision=trace.precision, kernels=list(trace.kernels[:8]), ops=list(trace.ops[:16])
        )
        self.request.node.user_properties.append(("lstmperf_observed", f"{case.mode} {trace.family}/{trace.precision}"))
        mismatch = kernel_mismatch(path, trace)
        if mismatch:
            self._attach(extra, [], thresholds, failed="kernel")
            from ..session import Finding

            known = known_kernel_finding(path, trace)
            message = f"known finding on {path.name} ({spec.short()}): {known}" if known else mismatch
            finding = Finding(path.name, "known" if known else "kernel", spec.short(), message)
            self.request.node.user_properties.append(("lstmperf_finding", json.dumps(asdict(finding))))
            if known:
                pytest.xfail(f"{message} [{mismatch}]")
            pytest.fail(mismatch + _explanation(path, spec, device, trace), pytrace=False)

        plan = ROUNDS[case.set_name]

        def timed() -> None:
            call()
            run.synchronize()

        # a run whose kernels launch in another process (Keras's worker) measures its device time and
        # counts its host work there
        own_time, own_counts = getattr(run, "device_time", None), getattr(run, "host_counters", None)
        from ..speed import timing

        def dev_time(samples: int) -> timing.DeviceTime:
            if own_time is not None:
                return own_time(case.mode, samples)
            return timing.device_time(call, device.torch_device, samples)

        def counters() -> dict[str, Any]:
            return own_counts(case.mode) if own_counts is not None else timing.host_counters(call, device.torch_device)

        data = self._time(timed, plan, extra, dev_time, counters, thresholds)
        if data is None:
            return self._attach(extra, [], thresholds)
        flops = spec.flops_forward * (3 if case.mode == "train" else 1)  # backward ~ 2x forward
        started = time.perf_counter()
        self._flops(extra, flops, trace.precision if trace.precision != "unknown" else path.precision)
        phases["peak"] = time.perf_counter() - started
        return self._attach(extra, data, thresholds)

    def __call__(self, fn: Any, *, label: str = "call", flops: float | None = None) -> Any:
        """Benchmark a user's own callable ``fn()`` (a model's forward, a training step) the way the built-in
        benchmarks are measured: per-call time, device time, host counters, the observed kernel, run medians,
        a device-keyed baseline entry and the gate (``@pytest.mark.lstmperf_threshold`` honoured). ``fn``
        runs PyTorch work (a ``torch.nn.Module``, or Keras on the torch backend) and must not synchronise;
        the benchmark synchronises after each timed call. ``flops`` (per call), when given, adds achieved
        FLOP/s; none is made up otherwise. Returns what one call of ``fn`` returned."""
        from ..observation.torch_trace import torch_trace
        from ..speed import timing
        from ..speed.shapes import ROUNDS

        session = _session(self.config)
        device = session.device
        from ..device import shared_gpu

        shared = shared_gpu(device)
        if shared:
            pytest.skip(f"not timed: {shared}; a benchmark needs a GPU of its own (use -n auto or fewer workers)")
        thresholds = self._thresholds()
        sync = _synchronizer(device.torch_device)
        result = fn()
        sync()
        with torch_trace(device.torch_device, "forward") as traced:
            fn()
        trace = traced[0]
        extra = self.benchmark.extra_info
        extra.update(
            path="user",
            framework="torch",
            device=device.name,
            mode=label,
            shape="-",
            set=bench_set(self.config),
            kernel=trace.family,
            precision=trace.precision,
            kernels=list(trace.kernels[:8]),
            ops=list(trace.ops[:16]),
        )
        self.benchmark.group = f"user {label}"
        self.request.node.user_properties.append(("lstmperf_observed", f"{label} {trace.family}/{trace.precision}"))

        def timed() -> None:
            fn()
            sync()

        data = self._time(
            timed,
            ROUNDS[bench_set(self.config)],
            extra,
            lambda samples: timing.device_time(fn, device.torch_device, samples),
            lambda: timing.host_counters(fn, device.torch_device),
            thresholds,
        )
        if data and flops:
            self._flops(extra, float(flops), trace.precision)
        self._attach(extra, data or [], thresholds)
        return result

    def _time(
        self,
        timed: Any,
        plan: Any,
        extra: dict[str, Any],
        dev_time: Any,
        counters: Any,
        thresholds: dict[str, float],
    ) -> list[float] | None:
        """Time ``timed`` (which synchronises) in rounds, then device time (``dev_time(samples)``), the host
        counters (``counters()``, one untimed call, no tracing during the rounds), the run medians and, when a
        baseline entry is compared and the first figures look like a regression, a second measurement.
        Fills ``extra``; returns the per-call samples, or None under ``--benchmark-disable``."""
        from ..speed import timing

        phases = extra.setdefault("phase_s", {})
        started = time.perf_counter()
        device = _session(self.config).device
        clock = timing.benchmark_timer(self.config)
        extra["timer"] = f"{getattr(clock, '__module__', None) or 'time'}.{getattr(clock, '__name__', repr(clock))}"
        estimate = timing.estimate_call(timed, plan.warmup, clock)
        rounds = timing.RoundPlan(plan.warmup, plan.min_rounds, plan.max_rounds, plan.target_s).rounds_for(estimate)
        sampler = _sampler(self.config, device)
        data: list[float] = []
        windows: list[tuple[float, float]] = []
        user_disabled = self.config.getoption("benchmark_disable", False) and not self.config.getoption(
            "benchmark_enable", False
        )
        # the drift probe runs only when asked for: it is work between every two rounds
        probe = (
            timing.DriftProbe(device.torch_device, clock)
            if _setting(self.config, "lstmperf_drift").value == "probe"
            else None
        )
        between = probe.sample if probe is not None else None
        if self.benchmark.enabled:
            starts: list[float] = []

            def mark_round() -> None:
                if between is not None:
                    between()  # untimed: how fast the host is right now
                starts.append(time.perf_counter())

            self.benchmark.pedantic(timed, setup=mark_round, rounds=rounds, warmup_rounds=1, iterations=1)
            data = list(self.benchmark.stats.stats.data)
            ends = [*starts[-rounds:][1:], time.perf_counter()]
            windows = list(zip(starts[-rounds:], ends, strict=True))
        elif user_disabled:
            self.benchmark.pedantic(timed)  # --benchmark-disable: run once, as a test
            return None
        else:  # pytest-benchmark disabled itself (pytest-xdist): time the same way ourselves
            self.benchmark.pedantic(lambda: None)
            data, windows = timing.time_rounds(timed, rounds, clock, between=between)
            extra["timed_by"] = "pytest-lstmperf (pytest-benchmark is disabled under pytest-xdist)"
        extra["rounds"] = len(data)
        if probe is not None:
            extra["drift_probe"] = probe.samples[-len(data) :] if data else []
        self._clock(extra, sampler, windows)
        phases["rounds"], started = time.perf_counter() - started, time.perf_counter()
        self._device_time(extra, dev_time(plan.device_samples), data)
        phases["device_time"], started = time.perf_counter() - started, time.perf_counter()
        self._counters(extra, counters)
        phases["counters"], started = time.perf_counter() - started, time.perf_counter()
        extra["run_medians"] = timing.batch_medians(data)
        self._remeasure(extra, data, thresholds, timed, plan, rounds, clock, dev_time)
        phases["remeasure"] = time.perf_counter() - started
        return data

    @staticmethod
    def _device_time(extra: dict[str, Any], dev: Any, data: list[float]) -> None:
        from ..speed import timing

        median = sorted(data)[len(data) // 2] if data else None
        extra.update(
            time_per_call_s=median,
            device_time_s=dev.median,
            device_time_method=dev.method,
            device_time_note=dev.note,
            device_samples=list(dev.samples),
            device_run_medians=timing.batch_medians(dev.samples),
            host_overhead=timing.host_overhead(median, dev.median),
        )

    @staticmethod
    def _counters(extra: dict[str, Any], counters: Any) -> None:
        try:
            counted = counters()
        except Exception as exc:  # counting must never cost the benchmark its timings
            extra["host_counters_note"] = f"not counted: {type(exc).__name__}: {str(exc)[:200]}"
            return
        note = counted.pop("note", None) if isinstance(counted, dict) else None
        if counted:
            extra["host_counters"] = counted
        if note:
            extra["host_counters_note"] = note

    def _flops(self, extra: dict[str, Any], flops: float, precision: str) -> None:
        from ..speed import timing

        busy = extra.get("device_time_s") or extra.get("time_per_call_s")
        peak = timing.measured_peak_flops(_session(self.config).device.torch_device, precision)
        achieved = flops / busy if busy else None
        extra.update(
            flops=flops,
            flops_per_s=achieved,
            peak_flops=peak,
            peak_fraction=achieved / peak if achieved and peak else None,
        )

    def _baseline_entry(self) -> dict[str, Any] | None:
        """This benchmark's entry in the baseline the gate compares against (read-only), else None."""
        state = _state(self.config)
        if state.baseline is None:
            return None
        return state.baseline.entries.get(self.request.node.nodeid)

    def _remeasure(
        self,
        extra: dict[str, Any],
        data: list[float],
        thresholds: dict[str, float],
        timed: Any,
        plan: Any,
        rounds: int,
        clock: Any,
        dev_time: Any,
    ) -> None:
        """When a baseline is compared and the first measurement's ratio of medians is over the threshold,
        measure again (fresh warm-up, twice the rounds and device samples) and record both in
        ``extra["remeasured"]``: the first figures alone never fail the build."""
        from ..speed import timing
        from ..speed.regression import pick_samples

        entry = self._baseline_entry()
        if entry is None or not data:
            return
        metric = _setting(self.config, "lstmperf_metric").value
        base_extra = entry.get("extra_info", {})
        base_data = entry.get("stats", {}).get("data") or []
        used, base, now, _ = pick_samples(metric, base_extra, extra, base_data, data)
        if used == "per-call" and base_extra.get("timer", "time.perf_counter") != extra.get("timer"):
            return  # another clock: not comparable, and the gate says so
        limit = thresholds.get("ratio", _setting(self.config, "lstmperf_threshold").value)
        # device samples move by a few percent between runs: a device ratio half-way to the threshold is
        # already worth a second look; per-call times are noisier, and are looked at again past the threshold
        trigger = 1.0 + (limit - 1.0) / 2 if used == "device" else limit
        first = _ratio(base, now)
        if first is None or first <= trigger:
            return
        timing.estimate_call(timed, plan.warmup, clock)
        data2, _ = timing.time_rounds(timed, 2 * rounds, clock)
        dev2 = dev_time(2 * plan.device_samples)
        again = {**extra, "device_samples": list(dev2.samples), "device_time_method": dev2.method}
        _, base, now2, _ = pick_samples(metric, base_extra, again, base_data, data2)
        second = _ratio(base, now2)
        extra["remeasured"] = {
            "confirmed": second is not None and second > limit,
            "first_ratio": first,
            "second_ratio": second,
            "metric": used,
            "threshold": limit,
            "trigger": trigger,
            "data": data2,
            "device_samples": list(dev2.samples),
            "device_time_method": dev2.method,
        }

    def _clock(self, extra: dict[str, Any], sampler: ClockSampler | None, windows: list[tuple[float, float]]) -> None:
        if sampler is None or not sampler.active:
            extra.update(clock_source="none", clock_note=sampler.reason if sampler else "")
            return
        clocks = sampler.round_clocks(windows)
        flags = sampler.throttled(windows)
        extra.update(
            clock_source=sampler.source,
            sm_clock_mhz=clocks,
            sm_clock_max_mhz=sampler.max_mhz,
            throttled=flags,
            throttled_rounds=sum(flags),
        )

    def _thresholds(self) -> dict[str, float]:
        marker = self.request.node.get_closest_marker("lstmperf_threshold")
        if marker is None:
            return {}
        out: dict[str, float] = {}
        ratio = marker.kwargs.get("ratio", marker.args[0] if marker.args else None)
        pvalue = marker.kwargs.get("pvalue", marker.args[1] if len(marker.args) > 1 else None)
        try:
            if ratio is not None:
                out["ratio"] = _parse_threshold(str(ratio))
            if pvalue is not None:
                out["pvalue"] = _parse_pvalue(str(pvalue))
        except ValueError as exc:
            pytest.fail(f"@pytest.mark.lstmperf_threshold: {exc}", pytrace=False)
        return out

    def _attach(
        self, extra: dict[str, Any], data: list[float], thresholds: dict[str, float], failed: str = ""
    ) -> dict[str, Any]:
        node = self.request.node
        callspec = getattr(node, "callspec", None)
        record = {
            "fullname": node.nodeid,
            "name": node.name,
            "group": self.benchmark.group,
            "param": callspec.id if callspec else None,
            "params": {k: repr(v) for k, v in callspec.params.items()} if callspec else None,
            "extra_info": _plain(extra),
            "options": {"rounds": len(data), "warmup": "estimate + 1 round", "timer": "perf_counter"},
            "data": [float(x) for x in data],
            "iterations": 1,
            "thresholds": thresholds,
            "failed": failed,
        }
        node.user_properties.append((RECORD_KEY, record))
        return record


def _ratio(base: Any, now: Any) -> float | None:
    import statistics

    if not base or not now:
        return None
    then = statistics.median(base)
    return statistics.median(now) / then if then > 0 else None


def _synchronizer(torch_device: str) -> Any:
    if not torch_device.startswith("cuda"):
        return lambda: None
    import torch

    return lambda: torch.cuda.synchronize(torch_device)


def kernel_mismatch(path: ExecutionPath, trace: Any) -> str:
    """A message when the observed kernel family or precision is not what the path claims, else ''.

    fp32 and tf32 count as one precision: TF32 is inferred from GEMM kernel names (see torch_trace.py), which a
    cuDNN RNN kernel does not always show; the equivalence suite's tolerances tell them apart.
    """
    from ..speed.regression import same_kernel

    expected = f"{path.kernel}/{path.precision}"
    observed = f"{trace.family}/{trace.precision}"
    if same_kernel(expected, observed):
        return ""
    kernels = ", ".join(k[:90] for k in trace.kernels[:6]) or "-"
    ops = ", ".join(trace.ops[:10]) or "-"
    return (
        f"{path.name}: expected kernel {expected}, observed {observed} (ops seen: {ops}; GPU kernels seen: {kernels})"
    )


def known_kernel_finding(path: ExecutionPath, trace: Any) -> str | None:
    """The documented upstream behaviour that explains a kernel mismatch, else None: every differing part
    must be explained by a finding of ``pytest_lstmperf.observation.claims`` (the one table the equivalence suites
    read too); on versions other than it was seen with, the text says it was re-confirmed."""
    from ..observation.claims import current_versions, explain_trace
    from ..speed.regression import same_kernel

    found = explain_trace(
        path,
        (path.kernel, path.precision),
        trace,
        lambda claimed, seen: same_kernel(f"{path.kernel}/{claimed}", f"{path.kernel}/{seen}"),
    )
    if not found:
        return None
    versions = current_versions(path.framework)
    return "; ".join(f.describe(versions) for f in found)


def _explanation(path: ExecutionPath, spec: Any, device: Any, trace: Any) -> str:
    """The explainer's prediction and reasons (``observation.explain``), when it is there and can judge."""
    try:
        from ..observation.explain import explain
    except ImportError:
        return ""
    framework = "torch" if path.framework == "torch" else path.framework
    try:
        verdict = explain(spec, framework, device)  # the DeviceInfo: its compute capability and cuDNN version
        text = "\nexplainer: " + verdict.describe()
        autocast = path.options.get("autocast")
        if autocast:
            text += (
                f"\n  note: {path.name} runs under torch.autocast(dtype={autocast}); the prediction is for the "
                f"layer's own dtype ({spec.dtype})"
            )
        return text
    except Exception as exc:
        return f"\nexplainer: cannot judge {spec.short()}: {type(exc).__name__}: {exc}"


def _plain(value: Any) -> Any:
    """JSON/execnet-safe copy: dicts, lists, str, int, float, bool, None."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def _sampler(config: pytest.Config, device: DeviceInfo) -> ClockSampler | None:
    state = _state(config)
    if state.sampler is None:
        from ..speed.timing import ClockSampler

        state.sampler = ClockSampler(device.torch_device).start()
    return state.sampler


@pytest.fixture
def lstmperf_benchmark(benchmark: Any, request: pytest.FixtureRequest, lstmperf: Any) -> BenchRunner:
    """Measure one :class:`BenchCase` through pytest-benchmark's ``benchmark`` fixture."""
    return BenchRunner(benchmark, request)


class MarkedBenchmark:
    """pytest-benchmark's ``benchmark`` in a test marked ``@pytest.mark.lstmperf``: ``benchmark(fn, *args,
    **kwargs)`` is measured by :meth:`BenchRunner.__call__` (one record, baseline entry and gate verdict like
    ``lstmperf_benchmark(fn)``); every other attribute (``extra_info``, ``group``, ...) is pytest-benchmark's."""

    def __init__(self, benchmark: Any, runner: BenchRunner, label: str, flops: float | None) -> None:
        object.__setattr__(self, "_parts", (benchmark, runner, label, flops))

    def __call__(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from functools import partial

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


def _marked_options(item: pytest.Item) -> tuple[str, float | None]:
    """``(label, flops)`` of ``@pytest.mark.lstmperf``, or a test failure naming what is wrong."""
    marker = item.get_closest_marker(BENCH_MARKER)
    kwargs = dict(marker.kwargs) if marker is not None else {}
    label = kwargs.pop("label", marker.args[0] if marker is not None and marker.args else "call")
    flops = kwargs.pop("flops", None)
    problem = ""
    if kwargs or (marker is not None and len(marker.args) > 1):
        problem = f"unknown arguments {sorted(kwargs) or list(marker.args[1:])} (valid: label, flops=)"
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
    funcargs["benchmark"] = MarkedBenchmark(plain, funcargs[BENCH_FIXTURE], label, flops)
    try:
        return (yield)
    finally:
        funcargs["benchmark"] = plain


def _session(config: pytest.Config) -> Any:
    """The run's LstmPerfSession, created from the settings if no hook has created it yet."""
    from ..session import SESSION_KEY, LstmPerfSession

    if SESSION_KEY not in config.stash:
        config.stash[SESSION_KEY] = LstmPerfSession.from_config(config)
    return config.stash[SESSION_KEY]


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
    state = config.stash.get(STATE_KEY, None)
    if state is not None and state.sampler is not None:
        state.sampler.stop()


# ----------------------------------------------------------------------------------- pytest-benchmark
def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict[str, Any]) -> None:
    if not _uses_lstmperf(config):
        return  # another project's benchmarks: no device resolution (no torch import), no lstmperf section
    try:
        device = _device(config)
    except pytest.UsageError:
        return
    from ..speed.baseline import device_key

    machine_info["lstmperf"] = {"device_key": device_key(_fields(device)), "fingerprint": dict(device.fingerprint)}


def pytest_benchmark_update_json(config: pytest.Config, benchmarks: Any, output_json: dict[str, Any]) -> None:
    if not _uses_lstmperf(config):
        return
    try:
        device = _device(config)
    except pytest.UsageError:
        return
    from ..speed.baseline import FORMAT, device_key

    fields = _fields(device)
    output_json["lstmperf"] = {
        "format": FORMAT,
        "device_key": device_key(fields),
        "comparable": fields,
        "fingerprint": dict(device.fingerprint),
        "provenance": provenance(config),
    }


# -------------------------------------------------------------------------------------------- finish
def provenance(config: pytest.Config) -> dict[str, Any]:
    commit, dirty = "unknown", None
    try:
        root = str(config.rootpath)
        commit = (
            subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or "unknown"
        )
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        )
        dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        pass
    return {
        "commit": commit,
        "dirty": dirty,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": platform.node(),
        "python": platform.python_version(),
        "command": shlex.join(["pytest", *map(str, config.invocation_params.args)]),
    }


def _header(config: pytest.Config) -> dict[str, Any]:
    import pytest_benchmark

    machine_info = config.hook.pytest_benchmark_generate_machine_info(config=config)
    config.hook.pytest_benchmark_update_machine_info(config=config, machine_info=machine_info)
    commit_info = config.hook.pytest_benchmark_generate_commit_info(config=config)
    config.hook.pytest_benchmark_update_commit_info(config=config, commit_info=commit_info)
    return {"machine_info": machine_info, "commit_info": commit_info, "version": pytest_benchmark.__version__}


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
        state.gate = run_gate(config, state)
    _write_report(config, state)
    failed = _gate_outcome(config, state)
    if failed and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _record_baseline(config: pytest.Config, state: GateState, session: pytest.Session, measured: list) -> None:
    """Record this run's benchmarks, only when the run completed: an interrupted run (Ctrl-C, -x, a failing
    test) would leave a partial baseline, so it records nothing and says so."""
    from ..speed.baseline import BaselineError

    status = pytest.ExitCode(session.exitstatus) if isinstance(session.exitstatus, int) else session.exitstatus
    if status != pytest.ExitCode.OK or session.shouldstop or session.shouldfail:
        why = "it was interrupted" if status == pytest.ExitCode.INTERRUPTED else f"it did not pass ({status.name})"
        if session.testsfailed:
            why += f": {session.testsfailed} test(s) failed"
        state.errors.append(
            f"not recording: this run did not complete ({why}); a partial baseline is never written, the "
            f"baseline folder is unchanged. Fix the failure and record again."
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
            provenance=provenance(config),
            header=_header(config),
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
            stats.setdefault(STAT_INCONCLUSIVE, []).extend(gate.inconclusive or [gate])
    state.outcome = _outcome_lines(config, state, failed)
    return failed


def _outcome_lines(config: pytest.Config, state: GateState, failed: bool) -> list[str]:
    gate = state.gate
    if gate is None:
        return []
    accept = _setting(config, "lstmperf_accept_inconclusive")
    lines = []
    if gate.failed:
        kinds = sorted({d.verdict for d in gate.failed})
        lines.append(
            f"SPEED GATE FAILED: {len(gate.failed)} benchmark(s) {'/'.join(kinds)}. If the change is intended, "
            f"record the new numbers with: {record_command(config, '--lstmperf-update-baseline')}"
        )
    for problem in gate.unsettled():
        if accept.value:
            lines.append(f"speed gate: {problem}, accepted ({accept.where()})")
        else:
            lines.append(
                f"SPEED GATE NOT PASSED: {problem}; this is not a pass. Accept it with "
                f"--lstmperf-accept-inconclusive (env PYTEST_LSTMPERF_ACCEPT_INCONCLUSIVE=1)"
            )
    if not failed and not gate.failed:
        lines.append(f"speed gate passed: {gate.compared} benchmark(s) compared, none slower")
    return lines


def _write_xdist_json(config: pytest.Config, target: Any, records: list[dict[str, Any]]) -> str:
    """pytest-benchmark writes no ``--benchmark-json`` under pytest-xdist (it disables itself there): write
    every worker's records into it, in pytest-benchmark's layout. ``target`` is a path (pytest-benchmark
    5.3 and later: written atomically) or the binary file pytest-benchmark opened (earlier versions)."""
    from ..speed.baseline import _atomic_write, bench_entry

    header = _header(config)
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


@dataclass(frozen=True)
class GateKnobs:
    """The settings one gate run decides with."""

    metric: str
    ratio: float
    pvalue: float
    probe: bool
    explicit_ratio: bool = False  # the threshold was given (option, env, ini): device time uses it as it is
    pooled_spread: float | None = None  # the median per-call noise band of the baseline's entries
    pooled_from: int = 0


def run_gate(config: pytest.Config, state: GateState) -> GateResult:
    """Every record against the baseline; baseline entries this run did not measure are not-run or path-lost."""
    from ..session import SESSION_KEY
    from ..speed.regression import Decision, GateResult

    assert state.baseline is not None
    from ..speed.regression import pooled_spread

    pooled, pooled_from = pooled_spread(state.baseline.entries.values())
    knobs = GateKnobs(
        metric=_setting(config, "lstmperf_metric").value,
        ratio=_setting(config, "lstmperf_threshold").value,
        pvalue=_setting(config, "lstmperf_pvalue").value,
        probe=_setting(config, "lstmperf_drift").value == "probe",
        explicit_ratio=_setting(config, "lstmperf_threshold").source != "default",
        pooled_spread=pooled,
        pooled_from=pooled_from,
    )
    entries = state.baseline.entries
    session = config.stash.get(SESSION_KEY, None)
    unavailable = session.unavailable if session is not None else {}
    decisions = [decide_record(record, entries.get(record["fullname"]), knobs) for record in state.records]
    seen = {record["fullname"] for record in state.records}
    for name, entry in entries.items():
        if name in seen:
            continue
        path = entry.get("extra_info", {}).get("path")
        if path in unavailable:
            decisions.append(Decision(name, "path-lost", notes=(f"{path} is unavailable now: {unavailable[path]}",)))
        else:
            decisions.append(Decision(name, "not-run"))
    return GateResult(decisions)


def _kernel_text(extra: dict[str, Any]) -> str:
    return f"{extra.get('kernel', '')}/{extra.get('precision', '')}" if extra.get("kernel") else ""


def decide_record(record: dict[str, Any], entry: dict[str, Any] | None, knobs: GateKnobs) -> Decision:
    """One benchmark: device time (where both sides have it), per-call time against the baseline's noise
    band, and the host counters; the most severe outcome is the verdict (``regression.combine``)."""
    from dataclasses import replace

    from ..speed.regression import Decision, Thresholds, combine, drift_ratio, events_host_bound

    name, extra = record["fullname"], record["extra_info"]
    kernels = {"kernel_now": _kernel_text(extra)}
    if entry is None:
        return Decision(name, "new", n_now=len(record["data"]), **kernels)
    bextra = entry.get("extra_info", {})
    kernels["kernel_then"] = _kernel_text(bextra)
    if record.get("failed") == "kernel":
        return Decision(name, "kernel-changed", notes=("kernel differs from the path's claim; not timed",), **kernels)
    now_data, now_device, remeasured = _current_samples(record)
    if not now_data:
        why = "not timed in this run (--benchmark-disable, or the test stopped before timing): nothing compared"
        return Decision(name, "inconclusive", notes=(why,), **kernels)
    limits = Thresholds(
        ratio=record.get("thresholds", {}).get("ratio", knobs.ratio),
        pvalue=record.get("thresholds", {}).get("pvalue", knobs.pvalue),
    )
    parts = []
    same_method = bextra.get("device_time_method") == extra.get("device_time_method")
    has_device = _graph_samples(bextra) and bool(now_device) and same_method
    per_call_limit, per_call_notes = _per_call_threshold(entry, limits.ratio, knobs)
    if knobs.metric == "device" or (knobs.metric == "auto" and has_device):
        explicit = knobs.explicit_ratio or "ratio" in record.get("thresholds", {})
        host_bound = per_call_limit if has_device and (events_host_bound(bextra) or events_host_bound(extra)) else None
        parts.append(
            _device_decision(name, bextra, now_device if has_device else [], limits, kernels, explicit, host_bound)
        )
    if knobs.metric in ("auto", "per-call"):
        parts.append(
            _per_call_decision(name, entry, extra, now_data, replace(limits, ratio=per_call_limit), knobs, kernels)
        )
        parts[-1] = replace(parts[-1], notes=(*parts[-1].notes, *per_call_notes))
    host, host_check = _host_decision(name, bextra, extra)
    decision = combine([*parts, *host], [host_check])
    notes = decision.notes
    if remeasured is not None:
        notes = (*notes, _remeasure_note(decision.failed, remeasured))
    return replace(decision, per_call_ratio=drift_ratio(entry["stats"]["data"], now_data), notes=notes)


def _graph_samples(extra: dict[str, Any]) -> bool:
    """Device-time samples the gate can compare: CUDA-graph replays, or batched CUDA events where capture
    fails (``regression.DEVICE_METHODS``)."""
    from ..speed.regression import DEVICE_METHODS

    return extra.get("device_time_method") in DEVICE_METHODS and len(extra.get("device_samples") or []) > 0


def _current_samples(record: dict[str, Any]) -> tuple[list[float], list[float], dict[str, Any] | None]:
    """(per-call samples, device samples, the re-measurement): a suspect the measurement re-measured is
    decided on the re-measured samples."""
    extra = record["extra_info"]
    device = list(extra.get("device_samples") or []) if _graph_samples(extra) else []
    again = extra.get("remeasured")
    if isinstance(again, dict) and again.get("data"):
        return [float(x) for x in again["data"]], list(again.get("device_samples") or device), again
    return [float(x) for x in record["data"]], device, None


def _remeasure_note(failed: bool, again: dict[str, Any]) -> str:
    first = again.get("first_ratio")
    first_text = f" ({first:.3f}x)" if isinstance(first, (int, float)) else ""
    if failed:
        return f"confirmed by re-measurement: the first measurement{first_text} and the re-measurement both fail"
    return f"not confirmed by re-measurement: the first measurement{first_text} was noise"


def _device_decision(
    name: str,
    bextra: dict[str, Any],
    now_device: list[float],
    limits: Any,
    kernels: dict[str, str],
    explicit: bool = False,
    host_bound: float | None = None,
) -> Decision:
    """Device time against the threshold; with the default threshold and a baseline recorded from several
    runs, against ``regression.device_threshold`` (tighter where the device time was steady between runs).
    ``host_bound`` (the per-call threshold) applies instead where the device time came from CUDA events that
    measured the host's launch rate (``regression.events_host_bound``): such a figure moves with the host."""
    from dataclasses import replace

    from ..speed.regression import HOST_BOUND_EVENTS, compare_samples, device_threshold

    base = bextra.get("device_samples") or [] if now_device else []
    notes: tuple[str, ...] = ()
    if host_bound is not None and not explicit:
        limits = replace(limits, ratio=max(limits.ratio, host_bound))
        notes = (
            f"device time from CUDA events is host-bound here (at least {HOST_BOUND_EVENTS:.0%} of the time per "
            f"call: the GPU waited for launches), so it is held to the per-call threshold {limits.ratio:.3f}; "
            "a device-side slowdown smaller than that is not resolved on this benchmark",
        )
    elif not explicit:
        ratio, why = device_threshold(limits.ratio, bextra.get("noise_band"))
        limits = replace(limits, ratio=ratio)
        notes = (why,) if why else ()
    decision = compare_samples(name, base, now_device, limits, **kernels)
    if not now_device:
        notes = (*notes, "no device time of one method on both sides")
    return replace(decision, metric="device", notes=(*decision.notes, *notes))


def _per_call_decision(
    name: str,
    entry: dict[str, Any],
    extra: dict[str, Any],
    now_data: list[float],
    limits: Any,
    knobs: GateKnobs,
    kernels: dict[str, str],
) -> Decision:
    """Per-call time (host overhead included) against max(threshold, 1 + k x the baseline's noise band)."""
    from dataclasses import replace

    from ..speed.regression import compare_samples, drift_ratio

    bextra = entry.get("extra_info", {})
    base_data: list[float] = list(entry["stats"]["data"])
    notes: list[str] = []
    timers = (bextra.get("timer", "time.perf_counter"), extra.get("timer", "time.perf_counter"))
    if timers[0] != timers[1]:
        base_data, now_data = [], []  # not comparable: inconclusive (a kernel change still counts)
        notes.append(f"timed with {timers[1]}, the baseline with {timers[0]}")
    threshold = limits.ratio
    drift = None
    if knobs.probe:
        drift = drift_ratio(bextra.get("drift_probe") or [], extra.get("drift_probe") or [])
        if drift is None:
            notes.append(
                "no drift correction: the baseline has no drift-probe samples (record with --lstmperf-drift=probe)"
            )
    decision = compare_samples(
        name,
        base_data,
        now_data,
        replace(limits, ratio=threshold),
        base_throttled=bextra.get("throttled"),
        now_throttled=extra.get("throttled") if not extra.get("remeasured") else None,
        drift=drift,
        device_s=extra.get("device_time_s") if drift else None,
        **kernels,
    )
    return replace(decision, metric="per-call", notes=(*decision.notes, *notes))


def _per_call_threshold(entry: dict[str, Any], ratio: float, knobs: GateKnobs) -> tuple[float, tuple[str, ...]]:
    """max(threshold, 1 + k x this entry's noise band, 1 + k x the band pooled over the baseline's entries)."""
    from ..speed.regression import NOISE_K, noise_threshold, per_call_spread

    spread, source = per_call_spread(entry.get("extra_info", {}), entry["stats"]["data"])
    threshold = noise_threshold(ratio, spread)
    note = f"{NOISE_K:g} x the baseline's noise band ({spread or 0:.1%} spread of the per-call medians of {source})"
    pooled = noise_threshold(ratio, knobs.pooled_spread)
    if pooled > threshold:
        threshold = pooled
        note = (
            f"{NOISE_K:g} x the noise band pooled over the baseline's {knobs.pooled_from} entries recorded from "
            f"several runs (median spread {knobs.pooled_spread:.1%}; this entry's own: {spread or 0:.1%})"
        )
    if threshold <= ratio:
        return ratio, ()
    return threshold, (f"per-call threshold {threshold:.3f}: {note}",)


def _host_decision(name: str, bextra: dict[str, Any], extra: dict[str, Any]) -> tuple[list[Decision], str]:
    """The host counters (ATen ops, GPU kernels, syncs, bytes allocated per call) then and now."""
    from ..speed.regression import Decision, host_counter_changes

    then, now = bextra.get("host_counters"), extra.get("host_counters")
    if not then or not now:
        missing = "the baseline has" if not then else "this run has"
        return [], f"host: not compared ({missing} no host counters; record the baseline again to gate them)"
    unstable = (bextra.get("noise_band") or {}).get("host_counters_unstable")
    if unstable:
        return [], f"host: not compared (the counters differed between the baseline's recording runs: {unstable})"
    changes = host_counter_changes(then, now)
    if changes:
        note = "host work per call changed: " + "; ".join(changes)
        return [Decision(name, "host-work-changed", metric="host", notes=(note,))], f"host: {note}"
    counted = ", ".join(f"{k} {now[k]}" for k in sorted(now))
    return [], f"host: unchanged ({counted})"


# ----------------------------------------------------------------------------------------- terminal
@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> Any:
    """The speed section after every other summary (pytest-benchmark's tables, pytest's short summary), so
    that the gate's verdict is the last thing printed before pytest's final line."""
    try:
        return (yield)
    finally:
        _print_speed_section(terminalreporter, config)


def _print_speed_section(tr: Any, config: pytest.Config) -> None:
    if _is_worker(config) or STATE_KEY not in config.stash:
        return
    state = _state(config)
    if not (state.records or state.messages or state.errors or state.gate or state.save_report):
        return
    tr.section("lstmperf speed", sep="=", bold=True)
    if state.records:
        with contextlib.suppress(pytest.UsageError):
            tr.write_line(f"device: {_device(config).describe()}")
        for line in summary_lines(state.records):
            tr.write_line(line)
        for note in clock_notes(state.records):
            tr.write_line(note, yellow=True)
    for message in state.messages:
        tr.write_line(message)
    if state.save_report is not None:
        tr.write_line(state.save_report.describe(), green=True)
        for flag in state.save_report.flags:
            tr.write_line(
                f"BIMODAL BASELINE (recorded, flagged in the file as extra_info.noise_band): {flag}",
                yellow=True,
                bold=True,
            )
    if state.report_path is not None:
        tr.write_line(f"speed report written to {state.report_path}")
    if state.gate is not None:
        _print_gate(tr, config, state)
    for error in state.errors:
        tr.write_line(f"ERROR: {error}", red=True, bold=True)
    for line in state.outcome:
        bad = not line.startswith("speed gate passed")
        tr.write_line(line, red=bad, green=not bad, bold=True)


def _print_gate(tr: Any, config: pytest.Config, state: GateState) -> None:
    from ..speed.regression import format_table

    assert state.baseline is not None and state.gate is not None
    gate = state.gate
    verbose = config.getoption("verbose", 0) > 0
    shown = gate.decisions if verbose else [d for d in gate.decisions if d.verdict not in ("unchanged", "not-run")]
    tr.write_line("")
    tr.write_line(f"speed gate against {state.baseline.path}: {gate.summary()}", bold=True)
    for line in format_table(shown) if shown else []:
        tr.write_line(line)
    uncorrected = [d for d in gate.decisions if any("no drift correction" in n for n in d.notes)]
    if uncorrected:
        tr.write_line(
            f"--lstmperf-drift=probe: no drift correction for {len(uncorrected)} benchmark(s): the baseline has "
            "no drift-probe samples for them (record with --lstmperf-drift=probe)",
            yellow=True,
        )
    no_counters = [d for d in gate.decisions if any(c.startswith("host: not compared") for c in d.checks)]
    if no_counters:
        tr.write_line(
            f"host counters not compared for {len(no_counters)} benchmark(s): the baseline or this run has none "
            "(record the baseline again to gate host work)",
            yellow=True,
        )
    for decision in gate.decisions:
        remeasured = any("re-measurement" in n for n in decision.notes)
        if not (decision.failed or decision.verdict == "inconclusive" or remeasured or (verbose and decision.checks)):
            continue
        for line in (*decision.checks, *decision.notes):
            if "no drift correction" in line or line.startswith("host: not compared"):
                continue
            tr.write_line(f"  {decision.name}: {line}", red=decision.failed, yellow=not decision.failed)


def _fmt_time(value: float | None) -> str:
    from ..speed.regression import format_seconds

    return format_seconds(value)


def summary_lines(records: list[dict[str, Any]]) -> list[str]:
    """Per mode, shape and path: time per call, device time, host share, speedup over generic, kernel, %peak."""
    from ..speed import timing
    from ..speed.report import generic_reference

    rows = [("mode", "shape", "path", "per call", "device", "host", "vs generic (torch)", "kernel", "%peak")]
    by_case: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for record in records:
        extra = record["extra_info"]
        by_case.setdefault((extra.get("mode", "?"), extra.get("shape", "?")), []).append(record)
    for (mode, shape), group in sorted(by_case.items()):
        ref = generic_reference(group)
        for record in sorted(group, key=lambda r: r["extra_info"].get("path", "")):
            extra = record["extra_info"]
            per_call = extra.get("time_per_call_s")
            host = extra.get("host_overhead")
            frac = extra.get("peak_fraction")
            kernel = f"{extra.get('kernel', '?')}/{extra.get('precision', '?')}"
            if record.get("failed"):
                kernel += " (MISMATCH)"
            rows.append(
                (
                    mode,
                    shape,
                    extra.get("path", "?"),
                    _fmt_time(per_call),
                    _fmt_time(extra.get("device_time_s")),
                    "-" if host is None else f"{host:.0%}",
                    f"{ref / per_call:.2f}x" if ref and per_call else "-",
                    kernel,
                    timing.format_peak_fraction(frac),
                )
            )
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(c).ljust(widths[i]) for i, c in enumerate(row)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def clock_notes(records: list[dict[str, Any]]) -> list[str]:
    notes = []
    throttled = [
        (r["extra_info"].get("throttled_rounds", 0), r["extra_info"].get("rounds", 0), r["name"])
        for r in records
        if r["extra_info"].get("throttled_rounds")
    ]
    for count, total, name in throttled:
        notes.append(
            f"throttled: {count}/{total} rounds of {name} ran below 75% of the maximum SM clock "
            f"(dropped from the regression test)"
        )
    reasons = {r["extra_info"].get("clock_note") for r in records if r["extra_info"].get("clock_note")}
    for reason in sorted(reasons):
        if reason != "no GPU clock on the CPU":
            notes.append(reason)
    methods = {r["extra_info"].get("device_time_note") for r in records if r["extra_info"].get("device_time_note")}
    if any(m and m.startswith("CUDA graph capture failed") for m in methods):
        count = sum(1 for r in records if str(r["extra_info"].get("device_time_note", "")).startswith("CUDA graph"))
        notes.append(
            f"device time: CUDA graph capture failed for {count} benchmark(s); event timing used "
            f"(an upper bound), see extra_info.device_time_note"
        )
    if any(r["extra_info"].get("timed_by") for r in records):
        notes.append(
            "timed by pytest-lstmperf: pytest-benchmark disables itself under pytest-xdist "
            f"({os.environ.get('PYTEST_XDIST_WORKER_COUNT', 'several')} workers shared the machine)"
        )
    return notes
