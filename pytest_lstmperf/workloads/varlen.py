"""Variable-length batching: a dataset of sequences of different lengths batched three ways (padded to each
batch's longest sequence, packed, or bucketed by length) and run through one LSTM/GRU layer, with the work
each way computes against the ideal work and the outputs checked against the float64 reference.

Pure functions (length distributions, automatic buckets, work ratios) come first and need only numpy (the
distributed training workload batches with them); the runner below them (:class:`VarLenWorkload`) needs torch
and is used by ``suites/test_workloads.py``.

Bucketing. Sequences of a variable-length dataset are grouped into buckets of similar length and batched
within a bucket, so that a batch pads only to the longest sequence of its bucket. The bucket boundaries are
generated from the data: over the sorted lengths, a dynamic programme chooses at most ``max_buckets``
contiguous groups that minimise the padded work ``sum(count x longest)`` of the groups.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np

from ..model.reference import forward_sequences
from ..model.spec import Cell, LayerSpec
from ..numerics.checks import relative_error
from .timing import sync

#: sequence lengths: a list, or an integer array as :func:`draw_lengths` returns
Lengths: TypeAlias = "Sequence[int] | np.ndarray"

LENGTH_DISTRIBUTIONS = ("uniform", "long-tailed")
MODES = ("padded", "packed", "bucketed")


# ------------------------------------------------------------------------------------------ lengths
def draw_lengths(count: int, max_len: int, distribution: str = "uniform", seed: int = 0) -> np.ndarray:
    """``count`` sequence lengths in ``1..max_len``.

    ``uniform``: every length equally likely. ``long-tailed``: log-normal with median ``max_len / 8`` and
    sigma 1 (most sequences short, a few near ``max_len``, as sentence lengths in text corpora), clipped.
    """
    if distribution not in LENGTH_DISTRIBUTIONS:
        raise ValueError(f"unknown length distribution {distribution!r} (valid: {', '.join(LENGTH_DISTRIBUTIONS)})")
    if count < 1 or max_len < 1:
        raise ValueError(f"count and max_len must be >= 1, got count={count} max_len={max_len}")
    rng = np.random.default_rng([seed, 0xB0C])
    if distribution == "uniform":
        lengths = rng.integers(1, max_len + 1, size=count)
    else:
        lengths = np.rint(rng.lognormal(math.log(max(max_len / 8, 1.0)), 1.0, size=count))
    return np.clip(lengths, 1, max_len).astype(np.int64)


# ------------------------------------------------------------------------------------------ batching
def padded_batches(lengths: Lengths, batch: int) -> list[np.ndarray]:
    """Batches in arrival order (index chunks of ``batch``), each to be padded to its longest sequence."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    order = np.arange(len(lengths))
    return [order[i : i + batch] for i in range(0, len(order), batch)]


def auto_buckets(lengths: Lengths, max_buckets: int = 8) -> list[int]:
    """Bucket upper bounds (ascending, the last is ``max(lengths)``) minimising the padded work when every
    sequence is padded to the longest of its bucket; at most ``max_buckets`` buckets."""
    if max_buckets < 1:
        raise ValueError(f"max_buckets must be >= 1, got {max_buckets}")
    values, counts = np.unique(np.asarray(lengths, dtype=np.int64), return_counts=True)
    if values.size == 0:
        return []
    n = values.size
    k_max = min(max_buckets, n)
    prefix = np.concatenate([[0], np.cumsum(counts)])
    # cost[k][j]: least padded work of values[:j] in k buckets; the bucket values[i:j] costs
    # (number of sequences in it) x values[j - 1]
    inf = float("inf")
    cost = np.full((k_max + 1, n + 1), inf)
    choice = np.zeros((k_max + 1, n + 1), dtype=np.int64)
    cost[0][0] = 0.0
    for k in range(1, k_max + 1):
        for j in range(1, n + 1):
            i = np.arange(0, j)
            candidates = cost[k - 1][i] + (prefix[j] - prefix[i]) * float(values[j - 1])
            best = int(np.argmin(candidates))
            cost[k][j], choice[k][j] = candidates[best], best
    k = int(np.argmin(cost[1:, n])) + 1
    bounds, j = [], n
    while j > 0:
        bounds.append(int(values[j - 1]))
        j = int(choice[k][j])
        k -= 1
    return sorted(bounds)


def bucketed_batches(lengths: Lengths, bounds: Sequence[int], batch: int, seed: int = 0) -> list[np.ndarray]:
    """Batches of ``batch`` drawn within each bucket (shuffled inside the bucket, seeded), buckets in turn."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    values = np.asarray(lengths)
    which = np.searchsorted(np.asarray(bounds), values, side="left")
    if len(values) and (which >= len(bounds)).any():
        raise ValueError(f"a length exceeds the last bucket bound {bounds[-1] if bounds else None}")
    rng = np.random.default_rng([seed, 0xB0C2])
    batches = []
    for bucket in range(len(bounds)):
        members = np.flatnonzero(which == bucket)
        rng.shuffle(members)
        batches += [members[i : i + batch] for i in range(0, len(members), batch)]
    return batches


@dataclass(frozen=True)
class Work:
    """Time steps computed per epoch: ideal (every sequence to its own length) and as batched."""

    ideal: int
    padded: int

    @property
    def ratio(self) -> float:
        """padded / ideal: 1.0 is no waste."""
        return self.padded / self.ideal if self.ideal else float("nan")

    @property
    def wasted(self) -> float:
        """Share of the computed steps that are padding."""
        return 1.0 - self.ideal / self.padded if self.padded else 0.0


def work(lengths: Lengths, batches: Sequence[np.ndarray]) -> Work:
    """Steps computed when each batch is padded to its longest sequence."""
    values = np.asarray(lengths)
    padded = sum(int(values[b].max()) * len(b) for b in batches if len(b))
    return Work(int(values.sum()), padded)


# ------------------------------------------------------------------------------------------ var-length
@dataclass
class VarLenResult:
    """Per sequence, the outputs at its valid positions ``(len_i, H)`` and the last valid hidden state."""

    outputs: list[np.ndarray]
    last: list[np.ndarray]


@dataclass
class VarLenWorkload:
    """A dataset of variable-length sequences run through one unidirectional LSTM/GRU three ways.

    ``padded``: arrival-order batches padded to their longest sequence (the layer computes the padding);
    ``packed``: the same batches as ``PackedSequence`` (the layer skips the padding); ``bucketed``: batches
    regrouped by automatically generated length buckets, padded to their longest. Unidirectional only:
    padding reaches a reverse direction's first steps, so a bidirectional layer's padded outputs differ.
    """

    cell: Cell
    input_size: int
    hidden_size: int
    lengths: np.ndarray
    batch: int
    device: str = "cpu"
    dtype: str = "float32"
    num_layers: int = 1
    seed: int = 0
    max_buckets: int = 8
    bounds: list[int] = field(init=False)
    batches: dict[str, list[np.ndarray]] = field(init=False)

    def __post_init__(self) -> None:
        import torch

        if self.cell not in ("lstm", "gru"):
            raise ValueError(f"unknown cell {self.cell!r} (valid: lstm, gru)")
        self.torch = torch
        self.dev = torch.device(self.device)
        self.tdtype = getattr(torch, self.dtype)
        gen = torch.Generator().manual_seed(self.seed)
        cls = torch.nn.LSTM if self.cell == "lstm" else torch.nn.GRU
        torch.manual_seed(self.seed)
        self.module = cls(self.input_size, self.hidden_size, self.num_layers, batch_first=True)
        self.module.to(device=self.dev, dtype=self.tdtype)
        self.sequences = [
            torch.randn(int(n), self.input_size, generator=gen).to(device=self.dev, dtype=self.tdtype)
            for n in self.lengths
        ]
        self.bounds = auto_buckets(self.lengths, self.max_buckets)
        self.batches = {
            "padded": padded_batches(self.lengths, self.batch),
            "packed": padded_batches(self.lengths, self.batch),
            "bucketed": bucketed_batches(self.lengths, self.bounds, self.batch, self.seed),
        }
        self.synchronize = sync(torch, self.dev)

    def work(self, mode: str) -> Work:
        if mode == "packed":
            return Work(int(self.lengths.sum()), int(self.lengths.sum()))
        return work(self.lengths, self.batches[mode])

    def _batch_output(self, mode: str, index: np.ndarray) -> tuple[Any, Any]:
        """(padded output ``(B, T, H)``, lengths tensor) of one batch."""
        from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence, pad_sequence

        torch = self.torch
        seqs = [self.sequences[i] for i in index]
        lengths = torch.as_tensor([int(self.lengths[i]) for i in index])
        x = pad_sequence(seqs, batch_first=True)
        if mode == "packed":
            packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
            out, _ = self.module(packed)
            out, _ = pad_packed_sequence(out, batch_first=True)
            return out, lengths
        out, _ = self.module(x)
        return out, lengths

    def epoch(self, mode: str, train: bool = True) -> None:
        """One pass over the dataset; ``train``: forward and backward of the sum of valid outputs per batch."""
        torch = self.torch
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r} (valid: {', '.join(MODES)})")
        context = torch.enable_grad() if train else torch.no_grad()
        with context:
            for index in self.batches[mode]:
                out, lengths = self._batch_output(mode, index)
                if train:
                    steps = torch.arange(out.shape[1], device=out.device)[None, :, None]
                    valid = steps < lengths.to(out.device)[:, None, None]
                    (out * valid).sum().backward()

    def results(self, mode: str) -> VarLenResult:
        """Valid outputs and last hidden state per sequence (float64 numpy), in dataset order."""
        torch = self.torch
        outputs: list[np.ndarray | None] = [None] * len(self.lengths)
        last: list[np.ndarray | None] = [None] * len(self.lengths)
        with torch.no_grad():
            for index in self.batches[mode]:
                out, lengths = self._batch_output(mode, index)
                out = out.double().cpu().numpy()
                for row, i in enumerate(index):
                    n = int(lengths[row])
                    outputs[i] = out[row, :n]
                    last[i] = out[row, n - 1]
        return VarLenResult(outputs, last)  # type: ignore[arg-type]

    def reference(self) -> VarLenResult:
        """Every sequence without padding, in float64, from the numpy reference (``reference.py``) with the
        module's weights, each over its own length (``reference.forward_sequences``)."""
        weights = {name: p.detach().double().cpu().numpy() for name, p in self.module.named_parameters()}
        spec = LayerSpec(cell=self.cell, input_size=self.input_size, hidden_size=self.hidden_size,
                         num_layers=self.num_layers, batch=1, seq_len=int(self.lengths.max()))  # fmt: skip
        outputs = forward_sequences(spec, weights, [s.detach().double().cpu().numpy() for s in self.sequences])
        return VarLenResult(outputs, [out[-1] for out in outputs])


def max_relative_error(result: VarLenResult, reference: VarLenResult) -> float:
    """The largest per-sequence relative error (checks.relative_error) over outputs and last states."""
    errors = [relative_error(a, b) for a, b in zip(result.outputs, reference.outputs, strict=True)]
    errors += [relative_error(a, b) for a, b in zip(result.last, reference.last, strict=True)]
    return max(errors) if errors else 0.0
