"""Timing that is right on GPUs and on busy machines: what a user waits for, what the GPU spends, and a fixed
anchor workload timed beside both.

* **Time per call** (what users feel): host wall clock around ``call(); synchronize()``, one call per round,
  after warm-up. The synchronisation makes queued CUDA work count; the host overhead (Python, dispatch,
  kernel launches) is included. pytest-benchmark takes these samples when it runs enabled; under
  pytest-xdist it disables itself and :func:`paired_rounds` takes them the same way.
* **Device time**: a CUDA graph of one call is captured and replayed; CUDA events around the replays time the
  kernels without the host (the graph launches them back to back). When capture fails (an op that
  synchronises, a CPU fallback inside the call) the call itself is timed with CUDA events around several
  back-to-back calls (their mean is one sample), a note says so: that figure also holds the gaps where the
  GPU waited for launches, so it is an upper bound.
* **Host counters** (:func:`host_counters`): per call, ATen ops dispatched, GPU kernels launched,
  host-device synchronisations and bytes allocated, counted in one untimed call: exact, whatever the load.
* **Host overhead share**: ``1 - device / per call``.
* **Achieved FLOP/s** against the device's *measured* peak: the best of several large GEMMs in the same
  precision, once per process (:func:`measured_peak_flops`, :data:`PEAK_METHOD`); a share above 100% is
  flagged as a measurement error (:func:`format_peak_fraction`).
* **The anchor** (:class:`Anchor`): a fixed workload of the benchmark's device, timed in pairs with its calls
  (:func:`paired_rounds`) and its device time beside the benchmark's, so that what the whole machine does to
  both (a slow phase, a busy neighbour, a lower clock) cancels in their ratio (:mod:`.policy`, sentence 1).

torch is imported only inside the functions that need it.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import statistics
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any


# -------------------------------------------------------------------------------------------- rounds
@dataclass(frozen=True)
class RoundPlan:
    """How many rounds a benchmark gets: enough for a stable median, bounded for CI."""

    warmup: int = 3  # calls before anything is timed (cuDNN plans, allocator, lazy init)
    min_rounds: int = 15
    max_rounds: int = 60
    target_s: float = 0.5  # timed work per benchmark when calls are fast
    device_samples: int = 15  # device-time samples (each of several graph replays)

    def rounds_for(self, call_s: float) -> int:
        if not call_s or call_s <= 0 or not math.isfinite(call_s):
            return self.min_rounds
        return long_call_samples(call_s, max(self.min_rounds, min(self.max_rounds, math.ceil(self.target_s / call_s))))


#: timed work per benchmark above which a long call (the Keras generic loop: 100-340 ms per call) gets fewer
#: samples, down to half: its relative spread is small (one call averages hundreds of launches), the rank
#: test on 8 rounds against a baseline's 15 still reaches p = 1/C(23, 8) = 2e-6, far below the gate's level,
#: and a suspect is re-measured with twice the samples before it can fail
LONG_CALL_BUDGET_S = 2.0


def long_call_samples(call_s: float, samples: int) -> int:
    """``samples``, or fewer (never under half) where they would take longer than :data:`LONG_CALL_BUDGET_S`
    at ``call_s`` each."""
    if not call_s or call_s <= 0 or not math.isfinite(call_s) or samples * call_s <= LONG_CALL_BUDGET_S:
        return samples
    return min(samples, max(math.ceil(samples / 2), math.ceil(LONG_CALL_BUDGET_S / call_s)))


#: a call at least this long is warm after its first call (lazy initialisation, the allocator's first blocks),
#: and one more call estimates it: the Keras generic loop (100-360 ms per call) spent 6 untimed calls, up to
#: 2 s per benchmark, on a warm-up and an estimate meant for calls of a millisecond
WARM_AFTER_ONE_S = 0.05


def estimate_call(call: Callable[[], object], warmup: int, clock: Callable[[], float] = time.perf_counter) -> float:
    """Warm up, then the median of three timed calls (``call`` must synchronise). A first call of at least
    :data:`WARM_AFTER_ONE_S` is the whole warm-up, and the next call the estimate."""
    start = clock()
    call()
    if clock() - start >= WARM_AFTER_ONE_S:
        start = clock()
        call()
        return clock() - start
    for _ in range(max(warmup, 1) - 1):
        call()
    times = []
    for _ in range(3):
        start = clock()
        call()
        times.append(clock() - start)
    return statistics.median(times)


#: the anchor lasts about as long as the benchmark's call, up to this: a long call's rounds are not doubled
ANCHOR_MAX_S = 0.005


#: while :func:`paired_with` is active: what runs after each device sample (the anchor's own device sample)
_AFTER_SAMPLE: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar("after_sample", default=None)


@contextlib.contextmanager
def paired_with(sample_anchor: Callable[[], float]) -> Iterator[list[float]]:
    """Device samples taken in this process inside the block are each followed by one of ``sample_anchor()``,
    collected into the list yielded: the benchmark's and the anchor's device samples alternate, so that what the
    GPU does meanwhile (another process's work, a clock change) reaches both sides of a pair. The last
    ``len(samples)`` of them pair with a :class:`DeviceTime`'s samples (a start-up transient's samples are dropped
    from the front). A device time taken in another process (a Keras worker) sees no hook: nothing is collected."""
    taken: list[float] = []
    token = _AFTER_SAMPLE.set(lambda: taken.append(sample_anchor()))
    try:
        yield taken
    finally:
        _AFTER_SAMPLE.reset(token)


def _after_sample() -> None:
    hook = _AFTER_SAMPLE.get()
    if hook is not None:
        token = _AFTER_SAMPLE.set(None)  # the anchor's sample is not followed by another
        try:
            hook()
        finally:
            _AFTER_SAMPLE.reset(token)


class Anchor:
    """A fixed workload on the benchmark's device, timed beside every benchmark call (:mod:`.policy`, sentence 1).

    Per call: ten steps of ``h = tanh(x @ W + h @ U)`` on 16x64 tensors (a few dozen small ops: the dispatcher,
    the allocator, a little arithmetic, a synchronisation on a GPU), run ``repeat`` times so that it lasts about
    as long as the benchmark's call; :meth:`time` returns seconds per repetition, so figures taken with another
    ``repeat`` stay comparable. On a GPU also a device part, one 2048x2048 matmul and a ``tanh``
    (:meth:`device_call`), whose device time is taken the same way as the benchmark's. It touches no LSTM or GRU
    layer: a slower layer does not move it, while a slower machine moves both. torch where it is installed (the
    benchmark's own threads and device), else numpy.
    """

    STEPS = 10
    MAX_REPEAT = 256

    def __init__(self, torch_device: str = "cpu") -> None:
        self.torch_device = torch_device
        self.kind: str
        self._x: Any
        self._w: Any
        self._u: Any
        try:
            import torch as _torch_module

            torch: Any = _torch_module
        except ImportError:
            torch = None
        self._torch = torch
        if torch is None:
            import numpy as np

            rng = np.random.default_rng(0)
            self.kind = "numpy"
            self._x, self._w, self._u = (
                rng.standard_normal(s).astype("float32") / 8 for s in ((16, 64), (64, 64), (64, 64))
            )
        else:
            dev = torch.device(torch_device)
            gen = torch.Generator().manual_seed(0)
            self.kind = f"torch-{dev.type}"
            self._x, self._w, self._u = (
                (torch.randn(*s, generator=gen) / 8).to(dev) for s in ((16, 64), (64, 64), (64, 64))
            )
            self._cuda = dev.type == "cuda"
            self._graph: Any = None
            if self._cuda:
                self._a = (torch.randn(2048, 2048, generator=gen) / 45).to(dev)
        self.once()  # the first call pays one-off costs

    def once(self) -> None:
        if self._torch is None:
            import numpy as np

            h = self._x
            for _ in range(self.STEPS):
                h = np.tanh(self._x @ self._w + h @ self._u)
            return
        torch = self._torch
        with torch.no_grad():
            h = self._x
            for _ in range(self.STEPS):
                h = torch.tanh(torch.addmm(h @ self._u, self._x, self._w))
            if self._cuda:
                torch.cuda.synchronize(self.torch_device)

    def _fit(self, call_s: float | None, one: float) -> int:
        """The repetitions that make the anchor last about ``call_s`` at ``one`` per repetition: a power of two up
        to :data:`MAX_REPEAT`."""
        repeat = 1
        while call_s and repeat * one < call_s and repeat < self.MAX_REPEAT:
            repeat *= 2
        return repeat

    def repeat_for(self, call_s: float | None, baseline: int | None = None) -> int:
        """The repetitions for a call of ``call_s``: the baseline entry's, so that both figures pair with the same
        anchor, where that lasts at most twice :data:`ANCHOR_MAX_S` here; else fitted to the call, up to
        :data:`ANCHOR_MAX_S`, as for a new entry."""
        one = min(self.time(1) for _ in range(3))
        if baseline and baseline * one <= 2 * ANCHOR_MAX_S:
            return baseline
        return self._fit(min(call_s, ANCHOR_MAX_S) if call_s else call_s, one)

    def time(self, repeat: int, clock: Callable[[], float] = time.perf_counter) -> float:
        """Seconds per repetition of ``repeat`` back-to-back runs."""
        start = clock()
        for _ in range(repeat):
            self.once()
        return (clock() - start) / repeat

    def device_call(self) -> None:
        """The device part (a GPU only), unsynchronised: what :meth:`device_sample` captures and replays."""
        torch = self._torch
        with torch.no_grad():
            torch.tanh(self._a @ self._a)

    def device_sample(self, replays: int = 5) -> float:
        """Device seconds of the device part, from ``replays`` back-to-back replays of its CUDA graph between two
        CUDA events, as :func:`device_time` times a benchmark; the graph is captured once per run."""
        torch = self._torch
        if self._graph is None:
            dev = torch.device(self.torch_device)
            side = torch.cuda.Stream(dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):
                for _ in range(3):
                    self.device_call()
            torch.cuda.current_stream(dev).wait_stream(side)
            torch.cuda.synchronize(dev)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self.device_call()
            graph.replay()
            torch.cuda.synchronize(dev)
            self._graph = graph
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            self._graph.replay()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) / 1000.0 / replays

    def device_time(self, samples: int) -> DeviceTime:
        """``samples`` device samples one after another (where they could not alternate with the benchmark's)."""
        return DeviceTime("cuda-graph", tuple(self.device_sample() for _ in range(samples)))


def paired_rounds(
    call: Callable[[], object],
    anchor: Anchor,
    repeat: int,
    rounds: int,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[list[float], list[float]]:
    """``rounds`` pairs of (seconds of one ``call``, which must synchronise; seconds per repetition of the
    anchor), the anchor first in every pair, as pytest-benchmark's ``setup`` runs it."""
    data, anchors = [], []
    for _ in range(rounds):
        anchors.append(anchor.time(repeat, clock))
        start = clock()
        call()
        data.append(clock() - start)
    return data, anchors


def benchmark_timer(config: Any) -> Callable[[], float]:
    """The clock pytest-benchmark times with (``--benchmark-timer``, default ``time.perf_counter``), so that
    rounds timed here (under pytest-xdist) use the same one."""
    from pytest_benchmark.utils import load_timer

    raw = config.getoption("benchmark_timer", None)
    if not raw:
        return time.perf_counter
    return load_timer(str(raw)).target


# --------------------------------------------------------------------------------------- device time
@dataclass(frozen=True)
class DeviceTime:
    method: str  # "cuda-graph", "cuda-events", "cupti", "pipelined", "host" (CPU: the host is the device), "none"
    samples: tuple[float, ...] = ()
    note: str = ""
    #: "pipelined" only: the host's share of the time, queueing the calls (:func:`pipelined_device_time`)
    dispatch_share: float | None = None

    @property
    def median(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None


def device_time(call: Callable[[], object], device: str, samples: int = 15, replays: int = 5) -> DeviceTime:
    """Device-side seconds per call of ``call`` (which must *not* synchronise) on ``device``.

    Each sample is the mean of ``replays`` back-to-back graph replays or, where capture fails, of ``replays``
    back-to-back calls between one pair of CUDA events (queued without a synchronisation, so the GPU works
    through them while the host launches the next ones: per-call event noise averages out over the batch)."""
    if not device.startswith("cuda"):
        return DeviceTime("host", (), "on the CPU the host runs the kernels: device time is the time per call")
    import torch

    dev = torch.device(device)
    try:
        kept, dropped = _graph_replay_times(torch, dev, call, samples, replays)
        return DeviceTime("cuda-graph", tuple(kept), transient_note(kept, dropped))
    except Exception as exc:
        with contextlib.suppress(Exception):
            torch.cuda.synchronize(dev)
        note = f"CUDA graph capture failed ({capture_failure(exc)})"
    try:
        one = _one_call_s(torch, dev, call)  # the warm-up call too
        calls = events_batch(one, replays)
        samples = long_call_samples(one * calls, samples)
        note += (
            f"; device time from CUDA events around {calls} back-to-back call(s) per sample, {samples} samples "
            "(kernels plus launch gaps: an upper bound)"
        )
        return DeviceTime("cuda-events", tuple(_event_times(torch, dev, call, samples, calls, warm=True)), note)
    except Exception as exc:
        return DeviceTime("none", (), f"{note}; event timing failed too ({type(exc).__name__}: {exc})")


def cupti_device_time(
    call: Callable[[], object],
    wait: Callable[[Any], object],
    samples: int = 15,
    calls: int = 5,
    clock: Callable[[], float] = time.perf_counter,
    busy: Callable[[Callable[[], None]], float | None] | None = None,
) -> DeviceTime | None:
    """Device seconds per call of ``call`` (whose results ``wait`` waits for) as CUPTI records the GPU's work:
    the summed durations of the kernels, copies and memsets of ``calls`` calls (one for a call of
    :data:`EVENTS_BATCH_S` or more), over ``calls``, for each sample. For work that torch's CUDA graphs and
    events cannot see, launched in this process by another runtime (XLA: Keras on JAX), which CUPTI records
    all the same. Host time and launch gaps are not in it, so a slower host does not move it. ``busy(block)``
    runs ``block`` and returns the GPU seconds recorded (default: :func:`_cupti_busy`, ``torch.profiler`` with
    CUDA activities); None where nothing can record them (no torch, no CUDA profiling) or nothing was recorded."""
    measure = busy or _cupti_busy
    batch, samples = _queued_plan(call, wait, samples, calls, clock)

    def block() -> None:
        wait([call() for _ in range(batch)])

    def sample() -> float:
        seconds = measure(block)
        _after_sample()
        return (seconds or 0.0) / batch

    first = [sample() for _ in range(samples)]
    if not all(first):
        return None
    kept, dropped = settled(first, samples, sample)
    if not all(kept):  # a sample taken in a transient's place recorded nothing: no figure rather than a wrong one
        return None
    note = (
        f"device time from CUPTI: the GPU's kernels, copies and memsets of {batch} call(s) per sample, summed, "
        f"{samples} samples (launch gaps and host time not included)"
    )
    if dropped:
        note += f"; {transient_note(kept, dropped)}"
    return DeviceTime("cupti", tuple(kept), note)


def _queued_plan(
    call: Callable[[], object], wait: Callable[[Any], object], samples: int, calls: int, clock: Callable[[], float]
) -> tuple[int, int]:
    """``(calls per sample, samples)`` for timing ``call`` in batches: one untimed warm-up call, one timed call,
    then :func:`events_batch` and :func:`long_call_samples` as for CUDA events."""
    wait(call())  # warm-up, untimed
    start = clock()
    wait(call())
    one = clock() - start
    batch = events_batch(one, calls)
    return batch, long_call_samples(one * batch, samples)


def xla_device_time(call: Callable[[], object], wait: Callable[[Any], object], samples: int) -> DeviceTime:
    """Device seconds per call of ``call``, XLA work launched in this process (Keras on JAX, a JAX function),
    whose results ``wait`` waits for: from CUPTI (:func:`cupti_device_time`), else from calls queued back to back
    (:func:`pipelined_device_time`), else none, the note saying why each gave way. Never raises: a device time
    must not cost a benchmark its timings."""
    try:
        recorded = cupti_device_time(call, wait, samples)
        why = (
            "CUPTI recorded no GPU activity here (no torch with CUDA profiling in this process, or another "
            "profiler holds CUPTI)"
        )
    except Exception as exc:
        recorded, why = None, f"CUPTI device time failed ({type(exc).__name__}: {str(exc)[:200]})"
    if recorded is not None:
        return recorded
    try:
        queued = pipelined_device_time(call, wait, samples)
    except Exception as exc:
        return DeviceTime("none", (), f"{why}; queued timing failed too ({type(exc).__name__}: {str(exc)[:200]})")
    return DeviceTime(queued.method, queued.samples, f"{why}; {queued.note}", queued.dispatch_share)


def _cupti_busy(block: Callable[[], None]) -> float | None:
    """GPU seconds that ``torch.profiler`` (CUPTI) records while ``block`` runs: every device activity of the
    process, whichever runtime launched it; None without torch or its CUDA profiling."""
    from ..observation.torch_trace import cuda_profile

    prof = cuda_profile(block)
    if prof is None:
        return None
    results = getattr(prof.profiler, "kineto_results", None)
    if results is not None:  # the raw records: building the profiler's event tree took 4-6 s per benchmark
        from torch.autograd import DeviceType

        return sum(e.duration_ns() for e in results.events() if e.device_type() == DeviceType.CUDA) * 1e-9
    total = 0.0
    for event in prof.events():
        if "CUDA" in str(getattr(event, "device_type", "")):
            total += event.time_range.elapsed_us() * 1e-6
    return total


#: a pipelined device time is the device's where the host queued the calls in at most this share of the time
#: they took: the GPU then never waited for the next launch (beyond the first); above it, the figure follows the
#: host, and the gate holds it as it holds CUDA events (``gate.device_limit``)
PIPELINED_DEVICE_BOUND = 0.25


def pipelined_device_time(
    call: Callable[[], object],
    wait: Callable[[Any], object],
    samples: int = 15,
    calls: int = 5,
    clock: Callable[[], float] = time.perf_counter,
) -> DeviceTime:
    """Device seconds per call of ``call``, which launches its device work and returns without waiting for it
    (a JAX executable on the GPU), where torch's CUDA graphs and events cannot see the work (XLA runs it on
    JAX's own streams). Each sample is the wall time from queueing ``calls`` calls back to back to ``wait``
    returning on all their results, divided by ``calls`` (1 for a call longer than :data:`EVENTS_BATCH_S`).
    The GPU works through the queue while the host launches the next call, so the figure is the device's
    time per call, plus one launch spread over the batch, wherever queueing a call takes the host less than
    the device needs for it; the host's share of the time (queueing the calls) is measured alongside and kept
    (``dispatch_share``): at :data:`PIPELINED_DEVICE_BOUND` and above the figure follows the host."""
    batch, samples = _queued_plan(call, wait, samples, calls, clock)
    queued: list[float] = []

    def sample() -> float:
        start = clock()
        results = [call() for _ in range(batch)]
        launched = clock()
        wait(results)
        end = clock()
        queued.append((launched - start) / batch)
        return (end - start) / batch

    kept, dropped = settled([sample() for _ in range(samples)], samples, sample)
    share = statistics.median(queued) / max(statistics.median(kept), 1e-12)
    bound = "the device's" if share < PIPELINED_DEVICE_BOUND else "the host's launch rate (host-bound)"
    note = (
        f"device time from {batch} call(s) queued back to back per sample, {samples} samples, timed until the last "
        f"result is ready; queueing took {share:.0%} of it, so the figure is {bound}"
    )
    if dropped:
        note += f"; {transient_note(kept, dropped)}"
    return DeviceTime("pipelined", tuple(kept), note, dispatch_share=share)


#: what a capture's first error says, and what to do about it
CAPTURE_HINTS = {
    "legacy stream": (
        "the call's autograd nodes were made on the legacy default stream: make and run what it calls on a stream "
        "of its own (torch.cuda.set_stream(torch.cuda.Stream()) before building it) to capture it"
    ),
}


def transient_note(kept: Sequence[float], dropped: Sequence[float]) -> str:
    """What :func:`settled` left out of a device measurement, or '' where it left out nothing."""
    if not dropped:
        return ""
    from .policy import format_seconds

    return (
        f"{len(dropped)} leading sample(s) of a start-up transient left out ({format_seconds(dropped[0])} "
        f"first, {format_seconds(statistics.median(kept))} steady): more taken in their place"
    )


def capture_failure(exc: BaseException) -> str:
    """Why a capture failed: the error's first line and, where the end of the capture replaced the error that
    broke it ("operation failed due to a previous error during capture"), that first error too (the exception's
    context), with what to do where its cause is known (:data:`CAPTURE_HINTS`). On the H100 the Keras-on-torch
    training steps' first error was "operation would make the legacy stream depend on a capturing blocking
    stream", raised in the backward; the note had shown only the second."""

    def line(error: BaseException) -> str:
        text = str(error).splitlines()[0] if str(error) else ""
        return f"{type(error).__name__}: {text}"[:200]

    reason = line(exc)
    first = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    if first is not None:
        reason += f"; first: {line(first)}"
    cause = str(first if first is not None else exc)
    return reason + "".join(f" ({hint})" for key, hint in CAPTURE_HINTS.items() if key in cause)


def _graph_replay_times(
    torch: Any, dev: Any, call: Callable[[], object], samples: int, replays: int
) -> tuple[list[float], list[float]]:
    # capture recipe from the CUDA graphs notes: warm up on a side stream, then capture one call
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        for _ in range(3):
            started = time.perf_counter()
            call()
            torch.cuda.synchronize(dev)
            if time.perf_counter() - started >= WARM_AFTER_ONE_S:
                break  # a long call (already run in the timed rounds) is warm on the side stream after one
    torch.cuda.current_stream(dev).wait_stream(side)
    torch.cuda.synchronize(dev)
    graph = torch.cuda.CUDAGraph()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with torch.cuda.graph(graph):
                call()
        if any("graph is empty" in str(w.message).lower() for w in caught):
            # the call launched nothing on this process's capture stream (its kernels ran elsewhere, e.g.
            # in another process): replaying the empty graph would time nothing
            raise RuntimeError("the captured CUDA graph is empty: the call launched no kernels on this stream")
        graph.replay()
        torch.cuda.synchronize(dev)
        replay = graph.replay

        def sample() -> float:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(replays):
                replay()
            end.record()
            end.synchronize()
            value = start.elapsed_time(end) / 1000.0 / replays
            _after_sample()
            return value

        return settled([sample() for _ in range(samples)], samples, sample)
    finally:
        del graph


#: a device sample at the start of a measurement more than this above the steady level (the median of the
#: later half of the samples) belongs to a start-up transient
SETTLE_TOLERANCE = 0.05


def transient_prefix(samples: Sequence[float]) -> int:
    """How many leading samples belong to a start-up transient: up to the last sample of the first half that
    lies more than :data:`SETTLE_TOLERANCE` above the median of the second half (0 for fewer than 6). Only a
    slow start is cut: samples below the steady level, and any sample of the second half, always count."""
    n = len(samples)
    if n < 6:
        return 0
    steady = statistics.median(samples[n // 2 :])
    cut = 0
    for i in range(n // 2):
        if samples[i] > steady * (1 + SETTLE_TOLERANCE):
            cut = i + 1
    return cut


def settled(
    samples: Sequence[float], needed: int, more: Callable[[], float], max_extra: int | None = None
) -> tuple[list[float], list[float]]:
    """``(kept, dropped)``: the last ``needed`` samples once a start-up transient's leading samples are dropped
    (:func:`transient_prefix`), further samples taken from ``more()`` in their place (at most ``max_extra``,
    default ``needed``; fewer are kept where the transient outlasts them). An H100 clean run once failed on
    graph replays that started at 2-3x their steady time and decayed over a second, in the first measurement
    and again at the start of its re-measurement; a steady slowdown has no such prefix and is kept whole."""
    out = list(samples)
    limit = needed if max_extra is None else max_extra
    extra = 0
    while True:
        start = transient_prefix(out)
        if len(out) - start >= needed or extra >= limit:
            return out[start:][-needed:], out[:start]
        out.append(more())
        extra += 1


#: seconds of device work one event-timed sample should span: enough back-to-back calls to average out the
#: launch noise of short calls; a call longer than this is timed alone (a 340 ms Keras training step took 25 s
#: of device timing at 5 calls per sample)
EVENTS_BATCH_S = 0.02


def events_batch(call_s: float, most: int) -> int:
    """Back-to-back calls per event-timed sample: enough for :data:`EVENTS_BATCH_S`, 1 to ``most``."""
    return max(1, min(most, math.ceil(EVENTS_BATCH_S / max(call_s, 1e-9))))


def _one_call_s(torch: Any, dev: Any, call: Callable[[], object]) -> float:
    torch.cuda.synchronize(dev)
    start = time.perf_counter()
    call()
    torch.cuda.synchronize(dev)
    return time.perf_counter() - start


def _event_times(
    torch: Any, dev: Any, call: Callable[[], object], samples: int, calls: int = 1, warm: bool = False
) -> list[float]:
    out = []
    if not warm:
        call()  # warm-up, untimed
    torch.cuda.synchronize(dev)
    for _ in range(samples):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            call()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) / 1000.0 / calls)
    return out


def batch_medians(samples: Sequence[float], batches: int = 3) -> list[float]:
    """Medians of ``batches`` consecutive, equal-sized batches of ``samples`` (the last takes the remainder):
    how far the median of one run moves between runs, for the noise band of a baseline. Empty when there
    are fewer samples than batches."""
    if len(samples) < batches or batches < 1:
        return []
    size = len(samples) // batches
    cuts = [samples[i * size : (i + 1) * size] for i in range(batches - 1)]
    cuts.append(samples[(batches - 1) * size :])
    return [statistics.median(cut) for cut in cuts]


# ---------------------------------------------------------------------------------------- host counters
#: ``torch.profiler`` runtime events that make the host wait for the device
SYNC_EVENTS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


def host_counters(call: Callable[[], object], device: str) -> dict[str, Any]:
    """What one call of ``call`` (which must *not* synchronise) asks of the host, counted in one untimed call.

    ``aten_ops``: ATen ops dispatched below autograd (a ``TorchDispatchMode``, which autograd propagates to
    its backward threads); ``alloc_bytes``: on CUDA the caching allocator's ``allocated_bytes`` growth
    during the call (workspaces included), on the CPU the bytes of the fresh storages the ops return (the
    mode sees each op's outputs; views and in-place results, which allocate nothing, are not counted);
    ``kernels`` and ``syncs`` (CUDA only; 0 on the CPU, which launches no GPU work): GPU kernels launched and
    host-device synchronisations (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``,
    ``cudaEventSynchronize``, ``cudaMemcpy`` runtime calls) seen by ``torch.profiler``. Counts are exact
    and do not depend on the machine's load; the caller counts after warm-up, never during timed rounds.
    """
    import torch

    cuda = device.startswith("cuda")
    counter = _OpCounter()
    profiler = None
    if cuda:
        from torch.profiler import ProfilerActivity, profile

        torch.cuda.synchronize(device)
        # CPU and GPU activity, as every baseline was counted: with GPU activity alone the count is faster
        # (a cuDNN-off LSTM forward on the H100: 0.10 s against 0.18 s) but an optimizer step counts one
        # kernel fewer (SGD.step: 1 against 2, deterministic), so a clean run would fail the exact kernel
        # comparison against a baseline counted the other way
        profiler = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
        before = torch.cuda.memory_stats(device).get("allocated_bytes.all.allocated", 0)
    with contextlib.ExitStack() as stack:
        if profiler is not None:
            stack.enter_context(profiler)
        stack.enter_context(_counting_mode(counter, fresh_bytes=not cuda))
        call()
        if cuda:
            torch.cuda.synchronize(device)
    out = {"aten_ops": counter.ops, "kernels": 0, "syncs": 0, "alloc_bytes": counter.fresh_bytes}
    if profiler is not None:
        kernels = syncs = 0
        from ..observation.torch_trace import profiled_events

        for name, on_gpu in profiled_events(profiler):
            if on_gpu:
                kernels += not name.startswith(("Memcpy", "Memset"))  # copies and fills are no launches
            elif name.split("_v")[0] in SYNC_EVENTS:  # runtime names may carry a version suffix
                syncs += 1
        after = torch.cuda.memory_stats(device).get("allocated_bytes.all.allocated", 0)
        # the synchronisation that closes the counted call is ours, not the call's
        out.update(kernels=kernels, syncs=max(0, syncs - 1), alloc_bytes=int(after - before))
    return out


class _OpCounter:
    def __init__(self) -> None:
        self.ops = 0
        self.fresh_bytes = 0


@contextlib.contextmanager
def _counting_mode(counter: _OpCounter, fresh_bytes: bool = True) -> Any:
    """Count the ATen ops dispatched under it and, with ``fresh_bytes`` (the CPU, where no allocator counts
    them), the bytes of the fresh storages they return. Without it (CUDA: the caching allocator counts the
    bytes) an op is only counted: walking every op's inputs and outputs cost 20 us per op, 0.2 s of the
    count of a Keras generic training step of 11,000 ops."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class Counted(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            counter.ops += 1
            return func(*args, **(kwargs or {}))

    if not fresh_bytes:
        with Counted():
            yield
        return

    class Counting(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            kwargs = kwargs or {}
            inputs = {
                t.untyped_storage().data_ptr()
                for t in tree_leaves((args, kwargs))
                if isinstance(t, torch.Tensor) and not t.is_meta
            }
            result = func(*args, **kwargs)
            counter.ops += 1
            seen: set[int] = set()
            for t in tree_leaves(result):
                if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                    storage = t.untyped_storage()
                    ptr = storage.data_ptr()
                    if ptr and ptr not in inputs and ptr not in seen:
                        seen.add(ptr)
                        counter.fresh_bytes += storage.nbytes()
            return result

    with Counting():
        yield


def host_overhead(per_call_s: float | None, device_s: float | None) -> float | None:
    """Share of the time per call that the device was not computing (0..1)."""
    if not per_call_s or device_s is None or per_call_s <= 0:
        return None
    return min(1.0, max(0.0, 1.0 - device_s / per_call_s))


# ------------------------------------------------------------------------------------------ peak FLOP/s
_PEAKS: dict[tuple[str, str], float | None] = {}
_MATMUL_DTYPE = {"fp64": "float64", "fp32": "float32", "tf32": "float32", "fp16": "float16", "bf16": "bfloat16"}
#: square GEMM sizes tried per device kind, ascending until one call takes longer than its PEAK_CALL_BUDGET_S
PEAK_SIZES = {"cpu": (256, 512, 1024, 2048), "cuda": (2048, 4096, 8192)}
PEAK_REPEATS = 5
#: a CPU GEMM reaches its plateau sooner (on 2 cores: within 10% from n = 512, where a call takes 2 ms); the
#: 2048 GEMM that a 50 ms budget let through took 0.8 s of every CPU run's first benchmark there
PEAK_CALL_BUDGET_S = {"cpu": 0.01, "cuda": 0.05}
#: how the peak is obtained, for tables and reports
PEAK_METHOD = (
    "measured peak: the best FLOP/s of square GEMMs (all threads; sizes growing up to 2048 on the CPU, 8192 "
    f"on a GPU, while a call takes under {PEAK_CALL_BUDGET_S['cpu'] * 1e3:.0f} ms on the CPU, "
    f"{PEAK_CALL_BUDGET_S['cuda'] * 1e3:.0f} ms on a GPU; best of {PEAK_REPEATS} calls each) "
    "in the precision and, for fp16/bf16, also in fp32"
)


def measured_peak_flops(device: str, precision: str) -> float | None:
    """The device's peak FLOP/s in ``precision``, measured once per process (:data:`PEAK_METHOD`)."""
    key = (device, precision)
    if key not in _PEAKS:
        try:
            _PEAKS[key] = _measure_peak(device, precision)
        except Exception:
            _PEAKS[key] = None
    return _PEAKS[key]


def format_peak_fraction(fraction: float | None) -> str:
    """``52.0%``; a share above 100% cannot be a share of a peak: flagged as a measurement error."""
    if fraction is None:
        return "-"
    if fraction > 1.0:
        return f"{fraction:.0%}: measurement error (peak under-measured)"
    return f"{fraction:.1%}"


def _measure_peak(device: str, precision: str) -> float | None:
    """The best of several GEMM sizes and repeats: a peak is an upper bound, so every disturbance (a busy
    neighbour, a cold cache, a size the library tiles badly) can only lower a sample, and the maximum is the
    most faithful estimate. A layer in fp16/bf16 may compute parts in fp32 (CPU autocast does), so for those
    precisions the fp32 GEMM is a candidate too."""
    import torch

    if precision not in _MATMUL_DTYPE:
        return None
    cuda = device.startswith("cuda")
    names = [_MATMUL_DTYPE[precision]] + (["float32"] if precision in ("fp16", "bf16") else [])
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        rates = [rate for name in names for rate in _gemm_rates(torch, device, getattr(torch, name), cuda)]
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    return max(rates) if rates else None


def _gemm_rates(torch: Any, device: str, dtype: Any, cuda: bool) -> list[float]:
    """FLOP/s per GEMM size, ascending, stopping after the first size whose fastest call exceeds the budget."""
    rates = []
    kind = "cuda" if cuda else "cpu"
    for n in PEAK_SIZES[kind]:
        if dtype == torch.float64 and n > 4096:
            break
        best = _fastest_gemm(torch, device, dtype, n)
        rates.append(2.0 * n**3 / best)
        if best > PEAK_CALL_BUDGET_S[kind]:
            break
    return rates


def _fastest_gemm(torch: Any, device: str, dtype: Any, n: int) -> float:
    """Seconds of the fastest of :data:`PEAK_REPEATS` synchronised ``n x n`` GEMMs (after one warm-up call)."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    sync = (lambda: torch.cuda.synchronize(device)) if device.startswith("cuda") else (lambda: None)
    torch.mm(a, b)
    sync()
    best = math.inf
    for _ in range(PEAK_REPEATS):
        start = time.perf_counter()
        torch.mm(a, b)
        sync()
        best = min(best, time.perf_counter() - start)
    return best
