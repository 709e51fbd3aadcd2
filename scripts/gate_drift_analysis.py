"""Replay the speed gate's decision on stored runs, with the drift correction and without it.

    python scripts/gate_drift_analysis.py BASELINE.json RUN.json [RUN.json ...]

Each RUN is a ``--benchmark-json`` file of ``suites/test_benchmarks.py``. For every run, prints how many
benchmarks each rule calls regressed / improved / unchanged, the spread of the drift probe's now/baseline
ratio, and the regressed ones.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_lstmperf.regression import compare_samples, drift_ratio  # noqa: E402


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__)
        return 2
    base = {b["fullname"]: b for b in json.loads(Path(argv[0]).read_text())["benchmarks"]}
    for run_file in argv[1:]:
        run = json.loads(Path(run_file).read_text())
        counts = {"probe": Counter(), "off": Counter()}
        flagged: dict[str, list[str]] = {"probe": [], "off": []}
        drifts = []
        for bench in run["benchmarks"]:
            entry = base.get(bench["fullname"])
            data = bench["stats"].get("data") or []
            if entry is None or not data:
                continue
            extra, bextra = bench["extra_info"], entry["extra_info"]
            drift = drift_ratio(bextra.get("drift_probe") or [], extra.get("drift_probe") or [])
            if drift:
                drifts.append(drift)
            for mode in ("probe", "off"):
                d = compare_samples(
                    bench["fullname"], entry["stats"]["data"], data,
                    drift=drift if mode == "probe" else None,
                    device_s=extra.get("device_time_s") if mode == "probe" else None,
                )  # fmt: skip
                counts[mode][d.verdict] += 1
                if d.verdict == "regressed":
                    flagged[mode].append(f"{bench['name']} x{d.ratio:.3f}")
        spread = f"{min(drifts):.3f}..{max(drifts):.3f} (median {statistics.median(drifts):.3f})" if drifts else "-"
        print(f"{Path(run_file).name}: drift probe now/baseline {spread}")
        for mode in ("probe", "off"):
            summary = ", ".join(f"{n} {v}" for v, n in sorted(counts[mode].items()))
            print(f"  drift={mode:5s} {summary}")
            for line in flagged[mode]:
                print(f"      regressed: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
