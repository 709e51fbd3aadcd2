"""How long a long command has left: :class:`Remaining`, for the progress lines of the CLI's commands that can
run for minutes (``lstmperf crossover``, ``lstmperf report --run``).

A command made of steps that each cost more with a size (a batch size; 1 for steps of one kind) records each
finished step's time with :meth:`Remaining.finished`. The estimate fits the finished steps' times as
``a + c * size`` (least squares, neither term negative) and sums it over the steps left. With one size seen, it
can only assume that every step left takes as long as those done: where the steps left are larger, that is a
lower bound, and the line says "at least".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence


def format_duration(seconds: float) -> str:
    """``42 s``, ``3 min 05 s``, ``1 h 02 min``."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


class Remaining:
    """The time left of a run of steps of the given sizes, in order."""

    def __init__(self, sizes: Sequence[float], clock: Callable[[], float] = time.perf_counter) -> None:
        self.sizes = [float(s) for s in sizes]
        self.done: list[tuple[float, float]] = []
        self.clock = clock
        self._since = clock()

    def start(self) -> None:
        """The next step starts now (the time since the last :meth:`finished` is not counted)."""
        self._since = self.clock()

    def finished(self, size: float | None = None) -> None:
        """The next step (of ``size``, by default the next of :attr:`sizes`) has finished."""
        now = self.clock()
        step = self.sizes[len(self.done)] if size is None else float(size)
        self.done.append((step, now - self._since))
        self._since = now

    def _fit(self) -> tuple[float, float]:
        sizes = [s for s, _ in self.done]
        times = [t for _, t in self.done]
        n = len(sizes)
        mean_s, mean_t = sum(sizes) / n, sum(times) / n
        spread = sum((s - mean_s) ** 2 for s in sizes)
        if spread == 0:
            return mean_t, 0.0
        c = sum((s - mean_s) * (t - mean_t) for s, t in self.done) / spread
        a = mean_t - c * mean_s
        if c < 0:
            return mean_t, 0.0
        if a < 0:
            return 0.0, sum(s * t for s, t in self.done) / sum(s * s for s in sizes)
        return a, c

    def estimate(self) -> tuple[float, bool] | None:
        """(seconds left, whether that is only a lower bound); None before the first step has finished."""
        if not self.done:
            return None
        left = self.sizes[len(self.done) :]
        a, c = self._fit()
        one_size = len({s for s, _ in self.done}) == 1
        lower_bound = one_size and any(s > self.done[0][0] for s in left)
        return sum(a + c * s for s in left), lower_bound

    def line(self) -> str:
        """``about 3 min 05 s left`` / ``at least 40 s left`` / ``time left: known after the first step``."""
        found = self.estimate()
        if found is None:
            return "time left: known after the first step"
        seconds, lower_bound = found
        return f"{'at least' if lower_bound else 'about'} {format_duration(seconds)} left"
