"""How far recordings made at different times (sittings) lie apart, per pool of the rule (forward calls, training
steps), beyond what each recording's own processes say.

    python scripts/sitting_compare.py LABEL=BASELINE.json[.gz] LABEL=BASELINE.json[.gz] [...] [--beside=LABEL]
        [--sittings] [--by-path]

Each ``BASELINE`` is a baseline file of one machine, recorded at its own time by the same gate. For every pair,
and every benchmark the two share with the same anchor repetition count (a different count moves the figure:
docs/speed-gate.md, "What runs just before a call moves it"), the difference of the two recordings' mean log
figures is taken. Per pool the script prints the median ratio, the root mean square difference, the typical
standard error the two recordings' processes give it, and ``T``: the spread one sitting adds beyond them,
sqrt((rms^2 - se^2) / 2), and the same from the median absolute deviation; then the pair's largest ratio.

``--sittings``: a baseline whose entries hold several sittings (an update kept an earlier recording) is split into
one baseline per sitting, labelled ``LABEL@SITTING``, each pooled alone (a baseline of one sitting stays one).

``--by-path``: per pool, also how much of the differences a benchmark shares with the others of its path (the
forward calls of ``torch-compile-cpu``, of ``keras-jax-cpu``, ...): each path's mean difference, and the root mean
square left within paths once it is taken away (``within_paths``). A move that a path's benchmarks share is one
an anchor timed in that path could follow; one within paths is not.

``--beside=LABEL``: that baseline's last recording process was timed beside a planted neighbour
(``--lstmperf-record-neighbour=stream``); its figure divided by the mean of the others' is correlated, benchmark by
benchmark, with each pair's differences: whether what moved between two sittings looks like that neighbour.
"""

from __future__ import annotations

import dataclasses
import gzip
import itertools
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from pytest_lstmperf.speed import policy
from pytest_lstmperf.speed.baseline_file import reference_of
from pytest_lstmperf.speed.records import BaselineEntry


def _entries(path: Path) -> list[dict[str, Any]]:
    raw = path.read_bytes()
    return list(json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)["benchmarks"])


def load(path: Path) -> tuple[dict[str, policy.Reference], dict[str, object]]:
    """The baseline's references, pooled as the rule pools them, and each entry's anchor repetition count."""
    entries = _entries(path)
    refs = policy.pooled({e["fullname"]: reference_of(BaselineEntry.from_json(e)) for e in entries})
    return refs, {e["fullname"]: (e.get("extra_info", {}).get("anchor") or {}).get("repeat") for e in entries}


def by_sitting(refs: dict[str, policy.Reference]) -> dict[str, dict[str, policy.Reference]]:
    """The baseline split by the sitting that timed each process (sitting -> its references, pooled alone)."""
    groups: dict[str, dict[str, policy.Reference]] = {}
    for name, ref in refs.items():
        for sitting in sorted({run.sitting for run in ref.runs}):
            runs = tuple(run for run in ref.runs if run.sitting == sitting)
            groups.setdefault(sitting, {})[name] = dataclasses.replace(ref, runs=runs, spread={}, sittings={})
    return {sitting: policy.pooled(group) for sitting, group in groups.items()}


def paths_of(path: Path) -> dict[str, str]:
    """Each entry's path, as its record holds it (``extra_info.path``: ``keras-jax-cpu``); its name where none."""
    return {e["fullname"]: str(e.get("extra_info", {}).get("path") or e["fullname"]) for e in _entries(path)}


def by_path(rows: list[tuple[str, float, float]], paths: dict[str, str]) -> dict[str, Any]:
    """Each path's mean difference (as a ratio, about the pool's median) and the root mean square within paths;
    ``paths``: benchmark -> its path (:func:`paths_of`)."""
    middle = statistics.median(d for _, d, _ in rows)
    moved: dict[str, list[float]] = {}
    for name, d, _ in rows:
        moved.setdefault(paths.get(name, name), []).append(d - middle)
    means = {path: statistics.fmean(ds) for path, ds in moved.items()}
    within = [d - middle - means[paths.get(name, name)] for name, d, _ in rows]
    return {
        "within_paths": round(math.sqrt(statistics.fmean(x * x for x in within)), 4),
        "paths": {path: round(math.exp(mean), 3) for path, mean in sorted(means.items())},
    }


def _logs(ref: policy.Reference, variant: str) -> list[float]:
    """A benchmark's recording processes' log time-per-call figures of ``variant`` (anchored or raw), in order."""
    return [math.log(f.value) for f in (run.get("per-call", variant) for run in ref.runs) if f is not None]


def differences(
    a: dict[str, policy.Reference], b: dict[str, policy.Reference], repeats: tuple[dict[str, object], ...]
) -> dict[str, list[tuple[str, float, float]]]:
    """Per pool: (benchmark, log difference b - a, its variance from the two recordings' processes)."""
    out: dict[str, list[tuple[str, float, float]]] = {}
    for name in sorted(set(a) & set(b)):
        if repeats[0].get(name) != repeats[1].get(name):
            continue
        ra, rb = a[name], b[name]
        variant = ra.variant("per-call")
        la, lb = _logs(ra, variant), _logs(rb, variant)
        between_a, between_b = ra.between("per-call", variant), rb.between("per-call", variant)
        if not la or not lb or between_a is None or between_b is None:
            continue
        variance = between_a[0] ** 2 / len(la) + between_b[0] ** 2 / len(lb)
        out.setdefault(ra.pool, []).append((name, statistics.fmean(lb) - statistics.fmean(la), variance))
    return out


def summary(rows: list[tuple[str, float, float]]) -> dict[str, Any]:
    ds = [d for _, d, _ in rows]
    middle = statistics.median(ds)
    mad = 1.4826 * statistics.median([abs(d - middle) for d in ds])
    rms = math.sqrt(statistics.fmean([d * d for d in ds]))
    se = math.sqrt(statistics.median([v for _, _, v in rows]))
    worst = max(rows, key=lambda r: abs(r[1]))
    return {
        "benchmarks": len(rows),
        "median_ratio": round(math.exp(middle), 3),
        "rms": round(rms, 4),
        "se": round(se, 4),
        "T_rms": round(math.sqrt(max(rms * rms - se * se, 0) / 2), 4),
        "T_mad": round(math.sqrt(max(mad * mad - se * se, 0) / 2), 4),
        "largest": [worst[0].split("::")[-1], round(math.exp(worst[1]), 3)],
    }


def beside_effect(refs: dict[str, policy.Reference]) -> dict[str, float]:
    """Each benchmark's last recording process against the mean of its others (log scale)."""
    out = {}
    for name, ref in refs.items():
        logs = _logs(ref, "anchored")
        if len(logs) >= 3:
            out[name] = logs[-1] - statistics.fmean(logs[:-1])
    return out


def main(argv: list[str]) -> int:
    beside = next((a.split("=", 1)[1] for a in argv if a.startswith("--beside=")), "")
    specs = [a.split("=", 1) for a in argv if not a.startswith("--")]
    if len(specs) < (1 if "--sittings" in argv else 2):
        print(__doc__)
        return 2
    loaded = {label: load(Path(path)) for label, path in specs}
    paths = {name: path for _, file in specs for name, path in paths_of(Path(file)).items()}
    if "--sittings" in argv:
        split: dict[str, tuple[dict[str, policy.Reference], dict[str, object]]] = {}
        for label, (refs, repeats) in loaded.items():
            sittings = by_sitting(refs)
            if len(sittings) < 2:
                split[label] = (refs, repeats)
                continue
            for sitting, group in sittings.items():
                split[f"{label}@{sitting}"] = (group, repeats)
        loaded = split
        specs = [[label, ""] for label in loaded]
        if len(specs) < 2:
            print(__doc__)
            return 2
    effect = beside_effect(loaded[beside][0]) if beside else {}
    result: dict[str, Any] = {}
    for x, y in itertools.combinations([label for label, _ in specs], 2):
        if beside in (x, y):
            continue
        pools = differences(loaded[x][0], loaded[y][0], (loaded[x][1], loaded[y][1]))
        row: dict[str, Any] = {pool: summary(rows) for pool, rows in sorted(pools.items())}
        if "--by-path" in argv:
            row.update({f"{pool} by path": by_path(rows, paths) for pool, rows in sorted(pools.items())})
        if effect:
            from scipy.stats import pearsonr

            pairs = [(d, effect[n]) for rows in pools.values() for n, d, _ in rows if n in effect]
            if len(pairs) > 2:
                r = pearsonr([p[0] for p in pairs], [p[1] for p in pairs])
                row["beside"] = {"benchmarks": len(pairs), "pearson": round(float(r.statistic), 3),
                                 "p": float(f"{r.pvalue:.2g}")}  # fmt: skip
        result[f"{x} vs {y}"] = row
        print(f"{x} vs {y}:")
        for key, value in row.items():
            print(f"    {key}: {value}")
    if "--json" in argv:
        print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
