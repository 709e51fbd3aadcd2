"""pytest-benchmark's machine info, computed once in a thread of its own.

Its CPU probe (py-cpuinfo, a subprocess) took 1.2 s of the default GPU command on the H100 runner, where
pytest-benchmark loads the baseline it compares against, before the first test, and another 1.4 s where it saves
JSON at the end. Started when an lstmperf run configures, it runs beside the device's set-up (the torch import
and CUDA's start), and both uses get a copy of the one result.
"""

from __future__ import annotations

from typing import Any

from .benchmark_adapter import default_machine_info


class MachineInfo:
    """pytest-benchmark's own machine info (its default ``pytest_benchmark_generate_machine_info``), computed in
    a thread started by :meth:`start`; :meth:`result` waits for it."""

    def __init__(self) -> None:
        import threading

        self.info: dict[str, Any] | None = None
        self.failed = False
        self.thread = threading.Thread(target=self._run, name="lstmperf-machine-info", daemon=True)

    @classmethod
    def start(cls) -> MachineInfo:
        probe = cls()
        probe.thread.start()
        return probe

    def _run(self) -> None:
        try:
            self.info = default_machine_info()
        except Exception:  # pytest-benchmark computes it itself then, with its own errors
            self.failed = True

    def result(self) -> dict[str, Any] | None:
        """A copy of the machine info (pytest-benchmark's update hooks add to it), or None where it failed."""
        import copy

        self.thread.join()
        return None if self.failed or self.info is None else copy.deepcopy(self.info)
