"""Concrete data for a spec: canonical float64 weights, input, initial states and upstream gradients.

Canonical weights use PyTorch's parameter names and layouts (gate order LSTM [i, f, g, o], GRU [r, z, n]):
``weight_ih_l{k}{sfx}`` (G*H, I_k), ``weight_hh_l{k}{sfx}`` (G*H, S), ``bias_ih_l{k}{sfx}`` (G*H,),
``bias_hh_l{k}{sfx}`` (G*H,), ``weight_hr_l{k}{sfx}`` (P, H) with ``sfx`` ``""`` or ``"_reverse"``,
S the state size (P when projecting, else H). Every path converts from these and back, and the
reference computes on them directly.

All arrays are float64 but hold values representable in the spec's dtype, so that the reference
sees exactly the numbers a path stores; what a path loses beyond that is its own error.
The input is always batch-first here ``(B, T, I)``; positions past a sequence's length are zero.
The backward pass of every path is the gradient of
``sum(output * grad_output) + sum(h_n * grad_h_n) + sum(c_n * grad_c_n)``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from .spec import LayerSpec


def param_names(spec: LayerSpec) -> list[str]:
    """Canonical parameter names in PyTorch's registration order."""
    names: list[str] = []
    for layer in range(spec.num_layers):
        for direction in range(spec.directions):
            sfx = "_reverse" if direction else ""
            names += [f"weight_ih_l{layer}{sfx}", f"weight_hh_l{layer}{sfx}"]
            if spec.bias:
                names += [f"bias_ih_l{layer}{sfx}", f"bias_hh_l{layer}{sfx}"]
            if spec.proj_size:
                names.append(f"weight_hr_l{layer}{sfx}")
    return names


def param_shapes(spec: LayerSpec) -> dict[str, tuple[int, ...]]:
    g, h, s = spec.gates * spec.hidden_size, spec.hidden_size, spec.state_size
    shapes: dict[str, tuple[int, ...]] = {}
    for name in param_names(spec):
        layer = int(name.split("_l")[1].split("_")[0])
        kind = name.split("_l")[0]
        shapes[name] = {
            "weight_ih": (g, spec.layer_input_size(layer)),
            "weight_hh": (g, s),
            "bias_ih": (g,),
            "bias_hh": (g,),
            "weight_hr": (spec.proj_size, h),
        }[kind]
    return shapes


def round_to_dtype(array: np.ndarray, dtype: str) -> np.ndarray:
    """Round float64 values to the nearest value of ``dtype`` (kept as float64)."""
    if dtype == "float64":
        return array
    if dtype == "float32":
        return array.astype(np.float32).astype(np.float64)
    if dtype == "float16":
        return array.astype(np.float16).astype(np.float64)
    if dtype == "bfloat16":
        # round-to-nearest-even on the top 16 bits of the float32 pattern
        bits = array.astype(np.float32).view(np.uint32).astype(np.uint64)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
        return rounded.astype(np.uint32).view(np.float32).astype(np.float64)
    raise ValueError(f"unknown dtype {dtype!r}")


@dataclass(frozen=True, eq=False)
class Case:
    """A spec with its data. Build with :func:`make_case`."""

    spec: LayerSpec
    seed: int
    weights: dict[str, np.ndarray]
    x: np.ndarray
    h0: np.ndarray | None
    c0: np.ndarray | None
    grad_output: np.ndarray
    grad_h_n: np.ndarray
    grad_c_n: np.ndarray | None
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def valid_mask(self) -> np.ndarray:
        """(B, T) booleans: True where a time step lies within its sequence's length."""
        lengths = np.asarray(self.spec.lengths or (self.spec.seq_len,) * self.spec.batch)
        return np.arange(self.spec.seq_len)[None, :] < lengths[:, None]


def _uniform(rng: np.random.Generator, shape: tuple[int, ...], bound: float) -> np.ndarray:
    return rng.uniform(-bound, bound, size=shape)


@functools.lru_cache(maxsize=64)
def make_case(spec: LayerSpec, seed: int = 0) -> Case:
    """Deterministic data for ``spec``: PyTorch's default init range U(-1/sqrt(H), 1/sqrt(H)), N(0,1) input."""
    rng = np.random.default_rng([seed, 0x157])
    dtype = spec.dtype
    bound = 1.0 / np.sqrt(spec.hidden_size)
    weights = {name: round_to_dtype(_uniform(rng, shape, bound), dtype) for name, shape in param_shapes(spec).items()}
    b, t = spec.batch, spec.seq_len
    x = round_to_dtype(rng.standard_normal((b, t, spec.input_size)), dtype)
    states = spec.num_layers * spec.directions
    h0 = c0 = None
    if spec.initial_state:
        h0 = round_to_dtype(0.5 * rng.standard_normal((states, b, spec.state_size)), dtype)
        if spec.cell == "lstm":
            c0 = round_to_dtype(0.5 * rng.standard_normal((states, b, spec.hidden_size)), dtype)
    grad_output = rng.standard_normal((b, t, spec.output_size))
    grad_h_n = rng.standard_normal((states, b, spec.state_size))
    grad_c_n = rng.standard_normal((states, b, spec.hidden_size)) if spec.cell == "lstm" else None
    case = Case(spec, seed, weights, x, h0, c0, grad_output, grad_h_n, grad_c_n)
    if spec.length_mode != "none":
        mask = case.valid_mask
        x[~mask] = 0.0
        if spec.length_mode == "packed":
            grad_output[~mask] = 0.0
    for array in (x, grad_output, grad_h_n, *(a for a in (h0, c0, grad_c_n) if a is not None)):
        array.setflags(write=False)
    for array in weights.values():
        array.setflags(write=False)
    return case
