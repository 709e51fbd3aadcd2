"""The speed gate's acceptance trials on one machine, the README's recipe taken literally: one recording command, then
clean compares in one process and under pytest-xdist, an update and compares after it, compares with a planted 1.5x
time-only slowdown of every torch LSTM/GRU call (compiled ones too) and Keras layer call, and clean compares beside
a busy process. Every run's verdict per benchmark, the resolutions the gate printed and the wall times go into
``OUT/trials.json``; the table is printed last. Each compare also writes its benchmarks' JSON
(``OUT/runs/NAME.json``, with the anchor's times), and its line says how far the machine's state moved from the
recording's: the median over its benchmarks of the raw time per call and of the anchor's time against the baseline's
(a run whose raw times moved 1.5x while its figures divided by the anchor did not is a run on a machine in another
state). ``trials.json`` also holds,
per run and benchmark, how far its time follows the machine's state within the run (:func:`slopes`). Where the
sweep times a benchmark, the JSON holds the swept samples the gate judges, as the baseline holds the recording's.

    python scripts/gate_trials.py --device=cpu --out=/tmp/trials [--clean=10] [--xdist=10] [--after-update=5]
        [--slow=5] [--busy=3] [--stream=0] [--paths=torch-cpu-onednn,...] [--target=suites/test_benchmarks.py]

A benchmark's verdict is read from the gate's table (``-v`` prints every row). A clean run's alarm is any
verdict that fails (regressed, kernel-changed, host-work-changed, path-lost) or inconclusive; a slowdown run's
targets are the torch framework's benchmarks (the fault is planted in torch's LSTM/GRU).

``--stream=N``: clean compares beside a process that streams memory (:data:`STREAM`, another tenant of a shared host
that takes the memory bandwidth and the shared cache). ``--record-stream``: after the recording, one recording
process more (``--lstmperf-add-baseline-run --lstmperf-record-processes=1``) timed beside that neighbour, so that
the baseline's processes take a second state of the machine in.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from pytest_lstmperf.speed.records import BenchRecord, entries_from_benchmark_json

#: the planted neighbour of ``--stream`` and ``--record-stream``: a process that copies a 256 MiB array into another
#: without end, taking the memory bandwidth and the shared cache as another tenant of a shared host may. Like
#: :data:`SPIN`, it stops once the process that started it is gone (its parent changes): a neighbour left behind by
#: a killed script would sit beside every later run on the machine
STREAM = (
    "import os\nimport numpy as np\nparent = os.getppid()\na = np.ones(32 << 20)\nb = np.empty_like(a)\n"
    "while os.getppid() == parent: np.copyto(b, a)"
)
#: the busy neighbour of ``--busy``: a spinning process
SPIN = "import os\nparent = os.getppid()\nwhile os.getppid() == parent: pass"
QUIET = {"unchanged", "improved", "new", "not-run"}
VERDICT_WORDS = QUIET | {"regressed", "kernel-changed", "host-work-changed", "path-lost", "inconclusive"}


def verdicts(log: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in log.splitlines():
        words = line.split()
        if len(words) >= 3 and "::" in words[0] and words[-1] in VERDICT_WORDS and not line.startswith(" "):
            out[words[0]] = words[-1]
    return out


def _medians(records: list[BenchRecord]) -> dict[str, tuple[float, float]]:
    """fullname -> (seconds per call, the anchor's seconds per repetition), where both were measured."""
    out = {}
    for r in records:
        if r.time_per_call_s and r.anchor.per_call_s:
            out[r.fullname] = (r.time_per_call_s, r.anchor.per_call_s)
    return out


def state_moves(run_json: Path, baselines: Path) -> dict[str, float] | None:
    """How far this run's machine state lay from the recording's: the median over the benchmarks both hold of
    the raw time per call and of the anchor's time, each against the baseline's."""
    import statistics

    try:
        document = json.loads(run_json.read_text())
    except (OSError, ValueError):  # not written, or left empty: the run's log says why
        return None
    now = _medians([BenchRecord.from_json(b) for b in document.get("benchmarks", [])])
    then: dict[str, tuple[float, float]] = {}
    for f in baselines.glob("*.json"):
        then |= _medians([e.as_record() for e in entries_from_benchmark_json(json.loads(f.read_text()))])
    both = [k for k in now if k in then]
    if not both:
        return None
    return {
        "raw": round(statistics.median(now[k][0] / then[k][0] for k in both), 3),
        "anchor": round(statistics.median(now[k][1] / then[k][1] for k in both), 3),
        "benchmarks": len(both),
    }


def slopes(run_json: Path) -> dict[str, dict[str, float]]:
    """Per benchmark of a run: how far its time per call follows the machine's state, as the slope of its log
    time on the anchor's over the run's paired samples, with the anchor's own spread there (standard deviation of
    its log time) and the number of pairs. Dividing by the anchor assumes a slope of 1; on a 16-core Xeon small
    torch inference calls read 1.2-1.5 where the anchor varied by more than 15% (docs/gate-evidence.md). A slope
    fitted where the anchor varied little is dragged toward 0 by the anchor's own noise."""
    import math
    import statistics

    try:
        document = json.loads(run_json.read_text())
    except (OSError, ValueError):
        return {}
    out = {}
    for b in document.get("benchmarks", []):
        data = (b.get("stats") or {}).get("data") or []
        anchors = ((b.get("extra_info") or {}).get("anchor") or {}).get("samples") or []
        pairs = [(math.log(a), math.log(v)) for a, v in zip(anchors, data, strict=False) if a > 0 and v > 0]
        if len(pairs) < 10 or len(data) != len(anchors):
            continue
        la, lb = [a for a, _ in pairs], [v for _, v in pairs]
        ma, mb = statistics.fmean(la), statistics.fmean(lb)
        va = statistics.fmean((x - ma) ** 2 for x in la)
        if va <= 0:
            continue
        cov = statistics.fmean((x - ma) * (y - mb) for x, y in pairs)
        out[b["fullname"]] = {
            "slope": round(cov / va, 3),
            "anchor_log_sd": round(math.sqrt(va), 3),
            "pairs": len(pairs),
        }
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
        "processes": [ln for ln in text.splitlines() if ln.startswith("lstmperf: process ")],
        "wall_line": [ln for ln in text.splitlines() if ln.startswith("lstmperf: wall time")][-1:],
        "state": state_moves(out / f"{name}.json", out.parent / "baselines"),
        "slopes": slopes(out / f"{name}.json"),
    }
    counts: dict[str, int] = {}
    for v in seen.values():
        counts[v] = counts.get(v, 0) + 1
    state = result["state"]
    moved = f", raw {state['raw']}x and anchor {state['anchor']}x the recording's" if state else ""
    print(f"{name}: exit {rc}, {result['wall_s']} s, {counts}, resolution median {result['resolution_median']}"
          f"{moved}", flush=True)  # fmt: skip
    return result


@contextlib.contextmanager
def beside(code: str) -> Iterator[None]:
    """What the block runs, beside a neighbour process running ``code`` (:data:`SPIN`, :data:`STREAM`)."""
    neighbour = subprocess.Popen([sys.executable, "-c", code])
    try:
        yield
    finally:
        neighbour.kill()
        neighbour.wait()


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
    p.add_argument(
        "--record-stream",
        action="store_true",
        help="after recording, add one recording process timed beside the memory-streaming neighbour",
    )
    p.add_argument("--stream", type=int, default=0, help="clean compares beside a process that streams memory")
    p.add_argument("--extra", default="", help="more pytest arguments for every run, space-separated")
    p.add_argument("--record-target", default="", help="what the recording command runs (default: --target)")
    p.add_argument("--default-runs", type=int, default=0, help="compares of the whole default command (suites/)")
    p.add_argument("--faults", default="", help="more planted faults, each run --slow times: cudnn-off ...")
    p.add_argument("--budget", type=float, default=0, help="no run starts after this many seconds (0: none)")
    p.add_argument("--baseline", type=Path, help="a baseline file recorded earlier: compared with, not recorded")
    a = p.parse_args()
    out = a.out
    if out.exists() and any(out.iterdir()):  # a recording never overwrites a baseline: the trials would compare
        p.error(f"--out={out} is not empty: its baseline would be compared with, not recorded; name a new folder")
    (out / "runs").mkdir(parents=True, exist_ok=True)
    common = [f"--device={a.device}", f"--lstmperf-baselines={out / 'baselines'}", "-p", "no:cacheprovider",
              *a.extra.split()]  # fmt: skip
    base = [a.target, *common] + ([f"--lstmperf-paths={a.paths}"] if a.paths else [])
    compare = [*base, "--benchmark-compare", "-v"]
    results = []
    runs = out / "runs"
    started = time.perf_counter()

    def go(name: str, args: list[str]) -> None:
        if a.budget and time.perf_counter() - started > a.budget:
            print(f"{name}: not started (budget of {a.budget:.0f} s spent)", flush=True)
            return
        if name not in ("record", "record-stream", "update"):
            args = [*args, f"--benchmark-json={runs / (name + '.json')}"]
        results.append(run(name, args, runs))
        (out / "trials.json").write_text(json.dumps({"args": vars(a) | {"out": str(out)}, "runs": results},
                                                    indent=1, default=str) + "\n")  # fmt: skip

    record_args = [a.record_target, *common] if a.record_target else base
    if a.baseline:
        (out / "baselines").mkdir(exist_ok=True)
        shutil.copy(a.baseline, out / "baselines" / a.baseline.name)
    else:
        go("record", [*record_args, "--lstmperf-save-baseline", "-q"])
    if a.record_stream:
        with beside(STREAM):
            go("record-stream", [*record_args, "--lstmperf-add-baseline-run", "--lstmperf-record-processes=1", "-q"])
    for k in range(a.default_runs):
        go(f"default-command-{k + 1}", ["suites/", *common, "--benchmark-compare", "-v"])
    for k in range(a.clean):
        go(f"clean-{k + 1}", compare)
    for k in range(a.xdist):
        go(f"xdist-clean-{k + 1}", [*compare, "-n", "2"])
    for fault_name in [f"slowdown:{a.slow_factor}", *a.faults.split()]:
        for k in range(a.slow):
            fault = ["-p", "pytest_lstmperf.testing.faults", f"--lstmperf-plant={fault_name}"]
            go(f"fault={fault_name}-{k + 1}", [*compare, *fault])
    for name, code, count in (("busy", SPIN, a.busy), ("stream", STREAM, a.stream)):
        if count:  # a busy core; another tenant of a shared host that takes the memory bandwidth and shared cache
            with beside(code):
                for k in range(count):
                    go(f"{name}-clean-{k + 1}", compare)
    if a.after_update:
        # the recording the compares before the update were judged against, kept for replaying them
        # (scripts/gate_replay.py, scripts/gate_between.py): the update rewrites the file in place
        shutil.copytree(out / "baselines", out / "baselines-before-update", dirs_exist_ok=True)
        go("update", [*base, "--lstmperf-update-baseline", "-q"])
        for k in range(a.after_update):
            go(f"after-update-clean-{k + 1}", compare)
    entries: dict[str, BenchRecord] = {}
    for f in (out / "baselines").glob("*.json"):
        entries = {e.fullname: e.as_record() for e in entries_from_benchmark_json(json.loads(f.read_text()))}
    table = summarise(results, entries)
    (out / "trials.json").write_text(json.dumps({"args": vars(a) | {"out": str(out)}, "runs": results,
                                                 "table": table}, indent=1, default=str) + "\n")  # fmt: skip
    print()
    print("| scenario | runs | runs failed | alarms / benchmark-runs (regressed; inconclusive) | caught / targeted | "
          "median resolution (per run) | wall s (median) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for row in table:
        print(f"| {row['scenario']} | {row['runs']} | {row['runs_failed']} | {row['alarms']}/{row['others']} "
              f"({row['regressed']}; {row['inconclusive']}) | {row['caught']} | {row['resolution']} | "
              f"{row['wall']} |")  # fmt: skip
    return 0


def summarise(results: list[dict], entries: dict[str, BenchRecord]) -> list[dict]:
    import statistics

    groups: dict[str, list[dict]] = {}
    for r in results:
        if r["name"] in ("record", "record-stream", "update"):
            continue
        groups.setdefault(re.sub(r"-\d+$", "", r["name"]), []).append(r)
    table = []
    for scenario, rs in groups.items():
        fault = scenario.split("=", 1)[1].split(":")[0] if scenario.startswith("fault=") else ""
        alarms = others = regressed = inconclusive = caught = targets = 0
        for r in rs:
            for name, verdict in r["verdicts"].items():
                if verdict in ("not-run", "path-lost"):
                    continue
                entry = entries.get(name)
                hit = bool(fault) and entry is not None and entry.framework == "torch"
                if fault == "slowdown":  # planted in the Keras workers too (testing.slowdowns)
                    hit = bool(fault) and entry is not None and entry.framework.startswith(("torch", "keras"))
                if fault in ("cudnn-off", "onednn-off"):  # planted in the test process, on torch's kernels
                    hit = hit and entry is not None and entry.expected_kernel in ("cudnn", "onednn")
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
