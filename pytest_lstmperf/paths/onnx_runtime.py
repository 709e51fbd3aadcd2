"""ONNX Runtime execution paths: the ``nn.LSTM``/``nn.GRU`` loaded with a case's canonical weights, exported
with ``torch.onnx.export`` (the dynamo exporter, torch's default) and run by an ``onnxruntime.InferenceSession``.

The exporter maps ``aten::lstm``/``aten::gru`` to the ONNX ``LSTM``/``GRU`` operator (seen with torch 2.13 and
onnxscript 0.7); the trace (:mod:`pytest_lstmperf.ort_trace`) reads ONNX Runtime's own profile: which nodes
ran, on which execution provider, with which element types. What runs inside a provider's LSTM kernel is not
observable there, and the families say so (``ort-rnn``, ``ort-cuda-rnn``).

ONNX Runtime's inference sessions do not differentiate: these paths run inference only. Training specs are
refused by ``supports()`` with that reason (the suites generate inference specs for them and report the
training benchmarks as not run), so no backward pass is ever reported as checked here.

Export faults a user would meet (a packed sequence, ``proj_size``) are the explainer's rules
(:mod:`pytest_lstmperf.explain`, framework ``onnxruntime``); ``supports()`` returns the same reasons.
Hooks in :data:`EXPORT_HOOKS` see each exported model before a session loads it (the planted-fault plugin
perturbs an exported weight through one). This module imports no framework at import time.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..device import DeviceInfo, cpu_threads
from ..meters import DeviceTime
from ..observation.explain import onnx_export_problems
from ..observation.ort_trace import read_profile, trace_from_profile
from . import ExecutionPath, PathResult, register_from

if TYPE_CHECKING:
    from ..model.case import Case
    from ..model.spec import LayerSpec

_HERE = __name__
#: callables ``hook(model: onnx.ModelProto) -> None`` run on every exported model before a session loads it
EXPORT_HOOKS: list[Callable[[Any], None]] = []
INFERENCE_ONLY = (
    "ONNX Runtime runs inference only (an InferenceSession does not differentiate): no backward pass on this path"
)
_PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


def _entry(name: str, device: str, kernel: str, description: str, **options: Any) -> None:
    register_from(
        _HERE, name, "onnxruntime", device, kernel, "fp32", description, options={"inference_only": True, **options}
    )


_entry(
    "onnxruntime-cpu",
    "cpu",
    "ort-rnn",
    "torch.onnx.export (dynamo exporter) run by ONNX Runtime's CPU execution provider: the ONNX LSTM/GRU node",
)
_entry(
    "onnxruntime-cuda",
    "cuda",
    "ort-cuda-rnn",
    "torch.onnx.export run by ONNX Runtime's CUDA execution provider (use_tf32=0): the ONNX LSTM/GRU node "
    "(needs the onnxruntime-gpu package)",
    provider_options={"use_tf32": "0"},
)


# ---------------------------------------------------------------------------------------------- checks
def missing_packages() -> list[str]:
    """The packages this path needs that are not installed (found by import spec; nothing imported)."""
    needed = ("torch", "onnx", "onnxscript", "onnxruntime")
    return [name for name in needed if importlib.util.find_spec(name) is None]


def available(path: ExecutionPath, device: DeviceInfo) -> str | None:
    missing = missing_packages()
    if missing:
        return f"{', '.join(missing)} not installed (pip install 'pytest-lstmperf[onnx]')"
    import onnxruntime

    providers = onnxruntime.get_available_providers()
    wanted = _PROVIDERS[path.device]
    if wanted not in providers:
        return (
            f"onnxruntime {onnxruntime.__version__} has no {wanted} (providers: {', '.join(providers)}); "
            "the CUDA provider comes with the onnxruntime-gpu package, which replaces onnxruntime"
        )
    if path.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return "no usable CUDA device (run on a GPU runner)"
    return None


def supports(path: ExecutionPath, spec: LayerSpec) -> str | None:
    if spec.training:
        return INFERENCE_ONLY
    if spec.dtype != "float32":
        return f"dtype {spec.dtype} is not among this path's input dtypes (float32)"
    if spec.cell == "gru" and not spec.reset_after:
        return "PyTorch's GRU is reset-after only (reset_after=False exists in Keras alone)"
    problems = onnx_export_problems(spec)
    return "; ".join(problems) if problems else None


# ---------------------------------------------------------------------------------------------- runner
class _Layer:
    """A torch module returning ``(output, h_n[, c_n])`` from ``(x[, h0[, c0]])``, built lazily (torch import)."""

    @staticmethod
    def build(module: Any, cell: str, with_state: bool) -> Any:
        import torch

        class Exported(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.rnn = module

            def forward(self, x, *state):  # type: ignore[no-untyped-def]
                hx = None if not state else (tuple(state) if cell == "lstm" else state[0])
                out, final = self.rnn(x, hx)
                return (out, *final) if cell == "lstm" else (out, final)

        return Exported().eval()


class OnnxRun:
    """A layer exported to ONNX, loaded in an InferenceSession on the path's execution provider."""

    def __init__(self, path: ExecutionPath, case: Case, device: DeviceInfo) -> None:
        import numpy as np
        import onnx
        import onnxruntime

        # at the top it would register the eager paths after these where this module is imported first
        from .torch_paths import TorchRun

        self.path, self.case, self.device, self.spec = path, case, device, case.spec
        self.ort = onnxruntime
        eager = TorchRun(path, case, _cpu(device))  # canonical weights, on the CPU, exported from there
        eager.module.eval()
        args = [eager.x] + [s for s in (eager.h0, eager.c0) if s is not None]
        self._dir = tempfile.TemporaryDirectory(prefix="lstmperf-onnx-")
        self.model_path = Path(self._dir.name) / "layer.onnx"
        self.export_seconds = _export(_Layer.build(eager.module, self.spec.cell, len(args) > 1), args, self.model_path)
        model = onnx.load(str(self.model_path))
        for hook in EXPORT_HOOKS:
            hook(model)
        self.model_bytes = model.SerializeToString()
        self.node_ops = tuple(dict.fromkeys(node.op_type for node in model.graph.node))
        self.session = self._session(profile=False)
        names = [i.name for i in self.session.get_inputs()]
        self.feed = {n: np.ascontiguousarray(a.detach().numpy()) for n, a in zip(names, args, strict=True)}

    def _session(self, profile: bool) -> Any:
        options = self.ort.SessionOptions()
        options.log_severity_level = 3  # errors only: its shape-merge warnings are the exporter's business
        # ONNX Runtime's pool threads spin after each run by default, taking the cores from whatever runs next
        # (torch timed in alternation was slowed 100x on a 2-core machine); they sleep instead
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        threads = cpu_threads()
        if threads is not None and self.path.device == "cpu":  # the run's fixed CPU threads (--lstmperf-threads)
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        if profile:
            options.enable_profiling = True
            options.profile_file_prefix = str(Path(self._dir.name) / "profile")
        provider = _PROVIDERS[self.path.device]
        provider_options = dict(self.path.options.get("provider_options", {}))
        if provider == "CUDAExecutionProvider":
            provider_options.setdefault("device_id", str(self.device.index or 0))
        providers: list[Any] = [(provider, provider_options)]
        if provider != "CPUExecutionProvider":
            providers.append("CPUExecutionProvider")  # ONNX Runtime places nodes its provider lacks there
        return self.ort.InferenceSession(self.model_bytes, options, providers=providers)

    # ---- PreparedRun protocol
    def run(self) -> PathResult:
        session = self._session(profile=True)
        outputs = session.run(None, self.feed)
        trace = trace_from_profile(read_profile(session.end_profiling()), "forward", self._note())
        output, h_n = outputs[0], outputs[1]
        c_n = outputs[2] if self.spec.cell == "lstm" else None
        if not self.spec.batch_first:
            output = output.transpose(1, 0, 2)
        return PathResult(
            output=output.astype("float64"),
            h_n=h_n.astype("float64"),
            c_n=None if c_n is None else c_n.astype("float64"),
            grads={},
            forward_trace=trace,
            backward_trace=None,
            notes=[self._note(), INFERENCE_ONLY],
        )

    def _note(self) -> str:
        return f"exported in {self.export_seconds:.1f} s; graph nodes {', '.join(self.node_ops)}"

    def forward(self) -> object:
        return self.session.run(None, self.feed)

    def train_step(self) -> object:
        raise NotImplementedError(INFERENCE_ONLY)

    def trace_forward(self) -> Any:
        return self.run().forward_trace

    def synchronize(self) -> None:
        """``InferenceSession.run`` returns host arrays: the call has finished when it returns."""

    def device_time(self, mode: str, samples: int) -> Any:
        if self.path.device == "cpu":
            return DeviceTime("host", (), "on the CPU the host runs the kernels: device time is the time per call")
        return DeviceTime(
            "none", (), "ONNX Runtime's CUDA provider runs on its own stream, unseen by torch's CUDA events or graphs: "
            "device time not measured (the time per call includes its host-device copies)",
        )  # fmt: skip

    def host_counters(self, mode: str) -> dict[str, Any]:
        return {"note": "not counted: ONNX Runtime dispatches no ATen ops (its profile lists the nodes in the trace)"}


def _cpu(device: DeviceInfo) -> Any:
    return DeviceInfo("cpu")


def _export(module: Any, args: list[Any], target: Path) -> float:
    """Export with the dynamo exporter, its progress lines and warnings kept out of the test output."""
    import time

    import torch

    started = time.perf_counter()
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(module, tuple(args), str(target), dynamo=True, verbose=False)
    return time.perf_counter() - started


def prepare(path: ExecutionPath, case: Case, device: DeviceInfo) -> OnnxRun:
    return OnnxRun(path, case, device)
