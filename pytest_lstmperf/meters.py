"""Device-time meters: what the device spends on a call, measured in the process that runs it (the benchmark's, or
a Keras worker's); what a call asks of the host is :mod:`.host_counters`.

* **Device time** (:func:`device_time`): a CUDA graph of one call is captured and replayed; CUDA events around
  the replays, queued behind a spin of the GPU so that the host's launches leave no gap between them
  (:mod:`.graph_replay`), time the kernels without the host. When capture fails (an
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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .graph_replay import capture_failure, graph_replay_times
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
        times = graph_replay_times(
            torch, dev, call, samples, replays, warm_after_s=WARM_AFTER_ONE_S, after_sample=_after_sample
        )
        return DeviceTime("cuda-graph", tuple(times))
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


def transient_note(kept: Sequence[float], dropped: Sequence[float]) -> str:
    """What :func:`settled` left out of a device measurement, or '' where it left out nothing."""
    if not dropped:
        return ""
    return (
        f"{len(dropped)} leading sample(s) of a start-up transient left out ({format_seconds(dropped[0])} "
        f"first, {format_seconds(statistics.median(kept))} steady): more taken in their place"
    )


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
    replays are queued behind a spin instead (:class:`.graph_replay.ReplayTimer`): there, samples that started at
    2-3x their steady level on the H100 were the host's launch gaps, and dropping them once traded clean samples
    for slow ones."""
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
