"""``torch.compile`` execution paths: the same ``nn.LSTM``/``nn.GRU`` as the eager paths, called through
``torch.compile(module, mode=...)``.

What compiling does to a recurrent layer (torch 2.11-2.13): Dynamo refuses to trace RNN modules unless
``torch._dynamo.config.allow_rnn`` is set ("Attempted to wrap RNN, GRU, or LSTM"), so by default it
graph-breaks on the layer and the layer runs eagerly, on the kernel eager PyTorch picks (cuDNN, oneDNN).
``mode="reduce-overhead"`` then has no graph to capture around a bare layer: no CUDA graph is replayed.
With ``allow_rnn=True`` the layer is traced; on CUDA ``aten::lstm`` is decomposed into per-step matrix
products and inductor's generated kernels (it leaves cuDNN), which ``reduce-overhead`` can capture and
replay; on the CPU inductor keeps oneDNN's ``mkldnn_rnn_layer`` as an extern kernel for the LSTM.

Each path claims the family its trace must show; the trace is :func:`pytest_lstmperf.trace.profiler_trace`
(the profiler alone: under a ``TorchDispatchMode`` Dynamo would not run compiled code at all, and a
dispatch-mode trace would observe the eager layer). The graph breaks counted while compiling, the compiled
regions entered and the CUDA graphs replayed are reported with each pass. Gradients flow through compiled
code, so training specs check the backward pass too. This module imports no framework at import time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .. import meters
from ..observation.torch_trace import profiler_trace
from . import ExecutionPath, PathResult, register_from
from .torch_paths import TorchRun
from .torch_paths import available as torch_available
from .torch_paths import supports as torch_supports

if TYPE_CHECKING:
    from ..device import DeviceInfo
    from ..model.case import Case
    from ..model.spec import LayerSpec

_HERE = __name__
#: calls before a pass is traced: Dynamo compiles on the first, cudagraph trees record on the second and
#: replay from the third (``mode="reduce-overhead"``)
WARMUP_CALLS = 3


def _entry(name: str, device: str, kernel: str, precision: str, description: str, **options: Any) -> None:
    options.setdefault("asked_on_first_use", True)
    register_from(
        _HERE, name, "torch-compile", device, kernel, precision, description,
        pair_with=tuple(options.pop("pair_with", ())), in_gate=options.pop("in_gate", True),
        extended=options.pop("extended", ""), options=options,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------- registry
# options: mode (torch.compile mode), allow_rnn (torch._dynamo.config.allow_rnn), plus torch_paths' options;
# every entry's availability is asked at its first test (``asked_on_first_use``): the check imports Dynamo
_entry(
    "torch-compile-cpu",
    "cpu",
    "onednn",
    "fp32",
    "torch.compile(mode='default') of an LSTM on the CPU: Dynamo graph-breaks on the layer, which runs oneDNN",
    mode="default",
    onednn_only=True,
    cells=("lstm",),
    pair_with=("torch-cpu-onednn",),
)
_entry(
    "torch-compile-cudnn",
    "cuda",
    "cudnn",
    "fp32",
    "torch.compile(mode='default'), TF32 off: Dynamo graph-breaks on the layer, which runs cuDNN",
    mode="default",
    tf32=False,
    pair_with=("torch-cudnn-fp32",),
)
_entry(
    "torch-compile-reduce-overhead",
    "cuda",
    "cudnn",
    "fp32",
    "torch.compile(mode='reduce-overhead'), TF32 off: the layer graph-breaks and runs cuDNN eagerly "
    "(no CUDA graph to replay around a bare layer)",
    mode="reduce-overhead",
    tf32=False,
)
_entry(
    "torch-compile-inductor-graphs",
    "cuda",
    "inductor",
    "fp32",
    "torch.compile(mode='reduce-overhead') with torch._dynamo.config.allow_rnn=True: the layer decomposed "
    "into matmuls and inductor's triton kernels, replayed as a CUDA graph (leaves cuDNN; compiles slowly)",
    mode="reduce-overhead",
    allow_rnn=True,
    in_gate=False,
    extended="inductor compiles every shape anew: 10-20 s per test on an H100",
)


# ---------------------------------------------------------------------------------------------- checks
def available(path: ExecutionPath, device: DeviceInfo) -> str | None:
    """Why ``torch.compile`` cannot compile here: no torch, Dynamo unsupported on this Python, no C++
    compiler (inductor's CPU backend), no triton (its CUDA backend), or the device's own reason."""
    reason = torch_available(path, device)
    if reason:
        return reason
    import torch

    try:
        torch._dynamo.eval_frame.check_if_dynamo_supported()
    except Exception as exc:
        return f"torch.compile is not supported here: {exc}"
    if path.device == "cpu":
        compiler = os.environ.get("CXX") or next((c for c in ("g++", "c++", "clang++") if shutil.which(c)), None)
        if compiler is None or not shutil.which(compiler):
            return "no C++ compiler on PATH (inductor's CPU backend compiles C++; install g++ or set CXX)"
    else:
        from torch.utils._triton import has_triton

        if not has_triton():
            return "triton is not installed or finds no usable GPU (inductor's CUDA backend generates triton kernels)"
    return None


def supports(path: ExecutionPath, spec: LayerSpec) -> str | None:
    """The eager path's rules (the layer is the same ``nn.LSTM``/``nn.GRU``; packed specs are refused: these
    paths run padded tensors)."""
    return torch_supports(path, spec)


# ---------------------------------------------------------------------------------------------- runner
@contextlib.contextmanager
def _quiet_inductor_import() -> Iterator[None]:
    """Silences the ``torch.jit.script_method is deprecated`` warnings that torch's own modules raise (14 of
    them) when ``torch.compile`` first imports inductor: they are about torch's code, not the user's, and no
    user can act on them. Every other warning goes through."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="`torch.jit.script_method` is deprecated", category=DeprecationWarning
        )
        yield


class CompiledRun(TorchRun):
    """A :class:`TorchRun` whose calls go through ``torch.compile(module, mode=...)``; compiled and warmed
    up when prepared, so traces and timings see the compiled code, not compilation."""

    def __init__(self, path: ExecutionPath, case: Case, device: DeviceInfo) -> None:
        super().__init__(path, case, device)
        torch = self.torch
        torch._dynamo.reset()  # a fresh cache per path run: no recompile limit reached across examples
        self.mode = str(path.options.get("mode", "default"))
        with _quiet_inductor_import():
            self.layer = torch.compile(self.module, mode=self.mode, dynamic=False)
            self.graph_breaks = 0
            self.breaks_seen: list[str] = []
            self._warm("forward")

    def _dynamo_config(self) -> contextlib.AbstractContextManager:
        return self.torch._dynamo.config.patch(allow_rnn=bool(self.path.options.get("allow_rnn", False)))

    def _call(self, x: Any, h0: Any, c0: Any) -> tuple[Any, Any, Any]:
        if self.mode == "reduce-overhead":
            self.torch.compiler.cudagraph_mark_step_begin()  # earlier outputs are not read again
        with self._dynamo_config():
            return super()._call(x, h0, c0)

    def _warm(self, mode: str) -> None:
        from torch._dynamo.utils import counters

        before = sum(counters["graph_break"].values())
        step = self.forward if mode == "forward" else self.train_step
        for _ in range(WARMUP_CALLS):
            step()
        self.synchronize()
        self.graph_breaks += sum(counters["graph_break"].values()) - before
        self.breaks_seen = sorted({str(k).splitlines()[0] for k in counters["graph_break"]})
        if mode == "train":
            self.module.zero_grad(set_to_none=True)

    def _tracer(self) -> Any:
        return profiler_trace

    def _compile_note(self) -> str:
        breaks = f"graph breaks while compiling: {self.graph_breaks}"
        if self.breaks_seen:
            breaks += f" ({'; '.join(self.breaks_seen)[:160]})"
        return f"torch.compile(mode={self.mode!r}, allow_rnn={bool(self.path.options.get('allow_rnn'))}); {breaks}"

    def run(self) -> PathResult:
        if self.spec.training:
            self._warm("train")
        result = super().run()
        note = self._compile_note()
        result.forward_trace = _with_note(result.forward_trace, note)
        if result.backward_trace is not None:
            result.backward_trace = _with_note(result.backward_trace, note)
        result.notes.append(note)
        return result

    def trace_forward(self) -> Any:
        return _with_note(super().trace_forward(), self._compile_note())

    # ---- timing: compiled code must not run under a dispatch mode or inside an outer graph capture
    def device_time(self, mode: str, samples: int) -> Any:
        call = self.forward if mode == "forward" else self.train_step
        if self.mode != "reduce-overhead":
            return meters.device_time(call, self.device.torch_device, samples)
        torch = self.torch
        note = "mode='reduce-overhead' replays its own CUDA graphs: device time from CUDA events around calls"
        return meters.DeviceTime(
            "cuda-events", tuple(meters._event_times(torch, torch.device(self.device.torch_device), call, samples, 5)),
            note,
        )  # fmt: skip

    def host_counters(self, mode: str) -> dict[str, Any]:
        """Counted with the profiler (a dispatch mode would turn compilation off): ATen ops the compiled
        code dispatched, GPU kernels, CUDA graph replays."""
        with self._tracer()(self.device.torch_device, "forward") as traced:
            (self.forward if mode == "forward" else self.train_step)()
        trace = traced[0]
        return {
            "aten_ops": len(trace.ops),
            "kernels": len(trace.kernels),
            "note": f"counted with torch.profiler (distinct ops and kernels; {trace.detail})",
        }


def _with_note(trace: Any, note: str) -> Any:
    detail = f"{trace.detail}; {note}" if trace.detail else note
    return dataclasses.replace(trace, detail=detail)


def prepare(path: ExecutionPath, case: Case, device: DeviceInfo) -> CompiledRun:
    return CompiledRun(path, case, device)
