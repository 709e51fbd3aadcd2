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
    The Keras workers the run starts (separate processes) are slowed the same way, each prepared run's whole
    call and training step (:func:`.slowdowns.plant_worker_slowdown`), so the Keras benchmarks, timed there,
    are targets too.
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

The two slowdowns are planted by :mod:`.slowdowns`; the wrapping of ``LSTM``/``GRU.forward`` and the clocks all the
faults share are :mod:`.patching`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from .patching import CLOCKS, check_clock, first_tensor, map_outputs, patch_forward
from .slowdowns import plant_kernel_slowdown, plant_slowdown, worker_slowdown_env

ENV = "PYTEST_LSTMPERF_PLANT"
CLOCK_ENV = "PYTEST_LSTMPERF_PLANT_CLOCK"
VALID = (
    "cudnn-off, onednn-off, perturb:EPS, slowdown:F, kernel-slowdown:F, host-work:N, wrong-precision, onnx-weight:EPS"
)


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


def _plant_perturb(eps: float) -> Callable[[], None]:
    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            return map_outputs(original(self, *args, **kwargs), lambda t: t * (1.0 + eps))

        return forward

    return patch_forward(wrap)


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


def _plant_host_work(ops: int) -> Callable[[], None]:
    """Each ``LSTM``/``GRU`` call first allocates a 256-float scratch tensor on the input's device and runs
    ``ops`` in-place adds on it: host-side work per call (dispatch, and on a GPU one small kernel launch per
    op), the kind a careless change to a model's Python adds. Outputs are unchanged."""
    import torch

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            tensor = first_tensor(args)
            scratch = torch.zeros(256, device=tensor.device if tensor is not None else "cpu")
            for _ in range(ops):
                scratch.add_(1.0)
            return original(self, *args, **kwargs)

        return forward

    return patch_forward(wrap)


def _plant_onnx_weight(eps: float) -> Callable[[], None]:
    from ..paths import onnx_runtime  # at the top, importing this module first would register the ONNX paths first

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
                undos.append(plant_slowdown(float(fault.value or 1.0), clock))
                undos.append(worker_slowdown_env(float(fault.value or 1.0), clock))
            elif fault.kind == "kernel-slowdown":
                undos.append(plant_kernel_slowdown(float(fault.value or 1.0)))
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
