"""The float64 reference every path is checked against: LSTM and GRU, forward and backward, in numpy.

The backward pass is hand-written backpropagation through time (no autograd library), so the reference
depends on nothing but numpy and can be read step by step. It computes directly on the canonical weights
of :mod:`pytest_lstmperf.model.case` (PyTorch names and layouts, gate order LSTM ``[i, f, g, o]``,
GRU ``[r, z, n]``) and covers everything a :class:`~pytest_lstmperf.model.spec.LayerSpec` can describe:

* LSTM: ``c' = f*c + i*g``, ``h' = o*tanh(c')``, or with ``proj_size`` ``h' = W_hr @ (o*tanh(c'))``
  (PyTorch's projection: ``c`` keeps ``hidden_size``, ``h`` has ``proj_size``);
* GRU, reset after the hidden matmul (``spec.reset_after``, PyTorch/cuDNN):
  ``n = tanh(W_in x + b_in + r*(W_hn h + b_hn))``; reset before (Keras's other form):
  ``n = tanh(W_in x + b_in + W_hn (r*h) + b_hn)``; both ``h' = (1-z)*n + z*h``;
* several layers (layer ``k+1`` reads layer ``k``'s output), both directions, bias on/off,
  initial states (zeros when none are given);
* lengths: ``"none"`` and ``"padded"`` run every sequence over all ``seq_len`` steps (padding included, as
  a layer does on a padded tensor); ``"packed"`` follows ``PackedSequence``: sequence ``b`` runs over its first
  ``lengths[b]`` steps only (the reverse direction starts at step ``lengths[b]-1``), outputs past the length
  are zero and ``h_n``/``c_n`` are the states at each sequence's own end.

Shapes: ``x`` is batch-first ``(B, T, I)``; ``output`` is ``(B, T, D*S)`` with the forward direction first in
the last axis; ``h_n`` is ``(L*D, B, S)`` and ``c_n`` ``(L*D, B, H)``, indexed ``layer*D + direction``.
The backward pass is the gradient of ``sum(output*grad_output) + sum(h_n*grad_h_n) + sum(c_n*grad_c_n)``.
Dropout is not modelled.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .case import Case, make_case, param_names, param_shapes
from .spec import LayerSpec

__all__ = ["ReferenceResult", "backward", "forward", "run_reference"]


@dataclass(frozen=True)
class ReferenceResult:
    """Forward results and gradients of one case, float64, read-only.

    ``grads`` holds ``"x"`` (batch-first ``(B, T, I)``), ``"h0"`` and ``"c0"`` when ``spec.initial_state``
    (``"c0"`` for LSTM only) and every name of :func:`~pytest_lstmperf.model.case.param_names`.
    """

    output: np.ndarray  # (B, T, D*S)
    h_n: np.ndarray  # (L*D, B, S)
    c_n: np.ndarray | None  # (L*D, B, H) for LSTM, None for GRU
    grads: dict[str, np.ndarray]


# --------------------------------------------------------------------------------------- parameters


@dataclass(frozen=True)
class _Params:
    """The float64 weights of one layer and direction; the biases are zeros when the spec has none."""

    w_ih: np.ndarray  # (G*H, I_layer)
    w_hh: np.ndarray  # (G*H, S)
    b_ih: np.ndarray  # (G*H,)
    b_hh: np.ndarray  # (G*H,)
    w_hr: np.ndarray | None  # (P, H) when projecting


class _Grads:
    """Gradient accumulators matching :class:`_Params` (each step adds its share)."""

    def __init__(self, p: _Params) -> None:
        self.w_ih = np.zeros_like(p.w_ih)
        self.w_hh = np.zeros_like(p.w_hh)
        self.b_ih = np.zeros_like(p.b_ih)
        self.b_hh = np.zeros_like(p.b_hh)
        self.w_hr = None if p.w_hr is None else np.zeros_like(p.w_hr)


def _suffix(direction: int) -> str:
    return "_reverse" if direction else ""


def _layer_params(spec: LayerSpec, weights: Mapping[str, np.ndarray], layer: int, direction: int) -> _Params:
    sfx = f"_l{layer}{_suffix(direction)}"
    rows = spec.gates * spec.hidden_size
    if spec.bias:
        b_ih, b_hh = weights["bias_ih" + sfx], weights["bias_hh" + sfx]
    else:
        b_ih = b_hh = np.zeros(rows)
    w_hr = weights["weight_hr" + sfx] if spec.proj_size else None
    return _Params(weights["weight_ih" + sfx], weights["weight_hh" + sfx], b_ih, b_hh, w_hr)


def _store_grads(spec: LayerSpec, layer: int, direction: int, g: _Grads, out: dict[str, np.ndarray]) -> None:
    sfx = f"_l{layer}{_suffix(direction)}"
    out["weight_ih" + sfx] = g.w_ih
    out["weight_hh" + sfx] = g.w_hh
    if spec.bias:
        out["bias_ih" + sfx] = g.b_ih
        out["bias_hh" + sfx] = g.b_hh
    if spec.proj_size:
        assert g.w_hr is not None
        out["weight_hr" + sfx] = g.w_hr


def _sigmoid(a: np.ndarray) -> np.ndarray:
    # tanh form: accurate and free of overflow warnings for large |a|
    return 0.5 * (1.0 + np.tanh(0.5 * a))


# --------------------------------------------------------------------------------------- LSTM cell


class _LSTMCache(NamedTuple):
    x: np.ndarray  # (B, I) step input
    h: np.ndarray  # (B, S) previous state
    c: np.ndarray  # (B, H) previous cell
    i: np.ndarray  # (B, H) gate activations
    f: np.ndarray
    g: np.ndarray
    o: np.ndarray
    tanh_c: np.ndarray  # (B, H) tanh of the new cell
    m: np.ndarray  # (B, H) o*tanh(c'), the unprojected output


def _lstm_step_forward(
    p: _Params, x: np.ndarray, h: np.ndarray, c: np.ndarray
) -> tuple[np.ndarray, np.ndarray, _LSTMCache]:
    """One LSTM step on a batch: ``(x (B,I), h (B,S), c (B,H)) -> (h' (B,S), c' (B,H), cache)``."""
    a = x @ p.w_ih.T + p.b_ih + h @ p.w_hh.T + p.b_hh
    a_i, a_f, a_g, a_o = np.split(a, 4, axis=1)
    i, f, g, o = _sigmoid(a_i), _sigmoid(a_f), np.tanh(a_g), _sigmoid(a_o)
    c_new = f * c + i * g
    tanh_c = np.tanh(c_new)
    m = o * tanh_c
    h_new = m @ p.w_hr.T if p.w_hr is not None else m
    return h_new, c_new, _LSTMCache(x, h, c, i, f, g, o, tanh_c, m)


def _lstm_step_backward(
    p: _Params, cache: _LSTMCache, dh_new: np.ndarray, dc_new: np.ndarray, grads: _Grads
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Backward of :func:`_lstm_step_forward`.

    Takes the gradients of ``h'`` and ``c'``, adds the step's parameter gradients to ``grads`` and returns
    the gradients of ``(x, h, c)``. Linear in ``(dh_new, dc_new)``: zero rows in give zero rows out.
    """
    if p.w_hr is not None:
        assert grads.w_hr is not None
        grads.w_hr += dh_new.T @ cache.m
        dm = dh_new @ p.w_hr
    else:
        dm = dh_new
    do = dm * cache.tanh_c
    dc = dc_new + dm * cache.o * (1.0 - cache.tanh_c**2)
    di, df, dg = dc * cache.g, dc * cache.c, dc * cache.i
    da = np.concatenate(
        [
            di * cache.i * (1.0 - cache.i),
            df * cache.f * (1.0 - cache.f),
            dg * (1.0 - cache.g**2),
            do * cache.o * (1.0 - cache.o),
        ],
        axis=1,
    )
    grads.w_ih += da.T @ cache.x
    grads.w_hh += da.T @ cache.h
    db = da.sum(axis=0)
    grads.b_ih += db
    grads.b_hh += db
    return da @ p.w_ih, da @ p.w_hh, dc * cache.f


# --------------------------------------------------------------------------------------- GRU cell


class _GRUCache(NamedTuple):
    x: np.ndarray  # (B, I) step input
    h: np.ndarray  # (B, H) previous state
    r: np.ndarray  # (B, H) gate activations
    z: np.ndarray
    n: np.ndarray
    hn: np.ndarray  # reset-after: W_hn h + b_hn; reset-before: r*h


def _gru_step_forward(p: _Params, x: np.ndarray, h: np.ndarray, reset_after: bool) -> tuple[np.ndarray, _GRUCache]:
    """One GRU step on a batch: ``(x (B,I), h (B,H)) -> (h' (B,H), cache)``; ``h' = (1-z)*n + z*h``."""
    hidden = h.shape[1]
    gi = x @ p.w_ih.T + p.b_ih
    gi_r, gi_z, gi_n = np.split(gi, 3, axis=1)
    w_hrz, w_hn = p.w_hh[: 2 * hidden], p.w_hh[2 * hidden :]
    b_hrz, b_hn = p.b_hh[: 2 * hidden], p.b_hh[2 * hidden :]
    gh_r, gh_z = np.split(h @ w_hrz.T + b_hrz, 2, axis=1)
    r = _sigmoid(gi_r + gh_r)
    z = _sigmoid(gi_z + gh_z)
    if reset_after:
        hn = h @ w_hn.T + b_hn
        n = np.tanh(gi_n + r * hn)
    else:
        hn = r * h
        n = np.tanh(gi_n + hn @ w_hn.T + b_hn)
    h_new = (1.0 - z) * n + z * h
    return h_new, _GRUCache(x, h, r, z, n, hn)


def _gru_step_backward(
    p: _Params, cache: _GRUCache, dh_new: np.ndarray, grads: _Grads, reset_after: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Backward of :func:`_gru_step_forward`.

    Takes the gradient of ``h'``, adds the step's parameter gradients to ``grads`` and returns the gradients
    of ``(x, h)``. Linear in ``dh_new``: zero rows in give zero rows out.
    """
    hidden = cache.h.shape[1]
    w_hrz, w_hn = p.w_hh[: 2 * hidden], p.w_hh[2 * hidden :]
    r, z, n, hn = cache.r, cache.z, cache.n, cache.hn
    dn = dh_new * (1.0 - z)
    dz = dh_new * (cache.h - n)
    dh = dh_new * z
    da_n = dn * (1.0 - n**2)  # gradient of n's pre-activation
    if reset_after:
        dr = da_n * hn
        dgh_n = da_n * r  # gradient of W_hn h + b_hn
        grads.w_hh[2 * hidden :] += dgh_n.T @ cache.h
        dh += dgh_n @ w_hn
    else:
        drh = da_n @ w_hn  # gradient of r*h
        dr = drh * cache.h
        dgh_n = da_n
        grads.w_hh[2 * hidden :] += da_n.T @ hn
        dh += drh * r
    da_r = dr * r * (1.0 - r)
    da_z = dz * z * (1.0 - z)
    da_rz = np.concatenate([da_r, da_z], axis=1)
    da_i = np.concatenate([da_rz, da_n], axis=1)
    grads.w_ih += da_i.T @ cache.x
    grads.b_ih += da_i.sum(axis=0)
    grads.w_hh[: 2 * hidden] += da_rz.T @ cache.h
    grads.b_hh += np.concatenate([da_rz, dgh_n], axis=1).sum(axis=0)
    dh += da_rz @ w_hrz
    return da_i @ p.w_ih, dh


# --------------------------------------------------------------------------------------- one direction


def _step_mask(spec: LayerSpec) -> np.ndarray:
    """(B, T) booleans: True where the layer runs a step (always, except past a packed sequence's end)."""
    lengths = np.asarray(spec.effective_lengths)
    return np.arange(spec.seq_len)[None, :] < lengths[:, None]


def _time_order(seq_len: int, reverse: bool) -> range:
    return range(seq_len - 1, -1, -1) if reverse else range(seq_len)


@dataclass
class _DirectionTape:
    """What the backward pass of one layer and direction needs from its forward pass."""

    params: _Params
    reverse: bool
    caches: list[_LSTMCache | _GRUCache]  # in processing order


def _direction_forward(
    spec: LayerSpec, p: _Params, x: np.ndarray, h0: np.ndarray, c0: np.ndarray | None, mask: np.ndarray, reverse: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, _DirectionTape]:
    """Run one direction of one layer over ``x (B,T,I)``: returns ``(output (B,T,S), h_n, c_n, tape)``.

    Where ``mask`` is False the step is skipped: the state is carried unchanged and the output is zero.
    """
    batch, seq_len, _ = x.shape
    h, c = h0, c0
    out = np.zeros((batch, seq_len, h0.shape[1]))
    caches: list[_LSTMCache | _GRUCache] = []
    for t in _time_order(seq_len, reverse):
        valid = mask[:, t, None]
        cache: _LSTMCache | _GRUCache
        if spec.cell == "lstm":
            assert c is not None
            h_new, c_new, cache = _lstm_step_forward(p, x[:, t], h, c)
            c = np.where(valid, c_new, c)
        else:
            h_new, cache = _gru_step_forward(p, x[:, t], h, spec.reset_after)
        h = np.where(valid, h_new, h)
        out[:, t] = np.where(valid, h_new, 0.0)
        caches.append(cache)
    return out, h, c, _DirectionTape(p, reverse, caches)


def _direction_backward(
    spec: LayerSpec,
    tape: _DirectionTape,
    mask: np.ndarray,
    d_out: np.ndarray,
    dh_n: np.ndarray,
    dc_n: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, _Grads]:
    """Backward of :func:`_direction_forward`: returns the gradients of ``(x, h0, c0)`` and the parameters.

    ``d_out (B,T,S)`` is the gradient of this direction's output, ``dh_n``/``dc_n`` of its final states.
    """
    p = tape.params
    grads = _Grads(p)
    batch, seq_len, _ = d_out.shape
    dx = np.zeros((batch, seq_len, p.w_ih.shape[1]))
    dh, dc = dh_n, dc_n
    order = list(_time_order(seq_len, tape.reverse))
    for t, cache in zip(reversed(order), reversed(tape.caches), strict=True):
        valid = mask[:, t, None]
        # a run step feeds h' to both the carried state and the output; a skipped one passes dh straight through
        dh_step = np.where(valid, dh + d_out[:, t], 0.0)
        if spec.cell == "lstm":
            assert dc is not None and isinstance(cache, _LSTMCache)
            dx[:, t], dh_prev, dc_prev = _lstm_step_backward(p, cache, dh_step, np.where(valid, dc, 0.0), grads)
            dc = np.where(valid, dc_prev, dc)
        else:
            assert isinstance(cache, _GRUCache)
            dx[:, t], dh_prev = _gru_step_backward(p, cache, dh_step, grads, spec.reset_after)
        dh = np.where(valid, dh_prev, dh)
    return dx, dh, dc, grads


# --------------------------------------------------------------------------------------- whole layer


def _f64(array: object) -> np.ndarray:
    return np.asarray(array, dtype=np.float64)


def _check_shape(name: str, array: np.ndarray, shape: tuple[int, ...]) -> None:
    if array.shape != shape:
        raise ValueError(f"{name} has shape {array.shape}, the spec needs {shape}")


def _weights64(spec: LayerSpec, weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``weights`` in float64, checked against the spec: every parameter there, none unknown, each of its shape."""
    expected = param_shapes(spec)
    missing = sorted(set(expected) - set(weights))
    unknown = sorted(set(weights) - set(expected))
    if missing or unknown:
        raise ValueError(f"weights do not match the spec: missing {missing}, unknown {unknown}")
    w = {name: _f64(weights[name]) for name in param_names(spec)}
    for name, shape in expected.items():
        _check_shape(name, w[name], shape)
    return w


def _prepare(
    spec: LayerSpec, weights: Mapping[str, np.ndarray], x: object, h0: object | None, c0: object | None
) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray | None]:
    """Validate and convert the inputs to float64; missing initial states become zeros."""
    w = _weights64(spec, weights)
    x = _f64(x)
    _check_shape("x", x, (spec.batch, spec.seq_len, spec.input_size))
    states = spec.num_layers * spec.directions
    h0 = np.zeros((states, spec.batch, spec.state_size)) if h0 is None else _f64(h0)
    _check_shape("h0", h0, (states, spec.batch, spec.state_size))
    if spec.cell == "lstm":
        c0 = np.zeros((states, spec.batch, spec.hidden_size)) if c0 is None else _f64(c0)
        _check_shape("c0", c0, (states, spec.batch, spec.hidden_size))
    elif c0 is not None:
        raise ValueError("c0 given for a GRU")
    return w, x, h0, c0


def _forward_taped(
    spec: LayerSpec, w: Mapping[str, np.ndarray], x: np.ndarray, h0: np.ndarray, c0: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, list[list[_DirectionTape]]]:
    """Forward pass on validated float64 inputs, keeping one tape per layer and direction."""
    mask = _step_mask(spec)
    h_n = np.zeros_like(h0)
    c_n = None if c0 is None else np.zeros_like(c0)
    tapes: list[list[_DirectionTape]] = []
    layer_input = x
    for layer in range(spec.num_layers):
        outputs, layer_tapes = [], []
        for direction in range(spec.directions):
            idx = layer * spec.directions + direction
            p = _layer_params(spec, w, layer, direction)
            c_init = None if c0 is None else c0[idx]
            out, h_last, c_last, tape = _direction_forward(
                spec, p, layer_input, h0[idx], c_init, mask, reverse=bool(direction)
            )
            h_n[idx] = h_last
            if c_n is not None:
                c_n[idx] = c_last
            outputs.append(out)
            layer_tapes.append(tape)
        tapes.append(layer_tapes)
        layer_input = np.concatenate(outputs, axis=2)
    return layer_input, h_n, c_n, tapes


def _backward_taped(
    spec: LayerSpec,
    tapes: list[list[_DirectionTape]],
    grad_output: np.ndarray,
    grad_h_n: np.ndarray,
    grad_c_n: np.ndarray | None,
) -> dict[str, np.ndarray]:
    """Backward pass through the tapes of :func:`_forward_taped`; returns every gradient, ``h0``/``c0`` included."""
    mask = _step_mask(spec)
    size = spec.state_size
    dh0 = np.zeros_like(grad_h_n)
    dc0 = None if grad_c_n is None else np.zeros_like(grad_c_n)
    param_grads: dict[str, np.ndarray] = {}
    # outputs past a packed sequence's end are constant zeros: their gradient goes nowhere
    d_layer_out = grad_output * mask[:, :, None]
    for layer in reversed(range(spec.num_layers)):
        d_layer_in = np.zeros((spec.batch, spec.seq_len, spec.layer_input_size(layer)))
        for direction, tape in enumerate(tapes[layer]):
            idx = layer * spec.directions + direction
            d_out = d_layer_out[:, :, direction * size : (direction + 1) * size]
            dc_n = None if grad_c_n is None else grad_c_n[idx]
            dx, dh, dc, grads = _direction_backward(spec, tape, mask, d_out, grad_h_n[idx], dc_n)
            d_layer_in += dx
            dh0[idx] = dh
            if dc0 is not None:
                dc0[idx] = dc
            _store_grads(spec, layer, direction, grads, param_grads)
        d_layer_out = d_layer_in
    result = {"x": d_layer_out, "h0": dh0}
    if dc0 is not None:
        result["c0"] = dc0
    result.update((name, param_grads[name]) for name in param_names(spec))
    return result


# --------------------------------------------------------------------------------------- public API


def forward(
    spec: LayerSpec,
    weights: Mapping[str, np.ndarray],
    x: np.ndarray,
    h0: np.ndarray | None = None,
    c0: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Run the layer described by ``spec`` in float64.

    ``weights`` are the canonical arrays (any float dtype), ``x`` is ``(B, T, I)`` batch-first, ``h0``
    ``(L*D, B, S)`` and ``c0`` ``(L*D, B, H)`` default to zeros (``c0`` must be None for a GRU).
    Returns ``(output (B, T, D*S), h_n (L*D, B, S), c_n (L*D, B, H) or None for a GRU)``.
    Raises ``ValueError`` when a shape or weight name does not match the spec.
    """
    w, x64, h0_64, c0_64 = _prepare(spec, weights, x, h0, c0)
    output, h_n, c_n, _ = _forward_taped(spec, w, x64, h0_64, c0_64)
    return output, h_n, c_n


def backward(
    spec: LayerSpec,
    weights: Mapping[str, np.ndarray],
    x: np.ndarray,
    h0: np.ndarray | None,
    c0: np.ndarray | None,
    grad_output: np.ndarray,
    grad_h_n: np.ndarray,
    grad_c_n: np.ndarray | None,
) -> dict[str, np.ndarray]:
    """Gradients of ``sum(output*grad_output) + sum(h_n*grad_h_n) + sum(c_n*grad_c_n)``.

    Inputs as in :func:`forward`; ``grad_output`` is ``(B, T, D*S)``, ``grad_h_n`` ``(L*D, B, S)``,
    ``grad_c_n`` ``(L*D, B, H)`` (LSTM; None means zeros, and it must be None for a GRU). ``grad_output``
    past a packed sequence's end is ignored (the output there is a constant zero).
    Returns ``"x"`` ``(B, T, I)``, ``"h0"`` and ``"c0"`` (only when ``spec.initial_state``; ``"c0"`` for LSTM
    only) and every canonical parameter name, in :func:`~pytest_lstmperf.model.case.param_names` order.
    """
    w, x64, h0_64, c0_64 = _prepare(spec, weights, x, h0, c0)
    _, _, _, tapes = _forward_taped(spec, w, x64, h0_64, c0_64)
    return _gradients(spec, tapes, grad_output, grad_h_n, grad_c_n)


def _gradients(
    spec: LayerSpec,
    tapes: list[list[_DirectionTape]],
    grad_output: np.ndarray,
    grad_h_n: np.ndarray,
    grad_c_n: np.ndarray | None,
) -> dict[str, np.ndarray]:
    """Validate the upstream gradients, run :func:`_backward_taped` and keep the keys :func:`backward` returns."""
    states = spec.num_layers * spec.directions
    g_out = _f64(grad_output)
    _check_shape("grad_output", g_out, (spec.batch, spec.seq_len, spec.output_size))
    g_h = _f64(grad_h_n)
    _check_shape("grad_h_n", g_h, (states, spec.batch, spec.state_size))
    g_c = None
    if spec.cell == "lstm":
        g_c = np.zeros((states, spec.batch, spec.hidden_size)) if grad_c_n is None else _f64(grad_c_n)
        _check_shape("grad_c_n", g_c, (states, spec.batch, spec.hidden_size))
    elif grad_c_n is not None:
        raise ValueError("grad_c_n given for a GRU")
    grads = _backward_taped(spec, tapes, g_out, g_h, g_c)
    if not spec.initial_state:
        grads.pop("h0")
        grads.pop("c0", None)
    return grads


def _compute(case: Case) -> ReferenceResult:
    spec = case.spec
    w, x, h0, c0 = _prepare(spec, case.weights, case.x, case.h0, case.c0)
    output, h_n, c_n, tapes = _forward_taped(spec, w, x, h0, c0)
    grads = _gradients(spec, tapes, case.grad_output, case.grad_h_n, case.grad_c_n)
    for array in (output, h_n, c_n, *grads.values()):
        if array is not None:
            array.setflags(write=False)
    return ReferenceResult(output, h_n, c_n, grads)


def forward_reference(
    spec: LayerSpec, weights: Mapping[str, np.ndarray], x: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Forward only, float64, zero initial states: ``(output (B, T, D*S), h_n, c_n)`` for batch-first ``x``."""
    w, x64, h0, c0 = _prepare(spec, weights, x, None, None)
    output, h_n, c_n, _ = _forward_taped(spec, w, x64, h0, c0)
    return output, h_n, c_n


def forward_sequences(
    spec: LayerSpec, weights: Mapping[str, np.ndarray], sequences: list[np.ndarray]
) -> list[np.ndarray]:
    """Forward only, float64, zero initial states, unidirectional ``spec``: the output ``(T_b, S)`` of each
    sequence ``(T_b, I)`` of a dataset, each run over its own length alone (``spec``'s batch and sequence length
    are not used). The same steps as :func:`forward_reference` on one batch per length, in one loop over
    time: at step ``t`` the sequences longer than ``t`` (a prefix, once sorted by length) take the step. One
    batch per distinct length cost a Python loop over time for each of dozens of lengths (3 s of a GPU run's
    workload checks)."""
    if spec.bidirectional:
        raise ValueError("forward_sequences runs unidirectional layers (a backward sweep starts at each end)")
    weights64 = _weights64(spec, weights)
    lengths = np.array([len(seq) for seq in sequences], dtype=np.int64)
    order = np.argsort(-lengths, kind="stable")
    longest = int(lengths.max()) if len(lengths) else 0
    layer_input = np.zeros((len(sequences), longest, spec.input_size))
    for row, i in enumerate(order):
        layer_input[row, : lengths[i]] = _f64(sequences[i])
    active = [int(np.sum(lengths > t)) for t in range(longest)]  # rows taking step t (sorted: a prefix)
    for layer in range(spec.num_layers):
        p = _layer_params(spec, weights64, layer, 0)
        h = np.zeros((len(sequences), spec.state_size))
        c = np.zeros((len(sequences), spec.hidden_size)) if spec.cell == "lstm" else None
        out = np.zeros((len(sequences), longest, spec.state_size))
        for t in range(longest):
            n = active[t]
            if spec.cell == "lstm":
                assert c is not None
                h_new, c_new, _ = _lstm_step_forward(p, layer_input[:n, t], h[:n], c[:n])
                c[:n] = c_new
            else:
                h_new, _ = _gru_step_forward(p, layer_input[:n, t], h[:n], spec.reset_after)
            h[:n] = h_new
            out[:n, t] = h_new
        layer_input = out
    outputs: list[np.ndarray] = [np.zeros(0)] * len(sequences)
    for row, i in enumerate(order):
        outputs[i] = layer_input[row, : lengths[i]]
    return outputs


@functools.lru_cache(maxsize=64)
def _cached(spec: LayerSpec, seed: int) -> ReferenceResult:
    return _compute(make_case(spec, seed))


def _same_data(a: Case, b: Case) -> bool:
    if a is b:
        return True
    if a.weights.keys() != b.weights.keys():
        return False
    pairs: list[tuple[np.ndarray | None, np.ndarray | None]] = [(a.weights[k], b.weights[k]) for k in a.weights]
    pairs += [(a.x, b.x), (a.h0, b.h0), (a.c0, b.c0), (a.grad_output, b.grad_output)]
    pairs += [(a.grad_h_n, b.grad_h_n), (a.grad_c_n, b.grad_c_n)]
    return all(
        (u is None and v is None) or (u is not None and v is not None and np.array_equal(u, v)) for u, v in pairs
    )


def run_reference(case: Case) -> ReferenceResult:
    """Forward and backward of ``case`` in float64 (arrays read-only).

    Results are cached per ``(spec, seed)`` for cases built by :func:`~pytest_lstmperf.model.case.make_case`; a case
    whose data differs from ``make_case(spec, seed)`` is computed afresh and not cached.
    """
    if _same_data(case, make_case(case.spec, case.seed)):
        return _cached(case.spec, case.seed)
    return _compute(case)
