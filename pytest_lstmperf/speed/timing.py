"""Timing a benchmark that is right on GPUs and on busy machines: what a user waits for, and a fixed anchor
workload timed beside it. What the device spends and what a call asks of the host are measured by
:mod:`pytest_lstmperf.meters`.

* **Time per call** (what users feel): host wall clock around ``call(); synchronize()``, one call per round,
  after warm-up. The synchronisation makes queued CUDA work count; the host overhead (Python, dispatch,
  kernel launches) is included. pytest-benchmark takes these samples when it runs enabled; under
  pytest-xdist it disables itself and :func:`..anchor.paired_rounds` takes them the same way.
* **Host overhead share**: ``1 - device / per call``.
* **Achieved FLOP/s** against the device's *measured* peak: the best of several large GEMMs in the same
  precision, once per process (:func:`measured_peak_flops`, :data:`PEAK_METHOD`); a share above 100% is
  flagged as a measurement error (:func:`format_peak_fraction`).
* **The anchor** (:mod:`pytest_lstmperf.anchor`): a fixed workload of the benchmark's device, timed in pairs with
  its calls and its device time beside the benchmark's, so that what the whole machine does to both (a slow phase,
  a busy neighbour, a lower clock) cancels in their ratio (:mod:`.policy`, sentence 1).

torch is imported only inside the functions that need it.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..meters import long_call_samples
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
