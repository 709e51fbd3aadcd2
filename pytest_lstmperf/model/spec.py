"""The framework-neutral description of a recurrent layer and the input it is run on.

A :class:`LayerSpec` is frozen and hashable; every path, the float64 reference and the benchmark suites
take one. It holds no tensors: :mod:`pytest_lstmperf.model.case` turns a spec and a seed into concrete data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

from .precision import DTYPES

Cell = Literal["lstm", "gru"]
DType = Literal["float32", "float64", "float16", "bfloat16"]
Lengths = Literal["none", "padded", "packed"]

CELLS: tuple[str, ...] = ("lstm", "gru")
LENGTH_MODES: tuple[str, ...] = ("none", "padded", "packed")

#: gates per cell, in PyTorch/cuDNN order: LSTM [i, f, g, o], GRU [r, z, n]
GATES = {"lstm": 4, "gru": 3}


def reject_unknown_fields(cls: type, data: Mapping[str, object], error: type[Exception]) -> None:
    """Raise ``error`` naming the keys of ``data`` that are not fields of the dataclass ``cls``, and the valid ones."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise error(f"unknown {cls.__name__} fields {unknown} (valid: {', '.join(sorted(known))})")


class SpecError(ValueError):
    """An impossible layer description (negative size, proj_size >= hidden_size, ...)."""


@dataclass(frozen=True)
class LayerSpec:
    """One recurrent layer configuration and the shape of its input.

    ``lengths`` holds one length per batch element when ``length_mode`` is not ``"none"``:
    ``"padded"`` runs the layer over the zero-padded batch (what most user code does),
    ``"packed"`` runs it as a ``PackedSequence`` (states frozen after each sequence's end).
    ``initial_state`` gives the layer random ``h0`` (and ``c0``) instead of zeros.
    ``reset_after`` only concerns GRU; ``False`` is Keras's other GRU form, which PyTorch lacks.
    """

    cell: Cell = "lstm"
    input_size: int = 8
    hidden_size: int = 16
    num_layers: int = 1
    bidirectional: bool = False
    proj_size: int = 0
    bias: bool = True
    batch_first: bool = True
    batch: int = 4
    seq_len: int = 5
    length_mode: Lengths = "none"
    lengths: tuple[int, ...] | None = None
    dtype: DType = "float32"
    training: bool = True
    initial_state: bool = False
    reset_after: bool = True

    def __post_init__(self) -> None:
        if self.lengths is not None and not isinstance(self.lengths, tuple):
            object.__setattr__(self, "lengths", tuple(self.lengths))  # keep the spec hashable
        problems = list(self._problems())
        if problems:
            raise SpecError(f"invalid LayerSpec: {'; '.join(problems)}")

    def _problems(self) -> Iterator[str]:
        if self.cell not in CELLS:
            yield f"cell={self.cell!r} (valid: {', '.join(CELLS)})"
        if self.dtype not in DTYPES:
            yield f"dtype={self.dtype!r} (valid: {', '.join(DTYPES)})"
        if self.length_mode not in LENGTH_MODES:
            yield f"length_mode={self.length_mode!r} (valid: {', '.join(LENGTH_MODES)})"
        for name in ("input_size", "hidden_size", "num_layers", "batch", "seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                yield f"{name}={value!r} (must be an integer >= 1)"
        if not isinstance(self.proj_size, int) or isinstance(self.proj_size, bool) or self.proj_size < 0:
            yield f"proj_size={self.proj_size!r} (must be an integer >= 0)"
        elif self.proj_size and isinstance(self.hidden_size, int) and self.proj_size >= self.hidden_size:
            yield f"proj_size={self.proj_size} must be smaller than hidden_size={self.hidden_size}"
        if self.proj_size and self.cell != "lstm":
            yield f"proj_size={self.proj_size} is only defined for LSTM, not {self.cell}"
        if not self.reset_after and self.cell != "gru":
            yield "reset_after=False is only defined for GRU"
        if self.length_mode == "none":
            if self.lengths is not None:
                yield "lengths given but length_mode='none'"
        else:
            if self.lengths is None:
                yield f"length_mode={self.length_mode!r} needs lengths"
            elif isinstance(self.batch, int) and isinstance(self.seq_len, int):
                if len(self.lengths) != self.batch:
                    yield f"{len(self.lengths)} lengths for batch={self.batch}"
                bad = [n for n in self.lengths if not (1 <= n <= self.seq_len)]
                if bad:
                    yield f"lengths {bad} outside 1..seq_len={self.seq_len}"
                elif max(self.lengths) != self.seq_len:
                    yield f"the longest length {max(self.lengths)} must equal seq_len={self.seq_len}"

    # ----------------------------------------------------------------- derived sizes
    @property
    def gates(self) -> int:
        return GATES[self.cell]

    @property
    def directions(self) -> int:
        return 2 if self.bidirectional else 1

    @property
    def state_size(self) -> int:
        """Size of ``h`` (the projected size when ``proj_size > 0``)."""
        return self.proj_size or self.hidden_size

    @property
    def output_size(self) -> int:
        return self.state_size * self.directions

    def layer_input_size(self, layer: int) -> int:
        return self.input_size if layer == 0 else self.output_size

    @property
    def effective_lengths(self) -> tuple[int, ...]:
        """The length the layer must honour for each batch element."""
        if self.length_mode == "packed" and self.lengths is not None:
            return self.lengths
        return (self.seq_len,) * self.batch

    @property
    def param_count(self) -> int:
        count = 0
        g, h, p = self.gates, self.hidden_size, self.proj_size
        for layer in range(self.num_layers):
            per_dir = g * h * (self.layer_input_size(layer) + self.state_size)
            if self.bias:
                per_dir += 2 * g * h
            if p:
                per_dir += p * h
            count += per_dir * self.directions
        return count

    @property
    def flops_forward(self) -> int:
        """Multiply-adds x2 of the matrix products of one forward pass (pointwise work ignored)."""
        steps = sum(self.effective_lengths)
        g, h, p = self.gates, self.hidden_size, self.proj_size
        flops = 0
        for layer in range(self.num_layers):
            per_step = 2 * g * h * (self.layer_input_size(layer) + self.state_size)
            if p:
                per_step += 2 * p * h
            flops += per_step * steps * self.directions
        return flops

    def module_kwargs(self) -> dict[str, object]:
        """The constructor arguments of the ``torch.nn.LSTM``/``GRU`` this spec describes."""
        kwargs: dict[str, object] = dict(
            input_size=self.input_size,
            hidden_size=self.hidden_size,
            num_layers=self.num_layers,
            bias=self.bias,
            batch_first=self.batch_first,
            bidirectional=self.bidirectional,
        )
        if self.cell == "lstm":
            kwargs["proj_size"] = self.proj_size
        return kwargs

    def replace(self, **changes: object) -> LayerSpec:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def short(self) -> str:
        """A compact id for test names and tables: ``lstm-I8-H16-L1-B4-T5``."""
        parts = [self.cell, f"I{self.input_size}", f"H{self.hidden_size}", f"L{self.num_layers}"]
        if self.bidirectional:
            parts.append("bi")
        if self.proj_size:
            parts.append(f"P{self.proj_size}")
        if not self.bias:
            parts.append("nobias")
        if not self.reset_after:
            parts.append("reset_before")
        parts += [f"B{self.batch}", f"T{self.seq_len}"]
        if self.length_mode != "none":
            parts.append(self.length_mode)
        if self.initial_state:
            parts.append("h0")
        if self.dtype != "float32":
            parts.append(self.dtype)
        if not self.training:
            parts.append("eval")
        return "-".join(parts)

    def to_dict(self) -> dict[str, object]:
        data = dataclasses.asdict(self)
        if data["lengths"] is not None:
            data["lengths"] = list(data["lengths"])
        return data

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> LayerSpec:
        reject_unknown_fields(cls, data, SpecError)
        values = dict(data)
        if values.get("lengths") is not None:
            values["lengths"] = tuple(values["lengths"])  # type: ignore[arg-type]
        return cls(**values)  # type: ignore[arg-type]
