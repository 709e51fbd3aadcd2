"""The speed gate's rule (pytest_lstmperf/speed/policy.py) on synthetic records: each sentence of the rule, and a
planted fault of each kind seen failing, with the smallest one each check catches."""

from __future__ import annotations

import math
import random

import pytest

from pytest_lstmperf.speed import policy
from pytest_lstmperf.speed.policy import Measurement, Reference, RunFigures, check, decide, needs_second_look


def record(
    name: str = "t",
    call_s: float = 1e-3,
    anchor_s: float = 2e-4,
    n: int = 30,
    noise: float = 0.01,
    machine: float = 1.0,
    seed: int = 0,
    device: bool = False,
    counters: dict | None = None,
    kernel: str = "cudnn",
) -> dict:
    """A benchmark record: ``n`` rounds of call and anchor, both scaled by ``machine`` (a slower machine slows both),
    each with its own multiplicative noise; device samples likewise where ``device``."""
    rng = random.Random(seed)
    phases = [machine * (1 + 0.5 * rng.random()) for _ in range(n)]  # a machine whose speed wanders by 50%
    data = [call_s * p * math.exp(rng.gauss(0, noise)) for p in phases]
    anchors = [anchor_s * p * math.exp(rng.gauss(0, noise)) for p in phases]
    extra: dict = {"kernel": kernel, "precision": "fp32", "anchor": {"samples": anchors, "repeat": 4}}
    if device:
        extra["device_samples"] = [0.5 * call_s * p * math.exp(rng.gauss(0, noise)) for p in phases]
        extra["anchor"]["device_samples"] = [0.5 * anchor_s * p * math.exp(rng.gauss(0, noise)) for p in phases]
    if counters is not None:
        extra["host_counters"] = counters
    return {"fullname": name, "data": data, "extra_info": extra}


def reference(*records: dict) -> Reference:
    runs = tuple(policy.run_figures(Measurement.from_record(r)) for r in records)
    first = Measurement.from_record(records[0])
    return Reference(first.name, runs, kernel=first.kernel)


def test_the_anchor_cancels_a_machine_that_is_slower_as_a_whole() -> None:
    """Sentence 1: the same code on a machine twice as slow, and wandering by 50% within each run, is unchanged."""
    base = reference(record(seed=1))
    slow_machine = record(seed=2, machine=2.0)
    assert decide(Measurement.from_record(slow_machine), base).verdict == "unchanged"
    raw = [d for d in slow_machine["data"]]
    assert sorted(raw)[len(raw) // 2] > 1.8e-3  # the raw time did double


@pytest.mark.parametrize("factor", [1.15, 1.5, 3.0])
def test_a_slower_call_is_regressed_on_a_machine_that_also_changed(factor: float) -> None:
    """Sentence 2: a call slower by ``factor``, measured on a machine 1.7x slower than the recording one, fails."""
    base = reference(record(seed=1))
    now = record(seed=3, call_s=1e-3 * factor, machine=1.7)
    decision = decide(Measurement.from_record(now), base)
    assert decision.verdict == "regressed"
    assert decision.ratio("per-call") == pytest.approx(factor, rel=0.03)


def test_the_smallest_slowdown_caught_at_one_percent_noise_is_the_threshold() -> None:
    """With 1% noise per sample the resolution lies under the 1.10 threshold: 1.12x fails, 1.07x passes."""
    base = reference(record(seed=1))
    assert decide(Measurement.from_record(record(seed=4, call_s=1.12e-3)), base).verdict == "regressed"
    assert decide(Measurement.from_record(record(seed=4, call_s=1.07e-3)), base).verdict == "unchanged"


def test_a_noisy_benchmark_says_what_it_resolves_and_uses_it_as_its_limit() -> None:
    """Sentence 2: at 30% noise per sample the resolution lies above the threshold; a 1.15x slowdown is not
    called, a 3x one is, and the check says the slowdown it resolves."""
    base = reference(record(seed=1, noise=0.3))
    small = check("per-call", Measurement.from_record(record(seed=5, noise=0.3, call_s=1.15e-3)).first.per_call,
                  base, 1.10)  # fmt: skip
    assert small.resolves > 1.10 and small.limit == small.resolves
    assert small.verdict == "unchanged"
    big = decide(Measurement.from_record(record(seed=5, noise=0.3, call_s=3e-3)), base)
    assert big.verdict == "regressed"


def test_recording_runs_that_lie_apart_widen_the_resolution() -> None:
    """The spread between recording runs is part of the noise: two runs 20% apart make a 1.15x slowdown
    unresolved (and said), where one run alone would have caught it."""
    one = reference(record(seed=1))
    apart = reference(record(seed=1), record(seed=6, call_s=1.2e-3))
    now = Measurement.from_record(record(seed=7, call_s=1.15e-3 * math.sqrt(1.2)))
    assert decide(now, one).verdict == "regressed"
    assert decide(now, apart).verdict == "unchanged"
    assert decide(now, apart).checks[0].resolves > 1.15


def test_the_second_look_decides() -> None:
    """Sentence 3: a first look past the limit asks for a second; the second look alone decides."""
    base = reference(record(seed=1))
    first = record(seed=8, call_s=1.5e-3)
    assert needs_second_look(first, base, 1.10) == ["per-call"]
    clean_again = record(seed=9)
    first["extra_info"]["second_look"] = {
        "metrics": ["per-call"],
        "data": clean_again["data"],
        "anchor": clean_again["extra_info"]["anchor"],
    }
    decision = decide(Measurement.from_record(first), base)
    assert decision.verdict == "unchanged"
    assert any(n.startswith("per-call: first look 1.") and "past its limit" in n for n in decision.notes)
    assert needs_second_look(record(seed=9), base, 1.10) == []


def test_device_time_is_a_figure_of_its_own() -> None:
    """On a GPU the device figure is compared too: a device slowdown of 1.25x fails though the per-call figure
    (host-bound) did not move."""
    base = reference(record(seed=1, device=True))
    now = record(seed=10, device=True)
    now["extra_info"]["device_samples"] = [x * 1.25 for x in now["extra_info"]["device_samples"]]
    decision = decide(Measurement.from_record(now), base)
    assert decision.verdict == "regressed"
    assert [c.verdict for c in decision.checks] == ["unchanged", "regressed"]


def test_kernel_and_host_counts_fail_whatever_the_time() -> None:
    """Sentence 4: a kernel change and one extra ATen op per call fail though the time is unchanged."""
    counts = {"aten_ops": 120, "kernels": 10, "syncs": 1, "alloc_bytes": 1 << 20}
    base = reference(record(seed=1, counters=counts))
    other_kernel = decide(Measurement.from_record(record(seed=2, counters=counts, kernel="cuda-generic")), base)
    assert other_kernel.verdict == "kernel-changed"
    more_ops = decide(Measurement.from_record(record(seed=2, counters={**counts, "aten_ops": 121})), base)
    assert more_ops.verdict == "host-work-changed"
    assert "aten_ops 120 -> 121" in more_ops.checks[-1].note
    same = decide(Measurement.from_record(record(seed=2, counters={**counts, "alloc_bytes": (1 << 20) + 2048})), base)
    assert same.verdict == "unchanged"


def test_counts_that_moved_between_recording_runs_are_not_a_rule() -> None:
    a = record(seed=1, counters={"aten_ops": 120, "kernels": 10})
    b = record(seed=2, counters={"aten_ops": 124, "kernels": 10})
    base = reference(a, b)
    now = Measurement.from_record(record(seed=3, counters={"aten_ops": 130, "kernels": 10}))
    assert decide(now, base).verdict == "unchanged"
    now = Measurement.from_record(record(seed=3, counters={"aten_ops": 120, "kernels": 11}))
    assert decide(now, base).verdict == "host-work-changed"


def test_an_upgrade_is_compared_and_named() -> None:
    """Sentence 5: other versions are compared by the same rule, and the headline counts what moved."""
    base = reference(record(seed=1))
    base = Reference(base.name, base.runs, base.kernel, {"torch": "2.12.0", "keras": "3.15.1"})
    decisions = [decide(Measurement.from_record(record(seed=2, call_s=1.5e-3)), base)]
    upgrade = policy.upgrade_of([base], {"torch": "2.13.0", "keras": "3.15.1"})
    assert upgrade is not None
    assert upgrade.headline(decisions) == "upgrade: torch 2.12.0 -> 2.13.0: 1 slower, 0 faster, 0 kernel changed"
    assert policy.upgrade_of([base], {"torch": "2.12.0", "keras": "3.15.1"}) is None


def test_too_few_samples_or_no_timings_are_inconclusive_never_a_pass() -> None:
    base = reference(record(seed=1))
    few = decide(Measurement.from_record(record(seed=2, n=3)), base)
    assert few.verdict == "inconclusive"
    empty = Reference("t", (RunFigures(None, None, {"aten_ops": 1}),))
    migrated = decide(Measurement.from_record(record(seed=2)), empty)
    assert migrated.verdict == "inconclusive"
    assert "--lstmperf-save-baseline" in migrated.checks[0].note


def test_the_marker_threshold_wins() -> None:
    base = reference(record(seed=1))
    now = record(seed=2, call_s=1.3e-3)
    assert decide(Measurement.from_record(now), base).verdict == "regressed"
    now["thresholds"] = {"ratio": 1.5}
    assert decide(Measurement.from_record(now), base).verdict == "unchanged"


def test_run_figures_round_trip() -> None:
    run = policy.run_figures(Measurement.from_record(record(seed=1, device=True, counters={"aten_ops": 3})))
    assert RunFigures.from_dict(run.to_dict()) == run
