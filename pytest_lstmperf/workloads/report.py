"""The seed-workload report: the rows the workload suite collected (``bucketing``, ``crossover``, ``overhead``,
``precision``, ``scaling``) made into a summary table per kind (:func:`sections`), the notes a reader needs to
read each table right (:func:`notes`), and ``workloads.md`` with its plots written into a report folder
(:func:`write_workload_report`); the pytest hooks that collect the rows and print the tables live in
:mod:`pytest_lstmperf.hooks.workloads`. matplotlib (Agg backend) is imported by the functions that draw.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ..speed.report import link_pages
from ..speed.report_plots import plain_log_scale
from .rows import (
    KINDS,
    BucketingRow,
    CrossoverRow,
    OverheadRow,
    PrecisionRow,
    ScalingRow,
    WorkloadRow,
    ratio,
    row_to_json,
)

R = TypeVar("R", BucketingRow, CrossoverRow, OverheadRow, PrecisionRow, ScalingRow)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f}"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(header, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return lines


def _of(rows: Sequence[WorkloadRow], cls: type[R]) -> list[R]:
    return [r for r in rows if isinstance(r, cls)]


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def sections(rows: Sequence[WorkloadRow]) -> dict[str, tuple[list[str], list[list[str]]]]:
    """Per kind, (header, rows) of the summary tables."""
    out: dict[str, tuple[list[str], list[list[str]]]] = {}
    bucketing = _of(rows, BucketingRow)
    if bucketing:
        groups: dict[str, dict[str, BucketingRow]] = defaultdict(dict)
        for b in bucketing:
            groups[b.workload][b.mode] = b
        cells = []
        for workload, modes in sorted(groups.items()):
            padded = modes["padded"].seconds if "padded" in modes else None
            for mode in ("padded", "packed", "bucketed"):
                entry = modes.get(mode)
                if not entry:
                    continue
                speedup = f"{padded / entry.seconds:.2f}x" if padded and entry.seconds else "-"
                cells.append([workload, mode, f"{entry.work_ratio:.2f}", f"{100 * entry.wasted:.0f}%",
                              _ms(entry.seconds), speedup, str(entry.buckets)])  # fmt: skip
        header = ["workload", "mode", "work/ideal", "wasted", "epoch ms", "vs padded", "buckets"]
        out["bucketing"] = (header, cells)
    crossover = _of(rows, CrossoverRow)
    if crossover:
        cells = []
        for c in crossover:
            for name, batch in c.crossover.items():
                cells.append([c.shape, name, c.against, "never" if batch is None else str(batch)])
        out["crossover"] = (["shape", "path", "against", "wins from batch"], cells)
    overhead = _of(rows, OverheadRow)
    if overhead:
        cells = [
            [o.shape, o.device, o.framework, o.ran, _ms(o.module_s), _ms(o.op_s), _ms(o.raw_or_op_s),
             _fmt(o.ratio, ".2f", "x") + (" (below 1x)" if o.below_raw else ""), _ms(o.host_s),
             "-" if o.kernels is None else str(o.kernels)]
            for o in sorted(overhead, key=lambda o: (o.shape, o.framework))
        ]  # fmt: skip
        header = ["shape", "device", "framework", "ran", "call ms", "aten op ms", "raw ms", "call/raw",
                  "above raw ms", "distinct kernels"]  # fmt: skip
        out["overhead"] = (header, cells)
    precision = _of(rows, PrecisionRow)
    if precision:
        fp32 = {r.shape: r for r in precision if r.claimed.endswith("/fp32")}
        cells = []
        for r in sorted(precision, key=lambda r: (r.shape, r.path)):
            reference = fp32.get(r.shape)
            device_speedup = ratio(reference.device_s if reference else None, r.device_s)
            cells.append([r.shape, r.path, r.observed, _ms(r.seconds), _ms(r.fp32_s), _fmt(r.speedup, ".2f", "x"),
                          _ms(r.device_s), _fmt(device_speedup, ".2f", "x"), _fmt(r.error, ".2e"),
                          _fmt(r.bound, ".2e")])  # fmt: skip
        header = ["shape", "path", "ran", "forward ms", "fp32 ms (paired)", "vs fp32", "device ms",
                  "device vs fp32", "max rel error", "bound"]  # fmt: skip
        out["precision"] = (header, cells)
    scaling = _of(rows, ScalingRow)
    if scaling:
        cells = []
        for sc in sorted(scaling, key=lambda x: (x.strategy, x.data, x.world)):
            flag = speedup_flag(sc.speedup, sc.world)
            mark = " (implausible)" if flag else ""
            note = "; ".join(n for n in (sc.note, flag) if n) or "-"
            cells.append([sc.strategy, sc.data, sc.backend, str(sc.world), _fmt(sc.throughput, ".4g"),
                          f"{sc.speedup:.2f}x{mark}", _fmt(None if sc.efficiency is None else 100 * sc.efficiency,
                                                          ".0f", f"%{mark}"),
                          _fmt(sc.vs_plain, ".2f", "x"), _fmt(None if sc.comm_share is None else 100 * sc.comm_share,
                                                             ".0f", "%"), sc.model, note])  # fmt: skip
        header = ["strategy", "data", "backend", "ranks", "steps/s", "speedup", "efficiency", "vs plain", "comm",
                  "model", "note"]  # fmt: skip
        out["scaling"] = (header, cells)
    return out


def notes(rows: Sequence[WorkloadRow]) -> dict[str, list[str]]:
    """Per kind, what a reader must know to read the figures right (how they were measured, what differs)."""
    out: dict[str, list[str]] = defaultdict(list)
    precision = _of(rows, PrecisionRow)
    if precision:
        ref = precision[0].fp32_path or "the fp32 path"
        out["precision"].append(
            f"forward ms: median of 15 forward calls without autograd, each path timed in alternation with {ref} "
            "on the same inputs (fp32 ms); vs fp32 is the ratio of that pair. Device ms: CUDA-graph replay."
        )
        if any(r.path.startswith("onnxruntime") for r in precision):
            out["precision"].append(
                "onnxruntime-* rows: the path and the fp32 path timed one after the other, not in alternation "
                "(ONNX Runtime's thread pool and torch's OpenMP threads slow each other when alternated in one "
                "process); the rows are for inference specs (-eval), ONNX Runtime having no backward pass."
            )
    overhead = _of(rows, OverheadRow)
    if overhead:
        out["overhead"] += _overhead_notes(overhead)
    for kind in KINDS:
        mine = [r for r in rows if r.kind == kind]
        if not mine:
            continue
        shared = max(mine, key=lambda r: r.workers)
        if shared.workers > 1:
            out[kind].append(
                f"measured under pytest-xdist: {shared.workers} workers on {shared.cores} cores ran tests "
                "at the same time, so these times include their contention and differ from a serial run "
                "(run without -n for figures to compare)."
            )
    return dict(out)


#: a strong-scaling speed-up more than this many times the ideal (the rank count) is not a scaling result
SUPERLINEAR_LIMIT = 1.25


def speedup_flag(speedup: float | None, world: int) -> str:
    """Why a speed-up over one rank cannot be a scaling result, or "" when it can be one. A few percent above
    the ideal happen (caches, smaller per-rank working sets); more than :data:`SUPERLINEAR_LIMIT` times the rank
    count means the one-rank reference was slowed (oversubscribed threads, another job), e.g. 39.4x on 2 ranks."""
    if speedup is None:
        return ""
    if not math.isfinite(speedup) or speedup <= 0:
        return f"implausible: a speedup of {speedup} is not a measurement"
    if world >= 1 and speedup > SUPERLINEAR_LIMIT * world:
        return (f"implausible: {speedup:.3g}x on {world} rank{'s' if world != 1 else ''} is more than "
                f"{SUPERLINEAR_LIMIT:g} x the ideal {world}x; the one-rank reference ran slowed (oversubscribed "
                "cores, other work), so this is not a scaling figure")  # fmt: skip
    return ""


def _overhead_notes(rows: list[OverheadRow]) -> list[str]:
    lines = ["call ms and aten op ms: median of 15 calls each, the module and the op timed in alternation."]
    below = [r for r in rows if r.below_raw]
    if below:
        names = ", ".join(f"{r.framework} {r.shape} {r.ratio:.2f}x" for r in below[:6])
        lines.append(
            f"below 1x ({len(below)} row{'s' if len(below) != 1 else ''}: {names}): the call measured faster than its "
            "raw cost, a negative overhead that a call doing the raw work cannot have. Read it as no measurable "
            "overhead within the timing noise, or (where the ran column differs from the raw op's) a different "
            "kernel; the plot marks these points with an open triangle."
        )
    if any(r.framework.startswith(("torch-compile", "onnx")) for r in rows):
        lines.append(
            "torch-compile-* and onnxruntime-* rows: median of 15 synchronised forward calls in the test process, "
            "after the path's warm-up (compiling and exporting are not timed); ONNX Runtime's call includes its "
            "copies from and to host arrays. A torch.compile row that ran the eager kernel (Dynamo graph-breaks "
            "on the layer) measures what compiling adds around it: guard checks, the graph break, no CUDA graph."
        )
    if any(r.framework.startswith("keras") for r in rows):
        lines.append(
            "Keras rows: the call is timed inside the backend's worker process (15 synchronised calls after 3 "
            "warm-up calls, no pipe round trip in the figure); the raw cost is the torch layer's, measured in the "
            "test process."
        )
    torch_ran = {r.shape: r.ran for r in rows if r.framework == "torch"}
    differ: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    for r in rows:
        raw = torch_ran.get(r.shape, "")
        if r.framework != "torch" and raw and r.ran.split("/")[0] != raw.split("/")[0]:
            differ[(r.framework, r.ran, raw)].append(r.shape)
    for (framework, ran, raw), shapes in sorted(differ.items()):
        why = {
            "keras-torch": " (Keras on the torch backend calls torch's fused kernel only on CUDA; on the CPU it runs "
            "its own step loop)",
            "keras-jax": " (Keras on JAX runs an XLA-compiled loop, and cuDNN only for an LSTM on a GPU)",
        }.get(framework, "")
        lines.append(
            f"{framework} ran {ran} ({', '.join(shapes)}) where the raw cost is torch's {raw} op: its call/raw "
            f"includes the difference of kernels, not only framework overhead{why}."
        )
    return lines


TITLES = {
    "bucketing": "padding vs packing vs bucketing (training epoch)",
    "crossover": "CPU/GPU crossover (forward)",
    "overhead": "framework overhead against the raw cost: a CUDA-graph replay of the cuDNN call on a GPU, the ATen "
    "op on the CPU (forward)",
    "precision": "precision: speed and error side by side (forward)",
    "scaling": "scale-out training: throughput per number of ranks (speedup over one rank of the same strategy; "
    "vs plain: over plain single-device training of the same batch)",
}


def write_workload_report(out: Path, rows: Sequence[WorkloadRow]) -> Path:
    """``workloads.md`` with the tables, the crossover plots the suite wrote, and a bucketing bar chart."""
    out.mkdir(parents=True, exist_ok=True)
    lines = ["# Seed workloads", ""]
    remarks = notes(rows)
    plotters: dict[str, Callable[[Path, Sequence[WorkloadRow]], Path | None]] = {
        "bucketing": lambda o, rs: plot_bucketing(o, _of(rs, BucketingRow)),
        "scaling": lambda o, rs: plot_scaling(o, _of(rs, ScalingRow)),
        "overhead": lambda o, rs: plot_overhead(o, _of(rs, OverheadRow)),
        "precision": lambda o, rs: plot_precision(o, _of(rs, PrecisionRow)),
    }
    for kind, (header, cells) in sections(rows).items():
        lines += [f"## {TITLES[kind]}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(r) + " |" for r in cells]
        lines.append("")
        lines += [f"* {remark}" for remark in remarks.get(kind, [])] + ([""] if remarks.get(kind) else [])
        plotter = plotters.get(kind)
        if plotter:
            png = plotter(out, rows)
            if png:
                lines += [f"![{TITLES[kind]}]({png.name})", ""]
        if kind == "crossover":
            for c in _of(rows, CrossoverRow):
                if c.plot:
                    lines += [f"![crossover {c.shape}]({Path(c.plot).name})", ""]
    path = out / "workloads.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    (out / "workloads.json").write_text(json.dumps([row_to_json(r) for r in rows], indent=1), encoding="utf-8")
    link_pages(out)  # the folder's index links this page and shows its plots
    return path


def _pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend (reports are written on headless CI runners)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt: Any, fig: Any, path: Path) -> Path:
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_bucketing(out: Path, rows: Sequence[BucketingRow]) -> Path | None:
    plt = _pyplot()

    workloads = sorted({r.workload for r in rows})
    if not workloads:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.6))
    width = 0.25
    for i, mode in enumerate(("padded", "packed", "bucketed")):
        ratios = [next((r.work_ratio for r in rows if r.workload == w and r.mode == mode), 0.0) for w in workloads]
        times = [next((r.seconds or 0.0 for r in rows if r.workload == w and r.mode == mode), 0.0) for w in workloads]
        xs = [x + (i - 1) * width for x in range(len(workloads))]
        axes[0].bar(xs, ratios, width, label=mode)
        axes[1].bar(xs, [t * 1e3 for t in times], width, label=mode)
    for ax, label in ((axes[0], "computed steps / ideal steps"), (axes[1], "training epoch (ms)")):
        ax.set_xticks(range(len(workloads)))
        ax.set_xticklabels(workloads, fontsize=7)
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    axes[0].set_title("padded work (1 = no padding)", fontsize=9)
    axes[1].set_title("time of one training epoch", fontsize=9)
    _titled(fig, "padding vs packing vs bucketing: one training epoch per dataset", rows)
    fig.tight_layout()
    return _save(plt, fig, out / "bucketing.png")


def plot_scaling(out: Path, rows: Sequence[ScalingRow]) -> Path | None:
    """Speedup against the number of ranks per strategy and data, with the ideal line; and throughput over
    plain single-device training of the same batch (above 1: the GPUs paid off)."""
    plt = _pyplot()

    if not rows:
        return None
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 5.4))
    worlds = sorted({r.world for r in rows})
    ax.plot(worlds, worlds, linestyle="--", color="grey", label="ideal")
    ax2.axhline(1.0, linestyle="--", color="grey", label="plain single device")
    flagged = False
    for strategy, data in sorted({(r.strategy, r.data) for r in rows}):
        mine = sorted((r for r in rows if r.strategy == strategy and r.data == data), key=lambda r: r.world)
        label = f"{strategy}, {data}"
        line = ax.plot([r.world for r in mine], [r.speedup for r in mine], marker="o", label=label)
        bad = [(r.world, r.speedup) for r in mine if speedup_flag(r.speedup, r.world)]
        if bad:
            ax.scatter(*zip(*bad, strict=True), marker="x", s=120, color="red", zorder=5)
            flagged = True
        plain = [(r.world, r.vs_plain) for r in mine if r.vs_plain]
        if plain:
            ax2.plot(*zip(*plain, strict=True), marker="o", color=line[0].get_color(), label=label)
    if flagged:
        ax.scatter([], [], marker="x", s=120, color="red",
                   label=f"implausible: > {SUPERLINEAR_LIMIT:g} x ideal\n(slowed one-rank reference)")  # fmt: skip
    ax.set_ylabel("speedup over one rank of the same strategy")
    ax2.set_ylabel("throughput / plain single-device training")
    for a in (ax, ax2):
        a.set_xlabel("ranks (GPUs, or CPU processes with gloo)")
        a.set_xticks(worlds)
        a.grid(True, alpha=0.3)
        a.legend(fontsize=7)
    ax.set_title("speedup (strong scaling)", fontsize=9)
    ax2.set_title("against plain single-device training", fontsize=9)
    backends = ", ".join(sorted({r.backend for r in rows if r.backend}))
    fig.suptitle("scale-out training: throughput per number of ranks" + (f" ({backends})" if backends else "")
                 + (f"\n{_device_of(rows)}" if _device_of(rows) else ""), fontsize=10)  # fmt: skip
    fig.tight_layout()
    return _save(plt, fig, out / "scaling.png")


#: the overhead plot names each shape on its x axis up to this many shapes; beyond, it plots against the raw cost
NAMED_SHAPES = 8


def _device_of(rows: Sequence[WorkloadRow]) -> str:
    """The device the rows were measured on, for a plot's title ("" when the rows do not say)."""
    named = (r.hardware or (r.device if isinstance(r, (BucketingRow, OverheadRow)) else "") for r in rows)
    return ", ".join(sorted({name for name in named if name}))


def _titled(fig: Any, title: str, rows: Sequence[WorkloadRow]) -> None:
    device = _device_of(rows)
    fig.suptitle(title + (f"\n{device}" if device else ""), fontsize=10)


def plot_overhead(out: Path, rows: Sequence[OverheadRow]) -> Path | None:
    """Each framework's forward call time over the raw cost (1x = no overhead), log scale.

    Up to :data:`NAMED_SHAPES` shapes: one column per shape, ordered by raw cost and named with it, the
    frameworks side by side in each column (every framework of a shape shares its raw cost, so points placed
    by raw cost would sit on one another). More shapes: the ratio against the raw cost, unlabelled points (the
    overhead falls as the device work grows); the table beside the plot names them."""
    plt = _pyplot()

    drawn = [r for r in rows if r.raw_s and r.ratio]
    if not drawn:
        return None
    frameworks = sorted({r.framework for r in drawn}, key=lambda f: (f != "torch", f))
    colors = {name: f"C{i % 10}" for i, name in enumerate(frameworks)}
    raw: dict[str, list[float]] = defaultdict(list)
    for r in drawn:
        raw[r.shape].append(r.raw_s or 0.0)
    shapes = sorted(raw, key=lambda shape: (sorted(raw[shape])[len(raw[shape]) // 2], shape))
    on_gpu = any(r.graph_s for r in drawn)
    raw_name = "CUDA-graph replay of the cuDNN call" if on_gpu else "ATen op"
    named = len(shapes) <= NAMED_SHAPES
    fig, ax = plt.subplots(figsize=(max(8.0, 1.25 * len(shapes) + 3.5) if named else 8.0, 5.2))
    markers = {"lstm": "o", "gru": "s"}
    if named:
        width = 0.6 / max(len(frameworks), 1)
        for i, framework in enumerate(frameworks):
            mine = [r for r in drawn if r.framework == framework]
            xs = [shapes.index(r.shape) + (i - (len(frameworks) - 1) / 2) * width for r in mine]
            ax.scatter(xs, [r.ratio for r in mine], color=colors[framework], s=36, alpha=0.85, label=framework)
            _mark_below_raw(ax, xs, mine)
        ax.set_xticks(range(len(shapes)))
        ax.set_xticklabels(
            [f"{shape}\nraw {statistics.median(raw[shape]) * 1e3:.3g} ms" for shape in shapes], fontsize=7
        )
        ax.set_xlim(-0.6, len(shapes) - 0.4)
        ax.set_xlabel(f"shape, by raw cost ({raw_name})")
    else:
        for framework in frameworks:
            mine = [r for r in drawn if r.framework == framework]
            for cell in sorted({r.shape.split("-")[0] for r in mine}):
                pts = [r for r in mine if r.shape.startswith(cell + "-")]
                xs = [(r.raw_s or 0.0) * 1e3 for r in pts]
                ax.scatter(xs, [r.ratio for r in pts], color=colors[framework], marker=markers.get(cell, "o"), s=30,
                           alpha=0.8, label=f"{framework} ({cell})")  # fmt: skip
                _mark_below_raw(ax, xs, pts)
        plain_log_scale(ax, "x")
        ax.margins(x=0.08, y=0.08)
        ax.set_xlabel(f"raw cost, ms ({raw_name})")
    ax.axhline(1.0, color="grey", linestyle="--", label="1x: no overhead")
    if any(r.below_raw for r in drawn):
        ax.scatter([], [], marker="v", s=90, facecolors="none", edgecolors="red",
                   label="below 1x: faster than raw,\nnot an overhead (noise)")  # fmt: skip
    plain_log_scale(ax, "y", suffix="x")
    low, high = ax.get_ylim()
    ax.set_ylim(min(low, 0.8), high)  # the 1x line is always in view
    ax.set_ylabel("forward call time / raw cost")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, title="framework",
              title_fontsize=8)  # fmt: skip
    _titled(fig, "framework overhead (forward): call time over the raw cost", drawn)
    fig.tight_layout()
    return _save(plt, fig, out / "overhead.png")


def _mark_below_raw(ax: Any, xs: list[float], rows: list[OverheadRow]) -> None:
    """An open red triangle around each point below 1x (a negative overhead: :attr:`.OverheadRow.below_raw`)."""
    flagged = [(x, r.ratio) for x, r in zip(xs, rows, strict=True) if r.below_raw]
    if flagged:
        ax.scatter(*zip(*flagged, strict=True), marker="v", s=90, facecolors="none", edgecolors="red", zorder=5)


def plot_precision(out: Path, rows: Sequence[PrecisionRow]) -> Path | None:
    """Per shape, forward time against error for every precision path (what precision buys and costs); the
    legend below the panels, so that it takes no width from them."""
    plt = _pyplot()
    shapes = sorted({r.shape for r in rows})
    if not shapes:
        return None
    paths = sorted({r.path for r in rows})
    ncol = 1 if len(shapes) == 1 else 2
    legend_rows = math.ceil(len(paths) / ncol) + 1  # + the legend's title
    height = 4.7 + 0.22 * legend_rows
    fig, axes = plt.subplots(1, len(shapes), figsize=(max(6.5, 4.8 * len(shapes)), height), squeeze=False)
    colors = {name: f"C{i % 10}" for i, name in enumerate(paths)}
    labelled: set[str] = set()
    for ax, shape in zip(axes[0], shapes, strict=True):
        for r in (r for r in rows if r.shape == shape):
            seconds = r.device_s or r.seconds  # the device cost where a GPU measured it
            if not seconds or not r.error:
                continue
            label = f"{r.path} (ran {r.observed})"
            ax.scatter(seconds * 1e3, r.error, s=50, color=colors[r.path], alpha=0.8,
                       marker="o" if r.kernel_ok else "X",
                       label=None if label in labelled else label)  # fmt: skip
            labelled.add(label)
        ax.set_yscale("log")
        plain_log_scale(ax, "x")
        ax.margins(x=0.2, y=0.2)
        on_gpu = any(r.device_s for r in rows if r.shape == shape)
        ax.set_xlabel("forward ms, device time (CUDA-graph replay)" if on_gpu else "forward ms per call")
        ax.set_ylabel("max relative error vs float64")
        ax.set_title(shape, fontsize=9)
        ax.grid(True, which="both", alpha=0.25)
    fig.legend(loc="lower center", ncol=ncol, fontsize=8, frameon=False,
               title="path (X: not the claimed kernel/precision)", title_fontsize=8)  # fmt: skip
    _titled(fig, "precision (forward): time per call against error", rows)
    fig.tight_layout(rect=(0, (0.25 + 0.2 * legend_rows) / height, 1, 1))
    return _save(plt, fig, out / "precision.png")
