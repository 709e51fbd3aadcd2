"""PyTorch execution paths: one registry entry each; the runner below builds and runs them.

Paths leave the switch that selects their fast kernel as the user has it: the cuDNN and oneDNN paths do not
force ``cudnn.enabled``/``mkldnn.enabled`` on, so a runner where something disabled them behind the suite's
back is caught by the kernel trace. Only the fallback paths turn a switch off, as PyTorch's own tests do.
This module imports no framework at import time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ..observation.torch_trace import torch_trace
from . import ExecutionPath, PathResult, register_from

if TYPE_CHECKING:
    from ..device import DeviceInfo
    from ..model.case import Case
    from ..model.spec import LayerSpec
    from ..observation.torch_trace import KernelTrace

_HERE = __name__


def _entry(name: str, device: str, kernel: str, precision: str, description: str, **options: Any) -> ExecutionPath:
    return register_from(
        _HERE, name, "torch", device, kernel, precision, description,
        expect=options.pop("expect", ""), pair_with=tuple(options.pop("pair_with", ())), options=options,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------- registry
# options: cudnn (leave as is / False), mkldnn (leave / False), tf32 (cuDNN allow_tf32), autocast dtype,
# packed (run a PackedSequence), input_dtypes (spec dtypes accepted), needs (capability checks)
# known findings (a path that runs something other than it claims, documented upstream behaviour) live in
# pytest_lstmperf/observation/claims.py with the versions they were seen with
_entry(
    "torch-cudnn-fp32",
    "cuda",
    "cudnn",
    "fp32",
    "cuDNN RNN, fp32 with TF32 off",
    tf32=False,
    pair_with=("torch-cuda-generic",),
)
_entry(
    "torch-cudnn-default",
    "cuda",
    "cudnn",
    "tf32",
    "cuDNN RNN with PyTorch's default math (cudnn.allow_tf32=True: TF32 on Ampere and newer)",
    tf32=True,
    min_capability=(8, 0),
)
_entry("torch-cuda-generic", "cuda", "cuda-generic", "fp32", "generic CUDA kernels (cuDNN disabled), fp32", cudnn=False)
_entry(
    "torch-cuda-autocast-fp16", "cuda", "cudnn", "fp16", "cuDNN RNN under torch.autocast(float16)", autocast="float16"
)
_entry(
    "torch-cuda-autocast-bf16",
    "cuda",
    "cudnn",
    "bf16",
    "cuDNN RNN under torch.autocast(bfloat16)",
    autocast="bfloat16",
    min_cudnn=91300,
)
_entry(
    "torch-cudnn-packed",
    "cuda",
    "cudnn",
    "fp32",
    "cuDNN RNN on a PackedSequence, TF32 off",
    tf32=False,
    packed=True,
    pair_with=("torch-cuda-generic-packed",),
)
_entry(
    "torch-cuda-generic-packed",
    "cuda",
    "cuda-generic",
    "fp32",
    "generic CUDA kernels on a PackedSequence",
    cudnn=False,
    packed=True,
)
_entry(
    "torch-cpu-onednn",
    "cpu",
    "onednn",
    "fp32",
    "CPU oneDNN RNN (PyTorch's CPU default for LSTM)",
    pair_with=("torch-cpu-native",),
    onednn_only=True,
    cells=("lstm",),
)
_entry("torch-cpu-native", "cpu", "cpu-native", "fp32", "CPU native kernels (oneDNN disabled)", mkldnn=False)
_entry(
    "torch-cpu-autocast-bf16",
    "cpu",
    "onednn",
    "bf16",
    "CPU oneDNN RNN under torch.autocast(bfloat16)",
    autocast="bfloat16",
    onednn_only=True,
    cells=("lstm",),
)
_entry(
    "torch-cpu-native-autocast-bf16",
    "cpu",
    "cpu-native",
    "bf16",
    "CPU native kernels (oneDNN disabled) under torch.autocast(bfloat16): the bf16 path of any CPU",
    autocast="bfloat16",
    mkldnn=False,
)
_entry(
    "torch-cpu-packed",
    "cpu",
    "cpu-native",
    "fp32",
    "CPU on a PackedSequence (native kernels; oneDNN when every sequence has the same length)",
    packed=True,
    expect="expect_cpu_packed",
)


#: the first torch that hands a packed LSTM of uniform lengths to oneDNN: 2.13 does; 2.11 runs the native kernels
#: (a 16-core Xeon, torch 2.11.0). 2.12 was not seen: it is expected native, and a kernel check says so if not
PACKED_UNIFORM_ONEDNN_FROM = (2, 13)


def expect_cpu_packed(path: ExecutionPath, spec: LayerSpec) -> tuple[str, str]:
    """Packed input on the CPU runs the native kernels, except that PyTorch from
    :data:`PACKED_UNIFORM_ONEDNN_FROM` on hands a packed LSTM whose sequences all have one length (uniform batch
    sizes, i.e. a dense batch) to oneDNN like a padded one (oneDNN has no projections)."""
    uniform = spec.lengths is not None and len(set(spec.lengths)) == 1
    dense = spec.cell == "lstm" and not spec.proj_size and uniform and spec.dtype == "float32"
    if dense and _torch_release() >= PACKED_UNIFORM_ONEDNN_FROM:
        return "onednn", "fp32"
    return path.kernel, path.precision


def _torch_release() -> tuple[int, int]:
    """(major, minor) of the installed torch; (0, 0) where it cannot be read."""
    import torch

    parts = torch.__version__.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return 0, 0


# ---------------------------------------------------------------------------------------------- checks
def available(path: ExecutionPath, device: DeviceInfo) -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed (pip install 'pytest-lstmperf[torch]')"
    opts = path.options
    if path.device == "cuda":
        if not torch.cuda.is_available():
            return "no usable CUDA device (run on a GPU runner)"
        if path.kernel == "cudnn" and not torch.backends.cudnn.is_available():
            return f"torch {torch.__version__} was built without cuDNN"
        props = torch.cuda.get_device_properties(device.index or 0)
        need = opts.get("min_capability")
        if need and (props.major, props.minor) < need:
            return (
                f"{props.name} (compute capability {props.major}.{props.minor}) has no TF32; "
                f"its default math is fp32, which torch-cudnn-fp32 covers"
            )
        need_cudnn = opts.get("min_cudnn")
        if need_cudnn and (torch.backends.cudnn.version() or 0) < need_cudnn:
            return f"cuDNN {torch.backends.cudnn.version()} has no bfloat16 RNN (needs >= 9.13)"
        if opts.get("autocast") == "bfloat16" and not torch.cuda.is_bf16_supported():
            return f"{props.name} does not support bfloat16"
    else:
        if opts.get("onednn_only") and not torch.backends.mkldnn.is_available():
            return f"torch {torch.__version__} was built without oneDNN (mkldnn)"
        needs_onednn_bf16 = opts.get("autocast") == "bfloat16" and opts.get("mkldnn") is not False
        if needs_onednn_bf16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            return (
                "this CPU has no bfloat16 support in oneDNN (needs avx512_bf16, AMX or similar); torch still sends "
                "autocast(bfloat16) LSTMs to oneDNN there, which raises 'could not create a primitive descriptor' "
                "(torch-cpu-native-autocast-bf16 is the bf16 path of such CPUs)"
            )
    return None


def supports(path: ExecutionPath, spec: LayerSpec) -> str | None:
    opts = path.options
    if opts.get("packed") and spec.length_mode != "packed":
        return "packed paths run specs with length_mode='packed'"
    if not opts.get("packed") and spec.length_mode == "packed":
        return f"{path.name} runs padded tensors; packed specs go to the -packed paths"
    if spec.cell == "gru" and not spec.reset_after:
        return "PyTorch's GRU is reset-after only (reset_after=False exists in Keras alone)"
    if opts.get("autocast") and spec.dtype != "float32":
        return "autocast paths take float32 layers"
    if spec.dtype not in ("float32",):
        return f"dtype {spec.dtype} is not among this path's input dtypes (float32)"
    if opts.get("onednn_only"):
        # aten/src/ATen/native/RNN.cpp use_mkldnn: LSTM only, no projections, dense input
        if spec.cell != "lstm":
            return "PyTorch has no oneDNN GRU (only LSTM dispatches to oneDNN)"
        if spec.proj_size:
            return "PyTorch's oneDNN LSTM has no projections (proj_size > 0 runs the native path)"
    return None


# ---------------------------------------------------------------------------------------------- runner
class TorchRun:
    """An nn.LSTM/nn.GRU loaded with a case's canonical weights, and its inputs, on one device."""

    def __init__(self, path: ExecutionPath, case: Case, device: DeviceInfo) -> None:
        import torch

        self.torch = torch
        self.path = path
        self.case = case
        self.device = device
        spec = case.spec
        self.spec = spec
        dtype = getattr(torch, spec.dtype)  # the spec's dtypes are named as torch names them
        self.dtype = dtype
        dev = torch.device(device.torch_device)
        self.dev = dev
        cls = torch.nn.LSTM if spec.cell == "lstm" else torch.nn.GRU
        # made without initial values (on the meta device, then allocated on the run's): every parameter is
        # loaded from the case at once, and the layer's own random initialisation of weights as large as
        # 1024 x 4096, on the CPU before the copy to the GPU, took 2 s of the default GPU run's preparations
        self.module = cls(**spec.module_kwargs(), device="meta", dtype=dtype).to_empty(device=dev)
        unloaded = sorted({name for name, _ in self.module.named_parameters()} - set(case.weights))
        if unloaded:
            raise ValueError(f"the case has no values for the layer's parameters {unloaded}")
        with torch.no_grad():
            for name, value in case.weights.items():
                getattr(self.module, name).copy_(_tensor(value, dtype))
        if dev.type == "cuda":
            self.module.flatten_parameters()
        self.module.train(spec.training)
        self.layer: Any = self.module  # what a call runs (a compiled path puts torch.compile's wrapper here)
        x = _tensor(case.x, dtype, dev)
        self.x = x if spec.batch_first else x.transpose(0, 1).contiguous()
        self.h0 = None if case.h0 is None else _tensor(case.h0, dtype, dev)
        self.c0 = None if case.c0 is None else _tensor(case.c0, dtype, dev)
        self.lengths = (
            torch.tensor(spec.lengths, dtype=torch.int64) if path.options.get("packed") and spec.lengths else None
        )
        seeds = [case.grad_output if spec.batch_first else case.grad_output.transpose(1, 0, 2), case.grad_h_n]
        if case.grad_c_n is not None:
            seeds.append(case.grad_c_n)
        self.seeds = [_tensor(s, torch.float32, dev) for s in seeds]
        # a packed path's timed calls (forward, train_step) run the layer on a batch packed once here, and keep its
        # output packed: packing and padding are the data's preparation, not the recurrent call the benchmark
        # guards (on the 2-core VM they took about a third of the packed gate benchmark, and a 1.5x slower LSTM
        # call read 1.23x to 1.34x there). run() packs and pads on every call, as a model does, for equivalence.
        self.timed_x: Any = self.x
        self.timed_seeds = self.seeds
        lengths = self.lengths
        if lengths is not None:
            from torch.nn.utils.rnn import pack_padded_sequence

            def pack(t: Any) -> Any:
                return pack_padded_sequence(t, lengths, batch_first=spec.batch_first, enforce_sorted=False)

            self.timed_x = pack(self.x)
            self.timed_seeds = [pack(self.seeds[0]).data, *self.seeds[1:]]

    # ---- contexts
    def _switches(self) -> contextlib.AbstractContextManager:
        return path_switches(self.torch, self.path.options)

    def _autocast(self) -> contextlib.AbstractContextManager:
        return path_autocast(self.torch, self.path.options, self.dev.type)

    def _layer(self, x: Any, h0: Any, c0: Any) -> tuple[Any, Any, Any]:
        """The layer on ``x`` (a tensor or a PackedSequence): (output, h_n, c_n or None)."""
        hx = None
        if h0 is not None:
            hx = (h0, c0) if self.spec.cell == "lstm" else h0
        out, state = self.layer(x, hx)
        return (out, *state) if self.spec.cell == "lstm" else (out, state, None)

    def _call(self, x: Any, h0: Any, c0: Any) -> tuple[Any, Any, Any]:
        if self.lengths is None:
            return self._layer(x, h0, c0)
        from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

        packed = pack_padded_sequence(x, self.lengths, batch_first=self.spec.batch_first, enforce_sorted=False)
        out, h_n, c_n = self._layer(packed, h0, c0)
        out, _ = pad_packed_sequence(out, batch_first=self.spec.batch_first, total_length=self.spec.seq_len)
        return out, h_n, c_n

    def _tracer(self) -> Any:
        """The kernel trace a pass runs under (``torch_trace``: dispatch mode, and the profiler on CUDA)."""
        return torch_trace

    # ---- PreparedRun protocol
    def run(self) -> PathResult:
        torch_trace = self._tracer()
        torch = self.torch
        spec = self.spec
        x = self.x.detach().clone().requires_grad_(spec.training)
        h0 = None if self.h0 is None else self.h0.detach().clone().requires_grad_(spec.training)
        c0 = None if self.c0 is None else self.c0.detach().clone().requires_grad_(spec.training)
        self.module.zero_grad(set_to_none=True)
        with self._switches():
            with torch_trace(self.device.kind, "forward") as fwd, self._autocast():
                out, h_n, c_n = self._call(x, h0, c0)
            bwd_trace = None
            grads: dict[str, Any] = {}
            if spec.training:
                outs = [out.float(), h_n.float()] + ([c_n.float()] if c_n is not None else [])
                with torch_trace(self.device.kind, "backward") as bwd:
                    torch.autograd.backward(outs, self.seeds)
                bwd_trace = bwd[0]
                grads["x"] = x.grad if spec.batch_first else x.grad.transpose(0, 1)
                if h0 is not None:
                    grads["h0"] = h0.grad
                if c0 is not None:
                    grads["c0"] = c0.grad
                for name, param in self.module.named_parameters():
                    grads[name] = param.grad
        output = out if spec.batch_first else out.transpose(0, 1)
        return PathResult(
            output=_np(output),
            h_n=_np(h_n),
            c_n=None if c_n is None else _np(c_n),
            grads={k: _np(v) for k, v in grads.items() if v is not None},
            forward_trace=fwd[0],
            backward_trace=bwd_trace,
        )

    def _timed_call(self) -> tuple[Any, Any, Any]:
        """One call as the benchmarks time it: the layer on the run's input (a packed path's packed once, its
        output left packed: the PackedSequence's data)."""
        if self.lengths is None:
            return self._call(self.x, self.h0, self.c0)
        out, h_n, c_n = self._layer(self.timed_x, self.h0, self.c0)
        return out.data, h_n, c_n

    def forward(self) -> object:
        with self.torch.no_grad(), self._switches(), self._autocast():
            return self._timed_call()

    def train_step(self) -> object:
        torch = self.torch
        with self._switches():
            with self._autocast():
                out, h_n, c_n = self._timed_call()
            outs = [out.float(), h_n.float()] + ([c_n.float()] if c_n is not None else [])
            torch.autograd.backward(outs, self.timed_seeds)
        return out

    def trace_forward(self) -> KernelTrace:
        with self._tracer()(self.device.kind, "forward") as trace:
            self.forward()
        return trace[0]

    def synchronize(self) -> None:
        if self.dev.type == "cuda":
            self.torch.cuda.synchronize(self.dev)


def _tensor(array: Any, dtype: Any, device: Any = None):
    """A copy of a numpy array as a tensor of ``dtype`` (converted on the way, no float64 copy first)."""
    import torch

    return torch.tensor(array, dtype=dtype, device=device)


def _np(tensor: Any):
    return tensor.detach().to("cpu").double().numpy()


def prepare(path: ExecutionPath, case: Case, device: DeviceInfo) -> TorchRun:
    return TorchRun(path, case, device)


@contextlib.contextmanager
def path_switches(torch: Any, opts: Mapping[str, object]) -> Iterator[None]:
    """The backend switches a path is defined by (only those; the rest stay as the user has them), restored
    afterwards. Also used for a user's own model (``numerics.verify_model``)."""
    saved = (torch.backends.cudnn.enabled, torch.backends.cudnn.allow_tf32, torch.backends.mkldnn.enabled)
    try:
        if opts.get("cudnn") is False:
            torch.backends.cudnn.enabled = False
        if "tf32" in opts:
            torch.backends.cudnn.allow_tf32 = bool(opts["tf32"])
        if opts.get("mkldnn") is False:
            torch.backends.mkldnn.enabled = False
        yield
    finally:
        torch.backends.cudnn.enabled, torch.backends.cudnn.allow_tf32, torch.backends.mkldnn.enabled = saved


def path_autocast(torch: Any, opts: Mapping[str, object], device_type: str) -> contextlib.AbstractContextManager:
    """The path's autocast (``options["autocast"]``: a torch dtype name), or no context."""
    name = opts.get("autocast")
    if not name:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=getattr(torch, str(name)))
