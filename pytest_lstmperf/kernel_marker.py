"""``@pytest.mark.lstmperf_kernel("cudnn")`` and the ``lstmperf_kernel`` fixture: fail a user's test whose LSTM/GRU
layers do not run the kernel they must, with the explainer's reasons.

While the marked test (or a ``with lstmperf_kernel.expect("cudnn"):`` block) runs, the observer records:

* the kernels: the torch dispatch trace (PyTorch and Keras on the torch backend) and the TensorFlow op
  callback trace (Keras on TensorFlow, eager ops and graphs built in the block), for the frameworks the test
  has already imported (nothing is imported here);
* the layers: every Keras ``LSTM``/``GRU`` whose ``inner_loop`` runs (with its mask), and every
  ``torch.nn.LSTM``/``GRU`` called, so that a failure explains each of them.

A test that runs no recurrent kernel fails too (the marker would otherwise pass vacuously).
The lead's ``plugin.py`` loads this module through ``pytest_plugins``; it registers its marker itself.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

MARKER = "lstmperf_kernel"
FAMILIES = ("cudnn", "tf-generic", "cuda-generic", "onednn", "cpu-native")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(kernel, *, precision=None): fail unless every LSTM/GRU pass in the test runs this kernel "
        f"family ({', '.join(FAMILIES)}) [and precision]; the failure lists the explainer's reasons",
    )


@dataclass
class Observation:
    traces: list[Any] = field(default_factory=list)
    layers: list[tuple[str, Any, Any]] = field(default_factory=list)  # (framework, spec, options)
    problems: list[str] = field(default_factory=list)


@contextlib.contextmanager
def observe() -> Iterator[Observation]:
    """Record recurrent kernels and layers run inside the block (frameworks already imported only)."""
    seen = Observation()
    with contextlib.ExitStack() as stack:
        torch = sys.modules.get("torch")
        if torch is not None:
            from .trace import torch_trace

            device = "cuda" if torch.cuda.is_available() else "cpu"
            stack.enter_context(_collect(torch_trace(device, "test"), seen))
            handle = torch.nn.modules.module.register_module_forward_pre_hook(_torch_hook(seen))
            stack.callback(handle.remove)
        if sys.modules.get("tensorflow") is not None:
            from .tf_trace import tf_trace

            stack.enter_context(_collect(tf_trace("test"), seen))
        if sys.modules.get("keras") is not None:
            stack.enter_context(_keras_layers(seen))
        yield seen


@contextlib.contextmanager
def _collect(trace_cm: Any, seen: Observation) -> Iterator[None]:
    with trace_cm as out:
        yield
    seen.traces.extend(out)


def _torch_hook(seen: Observation) -> Any:
    def hook(module: Any, args: Any) -> None:
        import torch

        if isinstance(module, (torch.nn.LSTM, torch.nn.GRU)) and args:
            try:
                seen.layers.append(("torch", *_torch_layer(module, args[0])))
            except Exception as exc:
                seen.problems.append(f"could not describe {type(module).__name__}: {exc}")

    return hook


def _torch_layer(module: Any, data: Any) -> tuple[Any, Any]:
    import torch

    from .spec import LayerSpec

    packed = isinstance(data, torch.nn.utils.rnn.PackedSequence)
    tensor = data.data if packed else data
    dtype = str(tensor.dtype).replace("torch.", "")
    spec = LayerSpec(
        cell="lstm" if isinstance(module, torch.nn.LSTM) else "gru",
        input_size=module.input_size,
        hidden_size=module.hidden_size,
        num_layers=module.num_layers,
        bidirectional=module.bidirectional,
        proj_size=getattr(module, "proj_size", 0),
        bias=module.bias,
        dtype=dtype if dtype in ("float32", "float64", "float16", "bfloat16") else "float32",
    )
    if packed:
        spec = spec.replace(length_mode="packed", lengths=(1,) * spec.batch, seq_len=1)
    return spec, str(tensor.device.type)


@contextlib.contextmanager
def _keras_layers(seen: Observation) -> Iterator[None]:
    import keras

    originals = {}
    for cls in (keras.layers.LSTM, keras.layers.GRU):
        original = cls.inner_loop

        def inner_loop(self, sequences, initial_state, mask, training=False, _original=original):
            try:
                seen.layers.append(describe_keras_layer(self, sequences, mask))
            except Exception as exc:
                seen.problems.append(f"could not describe {self.name}: {exc}")
            return _original(self, sequences, initial_state, mask, training=training)

        originals[cls] = original
        cls.inner_loop = inner_loop
    try:
        yield
    finally:
        for cls, original in originals.items():
            cls.inner_loop = original


def _activation_name(function: Any) -> str:
    from .keras_layer import ACTIVATIONS

    name = getattr(function, "__name__", str(function))
    module = getattr(function, "__module__", "") or ""
    if name in ACTIVATIONS and module.startswith("keras"):
        return name
    return f"custom:{module}.{name}"


def describe_keras_layer(layer: Any, sequences: Any, mask: Any) -> tuple[str, Any, Any]:
    """``(framework, LayerSpec, KerasOptions)`` of a Keras LSTM/GRU layer being called."""
    import keras
    import numpy as np

    from .keras_layer import KerasOptions
    from .spec import LayerSpec

    backend = keras.backend.backend()
    shape = tuple(int(d) for d in sequences.shape)
    cell = layer.cell
    style, lengths = "none", None
    if mask is not None:
        if isinstance(mask, (list, tuple)):
            mask = mask[0]
        m = np.asarray(keras.ops.convert_to_numpy(mask)).astype(bool).reshape(shape[0], -1)
        counts = np.maximum(m.sum(axis=1), 1)
        right = np.arange(m.shape[1])[None, :] < m.sum(axis=1)[:, None]
        if not m.all():
            style = "right" if (m == right).all() else ("left" if (m == right[:, ::-1]).all() else "holes")
            lengths = tuple(int(c) for c in counts)
    spec = LayerSpec(
        cell="lstm" if isinstance(layer, keras.layers.LSTM) else "gru",
        input_size=shape[-1],
        hidden_size=int(cell.units),
        batch=shape[0],
        seq_len=max(lengths) if lengths else shape[1],
        bias=bool(cell.use_bias),
        reset_after=bool(getattr(cell, "reset_after", True)) or isinstance(layer, keras.layers.LSTM),
        length_mode="packed" if lengths else "none",
        lengths=lengths,
    )
    options = KerasOptions(
        backend=backend,
        use_cudnn=layer.use_cudnn,
        implementation=int(getattr(cell, "implementation", 2)),
        activation=_activation_name(cell.activation),
        recurrent_activation=_activation_name(cell.recurrent_activation),
        recurrent_dropout=float(cell.recurrent_dropout),
        dropout=float(cell.dropout),
        unroll=bool(layer.unroll),
        go_backwards=bool(layer.go_backwards),
        mask=style if style != "none" else "auto",
    )
    return f"keras-{backend}", spec, options


def _device_of(framework: str, extra: Any) -> str:
    if framework == "torch":
        return "cuda" if extra == "cuda" else "cpu"
    if framework == "keras-tensorflow":
        tf = sys.modules.get("tensorflow")
        return "cuda" if tf is not None and tf.config.list_logical_devices("GPU") else "cpu"
    torch = sys.modules.get("torch")
    return "cuda" if torch is not None and torch.cuda.is_available() else "cpu"


def verdict_problem(seen: Observation, kernel: str, precision: str | None = None) -> str | None:
    """The failure message, or ``None`` when every recurrent pass ran ``kernel`` (and ``precision``)."""
    from .explain import ExplainError, explain

    ran = [t for t in seen.traces if t.family != "none"]
    wrong = [t for t in ran if t.family != kernel or (precision is not None and t.precision != precision)]
    if ran and not wrong:
        return None
    want = kernel + (f"/{precision}" if precision else "")
    lines = [
        f"lstmperf_kernel: expected {want}; " + ("no LSTM/GRU kernel ran in this test" if not ran else "observed:")
    ]
    lines += [f"  {t.describe()}" for t in wrong]
    for entry in seen.layers:
        framework, spec, options_or_device = entry
        try:
            if framework == "torch":
                verdict = explain(spec, "torch", _device_of(framework, options_or_device))
            else:
                verdict = explain(spec, framework, _device_of(framework, None), options_or_device)
            lines.append("explainer: " + verdict.describe())
        except (ExplainError, ValueError) as exc:
            lines.append(f"explainer: cannot judge {spec.short()}: {exc}")
    lines += [f"note: {p}" for p in seen.problems]
    return "\n".join(lines)


def _expected(args: tuple, kwargs: dict, where: str) -> tuple[str, str | None]:
    if len(args) != 1 or args[0] not in FAMILIES:
        raise pytest.UsageError(
            f"{where}: lstmperf_kernel takes one kernel family (valid: {', '.join(FAMILIES)}), got {args!r}"
        )
    unknown = set(kwargs) - {"precision"}
    if unknown:
        raise pytest.UsageError(f"{where}: unknown lstmperf_kernel arguments {sorted(unknown)} (valid: precision)")
    return args[0], kwargs.get("precision")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    marker = item.get_closest_marker(MARKER)
    if marker is None:
        return (yield)
    kernel, precision = _expected(marker.args, marker.kwargs, item.nodeid)
    with observe() as seen:
        result = yield
    problem = verdict_problem(seen, kernel, precision)
    if problem:
        pytest.fail(problem, pytrace=False)
    return result


class KernelExpectation:
    """The ``lstmperf_kernel`` fixture: ``with lstmperf_kernel.expect("cudnn"): model(x)``."""

    @contextlib.contextmanager
    def expect(self, kernel: str, precision: str | None = None) -> Iterator[Observation]:
        kernel, precision = _expected((kernel,), {"precision": precision} if precision else {}, "expect()")
        with observe() as seen:
            yield seen
        problem = verdict_problem(seen, kernel, precision)
        if problem:
            pytest.fail(problem, pytrace=False)


@pytest.fixture
def lstmperf_kernel() -> KernelExpectation:
    """Check the kernel of the LSTM/GRU calls inside ``with lstmperf_kernel.expect(family):``."""
    return KernelExpectation()
