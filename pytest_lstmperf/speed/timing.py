"""Timing a benchmark that is right on GPUs and on busy machines: what a user waits for, and a fixed anchor
workload timed beside it. What the device spends and what a call asks of the host are measured by
:mod:`pytest_lstmperf.meters`.

* **Time per call** (what users feel): host wall clock around ``call(); synchronize()``, one call per round,
  after warm-up. The synchronisation makes queued CUDA work count; the host overhead (Python, dispatch,
  kernel launches) is included. pytest-benchmark takes these samples when it runs enabled; under
  pytest-xdist it disables itself and :func:`paired_rounds` takes them the same way.
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

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .. import graph_replay
from ..meters import WARM_AFTER_ONE_S, DeviceTime, long_call_samples
from ..model.precision import DTYPE_PRECISION, HALF_PRECISIONS
from .benchmark_adapter import load_timer


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


def estimate_call(call: Callable[[], object], warmup: int, clock: Callable[[], float] = time.perf_counter) -> float:
    """Warm up, then the median of three timed calls (``call`` must synchronise). A first call of at least
    :data:`..meters.WARM_AFTER_ONE_S` is the whole warm-up, and the next call the estimate."""
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


class Anchor:
    """A fixed workload on the benchmark's device, timed beside every benchmark call (:mod:`.policy`, sentence 1).

    Per call: ten steps of ``h = tanh(x @ W + h @ U)`` on 16x64 tensors (a few dozen small ops: the dispatcher,
    the allocator, a little arithmetic, a synchronisation on a GPU), run ``repeat`` times so that it lasts about
    as long as the benchmark's call; :meth:`time` returns seconds per repetition, so figures taken with another
    ``repeat`` stay comparable. On a GPU also a device part, one 2048x2048 matmul and a ``tanh``
    (:meth:`device_call`), whose device time is taken the same way as the benchmark's. It touches no LSTM or GRU
    layer: a slower layer does not move it, while a slower machine moves both. torch where it is installed (the
    benchmark's own threads and device), else numpy. On a CPU the ten steps run through ``backward``, as a
    training step does: on a 16-core Xeon that left a half to a quarter of the spread between processes that the
    forward steps left, for training steps and forward calls alike (docs/speed-gate.md).
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
            # the CPU anchor runs through backward (:meth:`once`): a baseline timed beside the forward-only anchor
            # ("torch-cpu") is not comparable with it (:func:`policy.comparable`)
            self.kind = "torch-cuda" if dev.type == "cuda" else f"torch-{dev.type}-backward"
            self._x, self._w, self._u = (
                (torch.randn(*s, generator=gen) / 8).to(dev) for s in ((16, 64), (64, 64), (64, 64))
            )
            self._cuda = dev.type == "cuda"
            self._graph: Any = None
            self._timer: Any = None
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
        if not self._cuda:
            if not self._w.requires_grad:
                self._w.requires_grad_(True)
                self._u.requires_grad_(True)
            with torch.enable_grad():
                h = self._x
                for _ in range(self.STEPS):
                    h = torch.tanh(torch.addmm(h @ self._u, self._x, self._w))
                h.sum().backward()
            self._w.grad = self._u.grad = None
            return
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
        """Device seconds of the device part, from ``replays`` back-to-back replays of its CUDA graph, timed as
        :func:`..meters.device_time` times a benchmark's (:class:`..graph_replay.ReplayTimer`); the graph is captured
        once per run."""
        if self._timer is None or self._timer.replays != replays:
            torch = self._torch
            dev = torch.device(self.torch_device)
            if self._graph is None:
                self._graph = graph_replay.capture_graph(torch, dev, self.device_call, warm_after_s=WARM_AFTER_ONE_S)
                self._graph.replay()
                torch.cuda.synchronize(dev)
            self._timer = graph_replay.ReplayTimer(torch, dev, self._graph.replay, replays)
        return float(self._timer())

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


class Pairs:
    """Where a benchmark's call is timed and its anchor beside it: here, in this process (a Keras benchmark on
    a CPU is timed in its worker instead: :class:`pytest_lstmperf.paths.keras.paths.WorkerPairs`, the same
    methods). The test's rounds and the sweep's slices take their pairs through this."""

    def __init__(self, timed: Callable[[], object], anchor: Anchor, clock: Callable[[], float] = time.perf_counter):
        self.timed = timed  # one call, synchronised
        self.anchor = anchor
        self.clock = clock
        self.kind = anchor.kind

    def estimate(self, warmup: int) -> float:
        """Seconds of one call after ``warmup`` calls (:func:`estimate_call`)."""
        return estimate_call(self.timed, warmup, self.clock)

    def repeat_for(self, call_s: float | None, baseline: int | None = None) -> int:
        return self.anchor.repeat_for(call_s, baseline)

    def warm(self) -> None:
        """One untimed call."""
        self.timed()

    def rounds(self, repeat: int, rounds: int) -> tuple[list[float], list[float]]:
        """:func:`paired_rounds` of the call and the anchor."""
        return paired_rounds(self.timed, self.anchor, repeat, rounds, self.clock)


def benchmark_timer(config: Any) -> Callable[[], float]:
    """The clock pytest-benchmark times with (``--benchmark-timer``, default ``time.perf_counter``), so that
    rounds timed here (under pytest-xdist) use the same one."""
    raw = config.getoption("benchmark_timer", None)
    if not raw:
        return time.perf_counter
    clock: Callable[[], float] = load_timer(str(raw))
    return clock


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


def host_overhead(per_call_s: float | None, device_s: float | None) -> float | None:
    """Share of the time per call that the device was not computing (0..1)."""
    if not per_call_s or device_s is None or per_call_s <= 0:
        return None
    return min(1.0, max(0.0, 1.0 - device_s / per_call_s))


# ------------------------------------------------------------------------------------------ peak FLOP/s
_PEAKS: dict[tuple[str, str], float | None] = {}
_MATMUL_DTYPE = {**{p: d for d, p in DTYPE_PRECISION.items()}, "tf32": "float32"}
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
    names = [_MATMUL_DTYPE[precision]] + (["float32"] if precision in HALF_PRECISIONS else [])
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
