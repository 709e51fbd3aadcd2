"""The speed gate as the session ends (on the controller, or the only process): the baseline recorded, the
merged ``--benchmark-json`` written under pytest-xdist, the gate run against the baseline, its verdict written
for CI and into the speed report, and whether the session fails. Before any test runs, :func:`check_writable`
stops a recording run whose baseline cannot be written."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .. import ci_summary
from ..run_report import RunReport, build_report
from ..session import run_session, started_session
from ..speed.baseline_file import BaselineError, reference_of
from ..speed.gate import GateState
from ..speed.policy import (
    MAX_LIMIT,
    RECORD_PROCESSES_MAX,
    blind,
    compare_processes,
    for_the_goal,
    pooled,
    undecided,
    unresolved_why,
)
from ..speed.provenance import benchmark_header, provenance, record_command, rerun_command
from ..speed.records import BenchRecord
from ..speed.report import write_report
from ..speed.sweep import Swept, apply
from ..speed.verdict import judge, run_gate
from .benchmark_json import write_xdist_json
from .compare_target import take_over_compare
from .gate_context import (
    baseline_store,
    gate_device,
    gate_state,
    hardware_fields,
    is_worker,
    machine_lock,
    saving,
    saving_flag,
    setting,
    xdist_active,
)
from .recording import RecordingError, process_folder, record_in_processes, write_records

STAT_REGRESSION = "speed-regression"
STAT_INCONCLUSIVE = "speed-inconclusive"


def check_writable(config: pytest.Config) -> None:
    """A recording run whose baseline cannot be written stops before any test runs (exit 4)."""
    try:
        baseline_store(config).check_writable(hardware_fields(gate_device(config)))
    except BaselineError as exc:
        raise pytest.UsageError(f"{saving_flag(config)}: {exc}") from None


SWEPT_KEY = "lstmperf_swept"  # a pytest-xdist worker's sweep, in its workeroutput


def sweep(config: pytest.Config) -> None:
    """This process's benchmarks whose figure is the time per call, timed again across the run
    (:mod:`..speed.sweep`); a pytest-xdist worker hands what it measured to the controller."""
    state = run_session(config).gate  # a run without a benchmark to sweep does not become the gate's
    if state.sweep is None or not len(state.sweep):
        return
    if not is_worker(config):
        _say(config)(f"lstmperf: {state.sweep.plan().describe()}")
    lock = machine_lock(config)
    started = time.perf_counter()
    swept = state.sweep.run(hold=lock.exclusive if lock is not None else contextlib.nullcontext)
    state.phase_s["sweep"] = time.perf_counter() - started
    if is_worker(config):
        config.workeroutput[SWEPT_KEY] = {name: s.to_json() for name, s in swept.items()}  # type: ignore[attr-defined]  # set by pytest-xdist on its workers
    else:
        state.swept.update(swept)


def show_swept(config: pytest.Config) -> None:
    """pytest-benchmark's own results given the swept samples where they are a benchmark's figure, before
    pytest-benchmark groups and writes them (its tables, ``--benchmark-json``, ``--benchmark-compare-fail``): its
    ``NOW`` rows then hold the figure the gate compares, as a baseline's entries hold the recording's sweep,
    instead of the stretch its test timed (its rounds counted in ``extra_info.swept.test_rounds``). Under pytest-xdist
    pytest-benchmark keeps nothing and the merged ``--benchmark-json`` is written from the swept records."""
    session = getattr(config, "_benchmarksession", None)
    state = run_session(config).gate
    if session is None or not state.swept:
        return
    applied = {r.fullname: r for r in apply(state.records, state.swept)[0]}
    for meta in getattr(session, "benchmarks", ()):
        record = applied.get(getattr(meta, "fullname", ""))
        swept = record.extra_info.get("swept") if record is not None else None
        if record is None or not isinstance(swept, dict) or "rounds" not in swept:
            continue  # not swept (its figure is the device time, or the sweep could not time it)
        stats = type(meta.stats)()
        stats.data = list(record.data)
        meta.stats = stats
        meta.extra_info.update(
            {key: record.extra_info[key] for key in ("swept", "anchor", "rounds", "time_per_call_s", "run_medians")}
        )


def take_swept(config: pytest.Config, workeroutput: Any) -> None:
    """On the controller: a finished worker's sweep."""
    raw = (workeroutput or {}).get(SWEPT_KEY) or {}
    gate_state(config).swept.update({name: Swept.from_json(s) for name, s in raw.items()})


def finish(session: pytest.Session) -> None:
    """Record, write, decide; a failed gate (or an error of its own) turns a passing session's exit status to
    TESTS_FAILED."""
    config = session.config
    state = gate_state(config)
    if state.deferred_compare is not None and state.records:  # pytest-xdist: the controller collected nothing
        try:
            take_over_compare(config)
        except pytest.UsageError as exc:
            state.errors.append(str(exc))
            session.exitstatus = pytest.ExitCode.USAGE_ERROR
    state.records, swept_lines = apply(state.records, state.swept)
    state.messages.extend(swept_lines)
    measured = [r for r in state.records if r.data]
    if process_folder() is not None:  # a recording process: its records go to the recording command
        write_records(measured)
        return
    state.goal = setting(config, "lstmperf_resolution").value  # read once: the recording and the compare aim at it
    if saving(config) is not None:
        started = time.perf_counter()
        _record_baseline(config, state, session, measured)
        state.phase_s["recording processes"] = time.perf_counter() - started
    json_target = config.getoption("benchmark_json", None)
    if json_target and measured and xdist_active(config):
        try:
            state.messages.append(write_xdist_json(config, json_target, measured))
        except (OSError, TypeError, ValueError) as exc:
            name = getattr(json_target, "name", json_target)
            state.errors.append(f"--benchmark-json={name}: could not write the merged results: {exc}")
    if state.baseline is not None:
        session_ = started_session(config)
        unavailable = session_.resolve_unavailable() if session_ is not None else {}
        threshold = setting(config, "lstmperf_threshold").value
        versions = gate_device(config).versions()
        state.gate = run_gate(state.baseline, state.records, threshold, versions, unavailable)
        started = time.perf_counter()
        goal = state.goal
        cap = compare_processes(goal)
        more: dict[str, list[BenchRecord]] = {}
        for extra in range(2, cap + 1):  # adaptive: more processes only where noise needs them
            again = [d for d in state.gate.decisions if undecided(d, goal)]
            names = {d.name for d in again}
            if not names or state.errors or session.exitstatus not in (0, pytest.ExitCode.OK):
                break
            short = any(for_the_goal(d, goal) for d in again)
            why = f"undecided, or short of {goal:g}x" if short else "undecided on this run's noise"
            try:
                got = record_in_processes(
                    config, [r for r in measured if r.fullname in names], 2, _say(config), index=extra,
                    of=cap, why=why, beside=measured,
                )  # fmt: skip
            except RecordingError as exc:
                state.errors.append(str(exc).replace("not recording: recording", "not compared further: compare"))
                break
            for name, records in got.items():
                more.setdefault(name, []).extend(records)
            state.gate = run_gate(state.baseline, state.records, threshold, versions, unavailable, more)
        if more:
            state.phase_s["compare processes"] = time.perf_counter() - started
    _write_report(config, state)
    run = run_session(config)
    _judge(config, state)
    run.report = build_report(run)
    if state.gate is not None:  # the verdict for CI, from the report; an error writing it fails the run too
        error = _write_ci_summary(config, run.report)
        if error:
            state.errors.append(error)
            _judge(config, state)
        run.report = build_report(run)  # with the line that says where the CI summary went, or why it did not
    _count_for_pytest(config, state)
    if run.report.failed and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _record_baseline(
    config: pytest.Config, state: GateState, session: pytest.Session, measured: list[BenchRecord]
) -> None:
    """Record this run's benchmarks, only when the run completed: an interrupted run (Ctrl-C, -x, a failing
    test) would leave a partial baseline, so it records nothing and says so."""
    status = pytest.ExitCode(session.exitstatus) if isinstance(session.exitstatus, int) else session.exitstatus
    if status != pytest.ExitCode.OK or session.shouldstop or session.shouldfail:
        interrupted = status == pytest.ExitCode.INTERRUPTED
        why = "it was interrupted" if interrupted else f"it did not pass ({status.name})"
        if session.testsfailed:
            why += f": {session.testsfailed} test(s) failed"
        then = "Record again with a run that completes." if interrupted else "Fix the failure and record again."
        state.errors.append(
            f"not recording: this run did not complete ({why}); a partial baseline is never written, the "
            f"baseline folder is unchanged. {then}"
        )
        return
    if not measured:
        state.messages.append("no benchmark was measured in this run: nothing recorded")
        return
    try:
        siblings = _record_processes(config, measured, state.goal)
    except RecordingError as exc:
        state.errors.append(str(exc))
        return
    recorded = {r.fullname: [x.measurement() for x in (r, *siblings.get(r.fullname, ()))] for r in measured}
    try:
        device = gate_device(config)
        state.save_report = baseline_store(config).save(
            measured,
            fields=hardware_fields(device),
            fingerprint=device.fingerprint,
            versions=device.versions(),
            threshold=setting(config, "lstmperf_threshold").value,
            provenance=provenance(config),
            header=benchmark_header(config),
            update=saving(config) == "update",
            add_run=saving(config) == "add-run",
            siblings=siblings,
        )
        if saving(config) != "add-run" and setting(config, "lstmperf_record_processes").value > 1:
            written = pooled({name: reference_of(entry) for name, entry in state.save_report.entries.items()})
            state.save_report.blind = blind(recorded, state.goal, written)
            state.save_report.compare_processes = compare_processes(state.goal)
        if xdist_active(config):
            state.messages.append("recorded under pytest-xdist: workers shared the machine while timing")
    except BaselineError as exc:
        state.errors.append(str(exc))


def _record_processes(config: pytest.Config, measured: list[BenchRecord], goal: float) -> dict[str, list[BenchRecord]]:
    """The recording's further processes: ``--lstmperf-record-processes`` in all, then one more at a time for the
    benchmarks whose processes do not yet show how far they lie apart well enough to see a 1.5x slowdown (a lone
    benchmark of a user's: Student's t on few processes), and for those a compare would resolve the
    ``--lstmperf-resolution`` goal against with more recorded (:func:`unresolved`), up to
    :data:`RECORD_PROCESSES_MAX` in all."""
    say = _say(config)
    processes = setting(config, "lstmperf_record_processes").value
    siblings = record_in_processes(config, measured, processes, say)
    if processes <= 1 or saving(config) == "add-run":  # an added run joins processes the entry already has
        return siblings
    total = processes
    while total < RECORD_PROCESSES_MAX:
        recorded = {r.fullname: [x.measurement() for x in (r, *siblings.get(r.fullname, ()))] for r in measured}
        why = unresolved_why(recorded, goal)
        if not why:
            break
        names = set(why)
        total += 1
        counts = {kind: sum(w == kind for w in why.values()) for kind in ("apart", "promise", "goal")}
        whys = []
        if counts["apart"] + counts["promise"]:
            whys.append(
                f"{counts['apart'] + counts['promise']} whose processes do not yet show how far they lie apart well "
                f"enough to see a {MAX_LIMIT}x slowdown" + (
                    f" ({counts['apart']} lie beyond doubt further apart than their neighbours)"
                    if counts["apart"] else "")
            )  # fmt: skip
        if counts["goal"]:
            whys.append(f"{counts['goal']} that a compare would resolve {goal:g}x against with more recorded")
        got = record_in_processes(
            config, [r for r in measured if r.fullname in names], 2, say, index=total, of=RECORD_PROCESSES_MAX,
            why=f"{len(names)} benchmark(s): " + "; ".join(whys), beside=measured,
        )  # fmt: skip
        for name, records in got.items():
            siblings.setdefault(name, []).extend(records)
    return siblings


def _say(config: pytest.Config) -> Callable[[str], None]:
    """A line on the terminal, now (a recording's processes take minutes)."""
    tr = config.pluginmanager.get_plugin("terminalreporter")

    def say(line: str) -> None:
        if tr is not None:
            tr.write_line(line)

    return say


def _write_ci_summary(config: pytest.Config, report: RunReport) -> str | None:
    """The report's verdict as Markdown in ``$GITHUB_STEP_SUMMARY`` (where set) and as JUnit properties of the
    run; an error writing the summary file, or None."""
    try:
        written = ci_summary.write_step_summary(list(report.ci_rows), report.headline)
    except ci_summary.StepSummaryError as exc:
        return str(exc)
    if written is not None:
        gate_state(config).messages.append(f"the gate's verdict was written to {written} (GITHUB_STEP_SUMMARY)")
    ci_summary.add_junit_properties(config, ci_summary.junit_properties(list(report.ci_rows), report.headline))
    return None


def _write_report(config: pytest.Config, state: GateState) -> None:
    report_dir = setting(config, "lstmperf_report").value
    if not (report_dir and state.records):
        return

    try:
        state.report_path = write_report(
            Path(report_dir),
            state.records,
            list(state.baseline.benchmarks.values()) if state.baseline else None,
            gate_device(config).describe(),
            state.gate,
        )
    except Exception as exc:
        state.errors.append(f"--lstmperf-report={report_dir}: could not write the report: {exc}")


def _judge(config: pytest.Config, state: GateState) -> None:
    """The run's verdict (:func:`..speed.verdict.judge`), kept as ``state.verdict``."""
    accept = setting(config, "lstmperf_accept_inconclusive")
    state.verdict = judge(
        state.gate,
        state.errors,
        threshold=setting(config, "lstmperf_threshold").value,
        accept_inconclusive=bool(accept.value),
        accept_where=accept.where(),
        update_command=record_command(config, "--lstmperf-update-baseline"),
        rerun_command=rerun_command(config),
    )


def _count_for_pytest(config: pytest.Config, state: GateState) -> None:
    """pytest's final line counts the regressed and the inconclusive benchmarks."""
    tr = config.pluginmanager.get_plugin("terminalreporter")
    stats = getattr(tr, "stats", None)
    verdict = state.verdict
    if stats is None or verdict is None:
        return
    if verdict.regressed:
        stats.setdefault(STAT_REGRESSION, []).extend(verdict.regressed)
    if state.gate is not None and verdict.unsettled:  # said even where accepted
        inconclusive: list[Any] = list(state.gate.inconclusive) or [state.gate]
        stats.setdefault(STAT_INCONCLUSIVE, []).extend(inconclusive)
