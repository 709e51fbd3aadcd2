"""Under pytest-xdist, a benchmark times with the machine to itself: every other worker waits.

Workers share the machine's cores: a benchmark timed while another worker runs a test (or builds its own
benchmark's model) measures that work as much as its own call (on 2 cores, two workers running torch with 2
threads each made one call read 3 ms to 290 ms). So the workers of one run share two ``flock`` locks in a folder
named by xdist's ``testrunuid``:

* every test, a benchmark included, holds ``machine`` shared while it runs (setup, call, teardown), after
  passing ``intent`` (taken shared and released at once);
* a benchmark's timing (its rounds, device time and host counts) lets its shared hold go, takes ``intent`` and
  then ``machine`` exclusively: no test starts, the tests already running end (a test's set-up, call and
  teardown, or a benchmark up to its timing), it times alone, and takes its shared hold back.

One process decides as several do, by construction. Outside pytest-xdist nothing is locked, nor in a run that
compares and records nothing (its figures are only printed, with a note that other tests ran beside them): a
benchmark waiting for the lock idles its worker until the other worker's test ends, which in the project's own
test command on a 2-core VM cost 136 s of 1,056 s.
POSIX only (a no-op where ``fcntl`` is missing).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]


class MachineLock:
    """The two locks of one pytest-xdist run (``run_id``: xdist's ``testrunuid``)."""

    def __init__(self, run_id: str, folder: Path | None = None) -> None:
        self.folder = self.folder_of(run_id, folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._fds = {name: os.open(self.folder / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
                     for name in ("intent", "machine")}  # fmt: skip
        self._shared = 0  # how deep this process holds ``machine`` shared

    def _lock(self, name: str, mode: int) -> None:
        if fcntl is not None:
            fcntl.flock(self._fds[name], mode)

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        """A test that is not a benchmark: it waits while a benchmark times, and runs beside other tests."""
        if fcntl is None:
            yield
            return
        self._lock("intent", fcntl.LOCK_SH)
        self._lock("intent", fcntl.LOCK_UN)
        self._lock("machine", fcntl.LOCK_SH)
        self._shared += 1
        try:
            yield
        finally:
            self._shared -= 1
            if not self._shared:
                self._lock("machine", fcntl.LOCK_UN)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """A benchmark's timing: no other test of the run runs meanwhile. A shared hold of this process is let go
        first (two benchmarks waiting for each other's shared hold would wait forever) and taken back after."""
        if fcntl is None:
            yield
            return
        if self._shared:
            self._lock("machine", fcntl.LOCK_UN)
        self._lock("intent", fcntl.LOCK_EX)
        try:
            self._lock("machine", fcntl.LOCK_EX)
            try:
                yield
            finally:
                self._lock("machine", fcntl.LOCK_SH if self._shared else fcntl.LOCK_UN)
        finally:
            self._lock("intent", fcntl.LOCK_UN)

    @staticmethod
    def folder_of(run_id: str, folder: Path | None = None) -> Path:
        return (folder or Path(tempfile.gettempdir())) / f"pytest-lstmperf-{run_id}"

    @classmethod
    def remove(cls, run_id: str, folder: Path | None = None) -> None:
        """Remove the run's lock folder: by pytest-xdist's controller, once every worker has ended."""
        shutil.rmtree(cls.folder_of(run_id, folder), ignore_errors=True)

    def close(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = {}
