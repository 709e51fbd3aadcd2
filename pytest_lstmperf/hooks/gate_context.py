"""What the speed gate's hooks read from the run's config: the gate's state, the device and its hardware fields,
the baseline folder and store, whether the run records a baseline, whether this is an lstmperf run, whether
it runs under pytest-xdist (and this process is a worker), and the worker's machine lock."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from .. import options
from ..session import SESSION_KEY, run_device, run_session
from ..speed.baseline import BaselineStore
from ..speed.gate import GateState
from ..speed.provenance import record_command
from ..speed.runner import BENCH_MARKER

if TYPE_CHECKING:
    from ..device import DeviceInfo


BENCH_FIXTURE = "lstmperf_benchmark"


def gate_state(config: pytest.Config) -> GateState:
    """The speed gate's state, in the run's session; asking for it makes the gate part of this run (its end, its
    terminal section)."""
    session = run_session(config)
    session.gate_used = True
    return session.gate


def gate_used(config: pytest.Config) -> bool:
    """Whether the speed gate took part in this run (a benchmark, a compare, a recording)."""
    session = config.stash.get(SESSION_KEY, None)
    return session is not None and session.gate_used


def setting(config: pytest.Config, name: str) -> options.Resolved:
    return options.resolve(config, name)


def is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def xdist_active(config: pytest.Config) -> bool:
    return is_worker(config) or config.getoption("dist", "no") not in ("no", None)


def gate_device(config: pytest.Config) -> DeviceInfo:
    """The run's device: :func:`..session.run_device` (the session's, or before it exists, at configure time,
    resolved the same way and kept for the session)."""
    return run_device(config)


def hardware_fields(device: DeviceInfo) -> dict[str, str]:
    return device.hardware()


def baselines_dir(config: pytest.Config) -> Path:
    raw = setting(config, "lstmperf_baselines").value
    return Path(raw) if raw else Path(config.rootpath) / "baselines"


def baseline_store(config: pytest.Config) -> BaselineStore:
    return BaselineStore(baselines_dir(config), record_hint=record_command(config))


def sweeps(config: pytest.Config) -> bool:
    """Whether this process times its benchmarks' time per call again across the run as it ends
    (:mod:`..speed.sweep`): where the gate compares or records, in a recording's processes too."""
    return bool(setting(config, "lstmperf_sweep").value) and judges(config)


def judges(config: pytest.Config) -> bool:
    """Whether this run's figures are judged or kept: the gate compares (``--benchmark-compare``) or records a
    baseline, or this process is one of a recording's. Only such a run times with the machine to itself under
    pytest-xdist (:mod:`..speed.machine_lock`) and sweeps; a run that only prints its figures times beside the
    other workers' tests, and says so."""
    from .recording import process_folder

    return bool(
        config.getoption("benchmark_compare", None) or saving(config) is not None or process_folder() is not None
    )


def saving(config: pytest.Config) -> str | None:
    """How this run records the baseline: ``update``, ``save``, ``add-run``, or None (a recording process of
    another run's recording records nothing itself)."""
    from .recording import process_folder

    if process_folder() is not None:
        return None
    if setting(config, "lstmperf_update_baseline").value:
        return "update"
    if setting(config, "lstmperf_save_baseline").value:
        return "save"
    if setting(config, "lstmperf_add_baseline_run").value:
        return "add-run"
    return None


def saving_flag(config: pytest.Config) -> str:
    return {"update": "--lstmperf-update-baseline", "save": "--lstmperf-save-baseline"}.get(
        saving(config) or "", "--lstmperf-add-baseline-run"
    )


def explicit_lstmperf(config: pytest.Config) -> bool:
    """Whether a pytest-lstmperf setting was given (option, environment or ini): this is an lstmperf run."""
    for one in options.SETTINGS.values():
        if not options.is_added(config, one.name):
            continue
        given = config.getoption(one.name, default=None)
        if one.alias:  # ``--device``, where this plugin owns it (its destination is ours alone)
            given = given or config.getoption(one.alias_dest, default=None)
        if given or os.environ.get(one.env) or config.getini(one.ini):
            return True
    return False


def uses_lstmperf(config: pytest.Config) -> bool:
    """This run measures lstmperf benchmarks (records arrived, or the gate was pointed at a baseline)."""
    if not gate_used(config):
        return False
    state = gate_state(config)
    return bool(state.records or state.compare_requested or explicit_lstmperf(config))


def is_benchmark(item: pytest.Item) -> bool:
    return BENCH_FIXTURE in getattr(item, "fixturenames", ()) or item.get_closest_marker(BENCH_MARKER) is not None


def machine_lock(config: pytest.Config) -> Any:
    """This pytest-xdist worker's :class:`~..speed.machine_lock.MachineLock`, where the run times benchmarks."""
    session = config.stash.get(SESSION_KEY, None)
    return None if session is None else session.machine_lock
