"""Bucketing generator, work ratios and the crossover finder on synthetic data; the workload suite's
checks fail when their fault is planted."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pytest_lstmperf import workloads as w

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
    assert w.find_crossover(cpu, gpu) == expected


def test_crossovers_from_points() -> None:
    points = [w.SweepPoint("cpu", b, b * 1e-3) for b in (1, 2, 4)]
    points += [w.SweepPoint("gpu", b, 2.5e-3) for b in (1, 2, 4)]
    points += [w.SweepPoint("gpu2", b, None, note="unavailable") for b in (1, 2, 4)]
    assert w.crossovers(points, "cpu", ["gpu", "gpu2"]) == {"gpu": 4, "gpu2": None}


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
    result = w.measure_overhead("lstm", 8, 16, 1, 2, 5, "cpu", repeats=3)
    assert result.graph_s is None and result.raw_s == result.op_s and result.kernels > 0
    assert result.module_s > 0 and result.ratio == result.module_s / result.op_s


# ------------------------------------------------------------------------------------------- the suite
SUITE_ARGS = ["-p", "no:cacheprovider", "--device=cpu", "-p", "no:randomly", "--benchmark-disable"]


def _suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    from pathlib import Path

    suite = Path(__file__).resolve().parents[1] / "suites" / "test_workloads.py"
    pytester.makepyfile(test_workloads=suite.read_text())
    for name in ("PYTEST_ADDOPTS", "PYTEST_LSTMPERF_PLANT", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT"):
        monkeypatch.delenv(name, raising=False)


def test_suite_passes_and_reports(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    _suite(pytester, monkeypatch)
    result = pytester.runpytest_subprocess(*SUITE_ARGS, "--lstmperf-report=rep", timeout=600)
    assert result.ret == 0, result.stdout.str()
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
        "precision: speed and error*",
        "*torch-cpu-native-autocast-bf16*cpu-native/bf16*",
        "*workload report written to*workloads.md*",
    ])  # fmt: skip
    written = {p.name for p in (pytester.path / "rep").iterdir()}
    assert {"workloads.md", "workloads.json", "bucketing.png", "crossover-cpu.png"} <= written
    assert {"overhead.png", "precision.png"} <= written


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
    result = pytester.runpytest_subprocess(
        *SUITE_ARGS, "-p", "pytest_lstmperf.testing.faults", f"--lstmperf-plant={plant}", "-k", test, timeout=600
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines(message if isinstance(message, list) else [message])


def test_overhead_check_fails_when_the_op_differs(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The raw op is checked to compute the module's numbers: perturbing the module breaks that check."""
    _suite(pytester, monkeypatch)
    result = pytester.runpytest_subprocess(
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
        from pytest_lstmperf.paths.keras_paths import KerasRun

        _real = KerasRun.trace_forward

        def _fell_back(self):
            return dataclasses.replace(_real(self), family="onednn")

        KerasRun.trace_forward = _fell_back
        """
    )
    result = pytester.runpytest_subprocess(*SUITE_ARGS, "-k", "test_keras_overhead and B1-", timeout=600)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines([
        "*keras-torch-cpu on lstm-I64-H64*expected kernel family 'cpu-native', observed 'onednn'*",
        "*keras-tf-cpu on lstm-I64-H64*expected kernel family 'tf-generic', observed 'onednn'*",
    ])  # fmt: skip
