"""Canonical (PyTorch-layout) weights <-> Keras 3 LSTM/GRU weights, and Keras gradients back to canonical.

Keras keeps one ``(kernel, recurrent_kernel[, bias])`` triple per layer and direction:

* LSTM: ``kernel (I, 4H)``, ``recurrent_kernel (H, 4H)``, ``bias (4H,)``, gate order ``[i, f, c, o]`` as in
  PyTorch. Keras has a single bias: ``bias = b_ih + b_hh``; back to canonical ``b_ih = bias``, ``b_hh = 0``.
* GRU ``reset_after=True``: gate order ``[z, r, h]`` against PyTorch's ``[r, z, n]``; ``bias (2, 3H)`` holds
  the input bias (row 0) and the recurrent bias (row 1), so the conversion is a pure permutation.
* GRU ``reset_after=False`` (Keras only): ``bias (3H,)`` is added on the input side. The canonical form of the
  float64 reference, ``n = tanh(W_in x + b_in + W_hn (r*h) + b_hn)``, adds ``b_hn`` outside the reset gate,
  so ``bias = b_ih + b_hh`` is exact math; back to canonical ``b_ih = bias``, ``b_hh = 0``.

Round trips: Keras -> canonical -> Keras is the identity for every layout. Canonical -> Keras -> canonical is
the identity for the weights and for split biases whose ``b_hh`` is zero (the form :func:`from_keras`
returns); otherwise it preserves ``b_ih + b_hh``, which is all a single-bias layer can hold. Sums are formed in
float64; a float32 layer then rounds that sum once (relative error <= 2**-24, far inside every tolerance).

Gradients: the gradient of a Keras summed bias is the gradient of both ``b_ih`` and ``b_hh``
(:func:`grads_to_canonical`). Pure numpy; imports no framework.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from ...model.spec import LayerSpec

#: Keras GRU gate blocks [z, r, h] taken from canonical [r, z, n] (the permutation is its own inverse)
GRU_GATE_PERM = (1, 0, 2)


class KerasLayoutError(ValueError):
    """A spec or a weight set that Keras's LSTM/GRU cannot hold (e.g. ``proj_size > 0``)."""


def check_expressible(spec: LayerSpec) -> str | None:
    """Why Keras's LSTM/GRU cannot hold the weights of ``spec``, or ``None``."""
    if spec.proj_size:
        return f"proj_size={spec.proj_size}: Keras's LSTM has no projection (PyTorch-only feature)"
    return None


def _suffix(layer: int, direction: int) -> str:
    return f"_l{layer}" + ("_reverse" if direction else "")


def _gates(array: np.ndarray, gates: int, axis: int) -> list[np.ndarray]:
    return np.split(array, gates, axis=axis)


def _reorder(array: np.ndarray, spec: LayerSpec, axis: int) -> np.ndarray:
    """Canonical gate order -> Keras gate order along ``axis`` (and back: the permutation is an involution)."""
    if spec.cell == "lstm":
        return array
    blocks = _gates(array, 3, axis)
    return np.concatenate([blocks[i] for i in GRU_GATE_PERM], axis=axis)


def layer_to_keras(spec: LayerSpec, weights: Mapping[str, np.ndarray], layer: int, direction: int) -> list[np.ndarray]:
    """The ``layer.get_weights()`` list of one Keras layer (one direction of one stacked layer)."""
    reason = check_expressible(spec)
    if reason:
        raise KerasLayoutError(reason)
    sfx = _suffix(layer, direction)
    w_ih = np.asarray(weights["weight_ih" + sfx], dtype=np.float64)
    w_hh = np.asarray(weights["weight_hh" + sfx], dtype=np.float64)
    out = [_reorder(w_ih.T, spec, axis=1), _reorder(w_hh.T, spec, axis=1)]
    if spec.bias:
        b_ih = np.asarray(weights["bias_ih" + sfx], dtype=np.float64)
        b_hh = np.asarray(weights["bias_hh" + sfx], dtype=np.float64)
        if spec.cell == "gru" and spec.reset_after:
            out.append(np.stack([_reorder(b_ih, spec, 0), _reorder(b_hh, spec, 0)]))
        else:
            out.append(_reorder(b_ih + b_hh, spec, 0))
    return [np.ascontiguousarray(a) for a in out]


def to_keras(spec: LayerSpec, weights: Mapping[str, np.ndarray]) -> dict[tuple[int, int], list[np.ndarray]]:
    """Every Keras layer's weight list, keyed by ``(layer, direction)`` (direction 1 is the backward layer)."""
    return {
        (layer, direction): layer_to_keras(spec, weights, layer, direction)
        for layer in range(spec.num_layers)
        for direction in range(spec.directions)
    }


def expected_keras_shapes(spec: LayerSpec, layer: int) -> list[tuple[int, ...]]:
    g, h = spec.gates * spec.hidden_size, spec.hidden_size
    shapes: list[tuple[int, ...]] = [(spec.layer_input_size(layer), g), (h, g)]
    if spec.bias:
        shapes.append((2, g) if spec.cell == "gru" and spec.reset_after else (g,))
    return shapes


def _check_layer(spec: LayerSpec, key: tuple[int, int], arrays: list[np.ndarray]) -> None:
    expected = expected_keras_shapes(spec, key[0])
    got = [tuple(np.shape(a)) for a in arrays]
    if got != expected:
        raise KerasLayoutError(f"Keras weights of layer {key}: shapes {got}, expected {expected} for {spec.short()}")


def _to_canonical(
    spec: LayerSpec,
    lists: Mapping[tuple[int, int], list[np.ndarray]],
    single_bias_hh: Callable[[np.ndarray], np.ndarray],
) -> dict[str, np.ndarray]:
    """Keras per-layer lists (kernel, recurrent kernel, bias) -> canonical arrays; where Keras has one bias,
    ``bias_ih`` gets it and ``bias_hh`` gets ``single_bias_hh(bias)``."""
    out: dict[str, np.ndarray] = {}
    for layer in range(spec.num_layers):
        for direction in range(spec.directions):
            arrays = [np.asarray(a, dtype=np.float64) for a in lists[(layer, direction)]]
            _check_layer(spec, (layer, direction), arrays)
            sfx = _suffix(layer, direction)
            out["weight_ih" + sfx] = np.ascontiguousarray(_reorder(arrays[0], spec, axis=1).T)
            out["weight_hh" + sfx] = np.ascontiguousarray(_reorder(arrays[1], spec, axis=1).T)
            if spec.bias:
                bias = arrays[2]
                if bias.ndim == 2:
                    out["bias_ih" + sfx] = _reorder(bias[0], spec, 0)
                    out["bias_hh" + sfx] = _reorder(bias[1], spec, 0)
                else:
                    out["bias_ih" + sfx] = _reorder(bias, spec, 0)
                    out["bias_hh" + sfx] = single_bias_hh(bias)
    return out


def from_keras(spec: LayerSpec, keras: Mapping[tuple[int, int], list[np.ndarray]]) -> dict[str, np.ndarray]:
    """Canonical weights from Keras weight lists; single Keras biases land in ``b_ih`` with ``b_hh = 0``."""
    reason = check_expressible(spec)
    if reason:
        raise KerasLayoutError(reason)
    return _to_canonical(spec, keras, lambda bias: np.zeros_like(bias))


def grads_to_canonical(
    spec: LayerSpec, keras_grads: Mapping[tuple[int, int], list[np.ndarray]]
) -> dict[str, np.ndarray]:
    """Gradients of Keras weights -> gradients of the canonical parameters.

    A single Keras bias feeds both canonical biases with weight one, so each receives its full gradient.
    """
    return _to_canonical(spec, keras_grads, lambda bias: _reorder(bias, spec, 0).copy())


def canonical_normal_form(spec: LayerSpec, weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What a Keras layer can hold of ``weights``: single-bias layouts get ``b_ih + b_hh`` and ``b_hh = 0``."""
    return from_keras(spec, to_keras(spec, weights))
