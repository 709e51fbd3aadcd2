"""The speed gate's run: its state, and every record of a run decided against the baseline by :mod:`.policy`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .baseline import reference_of
from .policy import Decision, GateResult, Measurement, Reference, decide, pooled, upgrade_of

if TYPE_CHECKING:
    from ..device import DeviceInfo
    from .baseline import Baseline, SaveReport
    from .timing import Anchor


@dataclass
class GateState:
    compare: str | None = None  # "device" (no argument), "file" (an lstmperf baseline named), None
    compare_requested: bool = False
    baseline: Baseline | None = None
    records: list[dict[str, Any]] = field(default_factory=list)
    save_report: SaveReport | None = None
    gate: GateResult | None = None
    messages: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    report_path: Path | None = None
    device: DeviceInfo | None = None
    deferred_compare: object = None  # --benchmark-compare's value, until collection shows lstmperf benchmarks
    outcome: list[str] = field(default_factory=list)  # the gate's last lines, printed after every other summary
    anchor: Anchor | None = None  # the run's anchor workload, made by the first benchmark


def references_of(baseline: Baseline) -> dict[str, Reference]:
    """Every entry of ``baseline`` as a :class:`~.policy.Reference`, how far processes lie apart pooled over them."""
    return pooled({name: reference_of(entry) for name, entry in baseline.entries.items()})


def run_gate(
    baseline: Baseline,
    records: list[dict[str, Any]],
    threshold: float,
    versions: Mapping[str, str],
    unavailable: Mapping[str, str],
    more: Mapping[str, list[dict[str, Any]]] | None = None,
) -> GateResult:
    """Every record against the baseline (:func:`.policy.decide`); baseline entries this run did not measure are
    not-run, or path-lost where their path is ``unavailable`` now (path name -> why); the upgrade, where the
    entries' versions differ from ``versions``."""
    entries = baseline.entries
    references = references_of(baseline)
    more = more or {}
    decisions = [
        decide(
            Measurement.from_record(record),
            references.get(record["fullname"]),
            threshold,
            [Measurement.from_record(r) for r in more.get(record["fullname"], ())],
        )
        for record in records
    ]
    seen = {record["fullname"] for record in records}
    for name, entry in entries.items():
        if name in seen:
            continue
        path = entry.get("extra_info", {}).get("path")
        if path in unavailable:
            decisions.append(Decision(name, "path-lost", notes=(f"{path} is unavailable now: {unavailable[path]}",)))
        else:
            decisions.append(Decision(name, "not-run"))
    compared = [references[name] for name in seen if name in references]
    return GateResult(decisions, upgrade_of(compared, versions))
