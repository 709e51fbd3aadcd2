"""Figures printed as results are plausible or flagged: a positive ratio is never printed as zero, a ratio that
cannot be one is refused, a cell-loop slowdown the layer cannot have is not printed as a result, and the speed
report's baseline plot says what it plots and shows its row labels whole."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from plot_checks import figure_problems

from pytest_lstmperf.ratios import ImplausibleRatio, format_ratio
from pytest_lstmperf.speed.records import BaselineEntry, entries_from_benchmark_json

ROOT = Path(__file__).resolve().parents[1]


def test_a_positive_ratio_is_never_printed_as_zero() -> None:
    assert format_ratio(2.345) == "2.3x" and format_ratio(1.2345, 2) == "1.23x"
    assert format_ratio(0.0188) == "0.019x"  # the cell loop's 9.12 ms / 484 ms, once printed as "0.0x"
    assert format_ratio(0.004, 2) == "0.004x" and format_ratio(1e-5) == "0.000010x"
    for value in (0.0188, 0.04, 1e-5, 3e-9):
        printed = format_ratio(value)
        assert float(printed[:-1]) > 0 and math.isclose(float(printed[:-1]), value, rel_tol=0.3), printed


@pytest.mark.parametrize("value", [0.0, -0.5, float("nan"), float("inf"), None, "2"])
def test_a_ratio_that_cannot_be_one_is_refused(value) -> None:
    with pytest.raises(ImplausibleRatio, match="ratio"):
        format_ratio(value)


def test_the_speed_tables_speed_up_column_flags_a_time_that_is_not_positive() -> None:
    from pytest_lstmperf.speed.records import BenchRecord
    from pytest_lstmperf.speed.report import timing_cells

    def record(per_call: float) -> BenchRecord:
        return BenchRecord("t", extra_info={"time_per_call_s": per_call, "kernel": "onednn", "precision": "fp32"})

    assert timing_cells(record(1e-3), 4e-3)[3] == "4.00x"
    assert timing_cells(record(1e-3), 4e-6)[3] == "0.004x"  # not "0.00x"
    assert timing_cells(record(-1e-3), 4e-3)[3].startswith("invalid (ratio -4.0")


@pytest.fixture
def cell_report(monkeypatch: pytest.MonkeyPatch):
    """``build_report`` of one nn.GRUCell row with ``--run``, the measurement replaced by the given ones."""
    from pytest_lstmperf.device import resolve_device
    from pytest_lstmperf.model.spec import LayerSpec
    from pytest_lstmperf.observation import eligibility
    from pytest_lstmperf.observation.model_configs import CELL_FRAMEWORK

    def report(*measured: tuple[float, float]) -> tuple[object, list]:
        calls: list = []

        def fake(spec, device, repeats=7):
            loop, whole = measured[min(len(calls), len(measured) - 1)]
            calls.append(spec)
            return "cpu-native/fp32", loop / whole, (loop, whole)

        monkeypatch.setattr(eligibility, "measure_cell_loop", fake)
        spec = LayerSpec(cell="gru", input_size=8, hidden_size=16, batch=4, seq_len=10)
        rows = eligibility.build_report([(CELL_FRAMEWORK, spec, None)], resolve_device("cpu", "--device"), run=True,
                                        prepare=lambda *a: None)  # fmt: skip
        return rows[0], calls

    return report


def test_a_cell_loop_faster_than_its_layer_is_not_printed_as_a_result(cell_report) -> None:
    from pytest_lstmperf.observation.eligibility import render_table

    row, calls = cell_report((9.12e-3, 0.484))  # planted: the measurement, twice
    assert len(calls) == 2
    assert row.slowdown == "?" and "0.0x" not in render_table([row])
    assert row.slowdown_source.startswith("not a result, measured twice here")
    assert "9.12 ms vs nn.GRU on the same weights 484 ms, 0.019x" in row.slowdown_source
    assert "disturbed" in row.slowdown_source


def test_a_disturbed_cell_loop_measurement_is_taken_again(cell_report) -> None:
    row, calls = cell_report((9.12e-3, 0.484), (31.3e-3, 13.6e-3))
    assert len(calls) == 2 and row.slowdown == "2.3x"
    assert row.slowdown_source.endswith("31.3 ms vs nn.GRU on the same weights 13.6 ms")
    row, calls = cell_report((31.3e-3, 13.6e-3))
    assert len(calls) == 1 and row.slowdown == "2.3x"


def _h100_entries() -> list[BaselineEntry]:
    data = json.loads((ROOT / "baselines" / "NVIDIA_H100_80GB_HBM3-cc9.0.json").read_text(encoding="utf-8"))
    return entries_from_benchmark_json(data)


def _first_ink_column(png: Path) -> int:
    import matplotlib.image as mpimg

    grey = mpimg.imread(png)[..., :3].mean(axis=2)
    return int((grey < 0.6).any(axis=0).argmax())


def test_the_baseline_plot_shows_its_longest_row_labels_whole(
    drawn: list, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_lstmperf.speed import report_plots

    entries = _h100_entries()  # 74 rows, the longest inference[torch-compile-reduce-overhead-...]
    records = [e.as_record() for e in entries]
    png = report_plots.plot_baseline(tmp_path, records, entries)
    assert png is not None and _first_ink_column(png) > 5
    (fig,) = drawn
    assert figure_problems(fig) == []
    assert fig.axes[0].get_xlabel() == "now / baseline of: median time per call (raw)"

    # planted: the layout that cut the labels (measured at 100 dpi, saved at 110); the check above sees it
    def measured_at_another_dpi(fig, ax, height) -> None:
        fig.set_dpi(100)
        fig.tight_layout()
        fig.set_dpi(110)

    monkeypatch.setattr(report_plots, "_fit_row_labels", measured_at_another_dpi)
    png = report_plots.plot_baseline(tmp_path, records, entries)
    assert png is not None and _first_ink_column(png) == 0


def test_the_baseline_plot_says_which_figure_decided() -> None:
    from pytest_lstmperf.speed.report_plots import baseline_axis_label

    assert baseline_axis_label([("per-call", "anchored")]) == "now / baseline of: time per call / anchor's"
    assert (
        baseline_axis_label([("device", "anchored"), ("per-call", "raw")], undecided=True)
        == "now / baseline of: device time / anchor's, time per call (raw), median time per call (raw)"
    )


def test_a_cpu_device_reads_one_thread_and_many_threads_in_words() -> None:
    """The header and the speed section describe the CPU with its fixed thread count: "1 thread" by default (the
    count the plugin sets), "16 threads" where --lstmperf-threads says so."""
    from pytest_lstmperf.device import DeviceInfo, threads_text

    assert threads_text("1") == "1 thread" and threads_text(16) == "16 threads" and threads_text("?") == "? threads"
    one = DeviceInfo("cpu", None, {"cpu": "AMD EPYC", "threads": "1", "onednn": "yes", "torch": "2.13.0"})
    assert one.describe() == "cpu (AMD EPYC, 1 thread, oneDNN yes, torch 2.13.0)"
