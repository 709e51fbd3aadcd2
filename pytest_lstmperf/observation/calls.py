"""Observe the recurrent layer calls of a user's own code: :func:`observe` records, while its block runs, each
call of an LSTM/GRU layer (torch modules and cells, Keras layers on either backend) with the kernel family and
precision it ran, and describes each layer as a spec (and Keras options) the explainer can judge. The verdict
on what was observed is :func:`pytest_lstmperf.hooks.kernel_marker.verdict_problem`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..model.keras_options import ACTIVATIONS, KerasOptions
from ..model.precision import DTYPES
from ..model.spec import LayerSpec
from . import jax_trace
from .layer_trace import LayerRecorder, torch_layer_trace
from .tf_trace import tf_trace


@dataclass
class Observation:
    traces: list[Any] = field(default_factory=list)
    layers: list[tuple[str, Any, Any]] = field(default_factory=list)  # (framework, spec, options)
    problems: list[str] = field(default_factory=list)
    recorder: Any = None  # layer_trace.LayerRecorder once torch is observed
    #: Keras on JAX: also trace each layer's backward pass (what a training step of the layer compiles to)
    jax_backward: bool = False

    def all_traces(self) -> list[Any]:
        """Per-layer torch traces, then the TensorFlow pass traces and the per-layer JAX traces that ran a
        recurrent kernel."""
        layer_traces = self.recorder.traces() if self.recorder is not None else []
        return layer_traces + [t for t in self.traces if t.family != "none"]


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a callback once a watched top-level module has been imported (a framework imported mid-test)."""

    def __init__(self, callbacks: dict[str, Callable[[], None]]) -> None:
        self.callbacks = callbacks

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in self.callbacks:
            return None
        callback = self.callbacks.pop(name)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        inner = spec.loader

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec: Any) -> Any:
                return inner.create_module(spec)

            def exec_module(self, module: Any) -> None:
                inner.exec_module(module)
                callback()

        spec.loader = _Loader()
        return spec


@contextlib.contextmanager
def observe(jax_backward: bool = False) -> Iterator[Observation]:
    """Record recurrent kernels and layers run inside the block, for frameworks imported before or during it.
    ``jax_backward``: for Keras on JAX, trace each layer's backward pass too (see :func:`_jax_layer_traces`)."""
    seen = Observation(jax_backward=jax_backward)
    with contextlib.ExitStack() as stack:
        starters = {
            "torch": lambda: _observe_torch(stack, seen),
            "tensorflow": lambda: _observe_tf(stack, seen),
            "keras": lambda: stack.enter_context(_keras_layers(seen)),
        }
        waiting = {}
        for name, start in starters.items():
            if sys.modules.get(name) is not None:  # None: an import blocked on purpose, not a module
                start()
            else:
                waiting[name] = start
        watcher = _AfterImport(waiting)
        sys.meta_path.insert(0, watcher)
        stack.callback(lambda: sys.meta_path.remove(watcher) if watcher in sys.meta_path else None)
        yield seen


def _observe_torch(stack: contextlib.ExitStack, seen: Observation) -> None:
    import torch

    seen.recorder = LayerRecorder()
    stack.enter_context(torch_layer_trace(seen.recorder))
    handle = torch.nn.modules.module.register_module_forward_pre_hook(_torch_hook(seen))
    stack.callback(handle.remove)

    # an LSTM/GRU as its forward ran (packed inside a subclass too)
    stack.enter_context(rnn_calls(lambda module, args: _record_layer(seen, module, args)))


def _record_layer(seen: Observation, module: Any, args: Any) -> None:
    """One recurrent call into ``seen.layers`` (not while the recorder is paused: the explainer's own probes), or
    why it could not be described into ``seen.problems``."""
    if seen.recorder is not None and seen.recorder.paused:
        return
    try:
        seen.layers.append(torch_layer(module, args))
    except Exception as exc:
        seen.problems.append(f"could not describe {type(module).__name__}: {exc}")


def _observe_tf(stack: contextlib.ExitStack, seen: Observation) -> None:
    stack.enter_context(_collect(tf_trace("test"), seen))


@contextlib.contextmanager
def _collect(trace_cm: Any, seen: Observation) -> Iterator[None]:
    with trace_cm as out:
        yield
    seen.traces.extend(out)


#: the framework name of an ``nn.LSTMCell``/``nn.GRUCell`` call in ``Observation.layers`` (one time step)
CELL_FRAMEWORK = "torch-cell"


def _torch_hook(seen: Observation) -> Any:
    def hook(module: Any, args: Any) -> None:
        import torch

        if isinstance(module, (torch.nn.LSTMCell, torch.nn.GRUCell)) and args:  # LSTM/GRU: by rnn_calls
            _record_layer(seen, module, args)

    return hook


@contextlib.contextmanager
def rnn_calls(record: Callable[[Any, tuple], None]) -> Iterator[None]:
    """Inside the block, ``record(module, (input, hx))`` is called on every run of ``nn.LSTM.forward`` and
    ``nn.GRU.forward``, with what that forward was given: the ``PackedSequence`` a subclass packs inside its own
    forward and hands to ``super().forward`` (pytorch-forecasting's ``LSTM``, whose module call takes a padded
    batch and ``lengths=``) is seen as it runs, which a hook on the module call cannot see."""
    import torch

    originals = {cls: cls.__dict__["forward"] for cls in (torch.nn.LSTM, torch.nn.GRU)}

    def spy(original: Any) -> Any:
        @functools.wraps(original)
        def forward(self: Any, input: Any, hx: Any = None) -> Any:
            explainer = sys.modules.get(f"{__package__}.explain")
            if not getattr(explainer, "_PROBING", False):  # the rules check's own probe calls are not the caller's
                record(self, (input, hx))
            return original(self, input, hx)

        return forward

    try:
        for cls, original in originals.items():
            cls.forward = spy(original)  # type: ignore[method-assign]
        yield
    finally:
        for cls, original in originals.items():
            cls.forward = original  # type: ignore[method-assign]


def torch_layer(module: Any, args: tuple) -> tuple[str, Any, Any]:
    """``(framework, LayerSpec, device type)`` of one call of a torch LSTM/GRU or cell, with the batch, length
    and initial state of that call (a cell: one step, framework ``torch-cell``). A ``PackedSequence`` is packed,
    with its real batch, its lengths in the batch's own order (``unsorted_indices``) and its longest length as
    the length."""
    import torch

    data = args[0]
    packed = isinstance(data, torch.nn.utils.rnn.PackedSequence)
    tensor = data.data if packed else data
    dtype = str(tensor.dtype).replace("torch.", "")
    dtype = dtype if dtype in DTYPES else "float32"
    given_state = len(args) > 1 and args[1] is not None
    lstm = isinstance(module, (torch.nn.LSTM, torch.nn.LSTMCell))
    common = {
        "cell": "lstm" if lstm else "gru",
        "input_size": module.input_size,
        "hidden_size": module.hidden_size,
        "bias": bool(module.bias),
        "dtype": dtype,
        "initial_state": given_state,
    }
    if isinstance(module, torch.nn.RNNCellBase):
        batch = int(tensor.shape[0]) if tensor.dim() == 2 else 1
        return CELL_FRAMEWORK, LayerSpec(**common, batch=batch, seq_len=1), str(tensor.device.type)
    lengths = None
    if packed:
        sizes = [int(b) for b in data.batch_sizes]
        batch, seq_len = sizes[0], len(sizes)
        ordered = [sum(1 for b in sizes if b > i) for i in range(batch)]  # in the packed (sorted) order
        unsort = data.unsorted_indices
        lengths = tuple(ordered[int(k)] for k in unsort) if unsort is not None else tuple(ordered)
    elif tensor.dim() == 3:
        first, second = int(tensor.shape[0]), int(tensor.shape[1])
        batch, seq_len = (first, second) if module.batch_first else (second, first)
    else:  # unbatched (L, H_in)
        batch, seq_len = 1, int(tensor.shape[0])
    spec = LayerSpec(
        **common,
        num_layers=module.num_layers,
        bidirectional=module.bidirectional,
        proj_size=getattr(module, "proj_size", 0),
        batch=batch,
        seq_len=seq_len,
    )
    if packed:
        spec = spec.replace(length_mode="packed", lengths=lengths)
    return "torch", spec, str(tensor.device.type)


@contextlib.contextmanager
def _keras_layers(seen: Observation) -> Iterator[None]:
    """Every Keras LSTM/GRU call: the layers' ``inner_loop`` and, where Keras has it (3.15 on a GPU, torch and
    JAX backends), the fused bidirectional call, which runs both directions in one cuDNN call without calling
    either layer."""
    import keras

    patched: list[tuple[type, str, Any]] = []

    def patch(cls: type, name: str, make: Any) -> None:
        original = getattr(cls, name, None)
        if original is not None:
            patched.append((cls, name, original))
            setattr(cls, name, make(original))

    given: dict[int, bool] = {}  # id(layer) -> whether its running call was given an initial state
    for cls in (keras.layers.LSTM, keras.layers.GRU):
        patch(cls, "call", lambda original: _spied_call(given, original))
        patch(cls, "inner_loop", lambda original: _spied_inner_loop(seen, original, given))
    for name in ("_call_fused_lstm", "_call_fused_gru"):
        patch(keras.layers.Bidirectional, name, lambda original: _spied_fused(seen, original))
    try:
        yield
    finally:
        for cls, name, original in reversed(patched):
            setattr(cls, name, original)


@contextlib.contextmanager
def _layer_scope(seen: Observation, label: str, sequences: Any, *, keep_on_error: bool = True) -> Iterator[None]:
    """The torch recorder's bucket for one Keras layer call (on the torch backend only); with
    ``keep_on_error=False`` a call that raises leaves no bucket (an attempt Keras falls back from)."""
    import keras

    recorder = seen.recorder if keras.backend.backend() == "torch" else None
    if recorder is None or recorder.paused:
        yield
        return
    device = getattr(getattr(sequences, "device", None), "type", "cpu")
    recorder.enter(label, "cuda" if device == "cuda" else "cpu")
    call = recorder.calls[-1]
    try:
        yield
    except BaseException:
        if not keep_on_error:
            recorder.calls[:] = [c for c in recorder.calls if c is not call]
        raise
    finally:
        recorder.leave()


def _describe_into(
    seen: Observation, layer: Any, sequences: Any, mask: Any, initial_state: bool = False
) -> list[tuple[str, Any, Any]]:
    try:
        return [describe_keras_layer(layer, sequences, mask, initial_state=initial_state)]
    except Exception as exc:
        seen.problems.append(f"could not describe Keras layer {layer.name!r}: {type(exc).__name__}: {exc}")
        return []


def _spied_call(given: dict[int, bool], original: Any) -> Any:
    """An LSTM/GRU ``call`` that notes whether the caller passed ``initial_state`` (Keras makes zeros before
    ``inner_loop`` runs, so ``inner_loop`` always receives states)."""

    @functools.wraps(original)
    def call(self, sequences, initial_state=None, mask=None, training=False):
        before = given.get(id(self))
        given[id(self)] = initial_state is not None
        try:
            return original(self, sequences, initial_state=initial_state, mask=mask, training=training)
        finally:
            if before is None:
                given.pop(id(self), None)
            else:
                given[id(self)] = before

    return call


def _spied_inner_loop(seen: Observation, original: Any, given: dict[int, bool] | None = None) -> Any:
    def inner_loop(self, sequences, initial_state, mask, training=False):
        state = bool((given or {}).get(id(self), False))
        seen.layers.extend(_describe_into(seen, self, sequences, mask, initial_state=state))
        if _keras_backend() == "jax":

            def invoke(x: Any, states: Any, m: Any) -> Any:
                return original(self, x, states, m, training=training)

            label = f"keras {type(self).__name__} {self.name!r}"
            _jax_layer_traces(seen, self, invoke, (sequences, initial_state, mask), ("inner_loop", training), label)
        with _layer_scope(seen, f"keras {type(self).__name__} {self.name!r}", sequences):
            return original(self, sequences, initial_state, mask, training=training)

    return inner_loop


def _keras_backend() -> str:
    keras = sys.modules.get("keras")
    return keras.backend.backend() if keras is not None else ""


#: (layer class, what was traced, config without names and its unserialized switches, argument shapes and dtypes,
#: backward) -> traces (the
#: layer's label added when read): a layer of one configuration called on arrays of one shape compiles to the
#: same module (a float64 clone, perturbed weights, a second model built alike and a repeated call are traced
#: once)
_JAX_TRACES: dict[str, list[Any]] = {}


def _without_names(config: Any) -> Any:
    """A layer's config without the names (its own and its sub-layers'): a name changes no computation. A dtype
    policy's ``name`` is its dtype ("mixed_bfloat16") and stays."""
    if isinstance(config, dict):
        if str(config.get("class_name", "")).endswith("DTypePolicy"):
            return config
        return {k: _without_names(v) for k, v in config.items() if k != "name"}
    if isinstance(config, (list, tuple)):
        return [_without_names(v) for v in config]
    return config


def unserialized_switches(layer: Any) -> list[Any]:
    """What a Keras layer (or model) leaves out of ``get_config()`` that changes the kernel it runs: the
    ``use_cudnn`` of each LSTM/GRU in it (Keras 3.15 does not serialise it). A cache keyed by the config alone
    would give a clone with ``use_cudnn=False`` the compiled cuDNN computation of the model it was cloned from
    (on the H100, verify_model's cuDNN-off path ran cuDNN that way, and its kernel check failed)."""
    try:
        layers = list(layer._flatten_layers(include_self=True, recursive=True))
    except (AttributeError, TypeError):
        layers = [layer]
    return [getattr(sub, "use_cudnn", None) for sub in layers if hasattr(sub, "use_cudnn")]


def _jax_layer_traces(seen: Observation, layer: Any, invoke: Any, arrays: tuple, what: tuple, label: str) -> None:
    """What XLA compiles one Keras recurrent call on the JAX backend to: ``invoke(*arrays)`` (a layer's
    ``inner_loop``, or a Bidirectional wrapper's fused call; Keras's cuDNN-or-loop decision included, taken in
    Python while it is traced) as a ``jax.jit`` function of the layer's variables and the call's arrays,
    lowered for their shapes and dtypes and compiled, read by
    :func:`pytest_lstmperf.observation.jax_trace.hlo_trace`, as the suites' Keras-on-JAX worker reads the
    executables it times; with ``seen.jax_backward``, the gradient of the outputs w.r.t. the variables and
    inputs too. Works inside a ``jax.jit`` or ``jax.grad`` of the caller (only shapes and dtypes are used).
    Eager JAX runs a layer op by op; the compiled module is what a jitted step (Keras's own ``fit``/``predict``)
    runs."""
    try:
        import jax
        import jax.numpy as jnp
        import keras

        def abstract(a: Any) -> Any:
            return jax.ShapeDtypeStruct(tuple(int(d) for d in a.shape), a.dtype)

        # the weights are differentiated; other state (a dropout's seed generator) is passed as it is
        weights = [v for v in layer.variables if jnp.issubdtype(v.value.dtype, jnp.floating)]
        others = [v for v in layer.variables if not jnp.issubdtype(v.value.dtype, jnp.floating)]
        variables = weights + others
        sequences = arrays[0]
        # the weights and the sequences are differentiated; the other arrays (initial states, a boolean mask)
        # are passed as they are
        args = (
            [abstract(v.value) for v in weights],
            abstract(sequences),
            jax.tree.map(abstract, tuple(arrays[1:])),
            [abstract(v.value) for v in others],
        )
        shapes = jax.tree.map(lambda a: (a.shape, str(a.dtype)), args)
        kind = (type(layer).__module__, type(layer).__qualname__, repr(what))
        config = (_without_names(layer.get_config()), unserialized_switches(layer))
        key = repr((kind, config, shapes, seen.jax_backward))
        cached = _JAX_TRACES.get(key)
        if cached is None:

            def call(params: list, x: Any, more: tuple, rest: list) -> Any:
                with keras.StatelessScope(state_mapping=list(zip(variables, [*params, *rest], strict=True))):
                    return invoke(x, *more)

            def loss(params: list, x: Any, more: tuple, rest: list) -> Any:
                outs = jax.tree.leaves(call(params, x, more, rest))
                return sum(jnp.sum(o.astype(jnp.float32)) for o in outs if jnp.issubdtype(o.dtype, jnp.floating))

            concrete = not isinstance(sequences, jax.core.Tracer) and hasattr(sequences, "devices")
            tf32 = jax_trace.tf32_capable(next(iter(sequences.devices())) if concrete else jax.devices()[0])
            cached = []
            phases = [("forward", jax.jit(call))]
            if seen.jax_backward:
                phases.append(("backward", jax.jit(jax.grad(loss, argnums=(0, 1)))))
            for phase, function in phases:
                cached.append(jax_trace.compiled_trace(function, *args, phase=phase, tf32_capable=tf32))
            if len(_JAX_TRACES) > 256:
                _JAX_TRACES.clear()
            _JAX_TRACES[key] = cached
        seen.traces.extend(dataclasses.replace(t, detail=f"{label}; {t.detail}" if t.detail else label) for t in cached)
    except Exception as exc:  # never a silent pass: the verdict lists it
        seen.problems.append(f"could not trace {label} on JAX: {type(exc).__name__}: {exc}")


def _spied_fused(seen: Observation, original: Any) -> Any:
    def fused(self, sequences, initial_state, *args, **kwargs):
        described = [d for layer in (self.forward_layer, self.backward_layer)
                     for d in _describe_into(seen, layer, sequences, None,
                                             initial_state=initial_state is not None)]  # fmt: skip
        label = f"keras Bidirectional {self.name!r} (fused)"
        with _layer_scope(seen, label, sequences, keep_on_error=False):
            result = original(self, sequences, initial_state, *args, **kwargs)
        # reached only when the fused call ran (NotImplementedError: Keras falls back to the two layers)
        seen.layers.extend(described)
        if _keras_backend() == "jax":  # Keras 3.15 fuses both directions on a GPU there too (cuDNN)

            def invoke(x: Any, states: Any) -> Any:
                return original(self, x, states, *args, **kwargs)

            _jax_layer_traces(seen, self, invoke, (sequences, initial_state), ("fused", args, kwargs), label)
        return result

    return fused


def _activation_name(function: Any) -> str:
    name = getattr(function, "__name__", None)
    module = getattr(function, "__module__", "") or ""
    if name in ACTIVATIONS and module.startswith("keras"):
        return name
    if name is None and hasattr(function, "get_config"):
        # a layer object as activation (keras.layers.ReLU(negative_slope=0.05)): carried as its Keras
        # serialisation, so a worker can rebuild the layer with it (paths.keras.layer.activation)
        import json

        import keras

        data = keras.saving.serialize_keras_object(function)
        if isinstance(data, dict) and isinstance(data.get("config"), dict):  # what changes no computation out
            data = {k: v for k, v in data.items() if not (k == "registered_name" and v is None)}
            data["config"] = {k: v for k, v in data["config"].items() if k not in ("name", "dtype", "trainable")}
        return "custom:" + json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return f"custom:{module}.{name or type(function).__name__}"


def describe_keras_layer(layer: Any, sequences: Any, mask: Any, initial_state: bool = False) -> tuple[str, Any, Any]:
    """``(framework, LayerSpec, KerasOptions)`` of a Keras LSTM/GRU layer being called (``initial_state``:
    whether the caller passed states, as a decoder fed an encoder's states is)."""
    import keras
    import numpy as np

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
        initial_state=bool(initial_state),
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


def device_of(framework: str, extra: Any) -> str:
    """The device a framework's layer runs on: ``extra`` is torch's device, else what the backend reports."""
    if framework == "torch":
        return "cuda" if extra == "cuda" else "cpu"
    if framework == "keras-tensorflow":
        tf = sys.modules.get("tensorflow")
        return "cuda" if tf is not None and tf.config.list_logical_devices("GPU") else "cpu"
    if framework == "keras-jax":
        jax = sys.modules.get("jax")
        return "cuda" if jax is not None and jax.default_backend() == "gpu" else "cpu"
    torch = sys.modules.get("torch")
    return "cuda" if torch is not None and torch.cuda.is_available() else "cpu"
