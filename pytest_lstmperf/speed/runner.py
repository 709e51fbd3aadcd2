"""One benchmark's measurement: what ``lstmperf_benchmark`` gives a test.

:class:`BenchRunner` prepares a path, checks the kernel it ran against the path's claim (failing at once on a
mismatch), times the call with ``benchmark.pedantic`` in rounds paired with the anchor (a synchronising callable,
bounded rounds), measures device time beside the anchor's, host counters and FLOP/s into ``extra_info``, and
attaches a record to the test report (so pytest-xdist brings it to the controller). Called with a user's own
callable it measures that the same way (what is read of the call itself: :mod:`.user_call`);
:class:`~.marked.MarkedBenchmark` is pytest-benchmark's ``benchmark`` in a test marked ``@pytest.mark.lstmperf``.
"""

from __future__ import annotations

import contextlib
import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import pytest

from .. import meters, options
from .. import paths as registry
from ..anchor import Anchor, Pairs, TimedPairs
from ..device import shared_gpu
from ..host_counters import host_counters
from ..observation.claims import Finding, kernel_mismatch, known_kernel_finding
from ..observation.torch_trace import torch_trace
from . import timing
from .policy import DEVICE_METHODS, K_SIGMA, Figure
from .records import BESIDE_OTHER_TESTS, RECORD_KEY, BenchRecord, MeasuredInfo
from .shapes import ROUNDS, bench_set
from .user_call import holds_jax_arrays, jax_kernels, synchronizer, user_device_time

if TYPE_CHECKING:
    from ..device import DeviceInfo
    from ..paths import ExecutionPath
    from .gate import GateState
    from .shapes import BenchShape

#: the ``user_properties`` key of a benchmark's record
#: the marker that makes a plain ``benchmark`` test an lstmperf benchmark
BENCH_MARKER = "lstmperf"
#: the rounds of a benchmark whose device figure decides, where the gate compares or records: they hold the time per
#: call printed beside the device time, and the anchor's time that says whether the machine is comparable
DEVICE_DECIDES_ROUNDS = 5
#: device samples taken before asking whether the device figure has settled, at the least
DEVICE_FIRST_SAMPLES = 6
#: why a benchmark was measured for the report alone (``extra_info.not_judged``): the gate compares, and its
#: baseline has no entry for it, so no figure of it is judged; the gate's precision is spent where it judges
NOT_JUDGED = "no baseline entry: not judged, measured for the report (no sweep, the first half of its device samples)"
#: a device figure whose first samples resolve this slowdown takes no more (the issue's goal for a GPU: 1.05x)
DEVICE_SETTLED = 1.025


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


def run_spec(path: ExecutionPath, spec: Any, mode: str) -> Any:
    """The spec a benchmark prepares: the shape's own, or its inference form for an inference-only path's
    forward benchmark (ONNX Runtime; the shape keeps its id, so one shape is timed on every path)."""
    if mode == "forward" and path.options.get("inference_only") and spec.training:
        return spec.replace(training=False)
    return spec


class BenchRunner:
    """What ``lstmperf_benchmark`` gives a test: ``measure(case)``."""

    def __init__(
        self, benchmark: Any, request: pytest.FixtureRequest, session: Any, state: GateState, lock: Any = None
    ) -> None:
        self.benchmark = benchmark
        self.lock = lock  # under pytest-xdist: the run's MachineLock (timing holds it exclusively)
        self.request = request
        self.config = request.config
        self.session = session  # the run's LstmPerfSession
        self.state = state

    def measure(self, case: BenchCase) -> BenchRecord:
        from ..model.case import make_case  # imports numpy: kept out of pytest's start-up

        session = self.session
        device = session.device
        path = registry.get(case.path)
        self.request.node.user_properties.append(("lstmperf_path", path.name))
        reason = session.unavailable_reason(path) or path.available(device)
        if reason:
            pytest.skip(f"{path.name}: {reason}")
        _skip_shared_gpu(device, self.lock)
        spec = case.shape.spec
        thresholds = self._thresholds()
        extra = _measured(self.benchmark)
        phases = extra.setdefault("phase_s", {})
        started = time.perf_counter()
        run = path.prepare(make_case(run_spec(path, spec, case.mode), session.seed), device)
        call = run.forward if case.mode == "forward" else run.train_step
        extra.update(
            {
                "path": path.name,
                "framework": path.framework,
                "device": device.name,
                "mode": case.mode,
                "shape": spec.short(),
                "spec": spec.to_dict(),
                "set": case.set_name,
                "sweeps": list(case.shape.sweeps),
                "expected_kernel": path.kernel,
                "expected_precision": path.precision,
            }
        )
        self.benchmark.group = f"{case.mode} {spec.short()}"
        phases["prepare"] = time.perf_counter() - started
        started = time.perf_counter()
        trace = run.trace_forward()
        phases["trace"] = time.perf_counter() - started
        extra.update(
            {
                "kernel": trace.family,
                "precision": trace.precision,
                "kernels": list(trace.kernels[:8]),
                "ops": list(trace.ops[:16]),
            }
        )
        self.request.node.user_properties.append(("lstmperf_observed", f"{case.mode} {trace.family}/{trace.precision}"))
        self._check_kernel(path, spec, device, trace, extra, thresholds)

        def timed() -> None:
            call()
            run.synchronize()

        dev_time, counters = _meters(run, call, case.mode, device)
        where = run.pairs(case.mode, device.kind) if hasattr(run, "pairs") else None  # a Keras worker's, on a CPU
        data = self._time(timed, ROUNDS[case.set_name], extra, dev_time, counters, where)
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
        device = self.session.device
        _skip_shared_gpu(device, self.lock)
        thresholds = self._thresholds()
        sync = synchronizer(device.torch_device)
        result = fn()
        sync()
        if holds_jax_arrays(result):
            return self._call_jax(fn, result, label, flops, thresholds)
        with torch_trace(device.torch_device, "forward") as traced:
            fn()
        trace = traced[0]
        observed: MeasuredInfo = {
            "framework": "torch",
            "kernel": trace.family,
            "precision": trace.precision,
            "kernels": list(trace.kernels[:8]),
            "ops": list(trace.ops[:16]),
        }

        def timed() -> None:
            fn()
            sync()

        self._user_benchmark(
            label,
            flops,
            thresholds,
            observed,
            timed,
            user_device_time(fn, device.torch_device, trace.ops),
            lambda: host_counters(fn, device.torch_device),
        )
        return result

    def _user_benchmark(
        self,
        label: str,
        flops: float | None,
        thresholds: dict[str, float],
        observed: MeasuredInfo,
        timed: Any,
        dev_time: Any,
        counters: Any,
    ) -> None:
        """What a user's benchmark records and measures, whichever framework ran it: ``observed`` (the framework
        and what one call ran), the per-call time of ``timed``, ``dev_time(samples)``, ``counters()``, FLOP/s
        where ``flops`` is given, and the record the gate reads."""
        extra = _measured(self.benchmark)
        extra.update(
            {
                "path": "user",
                "device": self.session.device.name,
                "mode": label,
                "shape": "-",
                "set": bench_set(self.config),
            }
        )
        extra.update(observed)
        self.benchmark.group = f"user {label}"
        seen = f"{label} {observed.get('kernel', '')}/{observed.get('precision', '')}"
        self.request.node.user_properties.append(("lstmperf_observed", seen))
        data = self._time(timed, ROUNDS[bench_set(self.config)], extra, dev_time, counters)
        if data and flops:
            self._flops(extra, float(flops), observed.get("precision", ""))
        self._attach(extra, data or [], thresholds)

    def _call_jax(self, fn: Any, result: Any, label: str, flops: float | None, thresholds: dict[str, float]) -> Any:
        """``__call__`` for a ``fn`` that returns JAX arrays (a JAX function, a Keras model on JAX): each timed
        call waits for its results (``jax.block_until_ready``: JAX dispatches asynchronously, so a
        synchronisation of torch's would not wait for it); on a GPU the device time is the GPU work that CUPTI
        records (:func:`..meters.xla_device_time`) and the kernel is read from the GPU kernels of one call
        (``cudnn`` where cuDNN's RNN kernels ran, ``jax-generic`` where only XLA's own did); no host counters
        (they count PyTorch's ATen ops, and JAX dispatches none)."""
        import jax

        device = self.session.device
        wait: Callable[[Any], Any] = jax.block_until_ready
        wait(result)
        family, precision, kernels = jax_kernels(fn, wait, device.torch_device, result)
        observed: MeasuredInfo = {
            "framework": "jax",
            "kernel": family,
            "precision": precision,
            "kernels": kernels[:8],
            "ops": [],
        }
        if family == "unknown":
            observed["kernel_note"] = (
                "JAX on the CPU launches no GPU kernel to read the kernel from: use the kernel marker, which reads "
                "what XLA compiles each layer call to (docs/own-model.md)"
            )

        def timed() -> None:
            wait(fn())

        def dev_time(samples: int) -> meters.DeviceTime:
            if device.torch_device.startswith("cuda"):
                return meters.xla_device_time(fn, wait, samples)
            return meters.device_time(fn, device.torch_device, samples)  # the CPU: the time per call

        def counters() -> dict[str, Any]:
            return {"note": "not counted: the call runs JAX work (host counters count PyTorch's ATen ops)"}

        self._user_benchmark(label, flops, thresholds, observed, timed, dev_time, counters)
        return result

    def _check_kernel(
        self,
        path: ExecutionPath,
        spec: Any,
        device: DeviceInfo,
        trace: Any,
        extra: MeasuredInfo,
        thresholds: dict[str, float],
    ) -> None:
        """Fail at once, recording the finding, when the kernel that ran is not the path's claim
        (:func:`~pytest_lstmperf.observation.claims.kernel_mismatch`). A difference a known finding documents is
        recorded (the run's findings list it, ``extra_info.known_finding`` names it) and the benchmark goes on:
        a known finding changes what the path is expected to run, never whether its speed is gated."""
        mismatch = kernel_mismatch(path, trace)
        if not mismatch:
            return
        known = known_kernel_finding(path, trace)
        message = f"known finding on {path.name} ({spec.short()}): {known}" if known else mismatch
        finding = Finding(path.name, "known" if known else "kernel", spec.short(), message)
        self.request.node.user_properties.append(("lstmperf_finding", json.dumps(asdict(finding))))
        if known:
            extra["known_finding"] = f"{known} [{mismatch}]"
            return
        self._attach(extra, [], thresholds, failed="kernel")
        pytest.fail(mismatch + _explanation(path, spec, device, trace), pytrace=False)

    def _time(
        self,
        timed: Any,
        plan: Any,
        extra: MeasuredInfo,
        dev_time: Any,
        counters: Any,
        where: TimedPairs | None = None,
    ) -> list[float] | None:
        """Time ``timed`` (which synchronises) in rounds paired with the anchor, then device time beside the
        anchor's (``dev_time(samples)``) and the host counters (``counters()``, one untimed call), with the machine
        to itself (under pytest-xdist: :mod:`.machine_lock`). ``where``: the pairs (:class:`..anchor.Pairs`) where
        the call is timed elsewhere than in this process (a Keras worker's on a CPU), each with its own anchor.
        Fills ``extra``; returns the per-call samples, or None under ``--benchmark-disable``."""
        phases = extra.setdefault("phase_s", {})
        started = time.perf_counter()
        clock = timing.benchmark_timer(self.config)
        extra["timer"] = f"{getattr(clock, '__module__', None) or 'time'}.{getattr(clock, '__name__', repr(clock))}"
        user_disabled = self.config.getoption("benchmark_disable", False) and not self.config.getoption(
            "benchmark_enable", False
        )
        if user_disabled and not self.benchmark.enabled:
            self.benchmark.pedantic(timed)  # --benchmark-disable: run once, as a test
            return None
        with self.lock.exclusive() if self.lock is not None else contextlib.nullcontext():
            from ..paths.keras.pool import wait_started  # imports numpy, registers an exit hook: not at start-up

            wait_started()  # the run's own Keras workers: no start-up beside a timing
            phases["waited"] = time.perf_counter() - started  # for other workers' tests, the Keras workers' start
            started = time.perf_counter()
            anchor = self._anchor()
            if self.session.device.kind == "cpu":  # a bf16 or fp16 call: the anchor in its precision
                anchor = anchor.in_precision(str(extra.get("precision", "")))
            pairs: TimedPairs = where or Pairs(timed, anchor, clock)
            estimate = pairs.estimate(plan.warmup)
            repeat = pairs.repeat_for(estimate, self.state.anchor_repeat(self.request.node.nodeid))
            # where the gate compares, a benchmark its baseline has no entry for is measured for the report alone
            # (NOT_JUDGED): its device time from the first half of the samples, and no sweep
            judged = self.state.judges_benchmark(self.request.node.nodeid)
            # the device time first: whether a device figure (the GPU's own time) decides sets the rounds below
            self._device_time(extra, dev_time, plan.device_samples, anchor, settle=judged)
            phases["device_time"], started = time.perf_counter() - started, time.perf_counter()
            device_decides = extra.get("device_time_method") in DEVICE_METHODS
            # where the gate compares or records, a device figure or the sweep (:mod:`.sweep`) decides: the test's
            # own stretch of rounds only feeds pytest-benchmark's tables, and takes its fewest; where the device
            # figure decides, they hold the time per call printed beside it and the anchor's time, which says
            # whether the machine is in the state it was recorded in (a factor of 3): a few rounds do
            target_s = plan.target_s if self.state.sweep is None else 0.0
            fewest = plan.min_rounds
            if self.state.sweep is not None and device_decides:
                fewest = min(fewest, DEVICE_DECIDES_ROUNDS)
            rounds = timing.RoundPlan(plan.warmup, fewest, plan.max_rounds, target_s).rounds_for(
                (1 + pairs.calls) * estimate  # a round is the anchor and the call (after an untimed one on a CPU)
            )
            data: list[float]
            anchors: list[float]
            if where is not None and self.benchmark.enabled:  # timed where the call runs (the anchor's kind says
                # so): pytest-benchmark's results are given its samples
                self.benchmark.pedantic(lambda: None)
                data, anchors = where.rounds(repeat, rounds)
                stats = type(self.benchmark.stats.stats)()
                stats.data = list(data)
                self.benchmark.stats.stats = stats
            elif self.benchmark.enabled:
                anchors = []
                warm = 0 if (estimate or 0.0) >= meters.WARM_AFTER_ONE_S else 1  # a long call is warm already

                def setup() -> None:
                    anchors.append(anchor.time(repeat, clock))  # untimed by pytest-benchmark, timed here
                    if pairs.calls > 1:
                        timed()  # the timed call follows an untimed one (:class:`..anchor.Pairs`)

                self.benchmark.pedantic(timed, setup=setup, rounds=rounds, warmup_rounds=warm, iterations=1)
                data = list(self.benchmark.stats.stats.data)
                anchors = anchors[-len(data) :]
            else:  # pytest-benchmark disabled itself (pytest-xdist): time the same way ourselves
                self.benchmark.pedantic(lambda: None)
                data, anchors = pairs.rounds(repeat, rounds)
                extra["timed_by"] = "pytest-lstmperf (pytest-benchmark is disabled under pytest-xdist)" + (
                    "" if self.lock is not None else "; " + BESIDE_OTHER_TESTS
                )
            extra["rounds"] = len(data)
            extra.setdefault("anchor", {}).update(  # beside its device samples (:meth:`_device_time`)
                {
                    "kind": pairs.kind,
                    "repeat": repeat,
                    "samples": anchors,
                    "per_call_s": statistics.median(anchors) if anchors else None,
                }
            )
            median = sorted(data)[len(data) // 2] if data else None
            extra.update(
                {
                    "time_per_call_s": median,
                    "host_overhead": timing.host_overhead(median, extra.get("device_time_s")),
                }
            )
            phases["rounds"], started = time.perf_counter() - started, time.perf_counter()
            sweep = self.state.sweep
            if not judged:
                extra["not_judged"] = NOT_JUDGED
            elif sweep is not None and not device_decides:
                # the time per call decides: timed again across the run as it ends (:mod:`.sweep`)
                anchor_s = extra.get("anchor", {}).get("per_call_s") or 0.0
                per_round = pairs.calls * statistics.median(data) + anchor_s * repeat
                sweep.add(self.request.node.nodeid, pairs, repeat, per_round)
            self._counters(extra, counters)
            phases["counters"] = time.perf_counter() - started
            extra["run_medians"] = timing.batch_medians(data)
            return data

    def _anchor(self) -> Any:
        """The run's anchor on this device, made once."""
        if self.state.anchor is None:
            self.state.anchor = Anchor(self.session.device.torch_device)
        return self.state.anchor

    @staticmethod
    def _device_time(extra: MeasuredInfo, dev_time: Any, samples: int, anchor: Any, settle: bool = True) -> None:
        """The benchmark's device samples, each followed by one of the anchor's where they are taken in this process
        (:func:`..meters.paired_with`), else the anchor's taken after them (a Keras worker's device time). The
        anchor's part of ``extra`` is filled here; its rounds' samples join it after the rounds. ``settle``: False
        for a benchmark the run does not judge, whose first half of the samples is its device time."""
        part = extra.setdefault("anchor", {})
        if anchor.kind != "torch-cuda":
            dev, _ = _settled_device_time(dev_time, samples, [], settle)
        else:
            with meters.paired_with(anchor.device_sample) as beside:
                dev, paired = _settled_device_time(dev_time, samples, beside, settle)
            n = len(dev.samples)
            if n and len(paired) == n:
                part["device_samples"] = paired
                part["device_pairing"] = "alternating"
            elif n:
                part["device_samples"] = list(anchor.device_time(n).samples)
                part["device_pairing"] = "after"
        extra.update(
            {
                "device_time_s": dev.median,
                "device_time_method": dev.method,
                "device_time_note": dev.note,
                "device_samples": list(dev.samples),
                "device_run_medians": timing.batch_medians(dev.samples),
            }
        )
        share: float | None = getattr(dev, "dispatch_share", None)
        if share is not None:
            extra["device_dispatch_share"] = share

    @staticmethod
    def _counters(extra: MeasuredInfo, counters: Any) -> None:
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

    def _flops(self, extra: MeasuredInfo, flops: float, precision: str) -> None:
        busy = extra.get("device_time_s") or extra.get("time_per_call_s")
        peak = timing.measured_peak_flops(self.session.device.torch_device, precision)
        achieved = flops / busy if busy else None
        extra.update(
            {
                "flops": flops,
                "flops_per_s": achieved,
                "peak_flops": peak,
                "peak_fraction": achieved / peak if achieved and peak else None,
            }
        )

    def _thresholds(self) -> dict[str, float]:
        marker = self.request.node.get_closest_marker("lstmperf_threshold")
        if marker is None:
            return {}
        out: dict[str, float] = {}
        unknown = sorted(set(marker.kwargs) - {"ratio"})
        if unknown or len(marker.args) > 1:
            pytest.fail(
                f"@pytest.mark.lstmperf_threshold: takes one ratio (lstmperf_threshold(1.2) or ratio=1.2); got "
                f"{', '.join([*map(repr, marker.args), *unknown])}",
                pytrace=False,
            )
        ratio = marker.kwargs.get("ratio", marker.args[0] if marker.args else None)
        try:
            if ratio is not None:
                out["ratio"] = options.parse_threshold(str(ratio))
        except ValueError as exc:
            pytest.fail(f"@pytest.mark.lstmperf_threshold: {exc}", pytrace=False)
        return out

    def _attach(
        self, extra: MeasuredInfo, data: list[float], thresholds: dict[str, float], failed: str = ""
    ) -> BenchRecord:
        """The benchmark's record (:class:`.records.BenchRecord`), attached to its report for the gate."""
        node = self.request.node
        callspec = getattr(node, "callspec", None)
        record = BenchRecord(
            fullname=node.nodeid,
            name=node.name,
            group=self.benchmark.group,
            param=callspec.id if callspec else None,
            params={k: repr(v) for k, v in callspec.params.items()} if callspec else None,
            extra_info=_plain_object(extra),
            options={"rounds": len(data), "warmup": "estimate + 1 round", "timer": "perf_counter"},
            data=tuple(float(x) for x in data),
            threshold=thresholds.get("ratio"),
            failed=failed,
        )
        node.user_properties.append((RECORD_KEY, record.to_json()))
        return record


def _settled_device_time(
    dev_time: Any, samples: int, beside: list[float], settle: bool = True
) -> tuple[meters.DeviceTime, list[float]]:
    """``dev_time(samples)``, stopped at half of them where the GPU's own time (:data:`.policy.DEVICE_METHODS`)
    already resolves :data:`DEVICE_SETTLED` (:func:`_resolves`): device
    figures lie within a few tenths of a percent of each other (on the H200 the default command's median
    resolution was 1.013x with 12), so the second half is spent only where the first is noisy. With the anchor's
    samples taken beside each measurement (``beside``, :func:`..meters.paired_with`), those that pair with the
    returned samples (empty where they do not all pair). ``settle=False``: the first half alone (a benchmark the
    run does not judge)."""
    first = max(DEVICE_FIRST_SAMPLES, samples // 2)
    dev: meters.DeviceTime = dev_time(first)
    paired = _last(beside, len(dev.samples))
    settled = dev.method in DEVICE_METHODS and _resolves(dev.samples) <= DEVICE_SETTLED
    if first >= samples or not dev.samples or settled or not settle:
        return dev, paired
    mark = len(beside)
    more: meters.DeviceTime = dev_time(samples - first)
    if more.method != dev.method:  # a second measurement that took another method: the first stands alone
        return dev, paired
    shares = [x for x in (dev.dispatch_share, more.dispatch_share) if x is not None]
    merged = meters.DeviceTime(dev.method, dev.samples + more.samples, dev.note,
                               statistics.mean(shares) if shares else None)  # fmt: skip
    more_paired = _last(beside[mark:], len(more.samples))
    return merged, (paired + more_paired if paired and more_paired else [])


def _last(taken: list[float], n: int) -> list[float]:
    """The last ``n`` anchor samples taken beside a measurement of ``n`` samples (the front ones paired with a
    start-up transient's samples, dropped), or none where fewer were taken."""
    return list(taken[-n:]) if n and len(taken) >= n else []


def _resolves(samples: tuple[float, ...]) -> float:
    """The slowdown a figure of these samples resolves against one as sure, by the rule's own estimate
    (:meth:`.policy.Figure.of`: the median's standard error from the MAD, on the log scale): 4 standard errors on
    both sides; inf where the samples make no figure."""
    figure = Figure.of(samples)
    return math.inf if figure is None else math.exp(K_SIGMA * figure.se * math.sqrt(2))


def _skip_shared_gpu(device: DeviceInfo, lock: Any) -> None:
    """Skip a benchmark on a GPU that other pytest-xdist workers use, unless the run holds the machine lock.

    Where the run judges or keeps its figures (a compare, a recording), every worker holds the machine lock
    (:mod:`.machine_lock`): a benchmark times with the machine to itself, GPU included, since no other worker's
    test runs while it does. A run that only prints its figures takes no lock, and its benchmarks would time
    beside another worker's GPU work: they are skipped with the reason."""
    shared = shared_gpu(device)
    if shared and lock is None:
        pytest.skip(
            f"not timed: {shared}, and this run neither compares nor records, so no benchmark holds the machine "
            "to itself (use -n auto, fewer workers, or --benchmark-compare)"
        )


def _meters(run: Any, call: Any, mode: str, device: DeviceInfo) -> tuple[Any, Any]:
    """``(dev_time(samples), counters())`` of a prepared run: a run whose kernels launch in another process
    (Keras's worker) measures its device time and counts its host work there."""

    own_time, own_counts = getattr(run, "device_time", None), getattr(run, "host_counters", None)

    def dev_time(samples: int) -> meters.DeviceTime:
        if own_time is not None:
            measured: meters.DeviceTime = own_time(mode, samples)
            return measured
        return meters.device_time(call, device.torch_device, samples)

    def counters() -> dict[str, Any]:
        return own_counts(mode) if own_counts is not None else host_counters(call, device.torch_device)

    return dev_time, counters


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


def _plain(value: object) -> object:
    """JSON/execnet-safe copy: dicts, lists, str, int, float, bool, None."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def _plain_object(value: MeasuredInfo) -> dict[str, object]:
    """:func:`_plain` of a record's ``extra_info``."""
    return {str(k): _plain(v) for k, v in value.items()}


def _measured(benchmark: Any) -> MeasuredInfo:
    """pytest-benchmark's ``extra_info`` dict of ``benchmark``, which this module fills: the one place it is
    taken as :class:`.records.MeasuredInfo`."""
    info: MeasuredInfo = benchmark.extra_info
    return info
