"""The registry of execution paths: one entry per (framework, device, kernel family, precision, input form).

Adding a path is one :func:`register_path` call. Entries name their implementation as ``"module:function"``
strings so that listing paths (``--help``, the header, option validation) imports no framework.

A path's ``prepare(case, device)`` returns a :class:`PreparedRun`: the layer built and loaded with the
case's canonical weights, inputs on the device, ready to be run once with tracing (``run()``, used by the
equivalence suite) or many times without (``forward()`` / ``train_step()``, used by the benchmarks).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

from ..model.precision import PRECISIONS
from ..observation.families import CLAIMABLE

if TYPE_CHECKING:
    import numpy as np
    from hypothesis.strategies import SearchStrategy

    from ..device import DeviceInfo
    from ..model.case import Case
    from ..model.keras_options import KerasOptions
    from ..model.spec import LayerSpec
    from ..observation.torch_trace import KernelTrace


@dataclass
class PathResult:
    """What one path computed, as float64 numpy arrays in the canonical layouts, and what it ran.

    ``output`` is batch-first ``(B, T, D*S)``; ``h_n``/``c_n`` are ``(L*D, B, S|H)``; ``grads`` maps
    ``"x"``, ``"h0"``, ``"c0"`` (when the spec has initial states) and every canonical parameter name to
    its gradient. ``forward_trace``/``backward_trace`` are what the kernel trace observed.
    """

    output: np.ndarray
    h_n: np.ndarray
    c_n: np.ndarray | None
    grads: dict[str, np.ndarray]
    forward_trace: KernelTrace
    backward_trace: KernelTrace | None
    notes: list[str] = field(default_factory=list)


class PreparedRun(Protocol):
    """A layer and its inputs, ready on a device."""

    def run(self) -> PathResult:
        """One traced forward and backward pass; results copied to float64 numpy."""

    def forward(self) -> object:
        """One inference call (no autograd), for timing. Returns without synchronising."""

    def train_step(self) -> object:
        """One forward + backward call, for timing. Returns without synchronising."""

    def trace_forward(self) -> KernelTrace:
        """Trace one :meth:`forward` call (what the benchmarks record)."""

    def synchronize(self) -> None:
        """Wait for the device to finish queued work."""


class PathOptions(TypedDict, total=False):
    """The keys an :class:`ExecutionPath`'s ``options`` may hold (each optional), and who reads them."""

    # torch paths (torch_paths.py, compiled.py)
    cudnn: bool  # False: torch.backends.cudnn.enabled off
    mkldnn: bool  # False: torch.backends.mkldnn.enabled off
    tf32: bool  # torch.backends.cudnn.allow_tf32
    autocast: str  # torch dtype name of a torch.autocast around the calls
    packed: bool  # run a PackedSequence
    onednn_only: bool  # the path runs only where oneDNN takes the layer (LSTM, no projections)
    cells: tuple[str, ...]  # the cells the path's generated specs draw from
    min_capability: tuple[int, int]  # CUDA compute capability the path needs
    min_cudnn: int  # cuDNN version the path needs (torch.backends.cudnn.version())
    mode: str  # torch.compile mode
    allow_rnn: bool  # torch._dynamo.config.allow_rnn
    # ONNX Runtime paths
    provider_options: dict[str, str]  # the execution provider's options
    # Keras paths
    keras: KerasOptions
    kernel_only: str  # why the path runs no equivalence check (its kernel alone is checked)
    off_cudnn: bool  # the path takes the specs the explainer keeps off cuDNN
    # any path
    inference_only: bool  # no backward pass on this path
    reset_before_ok: bool  # the path runs GRUs with reset_after=False
    known_findings: dict[tuple[str, str], str]  # {(check, observed): why}, see observation/claims.py


def _resolve(ref: str) -> Callable[..., Any]:
    module, _, name = ref.partition(":")
    function: Callable[..., Any] = getattr(importlib.import_module(module, __name__), name)
    return function


@dataclass(frozen=True)
class ExecutionPath:
    """One way of executing a layer, with what it claims to run.

    ``available``: ``"module:function"`` taking a DeviceInfo, returning ``None`` or the reason it is not.
    ``supports``: ``"module:function"`` taking a LayerSpec, returning ``None`` or why the spec does not apply.
    ``prepare``: ``"module:function"`` taking ``(path, case, device)`` and returning a PreparedRun.
    ``pair_with``: names of paths of the same precision whose results should agree with this one closely.
    """

    name: str
    framework: str
    device: str  # "cpu" or "cuda"
    kernel: str  # expected family, one of observation.families.CLAIMABLE
    precision: str  # expected compute precision, one of PRECISIONS
    description: str
    prepare_ref: str
    available_ref: str
    supports_ref: str
    options: PathOptions = field(default_factory=lambda: PathOptions(), hash=False, compare=False)
    pair_with: tuple[str, ...] = ()
    in_gate: bool = True  # its benchmarks are in the speed gate's quick set
    #: why the path is left out of the default selection (slow to compile per shape); '' = selected by default.
    #: An extended path runs when named in --lstmperf-paths or with --lstmperf-paths=all
    extended: str = ""
    expect_ref: str = ""  # "module:function" (path, spec) -> (family, precision) where the claim depends on the spec

    def available(self, device: DeviceInfo) -> str | None:
        if device.kind != self.device:
            return f"path runs on {self.device}, selected device is {device.name}"
        reason: str | None = _resolve(self.available_ref)(self, device)
        return reason

    def supports(self, spec: LayerSpec) -> str | None:
        reason: str | None = _resolve(self.supports_ref)(self, spec)
        return reason

    def expected(self, spec: LayerSpec) -> tuple[str, str]:
        """The kernel family and precision this path must run for ``spec``."""
        if self.expect_ref:
            family, precision = _resolve(self.expect_ref)(self, spec)
            return str(family), str(precision)
        return self.kernel, self.precision

    def prepare(self, case: Case, device: DeviceInfo) -> PreparedRun:
        run: PreparedRun = _resolve(self.prepare_ref)(self, case, device)
        return run


REGISTRY: dict[str, ExecutionPath] = {}


def register_path(path: ExecutionPath) -> ExecutionPath:
    if path.name in REGISTRY:
        raise ValueError(f"execution path {path.name!r} registered twice")
    if path.kernel not in CLAIMABLE:
        raise ValueError(f"path {path.name!r}: kernel {path.kernel!r} not in {CLAIMABLE}")
    if path.precision not in PRECISIONS:
        raise ValueError(f"path {path.name!r}: precision {path.precision!r} not in {PRECISIONS}")
    REGISTRY[path.name] = path
    return path


def register_from(
    module: str, name: str, framework: str, device: str, kernel: str, precision: str, description: str, **fields: Any
) -> ExecutionPath:
    """Register a path whose ``prepare``, ``available`` and ``supports`` (and the function named by
    ``expect=``, if any) are the functions of those names in ``module`` (the registering module's ``__name__``).
    ``fields`` are the other :class:`ExecutionPath` fields (``options``, ``pair_with``, ``in_gate``)."""
    expect = fields.pop("expect", "")
    path = ExecutionPath(
        name, framework, device, kernel, precision, description,
        prepare_ref=f"{module}:prepare", available_ref=f"{module}:available", supports_ref=f"{module}:supports",
        expect_ref=f"{module}:{expect}" if expect else "", **fields,
    )  # fmt: skip
    return register_path(path)


def _load_builtin() -> None:
    # register on import and import no framework (compiled imports torch_paths: the eager paths come first)
    from . import compiled, onnx_runtime, torch_paths  # noqa: F401

    with contextlib.suppress(ImportError):  # module absent in a partial install
        from .keras import paths as keras_paths  # noqa: F401


_BUILTIN_LOADED: list[bool] = []


def all_paths() -> dict[str, ExecutionPath]:
    # loaded once, whatever was registered before (importing one path module first registers only its paths)
    if not _BUILTIN_LOADED:
        _BUILTIN_LOADED.append(True)
        _load_builtin()
    return REGISTRY


def get(name: str) -> ExecutionPath:
    paths = all_paths()
    if name not in paths:
        raise KeyError(f"unknown execution path {name!r} (valid: {', '.join(sorted(paths))})")
    return paths[name]


def default_names() -> list[str]:
    """The default selection: every registered path but the extended ones."""
    return sorted(name for name, path in all_paths().items() if not path.extended)


def for_device(kind: str, names: Iterable[str] | None = None) -> list[ExecutionPath]:
    """The paths of ``kind`` among ``names`` (None: the default selection)."""
    selected = [get(n) for n in (default_names() if names is None else names)]
    return [p for p in selected if p.device == kind]


def selection(value: str | None) -> tuple[str, ...] | None:
    """The paths ``--lstmperf-paths`` selects: comma-separated path names, ``default`` (None: every path but the
    extended ones) or ``all``; raises ValueError naming the unknown names and the valid ones."""
    known = all_paths()
    value = (value or "").strip()
    if value in ("", "default"):
        return None
    if value == "all":
        return tuple(sorted(known))
    names = tuple(dict.fromkeys(n.strip() for n in value.split(",") if n.strip()))
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(
            f"unknown path{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
            f"(valid: default, all, {', '.join(sorted(known))})"
        )
    return names


def path_names(device: str = "cpu", framework: str | None = "torch") -> SearchStrategy[str]:
    """Names of the registered execution paths of ``device`` (and ``framework``: torch, keras, torch-compile,
    onnxruntime; None: all), a Hypothesis strategy."""
    from hypothesis import strategies as st

    names = [
        p.name
        for p in for_device(device.split(":")[0])
        # "keras" takes both Keras backends (keras-tensorflow, keras-torch); "torch" is eager torch only
        if framework is None or p.framework == framework or (framework == "keras" and p.framework.startswith("keras-"))
    ]
    if not names:
        raise ValueError(f"no registered path for device {device!r} and framework {framework!r}")
    return st.sampled_from(sorted(names))
