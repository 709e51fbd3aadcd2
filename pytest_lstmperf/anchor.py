"""The anchor: a fixed workload timed beside every benchmark call, so that what the whole machine does to both (a
slow phase, a busy neighbour, a lower clock) cancels in their ratio (:mod:`.speed.policy`, sentence 1), and the
pairs of (call, anchor) timed where the call runs: in this process (:class:`Pairs`), or in a Keras worker, which
imports this module to time its calls beside an anchor of its own (:class:`.paths.keras.paths.WorkerPairs`).

torch is imported only inside the functions that need it.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable
from typing import Any, Protocol

from . import graph_replay
from .meters import WARM_AFTER_ONE_S, DeviceTime


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
#: a CPU benchmark's reduced precision (its observed kernel's) -> the autocast dtype its anchor runs in
#: (:meth:`Anchor.in_precision`)
REDUCED_PRECISIONS = {"bf16": "bfloat16", "fp16": "float16"}


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
            self._autocast: str | None = None  # a torch dtype's name: the steps run under autocast (in_precision)
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
            if self._autocast:  # in a reduced precision (in_precision); the fp32 steps enter no autocast context,
                # which would add its own 3 us to each repetition
                with torch.autocast("cpu", dtype=getattr(torch, self._autocast)):
                    self._backward_steps(torch)
            else:
                self._backward_steps(torch)
            return
        with torch.no_grad():
            h = self._x
            for _ in range(self.STEPS):
                h = torch.tanh(torch.addmm(h @ self._u, self._x, self._w))
            if self._cuda:
                torch.cuda.synchronize(self.torch_device)

    def _backward_steps(self, torch: Any) -> None:
        with torch.enable_grad():
            h = self._x
            for _ in range(self.STEPS):
                h = torch.tanh(torch.addmm(h @ self._u, self._x, self._w))
            h.sum().backward()
        self._w.grad = self._u.grad = None

    def in_precision(self, precision: str) -> Anchor:
        """This anchor with its steps run under autocast in ``precision`` (:data:`REDUCED_PRECISIONS`) on a CPU,
        its kind saying so (``torch-cpu-backward-bf16``); itself for any other precision, on a GPU, or without
        torch. What moves a bf16 call from process to process is not what moves fp32 arithmetic: on the 2-core VM
        the native LSTM and GRU at batch 16 under bf16 autocast lay 3.3% and 2.3% apart over 42 processes divided
        by the fp32 anchor, 1.3% and 0.9% divided by this one, while an fp32 LSTM lay 0.9% apart beside the fp32
        anchor and 2.1% beside this one (scripts/precision_anchor_probe.py)."""
        dtype = REDUCED_PRECISIONS.get(precision)
        if dtype is None or self._torch is None or self._cuda:
            return self
        other = copy.copy(self)  # the same tensors: one anchor per run, run one call at a time
        other._autocast = dtype
        other.kind = f"{self.kind}-{precision}"
        return other

    def _fit(self, call_s: float | None, one: float) -> int:
        """The repetitions that make the anchor last about ``call_s`` at ``one`` per repetition: a power of two up
        to :data:`MAX_REPEAT`."""
        repeat = 1
        while call_s and repeat * one < call_s and repeat < self.MAX_REPEAT:
            repeat *= 2
        return repeat

    def repeat_for(self, call_s: float | None, baseline: int | None = None) -> int:
        """The repetitions for a call of ``call_s``: ``baseline``, those its baseline entry (or the run's first
        process) was timed with, wherever there are any, so that every figure of a benchmark pairs with the same
        anchor: a call's own time depends on how long the anchor ran just before it (on the 2-core VM
        Keras-on-TensorFlow's LSTM at batch 1 read 1.57 of the anchor after one repetition, 2.04 after four and
        2.53 after eight). Else fitted to the call, up to :data:`ANCHOR_MAX_S`, as for a new entry. A machine so
        slow that the anchor lasts far longer than recorded is not comparable (:func:`.speed.policy.comparable`)."""
        if baseline:
            return baseline
        one = min(self.time(1) for _ in range(3))
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


#: what a CPU pair's kind ends with (:class:`Pairs`): its call is timed after an untimed call of its own
WARM_SUFFIX = "-warm"


def paired_rounds(
    call: Callable[[], object],
    anchor: Anchor,
    repeat: int,
    rounds: int,
    clock: Callable[[], float] = time.perf_counter,
    warm: bool = False,
) -> tuple[list[float], list[float]]:
    """``rounds`` pairs of (seconds of one ``call``, which must synchronise; seconds per repetition of the
    anchor), the anchor first in every pair, as pytest-benchmark's ``setup`` runs it; ``warm``: each timed call
    after an untimed one (:class:`Pairs`)."""
    data, anchors = [], []
    for _ in range(rounds):
        anchors.append(anchor.time(repeat, clock))
        if warm:
            call()
        start = clock()
        call()
        data.append(clock() - start)
    return data, anchors


class TimedPairs(Protocol):
    """Where a benchmark's call is timed beside the anchor: :class:`Pairs` in this process, or a Keras worker's
    (:class:`.paths.keras.paths.WorkerPairs`). The runner's rounds and the sweep's slices see only this."""

    kind: str  # the anchor's kind, which says where it ran (records, :func:`.speed.policy.comparable`)
    clock: Callable[[], float]
    calls: int  # calls per round: 2 where each timed call follows an untimed one (a CPU's), else 1

    def estimate(self, warmup: int) -> float: ...

    def repeat_for(self, call_s: float | None, baseline: int | None = None) -> int: ...

    def warm(self) -> None: ...

    def rounds(self, repeat: int, rounds: int) -> tuple[list[float], list[float]]: ...


class Pairs:
    """Where a benchmark's call is timed and its anchor beside it: here, in this process (a Keras benchmark on
    a CPU is timed in its worker instead: :class:`pytest_lstmperf.paths.keras.paths.WorkerPairs`, the same
    methods). The test's rounds and the sweep's slices take their pairs through this.

    On a CPU each timed call follows an untimed call of its own, after the anchor (kind ``...-warm``): a call timed
    right after the anchor was slower by as much as the anchor lasted (what the anchor evicted from the caches,
    likely; not measured apart), and how much moved from process to process. On the 2-core VM ONNX Runtime's LSTM at
    batch 1 took 57 us after one repetition of the anchor and 78 us after eight, 34-37 us after a call of its own;
    Keras-on-TensorFlow's 679-1,010 us against 630-704 us, and its figure lay 9.9-14.9% apart over a recording's
    processes. On a GPU the device time decides, and a call is timed as before (``torch-cuda``)."""

    def __init__(self, timed: Callable[[], object], anchor: Anchor, clock: Callable[[], float] = time.perf_counter):
        self.timed = timed  # one call, synchronised
        self.anchor = anchor
        self.clock = clock
        self.calls = 1 if anchor.kind == "torch-cuda" else 2  # on a CPU the timed call follows an untimed one
        self.kind = anchor.kind + (WARM_SUFFIX if self.calls > 1 else "")

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
        return paired_rounds(self.timed, self.anchor, repeat, rounds, self.clock, warm=self.calls > 1)
