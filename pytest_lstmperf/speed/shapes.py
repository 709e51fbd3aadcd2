"""The benchmark shape grids: a quick gate set for merge gating, and a thorough set.

``gate`` is small enough to finish in minutes on a GPU runner and in well under two minutes on a 2-core CI
machine; it holds a host-bound shape (batch 1, where CPU can beat GPU), a mid-size shape, a DeepBench
training and inference shape and a GRU. ``thorough`` adds DeepBench's LSTM training and inference shapes
(Baidu DeepBench, ``rnn_problems``; input size = hidden size, as DeepBench excludes the input projection),
GRUs on the same grid, and sweeps over batch (1 upward: the CPU/GPU crossover), hidden size and sequence
length around the reference shape (2-layer LSTM, I=64, H=256, T=100).

Each :class:`BenchShape` names the sweeps it belongs to, which the report uses to draw its plots.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import options
from ..model.spec import Cell, LayerSpec

if TYPE_CHECKING:
    import pytest

SETS = ("gate", "thorough")
MODES = ("forward", "train")


@dataclass(frozen=True)
class BenchShape:
    spec: LayerSpec
    modes: tuple[str, ...] = ("forward",)
    sweeps: tuple[str, ...] = ()  # "batch", "hidden", "seq", "deepbench-train", "deepbench-infer", "gate"

    @property
    def id(self) -> str:
        return self.spec.short()


@dataclass(frozen=True)
class RoundSettings:
    warmup: int
    min_rounds: int
    max_rounds: int
    target_s: float
    device_samples: int


#: rounds per set: enough for a rank test at p < 0.002 (7 per side at least) and for three run medians (5 rounds
#: each), bounded for CI. On a GPU the device samples decide (each the mean of 5 graph replays or 5 queued
#: calls, steady within a few percent): 12 of them, three batches of 4 for the run medians, cost milliseconds;
#: the per-call rounds stop at 0.25 s of timed work per benchmark, and where the gate compares or records and the device
#: figure decides, at ``runner.DEVICE_DECIDES_ROUNDS`` (the device time is measured first).
ROUNDS = {
    "gate": RoundSettings(warmup=3, min_rounds=15, max_rounds=45, target_s=0.25, device_samples=12),
    "thorough": RoundSettings(warmup=5, min_rounds=20, max_rounds=100, target_s=1.0, device_samples=20),
}


def _lstm(i: int, h: int, b: int, t: int, layers: int = 1, cell: Cell = "lstm") -> LayerSpec:
    return LayerSpec(
        cell=cell,
        input_size=i,
        hidden_size=h,
        num_layers=layers,
        batch=b,
        seq_len=t,
        batch_first=True,
        training=True,
    )


def _packed(spec: LayerSpec) -> LayerSpec:
    t, b = spec.seq_len, spec.batch
    lengths = tuple(max(1, t - (k * t) // (2 * b)) for k in range(b))
    return spec.replace(length_mode="packed", lengths=lengths)


REFERENCE = _lstm(
    64, 256, 64, 100, layers=2
)  # the shape of the reference H100 figures (eligibility.REFERENCE_SLOWDOWNS)


def deepbench_train() -> list[LayerSpec]:
    specs = [_lstm(h, h, b, 25) for h in (512, 1024, 2048, 4096) for b in (16, 32, 64, 128)]
    specs += [_lstm(1536, 1536, b, 50) for b in (8, 16, 32)]
    specs += [_lstm(256, 256, b, 150) for b in (16, 32, 64)]
    return specs


def deepbench_infer() -> list[LayerSpec]:
    specs = [_lstm(h, h, b, 25) for h in (512, 1024, 2048) for b in (1, 2, 4)]
    specs += [_lstm(1536, 1536, b, 50) for b in (1, 2, 4)]
    specs += [_lstm(256, 256, b, 150) for b in (1, 2, 4)]
    return specs


def _gate(device_kind: str) -> list[BenchShape]:
    if device_kind == "cuda":
        return [
            BenchShape(REFERENCE.replace(batch=1), ("forward",), ("gate", "batch")),
            BenchShape(REFERENCE, ("forward", "train"), ("gate", "batch")),
            BenchShape(_lstm(1024, 1024, 64, 25), ("forward", "train"), ("gate", "deepbench-train")),
            BenchShape(_lstm(512, 512, 4, 25), ("forward",), ("gate", "deepbench-infer")),
            BenchShape(_lstm(512, 512, 32, 25, cell="gru"), ("forward", "train"), ("gate",)),
        ]
    # a 2-core CI machine: small shapes, a few milliseconds per call
    small = _lstm(32, 64, 16, 20)
    return [
        BenchShape(small.replace(batch=1), ("forward",), ("gate", "batch")),
        BenchShape(small, ("forward", "train"), ("gate", "batch")),
        BenchShape(small.replace(cell="gru"), ("forward",), ("gate",)),
        BenchShape(_packed(small), ("forward",), ("gate",)),
    ]


def _thorough(device_kind: str) -> list[BenchShape]:
    cpu = device_kind == "cpu"
    shapes: list[BenchShape] = list(_gate(device_kind))
    # CPU runs keep to what a CPU finishes in reasonable time: hidden <= 1024, batch <= 256
    max_hidden, max_batch = (1024, 256) if cpu else (10**9, 10**9)
    for spec in deepbench_train():
        if spec.hidden_size <= max_hidden:
            shapes.append(BenchShape(spec, ("forward", "train"), ("deepbench-train",)))
            if spec.seq_len == 25 and spec.batch == 32:
                shapes.append(BenchShape(spec.replace(cell="gru"), ("forward", "train"), ("deepbench-train",)))
    for spec in deepbench_infer():
        if spec.hidden_size <= max_hidden:
            shapes.append(BenchShape(spec, ("forward",), ("deepbench-infer",)))
            if spec.seq_len == 25 and spec.batch in (1, 4):
                shapes.append(BenchShape(spec.replace(cell="gru"), ("forward",), ("deepbench-infer",)))
    for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024):
        if b <= max_batch:
            shapes.append(BenchShape(REFERENCE.replace(batch=b), ("forward",), ("batch",)))
    for h in (64, 128, 256, 512, 1024, 2048):
        if h <= max_hidden:
            shapes.append(BenchShape(REFERENCE.replace(hidden_size=h), ("forward",), ("hidden",)))
    for t in (10, 25, 50, 100, 200, 400):
        shapes.append(BenchShape(REFERENCE.replace(seq_len=t), ("forward",), ("seq",)))
    shapes.append(BenchShape(_packed(REFERENCE.replace(batch=32, seq_len=50)), ("forward", "train"), ()))
    return _merge(shapes)


def _merge(shapes: list[BenchShape]) -> list[BenchShape]:
    """One entry per spec, with the union of modes and sweeps, in first-seen order."""
    merged: dict[LayerSpec, BenchShape] = {}
    for shape in shapes:
        if shape.spec in merged:
            old = merged[shape.spec]
            merged[shape.spec] = BenchShape(
                shape.spec,
                tuple(m for m in MODES if m in old.modes or m in shape.modes),
                tuple(dict.fromkeys(old.sweeps + shape.sweeps)),
            )
        else:
            merged[shape.spec] = shape
    return list(merged.values())


def set_shapes(name: str, device_kind: str) -> list[BenchShape]:
    """The shapes of set ``name`` (one of :data:`SETS`) for a device kind (``cpu`` or ``cuda``)."""
    if name not in SETS:
        raise ValueError(f"unknown benchmark set {name!r} (valid: {', '.join(SETS)})")
    return _merge(_gate(device_kind)) if name == "gate" else _thorough(device_kind)


def bench_set(config: pytest.Config) -> str:
    """The name of the selected benchmark set (``--lstmperf-bench-set``): ``gate`` (quick) or ``thorough``."""
    return str(options.resolve(config, "lstmperf_bench_set").value)
