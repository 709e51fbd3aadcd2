"""Wall-clock timing shared by the workloads: the median time of a call after warm-up calls, several calls
timed in alternation so that a change of load on the machine moves them alike, and the synchronisation that
makes a device's queued work count (``torch.cuda.synchronize`` on a GPU, nothing on the CPU). Used by the
variable-length workload (:mod:`.varlen`), the crossover sweep (:mod:`.crossover`), the overhead measurement
(:mod:`.overhead`) and the workload suite.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any


def median_time(
    call: Callable[[], object], synchronize: Callable[[], None], repeats: int = 7, warmup: int = 2
) -> float:
    """Median wall seconds of ``call`` followed by ``synchronize``, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        call()
        synchronize()
    times = []
    for _ in range(max(repeats, 1)):
        start = time.perf_counter()
        call()
        synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def paired_median_times(
    calls: Sequence[Callable[[], object]], synchronize: Callable[[], None], repeats: int = 15, warmup: int = 2
) -> list[float]:
    """Median wall seconds of each of ``calls`` (each followed by ``synchronize``), timed in alternation:
    round ``r`` times every call once, so a change of load on the machine (a neighbour, another pytest-xdist
    worker) moves every figure alike and their ratios stay meaningful."""
    for _ in range(warmup):
        for call in calls:
            call()
            synchronize()
    times: list[list[float]] = [[] for _ in calls]
    for _ in range(max(repeats, 1)):
        for call, samples in zip(calls, times, strict=True):
            start = time.perf_counter()
            call()
            synchronize()
            samples.append(time.perf_counter() - start)
    return [statistics.median(samples) for samples in times]


def sync(torch: Any, device: Any) -> Callable[[], None]:
    """A function that waits for ``device``'s queued work: ``torch.cuda.synchronize`` on CUDA, nothing else."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None
