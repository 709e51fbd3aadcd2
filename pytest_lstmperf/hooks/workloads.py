"""Results of the seed-workload suite (``suites/test_workloads.py``): collected from every test (also from
pytest-xdist workers, through the reports' ``user_properties``), printed as tables at the end of the run and
written with plots into ``--lstmperf-report=DIR`` (``workloads.md`` and PNGs); the tables, notes and plots are
made by :mod:`pytest_lstmperf.workloads.report`.

A test adds a typed row (:mod:`pytest_lstmperf.workloads.rows`: ``BucketingRow``, ``CrossoverRow``,
``OverheadRow``, ``PrecisionRow``, ``ScalingRow``) with :func:`add_row`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from ..device import threads_text
from ..session import PropertyCollector, run_session, started_session
from ..workloads.report import TITLES, notes, sections, table, write_workload_report
from ..workloads.rows import Row, WorkloadRow, row_from_json, row_to_json

PROPERTY = "lstmperf_workload"


def add_row(request: pytest.FixtureRequest, row: WorkloadRow) -> None:
    """Add a row to the summary, with where it was measured (unless the row says) and how many pytest-xdist
    workers shared the machine's cores while it was."""
    if not isinstance(row, Row):
        raise TypeError(f"a workload row is one of pytest_lstmperf.workloads.rows' records, not {type(row).__name__}")
    row = dataclasses.replace(
        row,
        hardware=row.hardware or _hardware(request.config),
        workers=int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1),
        cores=os.cpu_count() or 1,
    )
    request.node.user_properties.append((PROPERTY, json.dumps(row_to_json(row), default=str)))


def _hardware(config: pytest.Config) -> str:
    """The run's device in a few words, for the plots' titles: the GPU's name, or the CPU's and its threads."""
    session = started_session(config)
    if session is None:
        return ""
    fp = session.device.fingerprint
    if session.device.kind == "cuda":
        return str(fp.get("gpu", session.device.name))
    return f"CPU: {fp.get('cpu', '?')}, {threads_text(fp.get('threads', '?'))}"


def pytest_configure(config: pytest.Config) -> None:
    rows = run_session(config).workload_rows
    collector = PropertyCollector(PROPERTY, lambda value: rows.append(row_from_json(json.loads(str(value)))))
    config.pluginmanager.register(collector, "lstmperf-workloads")
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(PartProgress(config), "lstmperf-workload-progress")


#: the workload suite's parts (test function -> what it does), announced as each starts: the suite runs for
#: minutes on a CPU, and a line per part says what it is doing between the progress dots
PARTS = {
    "test_padding_packing_bucketing_agree": "padding, packing and bucketing: outputs against the float64 reference",
    "test_padding_packing_bucketing_speed": "padding, packing and bucketing: one training epoch each way, timed",
    "test_crossover": "crossover: batch sweep of each path",
    "test_framework_overhead": "framework overhead: torch module call against the raw op",
    "test_keras_overhead": "framework overhead: Keras 3 layers in their backend's worker process",
    "test_compiled_and_onnx_overhead": "framework overhead: torch.compile and ONNX Runtime (compile/export untimed)",
    "test_precision_speed_and_error": "precision: each path's speed and error, then its kernel and tolerance checks",
}


class PartProgress:
    """Writes ``lstmperf workloads: <part> (N tests)`` when the first test of a part starts (controller only;
    under pytest-xdist the counts come from the workers' collections)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.counts: dict[str, int] = {}
        self.announced: set[str] = set()

    @staticmethod
    def part(nodeid: str) -> str | None:
        name = nodeid.split("::")[-1].split("[")[0]
        return name if name in PARTS else None

    def _count(self, nodeids: list[str]) -> None:
        counts: dict[str, int] = defaultdict(int)
        for nodeid in nodeids:
            part = self.part(nodeid)
            if part:
                counts[part] += 1
        self.counts = dict(counts)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self._count([item.nodeid for item in session.items])

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        self._count(list(ids))

    @pytest.hookimpl(tryfirst=True)  # before the terminal reporter writes the test file's name
    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        part = self.part(nodeid)
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if part is None or part in self.announced or reporter is None or self.config.option.verbose < 0:
            return
        self.announced.add(part)
        count = self.counts.get(part)
        reporter.ensure_newline()
        line = f"lstmperf workloads: {PARTS[part]}" + (f" ({count} test{'s' if count > 1 else ''})" if count else "")
        if self.config.getoption("dist", "no") != "no":  # pytest-xdist's dots carry no file name and no newline
            if getattr(getattr(reporter, "_tw", None), "width_of_current_line", 0):
                reporter.write("\n")
            reporter.write_line(line)
            return
        reporter.write(line)  # the test file's name, written next, starts a new line
        reporter.currentfspath = None  # the next progress dot starts a fresh line with its file name


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return
    rows = run_session(config).workload_rows
    if not rows:
        return
    terminalreporter.section("lstmperf workloads")
    remarks = notes(rows)
    for kind, (header, cells) in sections(rows).items():
        terminalreporter.write_line(TITLES[kind])
        for line in table(header, cells):
            terminalreporter.write_line("  " + line)
        for remark in remarks.get(kind, []):
            terminalreporter.write_line(f"  note: {remark}")
        terminalreporter.write_line("")
    report_dir = config.getoption("lstmperf_report", None) or ""
    if report_dir:
        try:
            path = write_workload_report(Path(report_dir), rows)
            terminalreporter.write_line(f"workload report written to {path}")
        except OSError as exc:
            terminalreporter.write_line(f"--lstmperf-report={report_dir}: could not write the workload report: {exc}")
