"""The sweep (pytest_lstmperf.speed.sweep): time per call taken in slices spread over the run, in-process, on a
simulated clock whose machine changes state over time as a shared CPU does."""

from __future__ import annotations

import itertools
import math
import random
import statistics

import pytest

from pytest_lstmperf.anchor import Pairs, paired_rounds
from pytest_lstmperf.speed import sweep as sweep_mod
from pytest_lstmperf.speed.records import BenchRecord
from pytest_lstmperf.speed.sweep import MIN_ROUNDS, Plan, Sweep, Swept, apply


class Machine:
    """A simulated clock: a call of cost ``c`` takes ``c * state(t)``, the state changing every ``regime_s``
    seconds to a fresh draw (spread ``sd`` on the log scale), as the 2-core VM's did over seconds."""

    def __init__(self, seed: int, regime_s: float = 1.0, sd: float = 0.08) -> None:
        self.now = 0.0
        self.rng = random.Random(seed)
        self.regime_s = regime_s
        self.sd = sd
        self.states: dict[int, float] = {}

    def clock(self) -> float:
        return self.now

    def state(self) -> float:
        k = int(self.now // self.regime_s)
        if k not in self.states:
            self.states[k] = math.exp(self.rng.gauss(0.0, self.sd))
        return self.states[k]

    def work(self, cost: float) -> None:
        self.now += cost * self.state()


class FakeAnchor:
    """Stands in for timing.Anchor: a fixed cost per repetition that the machine's state does not move (the
    part of the noise an anchor does not cancel)."""

    kind = "fake"

    def __init__(self, machine: Machine, cost: float = 1e-4) -> None:
        self.machine = machine
        self.cost = cost

    def time(self, repeat: int, clock: object = None) -> float:
        start = self.machine.now
        self.machine.now += self.cost * repeat
        return (self.machine.now - start) / repeat


def _bench(machine: Machine, cost: float, log: list[str] | None = None, name: str = ""):
    def timed() -> None:
        if log is not None:
            log.append(name)
        machine.work(cost)

    return timed


def test_plan_spends_at_least_the_work_and_spans_few_benchmarks_longer() -> None:
    one, many = Plan.of(1), Plan.of(40)
    assert one.work_s == sweep_mod.WORK_MAX_S
    assert many.work_s == sweep_mod.WORK_S
    assert Plan.of(0).passes == 0
    assert one.passes == math.ceil(one.work_s / sweep_mod.SLICE_S)
    assert many.rounds(1.0) == MIN_ROUNDS  # a long call still gets a median's worth
    assert many.rounds(1e-6) == sweep_mod.MAX_ROUNDS
    assert "3 benchmark(s)" in Plan.of(3).describe()


def test_slices_alternate_between_benchmarks_and_each_gets_its_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    machine = Machine(0)
    log: list[str] = []
    sweep = Sweep()
    for name, cost in (("a", 1e-3), ("b", 2e-3), ("c", 5e-4)):
        sweep.add(name, Pairs(_bench(machine, cost, log, name), FakeAnchor(machine), machine.clock), 1, cost + 1e-4)  # type: ignore[arg-type]
    plan = Plan.of(3)
    got = sweep.run()
    assert set(got) == {"a", "b", "c"}
    for name, cost in (("a", 1e-3), ("b", 2e-3), ("c", 5e-4)):
        swept = got[name]
        assert len(swept.data) == len(swept.anchors) == plan.rounds(cost + 1e-4)
        assert swept.slices > 10 and not swept.error
    # interleaved: the benchmarks' calls alternate many times, not one block each
    changes = sum(1 for x, y in itertools.pairwise(log) if x != y)
    assert changes > 3 * 10
    # each benchmark's samples span most of the sweep
    total = machine.now
    assert min(s.span_s for s in got.values()) > 0.8 * total
    assert len(sweep) == 0  # the models are released


def test_a_further_process_times_across_the_run_only_the_benchmarks_it_was_started_for() -> None:
    machine = Machine(2)
    sweep = Sweep(only=frozenset({"a"}))
    for name in ("a", "b"):
        sweep.add(name, Pairs(_bench(machine, 1e-3), FakeAnchor(machine), machine.clock), 1, 1.1e-3)  # type: ignore[arg-type]
    assert len(sweep) == 1 and sweep.plan() == Plan.of(1, sweep.span_s)
    assert set(sweep.run()) == {"a"}  # b ran its test in this process, and keeps its test's rounds


def test_a_call_that_fails_is_left_out_and_named_and_the_rest_go_on() -> None:
    machine = Machine(1)
    sweep = Sweep()
    calls = {"n": 0}

    def broken() -> None:
        calls["n"] += 1
        if calls["n"] > 3:
            raise RuntimeError("session closed")
        machine.work(1e-3)

    sweep.add("broken", Pairs(broken, FakeAnchor(machine), machine.clock), 1, 1.1e-3)  # type: ignore[arg-type]
    sweep.add("fine", Pairs(_bench(machine, 1e-3), FakeAnchor(machine), machine.clock), 1, 1.1e-3)  # type: ignore[arg-type]
    got = sweep.run()
    assert "RuntimeError: session closed" in got["broken"].error
    assert not got["fine"].error and len(got["fine"].data) >= MIN_ROUNDS
    records = [
        BenchRecord.from_json({"fullname": n, "data": [1.0] * 20, "extra_info": {"anchor": {"samples": [1.0] * 20}}})
        for n in ("broken", "fine")
    ]
    changed, lines = apply(records, got)
    assert len(lines) == 1 and "broken: not timed across the run (RuntimeError: session closed)" in lines[0]
    assert changed[0].data == (1.0,) * 20  # its test's own rounds stay its figure
    assert changed[0].extra_info["swept"] == {"error": got["broken"].error}
    fine = changed[1]
    assert fine.data == got["fine"].data
    assert fine.anchor.samples == got["fine"].anchors
    assert fine.extra_info["swept"]["test_rounds"] == 20  # type: ignore[index]
    assert fine.extra_info["swept"]["rounds"] == len(got["fine"].data)  # type: ignore[index]
    assert fine.time_per_call_s == statistics.median(got["fine"].data)
    assert records[1].data == (1.0,) * 20  # the records themselves are not changed


def test_swept_json_round_trip() -> None:
    swept = Swept((1.0, 2.0), (0.5, 0.5), 2, 1.25, "")
    assert Swept.from_json(swept.to_json()) == swept


def _figure(data: tuple[float, ...] | list[float], anchors: tuple[float, ...] | list[float]) -> float:
    return math.log(statistics.median(d / a for d, a in zip(data, anchors, strict=False)))


def test_a_figure_taken_across_the_run_moves_less_than_one_taken_in_a_stretch() -> None:
    """What the sweep is for, on a machine whose state changes every second: ten benchmarks, each timed in one
    stretch of half a second (as a test's own rounds are) and then by the sweep; over 30 simulated runs the
    swept figure of a benchmark moves far less between runs than its stretch does: the sweep spans about five of
    the machine's states, so about 1/sqrt(5) as far. (Seeded: the same draws every run.)"""
    stretch: list[float] = []
    swept: list[float] = []
    for seed in range(30):
        machine = Machine(seed, regime_s=1.0, sd=0.08)
        anchor = FakeAnchor(machine)
        cost = 5e-4
        block_data, block_anchors = paired_rounds(
            _bench(machine, cost), anchor, 1, int(0.5 / (cost + 1e-4)), machine.clock
        )  # type: ignore[arg-type]
        stretch.append(_figure(block_data, block_anchors))
        sweep = Sweep()
        for i in range(10):
            sweep.add(f"b{i}", Pairs(_bench(machine, cost), anchor, machine.clock), 1, cost + 1e-4)  # type: ignore[arg-type]
        got = sweep.run()
        swept.append(_figure(got["b0"].data, got["b0"].anchors))
    spread_stretch, spread_swept = statistics.stdev(stretch), statistics.stdev(swept)
    assert spread_swept < 0.6 * spread_stretch, (spread_stretch, spread_swept)


def test_the_sweep_setting_takes_seconds_and_zero_turns_it_off() -> None:
    from pytest_lstmperf import options

    setting = options.SETTINGS["lstmperf_sweep"]
    assert setting.option == "--lstmperf-sweep" and setting.env == "PYTEST_LSTMPERF_SWEEP"
    assert setting.parse(setting.default or "") == sweep_mod.SPAN_S
    assert setting.parse("0") == 0.0
    for bad in ("-1", "soon", "601"):
        with pytest.raises(ValueError, match=repr(bad)):
            setting.parse(bad)
    # a short sweep spends less on each benchmark too (tests' inner runs)
    assert Plan.of(3, 0.2).work_s == pytest.approx(0.2)


def test_a_call_on_a_cpu_is_timed_after_an_untimed_call_of_its_own() -> None:
    """Planted: a call that pays for what the anchor evicted, twice its own cost when it runs first after the
    anchor (on the 2-core VM ONNX Runtime's LSTM at batch 1 took 57-78 us right after the anchor, by how long the
    anchor ran, and 34-37 us after a call of its own). On a CPU the timed call follows an untimed one, so every
    sample is the warm call's; on a GPU (``torch-cuda``, whose device time decides) the call is timed as before."""
    machine = Machine(0, sd=0.0)
    after_anchor = [True]

    class Evicting(FakeAnchor):
        def time(self, repeat: int, clock: object = None) -> float:
            after_anchor[0] = True
            return super().time(repeat, clock)

    def call() -> None:
        machine.work(2e-3 if after_anchor[0] else 1e-3)
        after_anchor[0] = False

    cpu = Pairs(call, Evicting(machine), machine.clock)  # type: ignore[arg-type]
    assert cpu.kind == "fake-warm" and cpu.calls == 2
    data, anchors = cpu.rounds(1, 10)
    assert data == pytest.approx([1e-3] * 10) and len(anchors) == 10
    gpu_anchor = Evicting(machine)
    gpu_anchor.kind = "torch-cuda"
    gpu = Pairs(call, gpu_anchor, machine.clock)  # type: ignore[arg-type]
    assert gpu.kind == "torch-cuda" and gpu.calls == 1
    assert gpu.rounds(1, 10)[0] == pytest.approx([2e-3] * 10)
