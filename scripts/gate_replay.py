"""Replay recorded gate runs through the rule (pytest_lstmperf/speed/policy.py), with each kept mechanism removed
in turn, and count what it changes: false alarms on clean runs, detections on planted ones.

    python scripts/gate_replay.py BASELINE.json SCENARIO=RUN.json [SCENARIO=RUN.json ...] [--markdown]

``BASELINE.json`` is a baseline file; each ``RUN.json`` is a ``--benchmark-json`` file of one compare run (every
record with its ``extra_info``: anchor samples, device samples, host counters). ``SCENARIO`` is
``clean`` or the planted fault (``slowdown:1.5``, ``kernel-slowdown:1.10``, ``host-work:40``, ``fallback``), with
an optional ``#k`` run suffix. A planted fault targets the benchmarks of the torch framework (the faults are
planted in ``torch.nn.LSTM``/``GRU`` of the test process); an alarm there is a detection, an alarm anywhere else a
false alarm.

The variants: the rule as it is; without the anchor (every anchor sample set to one: raw times compared);
without the resolution (the limit is the threshold alone); without the host counts; without pooling the spread
(each benchmark's recording runs alone say how far runs lie apart). (Runs recorded while the gate
took a second look at a figure past its limit carry it as ``extra_info.second_look``; the rule no longer reads
it: the first look decides.)
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pytest_lstmperf.speed import policy
from pytest_lstmperf.speed.baseline_file import reference_of
from pytest_lstmperf.speed.records import BaselineEntry, BenchRecord

Record = dict[str, Any]


def _read(path: Path) -> Any:
    """A JSON file, gzip-compressed where its name ends in ``.gz`` (as the committed runs in docs/data are)."""
    import gzip

    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return json.loads(raw)


def _no_anchor(record: Record) -> Record:
    out = copy.deepcopy(record)
    anchor = out["extra_info"].get("anchor") or {}
    for key in ("samples", "device_samples"):
        if anchor.get(key):
            anchor[key] = [1.0] * len(anchor[key])
    return out


def _no_counters(record: Record) -> Record:
    out = copy.deepcopy(record)
    out["extra_info"].pop("host_counters", None)
    return out


VARIANTS: dict[str, tuple[Callable[[Record], Record], float | None]] = {
    "the rule": (lambda r: r, None),
    "without the anchor": (_no_anchor, None),
    "without the resolution": (lambda r: r, 0.0),
    "without the host counts": (_no_counters, None),
    "without pooling the spread": (lambda r: r, None),
}


def targeted(scenario: str, extra: dict[str, Any]) -> bool:
    kind = scenario.split("#")[0].split(":")[0]
    if kind == "clean":
        return False
    if kind == "fallback":
        return extra.get("framework") == "torch" and extra.get("expected_kernel") in ("cudnn", "onednn")
    return extra.get("framework") == "torch"


def _baseline_for(variant: str, entries: dict[str, Any]) -> dict[str, Any]:
    """The baseline's references as the variant sees them: without the anchor, figures rebuilt from raw samples
    where the entry has only its latest run's samples (one run)."""
    if variant == "without pooling the spread":
        return {name: reference_of(BaselineEntry.from_json(e)) for name, e in entries.items()}
    if variant != "without the anchor":
        return policy.pooled({name: reference_of(BaselineEntry.from_json(e)) for name, e in entries.items()})
    refs = {}
    for name, entry in entries.items():
        record = {"fullname": name, "data": entry["stats"]["data"], "extra_info": entry.get("extra_info") or {}}
        measured = BenchRecord.from_json(_no_anchor(record)).measurement()
        ref = reference_of(BaselineEntry.from_json(entry))
        refs[name] = policy.Reference(name, (policy.run_figures(measured),), ref.kernel, ref.versions)
    return policy.pooled(refs)


def replay(baseline: Path, runs: list[tuple[str, Path]]) -> dict[str, dict[str, list[int]]]:
    """variant -> scenario kind -> [alarms on targeted, targeted, alarms elsewhere, elsewhere]."""
    entries = {b["fullname"]: b for b in _read(baseline)["benchmarks"]}
    table: dict[str, dict[str, list[int]]] = {}
    threshold = policy.THRESHOLD
    for variant, (transform, k_sigma) in VARIANTS.items():
        references = _baseline_for(variant, entries)
        rows: dict[str, list[int]] = {}
        saved = policy.K_SIGMA
        if k_sigma is not None:
            policy.K_SIGMA = k_sigma
        try:
            for scenario, path in runs:
                kind = scenario.split("#")[0]
                row = rows.setdefault(kind, [0, 0, 0, 0])
                for record in _read(path)["benchmarks"]:
                    name = record["fullname"]
                    if name not in references:
                        continue
                    record = {**record, "data": record.get("stats", {}).get("data") or record.get("data") or []}
                    decision = policy.decide(
                        BenchRecord.from_json(transform(record)).measurement(),
                        references[name],
                        threshold,
                    )
                    hit = targeted(scenario, record.get("extra_info") or {})
                    row[0 if hit else 2] += decision.failed
                    row[1 if hit else 3] += 1
        finally:
            policy.K_SIGMA = saved
        table[variant] = rows
    return table


def markdown(table: dict[str, dict[str, list[int]]]) -> str:
    kinds = list(next(iter(table.values())))
    header = "| variant | " + " | ".join(kinds) + " |"
    lines = [header, "|" + "---|" * (len(kinds) + 1)]
    for variant, rows in table.items():
        cells = []
        for kind in kinds:
            hit, targets, alarms, others = rows[kind]
            cells.append(
                f"{alarms}/{others} false alarms"
                if kind == "clean"
                else f"{hit}/{targets} caught, {alarms}/{others} false"
            )
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = [a for a in argv if a != "--markdown"]
    if len(args) < 2:
        print(__doc__)
        return 2
    runs = [(s, Path(p)) for s, _, p in (a.partition("=") for a in args[1:])]
    table = replay(Path(args[0]), runs)
    if "--markdown" in argv:
        print(markdown(table))
    else:
        print(json.dumps(table, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
