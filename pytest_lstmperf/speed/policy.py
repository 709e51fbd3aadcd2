"""The speed gate's rule: what a benchmark measured, what its baseline holds, and the verdict. One home.

The rule, in five sentences (docs/speed-gate.md states the same):

1. Every benchmark is timed in pairs, one call of the benchmark and one run of a fixed anchor workload on the same
   device in the same process (a Keras benchmark's, on a CPU, in its worker, where its call runs; on a CPU each
   timed call after an untimed one of its own, and a bf16 or fp16 call beside the anchor run in its precision),
   the anchor repeated as often in every process as the benchmark's
   baseline (or the run's first process) says, with the machine
   to itself where the gate compares or records (under pytest-xdist the other workers wait) and a fixed number of CPU
   threads (``--lstmperf-threads``, 1 by default); its figure is the median of its device time where it has one that
   leaves the host out (a GPU), else of its time per call, taken where the gate compares or records in slices spread
   over a sweep of the process's benchmarks as the run ends, divided by the anchor's: the recording's processes run
   minutes apart at most, in one state of the machine, and a compare in another, which the anchor is there to cancel
   (a time per call whose own processes say beyond doubt that the anchor adds more noise than it removes, a GPU-bound
   call beside host-bound ones, is judged raw, on its own processes' spread).
2. A recording times every benchmark in independent processes (three, more where they do not yet show their spread or
   where more would let a compare resolve the goal of sentence 3), and how far one recording's lie apart is its
   between-run noise: its own, and a compare's processes' too, moderated by the baseline's (a median over its
   benchmarks of its mode: training steps with training steps) unless it lies beyond doubt further apart than theirs,
   widened by Student's t for the processes behind it. A figure is slower when it exceeds the baseline's by more than
   its limit: the threshold (1.05 unless ``--lstmperf-threshold`` or the ``lstmperf_threshold`` marker says
   otherwise), or the slowdown the benchmark resolves (4 such standard errors of this run's figure, of the processes,
   and for a time per call of how far runs made at different times lie apart: what the baseline's recordings made at
   different times measured for its mode, moderated towards its own, where its entries hold two such sittings, else
   1.5% as measured), where that is larger; a resolution above the threshold is printed (with ``-v``, every one).
3. A benchmark fails when its figure is slower, when it ran another kernel or precision than its baseline, or when
   its exact host counts per call (ATen ops, GPU kernels, synchronisations: the host's work, on a GPU too) changed.
   One that cannot see a 1.5x slowdown, where further processes could let it, or is slower, is timed in further
   processes of the run, and so is one that resolves a coarser slowdown than the goal (``--lstmperf-resolution``,
   1.10x by default) or than 1.33x (finer, it catches 1.5x 19 runs in 20) where eight processes would reach it: eight
   in all at most (four where the goal is 1.5x); one that still cannot see 1.5x, or that its baseline's processes and
   sittings alone leave blind (at once), or whose anchor ran more than 3x off its recorded time, is inconclusive,
   which fails unless accepted: never passed blind.
4. A recording process more than 2x off the median of its siblings is left out and named; a recording run
   added later, a sitting of its own, is compared with the entry's processes: one outside their limits is added
   and named, one more than 2x off is refused.
5. Baselines are keyed by the hardware alone (a GPU model; a CPU's model name, family, model and stepping, and
   its threads): a run on other software versions is compared by the same rule and reported as an upgrade, and
   ``--lstmperf-update-baseline`` accepts what it changed and keeps, beside its own, the earlier sittings of an entry
   the rule finds unchanged, or blind only for its own processes and sittings (three sittings at most).

Everything here is pure: records and baseline entries in, verdicts out, no timing and no files. The end-of-run
verdict (:func:`decide`) and a recording run's outlier check call the same :func:`check`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from ..anchor import REDUCED_PRECISIONS, WARM_SUFFIX
from ..options import PROMISED, THRESHOLD

# ----------------------------------------------------------------------------------------------- constants
#: a recording process whose figure lies more than this factor from the median of its siblings' is left out and
#: named (a process that broke, not noise); so is a recording run added later
OUTLIER_FACTOR = 2.0
#: standard errors a slowdown must exceed before it can count: the benchmark's resolution is exp(K_SIGMA x sigma)
K_SIGMA = 4.0
#: fewer paired samples on a side than this and a figure is not compared (inconclusive)
MIN_SAMPLES = 5
#: the slowdown the gate promises to see on any machine: a check whose limit lies above it cannot see a 1.5x
#: slower call, and is inconclusive (which fails) instead of passing blind
MAX_LIMIT = PROMISED
#: the coarsest slowdown a check may resolve and still catch a :data:`MAX_LIMIT` slowdown 19 runs in 20: a figure
#: slowed exactly to its limit L passes half the time, and its own noise is at most a :data:`K_SIGMA`-th of log L,
#: so a slowdown S exceeds L at least 95% of the time where log S >= log L x (1 + 1.645 / K_SIGMA): 1.333x for 1.5x.
#: A check between the two sees 1.5x by the rule, and is timed in further processes where they would bring it here
#: (:func:`undecided`): on the 2-core VM Keras on JAX's LSTM at batch 16 resolved 1.468-1.473x in one process in
#: each of 26 clean compares, where 8 would have resolved 1.13x, and a 1.5x slowdown of it read 1.405x and passed
SURE_LIMIT = MAX_LIMIT ** (K_SIGMA / (K_SIGMA + 1.645))
#: a run whose anchor workload took more than this factor longer or shorter than when it was recorded ran on a
#: machine in another state (overloaded, throttled, another machine): its figures are not comparable
COMPARABLE_FACTOR = 3.0
#: degrees of freedom given to the baseline's pooled between-process spread in each benchmark's own estimate: a
#: benchmark's own three recording processes (2 degrees of freedom) weigh one third, the machine's pool two thirds
PRIOR_DOF = 4
#: the pooled spread's own degrees of freedom count up to this many in the t quantile that replaces K_SIGMA
#: normal standard errors: how far processes lie apart is estimated, and an estimate from few processes is small
#: by chance often enough to fail clean runs (1 in 200 planted with 3 processes and no pool)
POOL_DOF_CAP = 30
#: a baseline's spread widened for its uncertainty beyond this factor per process is not printed as a figure: its
#: processes are too few to bound it (two processes, one degree of freedom, widen it 2,500-fold)
UNBOUNDED = 10.0
#: a recording times a benchmark in at most this many processes (more than --lstmperf-record-processes only where
#: :func:`unresolved` says its processes do not yet show how far they lie apart: a user's lone benchmark)
RECORD_PROCESSES_MAX = 8
#: a compare times a benchmark that is undecided (:func:`undecided`) in at most this many processes in all, where
#: the resolution goal is the 1.5x promise alone (``--lstmperf-resolution=1.5``; :func:`compare_processes`)
COMPARE_PROCESSES = 4
#: ... and in at most this many where the goal is finer (1.10x by default), whatever the reason, among them one
#: that resolves a coarser slowdown than the goal: as many as a recording may take. On the 16-core Xeon of a GPU host,
#: whose processes lay 2.8% apart divided by the anchor, one compare process resolved 1.17x; 1.10x takes five
#: or six against six to eight recorded, by this rule's arithmetic (:func:`resolution`)
GOAL_PROCESSES = RECORD_PROCESSES_MAX
#: how far a time-per-call figure lies from its recording made at another time, beyond what the recording's own
#: processes show (log scale, root mean square): the recording's processes run one after another, within a minute,
#: and share the machine's state of that minute; a compare runs minutes or days later. It was 4% when the CPU
#: anchor ran forward calls alone and the baseline pooled every benchmark's spread in one: on the 16-core Xeon of a
#: GPU host 10 clean compares lay 4.0% from their recording (3.5% spread around a 2.0% offset), and on the quiet
#: 2-core VM 4% was the smallest term that raised no false alarm over 21 clean compares replayed (scripts/
#: gate_between.py). Much of that was the training steps: the forward anchor did not follow them (on the Xeon the
#: anchor that runs its steps through backward leaves a half to a quarter of their spread between processes), and
#: pooled with the forward calls their spread read small. With the anchor through backward and pools by mode, 1.5%
#: raised no false alarm in 286 benchmark-runs of the README's recipe in each of three series on the VM (the
#: largest clean figure at 0.47-0.65 of its limit, log scale), 0 of 110 on a sixteenth Xeon (0.56) and 0 of 96 on
#: an H200, and every run caught a 1.5x slowdown on every torch benchmark (docs/gate-evidence.md). A device figure
#: (the GPU's own time) has none: 0 false alarms in 234 benchmark-runs across H100 hosts and days with the
#: processes' spread alone. One exception is known: on an H200 the graph of Keras's per-step torch ops at batch 4
#: read at one of two levels 10% apart from process to process on other H200 machines after its recording, whose
#: processes held the lower level alone: such an entry needs recording runs from the machine it is compared on
#: (--lstmperf-add-baseline-run).
BETWEEN_RUNS = {"per-call": 0.015, "device": 0.0}
#: how sure a benchmark's own recording processes must be that its time per call lies closer together raw than
#: divided by the anchor before it is judged raw (:meth:`Reference.variant`)
VARIANT_CONFIDENCE = 0.99
#: the modes the baseline's spread is pooled by (:attr:`Reference.pool`): a suite's forward calls and training steps
POOLED_MODES = ("forward", "train")
#: how the run names a pool of benchmarks (:attr:`Reference.pool`)
POOL_NAMES = {"forward": "forward calls", "train": "training steps", "": "benchmarks"}
#: the two figures a benchmark can have: per call (host included) and device time (GPU only)
METRICS = ("per-call", "device")
#: each figure divided by the anchor's beside it, or raw; the baseline's recording processes decide which
VARIANTS = ("anchored", "raw")
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
    """One look at a benchmark: per-pair ratios (benchmark / anchor) of each metric it has, and the raw samples
    (seconds) they were made of."""

    per_call: tuple[float, ...] = ()
    device: tuple[float, ...] = ()
    per_call_raw: tuple[float, ...] = ()
    device_raw: tuple[float, ...] = ()

    def samples(self, metric: str, variant: str = "anchored") -> tuple[float, ...]:
        if variant == "raw":
            return self.per_call_raw if metric == "per-call" else self.device_raw
        return self.per_call if metric == "per-call" else self.device


@dataclass(frozen=True)
class Measurement:
    """What one benchmark measured in this run (read from its record once; the record itself is not consulted
    again)."""

    name: str
    kernel: str = ""  # "cudnn/fp32"; "" where nothing was traced
    mode: str = ""  # "forward" or "train": what the benchmark times; its baseline's spread is pooled with its kind's
    failed_kernel: bool = False  # the test failed because the kernel was not the path's claim: not timed
    first: Look = Look()
    counters: Mapping[str, float] = field(default_factory=dict)
    threshold: float | None = None  # the marker's, where one is set
    per_call_s: float | None = None  # the raw medians, for the table and the report
    device_s: float | None = None
    anchor_s: float | None = None
    anchor_kind: str = ""  # where and how it was paired with the anchor (anchor.Pairs.kind): "torch-cpu-backward-warm"


def pairs(values: Sequence[float], anchors: Sequence[float]) -> tuple[float, ...]:
    if len(values) != len(anchors):
        return ()
    return tuple(float(v) / float(a) for v, a in zip(values, anchors, strict=True) if v and a and v > 0 and a > 0)


# --------------------------------------------------------------------------------------------- figures
@dataclass(frozen=True)
class Figure:
    """A median of samples (paired ratios, or raw seconds) and its standard error on the log scale."""

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
    """One recording process of a benchmark, as the baseline keeps it: its figures divided by the anchor and raw,
    the anchor's own time per repetition, its host counts, and its sitting: when the recording command that timed
    it started (ISO 8601; "" where the file does not say: one sitting with every other such process)."""

    per_call: Figure | None
    device: Figure | None
    counters: Mapping[str, float] = field(default_factory=dict)
    per_call_raw: Figure | None = None
    device_raw: Figure | None = None
    anchor_s: float | None = None
    sitting: str = ""

    def get(self, metric: str, variant: str = "anchored") -> Figure | None:
        if variant == "raw":
            return self.per_call_raw if metric == "per-call" else self.device_raw
        return self.per_call if metric == "per-call" else self.device


def run_figures(measurement: Measurement) -> RunFigures:
    """What a recording process contributes to its baseline entry: its figures and host counts."""
    look = measurement.first
    return RunFigures(
        Figure.of(look.per_call),
        Figure.of(look.device),
        measurement.counters,
        Figure.of(look.per_call_raw),
        Figure.of(look.device_raw),
        measurement.anchor_s,
    )


def recording_runs(measurements: Sequence[Measurement]) -> tuple[list[RunFigures], list[str]]:
    """The recording processes of one benchmark as its baseline keeps them, and why any was left out: a process
    whose figure lies more than :data:`OUTLIER_FACTOR` from the median of all of them broke (30x slower in one
    recording on a loaded VM) and is named, never trusted."""
    runs = [run_figures(m) for m in measurements]
    if len(runs) < 3:
        return runs, []
    kept, left_out = [], []
    for i, run in enumerate(runs):
        off = []
        for metric in METRICS:
            for variant in VARIANTS:
                mine = run.get(metric, variant)
                every = [f.value for f in (r.get(metric, variant) for r in runs) if f]
                if mine is None or len(every) < 3:
                    continue
                factor = mine.value / statistics.median(every)
                if not 1 / OUTLIER_FACTOR <= factor <= OUTLIER_FACTOR:
                    off.append(f"{metric}{' (raw)' if variant == 'raw' else ''} {factor:.3g}x the others'")
        if off:
            left_out.append(f"process {i + 1} of {len(runs)} left out: {'; '.join(off)}")
        else:
            kept.append(run)
    if len(kept) < 2:  # no majority: nothing can be trusted more than the rest
        return runs, [f"{len(runs)} recording processes disagree by more than {OUTLIER_FACTOR}x: kept all"]
    return kept, left_out


@dataclass(frozen=True)
class Outlook:
    """What a compare can resolve of one recorded benchmark, judged by the rule of :func:`check` itself: its
    resolution in one compare process against what is recorded now, and the best any compare can reach, with
    :data:`COMPARE_PROCESSES` compared and :data:`RECORD_PROCESSES_MAX` recorded, if the spread stays as estimated
    (Student's t on the degrees of freedom those processes would give it)."""

    name: str
    metric: str
    one: float  # a compare of one process against the processes recorded so far
    now: float  # a compare of compare_processes(goal) processes against the processes recorded so far
    best: float  # a compare of compare_processes(goal) processes against RECORD_PROCESSES_MAX recorded
    processes: int  # recorded so far
    #: its processes lie beyond doubt further apart than its mode's pool (:meth:`Reference.scatters`): judged on
    #: their spread alone, which more processes show
    scatters: bool = False
    #: a compare of :data:`GOAL_PROCESSES` processes against :data:`RECORD_PROCESSES_MAX` recorded: the finest
    #: slowdown ``--lstmperf-resolution`` can buy for it (:func:`unresolved`)
    reach: float = math.inf
    #: how far runs made at different times lie apart in its limit (:meth:`Reference.between_runs`, log scale), and
    #: whether its baseline's sittings measured it (else it is :data:`BETWEEN_RUNS`, assumed)
    between: float = 0.0
    between_measured: bool = False
    #: ``now`` with the between-run term assumed (:data:`BETWEEN_RUNS`): where ``now`` is blind and this is not,
    #: the sittings are what blind it
    assumed: float = math.inf


def resolution(sigma_b: float, m: int, n: int, se: float, metric: str, between: float | None = None) -> float:
    """The smallest slowdown a compare of ``m`` processes (``se``: its own standard error, log scale) resolves
    against ``n`` recorded processes whose figures lie ``sigma_b`` apart (widened, :meth:`Reference.figure`):
    exp(:data:`K_SIGMA` x the standard error of the ratio). :func:`check` and a recording's outlook both use it.
    ``between``: how far runs made at different times lie apart (:meth:`Reference.between_runs`), by default
    :data:`BETWEEN_RUNS`."""
    term = BETWEEN_RUNS.get(metric, 0.0) if between is None else between
    spread = math.hypot(sigma_b * math.sqrt(1 / m + 1 / n), term)
    return _exp(K_SIGMA * math.hypot(se, spread))


def _exp(x: float) -> float:
    """exp(x), or infinity where that overflows: a spread estimated from two processes (one degree of freedom) is
    widened 2,500-fold by Student's t, and a lone benchmark whose two recording processes lay 6% apart resolved
    exp(1,000), which raised OverflowError instead of an inconclusive verdict."""
    return math.exp(x) if x < 700 else math.inf


def compare_processes(goal: float = MAX_LIMIT) -> int:
    """How many processes a compare times a benchmark in at most, for the resolution goal ``goal``
    (``--lstmperf-resolution``): :data:`COMPARE_PROCESSES` where the goal is the 1.5x promise alone,
    :data:`GOAL_PROCESSES` where it is finer (1.10x by default), whatever the reason a benchmark is timed again."""
    return COMPARE_PROCESSES if goal >= MAX_LIMIT else GOAL_PROCESSES


def outlook(
    recorded: Mapping[str, Sequence[Measurement]],
    goal: float = MAX_LIMIT,
    written: Mapping[str, Reference] | None = None,
) -> list[Outlook]:
    """The outlook of every benchmark of a recording (name -> its measurements, one per process), on each metric
    that decides it, for a compare of at most :func:`compare_processes` processes for ``goal``; a benchmark whose
    processes' spread is not known at all resolves nothing (infinity). ``written``: the baseline's entries as
    written, pooled (:func:`pooled`), which a compare will judge against: an update keeps an unchanged entry's
    earlier sitting beside this recording's processes, and how far the sittings lie apart joins its limit, as
    :func:`check` takes it (the Xeon's Keras-on-JAX training step, two sittings 30% apart, resolves 1.66x at
    best); by default this recording's processes alone, one sitting."""
    references = (
        {name: written[name] for name in recorded if name in written}
        if written is not None
        else pooled(
            {
                name: Reference(name, tuple(recording_runs(list(ms))[0]), kernel=ms[0].kernel, mode=ms[0].mode)
                for name, ms in recorded.items()
                if ms
            }
        )
    )
    out = []
    most = compare_processes(goal)
    for name, ref in references.items():
        if not recorded.get(name):
            continue
        for metric in metrics_of(ref, recorded[name][0].first):
            variant = ref.variant(metric)
            term = ref.between_runs(metric, variant)
            figure, between = ref.figure(metric, variant), ref.between(metric, variant)
            if figure is None or between is None:
                out.append(Outlook(name, metric, math.inf, math.inf, math.inf, 0))
                continue
            _, widened, n = figure  # as the compare will judge it, with what is recorded now
            more = max(RECORD_PROCESSES_MAX - n, 0)
            spread = _later_spread(ref, metric, variant)
            ses = [f.se for f in (run.get(metric, variant) for run in ref.runs) if f is not None]
            se = statistics.median(ses) if ses else 0.0
            out.append(
                Outlook(
                    name,
                    metric,
                    one=resolution(widened, 1, n, se, metric, term),
                    now=resolution(spread(most - 1), most, n, se, metric, term),
                    best=resolution(spread(more + most - 1), most, n + more, se, metric, term),
                    processes=n,
                    scatters=ref.scatters(metric, variant),
                    reach=resolution(
                        spread(more + GOAL_PROCESSES - 1),
                        GOAL_PROCESSES,
                        n + more,
                        se / math.sqrt(GOAL_PROCESSES),
                        metric,
                        term,
                    ),
                    between=term,
                    between_measured=(metric, variant) in ref.sittings,
                    assumed=resolution(spread(most - 1), most, n, se, metric),
                )
            )
    return out


def _later_spread(ref: Reference, metric: str, variant: str) -> Callable[[int], float]:
    """extra -> sigma_b as :meth:`Reference.figure` widens it once ``extra`` more processes, compared or recorded,
    lie as far apart as the recorded ones did (each one more degree of freedom): how :func:`outlook` foresees a
    compare."""
    own = ref.own_variance(metric, variant)

    def spread(extra: int) -> float:
        sigma, dof = ref.between(metric, variant, (own[0], extra) if own else None) or (math.inf, 0)
        return sigma * tail_factor(dof)

    return spread


def unresolved_why(recorded: Mapping[str, Sequence[Measurement]], goal: float = MAX_LIMIT) -> dict[str, str]:
    """The benchmarks of a recording (name -> its measurements, one per process) that one process of a compare
    could not see a :data:`MAX_LIMIT` slowdown on, though a compare would see it once both sides have all the
    processes they may take (:data:`RECORD_PROCESSES_MAX` recorded, :func:`compare_processes` compared), judged
    as the compare judges (:func:`outlook`): what hides 1.5x is then how little is known yet (few processes and
    few neighbours: Student's t) or too few processes behind the figure. A recording times them in more
    processes; not those that even the most processes would leave blind (:func:`blind` names them). One whose
    processes lie beyond doubt further apart than its neighbours' (:meth:`Reference.scatters`) has not shown its
    spread yet whatever its forecast: it is judged on its own processes alone, and more processes tell whether it
    scatters (the fifth Xeon's bimodal benchmark) or whether its first ones lay apart by chance.

    With a ``goal`` finer than 1.5x (``--lstmperf-resolution``, 1.10 by default), also those that one compare
    process would not resolve the goal against, where :data:`RECORD_PROCESSES_MAX` recorded would let a compare
    reach it (:attr:`Outlook.reach`): a recording is made once and compared against often, and each process
    recorded spares the compares some (by :func:`resolution`, a benchmark whose processes lie 2.8% apart, the
    16-core Xeon's, reaches 1.10x in five or six compare processes against eight recorded, and in none against
    three).

    Name -> why: "apart" (the promise, its processes lying beyond doubt further apart than its neighbours'),
    "promise", or "goal"."""
    out: dict[str, str] = {}
    for o in outlook(recorded, goal):
        if o.one > MAX_LIMIT and (o.scatters or o.best <= MAX_LIMIT):
            out[o.name] = "apart" if o.scatters else "promise"
        elif goal < MAX_LIMIT and o.one > goal and o.reach <= goal and o.processes < RECORD_PROCESSES_MAX:
            out.setdefault(o.name, "goal")
    return out


def unresolved(recorded: Mapping[str, Sequence[Measurement]], goal: float = MAX_LIMIT) -> list[str]:
    """The names :func:`unresolved_why` gives, sorted: the benchmarks a recording times in one more process."""
    return sorted(unresolved_why(recorded, goal))


@dataclass(frozen=True)
class Blind:
    """A benchmark of a finished recording that no compare will see a :data:`MAX_LIMIT` slowdown on (:func:`blind`)."""

    #: the best resolution a compare reaches, with as many processes as it takes
    resolves: float
    #: how far a compare made at another time lies from the baseline's recordings by chance (log scale), where the
    #: baseline's sittings measured it and it, not the processes, is what blinds the benchmark; else None
    sittings: float | None = None


def blind(
    recorded: Mapping[str, Sequence[Measurement]],
    goal: float = MAX_LIMIT,
    written: Mapping[str, Reference] | None = None,
) -> dict[str, Blind]:
    """The benchmarks of a finished recording that no compare will see a :data:`MAX_LIMIT` slowdown on, not even
    with as many processes as a compare for ``goal`` takes (:func:`compare_processes`): every compare will call
    them inconclusive, which fails the run, unless that run is quieter than the recording's processes were, or,
    where the baseline's sittings blind it (``written``, :func:`outlook`), never."""
    out: dict[str, Blind] = {}
    for o in outlook(recorded, goal, written):
        if o.now > MAX_LIMIT and o.now > (out[o.name].resolves if o.name in out else 0.0):
            by_sittings = o.between_measured and o.assumed <= MAX_LIMIT
            out[o.name] = Blind(o.now, o.between if by_sittings else None)
    return out


def _chi2_median_ratio(dof: int) -> float:
    """The median of chi2(dof)/dof: a median of sample variances with ``dof`` degrees of freedom, divided by
    this, estimates the variance without the bias of taking a median (0.69 for 2 degrees of freedom)."""
    from scipy.stats import chi2

    return float(chi2.median(dof) / dof)


def tail_factor(dof: int) -> float:
    """How much wider than :data:`K_SIGMA` normal standard errors the same one-sided tail lies for a spread
    estimated with ``dof`` degrees of freedom (Student's t): 32x for 2, 1.15x for 32."""
    from scipy.stats import norm, t

    if dof <= 0:
        return math.inf
    return float(t.ppf(norm.cdf(K_SIGMA), dof) / K_SIGMA)


@dataclass(frozen=True)
class Spread:
    """How far independent recording processes lie apart on this machine, for one metric and variant: the
    pooled variance (log scale) of a process's figure, robust to outlying benchmarks, the benchmarks it rests on
    and their degrees of freedom."""

    variance: float
    benchmarks: int
    dof: int = 0

    @property
    def sigma(self) -> float:
        return math.sqrt(self.variance)


@dataclass(frozen=True)
class Reference:
    """A benchmark's baseline: its recording processes (this software's), its kernel, its versions."""

    name: str
    runs: tuple[RunFigures, ...]
    kernel: str = ""
    versions: Mapping[str, str] = field(default_factory=dict)
    mode: str = ""  # "forward" or "train" (a suite's), or a user's own label: what the benchmark times
    anchor_kind: str = ""  # the anchor workload its figures were divided by (anchor.Anchor.kind)
    #: how far recording processes lie apart on this machine, per (metric, variant), pooled over the baseline's
    #: benchmarks of its mode (:func:`pooled`)
    spread: Mapping[tuple[str, str], Spread] = field(default_factory=dict)
    #: how far the means of recordings made at different times (sittings) lie apart beyond their processes, per
    #: (metric, variant), pooled over the baseline's benchmarks of its mode that hold two sittings or more
    #: (:func:`pooled`); absent where none does
    sittings: Mapping[tuple[str, str], Spread] = field(default_factory=dict)

    def variant(self, metric: str) -> str:
        """The figure that decides this benchmark's ``metric``: divided by the anchor, or raw.

        Divided by the anchor wherever there is an anchored figure. How far the recording's processes lie apart
        raw and divided by the anchor does not choose between them for the baseline: those processes ran one after
        another, in one state of the machine, and a compare runs in another. On one 16-core Xeon the three
        processes of a recording lay 2.1% apart raw and 2.2% divided by the anchor, so the baseline chose raw
        time; a clean compare minutes later ran in a slower state (raw times 1.17-1.28x) and 8 of its 11
        benchmarks were called regressed. The one exception is a time per call whose own recording processes say
        beyond doubt (an F test of their two variances at :data:`VARIANT_CONFIDENCE`) that the anchor adds more
        noise than it removes: a time per call follows the host or the GPU by the benchmark's own size, and on the
        H200 a GPU-bound compiled training step lay 1.0% apart raw and 18% divided by the host-bound anchor. Such a
        benchmark is judged raw, on its own processes' spread. A device figure's two variants are both GPU time
        (the anchor's is timed on the same GPU): it is divided by the anchor."""
        if not self._logs(metric, "anchored"):
            return "raw"
        if metric != "per-call":
            return "anchored"
        anchored, raw = self.own_variance(metric, "anchored"), self.own_variance(metric, "raw")
        if anchored is None or raw is None or raw[0] <= 0:
            return "anchored"
        from scipy.stats import f

        if anchored[0] / raw[0] > f.ppf(VARIANT_CONFIDENCE, anchored[1], raw[1]):
            return "raw"
        return "anchored"

    def _logs(self, metric: str, variant: str) -> list[float]:
        return [math.log(f.value) for f in (run.get(metric, variant) for run in self.runs) if f is not None]

    def _sittings(self, metric: str, variant: str) -> list[list[float]]:
        """The processes' log figures, grouped by the sitting that timed them, oldest first."""
        groups: dict[str, list[float]] = {}
        for run in self.runs:
            f = run.get(metric, variant)
            if f is not None:
                groups.setdefault(run.sitting, []).append(math.log(f.value))
        return [groups[k] for k in sorted(groups)]

    def _centre(self, metric: str, variant: str) -> float | None:
        """The mean over its sittings of each sitting's mean log figure (every sitting weighs alike)."""
        groups = self._sittings(metric, variant)
        return statistics.fmean(statistics.fmean(g) for g in groups) if groups else None

    def own_variance(self, metric: str, variant: str | None = None) -> tuple[float, int] | None:
        """(variance, degrees of freedom) of this benchmark's recording processes' figures (log scale) about the
        mean of their own sitting, pooled over its sittings: how far processes of one recording lie apart; None
        where no sitting holds two processes."""
        groups = self._sittings(metric, variant or self.variant(metric))
        dof = sum(len(g) - 1 for g in groups)
        if dof < 1:
            return None
        squares = sum(sum((x - statistics.fmean(g)) ** 2 for x in g) for g in groups)
        return squares / dof, dof

    def _sitting_spread(self, metric: str, variant: str) -> tuple[float, float, int] | None:
        """(variance of its sittings' mean log figures, the part of it their processes explain, degrees of
        freedom); None under two sittings or where no sitting holds two processes."""
        groups = self._sittings(metric, variant)
        own = self.own_variance(metric, variant)
        if len(groups) < 2 or own is None:
            return None
        means = [statistics.fmean(g) for g in groups]
        return statistics.variance(means), statistics.fmean(own[0] / len(g) for g in groups), len(groups) - 1

    def sitting_variance(self, metric: str, variant: str | None = None) -> tuple[float, int] | None:
        """(variance, degrees of freedom) of its sittings' means beyond what their processes explain (log scale):
        how far a recording made at one time lies from one made at another; None under two sittings."""
        spread = self._sitting_spread(metric, variant or self.variant(metric))
        if spread is None:
            return None
        between, within, dof = spread
        return max(between - within, 0.0), dof

    def between_runs(self, metric: str, variant: str | None = None) -> float:
        """How far a compare's figure lies from this baseline's for runs made at different times, beyond the
        processes (log scale): :data:`BETWEEN_RUNS` where no entry of its pool holds two sittings; where some do,
        what they measured (a sitting's own spread: the pool's, moderated towards this entry's own sittings where it
        has two or more, as :meth:`between` moderates processes; at least the one :data:`BETWEEN_RUNS` implies) for
        a compare's sitting against the mean of this entry's sittings."""
        variant = variant or self.variant(metric)
        prior = BETWEEN_RUNS.get(metric, 0.0)
        pool, own = self.sittings.get((metric, variant)), self.sitting_variance(metric, variant)
        if pool is None:
            return prior
        variance = pool.variance
        if own is not None and pool.benchmarks > 1:  # its own sittings, moderated by its pool's (as between())
            weight = min(PRIOR_DOF, pool.benchmarks - 1)
            variance = (own[1] * own[0] + weight * pool.variance) / (own[1] + weight)
        count = max(len(self._sittings(metric, variant)), 1)
        return math.sqrt(max(prior**2 / 2, variance) * (1 + 1 / count))

    def own_spread(self, metric: str, variant: str | None = None) -> float | None:
        own = self.own_variance(metric, variant)
        return math.sqrt(own[0]) if own else None

    @property
    def pool(self) -> str:
        """The benchmarks its spread is pooled with (:func:`pooled`): the suites' forward calls, or their training
        steps (:data:`POOLED_MODES`); a user's own benchmarks, whose mode is a label of the user's choosing
        (``lstmperf_benchmark(label=...)``), pool together with whatever else has no such mode."""
        return self.mode if self.mode in POOLED_MODES else ""

    def scatters(self, metric: str, variant: str | None = None) -> bool:
        """Whether this benchmark's own recording processes say beyond doubt (an F test of its variance against
        its mode's pool at :data:`VARIANT_CONFIDENCE`) that its figures lie further apart than its neighbours':
        the pool is then no prior for it (:meth:`between`). On the fifth 16-core Xeon the oneDNN LSTM at batch 1
        read at two levels, 1.35 and 1.45-2.02, over 8 processes, beside neighbours 1-4% apart; moderated towards
        them its spread read 6.7% after three processes 11% apart, and a compare in the lower level slowed 1.5x
        would have passed. Only a spread that reaches the threshold's scale counts (four of its own standard
        deviations beyond :data:`~pytest_lstmperf.options.THRESHOLD`): within it the threshold decides, whatever
        spread the benchmark is judged on (on the H200 the GPU time of Keras's cuDNN calls lay 0.5% apart beside
        neighbours at 0.2%)."""
        variant = variant or self.variant(metric)
        own, pool = self.own_variance(metric, variant), self.spread.get((metric, variant))
        if own is None or pool is None or pool.benchmarks <= 1 or pool.variance <= 0:
            return False
        if _exp(K_SIGMA * math.sqrt(own[0])) <= THRESHOLD:
            return False
        if variant == "raw" and self._logs(metric, "anchored"):
            return False  # judged raw on its own processes already (:meth:`variant`)
        others = pool.dof - own[1]
        if others <= 0:
            return False
        from scipy.stats import f

        return bool(own[0] / pool.variance > f.ppf(VARIANT_CONFIDENCE, own[1], min(others, POOL_DOF_CAP)))

    def between(
        self, metric: str, variant: str | None = None, compared: tuple[float, int] | None = None
    ) -> tuple[float, int] | None:
        """(sigma, degrees of freedom): the standard deviation (log scale) of one process's figure on this
        machine, this benchmark's own processes' variance moderated by the baseline's pooled one
        (:data:`PRIOR_DOF`), the pool alone where it was recorded in one process and nothing else measured it;
        None where neither is known. Its own spread alone where its processes lie beyond doubt further apart than
        the pool's (:meth:`scatters`).

        ``compared``: (variance, degrees of freedom) of a compare's own processes' figures (log scale), which
        measure the same spread: its own processes are the recording's and the compare's, pooled as a two-sample
        t test pools them. On a 16-core Xeon Keras on JAX's training step lay 9.7% apart over its 8 recording
        processes, judged alone (Student's t on 7 degrees of freedom, 2.1x four normal standard errors): by this
        rule's arithmetic a compare of 8 processes lying as far apart resolves 1.55x judged on the recording's
        processes alone, 1.36x on both sides' 14 degrees of freedom."""
        variant = variant or self.variant(metric)
        recorded = self.own_variance(metric, variant)
        own = recorded
        if compared is not None and compared[1] > 0:
            own = compared if own is None else (
                (own[0] * own[1] + compared[0] * compared[1]) / (own[1] + compared[1]), own[1] + compared[1]
            )  # fmt: skip
        pool = self.spread.get((metric, variant))
        if recorded is not None and variant == "raw" and self._logs(metric, "anchored"):
            pool = None  # judged raw by its own processes (:meth:`variant`): the others' spread is no prior
        pool_dof = min(pool.dof, POOL_DOF_CAP) if pool is not None else 0
        if own is None:
            return (pool.sigma, pool_dof) if pool is not None else None
        variance, dof = own
        if pool is None or pool.benchmarks <= 1 or self.scatters(metric, variant):  # the pool is no prior for it
            return math.sqrt(variance), dof
        prior = min(PRIOR_DOF, pool.benchmarks - 1)
        # the pool's degrees of freedom but this benchmark's own recorded ones
        others = min(pool.dof - (recorded[1] if recorded else 0), POOL_DOF_CAP)
        return math.sqrt((dof * variance + prior * pool.variance) / (dof + prior)), dof + max(others, 0)

    def figure(
        self, metric: str, variant: str | None = None, compared: tuple[float, int] | None = None
    ) -> tuple[float, float, int] | None:
        """(value, sigma_b, n): the geometric mean of the ``n`` processes' figures (a process that broke was left
        out when recorded), and how far one process's figure lies from another's on the log scale, sigma_b from
        :meth:`between` (``compared``: a compare's own processes, which it counts too) widened by
        :func:`tail_factor` of its degrees of freedom. None where there is no figure, or how far processes lie
        apart is not known."""
        variant = variant or self.variant(metric)
        logs = self._logs(metric, variant)
        centre = self._centre(metric, variant)
        if not logs or centre is None:
            return None
        between = self.between(metric, variant, compared)
        if between is None:
            return None
        sigma_b, dof = between
        return math.exp(centre), sigma_b * tail_factor(dof), len(logs)

    def value(self, metric: str, variant: str | None = None) -> float | None:
        """The geometric mean of the processes' figures (of each sitting's, where it has several), noise or none."""
        centre = self._centre(metric, variant or self.variant(metric))
        return math.exp(centre) if centre is not None else None

    def has_figure(self, metric: str) -> bool:
        return bool(self._logs(metric, self.variant(metric)))

    @property
    def anchor_s(self) -> float | None:
        values = [run.anchor_s for run in self.runs if run.anchor_s]
        return statistics.median(values) if values else None


def pooled(references: Mapping[str, Reference]) -> dict[str, Reference]:
    """The references with how far their recording processes lie apart pooled over the benchmarks of their mode
    (forward calls with forward calls, training steps with training steps), per metric and variant.

    The pool is the median of every benchmark's own variance (those recorded in two processes or more), divided
    by the median of chi2(dof)/dof: one benchmark whose processes lie 1.42x apart does not widen the others (a
    root mean square did, to 1.68x on a 16-core host). Each benchmark's own variance is then moderated towards
    its mode's pool (:meth:`Reference.between`). A training step and a forward call do not lie apart alike: on
    the quiet 2-core VM a training step's gate processes lay about 5% apart and the forward calls' about 1%, and
    one pool over both, a median over mostly forward calls, took the training steps' spread as small."""
    out: dict[str, Reference] = {}
    for pool in sorted({ref.pool for ref in references.values()}):
        mine = {name: ref for name, ref in references.items() if ref.pool == pool}
        spread, sittings = _pool(mine.values()), _pool_sittings(mine.values())
        out.update({name: replace(ref, spread=spread, sittings=sittings) for name, ref in mine.items()})
    return {name: out[name] for name in references}


def _pool_sittings(references: Iterable[Reference]) -> dict[tuple[str, str], Spread]:
    """How far sittings lie apart beyond their processes, per metric and variant, over the benchmarks that hold
    two sittings or more: the median of their sittings' means' variances (divided by the median of
    chi2(dof)/dof, as :func:`_pool` does) less the median of what their processes explain of it."""
    references = list(references)
    out: dict[tuple[str, str], Spread] = {}
    for metric in METRICS:
        for variant in VARIANTS:
            rows = [row for ref in references if (row := ref._sitting_spread(metric, variant)) is not None]
            if not rows:
                continue
            dof = int(statistics.median(d for *_, d in rows))
            between = statistics.median(v for v, _, _ in rows) / _chi2_median_ratio(max(dof, 1))
            within = statistics.median(w for _, w, _ in rows)
            out[(metric, variant)] = Spread(max(between - within, 0.0), len(rows), sum(d for *_, d in rows))
    return out


def _pool(references: Iterable[Reference]) -> dict[tuple[str, str], Spread]:
    references = list(references)
    spread: dict[tuple[str, str], Spread] = {}
    for metric in METRICS:
        for variant in VARIANTS:
            own = [v for v in (ref.own_variance(metric, variant) for ref in references) if v is not None]
            if not own:
                continue
            dof = int(statistics.median(d for _, d in own))
            pool = statistics.median(v for v, _ in own) / _chi2_median_ratio(max(dof, 1))
            spread[(metric, variant)] = Spread(pool, len(own), sum(d for _, d in own))
    anchors = []  # how far the anchor's own time lies apart between processes: the bound of comparable()
    for ref in references:
        logs = [math.log(run.anchor_s) for run in ref.runs if run.anchor_s]
        if len(logs) > 1:
            anchors.append((statistics.variance(logs), len(logs) - 1))
    if anchors:
        dof = int(statistics.median(d for _, d in anchors))
        pool = statistics.median(v for v, _ in anchors) / _chi2_median_ratio(max(dof, 1))
        spread[("anchor", "raw")] = Spread(pool, len(anchors), sum(d for _, d in anchors))
    return spread


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
    variant: str = "anchored"
    #: no number of processes of this run can settle it: the baseline's own uncertainty is too large
    settled_by_baseline: bool = False
    #: the slowdown it would resolve with :data:`GOAL_PROCESSES` processes of this run, if their noise and the
    #: baseline's spread stay as estimated: what further processes can buy (``--lstmperf-resolution``)
    best: float | None = None
    #: ... and against :data:`RECORD_PROCESSES_MAX` recorded: what recording it in more processes can buy
    reach: float | None = None
    #: how far runs made at different times lie apart in its limit (:meth:`Reference.between_runs`, log scale)
    between: float | None = None
    #: whether ``between`` was measured from the baseline's sittings (else it is :data:`BETWEEN_RUNS`, assumed)
    between_measured: bool = False

    def text(self) -> str:
        if self.ratio is None:
            return f"{self.metric}: {self.verdict} ({self.note})"
        raw = " (raw time)" if self.variant == "raw" else ""
        text = (
            f"{self.metric}{raw}: {self.verdict} at {self.ratio:.3f}x (limit {self.limit:.3f}, "
            f"resolves {self.resolves:.3f})"
        )
        return f"{text}: {self.note}" if self.note else text


def check(
    metric: str,
    samples: Sequence[float],
    reference: Reference,
    threshold: float,
    variant: str | None = None,
    more: Sequence[Sequence[float]] = (),
) -> Check:
    """``samples`` (this run's, of ``variant``; ``more``: the same benchmark's from further processes of this
    run) against ``reference`` on ``metric`` (rule sentence 2). This run's figure is the geometric mean of its
    processes' figures; its noise is theirs and how far processes lie apart, sigma_b * sqrt(1/m + 1/n) for m
    processes now and n recorded."""
    variant = variant or reference.variant(metric)
    nows = [f for f in (Figure.of(s) for s in (samples, *more)) if f is not None]
    if not nows:
        return Check(metric, "inconclusive", note=f"fewer than {MIN_SAMPLES} paired samples in this run")
    if not reference.has_figure(metric):
        return Check(metric, "inconclusive", note=f"fewer than {MIN_SAMPLES} paired samples in the baseline")
    logs_now = [math.log(f.value) for f in nows]
    compared = (statistics.variance(logs_now), len(logs_now) - 1) if len(logs_now) > 1 else None
    ref = reference.figure(metric, variant, compared)
    if ref is None:
        return Check(
            metric,
            "inconclusive",
            note="recorded in one process and no other benchmark of the baseline measured how far processes lie "
            "apart here: record it again with --lstmperf-update-baseline",
            variant=variant,
        )
    value, sigma_b, recorded = ref
    m = len(nows)
    now_value = math.exp(statistics.fmean(math.log(f.value) for f in nows))
    now_se = math.sqrt(sum(f.se**2 for f in nows)) / m
    term = reference.between_runs(metric, variant)
    sigma_ref = math.hypot(sigma_b * math.sqrt(1 / m + 1 / recorded), term)
    resolves = resolution(sigma_b, m, recorded, now_se, metric, term)
    # each further process as noisy as this run's so far (se shrinks as 1/sqrt(m)), and its figure one more
    # degree of freedom of the spread between processes, which stays as estimated
    most = max(m, GOAL_PROCESSES)
    sigma, dof = reference.between(metric, variant, compared) or (math.nan, 0)
    more_recorded = max(RECORD_PROCESSES_MAX - recorded, 0)
    best = resolution(sigma * tail_factor(dof + most - m), most, recorded, now_se * math.sqrt(m / most), metric, term)
    reach = resolution(
        sigma * tail_factor(dof + most - m + more_recorded),
        most,
        recorded + more_recorded,
        now_se * math.sqrt(m / most),
        metric,
        term,
    )
    limit = max(threshold, resolves)
    ratio = now_value / value
    verdict = "regressed" if ratio > limit else "improved" if ratio < 1 / limit else "unchanged"
    note = f"{m} processes" if m > 1 else ""
    # what no number of this run's processes removes: the recorded processes' share of the spread, and how far runs
    # made at different times lie apart (a benchmark whose sittings lie 30% apart stays blind however long it runs)
    settled = sigma * tail_factor(dof + most - m) * math.sqrt(1 / recorded)
    hopeless = _exp(K_SIGMA * math.hypot(settled, term)) > MAX_LIMIT
    behind = f"its {recorded} recording process{'es' if recorded > 1 else ''}" + (
        f" and this run's {m}" if m > 1 else ""
    )
    if resolves > max(MAX_LIMIT, threshold) and verdict != "regressed":  # blind to 1.5x (and to its threshold)
        verdict = "inconclusive"
        if now_se >= sigma_ref:
            why = (
                f"this run's own noise ({math.exp(now_se) - 1:.1%} per standard error) dominates: rerun on a "
                "quieter machine"
            )
        elif (metric, variant) in reference.sittings and term >= (settled if hopeless else sigma_b * math.sqrt(
            1 / m + 1 / recorded
        )):  # fmt: skip
            own = reference.sitting_variance(metric, variant)
            others = reference.sittings[(metric, variant)].sigma
            apart = f"{math.exp(math.sqrt(own[0])) - 1:.1%} apart for it, " if own else ""
            why = (
                f"its baseline's recordings made at different times lie {apart}"
                f"{math.exp(others) - 1:.1%} for the baseline's {POOL_NAMES[reference.pool]}, so a compare made at "
                f"another time lies {math.exp(term) - 1:.1%} from their mean by chance, more than its processes do: "
                + (
                    "no number of processes settles it; find what moves it from one run to the next on this "
                    "machine, or accept it (--lstmperf-accept-inconclusive)"
                    if hopeless
                    else "rerun on a quieter machine, or record it again at another time (--lstmperf-update-baseline "
                    "keeps both recordings where it judges the entry unchanged)"
                )
            )
        elif reference.scatters(metric, variant):
            pool = reference.spread[(metric, variant)]
            why = (
                f"{behind} lie {math.exp(sigma) - 1:.1%} apart, beyond doubt further than "
                f"the baseline's other {POOL_NAMES[reference.pool]}' ({math.exp(pool.sigma) - 1:.1%}), and are "
                f"judged alone (Student's t on {dof} degree(s) of freedom): "
                + (
                    "record it in more processes (--lstmperf-record-processes) with --lstmperf-update-baseline"
                    if recorded < RECORD_PROCESSES_MAX
                    else "it scatters from process to process on this machine: rerun on a quieter one, or find "
                    "what moves it"
                )
            )
        elif sigma_b > math.log(UNBOUNDED):
            why = (
                f"{behind} lie {math.exp(sigma) - 1:.1%} apart, too few to bound how far "
                f"processes lie apart here (Student's t on {dof} degree(s) of freedom): record it in more processes "
                "(--lstmperf-record-processes) with --lstmperf-update-baseline"
            )
        else:
            why = (
                f"processes lie {_exp(sigma_b) - 1:.1%} apart here (the estimate of the recording's processes"
                f"{' and this run' if m > 1 else ''}, widened for its uncertainty), and {m} process(es) of this run "
                f"and {recorded} recorded leave "
                f"{_exp(sigma_ref) - 1:.1%}: rerun on a quieter machine, or record in more processes "
                "(--lstmperf-record-processes)"
            )
        note = f"cannot see a {MAX_LIMIT}x slowdown here ({why})"
    measured = (metric, variant) in reference.sittings
    return Check(metric, verdict, ratio, limit, resolves, note, variant, hopeless, best, reach, term, measured)


def metrics_of(reference: Reference, look: Look) -> list[str]:
    """The metric that decides (sentence 1): device time where both sides have a device figure, else the time per
    call. On the H100 the time per call of device-bound calls moved up to 1.4x between clean runs whose device
    figures agreed within 2% (the anchor, host-bound, does not follow a GPU's own state): there the device figure
    decides, and the exact host counts hold the host's work."""
    if look.samples("device", reference.variant("device")) and reference.has_figure("device"):
        return ["device"]
    has = look.samples("per-call", reference.variant("per-call")) and reference.has_figure("per-call")
    return ["per-call"] if has else []


def comparable(measurement: Measurement, reference: Reference) -> str | None:
    """Why this run's figures cannot be compared with the baseline's, else None: the anchor workload, which
    touches no recurrent layer, took more than :data:`COMPARABLE_FACTOR` times longer or shorter than when it was
    recorded (or more than its own recording processes lie apart allows, 4 standard errors: on a 16-core Xeon a
    clean run's anchor took 3.36x its recorded time), so the machine is not in the state it was recorded in
    (overloaded, throttled, another machine); or the anchor is another workload than the one recorded beside
    (a baseline recorded with the forward-only CPU anchor, ``torch-cpu``: on the 2-core VM its steps through
    backward took 404 us against 139 us, and every figure would read about a third of its recording, improved
    and blind)."""
    if reference.anchor_kind and measurement.anchor_kind and reference.anchor_kind != measurement.anchor_kind:
        was, kind = reference.anchor_kind, measurement.anchor_kind
        changes = [
            "the CPU anchor now runs its steps through backward" if was == "torch-cpu" else "",
            "a Keras benchmark on a CPU is now timed in its worker, beside an anchor there, without the pipe to it"
            if kind.endswith("-in-worker") and not was.endswith("-in-worker")
            else "",
            "a call on a CPU is now timed after an untimed call of its own, not right after the anchor, which "
            "slowed it by as much as the anchor lasted"
            if WARM_SUFFIX in kind and WARM_SUFFIX not in was and was != "torch-cpu"
            else "",
            "a bf16 or fp16 call on a CPU is now timed beside the anchor run in its own precision, which follows "
            "what moves it between processes"
            if _reduced(kind) and not _reduced(was)
            else "",
        ]
        why = "".join(f": {c}" for c in changes if c)
        return (
            f"not comparable: the anchor workload is another one ({measurement.anchor_kind} now, "
            f"{reference.anchor_kind} when recorded{why}), so figures divided by it are not comparable; record the "
            "baseline again with --lstmperf-update-baseline"
        )
    then, now = reference.anchor_s, measurement.anchor_s
    if not then or not now:
        return None
    factor = now / then
    bound = COMPARABLE_FACTOR
    pool = reference.spread.get(("anchor", "raw"))
    if pool is not None:  # where processes' anchors lie far apart (2x on a 16-core Xeon), the bound takes it in
        widened = pool.sigma * tail_factor(min(pool.dof, POOL_DOF_CAP)) * math.sqrt(1 + 1 / max(len(reference.runs), 1))
        bound = max(bound, _exp(K_SIGMA * widened))
    if 1 / bound <= factor <= bound:
        return None
    return (
        f"not comparable: the anchor workload, which touches no LSTM/GRU layer, took {factor:.3g}x its recorded "
        f"time ({now * 1e6:.4g} us against {then * 1e6:.4g} us): this machine is overloaded, throttled or not the "
        "one recorded; rerun on the machine the baseline was recorded on, quiet"
    )


def _reduced(kind: str) -> bool:
    """Whether an anchor's kind says it ran in a CPU call's reduced precision (:meth:`..anchor.Anchor.in_precision`)."""
    return any(f"-{precision}" in kind for precision in REDUCED_PRECISIONS)


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
    processes: int = 1  # processes of this run behind its figures
    #: the anchor's time per repetition now against its recorded one: how far the machine's state moved
    anchor_move: float | None = None

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

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "verdict": self.verdict,
            "kernel_then": self.kernel_then,
            "kernel_now": self.kernel_now,
            "checks": [c.__dict__ for c in self.checks],
            "notes": list(self.notes),
            "anchor_move": self.anchor_move,
        }


def decide(
    measurement: Measurement,
    reference: Reference | None,
    threshold: float = THRESHOLD,
    more: Sequence[Measurement] = (),
) -> Decision:
    """One benchmark against its reference (rule sentences 2 and 3): the most severe check wins. ``more`` holds
    the same benchmark measured in further processes of this run (:func:`undecided` says which get them)."""
    from ..observation.claims import same_kernel

    name, now = measurement.name, measurement.kernel
    if reference is None:
        return Decision(name, "new", kernel_now=now)
    then = reference.kernel
    base = Decision(name, "unchanged", kernel_then=then, kernel_now=now, per_call_s=measurement.per_call_s,
                    device_s=measurement.device_s, runs=len(reference.runs))  # fmt: skip
    state = measurement.anchor_s / reference.anchor_s if measurement.anchor_s and reference.anchor_s else None
    base = replace(base, processes=1 + len(more), anchor_move=state)
    if measurement.failed_kernel:
        return replace(base, verdict="kernel-changed", notes=("the kernel differs from the path's claim: not timed",))
    limit = measurement.threshold or threshold
    look = measurement.first
    checks = [
        check(
            m,
            look.samples(m, reference.variant(m)),
            reference,
            limit,
            more=[x.first.samples(m, reference.variant(m)) for x in more],
        )
        for m in metrics_of(reference, look)
    ]
    notes = [
        f"{m}: not compared: the baseline has this figure, this run has none"
        for m in METRICS
        if reference.has_figure(m) and not look.samples(m, reference.variant(m))
    ]
    elsewhere = comparable(measurement, reference)
    if elsewhere and checks:
        checks = [replace(c, verdict="inconclusive", note=elsewhere) for c in checks]
    if not checks:
        if not any(run.per_call or run.device or run.per_call_raw for run in reference.runs):
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


def undecided(decision: Decision, goal: float = MAX_LIMIT) -> bool:
    """Whether one more process of this run could change ``decision``: a timing check that could not see a
    1.5x slowdown (inconclusive on noise), or would miss it more than one run in 20 where more processes would
    make it sure (:func:`_unsure`), or called a slowdown on one process (confirmed, or not, by one more
    before it fails the build). A kernel or host-work change, or a run not comparable, is decided already. With
    a ``goal`` finer than 1.5x (``--lstmperf-resolution``), also a check that resolves a coarser slowdown than the
    goal where :data:`GOAL_PROCESSES` processes would bring it there (:attr:`Check.best`): more processes buy
    nothing where the baseline's own processes are too few (:func:`short_of` names those)."""
    timed = [c for c in decision.checks if c.metric in METRICS and not c.note.startswith("not comparable")]
    if any(c.metric not in METRICS and c.verdict != "unchanged" for c in decision.checks):
        return False
    confirm = decision.processes == 1  # a slowdown seen on one process is confirmed (or not) on one more
    return any(
        (c.verdict == "regressed" and confirm)
        or (c.verdict == "inconclusive" and c.ratio is not None and not c.settled_by_baseline)
        or (
            c.verdict in ("unchanged", "improved")
            and (_unsure(c) or (goal < MAX_LIMIT and _short(c, goal) == "processes"))
        )
        for c in timed
    )


def for_the_goal(decision: Decision, goal: float) -> bool:
    """Whether ``decision`` has a check that resolves a coarser slowdown than ``goal`` where further processes of
    this run would bring it there: what the run says it times a benchmark again for (:func:`undecided`)."""
    return goal < MAX_LIMIT and any(
        c.metric in METRICS and c.verdict in ("unchanged", "improved") and _short(c, goal) == "processes"
        for c in decision.checks
    )


def _unsure(check: Check) -> bool:
    """Whether ``check`` sees a 1.5x slowdown by the rule but would miss it more than one run in 20 (it resolves a
    coarser slowdown than :data:`SURE_LIMIT`), where :data:`GOAL_PROCESSES` processes of this run would bring it
    there (:attr:`Check.best`)."""
    return (
        check.resolves is not None
        and check.resolves > SURE_LIMIT
        and check.best is not None
        and check.best <= SURE_LIMIT
    )


def _short(check: Check, goal: float) -> str:
    """Why ``check`` resolves a coarser slowdown than ``goal``: "" where it does not, "processes" where further
    processes of this run would bring it there, "baseline" where they would not (the recording's processes are
    too few, or lie too far apart)."""
    if check.resolves is None or check.resolves <= goal:
        return ""
    return "processes" if check.best is not None and check.best <= goal else "baseline"


def short_of(decisions: Iterable[Decision], goal: float) -> list[tuple[Decision, Check, str]]:
    """The compared checks that resolve a coarser slowdown than ``goal`` (``--lstmperf-resolution``), each with
    its benchmark's decision and why (:func:`_short`): "processes" or "baseline"."""
    return [
        (d, c, why)
        for d in decisions
        if d.verdict in COMPARED
        for c in d.checks
        if c.metric in METRICS and (why := _short(c, goal))
    ]


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
        """Compared benchmarks whose baseline rests on one recording process: their spread is the pool's alone."""
        return [d.name for d in self.decisions if d.verdict in COMPARED and d.runs == 1]

    def resolutions(self) -> list[float]:
        """The slowdown each compared benchmark's deciding check resolves."""
        return [c.resolves for d in self.decisions if d.verdict in COMPARED for c in d.checks if c.resolves]

    def summary(self) -> str:
        parts = [f"{self.count(v)} {v}" for v in VERDICTS if self.count(v)]
        return ", ".join(parts) or "nothing compared"


def _median(values: Sequence[float]) -> float | None:
    vals = [float(v) for v in values if v]
    return statistics.median(vals) if vals else None


def between_text(checks: Iterable[Check]) -> str:
    """How far runs made at different times lie apart in these time-per-call checks' limits, as a run prints it:
    one figure where they share it, the range where a baseline's sittings measured it per pool ("1.3%-3.9%"), and
    whether it was measured or assumed (:data:`BETWEEN_RUNS`: no entry of the pool holds two sittings)."""
    per_call = [c for c in checks if c.metric == "per-call" and c.between is not None]
    terms = sorted({round(c.between, 3) for c in per_call if c.between is not None})
    if not terms:
        terms = [round(BETWEEN_RUNS["per-call"], 3)]
    figure = f"{terms[0]:.1%}" if len(terms) == 1 else f"{terms[0]:.1%}-{terms[-1]:.1%}"
    measured = sum(c.between_measured for c in per_call)
    if measured and measured == len(per_call):
        return f"{figure}, measured from the baseline's recordings made at different times"
    how = (
        "assumed"
        if not measured
        else "measured where the baseline's entries hold recordings made at two times, else assumed"
    )
    return (
        f"{figure}, {how}: an --lstmperf-update-baseline run at another time, judged unchanged, keeps both "
        "recordings and measures it"
    )
