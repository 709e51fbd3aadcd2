"""A recording in independent processes: how far runs lie apart is measured when a baseline is recorded, never
assumed.

A recording command (``--lstmperf-save-baseline``, ``--lstmperf-update-baseline``, ``--lstmperf-add-baseline-run``)
times every benchmark in this process, then in ``--lstmperf-record-processes`` - 1 fresh pytest processes (3 in
all by default) that run the same command on the benchmarks alone, as pyperf's worker processes and asv's
``processes`` do: a process's memory layout, thread placement, library heuristics and the machine's state while
it runs move its figures together, so the spread of figures within one process says nothing of them. Each
baseline entry keeps one figure per process (:func:`..speed.policy.recording_runs` leaves out a process that
broke and names it), and their spread is the entry's between-run noise.

A recording process is this command run again with :data:`PROCESS_ENV` naming a folder: it deselects every test
but the benchmarks this run measured (``nodeids.json``), writes nothing of its own (no baseline, no JUnit XML, no
pytest-benchmark files, no report, no CI summary), and leaves its records in ``records.json`` there.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from ..speed.records import BenchRecord, dump_records, load_records

#: set in a recording process's environment: the folder it reads its benchmarks from and writes its records to
PROCESS_ENV = "PYTEST_LSTMPERF_RECORDING_PROCESS"
#: the command that starts pytest in a further process, where ``python -m pytest`` (this interpreter) will not do:
#: a wrapper the runner needs, or a launcher that starts it from a process that imported the frameworks once (the
#: project's own tests do: their recordings test the rule, not the machine)
COMMAND_ENV = "PYTEST_LSTMPERF_PROCESS_COMMAND"
#: the pytest-benchmark and pytest options whose files the recording processes must not write
_QUIET_OPTIONS = {
    "xmlpath": None,
    "benchmark_json": None,
    "benchmark_save": None,
    "benchmark_autosave": False,
    "benchmark_histogram": None,
    "benchmark_compare_fail": None,
    "benchmark_cprofile_dump": None,
}


#: options (each with its value) left off a further process's command line: its own temporary folder is given
#: anew, and the files are the command's own. Setting them aside in the process (:func:`quiet`) is not enough:
#: pytest-benchmark up to 5.2 (5.2.3 on a GPU host) opens ``--benchmark-json``'s file as it parses the command line,
#: which empties the command's own file, written before its further processes run (5.3 opens it when it writes)
_DROPPED_OPTIONS = ("--basetemp", "--benchmark-json", "--benchmark-save", "--junitxml", "--junit-xml")
_DROPPED_FLAGS = ("--benchmark-autosave",)


#: where a run's first process hands the anchor repetitions it timed each benchmark with to the processes after it:
#: a further process's folder holds them in this file, a pytest-xdist worker's ``workerinput`` under this key
REPEATS_KEY = "lstmperf_anchor_repeats"


class RecordingError(Exception):
    """A recording process failed: nothing is recorded."""


def process_folder() -> Path | None:
    """The folder of this recording process, None in any other run."""
    raw = os.environ.get(PROCESS_ENV)
    return Path(raw) if raw else None


def quiet(config: pytest.Config) -> None:
    """In a recording process: no file of the command's own is written again (its caller writes them)."""
    for name, value in _QUIET_OPTIONS.items():
        if hasattr(config.option, name):
            setattr(config.option, name, value)


def handed_repeats(config: pytest.Config) -> dict[str, int]:
    """The anchor repetitions this process was handed (nodeid -> repetitions): by the recording or compare command
    that started it as a further process, or by pytest-xdist's controller; empty in a run's first process. Every
    process of a run times a benchmark with the same anchor: a call's own time depends on how long the anchor ran
    just before it."""
    raw: object = getattr(config, "workerinput", {}).get(REPEATS_KEY)
    folder = process_folder()
    if raw is None and folder is not None and (folder / f"{REPEATS_KEY}.json").is_file():
        raw = json.loads((folder / f"{REPEATS_KEY}.json").read_text())
    if not isinstance(raw, dict):
        return {}
    return {str(k): int(v) for k, v in raw.items() if isinstance(v, int) and v > 0}


def keep_benchmarks(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a recording process: only the benchmarks the recording measured run; the rest are deselected."""
    folder = process_folder()
    if folder is None:
        return
    wanted = set(json.loads((folder / "nodeids.json").read_text()))
    keep = [item for item in items if item.nodeid in wanted]
    dropped = [item for item in items if item.nodeid not in wanted]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def swept_only() -> frozenset[str] | None:
    """The benchmarks this process times again across the run, None for all: in a further process, those it was
    started for; the others of the run's selection run their tests beside them, so that every process of a run
    holds what the whole selection loads (a process that ran torch.compile times the anchor slower)."""
    folder = process_folder()
    if folder is None or not (folder / "sweep.json").is_file():
        return None
    return frozenset(json.loads((folder / "sweep.json").read_text()))


def write_records(records: Sequence[BenchRecord]) -> None:
    """In a recording process: its records, for the recording command that started it."""
    folder = process_folder()
    if folder is not None:
        only = swept_only()
        records = [r for r in records if only is None or r.fullname in only]
        tmp = folder / f"records.{os.getpid()}.tmp"
        tmp.write_text(dump_records(records))
        os.replace(tmp, folder / "records.json")


def _command(config: pytest.Config, folder: Path) -> list[str]:
    """This run's command for a further process (``python -m pytest``, or :data:`COMMAND_ENV`'s): its own temporary
    folder (pytest wipes a ``--basetemp`` as it starts) and its own cache folder, and none of the command's own
    output files (:data:`_DROPPED_OPTIONS`)."""
    args: list[str] = []
    skip = False
    for arg in map(str, config.invocation_params.args):
        if skip:
            skip = False
            continue
        if arg in _DROPPED_OPTIONS:
            skip = True
            continue
        if arg.split("=", 1)[0] in _DROPPED_OPTIONS or arg in _DROPPED_FLAGS:
            continue
        args.append(arg)
    start = shlex.split(os.environ.get(COMMAND_ENV, "")) or [sys.executable, "-m", "pytest"]
    return [*start, *args, f"--basetemp={folder / 'basetemp'}", "-o", f"cache_dir={folder / 'cache'}"]


def record_in_processes(
    config: pytest.Config,
    records: Sequence[BenchRecord],
    processes: int,
    say: Callable[[str], None],
    *,
    index: int | None = None,
    of: int | None = None,
    why: str = "how far processes lie apart is each benchmark's between-run noise",
    beside: Sequence[BenchRecord] = (),
) -> dict[str, list[BenchRecord]]:
    """Time the benchmarks of ``records`` again in ``processes`` - 1 fresh pytest processes; per benchmark, its
    records from them. Each process runs the tests of ``beside`` too (the run's other benchmarks), and times only
    those of ``records`` across its end: every process of a run then holds what the run's first process held (on a
    16-core Xeon, processes that ran a subset without torch.compile's benchmarks read torch's and ONNX Runtime's
    calls 4.5-8.3% slower divided by the anchor). ``say(line)`` reports progress (``index`` of ``of``: how a lone
    further process is named).
    Raises :class:`RecordingError` when a process fails or measures fewer benchmarks than this one did."""
    if processes <= 1 or not records:
        return {}
    names = sorted({r.fullname for r in records})
    every = sorted({*names, *(r.fullname for r in beside)})
    siblings: dict[str, list[BenchRecord]] = {}
    folder = Path(tempfile.mkdtemp(prefix="lstmperf-recording-"))
    # the same options as this run (PYTEST_ADDOPTS included), no CI summary of its own
    env = {k: v for k, v in os.environ.items() if k != "GITHUB_STEP_SUMMARY"}
    env[PROCESS_ENV] = str(folder)
    env.pop("PYTEST_XDIST_WORKER", None)
    try:
        (folder / "nodeids.json").write_text(json.dumps(every))
        (folder / "sweep.json").write_text(json.dumps(names))
        repeats = {r.fullname: r.anchor.repeat for r in (*beside, *records) if r.anchor.repeat}
        (folder / f"{REPEATS_KEY}.json").write_text(json.dumps(repeats))  # each timed with this process's anchor
        first = index or 2
        total = of or processes
        for index in range(first, first + processes - 1):
            say(
                f"lstmperf: process {index} of {total} at most: timing {len(names)} benchmark(s) again in a fresh "
                f"pytest process{f' that runs all {len(every)} of the run' if len(every) > len(names) else ''} ({why})"
            )
            started = time.perf_counter()
            log = folder / f"process-{index}.log"
            with open(log, "wb") as out:
                done = subprocess.run(
                    _command(config, folder),
                    cwd=str(config.invocation_params.dir),
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    check=False,
                )
            result = folder / "records.json"
            if done.returncode != 0 or not result.exists():
                tail = log.read_text(errors="replace").strip().splitlines()[-15:]
                raise RecordingError(
                    f"not recording: recording process {index} of {total} failed (exit {done.returncode}); "
                    f"nothing was written. Its last lines:\n    " + "\n    ".join(tail)
                )
            got = [r for r in load_records(result.read_text()) if r.data]
            result.unlink()
            missing = sorted(set(names) - {r.fullname for r in got})
            if missing:
                raise RecordingError(
                    f"not recording: recording process {index} of {total} measured {len(got)} of the "
                    f"{len(names)} benchmark(s); missing: {', '.join(missing[:5])}"
                    + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
                )
            for record in got:
                siblings.setdefault(record.fullname, []).append(record)
            say(f"lstmperf: process {index} of {total} at most done in {time.perf_counter() - started:.0f} s")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return siblings
