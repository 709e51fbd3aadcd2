"""The Keras layer stack built from a :class:`LayerSpec` plus :class:`KerasOptions`.

:class:`LayerSpec` stays framework-neutral; what only Keras has lives in :class:`KerasOptions`
(:mod:`pytest_lstmperf.model.keras_options`, re-exported here). The spec maps
to Keras where it can: ``bidirectional`` -> ``keras.layers.Bidirectional`` (merge ``concat``), ``num_layers``
-> a stack of layers, ``bias`` -> ``use_bias``, ``reset_after`` -> GRU ``reset_after``, ``initial_state`` ->
the layers' ``initial_state``, ``length_mode="packed"`` -> a boolean mask (Keras skips masked steps: the state
is carried over them). ``proj_size`` has no Keras counterpart.

Masks (``KerasOptions.mask``): ``"auto"`` is a right-padded mask for packed specs and none otherwise;
``"left"`` and ``"holes"`` place each sequence's valid steps at the end, or spread them with gaps, and mask
the rest: the same math as the packed spec, but a mask cuDNN rejects. Outputs are mapped back to the
canonical (right-aligned) positions, and positions past a sequence's length are reported as zero (Keras's
generic loop repeats the last output there; its cuDNN path writes zeros).

``go_backwards=True`` (a unidirectional option): the stack feeds each layer its input reversed, so that the
layer's backward sweep computes the forward recurrence; outputs come back in forward order. This checks
Keras's own reversal against the reference.

The module imports no framework at import time; :class:`KerasStack` imports keras when built (in a process
whose ``KERAS_BACKEND`` is set, see :mod:`pytest_lstmperf.paths.keras.pool`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...model.keras_options import (  # noqa: F401  (re-exported: KerasOptions's home was this module)
    ACTIVATIONS,
    BACKENDS,
    DTYPE_POLICIES,
    MASK_STYLES,
    MIXED_BACKENDS,
    KerasOptions,
    KerasOptionsError,
    mask_style,
)
from ...model.spec import LayerSpec
from . import weights as keras_weights


# ------------------------------------------------------------------------------------------- spec -> Keras
def unsupported(spec: LayerSpec, options: KerasOptions) -> str | None:
    """Why this spec + options cannot be expressed as a Keras layer stack, or ``None``."""
    if spec.proj_size:
        return f"proj_size={spec.proj_size}: Keras's LSTM has no projection (PyTorch-only feature)"
    if options.go_backwards and spec.bidirectional:
        return (
            "go_backwards=True with bidirectional: Keras's Bidirectional needs the two layers to differ in "
            "go_backwards (its backward layer is the go_backwards layer)"
        )
    if options.go_backwards and mask_style(spec, options) != "none":
        return "go_backwards=True is run on unmasked specs (masked backward sweeps are what Bidirectional runs)"
    if options.mask in ("right", "left", "holes") and spec.length_mode != "packed":
        return f"mask={options.mask!r} needs a spec with length_mode='packed' (the lengths define the mask)"
    if not options.return_sequences and spec.num_layers > 1:
        return "return_sequences=False on a stack: layers below the top must return sequences"
    if not options.return_state:
        return "return_state=False: the path needs h_n/c_n (use return_state=True; the kernel does not change)"
    return None


def valid_positions(spec: LayerSpec, style: str) -> np.ndarray:
    """(B, T) booleans: where each sequence's valid steps sit in the Keras input, in order."""
    t = spec.seq_len
    lengths = spec.lengths or (t,) * spec.batch
    mask = np.zeros((spec.batch, t), dtype=bool)
    for b, n in enumerate(lengths):
        if style in ("none", "right"):
            mask[b, :n] = True
        elif style == "left":
            mask[b, t - n :] = True
        elif style == "holes":
            # spread n steps over T: every gap is masked; the first step stays valid
            positions = np.floor(np.arange(n) * (t / n)).astype(int)
            mask[b, positions] = True
        else:
            raise ValueError(f"unknown mask style {style!r} (valid: {', '.join(MASK_STYLES[1:])})")
    if style == "none":
        mask[:] = True
    return mask


def place(array: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Right-aligned (B, T, ...) data -> the Keras input layout given by ``positions``."""
    out = np.zeros_like(array)
    for b in range(array.shape[0]):
        n = int(positions[b].sum())
        out[b, positions[b]] = array[b, :n]
    return out


def unplace(array: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Inverse of :func:`place`: Keras layout -> right-aligned, zero past each length."""
    out = np.zeros_like(array)
    for b in range(array.shape[0]):
        n = int(positions[b].sum())
        out[b, :n] = array[b, positions[b]]
    return out


def activation(name: str) -> Any:
    """An activation of :class:`KerasOptions` as Keras takes it: a Keras name as it is; ``custom:{...}`` (an
    observed layer object, :func:`pytest_lstmperf.observation.calls._activation_name`) rebuilt from its
    serialisation; ``custom:module.function`` imported. One that cannot be rebuilt is a ``ValueError`` that
    names it."""
    if not str(name).startswith("custom:"):
        return name
    body = str(name)[len("custom:") :]
    if body.startswith("{"):
        import json

        import keras

        return keras.saving.deserialize_keras_object(json.loads(body))
    import importlib

    module, _, attribute = body.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(
            f"activation {name!r}: cannot import {attribute!r} from {module!r} in the Keras worker ({exc}); "
            "define the activation at module level of an importable module, or use a Keras activation name"
        ) from None


def layer_kwargs(spec: LayerSpec, options: KerasOptions) -> dict[str, Any]:
    """Constructor arguments of one Keras LSTM/GRU layer."""
    kwargs: dict[str, Any] = {
        "units": spec.hidden_size,
        "activation": activation(options.activation),
        "recurrent_activation": activation(options.recurrent_activation),
        "use_bias": spec.bias,
        "dropout": options.dropout,
        "recurrent_dropout": options.recurrent_dropout,
        "return_sequences": True,
        "return_state": True,
        "go_backwards": options.go_backwards,
        "unroll": options.unroll,
        "use_cudnn": options.use_cudnn,
        "implementation": options.implementation,
        "dtype": spec.dtype if options.dtype_policy == "float32" else options.dtype_policy,
    }
    if spec.cell == "gru":
        kwargs["reset_after"] = spec.reset_after
    return kwargs


#: the layers' own initial values are replaced by the canonical weights at once (``set_weights``), so on JAX and
#: TensorFlow they are made as zeros: Keras's default orthogonal recurrent initializer runs a QR decomposition
#: per layer (a compiled one on JAX), 2.9 s of the Keras-on-JAX worker's preparations in one run of the default
#: GPU suites. Not on torch: there a variable keeps the tensor of its initial value, which ``set_weights``
#: copies into (its memory layout included), and with zeros initial values what a Keras-on-torch cuDNN GRU call
#: allocates moved on the H100 (45.5 MB to 46.4 MB per call, in two runs of two). The layer measured is the
#: one a user's default-initialised Keras layer is.
_PLACEHOLDER_INIT = {"kernel_initializer": "zeros", "recurrent_initializer": "zeros", "bias_initializer": "zeros"}
_PLACEHOLDER_BACKENDS = ("jax", "tensorflow")


class KerasStack:
    """The Keras layers of a spec (stacked, optionally Bidirectional), loaded with canonical weights.

    Built inside a process whose Keras backend is fixed. ``call(x, mask, states, training)`` takes backend
    tensors and returns ``(output (B,T,D*H), [h per layer*D+dir], [c ...])`` in Keras's time order.
    """

    def __init__(self, spec: LayerSpec, options: KerasOptions, weights: dict[str, np.ndarray]) -> None:
        import keras

        reason = unsupported(spec, options)
        if reason:
            raise KerasOptionsError(reason)
        self.keras = keras
        self.spec = spec
        self.options = options
        cls = keras.layers.LSTM if spec.cell == "lstm" else keras.layers.GRU
        self.layers: list[Any] = []
        converted = keras_weights.to_keras(spec, weights)
        for layer in range(spec.num_layers):
            kwargs = layer_kwargs(spec, options)
            kwargs["return_sequences"] = options.return_sequences or layer < spec.num_layers - 1
            if keras.backend.backend() in _PLACEHOLDER_BACKENDS:
                kwargs.update(_PLACEHOLDER_INIT)
            rnn = cls(**kwargs, name=f"{spec.cell}_{layer}")
            if spec.bidirectional:
                rnn = keras.layers.Bidirectional(rnn, merge_mode="concat", name=f"bidirectional_{layer}")
            in_size = spec.layer_input_size(layer)
            rnn.build((spec.batch, spec.seq_len, in_size))
            if spec.bidirectional:
                rnn.forward_layer.set_weights([w.astype(spec.dtype) for w in converted[(layer, 0)]])
                rnn.backward_layer.set_weights([w.astype(spec.dtype) for w in converted[(layer, 1)]])
            else:
                rnn.set_weights([w.astype(spec.dtype) for w in converted[(layer, 0)]])
            self.layers.append(rnn)

    def variables(self) -> list[Any]:
        """Trainable variables in ``(layer, direction)`` order, each as ``[kernel, recurrent_kernel, bias]``."""
        out = []
        for rnn in self.layers:
            subs = [rnn.forward_layer, rnn.backward_layer] if self.spec.bidirectional else [rnn]
            for sub in subs:
                out.extend(sub.cell.trainable_variables if hasattr(sub, "cell") else sub.trainable_variables)
        return out

    def variable_groups(self) -> list[tuple[tuple[int, int], int]]:
        """``((layer, direction), count)`` for the flat :meth:`variables` list."""
        per = 3 if self.spec.bias else 2
        return [((layer, d), per) for layer in range(self.spec.num_layers) for d in range(self.spec.directions)]

    def call(self, x: Any, mask: Any, states: list[Any] | None, training: bool) -> tuple[Any, list[Any], list[Any]]:
        ops = self.keras.ops
        spec, options = self.spec, self.options
        lstm = spec.cell == "lstm"
        per_dir = 2 if lstm else 1
        hs: list[Any] = []
        cs: list[Any] = []
        inputs = x
        for layer, rnn in enumerate(self.layers):
            init = None
            if states is not None:
                init = []
                for d in range(spec.directions):
                    idx = layer * spec.directions + d
                    init.append(states[0][idx])
                    if lstm:
                        init.append(states[1][idx])
            feed, feed_mask = inputs, mask
            if options.go_backwards:
                feed = ops.flip(feed, axis=1)
                feed_mask = None if mask is None else ops.flip(mask, axis=1)
            kwargs: dict[str, Any] = {"training": training}
            if feed_mask is not None:
                kwargs["mask"] = feed_mask
            if init is not None:
                kwargs["initial_state"] = init
            result = rnn(feed, **kwargs)
            out, finals = result[0], list(result[1:])
            for d in range(spec.directions):
                hs.append(finals[d * per_dir])
                if lstm:
                    cs.append(finals[d * per_dir + 1])
            inputs = out
        return inputs, hs, cs
