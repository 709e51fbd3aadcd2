"""Detections and false alarms of the speed gate, per benchmark-run, from gate runs' logs.

    python scripts/gate_trust.py BASELINE.json OUT.json SCENARIO=LOG [SCENARIO=LOG ...]

``SCENARIO`` is ``clean``, ``fallback``, ``kernel-slowdown:F`` (``slowdown:F`` on a CPU), ``host-work:N`` or
``full-suite``, with an optional ``#k`` run suffix (``clean#3``); ``LOG`` is the run's terminal output with
``-v`` (every gate row shown). A benchmark's verdict is the last word of its row in the gate table; a benchmark
without a row but with a ``FAILED``/``ERROR`` line counts as an alarm (the test itself failed, e.g. on a kernel
mismatch).

Which benchmarks a fault targets is read from the baseline's entries: ``fallback`` (cuDNN or oneDNN off)
targets the ``torch`` benchmarks whose expected kernel is ``cudnn``/``onednn`` (the faults are planted in the
test process; Keras layers run in a worker process of their own, untouched); slowdowns and ``host-work`` (all
planted in ``torch.nn.LSTM``/``GRU``) target the ``torch`` framework's benchmarks. An alarm on a targeted
benchmark is a detection; an alarm anywhere else (every benchmark of a clean run) is a false alarm.
Writes every verdict into ``OUT.json`` and prints the table last.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

from pytest_lstmperf.speed.records import BenchRecord, entries_from_benchmark_json

QUIET = {"unchanged", "improved", "new", "not-run"}


def targeted(scenario: str, entry: BenchRecord) -> bool:
    kind = scenario.split("#")[0].split(":")[0]
    if kind == "fallback":  # planted in the test process: Keras's worker process keeps its backends
        return entry.framework == "torch" and entry.expected_kernel in ("cudnn", "onednn")
    if kind in ("kernel-slowdown", "device-slowdown", "slowdown", "host-work"):
        return entry.framework == "torch"
    return False


def verdicts(log: str, names: list[str]) -> dict[str, str]:
    """The gate verdict of each benchmark seen in ``log`` (``failed`` for a failed test without a row)."""
    out: dict[str, str] = {}
    for line in log.splitlines():
        words = line.split()
        if len(words) >= 3 and words[0] in names:
            out[words[0]] = words[-1]
    for match in re.finditer(r"^(?:FAILED|ERROR) (\S+)", log, re.M):
        name = match.group(1)
        if name in names and out.get(name, "unchanged") in QUIET:
            out[name] = "failed"
    return out


def main(argv: list[str]) -> int:
    baseline, target, runs = Path(argv[0]), Path(argv[1]), argv[2:]
    entries = {e.fullname: e.as_record() for e in entries_from_benchmark_json(json.loads(baseline.read_text()))}
    names = sorted(entries)
    rows: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    detail: list[dict] = []
    for run in runs:
        scenario, _, log_path = run.partition("=")
        text = Path(log_path).read_text(errors="replace") if Path(log_path).is_file() else ""
        seen = verdicts(text, names)
        key = scenario.split("#")[0]
        row = rows[key]
        row["runs"] += 1
        for name, verdict in sorted(seen.items()):
            if verdict == "not-run":  # in the baseline, outside this run's selection: neither caught nor missed
                continue
            hit = targeted(scenario, entries[name])
            alarm = verdict not in QUIET
            row["targets"] += hit
            row["caught"] += hit and alarm
            row["others"] += not hit
            row["false_alarms"] += alarm and not hit
            detail.append({"run": scenario, "benchmark": name, "verdict": verdict, "targeted": hit})
            if hit and not alarm:
                row["missed"] += 1
    target.write_text(json.dumps({"baseline": str(baseline), "verdicts": detail}, indent=1) + "\n")
    missed = [d for d in detail if d["targeted"] and d["verdict"] in QUIET]
    alarms = [d for d in detail if not d["targeted"] and d["verdict"] not in QUIET]
    for d in alarms[:12]:
        print(f"false alarm: {d['run']}: {d['benchmark']} -> {d['verdict']}")
    for d in missed[:12]:
        print(f"missed: {d['run']}: {d['benchmark']} -> {d['verdict']}")
    print()
    head = ("scenario", "runs", "caught / targeted benchmark-runs", "false alarms / other benchmark-runs")
    print(f"{head[0]:<26} {head[1]:>4}  {head[2]:<34} {head[3]}")
    for scenario, row in rows.items():
        caught = f"{row['caught']}/{row['targets']}" if row["targets"] else "-"
        print(f"{scenario:<26} {row['runs']:>4}  {caught:<34} {row['false_alarms']}/{row['others']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
