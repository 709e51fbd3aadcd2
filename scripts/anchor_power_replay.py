"""How far compares on other machines lie from their recording, with each figure divided by the anchor, raw, or
divided by the anchor to a power fitted on the recording's processes (a control variate's coefficient).

    python scripts/anchor_power_replay.py BASELINE.json[.gz] RUN.json[.gz] [RUN.json[.gz] ...]

``BASELINE.json`` is a baseline file whose entries hold several recording processes; each ``RUN.json`` is the
``--benchmark-json`` file of one clean compare against it (the first process of that compare). For each benchmark
the recording's processes give its raw time per call and its time divided by the anchor, both as medians of the
process's pairs; the slope of the raw log time on the anchor's (the anchor as each process's two figures imply
it) is the power. A figure divided by the anchor to the power ``b`` is ``raw ** (1 - b) * anchored ** b``: 1 is
the gate's figure, 0 raw time. The script prints, per group (Keras on JAX, the rest), the root mean square of
each figure's log distance from its recording's mean, and the median of the recording processes' own spread.
The first says what a compare on another machine sees; the second only what the recording saw.
"""

from __future__ import annotations

import gzip
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from pytest_lstmperf.speed import policy
from pytest_lstmperf.speed.baseline_file import load, reference_of
from pytest_lstmperf.speed.records import BenchRecord

VARIANTS = (("divided by the anchor", 1.0), ("to the fitted power", None), ("raw", 0.0))


def _text(path: Path) -> str:
    raw = path.read_bytes()
    return (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode()


def _group(name: str) -> str:
    return "Keras on JAX" if "keras-jax" in name else "the others"


def replay(baseline: Path, runs: list[Path]) -> dict[tuple[str, str], tuple[list[float], list[float]]]:
    """(group, variant) -> (each compared figure's log distance from its recording's mean, the recording's own
    spread of that figure)."""
    with tempfile.TemporaryDirectory() as folder:
        plain = Path(folder) / "baseline.json"
        plain.write_text(_text(baseline))
        references = {name: reference_of(entry) for name, entry in load(plain).benchmarks.items()}
    fitted: dict[str, tuple[float, np.ndarray, np.ndarray]] = {}
    for name, ref in references.items():
        pairs = [(run.per_call_raw, run.per_call) for run in ref.runs if run.per_call_raw and run.per_call]
        if len(pairs) < 3:
            continue
        raw = np.array([math.log(r.value) for r, _ in pairs])
        anchored = np.array([math.log(a.value) for _, a in pairs])
        anchor = raw - anchored
        design = np.vstack([np.ones_like(anchor), anchor]).T
        coef, *_ = np.linalg.lstsq(design, raw, rcond=None)
        fitted[name] = (float(coef[1]), raw, anchored)
    out: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
    for path in runs:
        for record in json.loads(_text(path))["benchmarks"]:
            name = record["fullname"]
            if name not in fitted:
                continue
            row: dict[str, Any] = {**record, "data": record.get("stats", {}).get("data") or record.get("data") or []}
            look = BenchRecord.from_json(row).measurement().first
            now_anchored, now_raw = policy.Figure.of(look.per_call), policy.Figure.of(look.per_call_raw)
            if now_anchored is None or now_raw is None:
                continue
            power, raw, anchored = fitted[name]
            for variant, fixed in VARIANTS:
                b = power if fixed is None else fixed
                now = (1 - b) * math.log(now_raw.value) + b * math.log(now_anchored.value)
                then = (1 - b) * raw + b * anchored
                distances, spreads = out.setdefault((_group(name), variant), ([], []))
                distances.append(now - float(then.mean()))
                spreads.append(float(then.std(ddof=1)))
    return out


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__)
        return 2
    table = replay(Path(argv[0]), [Path(p) for p in argv[1:]])
    print("| benchmarks | figure | compared | from their recording (rms) | recording processes apart (median) |")
    print("|---|---|---|---|---|")
    for (group, variant), (distances, spreads) in sorted(table.items()):
        rms = math.sqrt(statistics.fmean(d * d for d in distances))
        print(f"| {group} | {variant} | {len(distances)} | {rms:.1%} | {statistics.median(spreads):.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
