"""The report of a run, built once at its end (:func:`build_report`) and read by everything that tells the run's
outcome: the terminal prints its sections, the CI summary (``$GITHUB_STEP_SUMMARY``, JUnit properties) writes its
rows, and the exit status is its verdict's (:func:`.speed.verdict.judge`).

Pure text and records: no terminal writer, no file. :class:`Line` carries the markup the terminal gives it.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import pytest

from . import ci_summary, options
from .speed.gate_table import format_table
from .speed.policy import (
    BETWEEN_RUNS,
    COMPARED,
    GOAL_PROCESSES,
    K_SIGMA,
    MAX_LIMIT,
    POOL_NAMES,
    RECORD_PROCESSES_MAX,
    between_text,
    short_of,
)
from .speed.provenance import record_command
from .speed.records import BESIDE_OTHER_TESTS
from .speed.report import by_case, generic_reference, path_cell, peak_notes, timing_cells
from .speed.verdict import references_of

if TYPE_CHECKING:
    from .speed.baseline_file import Baseline
    from .speed.gate import GateState
    from .speed.policy import Decision, GateResult
    from .speed.records import BenchRecord
    from .speed.verdict import Verdict


@dataclass(frozen=True)
class Line:
    """One line of a report section, with the terminal's markup (``red``, ``green``, ``yellow``, ``bold``)."""

    text: str
    markup: tuple[tuple[str, bool], ...] = ()

    @property
    def style(self) -> dict[str, bool]:
        return dict(self.markup)


class _Lines:
    """Collects lines as a terminal writer would be given them."""

    def __init__(self) -> None:
        self.lines: list[Line] = []

    def write_line(self, text: str, **markup: bool) -> None:
        self.lines.append(Line(text, tuple(sorted((k, v) for k, v in markup.items() if v))))


@dataclass(frozen=True)
class RunReport:
    """What a run has to say at its end: the per-path tally, the speed section, the CI rows and headline, and
    the verdict that decides the exit status."""

    paths: tuple[str, ...] = ()
    speed: tuple[Line, ...] = ()
    ci_rows: tuple[ci_summary.SummaryRow, ...] = ()
    headline: str = ""
    verdict: Verdict | None = None

    @property
    def failed(self) -> bool:
        return self.verdict is not None and self.verdict.failed


class _Tally(Protocol):
    def summary_lines(self) -> list[str]: ...


class _Device(Protocol):
    def describe(self) -> str: ...


class ReportedRun(Protocol):
    """What the report reads of a run: :class:`..session.LstmPerfSession` is one (this module names the session's
    parts it reads, not the session, which holds the report)."""

    @property
    def config(self) -> pytest.Config: ...

    @property
    def gate(self) -> GateState: ...

    @property
    def gate_used(self) -> bool: ...

    @property
    def tally(self) -> _Tally: ...

    @property
    def device(self) -> _Device: ...


def build_report(session: ReportedRun) -> RunReport:
    """The run's report, from its session: the tally's lines, and where the gate took part, its section, its CI
    rows and its verdict (``session.gate.verdict``, judged before)."""
    config = session.config
    state = session.gate
    speed: tuple[Line, ...] = ()
    rows: tuple[ci_summary.SummaryRow, ...] = ()
    headline = ""
    if session.gate_used:
        speed = speed_lines(config, state, lambda: session.device.describe())
        if state.gate is not None:
            rows = ci_rows(state)
            headline = f"speed gate: {state.gate.summary()}"
            if state.gate.upgrade is not None:
                headline += f" ({state.gate.upgrade.headline(state.gate.decisions)})"
    return RunReport(tuple(session.tally.summary_lines()), speed, rows, headline, state.verdict)


def ci_rows(state: GateState) -> tuple[ci_summary.SummaryRow, ...]:
    """One row per decision, as CI shows it (:mod:`.ci_summary`)."""
    assert state.gate is not None
    rows = []
    for d in state.gate.decisions:
        deciding = d.deciding
        kernel = d.kernel_now or d.kernel_then
        if d.kernel_then and d.kernel_now and d.kernel_then != d.kernel_now:
            kernel = f"{d.kernel_then} -> {d.kernel_now}"
        notes = [c.text() for c in d.checks if c.verdict != "unchanged"] or list(d.notes)
        rows.append(
            ci_summary.SummaryRow(
                name=d.name,
                verdict=d.verdict,
                kernel=kernel,
                ratio=deciding.ratio if deciding else None,
                limit=deciding.limit if deciding else None,
                note="; ".join(notes),
            )
        )
    return tuple(rows)


def speed_lines(config: pytest.Config, state: GateState, device: Callable[[], str]) -> tuple[Line, ...]:
    """The ``lstmperf speed`` section: per-benchmark table, clock notes, where the time went, messages, what was
    recorded, the gate's table and its verdict (``state.verdict``'s lines, last); empty where the gate has nothing
    to say. ``device()`` describes the device (may raise UsageError)."""
    if not (state.records or state.messages or state.errors or state.gate or state.save_report):
        return ()
    tr = _Lines()
    if state.records:
        with contextlib.suppress(pytest.UsageError):
            tr.write_line(f"device: {device()}")
        for line in summary_lines(state.records):
            tr.write_line(line)
        for note in timing_notes(state.records):
            tr.write_line(note, yellow=True)
    line = phase_line(state.records, state.phase_s)
    if line:
        tr.write_line(line)
    for message in state.messages:
        tr.write_line(message)
    if state.save_report is not None:
        tr.write_line(state.save_report.describe(), green=True)
        for flag in state.save_report.outliers:
            tr.write_line(
                f"RECORDING RUN OUTSIDE the runs before it (added; the resolution widens): {flag}", yellow=True
            )
        for flag in state.save_report.refused:
            tr.write_line(f"RECORDING RUN REFUSED for {flag}", yellow=True, bold=True)
        for flag in state.save_report.left_out:
            tr.write_line(f"RECORDING PROCESS LEFT OUT of {flag}", yellow=True, bold=True)
        for name, blind in sorted(state.save_report.blind.items()):
            resolves = "no slowdown at all" if math.isinf(blind.resolves) else f"{blind.resolves:.3g}x"
            processes = state.save_report.compare_processes
            if blind.sittings is not None:
                why = (
                    "its recordings made at different times (this one, and the earlier recording(s) this update "
                    "kept) lie so far apart that a compare made at another time lies "
                    f"{math.exp(blind.sittings) - 1:.1%} from their mean by chance, and a compare of {processes} "
                    f"processes resolves {resolves}; every compare will call it inconclusive (which fails the run), "
                    "however quiet: find what moves it from one run to the next on this machine, or leave it out of "
                    "the gated run"
                )
            else:
                why = (
                    f"its recording processes lie so far apart that a compare of {processes} processes resolves "
                    f"{resolves}; every compare will call it inconclusive (which fails the run) unless that run is "
                    "quieter: record it again on a quiet machine (--lstmperf-update-baseline), or leave it out of the "
                    "gated run"
                )
            tr.write_line(f"RECORDED BLIND to a {MAX_LIMIT}x slowdown: {name}: {why}", yellow=True, bold=True)
    if state.report_path is not None:
        tr.write_line(f"speed report written to {state.report_path}")
    if state.gate is not None:
        _print_gate(tr, config, state)
    for error in state.errors:
        tr.write_line(f"ERROR: {error}", red=True, bold=True)
    for line in state.verdict.lines if state.verdict is not None else ():
        bad = not line.startswith("speed gate passed")
        tr.write_line(line, red=bad, green=not bad, bold=True)
    return tuple(tr.lines)


def _print_gate(tr: _Lines, config: pytest.Config, state: GateState) -> None:
    assert state.baseline is not None and state.gate is not None
    gate = state.gate
    verbose = config.getoption("verbose", 0) > 0
    tr.write_line("")
    if gate.upgrade is not None:  # said first: every figure below crosses it
        tr.write_line(gate.upgrade.headline(gate.decisions), yellow=True, bold=True)
        moved = [d for d in gate.decisions if d.verdict in ("regressed", "improved", "kernel-changed")]
        for d in moved:
            tr.write_line(f"  {d.name}: {d.verdict}: {_check_line(d)}", yellow=True)
    if state.baseline.migrated_from is not None:
        tr.write_line(
            f"baseline {state.baseline.path.name} has the older format {state.baseline.migrated_from}: its timings "
            "were taken without the anchor and are not compared (kernels and host counts are); record them with "
            f"{record_command(config, '--lstmperf-save-baseline')}",
            yellow=True,
        )
    tr.write_line(f"speed gate against {state.baseline.path}: {gate.summary()}", bold=True)
    if gate.count("new"):
        tr.write_line(
            f"  {gate.count('new')} new: no entry in the baseline, so not judged; measured for the report alone (no "
            "sweep across the run, the first half of their device samples); record them with "
            f"{record_command(config, '--lstmperf-update-baseline')}"
        )
    shown = gate.decisions if verbose else [d for d in gate.decisions if d.verdict not in ("unchanged", "not-run")]
    for line in format_table(shown) if shown else []:
        tr.write_line(line)
    threshold = state.verdict.threshold if state.verdict is not None else options.THRESHOLD
    coarse = state.verdict.coarse if state.verdict is not None else ()
    if coarse:
        terms = [c.between for _, c in coarse if c.metric == "per-call" and c.between is not None]
        between = min(terms) if terms else BETWEEN_RUNS["per-call"]
        floor = math.exp(K_SIGMA * between)
        per_call = any(check.metric == "per-call" for _, check in coarse)
        tr.write_line(
            f"{len(coarse)} check(s) resolve less than the threshold {threshold:.2f} on this machine (their limit "
            f"is the slowdown they resolve: {K_SIGMA:g} standard errors of the figures and of how far runs lie "
            "apart; "
            + (
                f"a time per call resolves no better than {floor:.2f}x, since a compare made minutes or days "
                f"after its recording lies about {between_text(c for _, c in coarse)} from it; "
                if per_call
                else ""
            )
            + "more rounds or a quieter machine narrow the rest):",
            yellow=True,
        )
        for name, check in coarse:
            tr.write_line(f"  {name}: {check.metric} resolves {check.resolves:.3f}x", yellow=True)
    for line in goal_lines(gate, state.goal):
        tr.write_line(line, yellow=line.startswith(" ") or "short" in line)
    single = gate.one_run()
    if single:
        tr.write_line(
            f"{len(single)} benchmark(s) rest on one recording process: how far processes lie apart is the "
            "baseline's pooled figure alone for them (record them again with --lstmperf-update-baseline, which "
            "times them in several processes)",
            yellow=True,
        )
    for line in resolution_lines(gate, state.baseline):
        tr.write_line(line)
    for decision in gate.decisions:
        if not (decision.failed or decision.verdict == "inconclusive" or decision.notes or verbose):
            continue
        lines = [c.text() for c in decision.checks if verbose or c.verdict != "unchanged"] + list(decision.notes)
        for line in dict.fromkeys(lines):
            tr.write_line(f"  {decision.name}: {line}", red=decision.failed, yellow=not decision.failed)


def goal_lines(gate: GateResult, goal: float) -> list[str]:
    """Where the resolution goal (``--lstmperf-resolution``, 1.10 by default) is finer than the gate's promise:
    how many compared checks resolve it, with how many processes, and each one short of it with what would bring
    it there."""
    if goal >= MAX_LIMIT:
        return []
    compared = [c for d in gate.decisions if d.verdict in COMPARED for c in d.checks if c.resolves is not None]
    if not compared:
        return []
    short = short_of(gate.decisions, goal)
    counts = sorted(d.processes for d in gate.decisions if d.verdict in COMPARED)
    span = f"{counts[0]}" if counts[0] == counts[-1] else f"{counts[0]}-{counts[-1]}"
    lines = [
        f"resolution goal {goal:g}x (--lstmperf-resolution): {len(compared) - len(short)} of {len(compared)} "
        f"compared check(s) resolve it, timed in {span} process{'es' if counts[-1] > 1 else ''} of this run (at "
        f"most {GOAL_PROCESSES})" + (f"; {len(short)} short of it:" if short else "")
    ]
    for decision, check, why in short:
        term = check.between if check.between is not None else BETWEEN_RUNS["per-call"]
        floor = math.exp(K_SIGMA * term)
        if why == "processes" or check.best is None:
            what = "further processes would bring it there: the run stopped first (an error, or a failing test)"
        elif check.metric == "per-call" and goal < floor:
            what = (
                f"no compare resolves a time per call below {floor:.3f}x, since one made minutes or days after its "
                f"recording lies about {term:.1%} from it"
            )
        elif decision.runs < RECORD_PROCESSES_MAX and check.reach is not None and check.reach <= goal:
            what = (
                f"{GOAL_PROCESSES} processes of a compare would resolve {check.best:.3f}x against the "
                f"{decision.runs} recorded, {check.reach:.3f}x against {RECORD_PROCESSES_MAX}: record it in more "
                f"(--lstmperf-record-processes={RECORD_PROCESSES_MAX} with --lstmperf-update-baseline)"
            )
        else:
            against = (
                f", {check.reach:.3f}x against {RECORD_PROCESSES_MAX}"
                if check.reach is not None and decision.runs < RECORD_PROCESSES_MAX
                else ""
            )
            what = (
                f"{GOAL_PROCESSES} processes of a compare would resolve {check.best:.3f}x against the "
                f"{decision.runs} recorded{against}: its processes lie too far apart on this machine for the goal"
            )
        lines.append(f"  {decision.name}: {check.metric} resolves {check.resolves:.3f}x: {what}")
    return lines


#: a run whose anchor took this much longer or shorter than recorded (median over its benchmarks) names the state
#: beside a slower time per call: the benchmarks that follow the state faster than the anchor read high there
STATE_NOTE = 1.2


def resolution_lines(gate: GateResult, baseline: Baseline) -> list[str]:
    """What the compared benchmarks resolve, and which figures decide (raw or divided by the anchor) and why."""
    lines = []
    resolves = sorted(gate.resolutions())
    if resolves:
        median = resolves[len(resolves) // 2]
        per_call = any(
            c.metric == "per-call" and c.resolves for d in gate.decisions if d.verdict in COMPARED for c in d.checks
        )
        checks = [c for d in gate.decisions if d.verdict in COMPARED for c in d.checks]
        apart = f", and for a time per call of how far runs made at different times lie apart ({between_text(checks)})"
        lines.append(
            f"resolution: median {median:.3f}x, best {resolves[0]:.3f}x, worst {resolves[-1]:.3f}x over "
            f"{len(resolves)} compared check(s) (the slowdown each one sees: {K_SIGMA:g} standard errors of this "
            f"run's figure and of how far recording processes lie apart{apart if per_call else ''})"
        )
    moves = sorted(d.anchor_move for d in gate.decisions if d.anchor_move and d.verdict in COMPARED)
    if moves:
        median_move = moves[len(moves) // 2]
        text = (
            f"machine state: the anchor took {median_move:.2f}x its recorded time (median over {len(moves)} compared "
            f"benchmark(s), {moves[0]:.2f}-{moves[-1]:.2f}x)"
        )
        slower = any(c.metric == "per-call" and c.verdict == "regressed" for d in gate.decisions for c in d.checks)
        if slower and abs(math.log(median_move)) > math.log(STATE_NOTE):
            text += (
                ": dividing by it cancels a state that moves a benchmark as far as the anchor, and on a 16-core Xeon "
                "small torch inference calls moved up to 1.5 times as far (docs/gate-evidence.md); a time per call "
                "just past its limit in such a run may be the state: rerun it on a quieter machine"
            )
        lines.append(text)
    references = references_of(baseline)
    for pool in sorted({ref.pool for ref in references.values()}):  # the baseline's spread is pooled by mode
        mine = {n: ref for n, ref in references.items() if ref.pool == pool}
        any_ref = next(iter(mine.values()))
        for metric in ("per-call", "device"):
            a, r = any_ref.spread.get((metric, "anchored")), any_ref.spread.get((metric, "raw"))
            if a is None or r is None:
                continue
            of = f" of {POOL_NAMES[pool]}" if pool else ""
            lines.append(
                f"{metric} figures{of}: divided by the anchor (recording processes lie {a.sigma:.1%} apart divided "
                f"by the anchor, {r.sigma:.1%} raw, median over {r.benchmarks} benchmarks)"
            )
            raw = sorted(n for n, ref in mine.items() if ref.has_figure(metric) and ref.variant(metric) == "raw")
            if raw:  # a time per call whose own processes say so (:meth:`Reference.variant`)
                lines.append(
                    f"  raw time for {len(raw)} of them, whose own processes say beyond doubt that the anchor adds "
                    f"more noise than it removes: {_named(raw)}"
                )
            alone = sorted(n for n, ref in mine.items() if ref.has_figure(metric) and ref.scatters(metric))
            if alone:  # :meth:`Reference.scatters`
                lines.append(
                    f"  judged on their own processes alone, {len(alone)} of them, whose processes lie beyond doubt "
                    f"further apart than the others': {_named(alone)}"
                )
    return lines


def _named(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _check_line(decision: Decision) -> str:
    return "; ".join(c.text() for c in decision.checks if c.verdict != "unchanged") or "unchanged"


def summary_lines(records: list[BenchRecord]) -> list[str]:
    """Per mode, shape and path: time per call, device time, host share, speedup over generic, kernel, %peak."""
    rows: list[tuple[str, ...]] = [
        ("mode", "shape", "path", "per call", "device", "host", "vs generic (torch)", "kernel", "%peak")
    ]
    for (mode, shape), group in by_case(records):
        ref = generic_reference(group)
        for record in group:
            *times, kernel, peak = timing_cells(record, ref)
            if record.failed:
                kernel += " (MISMATCH)"
            rows.append((mode, shape, path_cell(record), *times, kernel, peak))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(c).ljust(widths[i]) for i, c in enumerate(row)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


#: the order a benchmark's phases run in (``extra_info.phase_s``, written by the runner)
PHASES = ("waited", "prepare", "trace", "rounds", "extended", "device_time", "counters", "peak")


def phase_line(records: list[BenchRecord], after: dict[str, float]) -> str:
    """Where the speed checks spent their time: the benchmarks' phases summed over the run's benchmarks (in this
    process, and under pytest-xdist in every worker), then the gate's own phases after the tests (``after``)."""
    totals: dict[str, float] = {}
    for record in records:
        for phase, seconds in record.phase_s.items():
            totals[phase] = totals.get(phase, 0.0) + seconds
    parts = []
    if totals:
        order = [p for p in PHASES if p in totals] + sorted(set(totals) - set(PHASES))
        inner = ", ".join(f"{p.replace('_', ' ')} {totals[p]:.1f}" for p in order)
        parts.append(f"{len(records)} benchmark(s) {sum(totals.values()):.1f} s ({inner})")
    parts += [f"{name} {seconds:.1f} s" for name, seconds in after.items()]
    return f"time by phase: {'; '.join(parts)}" if parts else ""


def timing_notes(records: list[BenchRecord]) -> list[str]:
    notes = peak_notes(records)  # why a %peak cell shows no share
    methods = {r.device_time_note for r in records if r.device_time_note}
    if any(m.startswith("CUDA graph capture failed") for m in methods):
        count = sum(1 for r in records if r.device_time_note.startswith("CUDA graph"))
        notes.append(
            f"device time: CUDA graph capture failed for {count} benchmark(s); event timing used "
            f"(an upper bound), see extra_info.device_time_note"
        )
    settled = sum(1 for r in records if "start-up transient" in r.device_time_note)
    if settled:
        notes.append(
            f"device time: {settled} benchmark(s) started with a transient (device samples more than 5% above their "
            "steady level); those leading samples were left out and more taken, see extra_info.device_time_note"
        )
    if any(r.timed_by for r in records):
        notes.append(
            "timed by pytest-lstmperf: pytest-benchmark disables itself under pytest-xdist "
            f"({os.environ.get('PYTEST_XDIST_WORKER_COUNT', 'several')} workers shared the machine)"
        )
    if any(BESIDE_OTHER_TESTS in r.timed_by for r in records):
        notes.append(
            "timed beside the other workers' tests: this run compares and records nothing, so no benchmark held "
            "the machine to itself, and the figures include the other tests' load (the gate's runs, "
            "--benchmark-compare and the recordings, hold it)"
        )
    return notes
