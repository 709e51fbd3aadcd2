"""Replay the speed gate's decision on stored runs under each rule: device time (the default where CUDA-graph
replay times exist), per-call time, and per-call time corrected by the drift probe.

    python scripts/gate_drift_analysis.py BASELINE.json RUN.json [RUN.json ...]

Each RUN is a ``--benchmark-json`` file of ``suites/test_benchmarks.py``. For every run, prints how many
benchmarks each rule calls regressed / improved / unchanged, the spread of the now/baseline ratios of the
device time, the per-call time and the drift probe, and the regressed ones.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_lstmperf.speed.regression import compare_samples, drift_ratio, pick_samples

RULES = ("device", "per-call", "per-call+probe")


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__)
        return 2
    base = {b["fullname"]: b for b in json.loads(Path(argv[0]).read_text())["benchmarks"]}
    for run_file in argv[1:]:
        run = json.loads(Path(run_file).read_text())
        counts = {rule: Counter() for rule in RULES}
        flagged: dict[str, list[str]] = {rule: [] for rule in RULES}
        ratios: dict[str, list[float]] = {"device": [], "per-call": [], "probe": []}
        for bench in run["benchmarks"]:
            entry = base.get(bench["fullname"])
            data = bench["stats"].get("data") or []
            if entry is None or not data:
                continue
            extra, bextra = bench["extra_info"], entry["extra_info"]
            drift = drift_ratio(bextra.get("drift_probe") or [], extra.get("drift_probe") or [])
            for key, value in (
                ("device", drift_ratio(bextra.get("device_samples") or [], extra.get("device_samples") or [])),
                ("per-call", drift_ratio(entry["stats"]["data"], data)),
                ("probe", drift),
            ):
                if value:
                    ratios[key].append(value)
            for rule in RULES:
                _, b, n, _ = pick_samples(
                    "device" if rule == "device" else "per-call", bextra, extra, entry["stats"]["data"], data
                )
                d = compare_samples(
                    bench["fullname"], b, n,
                    drift=drift if rule == "per-call+probe" else None,
                    device_s=extra.get("device_time_s") if rule == "per-call+probe" else None,
                    kernel_then=f"{bextra.get('kernel')}/{bextra.get('precision')}",
                    kernel_now=f"{extra.get('kernel')}/{extra.get('precision')}",
                )  # fmt: skip
                counts[rule][d.verdict] += 1
                if d.failed:
                    flagged[rule].append(f"{bench['name']} {d.verdict} x{d.ratio:.3f}" if d.ratio else bench["name"])
        print(f"{Path(run_file).name}:")
        for key, values in ratios.items():
            if values:
                middle = statistics.median(values)
                print(f"  {key:9s} now/baseline {min(values):.3f}..{max(values):.3f} (median {middle:.3f})")
        for rule in RULES:
            summary = ", ".join(f"{n} {v}" for v, n in sorted(counts[rule].items()))
            print(f"  rule {rule:15s} {summary}")
            for line in flagged[rule]:
                print(f"      failed: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
