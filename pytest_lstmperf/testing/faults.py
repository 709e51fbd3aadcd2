"""Planted faults: prove that a check fails when the thing it guards against happens.

Load explicitly (never through the entry point)::

    pytest suites/ -p pytest_lstmperf.testing.faults --lstmperf-plant=cudnn-off
    PYTEST_LSTMPERF_PLANT=slowdown:1.25 pytest suites/ -p pytest_lstmperf.testing.faults --benchmark-compare

Faults (comma-separated to combine), applied at ``pytest_configure`` (so before any test and before the
session resolves its paths: "behind the suite's back") and undone at ``pytest_unconfigure``:

``cudnn-off``
    ``torch.backends.cudnn.enabled = False``: cuDNN paths fall back to the generic CUDA kernels.
``onednn-off``
    ``torch.backends.mkldnn.enabled = False``: the CPU oneDNN path falls back to the native kernels.
``perturb:EPS``
    ``torch.nn.LSTM``/``torch.nn.GRU`` ``forward`` scales every output (sequence output, ``h_n``, ``c_n``) by
    ``1 + EPS``; gradients follow.
``wrong-precision``
    ``torch.autocast`` (and ``torch.cuda.amp.autocast``/``torch.cpu.amp.autocast``) becomes a no-op: autocast
    paths run in float32.
``kernel-slowdown:F``
    The GPU work of each ``torch.nn.LSTM``/``GRU`` call takes ``F`` times as long: after the call, a
    ``torch.cuda._sleep`` kernel stalls the stream for ``(F - 1)`` times the layer's kernel time, and after the
    backward pass (when the first weight's gradient is complete) for ``(F - 1)`` times its backward kernel
    time. The kernel times are measured once per layer, input shape and grad mode with ``torch.profiler``
    (sum of the GPU kernels' durations of a throwaway forward, and of ``torch.autograd.grad`` through it),
    and the sleep kernel's cycles per second with CUDA events. The stall is GPU work: CUDA-graph device time
    and the time per call both grow (device time by ``F``). CUDA only.
``slowdown:F``
    Each ``torch.nn.LSTM``/``GRU`` call takes ``F`` times as long: the wrapper synchronises the input's CUDA
    device, runs the real forward, synchronises again, measures the elapsed time ``t`` and waits
    ``(F - 1) * t`` (sleeping, then spinning on the clock for the last millisecond, as ``time.sleep``
    overshoots short waits). With autograd on, the backward pass is slowed the same way: an identity node on the
    output stamps the time the gradient reaches the layer, a hook on the layer's first weight fires when
    that weight's gradient is complete, and the elapsed backward time ``t_b`` buys a sleep of
    ``(F - 1) * t_b``. The sleep is host time, so the per-call time users feel grows by ``F`` while CUDA-graph
    device time does not (the wrapper stands aside while a stream is capturing). The synchronisation it
    adds is the one the benchmarks already do after each call.
``host-work:N``
    Each ``torch.nn.LSTM``/``GRU`` call allocates one extra scratch tensor on the input's device and runs
    ``N`` extra in-place ATen ops on it (on a GPU, ``N`` extra small kernel launches): a host-side slowdown
    that adds work per call, as a careless change to a model's Python does. The host counters
    (``aten_ops``, ``kernels``, ``alloc_bytes``) grow by ``N + 1``, ``N`` (CUDA) and the allocation; the
    time per call grows by the host cost of the ops. Outputs are unchanged. CPU and CUDA.
``onnx-weight:EPS``
    Every exported ONNX model (the ``onnxruntime-*`` paths) has its recurrent weight ``R`` (the ``LSTM``/``GRU``
    node's third input) scaled by ``1 + EPS`` after export, before the session loads it: the silent drift
    after export that a deployment fears. The torch layer is untouched.

The slowdown measures and waits on a clock: ``wall`` (default; ``time.perf_counter``, the clock
pytest-benchmark times with) or ``thread`` (``time.thread_time``, the CPU time of the calling thread, spun
on rather than slept), chosen with ``--lstmperf-plant-clock`` or ``PYTEST_LSTMPERF_PLANT_CLOCK``. The thread
clock pairs with ``--benchmark-timer=time.thread_time`` on a shared CPU machine, where preemption adds wall
time at random: measured in thread CPU time, a single-threaded CPU benchmark and its planted slowdown are
steady whatever else the machine runs.

Programmatic use: ``with planted("slowdown:1.25"): ...`` (``planted("slowdown:1.25", clock="thread")``).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

ENV = "PYTEST_LSTMPERF_PLANT"
CLOCK_ENV = "PYTEST_LSTMPERF_PLANT_CLOCK"
VALID = (
    "cudnn-off, onednn-off, perturb:EPS, slowdown:F, kernel-slowdown:F, host-work:N, wrong-precision, onnx-weight:EPS"
)
#: the clocks the slowdown measures and waits on
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "thread": time.thread_time}


def check_clock(name: str) -> str:
    """``name`` if it is a known clock, else ValueError naming the valid ones."""
    if name not in CLOCKS:
        raise ValueError(f"unknown clock {name!r} (valid: {', '.join(CLOCKS)})")
    return name


@dataclass(frozen=True)
class Fault:
    kind: str
    value: float | None = None

    def __str__(self) -> str:
        return self.kind if self.value is None else f"{self.kind}:{self.value:g}"


def parse_faults(raw: str) -> list[Fault]:
    """``"slowdown:1.25,cudnn-off"`` -> faults; ValueError naming the valid values."""
    faults = []
    for part in (p.strip() for p in raw.split(",")):
        if not part:
            continue
        kind, _, arg = part.partition(":")
        kind = kind.strip().lower()
        if kind in ("cudnn-off", "onednn-off", "wrong-precision"):
            if arg:
                raise ValueError(f"{part!r}: {kind} takes no value (valid: {VALID})")
            faults.append(Fault(kind))
        elif kind in ("perturb", "onnx-weight", "slowdown", "kernel-slowdown", "host-work"):
            try:
                value = float(arg)
            except ValueError:
                raise ValueError(
                    f"{part!r}: {kind} needs a number, e.g. "
                    f"{kind}:{'1e-3' if kind in ('perturb', 'onnx-weight') else '1.25'}"
                    f" (valid: {VALID})"
                ) from None
            if kind not in ("perturb", "onnx-weight") and not value >= 1.0:
                raise ValueError(f"{part!r}: the slowdown factor must be >= 1 (valid: {VALID})")
            if kind == "host-work" and value != int(value):
                raise ValueError(f"{part!r}: host-work needs a whole number of extra ops (valid: {VALID})")
            faults.append(Fault(kind, value))
        else:
            raise ValueError(f"unknown fault {part!r} (valid: {VALID})")
    return faults


# ------------------------------------------------------------------------------------------- planting
def _plant_switch(module_name: str) -> Callable[[], None]:
    import torch

    backend = getattr(torch.backends, module_name)
    saved = backend.enabled
    backend.enabled = False

    def undo() -> None:
        backend.enabled = saved

    return undo


def _patch_forward(
    wrap: Callable[[Callable[..., Any]], Callable[..., Any]], state: dict[str, bool] | None = None
) -> Callable[[], None]:
    """Wrap ``LSTM``/``GRU.forward``; the undo restores them and (``state``) marks the wrappers inactive, so
    hooks they left on layers stand aside."""
    import torch

    # Any: the type checker refuses assignments to methods, which is what this does
    saved: dict[Any, Any] = {cls: cls.__dict__["forward"] for cls in (torch.nn.LSTM, torch.nn.GRU)}
    for cls, original in saved.items():
        cls.forward = wrap(original)

    def undo() -> None:
        if state is not None:
            state["active"] = False
        for cls, original in saved.items():
            cls.forward = original

    return undo


def _map_outputs(out: Any, fn: Callable[[Any], Any]) -> Any:
    """Apply ``fn`` to the tensors of an RNN's ``(output, h_n)`` or ``(output, (h_n, c_n))``."""
    import torch
    from torch.nn.utils.rnn import PackedSequence

    if isinstance(out, PackedSequence):
        return out._replace(data=fn(out.data))
    if isinstance(out, torch.Tensor):
        return fn(out)
    if isinstance(out, tuple):
        return type(out)(_map_outputs(o, fn) for o in out)
    return out


def _plant_perturb(eps: float) -> Callable[[], None]:
    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            return _map_outputs(original(self, *args, **kwargs), lambda t: t * (1.0 + eps))

        return forward

    return _patch_forward(wrap)


def _plant_wrong_precision() -> Callable[[], None]:
    import torch

    cls: Any = torch.amp.autocast_mode.autocast  # Any: its methods are reassigned below
    saved = (cls.__dict__["__enter__"], cls.__dict__["__exit__"])

    def enter(self: Any) -> Any:
        return self

    def exit_(self: Any, *exc: Any) -> bool:
        return False

    cls.__enter__, cls.__exit__ = enter, exit_

    def undo() -> None:
        cls.__enter__, cls.__exit__ = saved

    return undo


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


def _first_tensor(args: tuple[Any, ...]) -> Any:
    import torch

    for arg in args:
        if isinstance(arg, torch.Tensor):
            return arg
        data = getattr(arg, "data", None)  # PackedSequence
        if isinstance(data, torch.Tensor):
            return data
    return None


def _plant_slowdown(factor: float, clock: str = "wall") -> Callable[[], None]:
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
            first = _first_tensor(args)
            sync(first)
            start = now()
            out = original(self, *args, **kwargs)
            sync(first)
            pause(extra * (now() - start), clock)
            if torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters()):
                box = hook_for(self, first)
                out = _map_outputs(out, lambda t: _StampBackward.apply(t, box) if t.requires_grad else t)
            return out

        return forward

    return _patch_forward(wrap, state)


def _kernel_seconds(prof: Any) -> float:
    """Sum of the GPU kernels' (and memory operations') durations a profiler saw, in seconds."""
    total = 0.0
    for event in prof.events():
        if "CUDA" in str(getattr(event, "device_type", "")):
            total += event.time_range.elapsed_us() * 1e-6
    return total


def _plant_kernel_slowdown(factor: float) -> Callable[[], None]:
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

                _map_outputs(out, keep)
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
            first = _first_tensor(args)
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

    return _patch_forward(wrap, state)


def _plant_host_work(ops: int) -> Callable[[], None]:
    """Each ``LSTM``/``GRU`` call first allocates a 256-float scratch tensor on the input's device and runs
    ``ops`` in-place adds on it: host-side work per call (dispatch, and on a GPU one small kernel launch per
    op), the kind a careless change to a model's Python adds. Outputs are unchanged."""
    import torch

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            tensor = _first_tensor(args)
            scratch = torch.zeros(256, device=tensor.device if tensor is not None else "cpu")
            for _ in range(ops):
                scratch.add_(1.0)
            return original(self, *args, **kwargs)

        return forward

    return _patch_forward(wrap)


def _plant_onnx_weight(eps: float) -> Callable[[], None]:
    from ..paths import onnx_runtime

    def hook(model: Any) -> None:
        import numpy as np
        from onnx import numpy_helper

        recurrent = [n for n in model.graph.node if n.op_type in ("LSTM", "GRU")]
        names = {n.input[2] for n in recurrent if len(n.input) > 2}
        for init in model.graph.initializer:
            if init.name in names:
                scaled = numpy_helper.to_array(init) * np.float32(1.0 + eps)
                init.CopyFrom(numpy_helper.from_array(scaled.astype(np.float32), init.name))
        if not names:
            raise RuntimeError("onnx-weight fault: no LSTM/GRU node with an initializer weight R in the export")

    onnx_runtime.EXPORT_HOOKS.append(hook)
    return lambda: onnx_runtime.EXPORT_HOOKS.remove(hook)


def plant(faults: list[Fault], clock: str = "wall") -> Callable[[], None]:
    """Apply ``faults``; returns a function that undoes them (in reverse order). ``clock`` is the one the
    slowdown measures and waits on (see the module docstring)."""
    undos: list[Callable[[], None]] = []
    try:
        for fault in faults:
            if fault.kind == "cudnn-off":
                undos.append(_plant_switch("cudnn"))
            elif fault.kind == "onednn-off":
                undos.append(_plant_switch("mkldnn"))
            elif fault.kind == "perturb":
                undos.append(_plant_perturb(float(fault.value or 0.0)))
            elif fault.kind == "wrong-precision":
                undos.append(_plant_wrong_precision())
            elif fault.kind == "slowdown":
                undos.append(_plant_slowdown(float(fault.value or 1.0), clock))
            elif fault.kind == "kernel-slowdown":
                undos.append(_plant_kernel_slowdown(float(fault.value or 1.0)))
            elif fault.kind == "host-work":
                undos.append(_plant_host_work(int(fault.value or 1)))
            elif fault.kind == "onnx-weight":
                undos.append(_plant_onnx_weight(float(fault.value or 0.0)))
    except BaseException:
        for undo in reversed(undos):
            undo()
        raise

    def undo_all() -> None:
        for undo in reversed(undos):
            undo()

    return undo_all


@contextlib.contextmanager
def planted(spec: str, clock: str = "wall") -> Iterator[list[Fault]]:
    faults = parse_faults(spec)
    undo = plant(faults, clock)
    try:
        yield faults
    finally:
        undo()


# ------------------------------------------------------------------------------------------ pytest plugin
_UNDO = pytest.StashKey[Callable[[], None]]()
_FAULTS = pytest.StashKey[list[Fault]]()
_CLOCK = pytest.StashKey[str]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("lstmperf").addoption(
        "--lstmperf-plant",
        dest="lstmperf_plant",
        default=None,
        metavar="FAULTS",
        help=f"plant faults to prove the checks catch them: {VALID} (comma-separated) [env {ENV}]",
    )
    parser.getgroup("lstmperf").addoption(
        "--lstmperf-plant-clock",
        dest="lstmperf_plant_clock",
        default=None,
        metavar="CLOCK",
        help=f"clock the planted slowdown measures and waits on: {', '.join(CLOCKS)} (default wall) [env {CLOCK_ENV}]",
    )


def pytest_configure(config: pytest.Config) -> None:
    clock, clock_source = config.getoption("lstmperf_plant_clock"), "--lstmperf-plant-clock"
    if not clock:
        clock, clock_source = os.environ.get(CLOCK_ENV) or "wall", CLOCK_ENV
    try:
        check_clock(clock)
    except ValueError as exc:
        raise pytest.UsageError(f"{clock_source}={clock}: {exc}") from None
    raw, source = config.getoption("lstmperf_plant"), "--lstmperf-plant"
    if not raw and os.environ.get(ENV):
        raw, source = os.environ[ENV], ENV
    if not raw:
        return
    try:
        faults = parse_faults(raw)
    except ValueError as exc:
        raise pytest.UsageError(f"{source}={raw}: {exc}") from None
    try:
        config.stash[_UNDO] = plant(faults, clock)
    except ImportError as exc:
        raise pytest.UsageError(f"{source}={raw}: planting needs torch ({exc})") from None
    except ValueError as exc:
        raise pytest.UsageError(f"{source}={raw}: {exc}") from None
    config.stash[_FAULTS] = faults
    config.stash[_CLOCK] = clock


def pytest_report_header(config: pytest.Config) -> list[str]:
    faults = config.stash.get(_FAULTS, None)
    if not faults:
        return []
    clock = config.stash.get(_CLOCK, "wall")
    on = f" on the {clock} clock" if clock != "wall" and any(f.kind == "slowdown" for f in faults) else ""
    return [f"lstmperf: PLANTED FAULTS {', '.join(map(str, faults))}{on} (pytest_lstmperf.testing.faults)"]


def pytest_unconfigure(config: pytest.Config) -> None:
    undo = config.stash.get(_UNDO, None)
    if undo is not None:
        undo()
        del config.stash[_UNDO]
