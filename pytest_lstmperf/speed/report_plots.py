"""The speed report's plots, and the figures they are drawn from.

Time per call against each sweep of the benchmark shapes (batch size, sequence length, hidden size), one line per
path and device kind, with the CPU/GPU crossover marked on the batch sweep (:func:`crossover`, the smallest batch
from which the fastest GPU path beats the fastest CPU path); baseline against now per benchmark; the plain-number
log scale every plot of the report folder uses (:func:`plain_log_scale`); and each plot's heading on the index
(:data:`PLOT_TITLES`). matplotlib (Agg backend) is imported by the functions that draw.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .policy import GateResult
    from .records import BaselineEntry, BenchRecord


def median(data: Sequence[float]) -> float | None:
    values = sorted(x for x in data if x)
    return values[len(values) // 2] if values else None


def _series(records: Iterable[BenchRecord], sweep: str, field: str) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """(path, device kind) -> sorted (x, seconds) for forward records of ``sweep``."""
    series: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    for record in records:
        if sweep not in record.sweeps or record.mode != "forward":
            continue
        value = record.time_per_call_s
        size = record.spec_size(field)
        if not value or size is None:
            continue
        kind = record.device.split(":")[0]
        series[(record.path, kind)][size] = float(value)
    return {key: sorted(points.items()) for key, points in series.items() if points}


def find_crossover(cpu: dict[int, float], gpu: dict[int, float]) -> int | None:
    """The smallest batch size from which the GPU is faster than the CPU at every larger measured batch.

    ``cpu``/``gpu`` map batch size to seconds per call. None when the GPU never wins for good (or no batch
    size was measured on both); the smallest measured batch when the GPU wins everywhere.
    """
    common = sorted(set(cpu) & set(gpu))
    for index, batch in enumerate(common):
        if all(gpu[b] < cpu[b] for b in common[index:]):
            return batch
    return None


def crossover(series: dict[tuple[str, str], list[tuple[int, float]]]) -> int | None:
    """The smallest batch from which the fastest GPU path beats the fastest CPU path (None if never/unknown)."""
    best: dict[str, dict[int, float]] = {"cpu": {}, "cuda": {}}
    for (_, kind), points in series.items():
        if kind not in best:
            continue
        for x, y in points:
            best[kind][x] = min(y, best[kind].get(x, float("inf")))
    return find_crossover(best["cpu"], best["cuda"])


def plain_log_scale(ax: Any, which: str, base: int = 10, suffix: str = "") -> None:
    """A log scale on ``ax``'s ``which`` axis ("x" or "y") whose tick labels are plain numbers (``0.5``,
    ``20``, ``4x``, never ``5x10^-1``), thinned by the span at draw time so that they cannot crowd: every
    tick within about a decade, mantissas 1, 2 and 5 up to three decades, powers of ten beyond."""
    import matplotlib.ticker as ticker

    axis = ax.xaxis if which == "x" else ax.yaxis
    (ax.set_xscale if which == "x" else ax.set_yscale)("log", base=base)
    if base != 10:
        axis.set_major_locator(ticker.LogLocator(base=base, numticks=16))
        axis.set_minor_locator(ticker.NullLocator())

    def label(value: float, _pos: int | None = None) -> str:
        if value <= 0:
            return ""
        low, high = sorted(axis.get_view_interval())
        decades = math.log10(high / low) if low > 0 else math.inf
        mantissa = round(value / 10 ** math.floor(math.log10(value) + 1e-9), 6)
        keep = base != 10 or decades <= 1.2 or mantissa == 1 or (decades <= 3 and mantissa in (2, 5))
        number = str(round(value)) if value >= 100 else f"{value:.3g}"
        return f"{number}{suffix}" if keep else ""

    axis.set_major_formatter(ticker.FuncFormatter(label))
    axis.set_minor_formatter(ticker.FuncFormatter(label))
    ax.tick_params(axis=which, which="minor", labelsize=7)


def plot_sweep(out: Path, records: list[BenchRecord], sweep: str, field: str, label: str) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = _series(records, sweep, field)
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(8, 5))
    for (path, kind), points in sorted(series.items()):
        xs, ys = zip(*points, strict=True)
        ax.plot(
            xs, [y * 1e3 for y in ys], marker="o", label=f"{path} ({kind})", linestyle="-" if kind == "cuda" else "--"
        )
    plain_log_scale(ax, "x", base=2)
    plain_log_scale(ax, "y")
    ax.set_xlabel(label)
    ax.set_ylabel("time per call (ms)")
    title = f"forward time vs {label}"
    if sweep == "batch":
        cross = crossover(series)
        if cross is not None:
            ax.axvline(cross, color="grey", linestyle=":")
            ax.annotate(
                f"GPU faster from batch {cross}",
                (cross, ax.get_ylim()[1]),
                fontsize=8,
                xytext=(4, -12),
                textcoords="offset points",
            )
            title += f" (CPU/GPU crossover at batch {cross})"
        elif len({kind for _, kind in series}) < 2:
            title += " (one device: run CPU and GPU and combine to see the crossover)"
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    target = out / f"time_vs_{sweep}.png"
    fig.savefig(target, dpi=110)
    plt.close(fig)
    return target


def plot_baseline(
    out: Path, records: list[BenchRecord], baseline: list[BaselineEntry], gate: GateResult | None = None
) -> Path | None:
    """Now/baseline per benchmark. With the gate's decisions: the paired ratio of the check that decided each
    one (per call or device time, :attr:`.policy.Decision.deciding`), coloured by verdict; without: per-call
    medians."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    decided = {
        d.name: (d.deciding, ratio, d.verdict)
        for d in (gate.decisions if gate is not None else [])
        if d.deciding is not None and (ratio := d.deciding.ratio) is not None
    }
    then = {b.fullname: median(b.samples) for b in baseline}
    rows: list[tuple[str, float, str]] = []
    for r in records:
        decision = decided.get(r.fullname)
        before, now = then.get(r.fullname), r.time_per_call_s
        if decision is not None:
            _, decided_ratio, verdict = decision
            rows.append((r.name, float(decided_ratio), verdict))
        elif before and now:
            ratio = now / before
            rows.append((r.name, ratio, "regressed" if ratio >= 1.10 else "improved" if ratio <= 1 / 1.10 else ""))
    if not rows:
        return None
    rows.sort()
    figures = sorted({(decided[r.fullname][0].metric, decided[r.fullname][0].variant)
                      for r in records if r.fullname in decided})  # fmt: skip
    undecided = len(rows) > len([r for r in records if r.fullname in decided])
    height = max(3.0, 0.28 * len(rows) + 1.4)
    fig, ax = plt.subplots(figsize=(9, height), dpi=110)  # the saved dpi: text is measured as it is drawn
    colors = {
        "regressed": "tab:red",
        "kernel-changed": "tab:red",
        "host-work-changed": "tab:red",
        "improved": "tab:green",
    }
    ratios = [ratio for _, ratio, _ in rows]
    shades = [colors.get(v, "tab:grey") for *_, v in rows]
    # bars from 1.0 (no change) to the ratio, and a dot at the ratio: an unchanged benchmark still shows
    ax.barh(range(len(rows)), [r - 1.0 for r in ratios], left=1.0, color=shades, height=0.6)
    ax.scatter(ratios, range(len(rows)), color=shades, s=8, zorder=3)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([name.replace("test_", "") for name, _, _ in rows], fontsize=6)
    ax.set_xlabel(baseline_axis_label(figures, undecided), fontsize=8)
    ax.set_title("baseline vs now (red: regressed, green: improved)", fontsize=10)
    _fit_row_labels(fig, ax, height)
    target = out / "baseline_vs_now.png"
    fig.savefig(target, dpi=fig.dpi)
    plt.close(fig)
    return target


def baseline_axis_label(figures: Iterable[tuple[str, str]], undecided: bool = False) -> str:
    """What :func:`plot_baseline`'s bars are: for the benchmarks the gate decided, its deciding figure (a
    ``(metric, variant)`` of :class:`.policy.Check`: ``anchored`` is the benchmark's time divided by the anchor
    workload's, timed in pairs in the same process, ``raw`` the benchmark's own time); for the others
    (``undecided``), the raw time per call's medians."""
    names = {"per-call": "time per call", "device": "device time"}
    parts = [
        f"{names.get(metric, metric)} / anchor's" if variant == "anchored" else f"{names.get(metric, metric)} (raw)"
        for metric, variant in figures
    ]
    if undecided or not parts:
        parts.append("median time per call (raw)")
    return "now / baseline of: " + ", ".join(dict.fromkeys(parts))


def _fit_row_labels(fig: Any, ax: Any, height: float) -> None:
    """Widen the figure by its widest row label and place the axes right of it. The labels are measured at the
    dpi the figure is saved at: measured at matplotlib's default 100 dpi and saved at 110, the long ones were cut
    at the left edge."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    widest = max((t.get_window_extent(renderer).width for t in ax.get_yticklabels()), default=0.0) / fig.dpi
    plot, margin = 5.5, 0.35
    width = widest + plot + 2 * margin
    fig.set_size_inches(width, height)
    fig.subplots_adjust(left=(widest + margin) / width, right=1 - margin / width, top=1 - 0.45 / height,
                        bottom=0.6 / height)  # fmt: skip


#: what each plot of the report folder shows, as its heading on the index (other plots: their file name)
PLOT_TITLES = {
    "time_vs_batch": "forward time against batch size",
    "time_vs_seq": "forward time against sequence length",
    "time_vs_hidden": "forward time against hidden size",
    "baseline_vs_now": "baseline against now",
    "bucketing": "workloads: padding vs packing vs bucketing",
    "crossover-cpu": "workloads: crossover of the CPU paths",
    "crossover-cuda": "workloads: CPU/GPU crossover",
    "overhead": "workloads: framework overhead",
    "precision": "workloads: precision, speed against error",
    "scaling": "workloads: scale-out training",
}
