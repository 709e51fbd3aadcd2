"""The seed workloads: padding vs packing vs bucketing, the CPU/GPU crossover, framework overhead against a
CUDA-graph replay, and precision speed against error.

Pure functions (length distributions, automatic buckets, work ratios, the crossover finder) come first and
need only numpy; the runners below them need torch and are used by ``suites/test_workloads.py`` and the
``lstmperf crossover`` command.

Bucketing. Sequences of a variable-length dataset are grouped into buckets of similar length and batched
within a bucket, so that a batch pads only to the longest sequence of its bucket. The bucket boundaries are
generated from the data: over the sorted lengths, a dynamic programme chooses at most ``max_buckets``
contiguous groups that minimise the padded work ``sum(count x longest)`` of the groups.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias, cast

import numpy as np

from ..speed.report_plots import find_crossover, plain_log_scale

if TYPE_CHECKING:
    from ..model.spec import Cell

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


# ------------------------------------------------------------------------------------------ crossover
# ------------------------------------------------------------------------------------------ timing
def median_time(
    call: Callable[[], object], synchronize: Callable[[], None], repeats: int = 7, warmup: int = 2
) -> float:
    """Median wall seconds of ``call`` followed by ``synchronize``, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        call()
        synchronize()
    times = []
    for _ in range(max(repeats, 1)):
        start = time.perf_counter()
        call()
        synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def paired_median_times(
    calls: Sequence[Callable[[], object]], synchronize: Callable[[], None], repeats: int = 15, warmup: int = 2
) -> list[float]:
    """Median wall seconds of each of ``calls`` (each followed by ``synchronize``), timed in alternation:
    round ``r`` times every call once, so a change of load on the machine (a neighbour, another pytest-xdist
    worker) moves every figure alike and their ratios stay meaningful."""
    for _ in range(warmup):
        for call in calls:
            call()
            synchronize()
    times: list[list[float]] = [[] for _ in calls]
    for _ in range(max(repeats, 1)):
        for call, samples in zip(calls, times, strict=True):
            start = time.perf_counter()
            call()
            synchronize()
            samples.append(time.perf_counter() - start)
    return [statistics.median(samples) for samples in times]


def _sync(torch: Any, device: Any) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


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
        self.synchronize = _sync(torch, self.dev)

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
        from ..model.reference import forward_sequences
        from ..model.spec import LayerSpec

        weights = {name: p.detach().double().cpu().numpy() for name, p in self.module.named_parameters()}
        spec = LayerSpec(cell=self.cell, input_size=self.input_size, hidden_size=self.hidden_size,
                         num_layers=self.num_layers, batch=1, seq_len=int(self.lengths.max()))  # fmt: skip
        outputs = forward_sequences(spec, weights, [s.detach().double().cpu().numpy() for s in self.sequences])
        return VarLenResult(outputs, [out[-1] for out in outputs])


def max_relative_error(result: VarLenResult, reference: VarLenResult) -> float:
    """The largest per-sequence relative error (checks.relative_error) over outputs and last states."""
    from ..numerics.checks import relative_error

    errors = [relative_error(a, b) for a, b in zip(result.outputs, reference.outputs, strict=True)]
    errors += [relative_error(a, b) for a, b in zip(result.last, reference.last, strict=True)]
    return max(errors) if errors else 0.0


# ------------------------------------------------------------------------------------------ sweeps
@dataclass
class SweepPoint:
    path: str
    batch: int
    seconds: float | None
    kernel: str = ""
    note: str = ""


def crossover_sweep(
    spec: Any,
    batches: Sequence[int],
    path_names: Sequence[str],
    devices: dict[str, Any],
    repeats: int = 7,
    progress: Callable[[str], None] | None = None,
    seed: int = 0,
) -> list[SweepPoint]:
    """Forward time per call of ``spec`` at each batch size on each path (``devices`` maps a path's device
    kind to its DeviceInfo). At each batch the paths are timed in alternation (:func:`paired_median_times`),
    so a change of load moves them alike and the comparison holds. Unavailable paths and failures become
    points with ``seconds=None`` and a note."""
    from .. import paths as registry

    paths = {name: registry.get(name) for name in path_names}
    reasons: dict[str, str | None] = {}
    for name, path in paths.items():
        device = devices.get(path.device)
        reasons[name] = "no such device" if device is None else path.available(device)
    points = []
    started = time.perf_counter()
    for step, batch in enumerate(batches, 1):
        if progress is not None:
            spent = time.perf_counter() - started
            progress(
                f"batch {batch} ({step}/{len(batches)}): preparing and timing {len(paths)} paths, {repeats} "
                f"call{'s' if repeats != 1 else ''} each"
                + (f" ({spent:.0f} s so far; larger batches take longer)" if step > 1 else "")
            )
        here = _sweep_batch(spec.replace(batch=int(batch)), paths, reasons, devices, repeats, seed)
        for point in here:
            points.append(point)
            if progress is not None:
                shown = f"{point.seconds * 1e3:.3f} ms {point.kernel}" if point.seconds else point.note
                progress(f"[{len(points)}/{len(batches) * len(paths)}] {point.path} batch {batch}: {shown}")
    return points


def _sweep_batch(
    spec: Any, paths: dict[str, Any], reasons: dict[str, str | None], devices: dict[str, Any], repeats: int, seed: int
) -> list[SweepPoint]:
    """One batch size of the sweep: every path prepared and traced, then all timed in alternation."""
    from ..model.case import make_case

    case = make_case(spec, seed)
    found: dict[str, SweepPoint] = {}
    runs = {}
    for name, path in paths.items():
        why = reasons[name] or path.supports(spec)
        if why:
            found[name] = SweepPoint(name, spec.batch, None, note=why)
            continue
        try:
            run = path.prepare(case, devices[path.device])
            trace = run.trace_forward()
            runs[name] = run
            found[name] = SweepPoint(name, spec.batch, None, f"{trace.family}/{trace.precision}")
        except Exception as exc:  # out of memory at a large batch: a point with the reason, the sweep goes on
            found[name] = SweepPoint(name, spec.batch, None, "failed", f"{type(exc).__name__}: {str(exc)[:160]}")
    if runs:
        try:

            def synchronize() -> None:
                for run in runs.values():
                    run.synchronize()

            timed = paired_median_times([run.forward for run in runs.values()], synchronize, repeats)
            for name, seconds in zip(runs, timed, strict=True):
                found[name].seconds = seconds
        except Exception as exc:
            for name in runs:
                found[name].kernel, found[name].note = "failed", f"{type(exc).__name__}: {str(exc)[:160]}"
    return [found[name] for name in paths]


def crossovers(points: Sequence[SweepPoint], cpu_path: str, gpu_paths: Sequence[str]) -> dict[str, int | None]:
    """Per GPU path, the crossover batch against ``cpu_path``."""
    cpu = {p.batch: p.seconds for p in points if p.path == cpu_path and p.seconds}
    out = {}
    for name in gpu_paths:
        gpu = {p.batch: p.seconds for p in points if p.path == name and p.seconds}
        out[name] = find_crossover(cpu, gpu)
    return out


def sweep_label(spec: Any) -> str:
    """``spec.short()`` without its batch size, for a sweep over batch sizes: ``lstm-I64-H256-L2-T100``."""
    return "-".join(part for part in spec.short().split("-") if part != f"B{spec.batch}")


def read_sweep_csv(path: Any) -> list[SweepPoint]:
    """The points of a ``crossover.csv`` written by ``lstmperf crossover`` (to re-draw its plot)."""
    import csv

    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    return [
        SweepPoint(r["path"], int(r["batch"]), float(r["seconds"]) if r["seconds"] else None, r["kernel"], r["note"])
        for r in rows
    ]


def plot_sweep(points: Sequence[SweepPoint], out: Any, title: str, marks: dict[str, int | None]) -> Any:
    """Time per call against batch size per path (log-log), the crossovers marked; returns the PNG path.

    Each path's legend entry says from which batch it wins (or that it never does), and its crossover is a
    dashed line in the path's colour: several paths may win from the same batch, and text drawn beside the lines
    would lie on top of each other. ``title`` is wrapped to the figure's width (a device description is long)."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    drawn: dict[int, int] = {}  # batch -> how many crossover lines are already drawn there
    for name in dict.fromkeys(p.path for p in points):
        xy = [(p.batch, p.seconds * 1e3) for p in points if p.path == name and p.seconds]
        if not xy:
            continue
        label = name
        if name in marks:
            batch = marks[name]
            label += f": wins from batch {batch}" if batch is not None else ": never wins for good"
        elif marks:
            label += ": the reference"
        (line,) = ax.plot(*zip(*xy, strict=True), marker="o", label=label)
        batch = marks.get(name)
        if batch is not None:
            dashes = (4, 2 + 2 * drawn.get(batch, 0))  # lines at one batch stay told apart
            ax.axvline(batch, linestyle=(0, dashes), alpha=0.7, color=line.get_color(), linewidth=1.2)
            drawn[batch] = drawn.get(batch, 0) + 1
    plain_log_scale(ax, "x", base=2)
    plain_log_scale(ax, "y")
    ax.set_xlabel("batch size")
    ax.set_ylabel("forward time per call (ms)")
    lines = [textwrap.fill(line, 95) for line in title.splitlines()]
    ax.set_title("\n".join(lines), fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


# ------------------------------------------------------------------------------------------ overhead
@dataclass(frozen=True)
class Overhead:
    """One shape's cost at three levels: the module call, the raw ATen op, and (CUDA) a graph replay."""

    module_s: float
    op_s: float
    graph_s: float | None
    kernels: int  # GPU kernels (CPU: ATen ops) one module call launched
    ran: str = ""  # observed kernel family/precision of the module call

    @property
    def raw_s(self) -> float:
        """The device-only cost where a graph replay exists, else the raw op."""
        return self.graph_s if self.graph_s else self.op_s

    @property
    def ratio(self) -> float:
        """module / raw: 1.0 is no framework overhead (the literature's "53% slower" is 1.53)."""
        return self.module_s / self.raw_s

    @property
    def host_s(self) -> float:
        return max(self.module_s - self.raw_s, 0.0)

    @property
    def python_s(self) -> float:
        """The module's own Python work (argument checks, flattening) above the raw op."""
        return max(self.module_s - self.op_s, 0.0)


def measure_overhead(cell: str, input_size: int, hidden: int, layers: int, batch: int, seq: int, device: str,
                     repeats: int = 15) -> Overhead:  # fmt: skip
    """Eager ``nn.LSTM``/``nn.GRU`` forward against the ATen op it calls (``torch._VF.lstm``/``gru`` with the
    module's flat weights) and, on CUDA, a CUDA-graph replay of the same call (the device-only cost)."""
    import torch

    from ..meters import device_time
    from ..observation.torch_trace import torch_trace

    dev = torch.device(device)
    cls = torch.nn.LSTM if cell == "lstm" else torch.nn.GRU
    module = cls(input_size, hidden, layers, batch_first=True).to(dev)
    x = torch.randn(batch, seq, input_size, device=dev)
    h0 = torch.zeros(layers, batch, hidden, device=dev)
    weights = cast("list[torch.Tensor]", module._flat_weights)  # None only for absent biases; this layer has them
    sync = _sync(torch, dev)

    def call_module() -> None:
        with torch.no_grad():
            module(x)

    def call_op() -> None:
        with torch.no_grad():
            if cell == "lstm":
                torch._VF.lstm(x, (h0, h0), weights, True, layers, 0.0, False, False, True)
            else:
                torch._VF.gru(x, h0, weights, True, layers, 0.0, False, False, True)

    module_s, op_s = paired_median_times([call_module, call_op], sync, repeats)
    graph_s = None
    if dev.type == "cuda":
        measured = device_time(call_module, device)
        graph_s = measured.median if measured.method == "cuda-graph" else None
    with torch_trace(device, "forward") as trace:
        call_module()
    kernels = len(trace[0].kernels) if dev.type == "cuda" else len(trace[0].ops)
    return Overhead(module_s, op_s, graph_s, kernels, f"{trace[0].family}/{trace[0].precision}")
