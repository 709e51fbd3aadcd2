"""Regenerate the measured figures of the documentation from the data they were measured into.

    python scripts/docs_figures.py                 # redraw docs/img/*.png, rewrite the run-time table
    python scripts/docs_figures.py --check         # exit 1 if docs/validation.md's table is not up to date
    python scripts/docs_figures.py --time -- pytest tests suites examples --device=cpu -n 2
                                                   # run a command, add its wall time to docs/data/run-times.json

Each figure is drawn by the plugin's own plotting code (the same code that draws ``--lstmperf-report``) from a
file in ``docs/data/``; its title carries the device and the date of the measurement, which :data:`FIGURES`
records beside each data file. ``--time`` records the device (this machine's CPU and GPU, as the plugin
describes them), today's date and pytest's last line; the table in ``docs/validation.md`` between the
``run-times`` markers is written from that file. Run from the repository root.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "data"
IMG = ROOT / "docs" / "img"
RUN_TIMES = DATA / "run-times.json"
VALIDATION = ROOT / "docs" / "validation.md"
START, END = "<!-- run-times: written by scripts/docs_figures.py -->", "<!-- /run-times -->"

#: image -> (data file, what to draw, device, date measured)
FIGURES: dict[str, tuple[str, str, str, str]] = {
    "h200-overhead.png": ("h200-overhead-precision.json", "overhead", "NVIDIA H200", "2026-11-23"),
    "h200-precision.png": ("h200-overhead-precision.json", "precision", "NVIDIA H200", "2026-11-23"),
    "h200x2-scaling.png": ("h200x2-scaling.json", "scaling", "2x NVIDIA H200", "2026-11-23"),
    "h100-workloads-bucketing.png": ("h100-bucketing.json", "bucketing", "NVIDIA H100 80GB HBM3", "2026-11-22"),
    "h100-crossover-cli.png": (
        "h100-crossover-lstm-I64-H256-L2-T100.csv",
        "crossover",
        "NVIDIA H100 80GB HBM3",
        "2026-11-22",
    ),
}


def draw(name: str, folder: Path = IMG) -> Path:
    """Draw one figure of :data:`FIGURES` into ``folder`` (``docs/img``)."""
    sys.path.insert(0, str(ROOT))
    from pytest_lstmperf.workloads import crossover as cx
    from pytest_lstmperf.workloads import report as wr
    from pytest_lstmperf.workloads.rows import row_from_json

    source, kind, device, date = FIGURES[name]
    target = folder / name
    where = f"{device}, measured {date}"
    if kind == "crossover":
        points = cx.read_sweep_csv(DATA / source)
        reference = points[0].path
        others = list(dict.fromkeys(p.path for p in points if p.path != reference))
        label = source.removeprefix("h100-crossover-").removesuffix(".csv")
        cx.plot_sweep(points, target, f"{label}, forward, against {reference}\n{where}",
                      cx.crossovers(points, reference, others))  # fmt: skip
        return target
    rows = [
        dataclasses.replace(row_from_json(r), hardware=where)
        for r in json.loads((DATA / source).read_text(encoding="utf-8"))
        if r.get("kind") == kind
    ]
    plotter = {"overhead": wr.plot_overhead, "precision": wr.plot_precision, "scaling": wr.plot_scaling,
               "bucketing": wr.plot_bucketing}[kind]  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        drawn = plotter(Path(folder), rows)
        if drawn is None:
            raise SystemExit(f"{source}: no {kind} rows to draw")
        shutil.copyfile(drawn, target)
    return target


def run_time_table() -> str:
    """The Markdown table of docs/data/run-times.json, newest first."""
    entries = json.loads(RUN_TIMES.read_text(encoding="utf-8")) if RUN_TIMES.exists() else []
    lines = ["| command | device | date | wall time | result |", "|---|---|---|---:|---|"]
    for e in sorted(entries, key=lambda e: e["date"], reverse=True):
        result = e["result"] + (f" ({e['note']})" if e.get("note") else "")
        lines.append(f"| `{e['command']}` | {e['device']} | {e['date']} | {e['seconds']:.0f} s | {result} |")
    lines += ["", "| figure | drawn from | device | measured |", "|---|---|---|---|"]
    for name, (source, _, device, date) in FIGURES.items():
        lines.append(f"| [{name}](img/{name}) | [docs/data/{source}](data/{source}) | {device} | {date} |")
    return "\n".join(lines)


def validation_text() -> str:
    text = VALIDATION.read_text(encoding="utf-8")
    head, found, rest = text.partition(START)
    if not found or END not in rest:
        raise SystemExit(f"{VALIDATION}: the markers {START} ... {END} are missing")
    return head + START + "\n" + run_time_table() + "\n" + END + rest.partition(END)[2]


def this_device() -> str:
    sys.path.insert(0, str(ROOT))
    from pytest_lstmperf.device import resolve_device

    cpu = resolve_device("cpu", "--device").describe()
    try:
        return f"{resolve_device('cuda', '--device').describe()}; {cpu}"
    except Exception:
        return f"{cpu}, no GPU"


def time_command(command: list[str]) -> dict[str, Any]:
    """Run ``command``, print its output as it comes, and return the run-time entry for it."""
    start = time.perf_counter()
    last = ""
    with subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            if line.strip():
                last = line.strip()
    seconds = time.perf_counter() - start
    result = last.strip("= ") if proc.returncode == 0 else f"exit {proc.returncode}: {last.strip('= ')}"
    return {"command": " ".join(command), "device": this_device(), "date": datetime.date.today().isoformat(),
            "seconds": round(seconds, 1), "result": result}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check that docs/validation.md is up to date")
    parser.add_argument("--note", default="", help="with --time: a note shown with the figure (e.g. other load)")
    parser.add_argument("--time", action="store_true", help="run and time the command given after --")
    argv = sys.argv[1:] if argv is None else list(argv)
    command = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    if args.time and not command:
        parser.error("--time needs the command after --, e.g. --time -- pytest tests --device=cpu")
    if args.time:
        entry = time_command(command)
        if args.note:
            entry["note"] = args.note
        entries = json.loads(RUN_TIMES.read_text(encoding="utf-8")) if RUN_TIMES.exists() else []
        RUN_TIMES.write_text(json.dumps([*entries, entry], indent=1) + "\n", encoding="utf-8")
        print(f"recorded in {RUN_TIMES.relative_to(ROOT)}: {entry['seconds']:.0f} s, {entry['result']}")
    text = validation_text()
    if args.check:
        if text != VALIDATION.read_text(encoding="utf-8"):
            print(f"{VALIDATION.relative_to(ROOT)} is not up to date: run python scripts/docs_figures.py")
            return 1
        return 0
    VALIDATION.write_text(text, encoding="utf-8")
    if not args.time:
        for name in FIGURES:
            print(draw(name).relative_to(ROOT))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
