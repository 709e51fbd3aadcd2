"""The speed gate's state in a run: what it compares against, the records, the decisions (:mod:`.verdict`) and the
verdict, and the messages and errors printed with it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .policy import GateResult

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
