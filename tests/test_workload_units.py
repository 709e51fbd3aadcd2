"""Bucketing generator, work ratios and the crossover finder on synthetic data; the workload suite's
checks fail when their fault is planted."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from forked_pytest import runpytest_forked
from pytester_runs import clear_inner_env

from pytest_lstmperf.speed.records import BaselineEntry, BenchRecord
from pytest_lstmperf.speed.report_plots import find_crossover
from pytest_lstmperf.workloads import crossover as cx
from pytest_lstmperf.workloads import varlen as w
from pytest_lstmperf.workloads.overhead import measure_overhead
from pytest_lstmperf.workloads.rows import (
    BucketingRow,
    OverheadRow,
    PrecisionRow,
    ScalingRow,
    WorkloadRow,
    row_from_json,
)
from pytest_lstmperf.workloads.timing import paired_median_times

pytest_plugins = ["pytester"]


# ------------------------------------------------------------------------------------------- lengths
def test_lengths_in_range_and_long_tail() -> None:
    uniform = w.draw_lengths(4000, 200, "uniform", 1)
    tail = w.draw_lengths(4000, 200, "long-tailed", 1)
    for lengths in (uniform, tail):
        assert lengths.min() >= 1 and lengths.max() <= 200 and lengths.dtype == np.int64
    assert abs(np.median(uniform) - 100) < 10
    assert np.median(tail) < 40 and np.percentile(tail, 99) > 100  # mostly short, a few long
    assert np.array_equal(w.draw_lengths(50, 20, "uniform", 3), w.draw_lengths(50, 20, "uniform", 3))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"distribution": "zipf"}, "unknown length distribution 'zipf' (valid: uniform, long-tailed)"),
    ({"count": 0}, "must be >= 1"),
])  # fmt: skip
def test_lengths_bad_input(kwargs: dict, message: str) -> None:
    args = {"count": 10, "max_len": 5, "distribution": "uniform"} | kwargs
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        w.draw_lengths(**args)


# ------------------------------------------------------------------------------------------- buckets
def _brute_force(lengths: np.ndarray, k: int) -> float:
    """Least padded work over every choice of at most k bucket bounds among the distinct lengths."""
    values = sorted(set(lengths.tolist()))
    best = float("inf")
    top = values[-1]
    for n in range(0, k):
        for inner in itertools.combinations(values[:-1], n):
            bounds = [*inner, top]
            which = np.searchsorted(bounds, lengths)
            best = min(best, float(sum(bounds[b] for b in which)))
    return best


@pytest.mark.parametrize("seed", range(6))
def test_auto_buckets_are_optimal(seed: int) -> None:
    lengths = w.draw_lengths(40, 12, "long-tailed" if seed % 2 else "uniform", seed)
    for k in (1, 2, 3):
        bounds = w.auto_buckets(lengths, k)
        assert len(bounds) <= k and bounds[-1] == lengths.max() and bounds == sorted(bounds)
        which = np.searchsorted(bounds, lengths)
        cost = float(sum(bounds[b] for b in which))
        assert cost == _brute_force(lengths, k)


def test_buckets_edge_cases() -> None:
    assert w.auto_buckets([7, 7, 7], 4) == [7]
    assert w.auto_buckets([1, 2, 3], 10) == [1, 2, 3]  # one bucket per distinct length: no padding
    assert w.auto_buckets([], 3) == []
    with pytest.raises(ValueError, match="max_buckets"):
        w.auto_buckets([1, 2], 0)


def test_bucketed_batches_cover_every_sequence_once_and_cut_work() -> None:
    lengths = w.draw_lengths(1000, 300, "long-tailed", 0)
    bounds = w.auto_buckets(lengths, 8)
    batches = w.bucketed_batches(lengths, bounds, 32)
    assert sorted(np.concatenate(batches).tolist()) == list(range(1000))
    assert all(len(b) <= 32 for b in batches)
    padded = w.work(lengths, w.padded_batches(lengths, 32))
    bucketed = w.work(lengths, batches)
    assert padded.ideal == bucketed.ideal == int(lengths.sum())
    assert bucketed.ratio < padded.ratio and bucketed.ratio < 1.3
    assert 0 <= bucketed.wasted < padded.wasted < 1
    with pytest.raises(ValueError, match="exceeds the last bucket bound"):
        w.bucketed_batches([5, 9], [6], 2)


def test_work_ratio_by_hand() -> None:
    # two batches: (2, 4) padded to 4 -> 8 steps, (1, 1) -> 2 steps; ideal 8 -> ratio 10/8, 20% wasted
    work = w.work([2, 4, 1, 1], [np.array([0, 1]), np.array([2, 3])])
    assert (work.ideal, work.padded) == (8, 10) and work.ratio == 1.25 and abs(work.wasted - 0.2) < 1e-12


# ------------------------------------------------------------------------------------------- crossover
@pytest.mark.parametrize(("cpu", "gpu", "expected"), [
    ({1: 1.0, 2: 2.0, 4: 4.0, 8: 8.0}, {1: 3.0, 2: 3.0, 4: 3.0, 8: 3.0}, 4),  # GPU flat, CPU linear
    ({1: 1.0, 2: 2.0}, {1: 0.5, 2: 0.6}, 1),  # the GPU wins at batch 1 already
    ({1: 1.0, 2: 1.0, 4: 1.0}, {1: 2.0, 2: 2.0, 4: 2.0}, None),  # never
    ({1: 1.0, 2: 2.0, 4: 4.0, 8: 8.0}, {1: 3.0, 2: 1.0, 4: 5.0, 8: 3.0}, 8),  # a noisy dip is not a crossover
    ({1: 1.0, 4: 4.0}, {2: 1.0, 8: 1.0}, None),  # no batch measured on both
])  # fmt: skip
def test_find_crossover(cpu: dict, gpu: dict, expected: int | None) -> None:
    assert find_crossover(cpu, gpu) == expected


def test_crossovers_from_points() -> None:
    points = [cx.SweepPoint("cpu", b, b * 1e-3) for b in (1, 2, 4)]
    points += [cx.SweepPoint("gpu", b, 2.5e-3) for b in (1, 2, 4)]
    points += [cx.SweepPoint("gpu2", b, None, note="unavailable") for b in (1, 2, 4)]
    assert cx.crossovers(points, "cpu", ["gpu", "gpu2"]) == {"gpu": 4, "gpu2": None}


# ------------------------------------------------------------------------------------------- runners
torch = pytest.importorskip("torch")


def test_varlen_modes_agree_with_sequences_alone() -> None:
    lengths = w.draw_lengths(24, 15, "long-tailed", 2)
    wl = w.VarLenWorkload("gru", 4, 8, lengths, 5, dtype="float64")
    reference = wl.reference()
    for mode in w.MODES:
        assert w.max_relative_error(wl.results(mode), reference) < 1e-12, mode
        wl.epoch(mode, train=True)
    assert wl.work("packed").ratio == 1.0 and wl.work("padded").ratio > wl.work("bucketed").ratio >= 1.0


def test_varlen_error_sees_a_wrong_result() -> None:
    """The equivalence check's measure is not blind: a result perturbed by 1e-3 shows up."""
    lengths = w.draw_lengths(10, 8, "uniform", 0)
    wl = w.VarLenWorkload("lstm", 3, 6, lengths, 4, dtype="float64")
    reference = wl.reference()
    result = wl.results("bucketed")
    result.outputs[3] = result.outputs[3] * (1 + 1e-3)
    assert w.max_relative_error(result, reference) > 5e-4


def test_overhead_on_cpu() -> None:
    result = measure_overhead("lstm", 8, 16, 1, 2, 5, "cpu", repeats=3)
    assert result.graph_s is None and result.raw_s == result.op_s and result.kernels > 0
    assert result.module_s > 0 and result.ratio == result.module_s / result.op_s


# ------------------------------------------------------------------------------------------- the suite
# the workload suite draws no hypothesis examples: hypothesis's plugin (about 1 s per run to import) is left out
SUITE_ARGS = ["-p", "no:cacheprovider", "--device=cpu", "-p", "no:randomly", "-p", "no:hypothesispytest",
              "--benchmark-disable"]  # fmt: skip


def _suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    from pathlib import Path

    suite = Path(__file__).resolve().parents[1] / "suites" / "test_workloads.py"
    pytester.makepyfile(test_workloads=suite.read_text())
    clear_inner_env(monkeypatch)


def test_suite_passes_and_reports(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    _suite(pytester, monkeypatch)
    result = runpytest_forked(pytester, *SUITE_ARGS, "--lstmperf-report=rep", timeout=600)
    assert result.ret == 0, result.stdout.str()
    # precision: torch-cpu-onednn, the two bf16 paths, torch-compile-cpu, onnxruntime-cpu
    # a CPU without oneDNN bf16 skips torch-cpu-autocast-bf16, the second precision test
    result.stdout.fnmatch_lines(["lstmperf workloads: precision: *(5 tests)", "test_workloads.py [.s][.s]*"])
    result.stdout.fnmatch_lines([
        "*lstmperf workloads*",
        "padding vs packing vs bucketing*",
        "*long-tailed*bucketed*",
        "CPU/GPU crossover*",
        "*torch-cpu-onednn*torch-cpu-native*",
        "framework overhead*",
        "*lstm-H64-B1-T20*keras-tensorflow*tf-generic/fp32*",
        "*lstm-H64-B1-T20*keras-torch*cpu-native/fp32*",
        "*lstm-H64-B1-T20*torch*onednn/fp32*",
        "*note: Keras rows: the call is timed inside the backend's worker process*",
        "*note: keras-torch ran cpu-native/fp32 (lstm-H64-B1-T20, *) where the raw cost is torch's onednn/fp32 op*",
        "precision: speed and error*",
        "*torch-cpu-native-autocast-bf16*cpu-native/bf16*",
        "*note: forward ms: median of 15 forward calls*in alternation with torch-cpu-onednn*",
        "*workload report written to*workloads.md*",
    ])  # fmt: skip
    written = {p.name for p in (pytester.path / "rep").iterdir()}
    assert {"workloads.md", "workloads.json", "bucketing.png", "crossover-cpu.png"} <= written
    assert {"overhead.png", "precision.png"} <= written
    index = (pytester.path / "rep" / "index.md").read_text(encoding="utf-8")  # the folder's index shows them all
    assert "[workloads.md](workloads.md)" in index and all(
        f"]({png})" in index for png in written if png.endswith(".png")
    )


@pytest.mark.parametrize(("plant", "test", "message"), [
    ("perturb:1e-3", "test_padding_packing_bucketing_agree", "*max relative error*> bound*"),
    ("onednn-off", "test_crossover", "*torch-cpu-onednn batch 1: expected onednn/fp32, observed cpu-native/fp32*"),
    ("wrong-precision", "test_precision_speed_and_error",
     ["*torch-cpu-native-autocast-bf16*", "*expected precision 'bf16', observed 'fp32'*"]),
])  # fmt: skip
def test_suite_checks_fail_when_planted(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, plant: str, test: str, message: str | list[str]
) -> None:
    _suite(pytester, monkeypatch)
    result = runpytest_forked(
        pytester,
        *SUITE_ARGS,
        "-p",
        "pytest_lstmperf.testing.faults",
        f"--lstmperf-plant={plant}",
        "-k",
        test,
        timeout=600,
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines(message if isinstance(message, list) else [message])


def test_overhead_check_fails_when_the_op_differs(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The raw op is checked to compute the module's numbers: perturbing the module breaks that check."""
    _suite(pytester, monkeypatch)
    result = runpytest_forked(pytester,
        *SUITE_ARGS, "-p", "pytest_lstmperf.testing.faults", "--lstmperf-plant=perturb:1e-3",
        "-k", "test_framework_overhead", timeout=600,
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*the raw op does not compute what the module computes*"])


def test_keras_overhead_kernel_check_fails_when_keras_leaves_its_kernel(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Keras overhead rows are checked to run the kernel their path claims: a Keras layer observed on
    another kernel (the trace the worker returns rewritten, as a layer that fell back would show) fails."""
    _suite(pytester, monkeypatch)
    pytester.makeconftest(
        """
        import dataclasses
        from pytest_lstmperf.paths.keras.paths import KerasRun

        _real = KerasRun.trace_forward

        def _fell_back(self):
            return dataclasses.replace(_real(self), family="onednn")

        KerasRun.trace_forward = _fell_back
        """
    )
    result = runpytest_forked(pytester, *SUITE_ARGS, "-k", "test_keras_overhead and B1-", timeout=600)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines([
        "*keras-torch-cpu on lstm-I64-H64*expected kernel family 'cpu-native', observed 'onednn'*",
        "*keras-tf-cpu on lstm-I64-H64*expected kernel family 'tf-generic', observed 'onednn'*",
    ])  # fmt: skip


# ------------------------------------------------------------------------------------------- figures that add up
def test_peak_share_over_100_percent_is_flagged() -> None:
    from pytest_lstmperf.speed.timing import format_peak_fraction

    assert format_peak_fraction(0.52) == "52.0%" and format_peak_fraction(None) == "-"
    assert "measurement error" in format_peak_fraction(1.315)  # a share above the peak cannot be one


def test_measured_peak_is_the_best_over_sizes_and_repeats(monkeypatch: pytest.MonkeyPatch) -> None:
    """The peak is the fastest GEMM over sizes and precisions (a disturbed sample only lowers a rate, so the
    maximum is the estimate); the sizes stop growing once a call exceeds the budget."""
    from pytest_lstmperf.speed import timing

    seconds = {(256, "float32"): 1e-3, (512, "float32"): 4e-3, (1024, "float32"): 0.2, (2048, "float32"): 1.0,
               (256, "bfloat16"): 2e-3, (512, "bfloat16"): 2e-3, (1024, "bfloat16"): 0.2}  # fmt: skip
    asked = []

    def fake(torch_: object, device: str, dtype: object, n: int) -> float:
        asked.append((n, str(dtype).split(".")[-1]))
        return seconds[asked[-1]]

    monkeypatch.setattr(timing, "_fastest_gemm", fake)
    monkeypatch.setattr(timing, "_PEAKS", {})
    assert timing.measured_peak_flops("cpu", "fp32") == 2 * 512**3 / 4e-3  # 67 GFLOP/s: 256 gave 34, 1024 11
    assert (2048, "float32") not in asked  # 1024 took 0.2 s > budget: no larger size
    asked.clear()
    # bf16: its own GEMMs and the fp32 ones are candidates; the best of all of them is the peak
    assert timing.measured_peak_flops("cpu", "bf16") == 2 * 512**3 / 2e-3
    assert {dtype for _, dtype in asked} == {"bfloat16", "float32"}
    # the CPU's budget is 10 ms: a 12 ms call at 1024 ends the CPU sizes (a GPU's budget is 50 ms)
    seconds[(1024, "float32")] = 12e-3
    asked.clear()
    monkeypatch.setattr(timing, "_PEAKS", {})
    assert timing.measured_peak_flops("cpu", "fp32") == 2 * 1024**3 / 12e-3
    assert asked == [(256, "float32"), (512, "float32"), (1024, "float32")]


def _bench_record(path: str, seconds: float, device: str = "cpu", kernel: str = "cpu-native") -> BenchRecord:
    return BenchRecord(path, path, extra_info={"path": path, "device": device, "mode": "forward", "shape": "s",
                       "time_per_call_s": seconds, "expected_kernel": kernel})  # fmt: skip


def test_vs_generic_reference_is_fixed_whatever_arrives_first() -> None:
    """Under pytest-xdist records arrive in any order: the reference stays the torch generic path."""
    from pytest_lstmperf.speed.report import _table, generic_reference

    group = [_bench_record("keras-torch-cpu-generic", 0.5), _bench_record("torch-cpu-native", 2.0),
             _bench_record("torch-cpu-onednn", 1.0, kernel="onednn")]  # fmt: skip
    assert generic_reference(group) == generic_reference(group[::-1]) == 2.0
    assert generic_reference(group[:1]) is None  # no torch generic record: no ratio, rather than another one
    header, rows = _table(group[::-1])
    ratios = {row[2]: row[header.index("vs generic (torch)")] for row in rows}
    assert ratios == {"keras-torch-cpu-generic": "4.00x", "torch-cpu-native": "1.00x", "torch-cpu-onednn": "2.00x"}


def test_paired_times_alternate_the_calls() -> None:
    order: list[str] = []
    a, b = paired_median_times([lambda: order.append("a"), lambda: order.append("b")], lambda: None, 3, 1)
    assert order == ["a", "b"] * 4 and a >= 0 and b >= 0


def _precision_row(path: str, seconds: float, fp32_s: float, workers: int = 1, observed: str = "x") -> PrecisionRow:
    return PrecisionRow(shape="s", path=path, claimed="onednn/" + ("fp32" if "bf16" not in path else "bf16"),
                        observed=observed, seconds=seconds, fp32_s=fp32_s, fp32_path="torch-cpu-onednn", device_s=None,
                        error=1e-3, bound=1e-2, workers=workers, cores=2)  # fmt: skip


def test_precision_ratio_is_the_paired_one_and_xdist_is_noted() -> None:
    """vs fp32 divides the fp32 time taken in alternation with the row, not another row's time taken at
    another moment (the 470x of a -n 2 run); rows measured under pytest-xdist carry a note."""
    from pytest_lstmperf.workloads.report import notes, sections

    rows = [_precision_row("torch-cpu-onednn", 0.149, 0.149, workers=2),
            _precision_row("torch-cpu-autocast-bf16", 0.5e-3, 0.6e-3, workers=2)]  # fmt: skip
    header, table = sections(rows)["precision"]
    speedups = {row[1]: row[header.index("vs fp32")] for row in table}
    assert speedups == {"torch-cpu-onednn": "1.00x", "torch-cpu-autocast-bf16": "1.20x"}
    remarks = " ".join(notes(rows)["precision"])
    assert "in alternation with torch-cpu-onednn" in remarks and "2 workers on 2 cores" in remarks
    assert "pytest-xdist" not in " ".join(notes([_precision_row("torch-cpu-onednn", 1, 1)])["precision"])


def test_keras_overhead_rows_say_what_their_ratio_holds() -> None:
    from pytest_lstmperf.workloads.report import notes

    base = {"kind": "overhead", "shape": "lstm-H64-B1-T20", "device": "cpu", "module_s": 1e-3, "op_s": 1e-3,
            "raw_s": 1e-3, "ratio": 1.0, "host_s": 0.0, "kernels": 4}  # fmt: skip
    rows = [row_from_json(r) for r in (
        {**base, "framework": "torch", "ran": "onednn/fp32"},
        {**base, "framework": "keras-torch", "ran": "cpu-native/fp32", "ratio": 137.47},
        {**base, "framework": "keras-tensorflow", "ran": "tf-generic/fp32"})]  # fmt: skip
    remarks = notes(rows)["overhead"]
    assert any("timed inside the backend's worker process" in r and "no pipe round trip" in r for r in remarks)
    differ = [r for r in remarks if "includes the difference of kernels" in r]
    assert len(differ) == 2  # keras-torch and keras-tensorflow, one line each
    assert any(r.startswith("keras-torch ran cpu-native/fp32 (lstm-H64-B1-T20)") and "step loop" in r for r in differ)
    assert not any("includes the difference" in r for r in notes(rows[:1]).get("overhead", []))


def test_sweep_label_drops_the_swept_batch_and_csv_round_trips(tmp_path) -> None:
    from pytest_lstmperf.cli import _write_sweep
    from pytest_lstmperf.model.spec import LayerSpec

    assert cx.sweep_label(LayerSpec(input_size=32, hidden_size=64, batch=1, seq_len=20)) == "lstm-I32-H64-L1-T20"
    points = [cx.SweepPoint("a", 1, 1e-3, "onednn/fp32"), cx.SweepPoint("b", 1, None, "failed", "OOM")]
    _write_sweep(tmp_path, points, {})
    assert cx.read_sweep_csv(tmp_path / "crossover.csv") == points


# ------------------------------------------------------------------------------------------- plots that read
def _layout_problems(fig) -> list[str]:
    """Tick labels that overlap their neighbours, titles, labels and legends outside the figure."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    page = fig.bbox
    problems = []
    for ax in fig.axes:
        for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            labels = [t for t in axis.get_ticklabels(which="both") if t.get_visible() and t.get_text()]
            boxes = [(t.get_window_extent(renderer), t.get_text()) for t in labels]
            boxes.sort(key=lambda b: b[0].x0 if name == "x" else b[0].y0)
            for (one, a), (two, b) in itertools.pairwise(boxes):
                if one.overlaps(two):
                    problems.append(f"{name} tick labels {a!r} and {b!r} overlap")
        texts = [ax.title, ax.xaxis.label, ax.yaxis.label] + ([ax.get_legend()] if ax.get_legend() else [])
        for text in texts:
            box = text.get_window_extent(renderer)
            if box.width and (box.x0 < page.x0 - 1 or box.x1 > page.x1 + 1 or box.y1 > page.y1 + 1 or box.y0 < -1):
                problems.append(f"{getattr(text, 'get_text', lambda: 'legend')()!r} leaves the figure")
    for legend in fig.legends:
        box = legend.get_window_extent(renderer)
        if box.x0 < -1 or box.x1 > page.x1 + 1 or box.y0 < -1:
            problems.append("the figure legend leaves the figure")
    return problems


def _workload_rows() -> list[WorkloadRow]:
    rows: list[WorkloadRow] = [_precision_row(p, s, 0.45e-3, observed=o)
            for p, s, o in (("torch-cpu-onednn", 0.45e-3, "onednn/fp32"), ("torch-cpu-autocast-bf16", 0.8e-3,
                            "onednn/bf16"), ("torch-cpu-native-autocast-bf16", 0.04, "cpu-native/bf16"))]  # fmt: skip
    for fw, ratio in (("torch", 0.9), ("keras-torch", 36.8), ("keras-tensorflow", 4.6)):
        for shape, raw in (("lstm-H64-B1-T20", 0.31e-3), ("lstm-H64-B16-T20", 0.41e-3)):
            rows.append(OverheadRow(shape=shape, framework=fw, raw_s=raw, ratio=ratio))
    for mode, ratio, sec in (("padded", 3.6, 0.21), ("packed", 1.0, 2.4), ("bucketed", 1.09, 0.56)):
        rows.append(BucketingRow(workload="long-tailed n=96", mode=mode, work_ratio=ratio, wasted=1 - 1 / ratio,
                                 seconds=sec))  # fmt: skip
    for world, speedup in ((1, 1.0), (2, 0.4)):
        rows.append(ScalingRow(strategy="ddp", data="fixed", world=world, speedup=speedup, vs_plain=speedup * 0.9))
    return rows


def test_every_plot_reads_cleanly(drawn: list, tmp_path) -> None:
    """Each plot of the workload report, the crossover and the speed report, drawn from data like a CPU run's
    (sub-decade and multi-decade log axes, long titles): no tick labels overlap, nothing leaves the figure,
    and the precision legend leaves the panel most of the width."""
    from pytest_lstmperf.speed import report_plots
    from pytest_lstmperf.workloads import report as wr

    rows = _workload_rows()
    for plot in (wr.plot_precision, wr.plot_overhead, wr.plot_bucketing, wr.plot_scaling):
        assert plot(tmp_path, [r for r in rows if r.kind == plot.__name__.split("_")[-1]]) is not None
    points = [cx.SweepPoint(p, b, s * b ** e * 1e-3, "k") for p, s, e in (("native", 16, 0.5), ("onednn", 0.4, 1.0))
              for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)]  # fmt: skip
    long_title = "lstm-I64-H256-L2-T100, forward, against onednn\ncuda:0 (" + "NVIDIA H100 80GB HBM3, " * 5 + ")"
    cx.plot_sweep(points, tmp_path / "c.png", long_title, cx.crossovers(points, "native", ["onednn"]))
    records = [BenchRecord(f"torch-cpu-native-B{b}", f"torch-cpu-native-B{b}", extra_info={
        "path": "torch-cpu-native", "device": "cpu", "mode": "forward", "sweeps": ["batch"], "spec": {"batch": b},
        "time_per_call_s": 1e-3 * b ** 0.7}) for b in (1, 4, 16, 64)]  # fmt: skip
    assert report_plots.plot_sweep(tmp_path, records, "batch", "batch", "batch size") is not None
    baseline = [BaselineEntry(r.fullname, stats={"data": [(r.time_per_call_s or 0) * 0.8]}) for r in records]
    assert report_plots.plot_baseline(tmp_path, records, baseline) is not None
    assert len(drawn) == 7
    problems = {i: _layout_problems(fig) for i, fig in enumerate(drawn)}
    assert not any(problems.values()), problems
    precision = drawn[0]
    assert precision.axes[0].get_position().width > 0.6  # the legend sits below, not beside the panel
    for fig in drawn:  # time and ratio axes read as plain numbers (0.5, 20), never as 5x10^-1 (mathtext)
        for ax in fig.axes:
            for axis in (ax.xaxis, ax.yaxis):
                if not axis.get_label_text().startswith("max relative error"):
                    assert not [t.get_text() for t in axis.get_ticklabels(which="both") if "$" in t.get_text()]


def test_layout_check_sees_crowded_labels_and_a_clipped_title(drawn: list, tmp_path) -> None:
    """The layout check is not blind: every minor tick of a 3-decade log axis labelled, and a title wider
    than its figure, are both reported."""
    import matplotlib.pyplot as plt
    import matplotlib.ticker as ticker

    fig, ax = plt.subplots(figsize=(4, 3))
    ax.scatter([0.2, 90], [1, 2])
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_title("x" * 200)
    problems = _layout_problems(fig)
    assert any("overlap" in p for p in problems) and any("leaves the figure" in p for p in problems)


# ------------------------------------------------------------------------------------------- the crossover command
def test_crossover_without_a_gpu_says_so_once_and_names_what_works(capsys: pytest.CaptureFixture) -> None:
    from pytest_lstmperf import cli

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the no-GPU message cannot show")
    assert cli.main(["crossover", "lstm", "input_size=8", "hidden_size=8", "seq_len=3"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs a GPU" in err[0] and "--device=cpu sweeps the CPU paths" in err[0]


@pytest.mark.parametrize(("args", "message"), [
    (["--device=tpu"], "--device=tpu: not a device for the crossover (valid: cuda, cuda:N, cpu)"),
    (["--device=cpu", "--paths=torch-cpu-native,torch-cudnn-default"],
     "--paths: torch-cudnn-default do not run with --device=cpu (they need a GPU)"),
    (["--device=cpu", "--paths=torch-cpu-native"], "need at least two paths (the first is the reference)"),
    (["--device=cpu", "--paths=torch-cpu-native,nope"], "--paths: unknown nope (valid: "),
])  # fmt: skip
def test_crossover_bad_input(capsys: pytest.CaptureFixture, args: list[str], message: str) -> None:
    from pytest_lstmperf import cli

    assert cli.main(["crossover", "lstm", "input_size=8", "hidden_size=8", "seq_len=3", *args]) == cli.EXIT_USAGE
    assert message in capsys.readouterr().err


def test_crossover_on_the_cpu_sweeps_the_cpu_paths(tmp_path, capsys: pytest.CaptureFixture) -> None:
    """The advice of the no-GPU message works: --device=cpu sweeps the CPU paths against the native kernel,
    and every point that ran its path ran the kernel the path claims."""
    import json

    from pytest_lstmperf import cli

    out = tmp_path / "cx"
    argv = ["crossover", "lstm", "input_size=4", "hidden_size=8", "seq_len=3", "--device=cpu", "--batches=1,2",
            "--repeats=1", f"--out={out}"]  # fmt: skip
    assert cli.main(argv) == 0, capsys.readouterr().err
    captured = capsys.readouterr()
    printed = captured.out
    progress = [line for line in captured.err.splitlines() if line.startswith("batch ")]  # one line as each starts
    assert progress[0] == "batch 1 (1/2): preparing and timing 4 paths, 1 call each"
    assert progress[1].startswith("batch 2 (2/2): preparing and timing 4 paths, 1 call each (") and len(progress) == 2
    assert "against torch-cpu-native" in printed and "lstm-I4-H8-L1-T3" in printed and "-B1-" not in printed
    data = json.loads((out / "crossover.json").read_text())
    assert data["reference"] == "torch-cpu-native" and set(data["crossover"]) == set(cli.CROSSOVER_PATHS["cpu"][1:])
    claimed = {
        "torch-cpu-native": "cpu-native/fp32",
        "torch-cpu-onednn": "onednn/fp32",
        "torch-cpu-autocast-bf16": "onednn/bf16",
        "torch-cpu-native-autocast-bf16": "cpu-native/bf16",
    }
    ran = [p for p in data["points"] if p["seconds"]]
    assert {p["path"] for p in ran} >= {"torch-cpu-native", "torch-cpu-onednn"}
    assert all(p["kernel"] == claimed[p["path"]] for p in ran), ran
    assert (out / "crossover.png").stat().st_size > 0 and len(cx.read_sweep_csv(out / "crossover.csv")) == 8


# ------------------------------------------------------------------------------------------- progress and headers
PROGRESS_SUITE = """
def test_padding_packing_bucketing_agree():
    pass

def test_crossover(benchmark):
    benchmark(lambda: None)

def test_precision_speed_and_error():
    pass
"""


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_parts_announced_headers_shown_and_no_stray_warning(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, xdist: list[str]
) -> None:
    """Each part of the workload suite says when it starts (with its number of tests), also under -n 2, where
    the device/paths header lines are printed too and pytest-benchmark's exit warning stays off the terminal."""
    clear_inner_env(monkeypatch)
    pytester.makepyfile(test_parts=PROGRESS_SUITE)
    result = runpytest_forked(pytester, "-p", "no:cacheprovider", "--device=cpu", *xdist, timeout=300)
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["lstmperf: device cpu*", "lstmperf: paths *"])
    result.stdout.fnmatch_lines_random([
        "lstmperf workloads: padding, packing and bucketing: outputs against the float64 reference (1 test)",
        "lstmperf workloads: crossover: batch sweep of each path (1 test)",
        "lstmperf workloads: precision: *(1 test)",
    ])  # fmt: skip
    output = result.stdout.str() + result.stderr.str()
    assert "PytestBenchmarkWarning" not in output and "automatically disabled" not in output
    assert output.count("lstmperf workloads: crossover") == 1


# ------------------------------------------------------------------------------------------- figures that cannot be
def _scaling_row(world: int, speedup: float) -> ScalingRow:
    return ScalingRow(strategy="ddp", data="fixed-length", backend="gloo", world=world, throughput=1e4 * speedup,
                      speedup=speedup, efficiency=speedup / world, vs_plain=speedup, comm_share=None,
                      model="4x LSTM 16->32")  # fmt: skip


def test_scale_out_table_flags_an_implausible_speedup(drawn: list, tmp_path) -> None:
    """The loaded-CPU run's "39.38x speedup, 1969% efficiency" on 2 ranks is marked in the table and the plot;
    1.9x on 2 ranks and a few percent above the ideal are not."""
    from pytest_lstmperf.workloads import report as wr

    rows = [_scaling_row(1, 1.0), _scaling_row(2, 39.38)]
    header, table = wr.sections(rows)["scaling"]
    bad = dict(zip(header, table[1], strict=True))
    assert bad["speedup"] == "39.38x (implausible)" and bad["efficiency"] == "1969% (implausible)"
    assert "39.4x on 2 ranks is more than 1.25 x the ideal 2x" in bad["note"]
    for speedup in (1.9, 2.2):
        good = dict(zip(header, wr.sections([_scaling_row(2, speedup)])["scaling"][1][0], strict=True))
        assert "implausible" not in good["speedup"] + good["efficiency"] and good["note"] == "-"
    assert wr.speedup_flag(float("nan"), 2).startswith("implausible")
    assert wr.speedup_flag(0.0, 2).startswith("implausible") and wr.speedup_flag(None, 2) == ""
    assert wr.plot_scaling(tmp_path, rows) is not None
    labels = [t.get_text() for ax in drawn[-1].axes if ax.get_legend() for t in ax.get_legend().get_texts()]
    assert any(label.startswith("implausible") for label in labels)
    wr.plot_scaling(tmp_path, [_scaling_row(1, 1.0), _scaling_row(2, 1.9)])
    labels = [t.get_text() for ax in drawn[-1].axes if ax.get_legend() for t in ax.get_legend().get_texts()]
    assert not any(label.startswith("implausible") for label in labels)


def test_overhead_below_one_is_flagged(drawn: list, tmp_path) -> None:
    """A call faster than its raw cost (a negative overhead) is marked in the table, the notes and the plot."""
    from pytest_lstmperf.workloads import report as wr

    def row(ratio: float) -> OverheadRow:
        return OverheadRow(shape="lstm-H64-B1-T20", device="cpu", framework="torch", ran="x", module_s=1e-3 * ratio,
                           op_s=1e-3, raw_s=1e-3, graph_s=None, ratio=ratio, host_s=0.0, kernels=3)  # fmt: skip

    header, table = wr.sections([row(0.9)])["overhead"]
    assert dict(zip(header, table[0], strict=True))["call/raw"] == "0.90x (below 1x)"
    assert any(n.startswith("below 1x (1 row: torch lstm-H64-B1-T20 0.90x)") for n in wr.notes([row(0.9)])["overhead"])
    assert wr.plot_overhead(tmp_path, [row(0.9)]) is not None
    labels = [t.get_text() for t in drawn[-1].axes[0].get_legend().get_texts()]
    assert any(label.startswith("below 1x") for label in labels)
    # not blind: 1.2x is an overhead, nothing flagged
    header, table = wr.sections([row(1.2)])["overhead"]
    assert dict(zip(header, table[0], strict=True))["call/raw"] == "1.20x"
    assert not any(n.startswith("below 1x") for n in wr.notes([row(1.2)])["overhead"])
    wr.plot_overhead(tmp_path, [row(1.2)])
    assert not any(t.get_text().startswith("below 1x") for t in drawn[-1].axes[0].get_legend().get_texts())


def test_workload_rows_round_trip_through_json_and_bad_ones_are_named() -> None:
    """The rows travel as JSON (pytest-xdist workers' user_properties, workloads.json): each kind reads back as
    written, an older report's derived fields are derived again, and a row of no known kind, with a field its
    kind does not have, or without one it needs, is refused with what is wrong."""
    import json

    from pytest_lstmperf.workloads.rows import CrossoverRow, row_to_json

    rows = [
        OverheadRow(shape="lstm-H64-B1-T20", framework="keras-jax", ran="jax-generic/fp32", raw_s=3e-4, ratio=2.5),
        CrossoverRow(
            shape="lstm-I32-H64-L1-T20",
            against="torch-cpu-native",
            crossover={"onednn": 4, "b": None},
            points=({"path": "onednn", "batch": 1, "seconds": 1e-3},),
        ),
        _precision_row("torch-cpu-autocast-bf16", 0.5e-3, 0.6e-3, workers=2),
        _scaling_row(2, 1.9),
        BucketingRow(workload="uniform n=96", mode="bucketed", work_ratio=1.08, wasted=0.07, buckets=8),
    ]
    for row in rows:
        assert row_from_json(json.loads(json.dumps(row_to_json(row)))) == row
    older = {**row_to_json(rows[2]), "speedup": 1.2, "device_speedup": None}  # written by earlier reports
    assert row_from_json(older) == rows[2] and rows[2].speedup == pytest.approx(1.2)
    with pytest.raises(ValueError, match="unknown workload row kind 'nope' \\(valid: bucketing, crossover"):
        row_from_json({"kind": "nope"})
    with pytest.raises(ValueError, match=r"overhead row: no field\(s\) colour"):
        row_from_json({**row_to_json(rows[0]), "colour": "red"})
    with pytest.raises(ValueError, match=r"scaling row: .*world"):
        row_from_json({"kind": "scaling", "strategy": "ddp", "data": "fixed", "speedup": 1.0})
