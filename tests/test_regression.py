"""The decision rule on synthetic samples: planted slowdowns caught, clean reruns quiet, edge cases named."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_lstmperf.observation.claims import same_kernel
from pytest_lstmperf.speed.regression import (
    Decision,
    GateResult,
    Thresholds,
    compare_samples,
    correct_for_drift,
    drift_ratio,
    format_table,
    mannwhitney_greater,
    min_attainable_pvalue,
    pick_samples,
)


def noisy(rng: np.random.Generator, median: float, n: int, spread: float = 0.03, outliers: int = 0) -> list[float]:
    """Log-normal timings with optional slow outliers, like a busy machine."""
    values = median * np.exp(rng.normal(0.0, spread, n))
    if outliers:
        values[rng.choice(n, outliers, replace=False)] *= rng.uniform(1.5, 3.0, outliers)
    return values.tolist()


def test_planted_slowdown_is_caught_every_time() -> None:
    rng = np.random.default_rng(1)
    caught = 0
    for _ in range(200):
        base = noisy(rng, 1e-3, 20, outliers=2)
        now = noisy(rng, 1.25e-3, 20, outliers=2)
        caught += compare_samples("t", base, now).verdict == "regressed"
    assert caught == 200


def test_clean_reruns_raise_no_false_alarm() -> None:
    rng = np.random.default_rng(2)
    alarms = 0
    for _ in range(500):
        # the machine drifts by up to 5% between runs, with outliers: still no alarm
        base = noisy(rng, 1e-3, 20, spread=0.05, outliers=3)
        now = noisy(rng, 1e-3 * rng.uniform(0.95, 1.05), 20, spread=0.05, outliers=3)
        alarms += compare_samples("t", base, now).failed
    assert alarms == 0


def test_small_but_significant_shift_is_not_a_regression() -> None:
    rng = np.random.default_rng(3)
    base = noisy(rng, 1e-3, 200, spread=0.01)
    now = noisy(rng, 1.05e-3, 200, spread=0.01)
    d = compare_samples("t", base, now)
    assert d.pvalue is not None and d.pvalue < 1e-6
    assert d.verdict == "unchanged"


def test_large_but_noisy_shift_is_not_a_regression() -> None:
    base = [1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 1.0, 2.0]
    now = [1.3, 2.2, 1.1, 2.4, 1.2, 2.6, 1.0, 2.1]
    d = compare_samples("t", base, now)
    assert d.ratio is not None and d.ratio > 1.1
    assert d.pvalue is not None and d.pvalue > 0.002
    assert d.verdict == "unchanged"


def test_improvement_is_reported_not_failed() -> None:
    rng = np.random.default_rng(4)
    d = compare_samples("t", noisy(rng, 2e-3, 20), noisy(rng, 1e-3, 20))
    assert d.verdict == "improved" and not d.failed
    assert d.ratio == pytest.approx(0.5, rel=0.05)


def test_kernel_change_fails_whatever_the_timing() -> None:
    same = [1.0] * 10
    d = compare_samples("t", same, same, kernel_then="cudnn/fp32", kernel_now="cuda-generic/fp32")
    assert d.verdict == "kernel-changed" and d.failed
    assert "cudnn/fp32 -> cuda-generic/fp32" in d.notes[0]


def test_tf32_and_fp32_are_one_precision() -> None:
    assert same_kernel("cudnn/tf32", "cudnn/fp32")
    assert not same_kernel("cudnn/fp16", "cudnn/fp32")
    assert not same_kernel("onednn/fp32", "cpu-native/fp32")


def test_throttled_samples_are_dropped() -> None:
    base = [1.0] * 10
    now = [1.0] * 7 + [5.0, 5.0, 5.0]
    throttled = [False] * 7 + [True] * 3
    d = compare_samples("t", base, now, now_throttled=throttled)
    assert d.n_now == 7 and d.verdict == "unchanged"
    assert "dropped 0 baseline and 3 current" in d.notes[0]


def test_everything_throttled_is_inconclusive() -> None:
    d = compare_samples("t", [1.0] * 10, [2.0] * 10, now_throttled=[True] * 10)
    assert d.verdict == "inconclusive" and not d.failed


def test_few_samples_decide_on_ratio_with_a_note() -> None:
    assert min_attainable_pvalue(4, 4) > 0.002
    d = compare_samples("t", [1.0, 1.01, 0.99, 1.0], [1.3, 1.31, 1.29, 1.3])
    assert d.verdict == "regressed"
    assert any("ratio alone" in n for n in d.notes)


def test_drift_correction_cancels_machine_drift() -> None:
    rng = np.random.default_rng(5)
    base = noisy(rng, 1e-3, 20)
    now = noisy(rng, 1.3e-3, 20)  # everything 30% slower today
    assert compare_samples("t", base, now).verdict == "regressed"
    drift = drift_ratio(noisy(rng, 5e-3, 20), noisy(rng, 6.5e-3, 20))
    d = compare_samples("t", base, now, drift=drift)
    assert d.verdict == "unchanged" and d.drift == drift


def test_drift_divides_only_the_host_part() -> None:
    rng = np.random.default_rng(7)
    # 1 ms on the device + 1 ms of host time; today the host takes 1.3 ms: the call is 1.15x slower
    base = noisy(rng, 2e-3, 30, 0.01)
    now = noisy(rng, 2.3e-3, 30, 0.01)
    host_drift = 1.3
    whole = compare_samples("t", base, now, drift=host_drift)  # dividing the whole call over-corrects
    assert whole.ratio is not None and whole.ratio < 0.9 and whole.verdict == "improved"
    d = compare_samples("t", base, now, drift=host_drift, device_s=1e-3)
    assert d.verdict == "unchanged" and d.ratio is not None and abs(d.ratio - 1.0) < 0.03
    assert any("host part" in n for n in d.notes)
    # a real regression on top of the drift is still caught: the layer itself got 1.25x slower
    slow = noisy(rng, 2.3e-3 * 1.25, 30, 0.01)
    assert compare_samples("t", base, slow, drift=host_drift, device_s=1e-3).verdict == "regressed"
    with pytest.raises(ValueError, match="positive finite"):
        correct_for_drift([1.0], 0.0)


def test_per_test_threshold() -> None:
    rng = np.random.default_rng(6)
    base, now = noisy(rng, 1e-3, 20, 0.01), noisy(rng, 1.15e-3, 20, 0.01)
    assert compare_samples("t", base, now, Thresholds(ratio=1.10)).verdict == "regressed"
    assert compare_samples("t", base, now, Thresholds(ratio=1.20)).verdict == "unchanged"


@pytest.mark.parametrize(
    "kwargs", [{"ratio": 1.0}, {"ratio": 0.9}, {"pvalue": 0.0}, {"pvalue": 1.5}, {"min_samples": 0}]
)
def test_bad_thresholds_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        Thresholds(**kwargs)


def test_identical_samples() -> None:
    assert mannwhitney_greater([1.0] * 5, [1.0] * 5) == 1.0
    assert compare_samples("t", [1.0] * 8, [1.0] * 8).verdict == "unchanged"


def test_table_and_summary() -> None:
    decisions = [
        Decision("suites/x::a", "regressed", 1.3, 1e-5, 1e-3, 1.3e-3, 20, 20, "cudnn/fp32", "cudnn/fp32"),
        Decision("suites/x::b", "unchanged", 1.0, 0.5, 2e-3, 2e-3, 20, 20),
    ]
    lines = format_table(decisions)
    assert lines[0].split()[:6] == ["test", "metric", "baseline", "now", "ratio", "p-value"]
    assert "1 ms" in lines[2] and "1.3 ms" in lines[2] and "1.300" in lines[2] and "regressed" in lines[2]
    result = GateResult(decisions)
    assert [d.name for d in result.failed] == ["suites/x::a"]
    assert result.summary() == "1 regressed, 1 unchanged"


def test_pick_samples() -> None:
    graph = {"device_time_method": "cuda-graph", "device_samples": [1.0, 1.1]}
    events = {"device_time_method": "cuda-events", "device_samples": [1.0]}
    cpu = {"device_time_method": "host", "device_samples": []}
    rounds_b, rounds_n = [5.0, 5.1], [6.0, 6.1]
    assert pick_samples("auto", graph, graph, rounds_b, rounds_n) == ("device", [1.0, 1.1], [1.0, 1.1], "")
    assert pick_samples("per-call", graph, graph, rounds_b, rounds_n) == ("per-call", rounds_b, rounds_n, "")
    used, b, n, note = pick_samples("auto", graph, events, rounds_b, rounds_n)  # capture failed now
    assert (used, b, n) == ("per-call", rounds_b, rounds_n) and "no device time of one method" in note
    # both sides timed with batched events (the Keras training step): device time decides
    assert pick_samples("auto", events, events, rounds_b, rounds_n) == ("device", [1.0], [1.0], "")
    used, b, n, note = pick_samples("device", cpu, cpu, rounds_b, rounds_n)
    assert (used, list(b), list(n)) == ("device", [], []) and note
    assert compare_samples("t", b, n).verdict == "inconclusive"
    with pytest.raises(ValueError, match="unknown metric 'wall' \\(valid: auto, device, per-call\\)"):
        pick_samples("wall", cpu, cpu, rounds_b, rounds_n)


def test_device_metric_ignores_host_noise_and_sees_kernel_slowdown() -> None:
    """What the H100 runs showed: per-call time moves by tens of percent between clean runs while the
    graph-replay device time stays within a few percent; a 1.25x slower kernel moves the device time."""
    rng = np.random.default_rng(11)
    device_base = noisy(rng, 7e-4, 10, 0.005)
    device_clean = noisy(rng, 7.1e-4, 10, 0.005)
    device_slow = noisy(rng, 7e-4 * 1.25, 10, 0.005)
    assert compare_samples("t", device_base, device_clean).verdict == "unchanged"
    assert compare_samples("t", device_base, device_slow).verdict == "regressed"


def test_baseline_plot_with_gate_decisions_and_without(tmp_path) -> None:
    from pytest_lstmperf.speed.report import _plot_baseline

    records = [
        {"name": "test_a", "fullname": "x::test_a", "extra_info": {"time_per_call_s": 3e-3}},
        {"name": "test_b", "fullname": "x::test_b", "extra_info": {"time_per_call_s": 2e-3}},
    ]
    baseline = [
        {"fullname": "x::test_a", "stats": {"data": [1e-3]}},
        {"fullname": "x::test_b", "stats": {"data": [2e-3]}},
    ]
    gate = GateResult([Decision("x::test_a", "unchanged", ratio=1.01, metric="device")])
    path = _plot_baseline(tmp_path, records, baseline, gate)
    assert path is not None and path.stat().st_size > 1000
    assert _plot_baseline(tmp_path, records, [], None) is None


# ------------------------------------------------------------------------ host counters, noise band, verdicts
def test_host_counters_compared_exactly_and_allocations_within_tolerance() -> None:
    from pytest_lstmperf.speed.regression import host_counter_changes

    then = {"aten_ops": 40, "kernels": 12, "syncs": 1, "alloc_bytes": 200_000}
    assert host_counter_changes(then, dict(then)) == []
    # the smallest planted change each counter catches: one op, one kernel launch, one synchronisation
    assert host_counter_changes(then, {**then, "aten_ops": 41}) == ["aten_ops per call 40 -> 41"]
    assert host_counter_changes(then, {**then, "kernels": 13}) == ["kernels per call 12 -> 13"]
    assert host_counter_changes(then, {**then, "syncs": 2}) == ["syncs per call 1 -> 2"]
    # bytes: +-5% or 4 KiB, whichever is larger
    assert host_counter_changes(then, {**then, "alloc_bytes": 209_999}) == []
    assert "alloc_bytes per call 200000 -> 210001" in host_counter_changes(then, {**then, "alloc_bytes": 210_001})[0]
    small = {"aten_ops": 5, "alloc_bytes": 1000}
    assert host_counter_changes(small, {**small, "alloc_bytes": 5000}) == []
    assert host_counter_changes(small, {**small, "alloc_bytes": 5097}) != []
    # absent counters (old baselines, kernels/syncs on the CPU) are not compared
    assert host_counter_changes(None, then) == [] and host_counter_changes({"aten_ops": 40}, {"kernels": 3}) == []


def test_noise_band_raises_the_per_call_threshold() -> None:
    from pytest_lstmperf.speed.regression import chunk_medians, noise_threshold, relative_spread

    assert relative_spread([1.0, 1.1, 1.05]) == pytest.approx(0.1 / 1.05)
    assert relative_spread([1.0]) is None
    assert noise_threshold(1.10, None) == 1.10
    assert noise_threshold(1.10, 0.02) == 1.10  # a quiet baseline keeps the configured ratio
    assert noise_threshold(1.10, 0.10) == pytest.approx(1.20)
    assert chunk_medians([1.0] * 5) == []  # too few samples for three chunks of three
    assert chunk_medians([1.0] * 3 + [2.0] * 3 + [3.0] * 3) == [1.0, 2.0, 3.0]


def test_bimodal_samples_are_flagged_and_unimodal_ones_not() -> None:
    from pytest_lstmperf.speed.regression import bimodal

    rng = np.random.default_rng(3)
    assert bimodal(noisy(rng, 1e-3, 40, spread=0.05, outliers=2)) == ""
    two = noisy(rng, 1e-3, 20, spread=0.01) + noisy(rng, 1.3e-3, 20, spread=0.01)
    assert bimodal(two).startswith("bimodal: 20 samples around")
    # a few slow outliers are not a second mode
    assert bimodal([*noisy(rng, 1e-3, 40, spread=0.01), 2e-3, 2.1e-3]) == ""


def test_combine_keeps_the_most_severe_verdict_and_every_check() -> None:
    from pytest_lstmperf.speed.regression import combine

    device = Decision("t", "unchanged", ratio=1.01, metric="device", threshold=1.1)
    per_call = Decision("t", "regressed", ratio=1.3, pvalue=1e-6, metric="per-call", threshold=1.1)
    host = Decision("t", "host-work-changed", metric="host", notes=("host work per call changed: syncs 1 -> 2",))
    merged = combine([device, per_call, host], ["host: ..."])
    assert merged.verdict == "regressed" and merged.ratio == 1.3 and merged.metric == "per-call"
    assert merged.checks[0].startswith("device: unchanged at 1.010x") and merged.checks[-1] == "host: ..."
    merged = combine([device, host])
    assert merged.verdict == "host-work-changed" and merged.ratio == 1.01  # the timed numbers stay in the table
    assert merged.failed


def test_inconclusive_and_compared_nothing_are_not_a_pass() -> None:
    gate = GateResult([Decision("a", "unchanged"), Decision("b", "inconclusive")])
    assert not gate.failed and gate.unsettled() == ["1 benchmark(s) inconclusive"]
    nothing = GateResult([Decision("a", "not-run"), Decision("b", "not-run")])
    assert nothing.compared == 0 and nothing.unsettled() == ["nothing was compared with the baseline"]
    assert GateResult([Decision("a", "unchanged")]).unsettled() == []


def test_device_threshold_from_recording_runs() -> None:
    from pytest_lstmperf.speed.regression import DEVICE_FLOOR, device_threshold

    # one recording run: no band between runs, the configured threshold stands
    assert device_threshold(1.10, {"runs": 1, "device_spread": 0.001}) == (1.10, "")
    assert device_threshold(1.10, None) == (1.10, "")
    # steady device time over 3 recording runs: the floor
    ratio, why = device_threshold(1.10, {"runs": 3, "device_spread": 0.01})
    assert ratio == DEVICE_FLOOR and "3 recording runs" in why
    # a 4% spread: 1 + 2 x 4%
    assert abs(device_threshold(1.10, {"runs": 3, "device_spread": 0.04})[0] - 1.08) < 1e-9
    # exactly at the configured threshold: no note
    assert device_threshold(1.10, {"runs": 3, "device_spread": 0.05}) == (1.10, "")
    # a spread wider than the configured threshold raises it, and the note says what is no longer resolved
    ratio, why = device_threshold(1.10, {"runs": 3, "device_spread": 0.2})
    assert abs(ratio - 1.40) < 1e-9
    assert why.startswith("device threshold raised to 1.400") and "below 1.40x is not resolved" in why


def test_device_threshold_catches_a_small_device_slowdown() -> None:
    """A 1.085x device slowdown passes the 1.10 default but fails once the baseline's runs show a 1% spread."""
    import random

    from pytest_lstmperf.speed.regression import Thresholds, compare_samples, device_threshold

    rng = random.Random(3)
    base = [1e-3 * (1 + rng.gauss(0, 0.005)) for _ in range(12)]
    now = [1.085e-3 * (1 + rng.gauss(0, 0.005)) for _ in range(12)]
    assert compare_samples("b", base, now, Thresholds(1.10)).verdict == "unchanged"
    ratio, _ = device_threshold(1.10, {"runs": 3, "device_spread": 0.01})
    assert compare_samples("b", base, now, Thresholds(ratio)).verdict == "regressed"
