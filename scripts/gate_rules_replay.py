"""Two candidate changes to how a benchmark's between-process spread is moderated, replayed on recorded compares
beside the rule itself (what one process of each compare decides, as scripts/gate_between.py counts it):

- ``floor at the pool``: a benchmark's spread is never taken below its mode's pool;
- ``t on own+prior dof``: Student's t counts the benchmark's own degrees of freedom and the pool's weight
  (``policy.PRIOR_DOF``), not the pool's own degrees of freedom.

    python scripts/gate_rules_replay.py OUT.json LABEL=BASELINE.json:RUN.json[,RUN.json ...] [...]

docs/gate-evidence.md holds what it printed on the VM's and the Xeon's series of 2026-11-29 and 2026-11-30.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gate_between import extract

from pytest_lstmperf.speed import policy
from pytest_lstmperf.speed.policy import Reference

RULE = Reference.between


def floor_at_pool(self: Reference, metric: str, variant: str | None = None) -> tuple[float, int] | None:
    out = RULE(self, metric, variant)
    variant = variant or self.variant(metric)
    pool = self.spread.get((metric, variant))
    if out is None or pool is None or pool.benchmarks <= 1 or self.scatters(metric, variant):
        return out
    if variant == "raw" and self._logs(metric, "anchored"):
        return out  # judged raw on its own processes
    return max(out[0], pool.sigma), out[1]


def own_and_prior_dof(self: Reference, metric: str, variant: str | None = None) -> tuple[float, int] | None:
    out = RULE(self, metric, variant)
    own = self.own_variance(metric, variant or self.variant(metric))
    if out is None or own is None:
        return out
    return out[0], min(out[1], own[1] + policy.PRIOR_DOF)


RULES: dict[str, Callable[..., tuple[float, int] | None]] = {
    "the rule": RULE,
    "floor at the pool": floor_at_pool,
    "t on own+prior dof": own_and_prior_dof,
}


def judge(row: dict[str, Any]) -> tuple[str, float]:
    resolves = policy.resolution(row["sigma_b"], 1, row["recorded"], row["se"], row["metric"])
    if row["ratio"] > max(row["threshold"], resolves):
        return "regressed", resolves
    if resolves > max(policy.MAX_LIMIT, row["threshold"]):
        return "inconclusive", resolves
    return "passed", resolves


def main(out: Path, sets: list[str]) -> None:
    table: dict[str, dict[str, Any]] = {}
    for rule, between in RULES.items():
        Reference.between = between  # type: ignore[method-assign]
        for one in sets:
            label, _, files = one.partition("=")
            baseline, _, runs = files.partition(":")
            rows = extract(label, Path(baseline), [Path(r) for r in runs.split(",")])
            clean = [r for r in rows if r["scenario"] == "clean"]
            hit = [r for r in rows if r["targeted"] and r["scenario"].startswith("slowdown")]
            seen, caught = [judge(r) for r in clean], [judge(r)[0] for r in hit]
            table[f"{rule} | {label}"] = {
                "clean_checks": len(clean),
                "false_alarms": sum(v == "regressed" for v, _ in seen),
                "inconclusive": sum(v == "inconclusive" for v, _ in seen),
                "median_resolution": round(statistics.median(r for _, r in seen), 3) if seen else None,
                "caught": caught.count("regressed"),
                "targeted": len(hit),
                "alarms": [
                    [r["run"], r["name"], r["ratio"], round(res, 3)]
                    for r, (v, res) in zip(clean, seen, strict=True)
                    if v == "regressed"
                ],
            }
            print(rule, "|", label, json.dumps(table[f"{rule} | {label}"]), flush=True)
    Reference.between = RULE  # type: ignore[method-assign]
    out.write_text(json.dumps(table, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
