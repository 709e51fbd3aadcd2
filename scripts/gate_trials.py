"""The speed gate's acceptance trials on one machine, the README's recipe taken literally: one recording command,
then clean compares in one process and under pytest-xdist, an update and compares after it, compares with a
planted 1.5x time-only slowdown of every torch LSTM/GRU call, and clean compares beside a busy process. Every
run's verdict per benchmark, the resolutions the gate printed and the wall times go into ``OUT/trials.json``;
the table is printed last.

    python scripts/gate_trials.py --device=cpu --out=/tmp/trials [--clean=10] [--xdist=10] [--after-update=5]
        [--slow=5] [--busy=3] [--paths=torch-cpu-onednn,...] [--target=suites/test_benchmarks.py]

A benchmark's verdict is read from the gate's table (``-v`` prints every row). A clean run's alarm is any
verdict that fails (regressed, kernel-changed, host-work-changed, path-lost) or inconclusive; a slowdown run's
targets are the torch framework's benchmarks (the fault is planted in torch's LSTM/GRU).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

QUIET = {"unchanged", "improved", "new", "not-run"}
VERDICT_WORDS = QUIET | {"regressed", "kernel-changed", "host-work-changed", "path-lost", "inconclusive"}


def verdicts(log: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in log.splitlines():
        words = line.split()
        if len(words) >= 3 and "::" in words[0] and words[-1] in VERDICT_WORDS and not line.startswith(" "):
            out[words[0]] = words[-1]
    return out


def run(name: str, args: list[str], out: Path, env: dict[str, str] | None = None) -> dict:
    started = time.perf_counter()
    log = out / f"{name}.log"
    with open(log, "wb") as handle:
        rc = subprocess.run([sys.executable, "-m", "pytest", *args], stdout=handle, stderr=subprocess.STDOUT,
                            env=env, check=False).returncode  # fmt: skip
    text = log.read_text(errors="replace")
    seen = verdicts(text)
    resolution = re.search(r"^resolution: median ([0-9.]+)x, best ([0-9.]+)x, worst ([0-9.]+)x", text, re.M)
    result = {
        "name": name,
        "exit": rc,
        "wall_s": round(time.perf_counter() - started, 1),
        "verdicts": seen,
        "resolution_median": float(resolution.group(1)) if resolution else None,
        "resolution_worst": float(resolution.group(3)) if resolution else None,
        "last": [ln for ln in text.splitlines() if ln.startswith(("speed gate", "SPEED GATE", "baseline "))][-3:],
    }
    counts: dict[str, int] = {}
    for v in seen.values():
        counts[v] = counts.get(v, 0) + 1
    print(f"{name}: exit {rc}, {result['wall_s']} s, {counts}, resolution median {result['resolution_median']}",
          flush=True)  # fmt: skip
    return result


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--target", default="suites/test_benchmarks.py")
    p.add_argument("--paths", default="")
    p.add_argument("--clean", type=int, default=10)
    p.add_argument("--xdist", type=int, default=10)
    p.add_argument("--after-update", type=int, default=5)
    p.add_argument("--slow", type=int, default=5)
    p.add_argument("--slow-factor", default="1.5")
    p.add_argument("--busy", type=int, default=3)
    p.add_argument("--extra", default="", help="more pytest arguments for every run, space-separated")
    a = p.parse_args()
    out = a.out
    (out / "runs").mkdir(parents=True, exist_ok=True)
    base = [a.target, f"--device={a.device}", f"--lstmperf-baselines={out / 'baselines'}", "-p", "no:cacheprovider"]
    if a.paths:
        base.append(f"--lstmperf-paths={a.paths}")
    base += a.extra.split()
    compare = [*base, "--benchmark-compare", "-v"]
    results = []
    runs = out / "runs"
    results.append(run("record", [*base, "--lstmperf-save-baseline", "-q"], runs))
    for k in range(a.clean):
        results.append(run(f"clean-{k + 1}", compare, runs))
    for k in range(a.xdist):
        results.append(run(f"xdist-clean-{k + 1}", [*compare, "-n", "2"], runs))
    for k in range(a.slow):
        fault = ["-p", "pytest_lstmperf.testing.faults", f"--lstmperf-plant=slowdown:{a.slow_factor}"]
        results.append(run(f"slow-{k + 1}", [*compare, *fault], runs))
    if a.busy:
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            for k in range(a.busy):
                results.append(run(f"busy-clean-{k + 1}", compare, runs))
        finally:
            busy.kill()
    if a.after_update:
        results.append(run("update", [*base, "--lstmperf-update-baseline", "-q"], runs))
        for k in range(a.after_update):
            results.append(run(f"after-update-clean-{k + 1}", compare, runs))
    entries = {}
    for f in (out / "baselines").glob("*.json"):
        entries = {b["fullname"]: b.get("extra_info", {}) for b in json.loads(f.read_text())["benchmarks"]}
    table = summarise(results, entries)
    (out / "trials.json").write_text(json.dumps({"args": vars(a) | {"out": str(out)}, "runs": results,
                                                 "table": table}, indent=1) + "\n")  # fmt: skip
    print()
    print("| scenario | runs | runs failed | alarms / benchmark-runs (regressed; inconclusive) | caught / targeted | "
          "median resolution (per run) | wall s (median) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for row in table:
        print(f"| {row['scenario']} | {row['runs']} | {row['runs_failed']} | {row['alarms']}/{row['others']} "
              f"({row['regressed']}; {row['inconclusive']}) | {row['caught']} | {row['resolution']} | "
              f"{row['wall']} |")  # fmt: skip
    return 0


def summarise(results: list[dict], entries: dict) -> list[dict]:
    import statistics

    groups: dict[str, list[dict]] = {}
    for r in results:
        if r["name"] in ("record", "update"):
            continue
        groups.setdefault(re.sub(r"-\d+$", "", r["name"]), []).append(r)
    table = []
    for scenario, rs in groups.items():
        slow = scenario.startswith("slow")
        alarms = others = regressed = inconclusive = caught = targets = 0
        for r in rs:
            for name, verdict in r["verdicts"].items():
                if verdict == "not-run":
                    continue
                hit = slow and entries.get(name, {}).get("framework") == "torch"
                alarm = verdict not in QUIET
                if hit:
                    targets += 1
                    caught += alarm and verdict != "inconclusive"
                else:
                    others += 1
                    alarms += alarm
                    regressed += verdict == "regressed"
                    inconclusive += verdict == "inconclusive"
        meds = [r["resolution_median"] for r in rs if r["resolution_median"]]
        table.append({
            "scenario": scenario,
            "runs": len(rs),
            "runs_failed": sum(1 for r in rs if r["exit"] != 0),
            "alarms": alarms,
            "others": others,
            "regressed": regressed,
            "inconclusive": inconclusive,
            "caught": f"{caught}/{targets}" if targets else "-",
            "resolution": f"{min(meds):.3f}-{max(meds):.3f}" if meds else "-",
            "wall": f"{statistics.median(r['wall_s'] for r in rs):.0f}",
        })  # fmt: skip
    return table


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
