"""The state of one test run: resolved settings, the device, the selected paths, the tally and findings, the
speed gate's state.

One :class:`LstmPerfSession` per pytest config, kept in ``config.stash`` under one key (:func:`run_session`); the
plugin's hooks and fixtures only read and record through it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pytest

from . import options
from . import paths as registry
from .device import DeviceError, resolve_device
from .model.profiles import PROFILES, Profile
from .observation.claims import Finding
from .speed.gate import GateState

if TYPE_CHECKING:
    from .device import DeviceInfo
    from .paths import ExecutionPath
    from .run_report import RunReport
    from .speed.machine_info import MachineInfo
    from .speed.machine_lock import MachineLock
    from .workloads.rows import WorkloadRow


@dataclass(eq=False)  # registered as a plugin: must stay hashable
class RunTally:
    """Outcomes, kernels seen and findings per path, gathered from test reports (so it works under xdist,
    where the reports of the workers reach the controller)."""

    outcomes: dict[str, dict[str, int]] = field(default_factory=dict)
    observed: dict[str, set[str]] = field(default_factory=dict)
    skip_reasons: dict[str, str] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.record(report)

    def record(self, report: pytest.TestReport) -> None:
        props = dict(report.user_properties)
        path = props.get("lstmperf_path")
        if path is None:
            return
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            counts = self.outcomes.setdefault(str(path), {"passed": 0, "failed": 0, "skipped": 0})
            outcome = "xfailed" if hasattr(report, "wasxfail") else report.outcome
            counts[outcome] = counts.get(outcome, 0) + 1
            if outcome == "skipped" and isinstance(report.longrepr, tuple):
                self.skip_reasons[str(path)] = str(report.longrepr[2]).removeprefix("Skipped: ")
        for key, value in report.user_properties:
            if key == "lstmperf_observed":
                self.observed.setdefault(str(path), set()).add(str(value))
            elif (
                key == "lstmperf_finding"
                and report.when == "call"
                and Finding(**json.loads(str(value))) not in self.findings
            ):
                self.findings.append(Finding(**json.loads(str(value))))

    def summary_lines(self) -> list[str]:
        if not self.outcomes:
            return []
        lines = ["", "lstmperf: per path (passed/failed/skipped; kernels observed)"]
        width = max(len(path) for path in self.outcomes)  # a pair of paths runs past any fixed width
        for path in sorted(self.outcomes):
            c = self.outcomes[path]
            seen = "; ".join(sorted(self.observed.get(path, ()))) or "-"
            counts = f"{c.get('passed', 0):3d}/{c.get('failed', 0):3d}/{c.get('skipped', 0):3d}"
            line = f"  {path.ljust(width)} {counts}  {seen}"
            if c.get("xfailed"):
                line += f"  ({c['xfailed']} xfailed: known finding)"
            if path in self.skip_reasons and not c.get("passed") and not c.get("failed"):
                line += f"  (skipped: {self.skip_reasons[path]})"
            lines.append(line)
        if self.findings:
            groups: dict[tuple[str, str], list[Finding]] = {}
            for f in self.findings:
                groups.setdefault((f.path, f.check), []).append(f)
            lines += [
                "",
                f"lstmperf FINDINGS: {len(groups)} (a path disagreed with what it claims; "
                "'known' ones are documented upstream behaviour whose numbers were checked, reported as xfail; "
                "'known-not-observed' ones are documented but were not seen in this run)",
            ]
            for (path, check), found in groups.items():
                first = found[0]
                shapes = f" (and {len(found) - 1} more shapes)" if len(found) > 1 else ""
                lines.append(f"  {path} [{check}] {first.spec}{shapes}: {first.message.splitlines()[0][:300]}")
        return lines

    def wall_time_line(self) -> str:
        """The run's wall time, printed after every other summary (pytest-benchmark's tables included) but the
        speed gate's section, whose verdict stays last."""
        seconds = time.perf_counter() - self.started
        return f"lstmperf: wall time {seconds:.1f}s, start-up included (pytest's own time below starts after it)"


class LstmPerfSession:
    """The run: its resolved settings, its device (resolved once, on first use), the selected paths (from
    :meth:`start`), the tally of outcomes and findings, the speed gate's state, the workload suite's rows and the
    run's machine probe and lock. One per pytest config, made at configure time without resolving anything that
    imports a framework (:func:`run_session`); the hooks, fixtures and the gate read and record through it."""

    def __init__(
        self,
        config: pytest.Config,
        settings: dict[str, options.Resolved] | None = None,
        device: DeviceInfo | None = None,
        selected: list[ExecutionPath] | None = None,
        unavailable: dict[str, str] | None = None,
        awaiting_worker: set[str] | None = None,
    ) -> None:
        self.config = config
        if settings is None:
            settings = {n: resolve_setting(config, n) for n in options.SETTINGS if options.is_added(config, n)}
        self.settings = settings
        self._device = device
        #: the paths selected for this device (by :meth:`start`, or given)
        self.selected: list[ExecutionPath] = list(selected) if selected is not None else []
        self._started = selected is not None
        self.unavailable: dict[str, str] = dict(unavailable or {})
        #: GPU Keras paths whose worker was started and has not said hello yet: their availability is asked on
        #: first use (:meth:`unavailable_reason`), and their tests run after the others of their file
        #: (``plugin.pytest_collection_modifyitems``), so that the workers' imports (6 s for Keras on torch on
        #: the H100) run beside those tests instead of before the first one
        self.awaiting_worker: set[str] = set(awaiting_worker or ())
        #: paths whose availability is asked on first use rather than at the start: the awaiting workers' paths,
        #: and those whose check costs seconds of imports a run that never uses them should not pay
        #: (``options["asked_on_first_use"]``: torch.compile's, which imports Dynamo, 2.7 s on a 2-core VM)
        self.asked_later: set[str] = set(self.awaiting_worker)
        self.deselected_other_device = 0
        self.tally = RunTally()
        self.gate = GateState()
        #: whether the speed gate took part in this run (a benchmark, a compare, a recording)
        self.gate_used = False
        self.workload_rows: list[WorkloadRow] = []
        #: pytest-benchmark's machine info, computed in a thread (:class:`~.speed.machine_info.MachineInfo`)
        self.machine_probe: MachineInfo | None = None
        #: whether the run's figures are judged or kept (:func:`.hooks.gate_context.judges`), read at configure
        #: time (a pytest-xdist worker's ``--benchmark-compare`` is cleared then: the controller compares)
        self.judges = False
        #: a pytest-xdist worker's machine lock, where it times benchmarks for a run that judges
        self.machine_lock: MachineLock | None = None
        #: pytest-xdist's controller: the run's id, whose lock folder it removes at the end
        self.xdist_run: str | None = None
        #: the run's report, built once at its end (:func:`.run_report.build_report`)
        self.report: RunReport | None = None

    # ------------------------------------------------------------------------------------ the device
    @property
    def device(self) -> DeviceInfo:
        """The run's device: the setting (resolved with the others, in ``settings``) turned into a DeviceInfo by
        device.py's one resolver on first use, and kept; a GPU asked for and not usable is a usage error."""
        if self._device is None:
            dev = self.settings["lstmperf_device"]
            threads = self.settings["lstmperf_threads"].value if "lstmperf_threads" in self.settings else None
            try:
                self._device = resolve_device(dev.value, dev.source, threads)
            except DeviceError as exc:
                raise pytest.UsageError(str(exc)) from None
        return self._device

    @device.setter
    def device(self, value: DeviceInfo) -> None:
        """A device given instead of the setting's (a test of a path on a device of its own)."""
        self._device = value

    # ------------------------------------------------------------------------------------ the paths
    @property
    def started(self) -> bool:
        return self._started

    def start(self) -> LstmPerfSession:
        """Resolve the device and select the paths (once): the GPU Keras paths' workers are started side by side,
        not waited for; every other selected path is asked whether it runs here."""
        if self._started:
            return self
        names = self.settings["lstmperf_paths"].value
        selected = registry.for_device(self.device.kind, names)
        if names is not None and not selected:
            raise pytest.UsageError(
                f"{self.settings['lstmperf_paths'].where()}: none of these paths runs on {self.device.name} (paths "
                f"for {self.device.kind}: {', '.join(p.name for p in registry.for_device(self.device.kind))})"
            )
        # importing these at the top would register the Keras paths before the built-in ones (and load numpy and
        # the pool's exit hook at pytest's start-up)
        from .paths.keras.paths import prestart_workers
        from .paths.keras.pool import resolve_xla_cache, set_xla_cache

        set_xla_cache(resolve_xla_cache(self.settings["lstmperf_xla_cache"].value))
        self.awaiting_worker = {p.name for p in prestart_workers(selected)}
        self.asked_later = self.awaiting_worker | {p.name for p in selected if p.options.get("asked_on_first_use")}
        for path in selected:
            reason = None if path.name in self.asked_later else path.available(self.device)
            if reason:
                self.unavailable[path.name] = reason
        self.selected, self._started = selected, True
        return self

    @property
    def profile(self) -> str:
        return str(self.settings["lstmperf_profile"].value)

    @property
    def seed(self) -> int:
        return int(self.settings["lstmperf_seed"].value)

    def unavailable_reason(self, path: ExecutionPath) -> str | None:
        """Why ``path`` cannot run on this device, or None; for a path asked on first use (one awaiting its
        worker waits for the worker's hello), asked now and kept."""
        if path.name in self.asked_later:
            self.asked_later.discard(path.name)
            self.awaiting_worker.discard(path.name)
            reason = path.available(self.device)
            if reason:
                self.unavailable[path.name] = reason
        return self.unavailable.get(path.name)

    def resolve_unavailable(self) -> dict[str, str]:
        """Every selected path that cannot run here, with the reason: the paths asked on first use and not used
        yet are asked now (at the end of a run the workers have long said hello)."""
        for path in [p for p in self.selected if p.name in self.asked_later]:
            self.unavailable_reason(path)
        return self.unavailable

    @property
    def available_paths(self) -> list[ExecutionPath]:
        return [p for p in self.selected if p.name not in self.unavailable]

    @property
    def hypothesis_profile(self) -> Profile:
        return PROFILES[self.profile]

    def header_lines(self) -> list[str]:
        run = [p.name for p in self.available_paths]
        jax = any("keras" in p.options and p.options["keras"].backend == "jax" for p in self.available_paths)
        lines = [
            f"lstmperf: device {self.device.describe()} [{self.settings['lstmperf_device'].where()}]",
            f"lstmperf: paths {', '.join(run) or 'none'}; hypothesis profile {self.profile} "
            f"({self.hypothesis_profile.description}); seed {self.seed}",
        ]
        if self.device.kind == "cpu" and "lstmperf_threads" in self.settings:
            threads = self.settings["lstmperf_threads"]
            # the Keras-on-JAX worker runs JAX's CPU calls on the calling thread (server.one_thread_dispatch)
            lines.append(
                f"lstmperf: CPU threads fixed at {threads.value} for every framework [{threads.where()}] "
                "(--lstmperf-threads; part of a CPU baseline's key)"
                + ("; Keras on JAX runs each CPU call inline, without a dispatch thread of its own" if jax else "")
            )
        for name, reason in self.unavailable.items():
            lines.append(f"lstmperf: path {name} unavailable: {reason}")
        if self.awaiting_worker:
            waiting = [p for p in self.selected if p.name in self.awaiting_worker]
            backends = sorted({str(p.options["keras"].backend) for p in waiting})
            lines.append(
                f"lstmperf: Keras workers ({', '.join(backends)}) starting beside the first tests: their paths' tests "
                "run last in each file, and a path whose worker cannot start is skipped with the reason"
            )
        if jax:
            from .paths.keras.pool import xla_cache_description  # numpy, an exit hook: not at pytest's start-up

            where = self.settings["lstmperf_xla_cache"].where()
            lines.append(
                f"lstmperf: XLA compilation cache of the Keras-on-JAX worker: {xla_cache_description()} [{where}]"
            )
        if self.settings["lstmperf_paths"].value is None:
            extended = [p for p in registry.all_paths().values() if p.extended and p.device == self.device.kind]
            if extended:
                lines.append(
                    f"lstmperf: {len(extended)} extended path(s) not selected: "
                    + "; ".join(f"{p.name} ({p.extended})" for p in extended)
                    + " (--lstmperf-paths=all, or naming them, runs them)"
                )
        recompiles = recompiled_torch_line()
        if recompiles:
            lines.append(recompiles)
        if self.deselected_other_device:
            lines.append(
                f"lstmperf: {self.deselected_other_device} tests of paths for another device deselected "
                f"(device is {self.device.name}; pass --device to change)"
            )
        return lines


SESSION_KEY = pytest.StashKey[LstmPerfSession]()

#: a module of torch's that a run imports (torch.compile's), whose bytecode says whether torch has any
TORCH_PROBE_MODULE = os.path.join("_dynamo", "utils.py")


def recompiled_torch_line(dont_write: bool | None = None, torch_dir: str | None = None) -> str | None:
    """A header line where every process of the run compiles torch's modules from source: Python may not write
    bytecode (``PYTHONDONTWRITEBYTECODE``, ``-B``) and torch has none to read (installed with ``--no-compile``, as
    the README's install does, so that Python writes it on first import). On an H200 machine that was 9 s of the
    default command's main process (docs/gate-evidence.md). It costs time, not accuracy: nothing is timed while
    modules import. None where bytecode is written or found, or torch is not installed."""
    dont_write = sys.dont_write_bytecode if dont_write is None else dont_write
    if not dont_write:
        return None
    if torch_dir is None:
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.origin is None:
            return None
        torch_dir = os.path.dirname(spec.origin)
    probe = os.path.join(torch_dir, TORCH_PROBE_MODULE)
    if not os.path.exists(probe) or os.path.exists(importlib.util.cache_from_source(probe)):
        return None
    return (
        "lstmperf: Python writes no bytecode here (PYTHONDONTWRITEBYTECODE or -B) and torch has none: every process "
        "of the run compiles torch's modules anew (9 s of a run's main process on an H200 machine); unset it, or "
        "set PYTHONPYCACHEPREFIX to a writable folder kept between runs"
    )


def resolve_setting(config: pytest.Config, name: str) -> options.Resolved:
    """One setting, as :func:`options.resolve` gives it, and ``lstmperf_paths`` checked against the registry of
    paths (which lies above the options): the names it selects (None: the default selection; ``all``: every
    registered path); an unknown name is a usage error, as any bad value is."""
    if name == "lstmperf_paths":
        return options.resolve(config, name, then=registry.selection)
    return options.resolve(config, name)


# ------------------------------------------------------------------------------------------ the device
def requested_device(config: pytest.Config) -> str:
    """The run's device setting as given (``auto``, ``cpu``, ``cuda``, ``cuda:N``), nothing resolved; a malformed
    one is a usage error (the session resolves it with the other settings, once)."""
    return str(run_session(config).settings["lstmperf_device"].value)


def run_device(config: pytest.Config) -> DeviceInfo:
    """The run's device (:attr:`LstmPerfSession.device`: resolved once, on first use); a GPU that was asked for
    and is not usable is a usage error."""
    return run_session(config).device


def device_kind(config: pytest.Config | None) -> str:
    """``cpu`` or ``cuda``: the kind the run's device setting names, resolving nothing and importing no framework
    (``auto``: a GPU when torch, already imported, sees one; no setting: ``auto``)."""
    value = "auto"
    if config is not None:
        with contextlib.suppress(ValueError, KeyError):
            value = requested_device(config)
    if value.startswith("cuda"):
        return "cuda"
    if value == "cpu":
        return "cpu"
    torch = sys.modules.get("torch")
    return "cuda" if torch is not None and torch.cuda.is_available() else "cpu"


class PropertyCollector:
    """Hands the values of one ``user_properties`` key of call-phase reports to ``sink``. Reports from
    pytest-xdist workers arrive here too, so results measured in workers reach the controller."""

    def __init__(self, key: str, sink: Callable[[object], None]) -> None:
        self.key = key
        self.sink = sink

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        for name, value in getattr(report, "user_properties", ()):
            if name == self.key:
                self.sink(value)


def run_session(config: pytest.Config) -> LstmPerfSession:
    """The run's one session object, made on first use (nothing resolved: no framework imported)."""
    if SESSION_KEY not in config.stash:
        config.stash[SESSION_KEY] = LstmPerfSession(config)
    return config.stash[SESSION_KEY]


def ensure_session(config: pytest.Config) -> LstmPerfSession:
    """The run's session, started (device resolved, paths selected) on first use."""
    return run_session(config).start()


def started_session(config: pytest.Config) -> LstmPerfSession | None:
    """The run's session where its paths were selected (an lstmperf run), else None."""
    session = config.stash.get(SESSION_KEY, None)
    return session if session is not None and session.started else None


def get_session(config: pytest.Config) -> LstmPerfSession:
    session = started_session(config)
    if session is None:
        raise RuntimeError("pytest-lstmperf is not active in this run (was it disabled with -p no:lstmperf?)")
    return session
