"""The speed gate's decision: each benchmark record against its baseline entry, and the run's state.

:func:`decide_record` compares one record on up to three checks (device time where both sides have it, the
per-call time against the baseline's noise band, the host counters) and keeps the most severe outcome;
:func:`run_gate` decides every record of a run and marks the baseline entries it did not measure. The rules
themselves (rank test, thresholds, noise band) live in :mod:`.regression`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from .. import options

if TYPE_CHECKING:
    from ..device import DeviceInfo
    from .baseline import Baseline, SaveReport
    from .regression import Decision, GateResult
    from .timing import ClockSampler


@dataclass
class GateState:
    compare: str | None = None  # "device" (no argument), "file" (an lstmperf baseline named), None
    compare_requested: bool = False
    baseline: Baseline | None = None
    records: list[dict[str, Any]] = field(default_factory=list)
    save_report: SaveReport | None = None
    gate: GateResult | None = None
    messages: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    sampler: ClockSampler | None = None
    report_path: Path | None = None
    device: DeviceInfo | None = None
    deferred_compare: object = None  # --benchmark-compare's value, until collection shows lstmperf benchmarks
    outcome: list[str] = field(default_factory=list)  # the gate's last lines, printed after every other summary
    knobs: GateKnobs | None = None  # the gate's settings against the baseline, once a measurement needed them
    #: per-call slowdowns the re-measurement confirmed, looked at a third time once every test has run
    late_looks: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class GateKnobs:
    """The settings one gate run decides with."""

    metric: str
    ratio: float
    pvalue: float
    probe: bool
    explicit_ratio: bool = False  # the threshold was given (option, env, ini): device time uses it as it is
    pooled_spread: float | None = None  # the median per-call noise band of the baseline's entries
    pooled_from: int = 0


def gate_knobs(config: pytest.Config, baseline: Baseline) -> GateKnobs:
    """The gate's settings for this run against ``baseline`` (whose entries' noise bands are pooled)."""
    from .regression import pooled_spread

    pooled, pooled_from = pooled_spread(baseline.entries.values())
    threshold = options.resolve(config, "lstmperf_threshold")
    return GateKnobs(
        metric=options.resolve(config, "lstmperf_metric").value,
        ratio=threshold.value,
        pvalue=options.resolve(config, "lstmperf_pvalue").value,
        probe=options.resolve(config, "lstmperf_drift").value == "probe",
        explicit_ratio=threshold.source != "default",
        pooled_spread=pooled,
        pooled_from=pooled_from,
    )


def run_gate(
    baseline: Baseline, records: list[dict[str, Any]], knobs: GateKnobs, unavailable: dict[str, str]
) -> GateResult:
    """Every record against the baseline; baseline entries this run did not measure are not-run, or path-lost
    where their path is ``unavailable`` now (path name -> why)."""
    from .regression import Decision, GateResult

    entries = baseline.entries
    decisions = [decide_record(record, entries.get(record["fullname"]), knobs) for record in records]
    seen = {record["fullname"] for record in records}
    for name, entry in entries.items():
        if name in seen:
            continue
        path = entry.get("extra_info", {}).get("path")
        if path in unavailable:
            decisions.append(Decision(name, "path-lost", notes=(f"{path} is unavailable now: {unavailable[path]}",)))
        else:
            decisions.append(Decision(name, "not-run"))
    return GateResult(decisions)


def _kernel_text(extra: dict[str, Any]) -> str:
    return f"{extra.get('kernel', '')}/{extra.get('precision', '')}" if extra.get("kernel") else ""


def decide_record(record: dict[str, Any], entry: dict[str, Any] | None, knobs: GateKnobs) -> Decision:
    """One benchmark: device time (where both sides have it), per-call time against the baseline's noise
    band, and the host counters; the most severe outcome is the verdict (``regression.combine``)."""
    from dataclasses import replace

    from .regression import Decision, Thresholds, centred_baseline, combine, drift_ratio, events_host_bound

    name, extra = record["fullname"], record["extra_info"]
    kernels = {"kernel_now": _kernel_text(extra)}
    if entry is None:
        return Decision(name, "new", n_now=len(record["data"]), **kernels)
    bextra = entry.get("extra_info", {})
    kernels["kernel_then"] = _kernel_text(bextra)
    if record.get("failed") == "kernel":
        return Decision(name, "kernel-changed", notes=("kernel differs from the path's claim; not timed",), **kernels)
    now_data, now_device, remeasured, unconfirmed = _current_samples(record)
    if not now_data:
        why = "not timed in this run (--benchmark-disable, or the test stopped before timing): nothing compared"
        return Decision(name, "inconclusive", notes=(why,), **kernels)
    limits = Thresholds(
        ratio=record.get("thresholds", {}).get("ratio", knobs.ratio),
        pvalue=record.get("thresholds", {}).get("pvalue", knobs.pvalue),
    )
    parts = []
    same_method = bextra.get("device_time_method") == extra.get("device_time_method")
    has_device = _graph_samples(bextra) and bool(now_device) and same_method
    per_call_limit, per_call_notes = per_call_threshold(entry, limits.ratio, knobs)
    if knobs.metric == "device" or (knobs.metric == "auto" and has_device):
        explicit = knobs.explicit_ratio or "ratio" in record.get("thresholds", {})
        host_bound = has_device and (events_host_bound(bextra) or events_host_bound(extra))
        compared = now_device if has_device else []
        device_part = _device_decision(name, bextra, compared, limits, kernels, explicit, host_bound, per_call_limit)
        if unconfirmed and device_part.failed:  # the first figures alone never fail the build
            why = "its device re-measurement could not be compared with the baseline: not confirmed, not cleared"
            device_part = replace(device_part, verdict="inconclusive", notes=(*device_part.notes, why))
        parts.append(device_part)
    if knobs.metric in ("auto", "per-call"):
        parts.append(
            _per_call_decision(name, entry, extra, now_data, replace(limits, ratio=per_call_limit), knobs, kernels)
        )
        parts[-1] = replace(parts[-1], notes=(*parts[-1].notes, *per_call_notes))
    host, host_check = _host_decision(name, bextra, extra)
    checks = [host_check]
    then, now = bextra.get("device_time_method"), extra.get("device_time_method")
    if knobs.metric == "auto" and not has_device and (_graph_samples(bextra) or _graph_samples(extra)):
        # say so: a device check that did not happen is not a pass
        why = f"no device time of one method on both sides: baseline {then}, now {now}"
        checks.insert(0, f"device: not compared ({why})")
    elif knobs.metric == "auto" and now == "none":
        # a GPU benchmark with no device time now, nor in the baseline (work that torch's streams do not see,
        # such as a user's TensorFlow call): as loud as one whose device time failed this time
        reason = str(extra.get("device_time_note", "")).split(" (")[0].split(";")[0]
        why = f"no device time in the baseline ({then}) nor now: {reason}"
        checks.insert(0, f"device: not compared ({why})")
    decision = combine([*parts, *host], checks)
    notes = decision.notes
    if remeasured is not None:
        metrics = _remeasured_metrics(remeasured)
        failed = any(part.failed for part in parts if part.metric in metrics)
        notes = (*notes, _remeasure_note(failed, remeasured, unconfirmed))
    centre = centred_baseline(entry["stats"]["data"], bextra.get("noise_band"), "per-call")[0]
    return replace(decision, per_call_ratio=drift_ratio(centre, now_data), notes=notes)


def _graph_samples(extra: dict[str, Any]) -> bool:
    """Device-time samples the gate can compare: CUDA-graph replays, or batched CUDA events where capture
    fails (``regression.DEVICE_METHODS``)."""
    from .regression import DEVICE_METHODS

    return extra.get("device_time_method") in DEVICE_METHODS and len(extra.get("device_samples") or []) > 0


def _current_samples(record: dict[str, Any]) -> tuple[list[float], list[float], dict[str, Any] | None, bool]:
    """(per-call samples, device samples, the re-measurement, device unconfirmed): a metric the measurement
    re-measured is decided on its re-measured samples, a metric it did not re-measure (it was inside its
    threshold) on the first ones. A device re-measurement that gave no samples, or samples of another method
    than the first (a capture that failed the second time), neither confirms nor clears the first device
    samples: they are kept, flagged unconfirmed, and a failure on them is inconclusive, never a regression."""
    extra = record["extra_info"]
    device = list(extra.get("device_samples") or []) if _graph_samples(extra) else []
    data = [float(x) for x in record["data"]]
    again = extra.get("remeasured")
    if not isinstance(again, dict):
        return data, device, None, False
    metrics = _remeasured_metrics(again)
    if not metrics:
        return data, device, None, False
    if "per-call" in metrics and again.get("late_data"):  # the third look, at the end of the run, decides
        data = [float(x) for x in again["late_data"]]
    elif "per-call" in metrics and again.get("data"):
        data = [float(x) for x in again["data"]]
    unconfirmed = False
    if "device" in metrics and device:
        samples = list(again.get("device_samples") or [])
        first = extra.get("device_time_method")
        if samples and again.get("device_time_method", first) == first:
            device = samples
        else:
            unconfirmed = True
    return data, device, again, unconfirmed


def _remeasured_data(extra: dict[str, Any]) -> bool:
    """Whether the per-call samples decided are the re-measured ones (the first rounds' throttle flags then do
    not apply to them)."""
    again = extra.get("remeasured")
    return isinstance(again, dict) and "per-call" in _remeasured_metrics(again) and bool(again.get("data"))


def _remeasured_metrics(again: dict[str, Any]) -> tuple[str, ...]:
    """Which metrics a re-measurement took again; records written before it was kept re-measured both."""
    listed = again.get("remeasured")
    if isinstance(listed, (list, tuple)):
        return tuple(str(m) for m in listed)
    return tuple(m for m, key in (("per-call", "data"), ("device", "device_samples")) if again.get(key))


def _remeasure_note(failed: bool, again: dict[str, Any], unconfirmed: bool = False) -> str:
    """``failed``: whether a re-measured metric's own check failed (not the decision as a whole: a host-counter
    change beside a device suspect that was noise is not a confirmation)."""
    first = again.get("first_ratio")
    first_text = f" ({first:.3f}x)" if isinstance(first, (int, float)) else ""
    if unconfirmed:
        method = again.get("device_time_method") or "none"
        return (
            f"not confirmed by re-measurement: the device re-measurement of the first measurement{first_text} could "
            f"not be compared with the baseline (device time by {method} the second time, no samples of the first "
            "method)"
        )
    late = again.get("late_ratio")
    if isinstance(late, (int, float)):
        second = again.get("second_ratio")
        second_text = f" ({second:.3f}x)" if isinstance(second, (int, float)) else ""
        looks = f"the first measurement{first_text} and the re-measurement{second_text}"
        if failed:
            return f"confirmed three times: {looks} failed, and a third look at the end of the run ({late:.3f}x)"
        return (
            f"not confirmed by a third look: {looks} failed, a third look at the end of the run read "
            f"{late:.3f}x (a slow phase of the host, not of the code)"
        )
    if failed:
        void = again.get("late_void")
        no_third = f"; third look void: {void}" if void else ""
        return (
            f"confirmed by re-measurement: the first measurement{first_text} and the re-measurement both fail{no_third}"
        )
    return f"not confirmed by re-measurement: the first measurement{first_text} was noise"


def _device_decision(
    name: str,
    bextra: dict[str, Any],
    now_device: list[float],
    limits: Any,
    kernels: dict[str, str],
    explicit: bool = False,
    host_bound: bool = False,
    per_call: float | None = None,
) -> Decision:
    """Device time against the threshold; with the default threshold and a baseline recorded from several
    runs, against ``regression.device_threshold`` (tighter where the device time was steady between runs,
    wider where it was not).
    ``per_call`` (the per-call threshold) is the least an event-timed device time is held to, and ``host_bound``
    says that its events measured the host's launch rate (``regression.events_host_bound``): :func:`device_limit`."""
    from dataclasses import replace

    from .regression import centred_baseline, compare_samples

    base, centred = centred_baseline(
        bextra.get("device_samples") or [] if now_device else [],
        bextra.get("noise_band"),
        "device",
        bextra.get("device_time_method"),
    )
    ratio, notes = device_limit(bextra, limits.ratio, explicit, host_bound, per_call)
    blunted = notes[0] if notes and ratio > limits.ratio and now_device else ""
    limits = replace(limits, ratio=ratio)
    decision = compare_samples(name, base, now_device, limits, **kernels)
    if not now_device:
        notes = (*notes, "no device time of one method on both sides")
    notes = (*notes, centred) if centred else notes
    return replace(decision, metric="device", notes=(*decision.notes, *notes), device_blunted=blunted)


def device_limit(
    bextra: dict[str, Any],
    ratio: float,
    explicit: bool = False,
    host_bound: bool = False,
    per_call: float | None = None,
) -> tuple[float, tuple[str, ...]]:
    """The device-time threshold of one baseline entry, and the notes that explain it: ``ratio`` as given
    when it was set explicitly; else ``regression.device_threshold`` of the entry's recorded noise band, and
    for a device time from CUDA events ``max(that, per_call)``, the per-call threshold: events around a call
    also time the gaps in which the GPU waits for the host's launches, so a slower or busier host moves them
    (a clean H100 run failed a reduce-overhead inference at 1.17x against its band's 1.074, its re-measured
    events holding stalls of 2-3.5x the median while its per-call time read 1.33x against a threshold of
    1.88). One rule for every event timing: an entry whose events are ``host_bound`` (at least
    ``regression.HOST_BOUND_EVENTS`` of the time per call) is held to the same limit, and only its note
    says so. An event timing's own recorded band is never tightened (a reduce-overhead GRU inference, band
    2.60 and per-call threshold 2.13, read 1.98x on a clean run of a slow host when it was held to the
    per-call one). A pipelined device time (``timing.pipelined_device_time``: Keras on JAX) is the device's
    own where the host queued its calls in a small share of it, and is held to its band; where it is
    host-bound (``regression.events_host_bound``), it is held as CUDA events are. The runner's re-measurement
    and the gate use this one rule."""
    from .regression import HOST_BOUND_EVENTS, device_threshold, own_device_median
    from .timing import PIPELINED_DEVICE_BOUND

    if explicit:
        return ratio, ()
    method, own = bextra.get("device_time_method"), own_device_median(bextra)
    limit, why = device_threshold(ratio, bextra.get("noise_band"), method=method, own=own)
    host_timed = method == "cuda-events" or (method == "pipelined" and host_bound)
    if host_timed and per_call is not None and per_call > limit:
        if method == "pipelined":
            cause = (
                f"pipelined device time is host-bound here (queueing the calls took at least "
                f"{PIPELINED_DEVICE_BOUND:.0%} of it: the GPU waited for launches), so it is held to"
            )
        elif host_bound:
            cause = (
                f"device time from CUDA events is host-bound here (at least {HOST_BOUND_EVENTS:.0%} of the time "
                "per call: the GPU waited for launches), so it is held to"
            )
        else:
            cause = "device time from CUDA events also times the host's launch gaps, so it is held no tighter than"
        return per_call, (
            f"{cause} the per-call threshold {per_call:.3f} (its recorded device band alone: {limit:.3f}); a "
            "device-side slowdown smaller than that is not resolved on this benchmark",
        )
    return limit, ((why,) if why else ())


def _per_call_decision(
    name: str,
    entry: dict[str, Any],
    extra: dict[str, Any],
    now_data: list[float],
    limits: Any,
    knobs: GateKnobs,
    kernels: dict[str, str],
) -> Decision:
    """Per-call time (host overhead included) against max(threshold, 1 + k x the baseline's noise band)."""
    from dataclasses import replace

    from .regression import centred_baseline, compare_samples, drift_ratio

    bextra = entry.get("extra_info", {})
    base_data, centred = centred_baseline(entry["stats"]["data"], bextra.get("noise_band"), "per-call")
    notes: list[str] = [centred] if centred else []
    timers = (bextra.get("timer", "time.perf_counter"), extra.get("timer", "time.perf_counter"))
    if timers[0] != timers[1]:
        base_data, now_data, notes = [], [], []  # not comparable: inconclusive (a kernel change still counts)
        notes.append(f"timed with {timers[1]}, the baseline with {timers[0]}")
    threshold = limits.ratio
    drift = None
    if knobs.probe:
        drift = drift_ratio(bextra.get("drift_probe") or [], extra.get("drift_probe") or [])
        if drift is None:
            notes.append(
                "no drift correction: the baseline has no drift-probe samples (record with --lstmperf-drift=probe)"
            )
    decision = compare_samples(
        name,
        base_data,
        now_data,
        replace(limits, ratio=threshold),
        base_throttled=bextra.get("throttled"),
        now_throttled=None if _remeasured_data(extra) else extra.get("throttled"),
        drift=drift,
        device_s=extra.get("device_time_s") if drift else None,
        **kernels,
    )
    return replace(decision, metric="per-call", notes=(*decision.notes, *notes))


def per_call_ratio(
    entry: dict[str, Any], extra: dict[str, Any], now_data: list[float], knobs: GateKnobs
) -> float | None:
    """The per-call ratio the gate decides on (``_per_call_decision``): against the centre of the recording
    runs, throttled rounds left out on both sides (the current side's flags unless ``extra`` says its samples
    were re-measured), the host part divided by the run's drift where the drift probe runs. The runner's
    trigger for a re-measurement takes this figure, so the gate never fails a first measurement the runner
    did not look at again."""
    from .regression import Thresholds

    return _per_call_decision("", entry, extra, list(now_data), Thresholds(), knobs, {}).ratio


def per_call_threshold(entry: dict[str, Any], ratio: float, knobs: GateKnobs) -> tuple[float, tuple[str, ...]]:
    """max(threshold, 1 + k x this entry's noise band, 1 + k x the band pooled over the baseline's entries)."""
    from .regression import NOISE_K, noise_threshold, per_call_spread

    spread, source = per_call_spread(entry.get("extra_info", {}), entry["stats"]["data"])
    threshold = noise_threshold(ratio, spread)
    note = f"{NOISE_K:g} x the baseline's noise band ({spread or 0:.1%} spread of the per-call medians of {source})"
    pooled = noise_threshold(ratio, knobs.pooled_spread)
    if pooled > threshold:
        threshold = pooled
        note = (
            f"{NOISE_K:g} x the noise band pooled over the baseline's {knobs.pooled_from} entries recorded from "
            f"several runs (median spread {knobs.pooled_spread:.1%}; this entry's own: {spread or 0:.1%})"
        )
    if threshold <= ratio:
        return ratio, ()
    return threshold, (f"per-call threshold {threshold:.3f}: {note}",)


def _host_decision(name: str, bextra: dict[str, Any], extra: dict[str, Any]) -> tuple[list[Decision], str]:
    """The host counters (ATen ops, GPU kernels, syncs, bytes allocated per call) then and now."""
    from .regression import Decision, alloc_tolerance, host_counter_changes, unstable_counters

    then, now = bextra.get("host_counters"), extra.get("host_counters")
    if not then or not now:
        missing = "the baseline has" if not then else "this run has"
        return [], f"host: not compared ({missing} no host counters; record the baseline again to gate them)"
    # a counter that moved between the baseline's own recording runs is left out; the others are compared
    unstable = unstable_counters(then, bextra.get("noise_band"))
    skipped = "; ".join(f"{k} {v}" for k, v in sorted(unstable.items()))
    compared = {k: v for k, v in then.items() if k not in unstable}
    if not set(compared) & set(now):
        return [], f"host: not compared (the counters differed between the baseline's recording runs: {skipped})"
    aside = f"; not compared, as they differed between the baseline's recording runs: {skipped}" if skipped else ""
    alloc_rel = alloc_tolerance(bextra.get("noise_band"))
    changes = host_counter_changes(compared, now, alloc_rel)
    if changes:
        note = "host work per call changed: " + "; ".join(changes)
        return [Decision(name, "host-work-changed", metric="host", notes=(note + aside,))], f"host: {note}{aside}"
    counted = ", ".join(f"{k} {now[k]}" for k in sorted(now) if k in compared)
    return [], f"host: unchanged ({counted}){aside}"
