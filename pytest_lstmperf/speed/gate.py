"""The speed gate's state in a run: what it compares against, the records, the decisions (:mod:`.verdict`) and the
verdict, and the messages and errors printed with it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .policy import MAX_LIMIT, GateResult

if TYPE_CHECKING:
    from ..anchor import Anchor
    from .baseline import SaveReport
    from .baseline_file import Baseline
    from .records import BenchRecord
    from .sweep import Sweep, Swept
    from .verdict import Verdict


@dataclass
class GateState:
    compare: str | None = None  # "device" (no argument), "file" (an lstmperf baseline named), None
    compare_requested: bool = False
    baseline: Baseline | None = None
    records: list[BenchRecord] = field(default_factory=list)
    save_report: SaveReport | None = None
    gate: GateResult | None = None
    messages: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    report_path: Path | None = None
    deferred_compare: object = None  # --benchmark-compare's value, until collection shows lstmperf benchmarks
    verdict: Verdict | None = None  # the run's verdict (:func:`.verdict.judge`); its lines are printed last
    anchor: Anchor | None = None  # the run's anchor workload, made by the first benchmark
    #: the benchmarks to time again across the run as it ends, where the gate compares or records (:mod:`.sweep`)
    sweep: Sweep | None = None
    #: what the sweeps measured, by benchmark: this process's, and under pytest-xdist every worker's
    swept: dict[str, Swept] = field(default_factory=dict)
    #: wall seconds of the gate's own phases after the tests (the recording's and the compare's further processes)
    phase_s: dict[str, float] = field(default_factory=dict)
    #: the anchor repetitions each benchmark is timed with where this run's first process decided them (its
    #: baseline's): handed to pytest-xdist's workers and to the run's further processes, which time every benchmark
    #: with them (:meth:`anchor_repeat`)
    anchor_repeats: dict[str, int] = field(default_factory=dict)
    #: this process records every benchmark it times: a recording's first process, one of its further processes,
    #: or a further process of a compare (which times only benchmarks it judges)
    recording: bool = False
    #: under pytest-xdist, a worker's: the benchmarks its controller's baseline has entries for (the workers do not
    #: load it); None where the controller compares with no lstmperf baseline, or this is no worker
    judged: frozenset[str] | None = None
    #: the slowdown a recording and a compare buy further processes to resolve (``--lstmperf-resolution``), read
    #: once as the run ends; the run's report names the checks short of it
    goal: float = MAX_LIMIT

    def anchor_repeat(self, nodeid: str) -> int | None:
        """The anchor repetitions ``nodeid`` must be timed with, None where no process of the run decided them yet
        (a new entry: fitted to its call). A call's own time depends on how long the anchor ran just before it: on
        the 2-core VM Keras-on-TensorFlow's LSTM at batch 1 read 1.57 of the anchor after one repetition and 2.53
        after eight, in one worker. Under pytest-xdist, which fitted them anew from a noisy estimate, a compare
        that doubled them read 1.155x its recording, regressed."""
        if nodeid in self.anchor_repeats:
            return self.anchor_repeats[nodeid]
        entry = self.baseline.benchmarks.get(nodeid) if self.baseline is not None else None
        return (entry.anchor_repeat or None) if entry is not None else None

    def judges_benchmark(self, nodeid: str) -> bool:
        """Whether this run judges or records ``nodeid``'s figure: it records, or the lstmperf baseline it compares
        with has an entry for it (under pytest-xdist, the controller's: :attr:`judged`). A benchmark it does not
        judge is measured for the report alone: no sweep, and its device time from the first half of its samples.
        A run that compares with no lstmperf baseline (pytest-benchmark's own saved run) measures every one in
        full: pytest-benchmark judges them."""
        if self.recording:
            return True
        if self.baseline is not None:
            return nodeid in self.baseline.benchmarks
        return self.judged is None or nodeid in self.judged

    def known_repeats(self) -> dict[str, int]:
        """Every anchor repetition this process knows before timing: the baseline's, and those handed to it."""
        out: dict[str, int] = {}
        if self.baseline is not None:
            out.update({k: e.anchor_repeat for k, e in self.baseline.benchmarks.items() if e.anchor_repeat})
        out.update(self.anchor_repeats)
        return out
