"""A user's layers as configs: reading a model or a config file into the ``(framework, LayerSpec, KerasOptions)``
configs that the explainer and the eligibility report judge. A config comes from a dict (``{"framework": ...,
"cell": ..., <LayerSpec fields>, <KerasOptions fields>}``), from a JSON file or a Python ``module:attribute``
(a list of dicts, a model, a model class or a factory), or from a model's own LSTM/GRU layers (a
``torch.nn.Module`` or a Keras model on any backend), with the batch and sequence length the model calls each
layer with where it shows them.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from pathlib import Path
from typing import Any

from ..model.keras_options import KerasOptions
from ..model.spec import LayerSpec
from .calls import _activation_name, observe
from .explain import normalize_framework
from .tf_import import quiet_tensorflow_import

Config = tuple[str, LayerSpec, KerasOptions | None]


class ModelConfigs(list):
    """The configs of a model's layers, with ``names``: each layer's name in the model (``encoder.gru``,
    ``bidirectional/forward_lstm``), in the same order; the report's rows carry them."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []
        #: index -> a note on how the model calls that layer (a loop over time steps)
        self.notes: dict[int, str] = {}

    def add(self, name: str, config: Config) -> None:
        self.append(config)
        self.names.append(name)


_SPEC_FIELDS = {f.name for f in dataclasses.fields(LayerSpec)}
_OPTION_FIELDS = {f.name for f in dataclasses.fields(KerasOptions)}
ALIASES = {"units": "hidden_size", "use_bias": "bias", "input_dim": "input_size"}


def config_from_dict(data: dict[str, Any]) -> Config:
    """``{"framework": "keras-tf", "cell": "lstm", "units": 128, "activation": "relu"}`` -> a config."""
    values = {ALIASES.get(k, k): v for k, v in data.items()}
    framework = normalize_framework(values.pop("framework", "keras-tensorflow"))
    unknown = sorted(set(values) - _SPEC_FIELDS - _OPTION_FIELDS)
    if unknown:
        valid = sorted(_SPEC_FIELDS | (_OPTION_FIELDS - {"backend"}) | set(ALIASES))
        raise ValueError(f"unknown layer keys {unknown} (valid: {', '.join(valid)})")
    spec_values = {k: v for k, v in values.items() if k in _SPEC_FIELDS}
    if isinstance(spec_values.get("lengths"), list):
        spec_values["lengths"] = tuple(spec_values["lengths"])
    spec = LayerSpec(**spec_values)
    option_values = {k: v for k, v in values.items() if k in _OPTION_FIELDS}
    if framework == "torch":
        if option_values:
            raise ValueError(f"Keras options {sorted(option_values)} given for framework 'torch'")
        return framework, spec, None
    option_values["backend"] = {"keras-tensorflow": "tensorflow", "keras-jax": "jax"}.get(framework, "torch")
    return framework, spec, KerasOptions(**option_values)


def configs_from_model(model: Any, batch: int = 4, seq_len: int = 10, example_inputs: Any = None) -> list[Config]:
    """The LSTM/GRU layers of a ``torch.nn.Module`` or a Keras model, as configs.

    The batch and sequence length are the model's own where it has them: a Keras layer's built input shape, or
    (torch) the shapes each layer is called with on ``example_inputs``; ``batch``/``seq_len`` fill in the rest.
    A Keras model is a Keras model on every backend (on the torch backend it is also a ``torch.nn.Module``)."""
    configs = ModelConfigs()
    if hasattr(model, "_flatten_layers"):
        return _keras_configs(model, batch, seq_len, example_inputs)
    torch_nn = getattr(importlib.import_module("torch"), "nn", None) if _has("torch") else None
    if torch_nn is not None and isinstance(model, torch_nn.Module):
        seen = _torch_call_shapes(model, example_inputs)
        for name, module in model.named_modules():
            if isinstance(module, (torch_nn.LSTMCell, torch_nn.GRUCell)):
                configs.add(name, (CELL_FRAMEWORK, _cell_spec(module, seen.get(id(module), (batch, seq_len))), None))
            if isinstance(module, (torch_nn.LSTM, torch_nn.GRU)):
                _add_layer_calls(configs, name or type(module).__name__, module, seen.get(id(module)), batch, seq_len)
        return configs
    raise ValueError(f"{type(model).__name__} is neither a torch.nn.Module nor a Keras model")


def _add_layer_calls(configs: ModelConfigs, name: str, module: Any, calls: Any, batch: int, seq_len: int) -> None:
    """The rows of one nn.LSTM/nn.GRU: one per distinct shape it was called with on the example inputs, each
    that call's real spec (a ``PackedSequence`` as packed, with its batch, lengths and longest length), named
    ``name`` for the first and ``name [call k]`` for the k-th distinct one (an encoder's packed sequence and a
    decoder's dense one are two sequences, not two steps of one); none given: the defaults' batch and length.
    A shape called several times in one forward (a decoder's one step per call) gets the loop note."""
    import torch

    if not calls:
        spec = LayerSpec(
            cell="lstm" if isinstance(module, torch.nn.LSTM) else "gru",
            input_size=module.input_size, hidden_size=module.hidden_size, num_layers=module.num_layers,
            bidirectional=module.bidirectional, proj_size=getattr(module, "proj_size", 0), bias=module.bias,
            batch=batch, seq_len=seq_len,
        )  # fmt: skip
        configs.add(name, ("torch", spec, None))
        return
    counts: dict[LayerSpec, int] = {}
    for spec in calls:
        counts[spec] = counts.get(spec, 0) + 1
    for k, (spec, times) in enumerate(counts.items(), start=1):
        note = _loop_note(times, spec.seq_len) if times > 1 else ""
        if len(counts) > 1:
            shapes = "; ".join(_call_shape(s) for s in counts)
            note = (
                f"called on {len(counts)} different sequences in one forward ({shapes}): one row per call, each "
                "with that call's shape" + (f"; this one {note}" if note else "")
            )
        if note:
            configs.notes[len(configs)] = note
        configs.add(name if k == 1 else f"{name} [call {k}]", ("torch", spec, None))


def _call_shape(spec: LayerSpec) -> str:
    text = f"B{spec.batch} T{spec.seq_len}"
    if spec.length_mode == "packed" and spec.lengths is not None:
        text += f" packed, lengths {min(spec.lengths)}..{max(spec.lengths)}"
    return text


def _torch_call_shapes(model: Any, example_inputs: Any) -> dict[int, Any]:
    """``id(module) ->`` the spec of each call of an nn.LSTM/GRU on ``example_inputs`` in one forward, in call
    order (:func:`pytest_lstmperf.observation.calls.torch_layer`: a ``PackedSequence`` as packed with its real
    batch and lengths), or ``(batch, steps)`` of a cell (its length is its number of calls); none given: {}."""
    if example_inputs is None:
        return {}
    import torch

    from .calls import rnn_calls, torch_layer

    seen: dict[int, Any] = {}

    def record(module: Any, args: tuple) -> None:  # what nn.LSTM/GRU's forward ran on (a subclass packs inside)
        spec = torch_layer(module, args)[1].replace(initial_state=False)
        seen.setdefault(id(module), []).append(spec)

    def cell_hook(module: Any, args: tuple) -> None:
        steps = seen.get(id(module), (0, 0))[1] + 1
        seen[id(module)] = (int(args[0].shape[0]) if args[0].dim() == 2 else 1, steps)

    handles = [m.register_forward_pre_hook(cell_hook) for m in model.modules() if isinstance(m, torch.nn.RNNCellBase)]
    try:
        with torch.no_grad(), rnn_calls(record):
            model(*(example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)))
    finally:
        for handle in handles:
            handle.remove()
    return seen


def _loop_note(calls: int, seq_len: int) -> str:
    return (
        f"called {calls} times in one forward of the model, {seq_len} time step(s) per call: the kernel runs per "
        "call, so every call's launches and Python overhead remain; where the model allows (encoders, teacher "
        "forcing), pass the whole sequence in one call"
    )


#: the framework name of a torch LSTMCell/GRUCell row: a cell has no cuDNN or oneDNN kernel in PyTorch
CELL_FRAMEWORK = "torch-cell"


def _cell_spec(module: Any, batch_steps: tuple[int, ...]) -> LayerSpec:
    """A cell as a one-layer spec whose length is its number of calls per forward (the steps of its loop)."""
    import torch

    return LayerSpec(
        cell="gru" if isinstance(module, torch.nn.GRUCell) else "lstm", input_size=module.input_size,
        hidden_size=module.hidden_size, bias=bool(module.bias), batch=batch_steps[0], seq_len=batch_steps[1],
    )  # fmt: skip


def _keras_input_shape(layer: Any) -> tuple[Any, ...] | None:
    for get in (lambda: layer.input.shape, lambda: next(iter(layer._build_shapes_dict.values()))):
        try:
            shape = tuple(get())
        except Exception:
            continue
        if len(shape) == 3:
            return shape
    return None


def _keras_mask_source(layer: Any) -> str | None:
    """What gives ``layer`` a mask in its model's graph (``"'embedding' (Embedding(mask_zero=True))"``), or
    ``None`` when its input carries no mask. Keras propagates a mask from an ``Embedding(mask_zero=True)`` or a
    ``Masking`` layer through every layer that supports masking; the symbolic input then carries it."""
    try:
        tensor = layer._inbound_nodes[0].input_tensors[0]
    except (AttributeError, IndexError, TypeError):
        return None
    if getattr(tensor, "_keras_mask", None) is None:
        return None
    seen: set[int] = set()
    queue = [tensor]
    while queue:  # the nearest upstream layer that makes a mask, for the note
        history = getattr(queue.pop(0), "_keras_history", None)
        operation = getattr(history, "operation", None) or (history[0] if isinstance(history, tuple) else None)
        if operation is None or id(operation) in seen:
            continue
        seen.add(id(operation))
        kind = type(operation).__name__
        if kind == "Embedding" and getattr(operation, "mask_zero", False):
            return f"{operation.name!r} (Embedding(mask_zero=True))"
        if kind == "Masking":
            return f"{operation.name!r} (Masking(mask_value={operation.mask_value!r}))"
        for node in getattr(operation, "_inbound_nodes", [])[:1]:
            queue.extend(getattr(node, "input_tensors", []))
    return "an upstream layer"


def _mask_note(framework: str, spec: LayerSpec, options: KerasOptions, source: str, observed: str | None) -> str:
    """What the mask does to eligibility, with the verdict of the padding the report did not assume."""
    from .explain import explain

    if observed is not None:
        return (
            f"a mask from {source} reaches this layer: {observed}-padded in the call of example_inputs, reported "
            "as such; another batch's padding may decide otherwise (cuDNN needs a strictly right-padded mask on "
            "the TensorFlow backend, and no mask on the torch and JAX backends)"
        )
    right = explain(spec, framework, "cuda", dataclasses.replace(options, mask="right"))
    head = f"a mask from {source} reaches this layer, its padding unknown until run time"
    if right.kernel != "cudnn" or right.raises:  # the torch and JAX backends: any mask leaves cuDNN
        why = "; ".join(r.finding.split(":")[0] for r in right.reasons) or "-"
        return f"{head}: any mask keeps it off cuDNN on this backend ({right.kernel} on a GPU: {why})"
    left = explain(spec, framework, "cuda", dataclasses.replace(options, mask="left"))
    effect = (
        f"raises on a GPU ({left.raises})"
        if left.raises
        else f"runs {left.kernel} on a GPU ({'; '.join(r.finding.split(':')[0] for r in left.reasons) or '-'})"
    )
    return (
        f"{head}; reported as right-padded: cuDNN only while every mask is strictly right-padded "
        f"(pad_sequences(padding='post')); a left-padded mask or one with holes {effect}; "
        "report(model, example_inputs) judges the padding of a real batch (`lstmperf explain ... mask=left`)"
    )


def _keras_called_shapes(model: Any, example_inputs: Any) -> dict[int, tuple[int, int, bool]]:
    """``id(layer) -> (batch, seq_len, initial state given)`` of each Keras LSTM/GRU called on
    ``example_inputs`` (one inference call of the model, observed); none given: {}. The mask style each
    masked layer saw goes to :data:`_CALLED_MASKS` (``id(layer) -> "right"/"left"/"holes"``)."""
    _CALLED_MASKS.clear()
    if example_inputs is None:
        return {}
    import keras

    shapes: dict[int, tuple[int, int, bool]] = {}
    original = {cls: cls.inner_loop for cls in (keras.layers.LSTM, keras.layers.GRU)}
    with observe() as seen:
        count = len(seen.layers)

        def noting(cls: Any) -> Any:  # a Keras layer class
            spied = cls.inner_loop  # observe()'s spy, which describes the call into seen.layers

            def inner_loop(self, *args: Any, **kwargs: Any) -> Any:
                nonlocal count
                result = spied(self, *args, **kwargs)
                for _, spec, options in seen.layers[count:]:
                    shapes[id(self)] = (spec.batch, spec.seq_len, spec.initial_state)
                    if getattr(options, "mask", "auto") in ("right", "left", "holes"):
                        _CALLED_MASKS[id(self)] = options.mask
                count = len(seen.layers)
                return result

            return inner_loop

        for cls in original:
            cls.inner_loop = noting(cls)
        try:
            model(example_inputs, training=False)
        finally:
            for cls, spied in original.items():
                cls.inner_loop = spied  # observe() puts the layers' own back when its block ends
    return shapes


#: ``id(layer) -> mask style`` seen by :func:`_keras_called_shapes` in the call of a model's example inputs
_CALLED_MASKS: dict[int, str] = {}


def _keras_configs(model: Any, batch: int, seq_len: int, example_inputs: Any = None) -> list[Config]:
    import keras

    configs = ModelConfigs()
    called = _keras_called_shapes(model, example_inputs)
    for layer in model._flatten_layers(include_self=True, recursive=True):
        if isinstance(layer, (keras.layers.LSTM, keras.layers.GRU)) and layer.built:
            cell = layer.cell
            shape = _keras_input_shape(layer) or (None, None, None)
            state = False
            if id(layer) in called:
                shape, state = (*called[id(layer)][:2], None), called[id(layer)][2]
            guessed = [
                f"{what} {value}"
                for what, value, have in (("batch", batch, shape[0]), ("length", seq_len, shape[1]))
                if not have
            ]
            framework = f"keras-{keras.backend.backend()}"
            spec = LayerSpec(
                cell="lstm" if isinstance(layer, keras.layers.LSTM) else "gru",
                input_size=int(cell.kernel.shape[0]), hidden_size=int(cell.units), bias=bool(cell.use_bias),
                reset_after=bool(getattr(cell, "reset_after", True)) or isinstance(layer, keras.layers.LSTM),
                batch=int(shape[0] or batch), seq_len=int(shape[1] or seq_len), initial_state=bool(state),
            )  # fmt: skip
            options = KerasOptions(
                backend=keras.backend.backend(), use_cudnn=layer.use_cudnn,
                implementation=int(getattr(cell, "implementation", 2)),
                activation=_activation_name(cell.activation),
                recurrent_activation=_activation_name(cell.recurrent_activation),
                recurrent_dropout=float(cell.recurrent_dropout), dropout=float(cell.dropout),
                unroll=bool(layer.unroll), go_backwards=bool(layer.go_backwards),
            )  # fmt: skip
            notes = []
            if guessed:
                notes.append(
                    f"the model leaves its {' and '.join(w.split()[0] for w in guessed)} open (None): reported at "
                    f"{', '.join(guessed)} (--batch/--seq-len, or report(model, example_inputs) for the shapes of "
                    "a real call); small batches decide CPU vs GPU"
                )
            masked_by = _keras_mask_source(layer)
            if masked_by is not None or id(layer) in _CALLED_MASKS:
                observed = _CALLED_MASKS.get(id(layer))
                options = dataclasses.replace(options, mask=observed or "right")
                notes.append(_mask_note(framework, spec, options, masked_by or "an upstream layer", observed))
            if notes:
                configs.notes[len(configs)] = "\n".join(notes)
            configs.add(layer.name, (framework, spec, options))
    return configs


def _has(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def load_configs(source: str, batch: int = 4, seq_len: int = 10) -> list[Config]:
    """Configs from a JSON file (a list of dicts) or ``package.module:attribute`` (a list, model or callable)."""
    path = Path(source)
    if path.suffix == ".json" or path.exists():
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"{source}: cannot read a JSON list of layer configs: {exc}") from None
        if not isinstance(data, list):
            raise ValueError(f"{source}: expected a JSON list of layer configs")
        return [config_from_dict(item) for item in data]
    module_name, _, attribute = source.partition(":")
    import os
    import sys

    if "" not in sys.path and os.getcwd() not in sys.path:  # as `python -m` and pytest do: the current folder
        sys.path.insert(0, os.getcwd())
    with quiet_tensorflow_import():  # the module may import Keras on TensorFlow, now or in its factory
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ValueError(f"{source}: cannot import {module_name!r}: {exc}") from None
        obj = getattr(module, attribute or "CONFIGS", None)
        if obj is None:
            candidates = _model_candidates(module)
            if not attribute:
                named = ", ".join(f"{module_name}:{c}" for c in candidates)
                raise ValueError(
                    f"{source}: name what to report as {module_name}:ATTRIBUTE (a model, a model class or a "
                    f"factory, or a list of layer dicts); {module_name} has no CONFIGS list"
                    + (f"; candidates: {named}" if candidates else "")
                )
            raise ValueError(
                f"{source}: {module_name} has no attribute {attribute!r}"
                + (f" (candidates: {', '.join(candidates)})" if candidates else "")
            )
        is_model = hasattr(obj, "modules") or hasattr(obj, "_flatten_layers")
        if isinstance(obj, type) or (callable(obj) and not is_model):
            obj = obj()  # a model class or a factory: the model it builds
        if isinstance(obj, list):
            return [item if isinstance(item, tuple) else config_from_dict(item) for item in obj]
        return configs_from_model(obj, batch=batch, seq_len=seq_len)


def _model_candidates(module: Any) -> list[str]:
    """Names in ``module`` that look like what ``report`` takes: torch modules and their classes, Keras models,
    and module-level functions defined there (factories)."""
    out = []
    for name, value in vars(module).items():
        if name.startswith("_"):
            continue
        defined_here = getattr(value, "__module__", None) == module.__name__
        is_model = hasattr(value, "modules") or hasattr(value, "_flatten_layers")
        if (is_model and not isinstance(value, type)) or (defined_here and callable(value)):
            out.append(name)
    return out
