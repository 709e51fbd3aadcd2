"""Pytest runs in subprocesses for fixtures that outlive one test (``pytester`` is per test), and the projects
they run: the speed gate's spin project, the suites on the CPU torch paths."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from forked_pytest import run_forked

#: pytest-xdist's worker variables: a run started by a test would believe itself a worker with them (and
#: pytest-benchmark then disables itself and writes no JSON)
XDIST_ENV = ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID")
#: what an inner pytest run of these tests must not inherit from the run that started it: its options, its
#: planted fault, its device and paths, its xdist worker variables. The one list (the ``inner_env`` fixture,
#: :func:`gate_env` and the session fixtures read it)
CLEARED_ENV = (
    "PYTEST_ADDOPTS",
    "PYTEST_LSTMPERF_PLANT",
    "PYTEST_LSTMPERF_DEVICE",
    "PYTEST_LSTMPERF_PATHS",
    *XDIST_ENV,
)


def clear_inner_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Clear :data:`CLEARED_ENV` for the inner runs of one test."""
    for name in CLEARED_ENV:
        monkeypatch.delenv(name, raising=False)


@dataclass(frozen=True)
class GateRecording:
    """The recording run's result and the baseline files it wrote (name -> text)."""

    result: pytest.RunResult
    files: dict[str, str]

    def install(self, root: Path, keep: Callable[[dict], bool] | None = None) -> Path:
        """Write the recorded baseline into ``root/baselines``; ``keep`` selects benchmarks, as a ``-k`` given
        to the recording run would have. Returns the baseline file's path."""
        folder = root / "baselines"
        folder.mkdir(exist_ok=True)
        assert len(self.files) == 1, (
            f"the shared recording run wrote {len(self.files)} baseline files, not 1 "
            f"(exit {self.result.ret}):\n{self.result.stdout.str()}\n{self.result.stderr.str()}"
        )
        ((name, text),) = self.files.items()
        if keep is not None:
            data = json.loads(text)
            data["benchmarks"] = [b for b in data["benchmarks"] if keep(b)]
            assert data["benchmarks"], "the selection keeps no recorded benchmark"
            text = json.dumps(data, indent=4)
        (folder / name).write_text(text)
        return folder / name


def run_pytest_in(root: Path, *args: str, env: dict[str, str], timeout: float = 300) -> pytest.RunResult:
    """``pytester.runpytest_subprocess`` for a folder a session-scoped fixture owns (pytester is per test),
    forked from the fork server where it can be (:mod:`forked_pytest`)."""
    basetemp = root / "basetemp"
    env = {
        **env,
        "HOME": str(root),
        "PY_COLORS": "0",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH", "")])),
    }
    forked = run_forked([f"--basetemp={basetemp}", *args], root, env, timeout)
    if forked is not None:
        return forked
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", f"--basetemp={basetemp}", *args],
        cwd=root, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    lines = proc.stdout.splitlines(), proc.stderr.splitlines()
    return pytest.RunResult(proc.returncode, *lines, time.perf_counter() - start)


def run_once(request: pytest.FixtureRequest, factory: pytest.TempPathFactory, name: str,
             run: Callable[[Path], pytest.RunResult]) -> tuple[Path, pytest.RunResult]:  # fmt: skip
    """``run(root)`` once per test run, in a folder ``name``: under pytest-xdist the first worker to ask runs it and
    the others read its result (a session fixture is per worker: each recorded the gate's baseline, a full run
    with its recording processes, again). Returns the folder and the result."""
    if not hasattr(request.config, "workerinput"):
        root = factory.mktemp(name, numbered=False)
        return root, run(root)
    from filelock import FileLock

    shared = factory.getbasetemp().parent  # the run's temporary folder, above each worker's own
    root, saved = shared / name, shared / f"{name}.json"
    with FileLock(str(shared / f"{name}.lock")):
        if not saved.exists():
            root.mkdir()
            result = run(root)
            lines = {"ret": int(result.ret), "out": result.outlines, "err": result.errlines}
            saved.write_text(json.dumps({**lines, "duration": result.duration}))
        data = json.loads(saved.read_text())
    return root, pytest.RunResult(data["ret"], data["out"], data["err"], data["duration"])


REPO = Path(__file__).resolve().parents[1]
CPU_TORCH_PATHS = "torch-cpu-onednn,torch-cpu-native,torch-cpu-autocast-bf16,torch-cpu-native-autocast-bf16"


def suites_args(paths: str) -> list[str]:
    """The kernel and equivalence suites on the CPU, on ``paths``."""
    suites = [str(REPO / "suites" / name) for name in ("test_kernels.py", "test_equivalence.py")]
    return ["-p", "no:cacheprovider", *suites, "--device=cpu", f"--lstmperf-paths={paths}"]


def write_gate_project(root: Path) -> None:
    """The real benchmark suite with the spin path registered (the gate fixture's project)."""
    from test_bench_plugin import SPIN_MODULE, SUITE

    (root / "spinpath.py").write_text(SPIN_MODULE)
    (root / "conftest.py").write_text("import spinpath  # noqa: F401 - registers the spin path\n")
    (root / "test_benchmarks.py").write_text(SUITE.read_text())


def gate_env() -> dict[str, str]:
    """The environment of the gate fixture's runs."""
    env = {k: v for k, v in os.environ.items() if k not in CLEARED_ENV}
    env["PYTEST_LSTMPERF_PLANT_CLOCK"] = "thread"
    return env
