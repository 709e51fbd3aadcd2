"""Every plot of the reports, drawn from data like a real run's: a title, no two labels on top of each other,
every label inside the figure and every annotation inside its axes (``plot_checks``); the report's index that
shows and links everything in its folder; the speed table's shape and %peak cells."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from plot_checks import figure_problems, titles

from pytest_lstmperf.speed import report, report_plots
from pytest_lstmperf.speed.records import BaselineEntry, BenchRecord
from pytest_lstmperf.workloads import crossover as cx
from pytest_lstmperf.workloads import report as wr
from pytest_lstmperf.workloads.rows import BucketingRow, OverheadRow, WorkloadRow, row_from_json

DATA = Path(__file__).resolve().parents[1] / "docs" / "data"
CPU = "CPU: AMD EPYC, 2 threads"


def _cpu_sweep() -> tuple[list[cx.SweepPoint], dict[str, int | None]]:
    """The four CPU paths of ``lstmperf crossover --device=cpu``, two of them winning from batch 1."""
    curves = {"torch-cpu-native": (2.0, 0.9), "torch-cpu-onednn": (1.0, 0.8), "torch-cpu-autocast-bf16": (0.9, 0.8),
              "torch-cpu-native-autocast-bf16": (3.0, 0.9)}  # fmt: skip
    points = [cx.SweepPoint(name, b, a * b**e * 1e-3, "k") for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
              for name, (a, e) in curves.items()]  # fmt: skip
    names = list(curves)
    return points, cx.crossovers(points, names[0], names[1:])


def _cpu_overhead_rows() -> list[OverheadRow]:
    """A CPU gate run's overhead rows: every framework shares each shape's raw cost (one x per shape)."""
    rows = []
    for framework, ratio in (("torch", 0.9), ("keras-torch", 36.8), ("keras-tensorflow", 4.6), ("keras-jax", 2.1),
                             ("torch-compile-cpu", 1.02), ("onnxruntime-cpu", 0.98)):  # fmt: skip
        for shape, raw in (("lstm-H64-B1-T20", 0.31e-3), ("lstm-H64-B16-T20", 0.41e-3), ("gru-H64-B1-T20", 0.30e-3),
                           ("gru-H64-B16-T20", 0.44e-3)):  # fmt: skip
            rows.append(OverheadRow(shape=shape, framework=framework, raw_s=raw, ratio=ratio, device="cpu",
                                    hardware=CPU, module_s=raw * ratio, op_s=raw, graph_s=None,
                                    host_s=raw * max(ratio - 1, 0), kernels=5, ran="onednn/fp32"))  # fmt: skip
    return rows


def _committed(kind: str, name: str) -> list[Any]:
    """A committed report's rows of one kind (``workloads.json`` as a run wrote it), read as the report reads them."""
    return [row_from_json(r) for r in json.loads((DATA / name).read_text(encoding="utf-8")) if r["kind"] == kind]


# ------------------------------------------------------------------------------------------ each plot
def test_crossover_with_two_paths_winning_from_the_same_batch(drawn: list, tmp_path: Path) -> None:
    points, marks = _cpu_sweep()
    assert marks["torch-cpu-onednn"] == marks["torch-cpu-autocast-bf16"] == 1  # the case that overlapped
    cx.plot_sweep(points, tmp_path / "c.png", "lstm-I32-H64-L1-T20, forward, against torch-cpu-native\ncpu", marks)
    (fig,) = drawn
    assert figure_problems(fig) == []
    ax = fig.axes[0]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == [
        "torch-cpu-native: the reference",
        "torch-cpu-onednn: wins from batch 1",
        "torch-cpu-autocast-bf16: wins from batch 1",
        "torch-cpu-native-autocast-bf16: never wins for good",
    ]
    assert len(ax.texts) == 0  # nothing written beside the crossover lines, where it would pile up
    assert titles(fig) and (tmp_path / "c.png").stat().st_size > 0


def test_crossover_from_a_committed_gpu_sweep(drawn: list, tmp_path: Path) -> None:
    points = cx.read_sweep_csv(DATA / "h100-crossover-lstm-I64-H256-L2-T100.csv")
    marks = cx.crossovers(points, "torch-cpu-onednn", ["torch-cudnn-default", "torch-cuda-generic"])
    cx.plot_sweep(points, tmp_path / "c.png", "lstm-I64-H256-L2-T100\ncuda:0 (" + "NVIDIA H100 80GB HBM3, " * 5, marks)
    assert figure_problems(drawn[0]) == []


def test_overhead_names_each_shape_once_and_nothing_overlaps(drawn: list, tmp_path: Path) -> None:
    rows = _cpu_overhead_rows()
    assert wr.plot_overhead(tmp_path, rows) == tmp_path / "overhead.png"
    (fig,) = drawn
    assert figure_problems(fig) == []
    assert titles(fig)[0].startswith("framework overhead") and CPU in titles(fig)[0]
    ax = fig.axes[0]
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert [t.split("\n")[0] for t in ticks] == ["gru-H64-B1-T20", "lstm-H64-B1-T20", "lstm-H64-B16-T20",
                                                 "gru-H64-B16-T20"]  # by raw cost  # fmt: skip
    assert ticks[0].endswith("raw 0.3 ms")
    assert len(ax.texts) == 0  # no point labels: the shapes are on the axis
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend[0] == "torch" and "1x: no overhead" in legend
    # torch at 0.9x and ONNX Runtime at 0.98x of their raw cost: flagged, with their own legend entry
    assert "below 1x: faster than raw,\nnot an overhead (noise)" in legend and len(legend) == 8
    low, high = ax.get_ylim()
    assert low < 1.0 < high


def test_overhead_with_many_shapes_plots_against_the_raw_cost(drawn: list, tmp_path: Path) -> None:
    rows = _committed("overhead", "h200-overhead-precision.json")
    assert len({r.shape for r in rows}) > wr.NAMED_SHAPES
    assert wr.plot_overhead(tmp_path, rows) is not None
    (fig,) = drawn
    assert figure_problems(fig) == []
    assert fig.axes[0].get_xlabel().startswith("raw cost, ms") and len(fig.axes[0].texts) == 0


def test_precision_bucketing_and_scaling_have_titles_and_read_cleanly(drawn: list, tmp_path: Path) -> None:
    precision = _committed("precision", "h200-overhead-precision.json")
    assert wr.plot_precision(tmp_path, precision) is not None
    bucketing = [BucketingRow(workload=f"{d} n=96 max=50 B=16 H=64", mode=m, work_ratio=r, wasted=1 - 1 / r,
                              seconds=s, hardware=CPU)
                 for d in ("uniform", "long-tailed")
                 for m, r, s in (("padded", 3.6, 0.026), ("packed", 1.0, 0.092), ("bucketed", 1.09, 0.15))]  # fmt: skip
    assert wr.plot_bucketing(tmp_path, bucketing) is not None
    scaling = _committed("scaling", "h200x2-scaling.json")
    assert wr.plot_scaling(tmp_path, scaling) is not None
    assert len(drawn) == 3
    expected = ("precision (forward)", "padding vs packing vs bucketing", "scale-out training")
    for fig, start in zip(drawn, expected, strict=True):
        assert titles(fig) and titles(fig)[0].startswith(start), titles(fig)
        assert figure_problems(fig) == [], start
    assert CPU in titles(drawn[1])[0]


def test_speed_report_plots_read_cleanly(drawn: list, tmp_path: Path) -> None:
    records = [BenchRecord(f"t[{p}-B{b}]", f"t[{p}-B{b}]", extra_info={
        "path": p, "device": d, "mode": "forward", "sweeps": ["batch"], "spec": {"batch": b},
        "time_per_call_s": a * 1e-3 * b**0.7})
        for p, d, a in (("torch-cpu-onednn", "cpu", 1.0), ("torch-cudnn-default", "cuda:0", 4.0))
        for b in (1, 4, 16, 64, 256)]  # fmt: skip
    assert report_plots.plot_sweep(tmp_path, records, "batch", "batch", "batch size") is not None
    baseline = [BaselineEntry(r.fullname, stats={"data": [(r.time_per_call_s or 0) * 0.8]}) for r in records]
    assert report_plots.plot_baseline(tmp_path, records, baseline) is not None
    assert len(drawn) == 2
    for fig in drawn:
        assert titles(fig)
        assert figure_problems(fig) == []


def test_the_check_sees_what_used_to_go_wrong(drawn: list) -> None:
    """The check is not blind: two rotated labels at one x overlap, a point label past the right edge leaves
    its axes, a label on the 1x line is struck through, and a figure without a title is said to have none."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([1, 2], [1, 2])
    for name in ("torch-cpu-onednn", "torch-cpu-autocast-bf16"):
        ax.annotate(f"{name} wins from batch 1", (1, 1.0), xycoords=("data", "axes fraction"), xytext=(3, -4),
                    textcoords="offset points", rotation=90, va="top", fontsize=7)  # fmt: skip
    ax.annotate("lstm-H64-B16-T20", (2, 1.5), xytext=(3, 3), textcoords="offset points")
    ax.axhline(1.2)
    ax.annotate("struck", (1.5, 1.2), va="center")
    problems = figure_problems(fig)
    assert any("wins from batch 1" in p and "overlap" in p for p in problems), problems
    assert any("'lstm-H64-B16-T20' leaves its axes" in p for p in problems), problems
    assert any("'struck' is struck through" in p for p in problems), problems
    assert any(p.startswith("no title") for p in problems), problems
    ax.set_title("titled")
    assert not any(p.startswith("no title") for p in figure_problems(fig))


# ------------------------------------------------------------------------------------------ the index
def _speed_records() -> list[BenchRecord]:
    return [BenchRecord(f"t[B{b}]", f"t[B{b}]", extra_info={
        "path": "torch-cpu-native", "device": "cpu", "mode": "forward", "sweeps": ["batch"], "spec": {"batch": b},
        "shape": f"lstm-B{b}", "time_per_call_s": 1e-3 * b, "kernel": "cpu-native", "precision": "fp32"})
        for b in (1, 4, 16)]  # fmt: skip


def _workload_rows() -> list[WorkloadRow]:
    rows: list[WorkloadRow] = list(_cpu_overhead_rows())
    rows += [BucketingRow(workload="uniform n=96", mode=m, work_ratio=r, wasted=0.1, seconds=s, buckets=8,
                          hardware=CPU)
             for m, r, s in (("padded", 1.9, 0.04), ("packed", 1.0, 0.1), ("bucketed", 1.08, 0.02))]  # fmt: skip
    return rows


@pytest.mark.parametrize("order", ["speed first", "workloads first"])
def test_index_shows_every_plot_and_links_the_workload_page(tmp_path: Path, order: str) -> None:
    writers = [lambda: report.write_report(tmp_path, _speed_records(), device="cpu"),
               lambda: wr.write_workload_report(tmp_path, _workload_rows())]  # fmt: skip
    for write in writers if order == "speed first" else writers[::-1]:
        write()
    md = (tmp_path / "index.md").read_text(encoding="utf-8")
    page = (tmp_path / "index.html").read_text(encoding="utf-8")
    assert "| forward | lstm-B1 | torch-cpu-native |" in md  # the speed table is there, whichever came first
    assert "[workloads.md](workloads.md)" in md and '<a href="workloads.md">' in page
    for png in sorted(p.name for p in tmp_path.glob("*.png")):
        assert md.count(f"]({png})") == 1, png  # each plot shown once
        assert page.count(f'src="{png}"') == 1, png
    assert {"time_vs_batch.png", "overhead.png", "bucketing.png"} <= {p.name for p in tmp_path.glob("*.png")}
    assert "### workloads: framework overhead" in md


def test_index_for_a_run_without_benchmarks(tmp_path: Path) -> None:
    wr.write_workload_report(tmp_path, _workload_rows())
    md = (tmp_path / "index.md").read_text(encoding="utf-8")
    assert md.startswith("# ") and "[workloads.md](workloads.md)" in md and "](overhead.png)" in md
    assert 'src="bucketing.png"' in (tmp_path / "index.html").read_text(encoding="utf-8")


def test_link_pages_is_idempotent(tmp_path: Path) -> None:
    wr.write_workload_report(tmp_path, _workload_rows())
    first = (tmp_path / "index.md").read_text(encoding="utf-8")
    report.link_pages(tmp_path)
    report.link_pages(tmp_path)
    assert (tmp_path / "index.md").read_text(encoding="utf-8") == first


# ------------------------------------------------------------------------------------------ table cells
def _user(name: str, label: str = "forward", file: str = "tests/test_model.py") -> BenchRecord:
    return BenchRecord(f"{file}::{name}", name, extra_info={
        "path": "user", "device": "cpu", "mode": label, "shape": "-", "time_per_call_s": 2e-3, "kernel": "onednn",
        "precision": "fp32"})  # fmt: skip


def test_user_benchmarks_are_named_by_their_test() -> None:
    from pytest_lstmperf.run_report import summary_lines

    records = [_user("test_encoder"), _user("test_decoder")]
    assert report.shape_of(records[0]) == "test_encoder"
    assert report.shape_of(_speed_records()[0]) == "lstm-B1"
    lines = summary_lines(records)
    body = [line.split() for line in lines[2:]]
    user = "user:tests/test_model.py"
    assert [row[:3] for row in body] == [["forward", "test_decoder", user], ["forward", "test_encoder", user]]
    _, rows = report._table(records)
    assert [row[1] for row in rows] == ["test_decoder", "test_encoder"]
    # one test name in two files (two examples' test_training_step_speed): the path cell tells them apart
    twins = [_user("test_training_step_speed", file=f"examples/{d}/test_x.py") for d in ("chatbot", "seq2seq")]
    cells = [line.split()[2] for line in summary_lines(twins)[2:]]
    assert cells == ["user:examples/chatbot/test_x.py", "user:examples/seq2seq/test_x.py"]


@pytest.mark.parametrize(
    ("extra", "cell"),
    [
        ({}, "-"),
        ({"peak_fraction": 0.52}, "52.0%"),
        ({"peak_fraction": 6.0}, ">100%: unreliable"),
        ({"peak_fraction": 0.3, "timed_by": "pytest-lstmperf"}, "n/a under -n"),
        ({"peak_fraction": 12.69, "timed_by": "pytest-lstmperf"}, "n/a under -n"),
    ],
)
def test_peak_cell(extra: dict, cell: str) -> None:
    assert report.peak_cell(BenchRecord("t", extra_info=extra)) == cell


def test_peak_notes_say_why_and_what_to_do() -> None:
    over = BenchRecord("t::k", "test_keras[keras-jax-cpu]", extra_info={"peak_fraction": 6.0})
    shared = BenchRecord("t::x", "test_x", extra_info={"peak_fraction": 12.69, "timed_by": "pytest-lstmperf"})
    fine = BenchRecord("t::y", "test_y", extra_info={"peak_fraction": 0.4})
    assert report.peak_notes([fine]) == []
    (note,) = report.peak_notes([over, fine])
    assert "test_keras[keras-jax-cpu]" in note and "Run again on a quiet machine" in note
    (note,) = report.peak_notes([shared])
    assert "pytest-xdist" in note and "run without -n" in note
    assert len(report.peak_notes([over, shared])) == 2


def test_terminal_notes_explain_the_peak_cells() -> None:
    from pytest_lstmperf.run_report import timing_notes

    over = BenchRecord("t::k", "test_keras[keras-jax-cpu]", extra_info={"peak_fraction": 6.0})
    fine = BenchRecord("t::y", "test_y", extra_info={"peak_fraction": 0.4})
    notes = timing_notes([over, fine])
    assert any(n.startswith("%peak over 100% for 1 benchmark(s) (test_keras[keras-jax-cpu])") for n in notes)
    assert not any("%peak" in n for n in timing_notes([fine]))
