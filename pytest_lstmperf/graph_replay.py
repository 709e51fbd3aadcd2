"""Capturing a call as a CUDA graph and timing its replays: the call is captured once (by the recipe of the CUDA
graphs notes, a failed capture leaving the random generator usable and saying why it failed), and each device
sample is the mean of back-to-back replays between two CUDA events, queued behind a spin of the GPU so that the
host has launched them all before the first starts and its launch gaps are not timed. torch is handed in by the
caller: this module imports no framework.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable
from typing import Any

#: what a capture's first error says, and what to do about it
CAPTURE_HINTS = {
    "legacy stream": (
        "the call's autograd nodes were made on the legacy default stream: make and run what it calls on a stream "
        "of its own (torch.cuda.set_stream(torch.cuda.Stream()) before building it) to capture it"
    ),
}


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


def capture_graph(torch: Any, dev: Any, call: Callable[[], object], *, warm_after_s: float, warmups: int = 3) -> Any:
    """A CUDA graph of one call of ``call``, by the recipe of the CUDA graphs notes: warm-up calls on a side stream (one
    for a call of ``warm_after_s`` or more, :data:`.meters.WARM_AFTER_ONE_S`: it ran in the timed rounds already), then
    one call captured. A capture that fails leaves the device's default random generator as it found it: torch marks the
    generator as capturing when a capture begins and clears the mark only when the capture ends well, so after a failed
    capture of a call that draws random numbers (dropout in training) every later random op of the process raised
    "Offset increment outside graph capture encountered unexpectedly" (on the H100 a failed capture in one test failed
    the next test's dropout)."""
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        for _ in range(warmups):
            started = time.perf_counter()
            call()
            torch.cuda.synchronize(dev)
            if time.perf_counter() - started >= warm_after_s:
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


def graph_replay_times(
    torch: Any,
    dev: Any,
    call: Callable[[], object],
    samples: int,
    replays: int,
    *,
    warm_after_s: float,
    after_sample: Callable[[], None] | None = None,
) -> list[float]:
    """``samples`` device samples of ``call``, each the seconds per replay of ``replays`` replays of its CUDA
    graph (:func:`capture_graph`, :class:`ReplayTimer`), each followed by ``after_sample()`` where given (the
    paired anchor's sample, :func:`.meters.paired_with`). Raises where the capture fails or captured nothing."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graph = capture_graph(torch, dev, call, warm_after_s=warm_after_s)
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
            if after_sample is not None:
                after_sample()
            return value

        return [sample() for _ in range(samples)]
    finally:
        del graph
