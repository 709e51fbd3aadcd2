"""Pytest runs in subprocesses for fixtures that outlive one test (``pytester`` is per test), and the projects
they run: the speed gate's spin project, the suites on the CPU torch paths."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
from forked_pytest import run_forked

#: pytest-xdist's worker variables: a run started by a test would believe itself a worker with them (and
#: pytest-benchmark then disables itself and writes no JSON)
XDIST_ENV = ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID")
#: what an inner pytest run of these tests must not inherit from the run that started it: its options, its
#: planted fault, its device and paths, its xdist worker variables. The one list (:func:`clear_inner_env`,
#: :func:`gate_env` and the session runs read it)
CLEARED_ENV = (
    "PYTEST_ADDOPTS",
    "PYTEST_LSTMPERF_PLANT",
    "PYTEST_LSTMPERF_DEVICE",
    "PYTEST_LSTMPERF_PATHS",
    *XDIST_ENV,
)


#: the sweep of the inner runs (``--lstmperf-sweep``, seconds): short, since their benchmarks are timed on the
#: thread's CPU time (a spin path, planted faults on that clock); tests of the sweep itself name their own
INNER_SWEEP_S = "0.2"


def clear_inner_env(monkeypatch: pytest.MonkeyPatch, *, short_sweep: bool = False) -> None:
    """Clear :data:`CLEARED_ENV` for the inner runs of one test; ``short_sweep``: their sweep lasts
    :data:`INNER_SWEEP_S` (only for runs that are lstmperf runs anyway: the variable makes a run one)."""
    for name in CLEARED_ENV:
        monkeypatch.delenv(name, raising=False)
    if short_sweep:
        monkeypatch.setenv("PYTEST_LSTMPERF_SWEEP", INNER_SWEEP_S)


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


def run_pytest_in(
    root: Path, *args: str, env: dict[str, str], timeout: float = 300, fork: bool = True
) -> pytest.RunResult:
    """``pytester.runpytest_subprocess`` for a folder a session-scoped fixture owns (pytester is per test),
    forked from the fork server where it can be (:mod:`forked_pytest`) and ``fork`` allows."""
    basetemp = root / "basetemp"
    env = {
        **env,
        "HOME": str(root),
        "PY_COLORS": "0",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH", "")])),
    }
    forked = run_forked([f"--basetemp={basetemp}", *args], root, env, timeout) if fork else None
    if forked is not None:
        return forked
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", f"--basetemp={basetemp}", *args],
        cwd=root, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    lines = proc.stdout.splitlines(), proc.stderr.splitlines()
    return pytest.RunResult(proc.returncode, *lines, time.perf_counter() - start)


class SessionRun:
    """An inner pytest run that a test session needs once (the gate's recording, the clean suites run), started in
    the background as collection ends, so that the other tests run while it does (:func:`start_session_run`).

    Under pytest-xdist every worker of a run shares one: the first to start it runs it (its folder and result are
    in the run's temporary folder, above each worker's own), the others read its result. A session fixture is
    per worker: each worker recorded the gate's baseline, a full run with its recording processes, again. The
    run is a child process (``python tests/pytester_runs.py FOLDER``) that runs ``python -m pytest`` and writes
    the result as JSON, so no thread of the test session waits for it."""

    #: the session's runs by name, one object per worker
    runs: ClassVar[dict[str, SessionRun]] = {}

    @classmethod
    def of(cls, config: pytest.Config, factory: pytest.TempPathFactory, name: str) -> SessionRun:
        if name not in cls.runs:
            base = factory.getbasetemp()
            cls.runs[name] = cls(base.parent if hasattr(config, "workerinput") else base, name)
        return cls.runs[name]

    def __init__(self, shared: Path, name: str) -> None:
        self.root = shared / name
        self.result_file = shared / f"{name}.json"
        self.process: subprocess.Popen[bytes] | None = None
        self.timeout = 0.0

    def start(
        self, args: Sequence[str], env: Mapping[str, str], timeout: float, prepare: Callable[[Path], None]
    ) -> None:
        """Start the run, unless a worker of this test run started it already."""
        try:
            self.root.mkdir()  # the one atomic claim: whoever makes the folder runs it
        except FileExistsError:
            return
        prepare(self.root)
        self.timeout = timeout
        request = {"args": list(args), "env": dict(env), "timeout": timeout, "result": str(self.result_file)}
        (self.root / "request.json").write_text(json.dumps(request))
        with open(self.root / "runner.log", "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, __file__, str(self.root)],
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop() ends it and what it started
            )

    def result(self, timeout: float) -> pytest.RunResult:
        """The run's result, waiting for it; a run that no worker started or that died is a test error."""
        deadline = time.monotonic() + timeout
        while not self.result_file.exists():
            if not self.root.exists() or (self.process is not None and self.process.poll() is not None):
                if self.result_file.exists():
                    break
                log = self.root / "runner.log"
                why = log.read_text(errors="replace")[-2000:] if log.exists() else "it was never started"
                raise RuntimeError(f"the session's inner run {self.root.name} ended without a result: {why}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the session's inner run {self.root.name} took more than {timeout:.0f} s")
            time.sleep(0.2)
        data = json.loads(self.result_file.read_text())
        return pytest.RunResult(data["ret"], data["out"], data["err"], data["duration"])

    def stop(self, wait: bool) -> None:
        """At this worker's session end. A run it started is needed by a test that collection kept, maybe one that
        another worker runs and waits for (pytest-xdist ends a worker's session once it has no more tests to
        run): with ``wait`` it is waited for, up to its own time limit. Else (an interrupted session, or past
        that limit) it is not left behind."""
        if self.process is None or self.process.poll() is not None:
            return
        if wait:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(self.timeout + 60)
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)  # its process group: the pytest run and what it started
            self.process.wait(30)


def _run_request(root: Path) -> int:  # pragma: no cover - runs in the session run's own process
    """The session run's process: ``python -m pytest`` in ``root`` as :func:`run_pytest_in` runs it (a fresh
    subprocess, never the fork server, whose one pipe belongs to the test session), its result as JSON."""
    import traceback

    # behind the test session's own processes: the tests running meanwhile (a user's benchmark on the wall clock,
    # JAX's thread pool) keep the cores they had; the gate's recording times on the thread clock (preemption
    # adds nothing to it) and the clean suites judge no time
    if hasattr(os, "nice"):
        os.nice(10)
    request = json.loads((root / "request.json").read_text())
    start = time.perf_counter()
    try:
        result = run_pytest_in(root, *request["args"], env=request["env"], timeout=request["timeout"], fork=False)
        out = {"ret": int(result.ret), "out": result.outlines, "err": result.errlines, "duration": result.duration}
    except Exception:  # a timeout included: the tests that need the run fail on this, naming it
        lines = [f"the session run in {root} raised:", *traceback.format_exc().splitlines()]
        out = {"ret": int(pytest.ExitCode.INTERNAL_ERROR), "out": [], "err": lines,
               "duration": time.perf_counter() - start}  # fmt: skip
    target = Path(request["result"])
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(out))
    os.replace(tmp, target)
    return 0


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
    env["PYTEST_LSTMPERF_SWEEP"] = INNER_SWEEP_S
    return env


if __name__ == "__main__":
    sys.exit(_run_request(Path(sys.argv[1])))
