"""The speed gate's terminal output: the ``lstmperf speed`` section printed after every other summary."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from .. import options
from ..speed.provenance import record_command

if TYPE_CHECKING:
    from ..speed.gate import GateState


def print_speed_section(tr: Any, config: pytest.Config, state: GateState, device: Callable[[], str]) -> None:
    """The ``lstmperf speed`` section: per-benchmark table, clock notes, messages, what was recorded, the gate's
    table and its verdict (``state.outcome``, last). ``device()`` describes the device (may raise UsageError)."""
    if not (state.records or state.messages or state.errors or state.gate or state.save_report):
        return
    tr.section("lstmperf speed", sep="=", bold=True)
    if state.records:
        with contextlib.suppress(pytest.UsageError):
            tr.write_line(f"device: {device()}")
        for line in summary_lines(state.records):
            tr.write_line(line)
        for note in clock_notes(state.records):
            tr.write_line(note, yellow=True)
    for message in state.messages:
        tr.write_line(message)
    if state.save_report is not None:
        tr.write_line(state.save_report.describe(), green=True)
        for flag in state.save_report.flags:
            tr.write_line(
                f"BIMODAL BASELINE (recorded, flagged in the file as extra_info.noise_band): {flag}",
                yellow=True,
                bold=True,
            )
    if state.report_path is not None:
        tr.write_line(f"speed report written to {state.report_path}")
    if state.gate is not None:
        _print_gate(tr, config, state)
    for error in state.errors:
        tr.write_line(f"ERROR: {error}", red=True, bold=True)
    for line in state.outcome:
        bad = not line.startswith("speed gate passed")
        tr.write_line(line, red=bad, green=not bad, bold=True)


def _print_gate(tr: Any, config: pytest.Config, state: GateState) -> None:
    from ..speed.regression import format_table

    assert state.baseline is not None and state.gate is not None
    gate = state.gate
    verbose = config.getoption("verbose", 0) > 0
    shown = gate.decisions if verbose else [d for d in gate.decisions if d.verdict not in ("unchanged", "not-run")]
    tr.write_line("")
    tr.write_line(f"speed gate against {state.baseline.path}: {gate.summary()}", bold=True)
    for line in format_table(shown) if shown else []:
        tr.write_line(line)
    uncorrected = [d for d in gate.decisions if any("no drift correction" in n for n in d.notes)]
    if uncorrected:
        tr.write_line(
            f"--lstmperf-drift=probe: no drift correction for {len(uncorrected)} benchmark(s): the baseline has "
            "no drift-probe samples for them (record with --lstmperf-drift=probe)",
            yellow=True,
        )
    no_counters = [d for d in gate.decisions if any(c.startswith("host: not compared") for c in d.checks)]
    if no_counters:
        tr.write_line(
            f"host counters not compared for {len(no_counters)} benchmark(s): the baseline or this run has none "
            "(record the baseline again to gate host work)",
            yellow=True,
        )
    wide = gate.wide_device()
    if wide:
        tr.write_line(
            f"{len(wide)} benchmark(s) with a raised device threshold: their baseline's device time spread wider "
            "between recording runs than the configured threshold, or their event-timed or queued device time "
            "follows the host's launches, "
            "so smaller device slowdowns are not resolved there (re-record noisy ones on a quiet machine, or set "
            "--lstmperf-threshold to hold them to it):",
            yellow=True,
        )
        for name, note in wide:
            tr.write_line(f"  {name}: {note}", yellow=True)
    unmatched = gate.no_device()
    if unmatched:
        tr.write_line(
            f"{len(unmatched)} benchmark(s) without a device comparison: the per-call check alone decided them, "
            "at its wider threshold (where the device time was taken by another method now than in the baseline, "
            "record the baseline again if the method changed for good):",
            yellow=True,
        )
        for name, why in unmatched:
            tr.write_line(f"  {name}: {why}", yellow=True)
    listed = {name for name, _ in unmatched}
    for decision in gate.decisions:
        remeasured = any("re-measurement" in n for n in decision.notes)
        if not (decision.failed or decision.verdict == "inconclusive" or remeasured or (verbose and decision.checks)):
            continue
        for line in (*decision.checks, *decision.notes):
            if (
                "no drift correction" in line
                or line.startswith("host: not compared")
                or line == decision.device_blunted
                or (decision.name in listed and line.startswith("device: not compared"))
            ):
                continue
            tr.write_line(f"  {decision.name}: {line}", red=decision.failed, yellow=not decision.failed)


def summary_lines(records: list[dict[str, Any]]) -> list[str]:
    """Per mode, shape and path: time per call, device time, host share, speedup over generic, kernel, %peak."""
    from ..speed.report import by_case, generic_reference, timing_cells

    rows = [("mode", "shape", "path", "per call", "device", "host", "vs generic (torch)", "kernel", "%peak")]
    for (mode, shape), group in by_case(records, "mode", "shape"):
        ref = generic_reference(group)
        for record in group:
            *times, kernel, peak = timing_cells(record, ref)
            if record.get("failed"):
                kernel += " (MISMATCH)"
            rows.append((mode, shape, record["extra_info"].get("path", "?"), *times, kernel, peak))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(c).ljust(widths[i]) for i, c in enumerate(row)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def clock_notes(records: list[dict[str, Any]]) -> list[str]:
    notes = []
    throttled = [
        (r["extra_info"].get("throttled_rounds", 0), r["extra_info"].get("rounds", 0), r["name"])
        for r in records
        if r["extra_info"].get("throttled_rounds")
    ]
    for count, total, name in throttled:
        notes.append(
            f"throttled: {count}/{total} rounds of {name} ran below 75% of the maximum SM clock "
            f"(dropped from the regression test)"
        )
    reasons = {r["extra_info"].get("clock_note") for r in records if r["extra_info"].get("clock_note")}
    for reason in sorted(reasons):
        if reason != "no GPU clock on the CPU":
            notes.append(reason)
    methods = {r["extra_info"].get("device_time_note") for r in records if r["extra_info"].get("device_time_note")}
    if any(m and m.startswith("CUDA graph capture failed") for m in methods):
        count = sum(1 for r in records if str(r["extra_info"].get("device_time_note", "")).startswith("CUDA graph"))
        notes.append(
            f"device time: CUDA graph capture failed for {count} benchmark(s); event timing used "
            f"(an upper bound), see extra_info.device_time_note"
        )
    settled = sum(1 for r in records if "start-up transient" in str(r["extra_info"].get("device_time_note", "")))
    if settled:
        notes.append(
            f"device time: {settled} benchmark(s) started with a transient (graph replays more than 5% above their "
            "steady level); those leading samples were left out and more taken, see extra_info.device_time_note"
        )
    if any(r["extra_info"].get("timed_by") for r in records):
        notes.append(
            "timed by pytest-lstmperf: pytest-benchmark disables itself under pytest-xdist "
            f"({os.environ.get('PYTEST_XDIST_WORKER_COUNT', 'several')} workers shared the machine)"
        )
    return notes


def outcome_lines(config: pytest.Config, state: GateState, failed: bool) -> list[str]:
    """The gate's last lines: failed (with the command that records the new numbers), not passed, or passed."""
    gate = state.gate
    if gate is None:
        return []
    accept = options.resolve(config, "lstmperf_accept_inconclusive")
    lines = []
    if gate.failed:
        kinds = sorted({d.verdict for d in gate.failed})
        lines.append(
            f"SPEED GATE FAILED: {len(gate.failed)} benchmark(s) {'/'.join(kinds)}. If the change is intended, "
            f"record the new numbers with: {record_command(config, '--lstmperf-update-baseline')}"
        )
    for problem in gate.unsettled():
        if accept.value:
            lines.append(f"speed gate: {problem}, accepted ({accept.where()})")
        else:
            lines.append(
                f"SPEED GATE NOT PASSED: {problem}; this is not a pass. Accept it with "
                f"--lstmperf-accept-inconclusive (env PYTEST_LSTMPERF_ACCEPT_INCONCLUSIVE=1)"
            )
    if not failed and not gate.failed:
        wide, unmatched = len(gate.wide_device()), len(gate.no_device())
        listed = [
            *([f"{wide} with a raised device threshold"] if wide else []),
            *([f"{unmatched} without a device comparison"] if unmatched else []),
        ]
        blunted = f" ({', '.join(listed)}, listed above)" if listed else ""
        lines.append(f"speed gate passed: {gate.compared} benchmark(s) compared, none slower{blunted}")
    return lines
