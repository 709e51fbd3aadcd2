"""The machine lock under pytest-xdist (:mod:`pytest_lstmperf.speed.machine_lock`): a benchmark's timing runs
alone. Each test plants the fault the lock exists for (work of another process overlapping a timing) and sees
the lock hold it back; processes stand in for xdist workers."""

from __future__ import annotations

import multiprocessing
import sys
import time
from pathlib import Path

import pytest

from pytest_lstmperf.speed.machine_lock import MachineLock

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="flock is POSIX (the lock is a no-op elsewhere)")


def _log(path: Path, text: str) -> None:
    with path.open("a") as handle:
        handle.write(f"{time.monotonic():.6f} {text}\n")


def _events(path: Path) -> dict[str, float]:
    return {line.split()[1]: float(line.split()[0]) for line in path.read_text().splitlines()}


def _test_then_work(folder: Path, log: Path, hold_s: float) -> None:
    """Another worker: a test (or a benchmark before its timing) holding ``machine`` shared for ``hold_s``."""
    lock = MachineLock("run", folder)
    with lock.shared():
        _log(log, "other-start")
        time.sleep(hold_s)
        _log(log, "other-end")


def _benchmark(folder: Path, log: Path, tag: str, before_s: float) -> None:
    """A benchmark test: shared while it prepares, exclusive while it times."""
    lock = MachineLock("run", folder)
    with lock.shared():
        time.sleep(before_s)
        _log(log, f"{tag}-prep-end")
        with lock.exclusive():
            _log(log, f"{tag}-time-start")
            time.sleep(0.2)
            _log(log, f"{tag}-time-end")
        time.sleep(0.05)


def _spawn(target, *args) -> multiprocessing.Process:  # type: ignore[no-untyped-def]
    proc = multiprocessing.get_context("fork").Process(target=target, args=args)
    proc.start()
    return proc


def test_a_timing_waits_for_a_running_test_and_a_new_test_waits_for_the_timing(tmp_path: Path) -> None:
    """Planted: another worker's test is running (0.4 s) when a benchmark wants to time, and a third test starts
    while it times. The timing starts after the running test ends; the third test starts after the timing."""
    log = tmp_path / "log"
    other = _spawn(_test_then_work, tmp_path, log, 0.4)
    time.sleep(0.1)
    bench = _spawn(_benchmark, tmp_path, log, "a", 0.0)
    time.sleep(0.45)  # the timing runs now (0.2 s from about 0.4 s)
    late = _spawn(_test_then_work, tmp_path, tmp_path / "late", 0.0)
    for proc in (other, bench, late):
        proc.join(10)
        assert proc.exitcode == 0
    seen = _events(log)
    assert seen["a-time-start"] >= seen["other-end"]
    assert _events(tmp_path / "late")["other-start"] >= seen["a-time-end"]


def test_a_benchmark_waits_for_another_benchmark_preparing(tmp_path: Path) -> None:
    """Planted: benchmark b builds its model (holding ``machine`` shared, 0.5 s) while benchmark a wants to time.
    a times only after b's preparation, and the two timings never overlap; neither waits forever for the other's
    shared hold."""
    log = tmp_path / "log"
    b = _spawn(_benchmark, tmp_path, log, "b", 0.5)
    time.sleep(0.1)
    a = _spawn(_benchmark, tmp_path, log, "a", 0.0)
    for proc in (a, b):
        proc.join(10)
        assert proc.exitcode == 0, "a benchmark did not finish: the locks deadlocked"
    seen = _events(log)
    assert seen["a-time-start"] >= seen["b-prep-end"]
    assert seen["a-time-start"] >= seen["b-time-end"] or seen["b-time-start"] >= seen["a-time-end"]


def test_without_the_lock_the_planted_overlap_is_seen(tmp_path: Path) -> None:
    """The checks above can fail: with each worker locking a folder of its own (no shared lock), the timing
    starts while the other test still runs (as a benchmark's timing did while another worker built its model,
    before benchmarks held the lock shared)."""
    log = tmp_path / "log"
    other = _spawn(_test_then_work, tmp_path / "x", log, 0.4)
    time.sleep(0.1)
    bench = _spawn(_benchmark, tmp_path / "y", log, "a", 0.0)
    for proc in (other, bench):
        proc.join(10)
    seen = _events(log)
    assert seen["a-time-start"] < seen["other-end"]


def test_every_test_a_benchmark_included_runs_under_the_shared_hold() -> None:
    """The hook holds ``machine`` shared around every test under pytest-xdist, a benchmark included (up to its
    timing, which converts the hold): a benchmark that built its model unlocked overlapped another worker's
    timing (the false alarms of 1.3-4x on the 2-core CPU under ``-n 2``)."""
    import contextlib
    from types import SimpleNamespace

    from pytest_lstmperf.hooks import bench

    held: list[str] = []

    class Lock:
        @contextlib.contextmanager
        def shared(self):  # type: ignore[no-untyped-def]
            held.append("shared")
            yield

    config = SimpleNamespace(stash={bench.MACHINE_LOCK_KEY: Lock()})
    for fixtures in ((bench.BENCH_FIXTURE,), ("tmp_path",)):
        item = SimpleNamespace(config=config, fixturenames=fixtures, get_closest_marker=lambda name: None)
        gen = bench.pytest_runtest_protocol(item, None)
        next(gen)
        with contextlib.suppress(StopIteration):
            gen.send(True)
    assert held == ["shared", "shared"]


def test_the_controller_removes_the_runs_lock_folder_once_its_workers_are_gone(tmp_path, monkeypatch) -> None:
    """Each pytest-xdist run made a lock folder in the temporary directory and left it there (one per run, for
    ever); the controller now removes it at its end, a worker never does (the others may still hold it)."""
    import tempfile
    import types

    from pytest_lstmperf.hooks import bench

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    lock = MachineLock("run-1")
    assert lock.folder == tmp_path / "pytest-lstmperf-run-1" and lock.folder.is_dir()
    lock.close()
    worker = types.SimpleNamespace(stash=pytest.Stash(), workerinput={"testrunuid": "run-1", "workerid": "gw0"})
    bench.pytest_unconfigure(worker)  # a worker ends: the folder stays
    assert lock.folder.is_dir()
    controller = types.SimpleNamespace(stash=pytest.Stash())
    bench.pytest_configure_node(types.SimpleNamespace(config=controller, workerinput={"testrunuid": "run-1"}))
    bench.pytest_unconfigure(controller)
    assert not lock.folder.exists()
