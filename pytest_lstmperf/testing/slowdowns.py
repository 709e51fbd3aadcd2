"""The planted slowdowns: ``slowdown:F`` makes each ``torch.nn.LSTM``/``GRU`` call (and its backward pass) take
``F`` times as long in host time, waiting with :func:`pause` on the chosen clock, and ``kernel-slowdown:F`` makes
its GPU work take ``F`` times as long by stalling the stream with a sleep kernel sized from the layer's profiled
kernel time. Each returns the undo; :mod:`.faults` plants them (its docstring describes both in full).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from .patching import CLOCKS, check_clock, first_tensor, map_outputs, patch_forward


def pause(seconds: float, clock: str = "wall") -> None:
    """Wait ``seconds`` accurately: ``time.sleep`` overshoots sub-millisecond waits by tens of
    microseconds, so the last millisecond is spun on the clock. On the ``thread`` clock the whole wait is
    spun (a sleeping thread uses no CPU time)."""
    if seconds <= 0:
        return
    if clock == "thread":
        now = CLOCKS["thread"]
        deadline = now() + seconds
        while now() < deadline:
            pass
        return
    deadline = time.perf_counter() + seconds
    if seconds > 0.002:
        time.sleep(seconds - 0.001)
    while time.perf_counter() < deadline:
        pass


def plant_slowdown(factor: float, clock: str = "wall") -> Callable[[], None]:
    import torch

    extra = factor - 1.0
    now = CLOCKS[check_clock(clock)]
    state = {"active": True}

    def sync(tensor: Any) -> None:
        if tensor is not None and tensor.is_cuda:
            torch.cuda.synchronize(tensor.device)

    def capturing() -> bool:
        return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()

    class _StampBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, tensor: Any, box: Any) -> Any:
            ctx.box = box
            return tensor.view_as(tensor)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            sync(grad)
            ctx.box["start"] = now()
            return grad, None

    def hook_for(module: Any, reference: Any) -> Any:
        box = module.__dict__.setdefault("_lstmperf_slowdown_box", {})
        if "handle" not in box:
            weight = next(iter(module.parameters()))

            def on_grad(grad: Any) -> None:
                start = box.pop("start", None)
                if start is None or not state["active"] or capturing():
                    return
                sync(grad)
                pause(extra * (now() - start), clock)

            box["handle"] = weight.register_hook(on_grad)
        return box

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not state["active"] or capturing():
                return original(self, *args, **kwargs)
            first = first_tensor(args)
            sync(first)
            start = now()
            out = original(self, *args, **kwargs)
            sync(first)
            pause(extra * (now() - start), clock)
            if torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters()):
                box = hook_for(self, first)
                out = map_outputs(out, lambda t: _StampBackward.apply(t, box) if t.requires_grad else t)
            return out

        return forward

    return patch_forward(wrap, state)


def worker_slowdown_env(factor: float, clock: str = "wall") -> Callable[[], None]:
    """``slowdown:F`` for the Keras workers (separate processes, which the torch patch does not reach): the
    workers this run starts call :func:`plant_worker_slowdown` as they start (their hook,
    :data:`~pytest_lstmperf.paths.keras.server.WORKER_HOOK_ENV`); returns the undo."""
    from ..paths.keras.server import WORKER_HOOK_ENV

    before = os.environ.get(WORKER_HOOK_ENV)
    os.environ[WORKER_HOOK_ENV] = f"{__name__}:plant_worker_slowdown:{factor}:{check_clock(clock)}"

    def undo() -> None:
        if before is None:
            os.environ.pop(WORKER_HOOK_ENV, None)
        else:
            os.environ[WORKER_HOOK_ENV] = before

    return undo


def plant_worker_slowdown(raw: str) -> Callable[[], None]:
    """In a Keras worker: each prepared run's ``forward`` and ``train_step`` (the whole Keras layer stack's call
    and training step) take ``F`` times as long, ``raw`` being ``F:CLOCK``: the call runs, is synchronised, and
    its elapsed time ``t`` buys a wait of ``(F - 1) * t`` on the clock (:func:`pause`). The worker's
    counterpart of ``slowdown:F``: a Keras benchmark's call is timed in its worker, which the planted torch
    layers of the test process do not reach. Returns the undo."""
    from ..paths.keras.runners import LocalKerasRun

    factor, _, clock = raw.partition(":")
    extra, clock = float(factor) - 1.0, check_clock(clock or "wall")
    now = CLOCKS[clock]

    def wrap(original: Callable[[Any], None]) -> Callable[[Any], None]:
        def call(self: Any) -> None:
            start = now()
            original(self)
            self.synchronize()
            pause(extra * (now() - start), clock)

        return call

    originals = {name: LocalKerasRun.__dict__[name] for name in ("forward", "train_step")}
    for name, original in originals.items():
        setattr(LocalKerasRun, name, wrap(original))

    def undo() -> None:
        for name, original in originals.items():
            setattr(LocalKerasRun, name, original)

    return undo


def _kernel_seconds(prof: Any) -> float:
    """Sum of the GPU kernels' (and memory operations') durations a profiler saw, in seconds."""
    total = 0.0
    for event in prof.events():
        if "CUDA" in str(getattr(event, "device_type", "")):
            total += event.time_range.elapsed_us() * 1e-6
    return total


def plant_kernel_slowdown(factor: float) -> Callable[[], None]:
    import torch

    if not torch.cuda.is_available():
        raise ValueError("kernel-slowdown adds GPU work: it needs a usable CUDA device")
    extra = factor - 1.0
    state = {"active": True}
    rate: dict[int, float] = {}
    cost: dict[tuple[Any, ...], tuple[float, float]] = {}

    def capturing() -> bool:
        return torch.cuda.is_current_stream_capturing()

    def profiling() -> bool:
        return bool(torch.autograd.profiler._is_profiler_enabled)

    def cycles_per_s(device: Any) -> float:
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in rate:
            with torch.cuda.device(index):
                torch.cuda._sleep(1000)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                torch.cuda._sleep(20_000_000)
                end.record()
                end.synchronize()
                rate[index] = 20_000_000 / (start.elapsed_time(end) * 1e-3)
        return rate[index]

    def stall(device: Any, seconds: float) -> None:
        if seconds > 0:
            with torch.cuda.device(device):
                torch.cuda._sleep(max(int(seconds * cycles_per_s(device)), 1))

    def measure(module: Any, original: Callable[..., Any], args: Any, kwargs: Any) -> tuple[float, float]:
        from torch.profiler import ProfilerActivity, profile

        grad = torch.is_grad_enabled() and any(p.requires_grad for p in module.parameters())
        state["active"] = False  # the throwaway calls below are not slowed
        try:
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                out = original(module, *args, **kwargs)
                torch.cuda.synchronize()
            forward = _kernel_seconds(prof)
            backward = 0.0
            if grad:
                tensors: list[Any] = []

                def keep(t: Any) -> Any:
                    tensors.append(t)
                    return t

                map_outputs(out, keep)
                loss = sum(t.float().sum() for t in tensors if t.requires_grad)
                params = [p for p in module.parameters() if p.requires_grad]
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    torch.autograd.grad(loss, params, allow_unused=True)
                    torch.cuda.synchronize()
                backward = _kernel_seconds(prof)
        finally:
            state["active"] = True
        return forward, backward

    def hook_for(module: Any, key: tuple[Any, ...]) -> None:
        box = module.__dict__.setdefault("_lstmperf_kernel_slowdown_box", {})
        box["key"] = key
        if "handle" not in box:
            weight = next(iter(module.parameters()))

            def on_grad(grad: Any) -> None:
                if state["active"] and box.get("key") in cost and grad.is_cuda:
                    stall(grad.device, extra * cost[box["key"]][1])

            box["handle"] = weight.register_hook(on_grad)

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            first = first_tensor(args)
            if not state["active"] or first is None or not first.is_cuda:
                return original(self, *args, **kwargs)
            key = (id(self), tuple(first.shape), first.dtype, torch.is_grad_enabled(), torch.is_autocast_enabled())
            if key not in cost and not capturing() and not profiling():
                cost[key] = measure(self, original, args, kwargs)
            out = original(self, *args, **kwargs)
            if key in cost:
                stall(first.device, extra * cost[key][0])
                if torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters()):
                    hook_for(self, key)
            return out

        return forward

    return patch_forward(wrap, state)
