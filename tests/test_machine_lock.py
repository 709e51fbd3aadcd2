"""The machine lock under pytest-xdist (:mod:`pytest_lstmperf.speed.machine_lock`): a benchmark's timing runs
alone. Each test plants the fault the lock exists for (work of another process overlapping a timing) and sees
the lock hold it back; processes stand in for xdist workers.

Nothing here waits a fixed time: the processes are moved from step to step by events, and where a step is "this
process now waits for the lock", the test reads that from the kernel's table of file locks (``/proc/locks``), so a
loaded machine can only make the tests slower, never change what they see. The order of what happened is the order
of the lines in a log the processes append to."""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_lstmperf.speed.machine_lock import MachineLock

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="flock is POSIX (the lock is a no-op elsewhere)")

PROC_LOCKS = Path("/proc/locks")
needs_lock_table = pytest.mark.skipif(
    not PROC_LOCKS.exists(), reason="which process waits for a lock is read from Linux's /proc/locks"
)
CTX = multiprocessing.get_context("fork")
WAIT_S = 30.0  # a bound on a step that should take milliseconds: reached only when the lock is broken


def _log(path: Path, text: str) -> None:
    with path.open("a") as handle:  # one short append: the lines' order is the order of the events
        handle.write(text + "\n")


def _order(path: Path) -> list[str]:
    return path.read_text().splitlines()


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"not seen within {WAIT_S} s: {what}"
        time.sleep(0.005)


def _locks(path: Path) -> list[tuple[int, str, bool]]:
    """The flocks on ``path`` from /proc/locks: (pid, READ or WRITE, waiting)."""
    info = os.stat(path)
    file_id = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    found = []
    for line in PROC_LOCKS.read_text().splitlines():
        fields = line.split()
        waiting = fields[1] == "->"
        fields = [f for f in fields if f != "->"]
        if fields[1] == "FLOCK" and fields[5] == file_id:
            found.append((int(fields[4]), fields[3], waiting))
    return found


def _holds(folder: Path, name: str, pid: int, mode: str) -> bool:
    return (pid, mode, False) in _locks(folder / "pytest-lstmperf-run" / f"{name}.lock")


def _waits(folder: Path, name: str, pid: int) -> bool:
    return any(p == pid and waiting for p, _, waiting in _locks(folder / "pytest-lstmperf-run" / f"{name}.lock"))


def _test(folder: Path, log: Path, tag: str, go: Callable[[], object] | None) -> None:
    """Another worker's test: holds ``machine`` shared from its start to ``go`` (an event's wait)."""
    lock = MachineLock("run", folder)
    with lock.shared():
        _log(log, f"{tag}-start")
        if go is not None:
            go()
        _log(log, f"{tag}-end")


def _benchmark(folder: Path, log: Path, tag: str, prepared: Callable[[], object] | None) -> None:
    """A benchmark test: shared while it prepares (up to ``prepared``), exclusive while it times."""
    lock = MachineLock("run", folder)
    with lock.shared():
        if prepared is not None:
            prepared()
        _log(log, f"{tag}-prep-end")
        with lock.exclusive():
            _log(log, f"{tag}-time-start")
            _log(log, f"{tag}-time-end")


def _spawn(target, *args) -> multiprocessing.Process:  # type: ignore[no-untyped-def]
    proc = CTX.Process(target=target, args=args)
    proc.start()
    return proc


def _join(*procs: multiprocessing.Process) -> None:
    for proc in procs:
        proc.join(WAIT_S)
        if proc.exitcode is None:
            proc.kill()
        assert proc.exitcode == 0, "a worker did not finish: the locks deadlocked"


@needs_lock_table
def test_a_timing_waits_for_a_running_test_and_a_new_test_waits_for_the_timing(tmp_path: Path) -> None:
    """Planted: another worker's test is running when a benchmark wants to time, and a third test starts while the
    benchmark waits. The timing starts after the running test ends; the third test starts after the timing."""
    log = tmp_path / "log"
    running, release = CTX.Event(), CTX.Event()
    other = _spawn(_test, tmp_path, log, "other", lambda: (running.set(), release.wait(WAIT_S)))
    _until(running.is_set, "the other test running")
    bench = _spawn(_benchmark, tmp_path, log, "a", None)
    # the benchmark has announced its timing (intent exclusive) and waits for the running test's shared hold
    _until(lambda: _holds(tmp_path, "intent", bench.pid, "WRITE"), "the benchmark holding intent")
    _until(lambda: _waits(tmp_path, "machine", bench.pid), "the benchmark waiting for the machine")
    late = _spawn(_test, tmp_path, log, "late", None)
    _until(lambda: _waits(tmp_path, "intent", late.pid), "the late test waiting")
    assert _order(log) == ["other-start", "a-prep-end"]  # neither the timing nor the late test has started
    release.set()
    _join(other, bench, late)
    seen = _order(log)
    assert seen.index("a-time-start") > seen.index("other-end")
    assert seen.index("late-start") > seen.index("a-time-end")


@needs_lock_table
def test_a_benchmark_waits_for_another_benchmark_preparing(tmp_path: Path) -> None:
    """Planted: benchmark b builds its model (holding ``machine`` shared) while benchmark a wants to time. a times
    only after b's preparation, and the two timings never overlap; neither waits forever for the other's shared
    hold."""
    log = tmp_path / "log"
    preparing, built = CTX.Event(), CTX.Event()
    b = _spawn(_benchmark, tmp_path, log, "b", lambda: (preparing.set(), built.wait(WAIT_S)))
    _until(preparing.is_set, "b preparing")
    a = _spawn(_benchmark, tmp_path, log, "a", None)
    _until(lambda: _waits(tmp_path, "machine", a.pid), "a waiting to time")
    assert "a-time-start" not in _order(log)
    built.set()
    _join(a, b)
    seen = _order(log)
    assert seen.index("a-time-start") > seen.index("b-prep-end")
    assert seen.index("a-time-start") > seen.index("b-time-end") or seen.index("b-time-start") > seen.index(
        "a-time-end"
    )


def test_without_the_lock_the_planted_overlap_is_seen(tmp_path: Path) -> None:
    """The checks above can fail: with each worker locking a folder of its own (no shared lock), the timing
    starts and ends while the other test still runs (as a benchmark's timing did while another worker built its
    model, before benchmarks held the lock shared)."""
    log = tmp_path / "log"
    running, release = CTX.Event(), CTX.Event()
    other = _spawn(_test, tmp_path / "x", log, "other", lambda: (running.set(), release.wait(WAIT_S)))
    _until(running.is_set, "the other test running")
    bench = _spawn(_benchmark, tmp_path / "y", log, "a", None)
    bench.join(WAIT_S)  # it does not wait for the other test
    release.set()
    _join(bench, other)
    seen = _order(log)
    assert seen.index("a-time-start") < seen.index("other-end")


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

    from pytest_lstmperf.session import SESSION_KEY

    config = SimpleNamespace(stash={SESSION_KEY: SimpleNamespace(machine_lock=Lock())})
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
    from pytest_lstmperf.session import SESSION_KEY, LstmPerfSession

    def config(**attributes: object) -> types.SimpleNamespace:
        made = types.SimpleNamespace(stash=pytest.Stash(), **attributes)
        made.stash[SESSION_KEY] = LstmPerfSession(made, {})  # type: ignore[arg-type]
        return made

    worker = config(workerinput={"testrunuid": "run-1", "workerid": "gw0"})
    bench.pytest_unconfigure(worker)  # a worker ends: the folder stays
    assert lock.folder.is_dir()
    controller = config()
    bench.pytest_configure_node(types.SimpleNamespace(config=controller, workerinput={"testrunuid": "run-1"}))
    bench.pytest_unconfigure(controller)
    assert not lock.folder.exists()
