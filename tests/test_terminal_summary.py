"""The end of a run's output: the per-path summary aligned whatever the length of a path's name, and the wall
time after pytest-benchmark's tables (not between the summary and them)."""

from __future__ import annotations

import dataclasses
import re

import pytest

LONG = "torch-cudnn-packed~torch-cuda-generic-packed"  # a pair of paths: longer than any fixed column

TESTS = f"""
def test_long(benchmark, request):
    request.node.user_properties.append(("lstmperf_path", "{LONG}"))
    benchmark(lambda: None)


def test_short(request):
    request.node.user_properties.append(("lstmperf_path", "torch-cpu-native"))
"""


@pytest.fixture(scope="module")
def output(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    pytest.importorskip("pytest_benchmark")
    pytester_dir = tmp_path_factory.mktemp("summary")
    (pytester_dir / "test_summary.py").write_text(TESTS, encoding="utf-8")
    import os
    import subprocess
    import sys

    # a run of its own: not a pytest-xdist worker's (whose environment says so to pytest-benchmark and the plugin)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "test_summary.py", "-p", "no:cacheprovider", "--device=cpu",
         "--lstmperf-paths=torch-cpu-native", "-p", "no:xdist"],
        cwd=pytester_dir, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.splitlines()


def test_per_path_summary_is_aligned(output: list[str]) -> None:
    start = output.index("lstmperf: per path (passed/failed/skipped; kernels observed)")
    rows = output[start + 1 : start + 3]
    assert [row.split()[0] for row in rows] == ["torch-cpu-native", LONG]
    counts = {row.index("/") for row in rows}  # the passed/failed/skipped column starts at one place
    kernels = {re.search(r"\d+/\s*\d+/\s*\d+\s+", row).end() for row in rows}  # type: ignore[union-attr]
    assert len(counts) == 1 and len(kernels) == 1, rows


def test_wall_time_comes_after_the_benchmark_tables(output: list[str]) -> None:
    wall = [i for i, line in enumerate(output) if line.startswith("lstmperf: wall time ")]
    table = [i for i, line in enumerate(output) if "benchmark: 1 tests" in line]
    summary = output.index("lstmperf: per path (passed/failed/skipped; kernels observed)")
    assert len(wall) == 1 and len(table) == 1, output
    assert summary < table[0] < wall[0]
    assert "start-up included" in output[wall[0]]


def test_time_by_phase_sums_the_benchmarks_phases_and_names_the_gates_own() -> None:
    from pytest_lstmperf.run_report import phase_line
    from pytest_lstmperf.speed.records import BenchRecord

    records = [
        BenchRecord("a", extra_info={"phase_s": {"prepare": 1.0, "rounds": 2.0, "trace": 0.5}}),
        BenchRecord(
            "b", extra_info={"phase_s": {"prepare": 0.5, "rounds": 4.0, "device_time": 1.0, "new_phase": 0.25}}
        ),
        BenchRecord("c"),
    ]
    line = phase_line(records, {"recording processes": 30.0})
    assert line == (
        "time by phase: 3 benchmark(s) 9.2 s (prepare 1.5, trace 0.5, rounds 6.0, device time 1.0, new phase 0.2); "
        "recording processes 30.0 s"
    )
    assert phase_line([], {}) == ""
    assert phase_line([], {"compare processes": 4.0}) == "time by phase: compare processes 4.0 s"


def test_a_recording_names_each_benchmark_no_compare_will_resolve(tmp_path) -> None:
    """A benchmark whose recording processes lie too far apart for a compare of COMPARE_PROCESSES processes to see
    1.5x (:func:`policy.blind`) is named when the recording ends, with what it resolves and what to do; a
    recording with none says nothing of it."""
    from pytest_lstmperf.run_report import speed_lines
    from pytest_lstmperf.speed.baseline import SaveReport
    from pytest_lstmperf.speed.gate import GateState
    from pytest_lstmperf.speed.policy import Blind

    state = GateState(save_report=SaveReport(tmp_path / "cpu.json", created=["a", "b"], new_file=True))
    quiet = [line.text for line in speed_lines(None, state, lambda: "cpu")]  # type: ignore[arg-type]
    assert not any("BLIND" in line for line in quiet), quiet
    state.save_report.blind = {"test_inference[b]": Blind(1.537)}
    lines = [line.text for line in speed_lines(None, state, lambda: "cpu")]  # type: ignore[arg-type]
    blind = [line for line in lines if "RECORDED BLIND" in line]
    assert len(blind) == 1, lines
    assert "test_inference[b]" in blind[0] and "resolves 1.54x" in blind[0] and "4 processes" in blind[0]
    assert "inconclusive" in blind[0] and "--lstmperf-update-baseline" in blind[0]
    # blinded by its sittings (an update kept an earlier recording far from this one): no quiet machine cures it
    state.save_report.blind = {"test_training[c]": Blind(1.66, sittings=0.1216)}
    lines = [line.text for line in speed_lines(None, state, lambda: "cpu")]  # type: ignore[arg-type]
    blind = [line for line in lines if "RECORDED BLIND" in line]
    assert len(blind) == 1 and "recordings made at different times" in blind[0] and "12.9%" in blind[0], lines
    assert "resolves 1.66x" in blind[0] and "however quiet" in blind[0] and "quiet machine" not in blind[0]


def test_a_recording_blind_for_want_of_processes_says_it_resolves_nothing(tmp_path) -> None:
    """A lone benchmark recorded in two processes far apart resolves no slowdown at all (its spread widened by
    Student's t on one degree of freedom): the line says so instead of printing ``infx``."""
    from pytest_lstmperf.run_report import speed_lines
    from pytest_lstmperf.speed.baseline import SaveReport
    from pytest_lstmperf.speed.gate import GateState
    from pytest_lstmperf.speed.policy import Blind

    state = GateState(save_report=SaveReport(tmp_path / "cpu.json", created=["a"], new_file=True))
    state.save_report.blind = {"test_mine[a]": Blind(float("inf"))}
    lines = [line.text for line in speed_lines(None, state, lambda: "cpu")]  # type: ignore[arg-type]
    blind = [line for line in lines if "RECORDED BLIND" in line]
    assert len(blind) == 1 and "resolves no slowdown at all;" in blind[0] and "inf" not in blind[0], lines


def test_a_resolution_goal_names_each_check_short_of_it_and_what_would_bring_it_there() -> None:
    """``--lstmperf-resolution``: nothing is said at 1.5x (the promise); at a finer goal (1.10x, the default), the
    run says how many checks resolve it, and for each one short of it why: further processes the run did not take,
    a baseline of fewer than 8 processes (record more), one of 8 on a machine too noisy for the goal, or a goal
    below what any time per call resolves (1.062x). A check that fails none of these is not named."""
    from pytest_lstmperf.run_report import goal_lines
    from pytest_lstmperf.speed.policy import Check, Decision, GateResult

    def decision(
        name: str, resolves: float, best: float, runs: int, metric: str = "per-call", reach: float | None = None
    ) -> Decision:
        check = Check(metric, "unchanged", 1.0, max(resolves, 1.05), resolves, best=best, reach=reach or best)
        return Decision(name, "unchanged", (check,), runs=runs, processes=2)

    gate = GateResult(
        [
            decision("fine", 1.08, 1.07, 8),
            decision("stopped", 1.15, 1.09, 8),
            decision("few", 1.16, 1.11, 3, reach=1.095),
            decision("noisy", 1.3, 1.2, 8),
            decision("gpu", 1.04, 1.02, 3, metric="device"),
            decision("few-and-noisy", 1.45, 1.22, 7, reach=1.21),
        ]
    )
    assert goal_lines(gate, 1.5) == []
    lines = goal_lines(gate, 1.10)
    assert lines[0] == (
        "resolution goal 1.1x (--lstmperf-resolution): 2 of 6 compared check(s) resolve it, timed in 2 "
        "processes of this run (at most 8); 4 short of it:"
    )
    assert [line.split(":")[0].strip() for line in lines[1:]] == ["stopped", "few", "noisy", "few-and-noisy"]
    assert "the run stopped first" in lines[1]
    more = "1.110x against the 3 recorded, 1.095x against 8: record it in more (--lstmperf-record-processes=8"
    assert more in lines[2]
    assert "1.200x against the 8 recorded: its processes lie too far apart on this machine" in lines[3]
    # recorded in 7, and 8 recorded would not bring it there either: recording more is not the advice
    assert "1.220x against the 7 recorded, 1.210x against 8: its processes lie too far apart" in lines[4]
    floor = goal_lines(gate, 1.06)
    assert "fine: per-call resolves 1.080x: no compare resolves a time per call below 1.062x" in floor[1]
    assert not any(line.strip().startswith("gpu") for line in floor)  # its device figure resolves 1.04x
    # every check timed in one process (a GPU's compare): the count is said once, in the singular
    one = GateResult([dataclasses.replace(decision("gpu", 1.04, 1.02, 3, metric="device"), processes=1)])
    assert "resolve it, timed in 1 process of this run (at most 8)" in goal_lines(one, 1.10)[0]
    spread = GateResult(
        [decision("fine", 1.08, 1.07, 8), dataclasses.replace(decision("x", 1.08, 1.07, 8), processes=5)]
    )
    assert "resolve it, timed in 2-5 processes of this run (at most 8)" in goal_lines(spread, 1.10)[0]
