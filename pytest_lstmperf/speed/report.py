"""The speed report: a markdown and an HTML page with PNG plots (matplotlib, Agg backend).

Written by ``--lstmperf-report=DIR`` at the end of a run, or from saved results::

    python -m pytest_lstmperf.speed.report OUTDIR results.json [more.json ...]

where each file is pytest-benchmark JSON written by this plugin (``--benchmark-json``, a baseline file).
Several files can be combined, e.g. a CPU run and a GPU run of the batch sweep, which draws the CPU/GPU
crossover. Plots (:mod:`.report_plots`): time per call against batch size (crossover marked), sequence length
and hidden size, one line per path and device; and baseline against now when a baseline was compared.
"""

from __future__ import annotations

import argparse
import html
import json
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

from ..meters import format_seconds
from ..ratios import ImplausibleRatio, format_ratio
from .gate_table import TABLE_HEADER, table_rows
from .policy import GateResult
from .records import (
    BaselineEntry,
    BenchRecord,
    device_key_of,
    entries_from_benchmark_json,
    records_from_benchmark_json,
)
from .report_plots import PLOT_TITLES, plot_baseline, plot_sweep
from .timing import PEAK_METHOD

SWEEPS = (
    ("batch", "batch", "batch size"),
    ("seq", "seq_len", "sequence length"),
    ("hidden", "hidden_size", "hidden size"),
)


def _fmt(value: float | None) -> str:
    return format_seconds(value)


#: the fixed reference of the "vs generic" column per device kind: the torch layer on its generic kernel
GENERIC_REFERENCE = {"cpu": "torch-cpu-native", "cuda": "torch-cuda-generic"}


def by_case(records: Iterable[BenchRecord], device: bool = False) -> list[tuple[tuple[str, ...], list[BenchRecord]]]:
    """Records grouped by the case they measured (mode and shape, and the device with ``device``), sorted, each
    group's records sorted by path."""
    groups: dict[tuple[str, ...], list[BenchRecord]] = defaultdict(list)
    for record in records:
        key = (record.mode, shape_of(record), *((record.device,) if device else ()))
        groups[key].append(record)
    return [(key, sorted(group, key=lambda r: (r.path, r.name))) for key, group in sorted(groups.items())]


def generic_reference(group: Iterable[BenchRecord]) -> float | None:
    """Time per call of :data:`GENERIC_REFERENCE`'s path among ``group`` (records of one mode and shape),
    whatever order the records arrived in (pytest-xdist workers report in any order); None without it."""
    for record in group:
        kind = record.device.split(":")[0]
        if record.path == GENERIC_REFERENCE.get(kind) and record.time_per_call_s:
            return float(record.time_per_call_s)
    return None


def shape_of(record: BenchRecord) -> str:
    """The shape column of a record: the suite's shape id, or for a user's own benchmark (which has no shape of
    the suite's) the benchmark's test name, so that two user benchmarks with the same label stay told apart."""
    shape = record.shape or "-"
    if shape == "-" and record.path == "user":
        return record.name or record.fullname or "-"
    return shape


def peak_cell(record: BenchRecord) -> str:
    """The ``% of measured peak`` cell: achieved FLOP/s over the GEMM peak measured in the same process.

    ``-`` where no FLOP count or peak was recorded; ``n/a under -n`` for a record timed under pytest-xdist (the
    peak GEMM then ran while other workers shared the cores, so the share means nothing); ``>100%: unreliable``
    where the share cannot be one. :func:`peak_notes` explains both."""
    fraction = record.peak_fraction
    if fraction is None:
        return "-"
    if record.timed_by:
        return "n/a under -n"
    if fraction > 1.0:
        return ">100%: unreliable"
    return f"{fraction:.1%}"


def peak_notes(records: Iterable[BenchRecord]) -> list[str]:
    """What a reader must know about the ``%peak`` cells :func:`peak_cell` did not print as a share."""
    records = list(records)
    notes = []
    shared = [r for r in records if r.peak_fraction is not None and r.timed_by]
    if shared:
        notes.append(
            f"%peak not shown for {len(shared)} benchmark(s) timed under pytest-xdist (n/a under -n): the peak GEMM "
            "was measured while other workers used the same cores, so it comes out low and the shares high; run "
            "without -n to see them"
        )
    over = [r for r in records if (r.peak_fraction or 0) > 1.0 and not r.timed_by]
    if over:
        names = ", ".join(r.name for r in over[:5]) + (f" and {len(over) - 5} more" if len(over) > 5 else "")
        notes.append(
            f"%peak over 100% for {len(over)} benchmark(s) ({names}): more FLOP/s than the peak GEMM measured "
            "in this process, so the peak was measured low (another process was busy on the machine while it "
            "ran) or the benchmark's time misses work it did (its FLOP count is in extra_info.flops). Run again "
            "on a quiet machine; if it stays, the timing of that path is wrong"
        )
    return notes


def path_cell(record: BenchRecord) -> str:
    """The path column of a timing table: the execution path, or for a user's benchmark (path ``user``) the test
    file it belongs to (the test's name is its shape cell), so that two users' benchmarks of one name in different
    files are told apart."""
    if record.path == "user" and record.fullname:
        return f"user:{record.fullname.split('::')[0]}"
    return record.path


def timing_cells(record: BenchRecord, reference: float | None) -> tuple[str, str, str, str, str, str]:
    """One benchmark record's timing columns, as the terminal summary and the report print them: time per call,
    device time, host share, speed-up over the generic path (``reference``: its time per call), kernel/precision
    and the share of the measured peak."""
    per_call = record.time_per_call_s
    host = record.host_overhead
    return (
        _fmt(per_call),
        _fmt(record.device_time_s),
        "-" if host is None else f"{host:.0%}",
        _speedup(reference, per_call),
        f"{record.kernel or '?'}/{record.precision or '?'}",
        peak_cell(record),
    )


def _speedup(reference: float | None, per_call: float | None) -> str:
    if not (reference and per_call):
        return "-"
    try:
        return format_ratio(reference / per_call, 2)
    except ImplausibleRatio as exc:  # a time that is not positive: shown as what it is, never as a speed-up
        return f"invalid ({exc})"


def _table(records: list[BenchRecord]) -> tuple[list[str], list[list[str]]]:
    header = [
        "mode",
        "shape",
        "path",
        "device",
        "per call",
        "device time",
        "host share",
        "vs generic (torch)",
        "kernel",
        "GFLOP/s",
        "% of measured peak",
    ]
    rows = []
    for (mode, shape, device), group in by_case(records, device=True):
        reference = generic_reference(group)
        for record in group:
            *times, peak = timing_cells(record, reference)
            flops = record.flops_per_s
            gflops = "-" if not flops else f"{flops / 1e9:.1f}"
            rows.append([mode, shape, path_cell(record), device, *times, gflops, peak])
    return header, rows


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def write_report(
    out: Path,
    records: list[BenchRecord],
    baseline: list[BaselineEntry] | None = None,
    device: str = "",
    gate: GateResult | None = None,
) -> Path:
    """Write ``index.md``, ``index.html`` and the PNG plots into ``out``; returns the HTML page's path."""
    out.mkdir(parents=True, exist_ok=True)
    records = [r for r in records if r.time_per_call_s]
    plots = [p for p in (plot_sweep(out, records, s, f, label) for s, f, label in SWEEPS) if p is not None]
    if baseline:
        compared = plot_baseline(out, records, baseline, gate)
        if compared is not None:
            plots.append(compared)
    header, rows = _table(records)
    gate_header = list(TABLE_HEADER)
    gate_rows = [list(row) for row in table_rows(gate.decisions)] if gate is not None else []
    title = "LSTM/GRU speed report"
    md = [
        f"# {title}",
        "",
        f"Device: {device or 'see the table'}",
        "",
        "## Benchmarks",
        "",
        "Time per call is host wall time around a synchronised call (what users wait for); device time is "
        "CUDA-graph replay (or CUDA events, see notes); host share = 1 - device/per call; vs generic (torch) is "
        f"the time per call of {' on the CPU, '.join(GENERIC_REFERENCE.values())} on a GPU (same mode and "
        "shape) over the row's; % of measured peak is achieved FLOP/s against the "
        f"{PEAK_METHOD} on the same device.",
        "",
        _md_table(header, rows),
        "",
    ]
    md += [f"* {note}" for note in peak_notes(records)] + ([""] if peak_notes(records) else [])
    if gate is not None and gate_rows:
        md += ["## Speed gate", "", f"{gate.summary()}", "", _md_table(gate_header, gate_rows), ""]
    if plots:
        md += ["## Plots", ""]
        for p in plots:
            md += [f"### {PLOT_TITLES.get(p.stem, p.stem)}", "", f"![{PLOT_TITLES.get(p.stem, p.stem)}]({p.name})", ""]
    md += [PAGES_START, PAGES_END, ""]
    (out / "index.md").write_text("\n".join(md), encoding="utf-8")
    body = [
        f"<h1>{title}</h1>",
        f"<p>Device: {html.escape(device or '-')}</p>",
        "<h2>Benchmarks</h2>",
        _html_table(header, rows),
    ]
    body += [f"<p>{html.escape(note)}</p>" for note in peak_notes(records)]
    if gate is not None and gate_rows:
        body += ["<h2>Speed gate</h2>", f"<p>{html.escape(gate.summary())}</p>", _html_table(gate_header, gate_rows)]
    if plots:
        body += ["<h2>Plots</h2>"]
        for p in plots:
            caption = html.escape(PLOT_TITLES.get(p.stem, p.stem))
            body += [f'<h3>{caption}</h3><p><img src="{p.name}" alt="{caption}"></p>']
    body += [PAGES_START, PAGES_END]
    style = (
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:12px}"
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}img{max-width:100%}"
    )
    page = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title><style>{style}</style>"
        f"</head><body>{''.join(body)}</body></html>"
    )
    target = out / "index.html"
    target.write_text(page, encoding="utf-8")
    link_pages(out)
    return target


#: the pages other parts of a run write into the report folder, with what they hold; linked from the index
OTHER_PAGES = {
    "workloads.md": "the seed workloads' tables and notes (padding/packing/bucketing, crossover, overhead, "
    "precision, scaling)",
}
PAGES_START, PAGES_END = "<!-- lstmperf: other pages -->", "<!-- /lstmperf: other pages -->"


def link_pages(out: Path) -> Path:
    """Link every page of :data:`OTHER_PAGES` found in ``out`` from ``index.md`` and ``index.html``, and show
    every plot of the folder that the index does not already show; written between the :data:`PAGES_START` and
    :data:`PAGES_END` markers, replaced on each call. An index that does not exist yet is started with this
    section alone (a run with workloads and no benchmark). Called by :func:`write_report` and by the workload
    report, in either order. Returns the HTML index's path."""
    import re

    md_path, html_path = out / "index.md", out / "index.html"
    title = "LSTM/GRU speed report"
    if not md_path.exists():
        md_path.write_text(f"# {title}\n\n{PAGES_START}{PAGES_END}\n", encoding="utf-8")
    if not html_path.exists():
        html_path.write_text(
            f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
            f"<style>img{{max-width:100%}}</style></head><body><h1>{title}</h1>{PAGES_START}{PAGES_END}</body></html>",
            encoding="utf-8",
        )
    md, page = md_path.read_text(encoding="utf-8"), html_path.read_text(encoding="utf-8")
    outside = _between(md, "")
    shown = set(re.findall(r"!\[[^\]]*\]\(([^)]+)\)", outside))
    pages = [(name, about) for name, about in OTHER_PAGES.items() if (out / name).exists()]
    plots = sorted(p for p in out.glob("*.png") if p.name not in shown)
    md_lines: list[str] = []
    html_parts: list[str] = []
    if pages:
        md_lines += ["## Other pages", ""] + [f"- [{name}]({name}): {about}" for name, about in pages] + [""]
        items = "".join(f'<li><a href="{html.escape(n)}">{html.escape(n)}</a>: {html.escape(a)}</li>' for n, a in pages)
        html_parts.append(f"<h2>Other pages</h2><ul>{items}</ul>")
    if plots:
        md_lines += ["## More plots", ""]
        html_parts.append("<h2>More plots</h2>")
        for p in plots:
            caption = PLOT_TITLES.get(p.stem, p.stem)
            md_lines += [f"### {caption}", "", f"![{caption}]({p.name})", ""]
            html_parts.append(
                f'<h3>{html.escape(caption)}</h3><p><img src="{p.name}" alt="{html.escape(caption)}"></p>'
            )
    md_path.write_text(_between(md, "\n" + "\n".join(md_lines) if md_lines else ""), encoding="utf-8")
    html_path.write_text(_between(page, "".join(html_parts)), encoding="utf-8")
    return html_path


def _between(text: str, section: str) -> str:
    """``text`` with what lies between the other-pages markers replaced by ``section`` (unchanged without them)."""
    head, found, rest = text.partition(PAGES_START)
    if not found:
        return text
    return head + PAGES_START + section + PAGES_END + rest.partition(PAGES_END)[2]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pytest_lstmperf.speed.report", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("out", type=Path, help="output folder")
    parser.add_argument("results", nargs="+", type=Path, help="pytest-benchmark JSON files written by this plugin")
    parser.add_argument("--baseline", type=Path, help="a baseline file to draw baseline vs now against")
    args = parser.parse_args(argv)
    records: list[BenchRecord] = []
    devices = []
    for path in args.results:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            print(f"{path}: cannot read: {exc}", file=sys.stderr)
            return 2
        records += records_from_benchmark_json(data)
        fp = device_key_of(data)
        if fp:
            devices.append(fp)
    baseline = None
    if args.baseline:
        baseline = entries_from_benchmark_json(json.loads(args.baseline.read_text(encoding="utf-8")))
    page = write_report(args.out, records, baseline, ", ".join(dict.fromkeys(devices)))
    print(page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
