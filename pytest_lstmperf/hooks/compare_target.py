"""Where ``--benchmark-compare`` points: with no argument, this hardware's baseline file; with a name, an
lstmperf baseline file (refused when it is of other hardware), else pytest-benchmark's own run of that name.
The gate compares against what it points at (``GateState.compare``, ``GateState.baseline``); pytest-benchmark
loads the same file for its comparison table. Its ``--benchmark-compare-fail`` is refused there: the gate is the
one rule that judges an lstmperf baseline."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..speed.baseline_file import BaselineError, differences, load
from ..speed.benchmark_adapter import reload_compare, set_compare, storage_has_run
from ..speed.provenance import record_command
from ..speed.verdict import refuse_compare_fail
from .gate_context import baseline_store, baselines_dir, gate_device, gate_state, hardware_fields, saving, setting


def take_over_compare(config: pytest.Config) -> None:
    """The ``--benchmark-compare`` left to pytest-benchmark at configure time becomes the gate's: pointed here,
    and reloaded by pytest-benchmark where it points at an lstmperf baseline."""
    state = gate_state(config)
    compare, state.deferred_compare = state.deferred_compare, None
    point_compare(config, compare)
    if state.compare is not None:
        reload_compare(config)


def point_compare(config: pytest.Config, compare: object) -> None:
    """Point ``--benchmark-compare`` (``True``: given with no argument) at the baseline the gate compares with;
    a usage error where there is none, or it is of other hardware."""
    state = gate_state(config)
    state.compare_requested = True
    recording = saving(config) is not None
    if compare is True:
        fields = hardware_fields(gate_device(config))
        store = baseline_store(config)
        try:
            baseline = store.find(fields)
        except BaselineError as exc:
            raise pytest.UsageError(f"--benchmark-compare: {exc}") from None
        if baseline is None:
            if recording:
                state.messages.append(f"{store.missing_message(fields)} This run records it; nothing to compare.")
                set_compare(config, [])
                return
            raise pytest.UsageError(f"--benchmark-compare: {store.missing_message(fields)}")
        state.compare, state.baseline = "device", baseline
        _refuse_compare_fail(config)
        set_compare(config, str(baseline.path.resolve()))
        return
    candidate = Path(str(compare))
    if not candidate.is_file():
        folder = baselines_dir(config)
        in_baselines = [folder / str(compare), folder / f"{compare}.json"]
        found = next((p for p in in_baselines if p.is_file()), None)
        if found is None:
            if storage_has_run(config, str(compare)):
                return  # pytest-benchmark's own run number or id: its comparison, not the gate's
            raise pytest.UsageError(
                f"--benchmark-compare={compare}: matches nothing: no file {candidate.resolve()}, no "
                f"{in_baselines[0].name} or {in_baselines[1].name} in {folder}, and no "
                f"pytest-benchmark run *{compare}*.json in --benchmark-storage. Valid: an existing baseline file, a "
                f"pytest-benchmark run number or id, or no value (this hardware's baseline in "
                f"{folder})"
            )
        candidate = found
    try:
        baseline = load(candidate, record_command(config))
    except BaselineError as exc:
        if "without pytest-lstmperf's device key" in str(exc):
            return  # a plain pytest-benchmark file: pytest-benchmark compares, the gate does not
        raise pytest.UsageError(f"--benchmark-compare={compare}: {exc}") from None
    diff = differences(baseline.fields, hardware_fields(gate_device(config)))
    if diff:
        raise pytest.UsageError(
            f"--benchmark-compare={compare}: refusing to compare against a baseline of other hardware: "
            f"{'; '.join(diff)}. Timings of different hardware are not comparable; compare against this "
            f"hardware's baseline (--benchmark-compare with no argument) or record one with: "
            f"{record_command(config)}"
        )
    state.compare, state.baseline = "file", baseline
    _refuse_compare_fail(config)
    set_compare(config, str(baseline.path.resolve()))


def _refuse_compare_fail(config: pytest.Config) -> None:
    """One rule decides against an lstmperf baseline: the gate's (:func:`..speed.verdict.refuse_compare_fail`)."""
    why = refuse_compare_fail(
        config.getoption("benchmark_compare_fail", None), setting(config, "lstmperf_threshold").value
    )
    if why:
        raise pytest.UsageError(why)
