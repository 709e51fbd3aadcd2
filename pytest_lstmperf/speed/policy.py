"""The speed gate's rule: what a benchmark measured, what its baseline holds, and the verdict. One home.

The rule, in five sentences (docs/speed-gate.md states the same):

1. Every benchmark is timed in pairs, one call of the benchmark and one run of a fixed anchor workload on the
   same device in the same process, with the machine to itself (under pytest-xdist the other workers wait), and
   its figure is the median of the per-pair ratios of its device time where it has one that leaves the host out
   (a GPU), else of its time per call, so that a slow phase, a busy neighbour or a clock change that the whole
   machine shares cancels instead of being measured.
2. A figure is slower when it exceeds the baseline's figure by more than its limit: the threshold (1.05 unless
   ``--lstmperf-threshold`` or the ``lstmperf_threshold`` marker says otherwise), or the smallest slowdown the
   benchmark resolves on this machine (4 standard errors of the two figures and of how far recording runs lie
   apart, pooled over the baseline's benchmarks) where that is larger; a resolution above the threshold is
   printed (with ``-v``, every one).
3. A benchmark fails when its figure is slower, when it ran another kernel or precision than its baseline, or when
   its exact host counts per call (ATen ops, GPU kernels, synchronisations: the host's work, on a GPU too)
   changed; a figure that cannot be compared is inconclusive, which fails unless accepted.
4. A recording run is compared with the entry's earlier runs by the same rule: one outside their limits is added
   and named, one more than 2x off is refused.
5. Baselines are keyed by the hardware alone: a run on other software versions is compared by the same rule and
   reported as an upgrade, and ``--lstmperf-update-baseline`` accepts what it changed.

Everything here is pure: records and baseline entries in, verdicts out, no timing and no files. The end-of-run
verdict (:func:`decide`) and a recording run's outlier check call the same :func:`check`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..options import THRESHOLD

# ----------------------------------------------------------------------------------------------- constants
#: a recording run whose figure lies more than this factor from the entry's is refused (a run that broke, not noise)
OUTLIER_FACTOR = 2.0
#: standard errors a slowdown must exceed before it can count: the benchmark's resolution is exp(K_SIGMA x sigma)
K_SIGMA = 4.0
#: fewer paired samples on a side than this and a figure is not compared (inconclusive)
MIN_SAMPLES = 5
#: the two figures a benchmark can have: per call (host included) and device time (GPU only)
METRICS = ("per-call", "device")
#: the device-time methods that leave the host out (CUDA-graph replays, CUPTI's kernel durations): a device figure.
#: CUDA events around queued calls and pipelined calls hold the launch gaps, so they follow the host: the time per
#: call is their figure (on the H100 two clean torch.compile reduce-overhead benchmarks read 1.47x and 1.52x so)
DEVICE_METHODS = ("cuda-graph", "cupti")
#: counts per call that must match exactly; bytes allocated may move by allocator rounding
EXACT_COUNTERS = ("aten_ops", "kernels", "syncs")
ALLOC_TOLERANCE = (0.05, 4096)  # relative, absolute (bytes)

#: verdicts that fail the session
FAILING = ("regressed", "kernel-changed", "host-work-changed", "path-lost")
#: verdicts of a benchmark that was compared
COMPARED = ("regressed", "kernel-changed", "host-work-changed", "improved", "unchanged")
VERDICTS = (
    "kernel-changed",
    "regressed",
    "host-work-changed",
    "path-lost",
    "inconclusive",
    "improved",
    "unchanged",
    "new",
    "not-run",
)  # fmt: skip  (also the precedence: the first one found in a benchmark's checks wins)


# --------------------------------------------------------------------------------------------- measured
@dataclass(frozen=True)
class Look:
    """One look at a benchmark: per-pair ratios (benchmark / anchor) of each metric it has."""

    per_call: tuple[float, ...] = ()
    device: tuple[float, ...] = ()

    def samples(self, metric: str) -> tuple[float, ...]:
        return self.per_call if metric == "per-call" else self.device


@dataclass(frozen=True)
class Measurement:
    """What one benchmark measured in this run (read from its record once; the record itself is not consulted
    again)."""

    name: str
    kernel: str = ""  # "cudnn/fp32"; "" where nothing was traced
    failed_kernel: bool = False  # the test failed because the kernel was not the path's claim: not timed
    first: Look = Look()
    counters: Mapping[str, float] = field(default_factory=dict)
    threshold: float | None = None  # the marker's, where one is set
    per_call_s: float | None = None  # the raw medians, for the table and the report
    device_s: float | None = None
    anchor_s: float | None = None

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Measurement:
        extra = record.get("extra_info") or {}
        return cls(
            name=record["fullname"],
            kernel=kernel_text(extra),
            failed_kernel=record.get("failed") == "kernel",
            first=look_of(record.get("data") or (), extra),
            counters=dict(extra.get("host_counters") or {}),
            threshold=(record.get("thresholds") or {}).get("ratio"),
            per_call_s=_median(record.get("data") or ()),
            device_s=extra.get("device_time_s"),
            anchor_s=(extra.get("anchor") or {}).get("per_call_s"),
        )


def look_of(data: Sequence[float], extra: Mapping[str, Any]) -> Look:
    """The paired ratios of a record: call / anchor, round by round, and device time /
    the anchor's device time, sample by sample."""
    anchor = extra.get("anchor") or {}
    device = extra.get("device_samples") if extra.get("device_time_method") in DEVICE_METHODS else ()
    return Look(
        per_call=_pairs(data, anchor.get("samples") or ()),
        device=_pairs(device or (), anchor.get("device_samples") or ()),
    )


def _pairs(values: Sequence[float], anchors: Sequence[float]) -> tuple[float, ...]:
    if len(values) != len(anchors):
        return ()
    return tuple(float(v) / float(a) for v, a in zip(values, anchors, strict=True) if v and a and v > 0 and a > 0)


def kernel_text(extra: Mapping[str, Any]) -> str:
    return f"{extra.get('kernel', '')}/{extra.get('precision', '')}" if extra.get("kernel") else ""


# --------------------------------------------------------------------------------------------- figures
@dataclass(frozen=True)
class Figure:
    """A median of paired ratios and its standard error on the log scale."""

    value: float
    se: float
    n: int

    @classmethod
    def of(cls, samples: Sequence[float]) -> Figure | None:
        values = [float(x) for x in samples if x and x > 0]
        if len(values) < MIN_SAMPLES:
            return None
        logs = [math.log(x) for x in values]
        centre = statistics.median(logs)
        mad = statistics.median(abs(x - centre) for x in logs)
        # the standard error of a median: sqrt(pi/2) x sigma / sqrt(n), sigma from the MAD (robust to outliers)
        se = 1.2533 * 1.4826 * mad / math.sqrt(len(values))
        return cls(math.exp(centre), se, len(values))


@dataclass(frozen=True)
class RunFigures:
    """One recording run of a benchmark, as the baseline keeps it."""

    per_call: Figure | None
    device: Figure | None
    counters: Mapping[str, float] = field(default_factory=dict)

    def get(self, metric: str) -> Figure | None:
        return self.per_call if metric == "per-call" else self.device

    def to_dict(self) -> dict[str, Any]:
        def one(f: Figure | None) -> dict[str, float] | None:
            return None if f is None else {"value": f.value, "se": f.se, "n": f.n}

        return {"per_call": one(self.per_call), "device": one(self.device), "host_counters": dict(self.counters)}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> RunFigures:
        def one(f: Any) -> Figure | None:
            return Figure(float(f["value"]), float(f["se"]), int(f["n"])) if isinstance(f, dict) else None

        return cls(one(raw.get("per_call")), one(raw.get("device")), dict(raw.get("host_counters") or {}))


def run_figures(measurement: Measurement) -> RunFigures:
    """What a recording run contributes to its baseline entry: its figures and host counts."""
    return RunFigures(
        Figure.of(measurement.first.per_call),
        Figure.of(measurement.first.device),
        measurement.counters,
    )


@dataclass(frozen=True)
class Reference:
    """A benchmark's baseline: its recording runs (this software's), its kernel, its versions."""

    name: str
    runs: tuple[RunFigures, ...]
    kernel: str = ""
    versions: Mapping[str, str] = field(default_factory=dict)
    #: how far recording runs lie apart on this machine, per metric, pooled over the baseline (:func:`pooled`)
    spread: Mapping[str, float] = field(default_factory=dict)

    def own_spread(self, metric: str) -> float | None:
        """The standard deviation (log scale) of this benchmark's recording runs' figures; None under two runs."""
        logs = [math.log(f.value) for f in (run.get(metric) for run in self.runs) if f is not None]
        return statistics.stdev(logs) if len(logs) > 1 else None

    def figure(self, metric: str) -> tuple[float, float] | None:
        """(value, sigma): the median of the runs' figures, and the noise of that reference on the log scale: the
        runs' own standard errors, and how far recording runs lie apart (the baseline's pooled spread, else this
        benchmark's own)."""
        figures = [f for f in (run.get(metric) for run in self.runs) if f is not None]
        if not figures:
            return None
        logs = [math.log(f.value) for f in figures]
        within = math.sqrt(sum(f.se**2 for f in figures) / len(figures) ** 2)
        between = self.spread.get(metric, self.own_spread(metric) or 0.0)
        return math.exp(statistics.median(logs)), math.hypot(within, between)


def pooled(references: Mapping[str, Reference]) -> dict[str, Reference]:
    """The references with the spread of their recording runs pooled over all of them, per metric: the root mean
    square of every benchmark's own spread (those recorded at least twice). A benchmark's own three runs give its
    spread two degrees of freedom, and 4 such standard errors let 2 of 70 clean benchmark-runs on the 2-core CPU
    through as slower (1.195x against a limit of 1.170); how far runs lie apart is the machine's, measured on
    every benchmark of the baseline at once."""
    spread: dict[str, float] = {}
    for metric in METRICS:
        own = [s for s in (ref.own_spread(metric) for ref in references.values()) if s is not None]
        if own:
            spread[metric] = math.sqrt(statistics.fmean(s * s for s in own))
    return {name: replace(ref, spread=spread) for name, ref in references.items()}


# --------------------------------------------------------------------------------------------- decision
@dataclass(frozen=True)
class Check:
    """One metric of one benchmark against its reference."""

    metric: str
    verdict: str  # "regressed" (slower), "improved" (faster), "unchanged", "inconclusive"
    ratio: float | None = None
    limit: float | None = None
    resolves: float | None = None  # the smallest slowdown this benchmark resolves on this machine
    note: str = ""

    def text(self) -> str:
        if self.ratio is None:
            return f"{self.metric}: {self.verdict} ({self.note})"
        return (
            f"{self.metric}: {self.verdict} at {self.ratio:.3f}x (limit {self.limit:.3f}, resolves {self.resolves:.3f})"
        )


def check(metric: str, samples: Sequence[float], reference: Reference, threshold: float) -> Check:
    """``samples`` (paired ratios of this run) against ``reference`` on ``metric`` (rule sentence 2)."""
    ref = reference.figure(metric)
    now = Figure.of(samples)
    if ref is None or now is None:
        side = "this run" if now is None else "the baseline"
        return Check(metric, "inconclusive", note=f"fewer than {MIN_SAMPLES} paired samples in {side}")
    value, sigma_ref = ref
    sigma = math.hypot(now.se, sigma_ref)
    resolves = math.exp(K_SIGMA * sigma)
    limit = max(threshold, resolves)
    ratio = now.value / value
    verdict = "regressed" if ratio > limit else "improved" if ratio < 1 / limit else "unchanged"
    return Check(metric, verdict, ratio, limit, resolves)


def metrics_of(reference: Reference, look: Look) -> list[str]:
    """The metric that decides (sentence 1): device time where both sides have a device figure, else the time per
    call. On the H100 the time per call of device-bound calls moved up to 1.4x between clean runs whose device
    figures agreed within 2% (the anchor, host-bound, does not follow a GPU's own state): there the device figure
    decides, and the exact host counts hold the host's work."""
    if look.device and reference.figure("device") is not None:
        return ["device"]
    return ["per-call"] if look.per_call and reference.figure("per-call") is not None else []


@dataclass(frozen=True)
class Decision:
    """The verdict on one benchmark, with every check behind it."""

    name: str
    verdict: str
    checks: tuple[Check, ...] = ()
    kernel_then: str = ""
    kernel_now: str = ""
    notes: tuple[str, ...] = ()
    per_call_s: float | None = None
    device_s: float | None = None
    runs: int = 0  # recording runs behind the reference

    @property
    def failed(self) -> bool:
        return self.verdict in FAILING

    def ratio(self, metric: str) -> float | None:
        return next((c.ratio for c in self.checks if c.metric == metric), None)

    @property
    def deciding(self) -> Check | None:
        """The check that gave the verdict, else the first one with a ratio."""
        return next((c for c in self.checks if c.verdict == self.verdict), None) or next(
            (c for c in self.checks if c.ratio is not None), None
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "verdict": self.verdict,
            "kernel_then": self.kernel_then,
            "kernel_now": self.kernel_now,
            "checks": [c.__dict__ for c in self.checks],
            "notes": list(self.notes),
        }


def decide(measurement: Measurement, reference: Reference | None, threshold: float = THRESHOLD) -> Decision:
    """One benchmark against its reference (rule sentences 2 and 3): the most severe check wins."""
    from ..observation.claims import same_kernel

    name, now = measurement.name, measurement.kernel
    if reference is None:
        return Decision(name, "new", kernel_now=now)
    then = reference.kernel
    base = Decision(name, "unchanged", kernel_then=then, kernel_now=now, per_call_s=measurement.per_call_s,
                    device_s=measurement.device_s, runs=len(reference.runs))  # fmt: skip
    if measurement.failed_kernel:
        return replace(base, verdict="kernel-changed", notes=("the kernel differs from the path's claim: not timed",))
    limit = measurement.threshold or threshold
    checks = [
        check(m, measurement.first.samples(m), reference, limit) for m in metrics_of(reference, measurement.first)
    ]
    notes = [
        f"{m}: not compared: the baseline has this figure, this run has none"
        for m in METRICS
        if reference.figure(m) is not None and not measurement.first.samples(m)
    ]
    if not checks:
        if not any(run.per_call or run.device for run in reference.runs):
            why = (
                "the baseline entry holds no timings of this format (migrated from format 1, or recorded without "
                "the anchor): record them with --lstmperf-save-baseline"
            )
        else:
            why = "no paired samples in this run (not timed: --benchmark-disable, or the test stopped before timing)"
        checks = [Check("per-call", "inconclusive", note=why)]
    if then and now and not same_kernel(then, now):
        checks.append(Check("kernel", "kernel-changed", note=f"{then} in the baseline, {now} now"))
    moved = counter_changes(reference, measurement.counters)
    if moved:
        checks.append(Check("host", "host-work-changed", note="; ".join(moved)))
    rank = {v: i for i, v in enumerate(VERDICTS)}
    verdict = min((c.verdict for c in checks), key=lambda v: rank.get(v, len(rank)))
    return replace(base, verdict=verdict, checks=tuple(checks), notes=tuple(notes))


def counter_changes(reference: Reference, now: Mapping[str, float]) -> list[str]:
    """Host counts per call that changed: exact counts must match the baseline's (where every recording run
    agreed on them), bytes allocated within allocator rounding. Nothing where either side has no counts."""
    runs = [run.counters for run in reference.runs if run.counters]
    if not runs or not now:
        return []
    out = []
    for key in EXACT_COUNTERS:
        seen = {run.get(key) for run in runs}
        if len(seen) != 1 or key not in now or None in seen:
            continue  # a count a clean rerun already moved is not a rule
        then = seen.pop()
        if now[key] != then:
            out.append(f"{key} {then:g} -> {now[key]:g} per call")
    allocs = [run["alloc_bytes"] for run in runs if "alloc_bytes" in run]
    if allocs and "alloc_bytes" in now:
        rel, absolute = ALLOC_TOLERANCE
        low, high = min(allocs), max(allocs)
        slack = max(rel * high, absolute)
        if not low - slack <= now["alloc_bytes"] <= high + slack:
            out.append(f"alloc_bytes {statistics.median(allocs):g} -> {now['alloc_bytes']:g} per call")
    return out


# ------------------------------------------------------------------------------------------- the run
@dataclass(frozen=True)
class Upgrade:
    """Software versions that differ between the baseline's entries and this run: ``name -> (then, now)``."""

    changed: Mapping[str, tuple[str, str]]

    def headline(self, decisions: Sequence[Decision]) -> str:
        """What moved, counted per check whatever verdict won: a benchmark that ran 4x faster and did less host
        work counts as faster and as host work changed (Keras 3.14.0 -> 3.15.1 on the H100)."""
        moved = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in sorted(self.changed.items()))

        def count(metrics: tuple[str, ...], verdict: str) -> int:
            return sum(1 for d in decisions if any(c.metric in metrics and c.verdict == verdict for c in d.checks))

        parts = [f"{count(METRICS, 'regressed')} slower", f"{count(METRICS, 'improved')} faster"]
        kernel = sum(1 for d in decisions if d.verdict == "kernel-changed")
        parts.append(f"{kernel} kernel changed")
        host = count(("host",), "host-work-changed")
        if host:
            parts.append(f"{host} host work changed")
        return f"upgrade: {moved}: {', '.join(parts)}"


def upgrade_of(references: Iterable[Reference], versions: Mapping[str, str]) -> Upgrade | None:
    changed: dict[str, tuple[str, str]] = {}
    for ref in references:
        for key in set(ref.versions) | set(versions):
            then, now = ref.versions.get(key), versions.get(key)
            if then is not None and now is not None and then != now:
                changed.setdefault(key, (then, now))
    return Upgrade(changed) if changed else None


@dataclass
class GateResult:
    """Every decision of one run against one baseline, and the upgrade it crossed, if any."""

    decisions: list[Decision] = field(default_factory=list)
    upgrade: Upgrade | None = None

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
        return sum(1 for d in self.decisions if d.verdict in COMPARED)

    def unsettled(self) -> list[str]:
        """Why this run is not a pass although nothing failed: inconclusive benchmarks, nothing compared."""
        out = []
        if self.inconclusive:
            out.append(f"{len(self.inconclusive)} benchmark(s) inconclusive")
        if not self.compared:
            out.append("nothing was compared with the baseline")
        return out

    def coarse(self, threshold: float) -> list[tuple[str, Check]]:
        """Compared checks whose resolution lies above the threshold: the slowdowns this machine cannot see."""
        return [
            (d.name, c)
            for d in self.decisions
            if d.verdict in COMPARED
            for c in d.checks
            if c.resolves is not None and c.resolves > (threshold if c.limit is None else min(c.limit, threshold))
        ]

    def one_run(self) -> list[str]:
        """Compared benchmarks whose baseline rests on one recording run: how far runs lie apart is not known."""
        return [d.name for d in self.decisions if d.verdict in COMPARED and d.runs == 1]

    def summary(self) -> str:
        parts = [f"{self.count(v)} {v}" for v in VERDICTS if self.count(v)]
        return ", ".join(parts) or "nothing compared"


def _median(values: Sequence[float]) -> float | None:
    vals = [float(v) for v in values if v]
    return statistics.median(vals) if vals else None
