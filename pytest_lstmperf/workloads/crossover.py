"""The CPU/GPU crossover: forward time per call of one layer shape over a sweep of batch sizes on several paths
(:func:`crossover_sweep`, the paths of each batch timed in alternation), the batch from which each GPU path beats
the CPU path (:func:`crossovers`), and the sweep's CSV read back and drawn as a log-log plot with the crossovers
marked (:func:`read_sweep_csv`, :func:`plot_sweep`). Used by the workload suite and the ``lstmperf crossover``
command; torch is imported by the paths that run, matplotlib by the function that draws.
"""

from __future__ import annotations

import csv
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .. import paths as registry
from ..model.case import make_case
from ..progress import Remaining, format_duration
from ..speed.report_plots import find_crossover, plain_log_scale
from .timing import paired_median_times


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
    paths = {name: registry.get(name) for name in path_names}
    reasons: dict[str, str | None] = {}
    for name, path in paths.items():
        device = devices.get(path.device)
        reasons[name] = "no such device" if device is None else path.available(device)
    points = []
    started = time.perf_counter()
    remaining = Remaining(batches)  # each batch's time, fitted against the batch size: the estimate of the rest
    for step, batch in enumerate(batches, 1):
        if progress is not None:
            spent = time.perf_counter() - started
            progress(
                f"batch {batch} ({step}/{len(batches)}): preparing and timing {len(paths)} paths, {repeats} "
                f"call{'s' if repeats != 1 else ''} each"
                + (f" ({format_duration(spent)} so far, {remaining.line()})" if step > 1 else "")
            )
        here = _sweep_batch(spec.replace(batch=int(batch)), paths, reasons, devices, repeats, seed)
        remaining.finished()
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
