"""How small the rule's between-run term for a time per call (``policy.BETWEEN_RUNS["per-call"]``) could be: the
first process of recorded compares, replayed through the rule with that term set to each value in turn, counting
false alarms on clean runs, catches on planted slowdowns, and the median resolution.

    python scripts/gate_between.py extract TABLE.json LABEL=BASELINE.json:RUN.json[,RUN.json ...] [...]
    python scripts/gate_between.py sweep TABLE.json [--markdown]

``extract`` reads each ``--benchmark-json`` file of a compare (``RUN.json``, named by its scenario as
scripts/gate_trials.py names it: ``clean-3``, ``xdist-clean-1``, ``fault=slowdown:1.5-1``) against the baseline it
was compared with, and keeps one row per benchmark: the figure's ratio to the baseline's, its standard error, how
far the recording's processes lie apart (widened as the rule widens it) and how many there were. The rows are small
enough to commit beside the evidence (docs/data; gzip-compressed where ``TABLE`` ends in ``.gz``). ``sweep``
replays them through :func:`policy.resolution` with each between-run term; it counts what one process decides, as
scripts/gate_replay.py does: the gate confirms a slowdown seen on one process with a second, so a first-process
alarm is an upper bound of the false alarms.
"""

from __future__ import annotations

import gzip
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from gate_replay import _read, targeted

from pytest_lstmperf.speed import policy
from pytest_lstmperf.speed.baseline_file import reference_of
from pytest_lstmperf.speed.records import BaselineEntry, BenchRecord

#: the between-run terms the sweep tries (log scale); the rule's own value is among them
TERMS = (0.0, 0.01, 0.02, 0.025, 0.03, 0.035, 0.04, 0.05)


def scenario_of(run: Path) -> str:
    """``clean`` or the planted fault (``slowdown:1.5``) from a run file's name as scripts/gate_trials.py writes it."""
    stem = run.name.removesuffix(".gz").removesuffix(".json")
    if stem.startswith("fault="):
        return stem.removeprefix("fault=").rsplit("-", 1)[0]
    return "clean"


def extract(label: str, baseline: Path, runs: list[Path]) -> list[dict[str, Any]]:
    entries = {b["fullname"]: b for b in _read(baseline)["benchmarks"]}
    references = policy.pooled({name: reference_of(BaselineEntry.from_json(e)) for name, e in entries.items()})
    rows = []
    for run in runs:
        scenario = scenario_of(run)
        for record in _read(run)["benchmarks"]:
            name = record["fullname"]
            reference = references.get(name)
            if reference is None:
                continue
            record = {**record, "data": (record.get("stats") or {}).get("data") or record.get("data") or []}
            measurement = BenchRecord.from_json(record).measurement()
            for metric in policy.metrics_of(reference, measurement.first):
                variant = reference.variant(metric)
                now = policy.Figure.of(measurement.first.samples(metric, variant))
                then = reference.figure(metric, variant)
                if now is None or then is None:
                    continue
                value, sigma_b, n = then
                rows.append(
                    {
                        "machine": label,
                        "run": run.name.removesuffix(".gz").removesuffix(".json"),
                        "scenario": scenario,
                        "name": name.rsplit("::", 1)[-1],
                        "metric": metric,
                        "variant": variant,
                        "targeted": targeted(scenario, record.get("extra_info") or {}),
                        "ratio": round(now.value / value, 5),
                        "se": round(now.se, 5),
                        "sigma_b": round(sigma_b, 5),
                        "recorded": n,
                        "threshold": measurement.threshold or policy.THRESHOLD,
                    }
                )
    return rows


def resolves(row: dict[str, Any], term: float) -> float:
    """The slowdown one process of the run resolves (:func:`policy.resolution`) with the between-run term ``term``."""
    saved = dict(policy.BETWEEN_RUNS)
    policy.BETWEEN_RUNS["per-call"] = term
    try:
        return policy.resolution(row["sigma_b"], 1, row["recorded"], row["se"], row["metric"])
    finally:
        policy.BETWEEN_RUNS.clear()
        policy.BETWEEN_RUNS.update(saved)


def judge(row: dict[str, Any], term: float) -> str:
    """What one process decides with the between-run term set to ``term``: regressed, inconclusive or passed (as
    :func:`policy.check` decides)."""
    resolution = resolves(row, term)
    if row["ratio"] > max(row["threshold"], resolution):
        return "regressed"
    if resolution > max(policy.MAX_LIMIT, row["threshold"]):
        return "inconclusive"
    return "passed"


def sweep(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for machine in sorted({r["machine"] for r in rows}):
        mine = [r for r in rows if r["machine"] == machine]
        for term in TERMS:
            clean = [r for r in mine if r["scenario"] == "clean"]
            hit = [r for r in mine if r["targeted"] and r["scenario"].startswith("slowdown")]
            seen = [judge(r, term) for r in clean]
            resolutions = [resolves(r, term) for r in clean]
            out.append(
                {
                    "machine": machine,
                    "term": term,
                    "clean_runs": len({r["run"] for r in clean}),
                    "false_alarms": seen.count("regressed"),
                    "inconclusive": seen.count("inconclusive"),
                    "clean_checks": len(clean),
                    "runs_alarmed": len({r["run"] for r, v in zip(clean, seen, strict=True) if v != "passed"}),
                    "caught": sum(judge(r, term) == "regressed" for r in hit),
                    "targeted": len(hit),
                    "median_resolution": round(statistics.median(resolutions), 3) if resolutions else None,
                    "worst_ratio_over_limit": round(
                        max(
                            (math.log(r["ratio"]) / math.log(max(r["threshold"], res)) for r, res in
                             zip(clean, resolutions, strict=True)),
                            default=0.0,
                        ),
                        2,
                    ),
                }
            )  # fmt: skip
    return out


def markdown(table: list[dict[str, Any]]) -> str:
    lines = [
        "| machine | between-run term | clean runs with an alarm | false alarms / checks (inconclusive) | "
        "median resolution | worst log ratio / log limit | 1.5x slowdown caught |",
        "|---|---|---|---|---|---|---|",
    ]
    for t in table:
        lines.append(
            f"| {t['machine']} | {t['term']:.1%} | {t['runs_alarmed']}/{t['clean_runs']} | "
            f"{t['false_alarms']}/{t['clean_checks']} ({t['inconclusive']}) | {t['median_resolution']}x | "
            f"{t['worst_ratio_over_limit']} | {t['caught']}/{t['targeted']} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "extract":
        rows = []
        for spec in argv[2:]:
            label, _, files = spec.partition("=")
            baseline, _, runs = files.partition(":")
            rows += extract(label, Path(baseline), [Path(p) for p in runs.split(",") if p])
        data = (json.dumps(rows, indent=0) + "\n").encode()
        Path(argv[1]).write_bytes(gzip.compress(data, mtime=0) if argv[1].endswith(".gz") else data)
        print(f"{len(rows)} rows -> {argv[1]}")
        return 0
    if len(argv) >= 2 and argv[0] == "sweep":
        table = sweep(_read(Path(argv[1])))
        print(markdown(table) if "--markdown" in argv else json.dumps(table, indent=1))
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
