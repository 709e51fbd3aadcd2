"""Does what else a process times move a benchmark's figure? One-process recordings, alternately of the whole
selection and of a subset of it (``-k``), each into a fresh folder, then per benchmark of the subset: how far its
figure divided by the anchor, its raw time per call and the anchor's time lie in the subset's processes from the
whole's (mean of the logs, percent, with Welch's t). A recording's further processes and a compare's time only the
benchmarks that still need them, so a difference here is part of what the gate measures as how far processes lie
apart.

    python scripts/composition_probe.py --out DIR --pairs 5 [--device cpu] [--target suites/test_benchmarks.py]
        [--subset 'torch-cpu-native or onnxruntime or packed'] [--budget SECONDS] [-- more pytest arguments]
    python scripts/composition_probe.py --out DIR --analyse      # the summary of the processes already in DIR

Writes DIR/composition_probe.json (each process's figures, and the summary) and prints the summary.
docs/gate-evidence.md holds what it printed on the 2-core VM.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics as st
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

KEYS = ("anchored", "raw", "anchor")


def record(out: Path, mode: str, k: int, args: argparse.Namespace, extra: list[str]) -> float:
    folder = out / f"{mode}-{k}"
    folder.mkdir(parents=True)
    select = ["-k", args.subset] if mode == "subset" else []
    command = [sys.executable, "-m", "pytest", args.target, f"--device={args.device}", "-q", "-p", "no:cacheprovider",
               "--lstmperf-save-baseline", "--lstmperf-record-processes=1", f"--lstmperf-baselines={folder}",
               *select, *extra]  # fmt: skip
    start = time.perf_counter()
    with open(folder / "log", "w") as log:
        rc = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    took = time.perf_counter() - start
    print(f"{mode} {k}: exit {rc}, {took:.0f} s", flush=True)
    return took


def figures(folder: Path) -> dict[str, list[float]]:
    files = sorted(folder.glob("*.json"))
    if not files:
        return {}
    out = {}
    for bench in json.loads(files[0].read_text())["benchmarks"]:
        run = bench["lstmperf"]["runs"][0]
        out[bench["name"]] = [run["per_call"]["value"], run["per_call_raw"]["value"], run["anchor_s"]]
    return out


def analyse(out: Path) -> dict[str, Any]:
    processes = []
    for folder in sorted(p for p in out.iterdir() if p.is_dir()):
        mode, _, k = folder.name.rpartition("-")
        found = figures(folder)
        if found and mode in ("whole", "subset"):
            processes.append({"mode": mode, "k": int(k), "figures": found})
    whole = [p["figures"] for p in processes if p["mode"] == "whole"]
    subset = [p["figures"] for p in processes if p["mode"] == "subset"]
    summary: dict[str, Any] = {}
    for name in sorted(set().union(*subset) if subset else ()):
        a = [f[name] for f in whole if name in f]
        b = [f[name] for f in subset if name in f]
        if len(a) < 2 or len(b) < 2:
            continue
        row = {}
        for j, key in enumerate(KEYS):
            la, lb = [math.log(x[j]) for x in a], [math.log(x[j]) for x in b]
            diff = st.fmean(lb) - st.fmean(la)
            se = math.sqrt(st.variance(la) / len(la) + st.variance(lb) / len(lb))
            row[key] = {"subset_minus_whole_%": round(100 * diff, 2), "t": round(diff / se, 2) if se else None}
        summary[name] = row
    return {"processes": processes, "summary": summary}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--device", default="cpu")
    p.add_argument("--target", default="suites/test_benchmarks.py")
    p.add_argument("--subset", default="torch-cpu-native or onnxruntime or packed")
    p.add_argument("--budget", type=float, default=0, help="no pair starts after this many seconds (0: none)")
    p.add_argument("--analyse", action="store_true", help="summarise the processes already in --out; run none")
    args, extra = p.parse_known_args()
    extra = [a for a in extra if a != "--"]
    if not args.analyse:
        if args.out.exists() and any(args.out.iterdir()):
            p.error(f"--out={args.out} is not empty: name a new folder, or --analyse it")
        started = time.perf_counter()
        for k in range(1, args.pairs + 1):
            if args.budget and time.perf_counter() - started > args.budget:
                print(f"pair {k}: not started (budget of {args.budget:.0f} s spent)")
                break
            for mode in ("whole", "subset"):
                record(args.out, mode, k, args, extra)
    result = analyse(args.out)
    result["args"] = {"pairs": args.pairs, "device": args.device, "target": args.target, "subset": args.subset}
    (args.out / "composition_probe.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'benchmark':70s} {'anchored':>16s} {'raw':>16s} {'anchor':>16s}")
    for name, row in result["summary"].items():
        cells = [f"{row[k]['subset_minus_whole_%']:+6.2f}% (t {row[k]['t']:+.1f})" for k in KEYS]
        print(f"{name[:70]:70s} " + " ".join(f"{c:>16s}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
