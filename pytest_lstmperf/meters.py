"""Device-time meters: what the device spends on a call, measured in the process that runs it (the benchmark's, or
a Keras worker's); what a call asks of the host is :mod:`.host_counters`.

* **Device time** (:func:`device_time`): a CUDA graph of one call is captured and replayed; CUDA events around
  the replays, queued behind a spin of the GPU so that the host's launches leave no gap between them
  (:class:`ReplayTimer`), time the kernels without the host. When capture fails (an
  op that synchronises, a CPU fallback inside the call) the call itself is timed with CUDA events around
  several back-to-back calls (their mean is one sample), a note says so: that figure also holds the gaps where
  the GPU waited for launches, so it is an upper bound. Work another runtime launches in this process (XLA:
  Keras on JAX) is timed from CUPTI, else from calls queued back to back (:func:`xla_device_time`).
* Device samples taken inside :func:`paired_with` alternate with another meter's (the anchor's).

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

from .host_counters import cuda_profile

# ------------------------------------------------------------------------------------------ sample counts
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


# ---------------------------------------------------------------------------------------- paired samples
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
        return DeviceTime("cuda-graph", tuple(_graph_replay_times(torch, dev, call, samples, replays)))
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


def capture_graph(torch: Any, dev: Any, call: Callable[[], object], warmups: int = 3) -> Any:
    """A CUDA graph of one call of ``call``, by the recipe of the CUDA graphs notes: warm-up calls on a side
    stream (one for a call of :data:`WARM_AFTER_ONE_S` or more: it ran in the timed rounds already), then one call
    captured. A capture that fails leaves the device's default random generator as it found it: torch marks the
    generator as capturing when a capture begins and clears the mark only when the capture ends well, so after a
    failed capture of a call that draws random numbers (dropout in training) every later random op of the
    process raised "Offset increment outside graph capture encountered unexpectedly" (on the H100 a failed
    capture in one test failed the next test's dropout)."""
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        for _ in range(warmups):
            started = time.perf_counter()
            call()
            torch.cuda.synchronize(dev)
            if time.perf_counter() - started >= WARM_AFTER_ONE_S:
                break
    torch.cuda.current_stream(dev).wait_stream(side)
    torch.cuda.synchronize(dev)
    generator = _default_generator(torch, dev)
    saved = generator.get_state() if generator is not None else None
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            call()
    except BaseException:
        if generator is not None:
            release_generator(torch, dev, generator, saved)
        raise
    return graph


def _default_generator(torch: Any, dev: Any) -> Any:
    try:
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        return torch.cuda.default_generators[index]
    except Exception:
        return None


def release_generator(torch: Any, dev: Any, generator: Any, state: Any) -> None:
    """Give ``generator`` a fresh state holding ``state`` (its seed and offset before a capture), not marked as
    capturing: what a capture that failed should have left."""
    with contextlib.suppress(Exception):
        torch.cuda.synchronize(dev)
    fresh = torch.Generator(device=dev)
    fresh.set_state(state)
    generator.graphsafe_set_state(fresh)


#: how long the GPU spins before a device sample's replays at first: the host queues the replays meanwhile, so
#: that the GPU runs them back to back whatever the host does (doubled, up to :data:`MAX_HOLD_S`, where the host
#: was not done queueing when the spin ended)
HOLD_S = 0.0005
MAX_HOLD_S = 0.05
_SPIN_RATE: dict[str, float] = {}  # GPU spin cycles per second, per device


class ReplayTimer:
    """Device seconds per replay of a captured CUDA graph: ``replays`` back-to-back replays between two CUDA
    events, queued behind a spin of the GPU (``torch.cuda._sleep``) long enough for the host to queue them all
    before the first starts. Without it the events also timed the gaps where the GPU waited for the host to
    launch the next replay: on the H100 a 190 us graph of small kernels read 17% slow for a whole measurement
    while the anchor's 350 us matmul, whose replays the host queues while the previous one runs, read 3% slow
    (a busy host, not a slower GPU). A sample whose spin ended before the host had queued its replays is taken
    again with a longer spin; one still late at :data:`MAX_HOLD_S` is kept."""

    def __init__(self, torch: Any, dev: Any, replay: Callable[[], object], replays: int) -> None:
        self.torch, self.dev, self.replay, self.replays = torch, dev, replay, replays
        self.hold_s = HOLD_S
        self.rate = _spin_rate(torch, dev)

    def __call__(self) -> float:
        torch = self.torch
        while True:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            if self.rate:
                torch.cuda._sleep(int(self.hold_s * self.rate))
            start.record()
            for _ in range(self.replays):
                self.replay()
            end.record()
            late = bool(self.rate) and start.query()  # the GPU had reached the first replay already
            end.synchronize()
            if not late or self.hold_s >= MAX_HOLD_S:
                return float(start.elapsed_time(end)) / 1000.0 / self.replays
            self.hold_s = min(2 * self.hold_s, MAX_HOLD_S)


def _spin_rate(torch: Any, dev: Any) -> float:
    """Cycles per second of ``torch.cuda._sleep`` on ``dev`` (measured once per process); 0 where it is missing."""
    key = str(dev)
    if key not in _SPIN_RATE:
        rate = 0.0
        with contextlib.suppress(Exception):
            cycles = 1_000_000
            torch.cuda._sleep(cycles)  # the first launch loads the kernel
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            end.synchronize()
            rate = cycles / (start.elapsed_time(end) / 1000.0)
        _SPIN_RATE[key] = rate
    return _SPIN_RATE[key]


def _graph_replay_times(torch: Any, dev: Any, call: Callable[[], object], samples: int, replays: int) -> list[float]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graph = capture_graph(torch, dev, call)
    try:
        if any("graph is empty" in str(w.message).lower() for w in caught):
            # the call launched nothing on this process's capture stream (its kernels ran elsewhere, e.g.
            # in another process): replaying the empty graph would time nothing
            raise RuntimeError("the captured CUDA graph is empty: the call launched no kernels on this stream")
        graph.replay()
        torch.cuda.synchronize(dev)
        timer = ReplayTimer(torch, dev, graph.replay, replays)

        def sample() -> float:
            value = timer()
            _after_sample()
            return value

        return [sample() for _ in range(samples)]
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
    default ``needed``; fewer are kept where the transient outlasts them); a steady slowdown has no such prefix
    and is kept whole. For the meters that time calls as the host queues them (CUPTI, pipelined calls); graph
    replays are queued behind a spin instead (:class:`ReplayTimer`): there, samples that started at 2-3x their
    steady level on the H100 were the host's launch gaps, and dropping them once traded clean samples for slow
    ones."""
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


# ----------------------------------------------------------------------------------------- formatting
def format_seconds(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.3g} s"
