"""The regression decision: is a benchmark meaningfully slower than its baseline?

asv's rule, on raw samples: a change counts only when it is both *large* (the ratio of medians is past a
minimum effect, default 1.10) and *real* (a one-sided Mann-Whitney U test on the two sets of samples gives
p below a level, default 0.002). The rank test needs no normality and shrugs off a few outliers; the
effect size keeps a tiny but significant drift (which many samples always find) from failing a build.
When either side has too few samples for the test to ever reach the level, the ratio alone decides and
the decision says so.

A kernel change (the baseline ran cuDNN, now the generic kernel) is a regression whatever the timings say.

Samples flagged as taken while the GPU was throttled are dropped from both sides before testing.
Optionally the current samples are corrected for *drift*: the now/baseline ratio of a reference measured in
the same run (the plugin's drift probe, a fixed host-bound workload timed between the rounds of every
benchmark; see ``timing.DriftProbe``), so that a host that is uniformly slower today does not look like a
regression. Only the host part of a sample is divided by the drift: with the benchmark's device time ``d``
(CUDA-graph replay, 0 on the CPU), a sample ``x`` becomes ``d + max(x - d, 0) / drift``; the rank test and
the ratio are then taken on the corrected samples.

Everything here is a pure function of numbers; nothing reads files or pytest state.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..observation.claims import same_kernel

#: verdicts that fail the session
FAILING = ("regressed", "kernel-changed", "host-work-changed", "path-lost")
#: verdicts that say the benchmark was compared (a run with none of them compared nothing)
COMPARED = ("regressed", "kernel-changed", "host-work-changed", "improved", "unchanged")
VERDICTS = (
    "regressed",  # slower past the minimum effect and significant
    "kernel-changed",  # observed kernel family or precision differs from the baseline's
    "host-work-changed",  # ATen ops, GPU kernels or synchronisations per call (or allocated bytes) changed
    "path-lost",  # the baseline measured this path, this run could not (unavailable now)
    "improved",  # faster past the minimum effect and significant
    "unchanged",  # neither
    "inconclusive",  # too few usable samples (throttling, a failed benchmark, not timed)
    "new",  # measured now, absent from the baseline
    "not-run",  # in the baseline, not measured in this run (deselected)
)


@dataclass(frozen=True)
class Thresholds:
    """How large and how certain a slowdown must be to count."""

    ratio: float = 1.10  # minimum effect: median(now) / median(baseline)
    pvalue: float = 0.002  # one-sided Mann-Whitney U level
    min_samples: int = 3  # fewer usable samples on a side: inconclusive

    def __post_init__(self) -> None:
        if not self.ratio > 1.0:
            raise ValueError(f"threshold ratio must be > 1.0, got {self.ratio!r}")
        if not 0.0 < self.pvalue < 1.0:
            raise ValueError(f"p-value level must be in (0, 1), got {self.pvalue!r}")
        if self.min_samples < 1:
            raise ValueError(f"min_samples must be >= 1, got {self.min_samples!r}")


@dataclass(frozen=True)
class Decision:
    """The verdict on one benchmark, with the numbers behind it."""

    name: str
    verdict: str
    ratio: float | None = None  # median(now) / median(baseline), now drift-corrected when drift is given

    pvalue: float | None = None  # one-sided, in the direction of the change
    base_median: float | None = None
    now_median: float | None = None
    n_base: int = 0
    n_now: int = 0
    kernel_then: str = ""
    kernel_now: str = ""
    threshold: float | None = None
    drift: float | None = None
    notes: tuple[str, ...] = ()
    metric: str = "per-call"  # which samples decided: "device" (CUDA-graph replay) or "per-call"
    per_call_ratio: float | None = None  # median(now) / median(baseline) of the per-call times, for the table
    checks: tuple[str, ...] = ()  # one line per metric that was decided on (device, per-call, host counters)
    #: why this benchmark's device threshold lies above the configured one (recorded noise between baseline
    #: runs, or event timing that follows the host): the device slowdowns it does not resolve; "" where none
    device_blunted: str = ""

    @property
    def failed(self) -> bool:
        return self.verdict in FAILING

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "verdict": self.verdict,
            "ratio": self.ratio,
            "pvalue": self.pvalue,
            "base_median": self.base_median,
            "now_median": self.now_median,
            "n_base": self.n_base,
            "n_now": self.n_now,
            "kernel_then": self.kernel_then,
            "kernel_now": self.kernel_now,
            "threshold": self.threshold,
            "drift": self.drift,
            "notes": list(self.notes),
            "metric": self.metric,
            "per_call_ratio": self.per_call_ratio,
            "checks": list(self.checks),
            "device_blunted": self.device_blunted,
        }


def min_attainable_pvalue(n: int, m: int) -> float:
    """The smallest one-sided exact Mann-Whitney p-value two samples of sizes n and m can give."""
    if n < 1 or m < 1:
        return 1.0
    return 1.0 / math.comb(n + m, n)


def mannwhitney_greater(now: Sequence[float], base: Sequence[float]) -> float:
    """One-sided p-value that ``now`` is stochastically greater than ``base`` (slower)."""
    from scipy.stats import mannwhitneyu

    if len(set(now)) == 1 and set(now) == set(base):
        return 1.0  # all equal: scipy warns and returns nan on some versions
    method = "exact" if len(now) <= 50 and len(base) <= 50 and not _has_ties(now, base) else "asymptotic"
    result = mannwhitneyu(now, base, alternative="greater", method=method)
    p = float(result.pvalue)
    return 1.0 if math.isnan(p) else p


def _has_ties(a: Sequence[float], b: Sequence[float]) -> bool:
    joined = list(a) + list(b)
    return len(set(joined)) != len(joined)


def _usable(samples: Sequence[float], throttled: Sequence[bool] | None) -> list[float]:
    values = [float(s) for s in samples if s is not None and math.isfinite(float(s)) and float(s) > 0]
    if throttled is None or len(throttled) != len(samples):
        return values
    return [float(s) for s, bad in zip(samples, throttled, strict=True) if not bad and s is not None and float(s) > 0]


def compare_samples(
    name: str,
    base: Sequence[float],
    now: Sequence[float],
    thresholds: Thresholds = Thresholds(),
    *,
    base_throttled: Sequence[bool] | None = None,
    now_throttled: Sequence[bool] | None = None,
    drift: float | None = None,
    device_s: float | None = None,
    kernel_then: str = "",
    kernel_now: str = "",
) -> Decision:
    """Decide on one benchmark from its raw per-call times (seconds) then and now.

    ``kernel_then``/``kernel_now`` are ``"family/precision"`` strings; when both are given and differ the
    verdict is ``kernel-changed`` whatever the timings. ``drift`` divides the host part of every current
    sample, the part above ``device_s`` (see module docstring).
    """
    notes: list[str] = []
    b = _usable(base, base_throttled)
    n = _usable(now, now_throttled)
    dropped = (len(base) - len(b), len(now) - len(n))
    if any(dropped):
        notes.append(f"dropped {dropped[0]} baseline and {dropped[1]} current samples (throttled or invalid)")
    common = dict(
        name=name,
        n_base=len(b),
        n_now=len(n),
        kernel_then=kernel_then,
        kernel_now=kernel_now,
        threshold=thresholds.ratio,
        drift=drift,
    )
    base_median = statistics.median(b) if b else None
    now_median = statistics.median(n) if n else None  # as measured, for the table
    if drift and n:
        n = correct_for_drift(n, drift, device_s)
        where = f"host part (above device time {format_seconds(device_s)})" if device_s else "time"
        notes.append(f"{where} divided by drift {drift:.3f} of the same-run probe")
    ratio = statistics.median(n) / base_median if base_median and n else None

    def decided(verdict: str, pvalue: float | None = None) -> Decision:
        return Decision(
            verdict=verdict,
            ratio=ratio,
            pvalue=pvalue,
            base_median=base_median,
            now_median=now_median,
            notes=tuple(notes),
            **common,
        )  # type: ignore[arg-type]

    if kernel_then and kernel_now and not same_kernel(kernel_then, kernel_now):
        notes.append(f"kernel changed: {kernel_then} -> {kernel_now}")
        return decided("kernel-changed")
    if len(b) < thresholds.min_samples or len(n) < thresholds.min_samples or ratio is None:
        notes.append(f"too few usable samples ({len(b)} baseline, {len(n)} now; need {thresholds.min_samples} each)")
        return decided("inconclusive")
    testable = min_attainable_pvalue(len(b), len(n)) < thresholds.pvalue
    if ratio >= 1.0:
        p = mannwhitney_greater(n, b)
        big = ratio >= thresholds.ratio
        verdict = "regressed" if big and (p < thresholds.pvalue or not testable) else "unchanged"
    else:
        p = mannwhitney_greater(b, n)
        big = 1.0 / ratio >= thresholds.ratio
        verdict = "improved" if big and (p < thresholds.pvalue or not testable) else "unchanged"
    if big and not testable:
        notes.append(f"{len(b)}+{len(n)} samples cannot reach p<{thresholds.pvalue:g}; decided on the ratio alone")
    return decided(verdict, p)


METRICS = ("auto", "device", "per-call")
#: device-time methods whose samples the gate compares (with the same method on both sides)
DEVICE_METHODS = ("cuda-graph", "cuda-events", "cupti", "pipelined")


def pick_samples(
    metric: str, base_extra: dict, now_extra: dict, base_data: Sequence[float], now_data: Sequence[float]
) -> tuple[str, Sequence[float], Sequence[float], str]:
    """Which samples the decision compares: ``(metric used, baseline samples, current samples, note)``.

    ``device``: the device-time samples (``extra_info.device_samples``) of both sides, taken by the same
    method: CUDA-graph replays (``cuda-graph``), or, where capture fails (the Keras training step), batches
    of back-to-back calls between CUDA events (``cuda-events``), or, for work on streams torch cannot see
    (Keras on JAX), the GPU activities CUPTI records per call (``cupti``), or, where nothing records them,
    batches of calls queued back to back and timed until their last result (``pipelined``);
    the kernels' own cost, steady within a few
    percent between runs where the per-call time (mostly host time for small RNN calls) moves by tens of
    percent. ``per-call``: the timed rounds, host overhead included. ``auto``: device where both sides have
    device samples of one method, else per-call.
    """
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r} (valid: {', '.join(METRICS)})")
    methods = {extra.get("device_time_method") for extra in (base_extra, now_extra)}
    graphs = (
        len(methods) == 1
        and methods <= set(DEVICE_METHODS)
        and all(len(extra.get("device_samples") or []) > 0 for extra in (base_extra, now_extra))
    )
    if metric == "per-call":
        return "per-call", base_data, now_data, ""
    if graphs:
        return "device", base_extra["device_samples"], now_extra["device_samples"], ""
    why = "no device time of one method on both sides" + (
        f" (baseline {base_extra.get('device_time_method')}, now {now_extra.get('device_time_method')})"
    )
    if metric == "device":
        return "device", [], [], why
    return "per-call", base_data, now_data, f"decided on per-call time: {why}"


def correct_for_drift(samples: Sequence[float], drift: float, device_s: float | None = None) -> list[float]:
    """Express ``samples`` at the baseline's host speed: ``d + max(x - d, 0) / drift`` (``d`` = device time)."""
    if not drift or drift <= 0 or not math.isfinite(drift):
        raise ValueError(f"drift must be a positive finite ratio, got {drift!r}")
    d = device_s if device_s and device_s > 0 else 0.0
    return [d + max(x - d, 0.0) / drift for x in samples]


def drift_ratio(base: Sequence[float], now: Sequence[float]) -> float | None:
    """median(now)/median(base) of a reference benchmark: how much slower the machine is today."""
    b = [x for x in base if x and x > 0]
    n = [x for x in now if x and x > 0]
    if not b or not n:
        return None
    return statistics.median(n) / statistics.median(b)


# ------------------------------------------------------------------------------------- host counters
#: host counters compared exactly: per call, counted in one untimed call after warm-up
EXACT_COUNTERS = ("aten_ops", "kernels", "syncs")
ALLOC_TOLERANCE = (0.05, 4096)  # relative, absolute (bytes): allocator rounding moves a few KiB


def host_counter_changes(
    then: Mapping[str, Any] | None, now: Mapping[str, Any] | None, alloc_rel: float | None = None
) -> list[str]:
    """What moved between the baseline's host counters and this run's: ATen ops, GPU kernels launched and
    host-device synchronisations per call exactly, bytes allocated per call within +-5% or 4 KiB (or the
    wider relative tolerance ``alloc_rel``: :func:`alloc_tolerance`).

    A counter absent on either side (an old baseline, ``kernels``/``syncs`` on the CPU) is not compared.
    """
    return list(_counter_moves(then, now, alloc_rel).values())


def _counter_moves(
    then: Mapping[str, Any] | None, now: Mapping[str, Any] | None, alloc_rel: float | None = None
) -> dict[str, str]:
    if not then or not now:
        return {}
    changes = {}
    for name in EXACT_COUNTERS:
        if name in then and name in now and int(then[name]) != int(now[name]):
            changes[name] = f"{name} per call {int(then[name])} -> {int(now[name])}"
    a, b = then.get("alloc_bytes"), now.get("alloc_bytes")
    if a is not None and b is not None:
        rel, absolute = ALLOC_TOLERANCE
        rel = max(rel, alloc_rel or 0.0)
        if abs(int(b) - int(a)) > max(rel * abs(int(a)), absolute):
            changes["alloc_bytes"] = (
                f"alloc_bytes per call {int(a)} -> {int(b)} (tolerance +-{rel:.0%} or {absolute} B)"
            )
    return changes


def _runs_counters(band: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    return [r["host_counters"] for r in (band or {}).get("recording_runs") or [] if r.get("host_counters")]


def alloc_tolerance(band: Mapping[str, Any] | None) -> float:
    """The relative tolerance on bytes allocated per call: 5%, or ``NOISE_K`` x their spread between the
    baseline's recording runs (:func:`relative_spread`, as for the time bands) where that is wider. The caching
    allocator's blocks and cuDNN's workspace choice moved it by up to 4% between clean runs on different H100
    instances (397 MB and 414 MB per call for one Keras training step): a 5% bound against one run's figure
    would be a false alarm waiting to happen, and a count that can move is compared within the band its own
    runs showed."""
    spread = relative_spread([c["alloc_bytes"] for c in _runs_counters(band) if c.get("alloc_bytes")])
    return max(ALLOC_TOLERANCE[0], NOISE_K * (spread or 0.0))


def unstable_counters(then: Mapping[str, Any] | None, band: Mapping[str, Any] | None) -> dict[str, str]:
    """The exactly compared host counters (ATen ops, kernels, syncs) that differed between the baseline's own
    recording runs, each with its recorded values: only these are left out of the comparison, the others
    are still compared (bytes allocated are compared within :func:`alloc_tolerance`, which covers their
    recorded spread). Read from the runs' counters in ``band["recording_runs"]``; a band without them names
    its moved counters in ``host_counters_unstable`` ("aten_ops 10 vs 11; ...")."""
    band = band or {}
    runs = _runs_counters(band)
    if then and len(runs) >= 2:
        moved: dict[str, list[Any]] = {}
        for counters in runs:
            for key in _counter_moves(then, counters, alloc_rel=float("inf")):
                moved.setdefault(key, [then.get(key)]).append(counters.get(key))
        return {key: " vs ".join(str(v) for v in dict.fromkeys(values)) for key, values in moved.items()}
    legacy = band.get("host_counters_unstable") or ""
    out = {}
    for part in filter(None, (p.strip() for p in legacy.split(";"))):
        key, _, values = part.partition(" ")
        out[key] = values
    return out


# ---------------------------------------------------------------------------------------- noise band
NOISE_K = 2.0  # the per-call threshold is at least 1 + NOISE_K x the recorded relative spread


def relative_spread(medians: Sequence[float]) -> float | None:
    """(max - min) / median of the per-call medians of independent measurements; None with fewer than 2."""
    values = [float(m) for m in medians if m is not None and math.isfinite(float(m)) and float(m) > 0]
    if len(values) < 2:
        return None
    return (max(values) - min(values)) / statistics.median(values)


#: the recording-run median each metric's band is measured around (``noise_band.recording_runs``)
RUN_MEDIAN_KEYS = {"per-call": "per_call_median", "device": "device_median"}


#: an older recording run that did not keep its device-time method counts towards the device centre only
#: where its median lies within this factor of the entry's own samples: graph replays and event timing of one
#: call differed by 2.8x to 20x on the H100 baseline (a Keras training step captured in some recording runs
#: and event-timed in others), the spread between runs of one method by at most 1.9x
SAME_METHOD_FACTOR = 2.0


def own_device_median(extra: Mapping[str, Any]) -> float | None:
    """The median of an entry's own device samples (those of its first recording run), or None."""
    samples = [float(x) for x in extra.get("device_samples") or [] if x and x > 0]
    return statistics.median(samples) if samples else None


def runs_of_method(runs: Sequence[Mapping[str, Any]], method: str | None, own: float | None) -> list[Any]:
    """The recording runs whose device time was taken as the entry's own samples were: a run that kept its
    method counts when it matches (or the entry's is not known); an older run that did not keep it counts
    where its median lies within :data:`SAME_METHOD_FACTOR` of the entry's own samples' median ``own`` (or
    where that is not known). The one rule for the device band at recording and the device centre at the gate."""

    def alike(run: Mapping[str, Any]) -> bool:
        theirs = run.get("device_time_method")
        if theirs is not None:
            return method is None or theirs == method
        median = run.get("device_median")
        if not own or not median:
            return True
        return 1 / SAME_METHOD_FACTOR <= float(median) / own <= SAME_METHOD_FACTOR

    return [run for run in runs if alike(run)]


def centred_baseline(
    samples: Sequence[float], band: Mapping[str, Any] | None, metric: str, method: str | None = None
) -> tuple[list[float], str]:
    """The baseline's samples of ``metric`` (``per-call`` or ``device``), scaled so that their median is the
    centre (the median) of the recording runs' medians where the baseline rests on two or more recording runs;
    else as they are, with no note.

    The noise band is the spread of those runs' medians around their centre, and the threshold is 1 + k x that
    spread; the samples stored are the first run's. Taking the ratio against the first run while the band sits
    around the centre put the threshold off-centre by as much as the first run was: on the H100 (2026-11-24) a
    clean run of an autocast-bf16 GRU inference took 1.78 ms per call against a first recording run of 0.96 ms
    and later ones of 1.42 and 1.49 ms (spread 37%, threshold 1.74): 1.86x the first run, 1.25x the centre, and
    a false alarm. Against the centre, a threshold means what the band measured. The Mann-Whitney test then
    compares the current samples with the first run's distribution moved to the centre."""
    values = [float(x) for x in samples]
    recorded = [r for r in (band or {}).get("recording_runs") or [] if r.get(RUN_MEDIAN_KEYS[metric])]
    positive = [v for v in values if v > 0 and math.isfinite(v)]
    if metric == "device" and positive:  # the device centre of the runs timed as the entry's samples were
        recorded = runs_of_method(recorded, method, statistics.median(positive))
    runs = [float(r[RUN_MEDIAN_KEYS[metric]]) for r in recorded]
    if len(runs) < 2 or not positive:
        return values, ""
    first, centre = statistics.median(positive), statistics.median(runs)
    if first <= 0 or abs(centre / first - 1.0) < 1e-6:
        return values, ""
    note = (
        f"{metric} compared with the centre of the {len(runs)} recording runs' medians ({format_seconds(centre)}; "
        f"the first run's: {format_seconds(first)})"
    )
    return [v * centre / first for v in values], note


def chunk_medians(samples: Sequence[float], chunks: int = 3) -> list[float]:
    """Medians of ``chunks`` consecutive slices of one run's samples (a fallback where no independent
    measurements were stored: it sees drift within the run, not between runs)."""
    values = [float(x) for x in samples if x and x > 0]
    size = len(values) // chunks
    if size < 3:
        return []
    return [statistics.median(values[i * size : (i + 1) * size]) for i in range(chunks)]


def noise_threshold(ratio: float, spread: float | None, k: float = NOISE_K) -> float:
    """The per-call threshold: the configured ratio, or more where the baseline's own runs spread wider."""
    if spread is None:
        return ratio
    return max(ratio, 1.0 + k * spread)


#: the lowest device-time threshold. On two H100 instances (2026-11-23), a baseline recorded on one and compared
#: on the other moved clean device times by 0.94-1.058x (the largest: a Keras GRU, confirmed by re-measurement),
#: while a planted 1.10x kernel slowdown moved them by 1.074-1.17x: 1.07 lies between the two.
DEVICE_FLOOR = 1.07


def device_spread(
    band: Mapping[str, Any] | None, method: str | None = None, own: float | None = None
) -> tuple[float | None, int]:
    """The device-time noise band of a baseline entry and how many recording runs it rests on: the larger of
    the spread within its first run (``device_spread_within_run``) and the relative spread of the device
    medians of the recording runs taken as the entry's own samples were (:func:`runs_of_method`, with the
    entry's ``method`` and the median ``own`` of its samples), computed from the runs the band keeps; the
    stored ``device_spread`` where it keeps none, or where neither ``method`` nor ``own`` is known.

    The one rule at recording and at the gate: a band stored before the rule is judged as a new recording
    would be. The committed H100 entry of a Keras cuDNN-off LSTM training step had stored a spread of 1925%
    over graph replays of 17.7-17.9 ms and two event-timed runs of 357-361 ms (a device threshold of 39.5:
    blind); by the rule, 0.8% (its first run's own batches; its three graph-timed runs 0.6%)."""
    if not band:
        return None, 0
    runs = [r for r in band.get("recording_runs") or [] if r.get("device_median")]
    if len(runs) < 2 or (method is None and own is None):  # no runs to judge, or nothing to judge them by
        stored = band.get("device_spread")
        return (None if stored is None else float(stored)), int(band.get("runs") or 0)
    alike = runs_of_method(runs, method, own)
    within = band.get("device_spread_within_run")
    candidates = [float(v) for v in (within, relative_spread([r["device_median"] for r in alike])) if v is not None]
    return (max(candidates) if candidates else None), len(alike)


def device_threshold(
    ratio: float,
    band: Mapping[str, Any] | None,
    k: float = NOISE_K,
    method: str | None = None,
    own: float | None = None,
) -> tuple[float, str]:
    """The device-time threshold under the default setting: ``max(DEVICE_FLOOR, 1 + k x device spread)``
    where the baseline was recorded from two or more runs (:func:`device_spread`, over the runs of the entry's
    device-time ``method``, whose own samples' median is ``own``); ``ratio`` itself otherwise. Below ``ratio``
    where the device time was steady between recording runs; above it where it was not (an event-timed call
    whose GPU waits on the host, a cuDNN plan that differs between runs): a threshold inside the recorded noise
    would fail clean runs. Returns the threshold and a note when it differs from ``ratio``; a raised one says
    which slowdowns the benchmark no longer resolves (:data:`WIDE_DEVICE_NOTE` starts it)."""
    if not band or int(band.get("runs") or 0) < 2:
        return ratio, ""
    spread, runs = device_spread(band, method, own)
    if spread is None:
        return ratio, ""
    threshold = max(DEVICE_FLOOR, 1.0 + k * spread)
    if threshold > ratio:
        return threshold, (
            f"{WIDE_DEVICE_NOTE} {threshold:.3f}: the baseline's device time spread {spread:.1%} over {runs} "
            f"recording runs, so a device slowdown below {threshold:.2f}x is not resolved on this benchmark "
            "(the per-call and host-counter checks still apply)"
        )
    if threshold == ratio:
        return ratio, ""
    return threshold, (
        f"device threshold {threshold:.3f}: the baseline's device time spread {spread:.1%} over "
        f"{runs} recording runs (floor {DEVICE_FLOOR})"
    )


#: the start of the note of a device threshold raised above the configured one by the recorded noise
WIDE_DEVICE_NOTE = "device threshold raised to"


def bimodal(samples: Sequence[float], min_share: float = 0.2, gap: float = 1.05, apart: float = 1.10) -> str:
    """A description when the samples fall into two clusters, else ''.

    Split the sorted samples at their widest gap (each side holding at least ``min_share`` of them and 3
    samples): bimodal when that gap is at least ``gap`` (ratio of neighbours) and the two clusters' medians
    are at least ``apart`` apart, e.g. half the rounds at 1.0 ms and half at 1.3 ms.
    """
    values = sorted(float(x) for x in samples if x and x > 0)
    low = max(3, math.ceil(min_share * len(values)))
    if len(values) < 2 * low:
        return ""
    widest = max(range(low, len(values) - low + 1), key=lambda i: values[i] / values[i - 1])
    lower, upper = values[:widest], values[widest:]
    step = upper[0] / lower[-1]
    ratio = statistics.median(upper) / statistics.median(lower)
    # two modes: the gap is wide against the clusters' own spread (a broad unimodal spread has no such gap)
    inner = max(_log_iqr(lower), _log_iqr(upper))
    if step < gap or ratio < apart or math.log(step) < 2 * inner:
        return ""
    return (
        f"bimodal: {len(lower)} samples around {format_seconds(statistics.median(lower))} and {len(upper)} around "
        f"{format_seconds(statistics.median(upper))} ({ratio:.2f}x apart)"
    )


def noise_record(extra: Mapping[str, Any], data: Sequence[float]) -> dict[str, Any]:
    """What a baseline entry stores about its own noise, at recording time.

    ``per_call_spread``/``device_spread``: the relative spread of the per-call medians of independent
    batches of rounds (``extra_info.run_medians``/``device_run_medians``, from the measurement), or, where
    the record has none, of three consecutive chunks of the samples (``source`` says which); ``bimodal``:
    a description when the per-call samples fall into two clusters (see :func:`bimodal`), else ''.
    """
    runs = list(extra.get("run_medians") or [])
    source = "independent runs" if len(runs) >= 2 else "chunks of one run"
    per_call = relative_spread(runs if len(runs) >= 2 else chunk_medians(data))
    device = relative_spread(extra.get("device_run_medians") or [])
    return {
        "per_call_spread": per_call,
        "device_spread": device,
        "source": source,
        "runs": len(runs),
        "bimodal": bimodal(data),
    }


def per_call_spread(base_extra: Mapping[str, Any], base_data: Sequence[float]) -> tuple[float | None, str]:
    """The baseline's per-call noise band (relative spread) and where it came from."""
    stored = base_extra.get("noise_band")
    if isinstance(stored, Mapping) and stored.get("per_call_spread") is not None:
        return float(stored["per_call_spread"]), str(stored.get("source", "recorded"))
    record = noise_record(base_extra, base_data)
    return record["per_call_spread"], str(record["source"])


def pooled_spread(entries: Iterable[Mapping[str, Any]]) -> tuple[float | None, int]:
    """The median per-call noise band over a baseline's entries recorded from two or more runs, and how many
    there were. One entry's spread from three runs is itself a noisy estimate (on the H100 host the per-call
    time of the same benchmark moved 0.7-1.9x between machines of one type while some entries' three
    recording runs agreed within 5%); the pooled median is the steadier estimate of the host's noise."""
    spreads = []
    for entry in entries:
        band = (entry.get("extra_info") or {}).get("noise_band")
        if isinstance(band, Mapping) and int(band.get("runs") or 0) >= 2 and band.get("per_call_spread") is not None:
            spreads.append(float(band["per_call_spread"]))
    return (statistics.median(spreads) if spreads else None), len(spreads)


#: a CUDA-events device time this close to the time per call measured the host's launch rate, not the GPU
HOST_BOUND_EVENTS = 0.8


def events_host_bound(extra: Mapping[str, Any]) -> bool:
    """Device time from CUDA events (capture failed) that is mostly launch gaps: the GPU waited for the host.
    A pipelined device time (``timing.pipelined_device_time``) whose queueing took the host at least
    ``timing.PIPELINED_DEVICE_BOUND`` of it, or whose share was not kept, counts as host-bound too."""
    if extra.get("device_time_method") == "pipelined":
        from .timing import PIPELINED_DEVICE_BOUND

        share = extra.get("device_dispatch_share")
        return not isinstance(share, (int, float)) or float(share) >= PIPELINED_DEVICE_BOUND
    device, per_call = extra.get("device_time_s"), extra.get("time_per_call_s")
    if extra.get("device_time_method") != "cuda-events" or not device or not per_call:
        return False
    return float(device) >= HOST_BOUND_EVENTS * float(per_call)


def _log_iqr(values: Sequence[float]) -> float:
    """Interquartile range of log(values) (sorted, positive)."""
    q = statistics.quantiles([math.log(v) for v in values], n=4, method="inclusive")
    return q[2] - q[0]


# ----------------------------------------------------------------------------------- combining metrics
#: which verdict wins when several metrics (device time, per-call time, host counters) decide one benchmark
PRECEDENCE = ("kernel-changed", "regressed", "host-work-changed", "path-lost", "inconclusive", "improved", "unchanged")


def combine(decisions: Sequence[Decision], extra_checks: Sequence[str] = ()) -> Decision:
    """One decision from the per-metric ones: the most severe verdict wins and keeps its numbers; every
    metric's outcome is listed in ``checks``."""
    if not decisions:
        raise ValueError("nothing to combine")
    rank = {v: i for i, v in enumerate(PRECEDENCE)}
    worst = min(decisions, key=lambda d: rank.get(d.verdict, len(PRECEDENCE)))
    # the table shows the numbers of the deciding metric, or of the first timed one (host counters have none)
    numbers = worst if worst.ratio is not None else next((d for d in decisions if d.ratio is not None), worst)
    checks = tuple(f"{d.metric}: {_check_text(d)}" for d in decisions if d.metric != "host") + tuple(extra_checks)
    notes = tuple(dict.fromkeys(n for d in decisions for n in d.notes))
    blunted = next((d.device_blunted for d in decisions if d.device_blunted), "")
    return replace(numbers, verdict=worst.verdict, checks=checks, notes=notes, device_blunted=blunted)


def _check_text(d: Decision) -> str:
    ratio = "-" if d.ratio is None else f"{d.ratio:.3f}x"
    p = "" if d.pvalue is None else f", p {d.pvalue:.2g}"
    limit = "" if d.threshold is None else f" (threshold {d.threshold:.3f})"
    return f"{d.verdict} at {ratio}{p}{limit}"


@dataclass
class GateResult:
    """All decisions of one run against one baseline."""

    decisions: list[Decision] = field(default_factory=list)

    @property
    def failed(self) -> list[Decision]:
        return [d for d in self.decisions if d.failed]

    def count(self, verdict: str) -> int:
        return sum(1 for d in self.decisions if d.verdict == verdict)

    @property
    def inconclusive(self) -> list[Decision]:
        return [d for d in self.decisions if d.verdict == "inconclusive"]

    @property
    def compared(self) -> int:
        """How many benchmarks were actually compared with the baseline."""
        return sum(1 for d in self.decisions if d.verdict in COMPARED)

    def unsettled(self) -> list[str]:
        """Why this run is not a pass although nothing regressed: inconclusive benchmarks, nothing compared."""
        out = []
        if self.inconclusive:
            out.append(f"{len(self.inconclusive)} benchmark(s) inconclusive")
        if not self.compared:
            out.append("nothing was compared with the baseline")
        return out

    def wide_device(self) -> list[tuple[str, str]]:
        """Compared benchmarks whose device threshold lies above the configured one (``Decision.device_blunted``:
        the baseline's recorded noise, or CUDA-event timing that follows the host): (name, why). Listed with
        every verdict, so a blunted check is never a silent one."""
        return [(d.name, d.device_blunted) for d in self.decisions if d.verdict in COMPARED and d.device_blunted]

    def no_device(self) -> list[tuple[str, str]]:
        """Compared benchmarks whose device check did not happen although one side had device time (another
        method now than in the baseline: a CUDA-graph capture that failed this time, a Keras-on-JAX worker without
        CUPTI): (name, why). The per-call check alone decided them, at its wider threshold: listed with every
        verdict, so a device check that did not run is never a silent pass."""
        return [
            (d.name, check)
            for d in self.decisions
            if d.verdict in COMPARED
            for check in d.checks
            if check.startswith("device: not compared")
        ]

    def summary(self) -> str:
        parts = [f"{self.count(v)} {v}" for v in VERDICTS if self.count(v)]
        return ", ".join(parts) or "nothing compared"


def format_seconds(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.3g} s"


def format_table(decisions: Sequence[Decision]) -> list[str]:
    """Rows for the terminal: test, baseline, now, ratio, p-value, drift, kernel then and now, verdict."""
    header = (
        "test", "metric", "baseline", "now", "ratio", "p-value", "per call", "drift", "kernel then", "kernel now",
        "verdict",
    )  # fmt: skip
    rows = [header]
    for d in decisions:
        rows.append(
            (
                d.name,
                d.metric,
                format_seconds(d.base_median),
                format_seconds(d.now_median),
                "-" if d.ratio is None else f"{d.ratio:.3f}",
                "-" if d.pvalue is None else f"{d.pvalue:.2g}",
                "-" if d.per_call_ratio is None else f"{d.per_call_ratio:.3f}",
                "-" if d.drift is None else f"{d.drift:.3f}",
                d.kernel_then or "-",
                d.kernel_now or "-",
                d.verdict,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines
