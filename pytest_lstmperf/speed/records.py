"""The speed gate's records and their JSON, in one place: every key of a record, a baseline entry or a baseline
file is read and written here, and nowhere else.

* :class:`BenchRecord`: what one benchmark measured in one process. A benchmark attaches it to its test report as
  a plain dict (:meth:`BenchRecord.to_json`), which is also how it travels: from a pytest-xdist worker to the
  controller in the report's ``user_properties`` (key :data:`RECORD_KEY`), and from a recording process to its
  recording command in ``records.json``. :meth:`BenchRecord.from_json` reads it back on the other side. Its
  ``extra_info`` is pytest-benchmark's own free-form dict; the properties of :class:`BenchRecord` are the one
  reader of the fields this plugin puts there.
* :class:`BaselineEntry`: one benchmark of a baseline file, in pytest-benchmark's layout with its ``lstmperf``
  part (:class:`EntryPart`: versions, kernel, recording runs, history).
* :class:`BaselineDocument`: a whole baseline file, its ``lstmperf`` section (:class:`BaselineSection`) and
  pytest-benchmark's header (:class:`Header`); :data:`FORMAT` is the section's version, and
  :func:`parse_baseline` reads every format this version knows (format 1 migrated: :func:`migrate_format_1`).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TypedDict

from ..device import HARDWARE_FIELDS, hardware_key
from .policy import DEVICE_METHODS, Figure, Look, Measurement, RunFigures, pairs
from .timing import batch_medians

#: version of a baseline file's ``lstmperf`` section; bump when its meaning changes (and migrate the older one)
FORMAT = 2
#: the ``user_properties`` key a benchmark's record travels under (pytest-xdist worker to controller)
RECORD_KEY = "lstmperf_bench"
#: in a record's ``timed_by``: timed under pytest-xdist in a run that compares and records nothing, so without the
#: machine lock (:func:`..hooks.gate_context.judges`)
BESIDE_OTHER_TESTS = "beside the other workers' tests"

#: a JSON object as :mod:`json` reads it
JSONObject = Mapping[str, object]


class AnchorInfo(TypedDict, total=False):
    """A record's ``extra_info.anchor``, as the runner writes it (:class:`Anchor` reads it)."""

    kind: str
    repeat: int
    samples: list[float]
    per_call_s: float | None
    device_samples: list[float]
    device_pairing: str  # alternating (each device sample followed by one of the anchor's) or after


class MeasuredInfo(TypedDict, total=False):
    """Every field the runner (:mod:`.runner`) writes into a benchmark's ``extra_info``, pytest-benchmark's free-form
    dict, typed: a key misspelt or a value of the wrong type where it is written is a mypy error. The
    properties of :class:`BenchRecord` read them back."""

    # what was benchmarked
    path: str  # ``user`` for a user's own benchmark
    framework: str
    device: str
    mode: str
    shape: str
    spec: dict[str, object]
    set: str
    sweeps: list[str]
    expected_kernel: str
    expected_precision: str
    # what one traced call ran
    kernel: str
    precision: str
    kernels: list[str]
    ops: list[str]
    kernel_note: str
    known_finding: str
    # how it was timed
    phase_s: dict[str, float]
    timer: str
    timed_by: str
    not_judged: str  # why it was measured for the report alone (:data:`.runner.NOT_JUDGED`)
    rounds: int
    anchor: AnchorInfo
    time_per_call_s: float | None
    host_overhead: float | None
    run_medians: list[float]
    device_time_s: float | None
    device_time_method: str
    device_time_note: str
    device_samples: list[float]
    device_run_medians: list[float]
    device_dispatch_share: float
    host_counters: dict[str, object]
    host_counters_note: str
    flops: float
    flops_per_s: float | None
    peak_flops: float | None
    peak_fraction: float | None


# ------------------------------------------------------------------------------------------- reading helpers
def _obj(value: object) -> JSONObject:
    return value if isinstance(value, Mapping) else {}


def _number(value: object) -> float | None:
    """A JSON number as it was read (an int stays one, so that a file written back holds what it held)."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _text(value: object, default: str = "") -> str:
    return value if isinstance(value, str) else default


def _optional_text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _numbers(value: object) -> tuple[float, ...]:
    if not isinstance(value, (list, tuple)):
        return ()
    return tuple(v for v in value if isinstance(v, (int, float)) and not isinstance(v, bool))


def _counts(value: object) -> dict[str, float]:
    """Host counts per call: name -> count (a non-numeric value, a note, is not a count)."""
    out: dict[str, float] = {}
    for k, v in _obj(value).items():
        number = _number(v)
        if number is not None:
            out[str(k)] = number
    return out


def _strings(value: object) -> dict[str, str]:
    return {str(k): str(v) for k, v in _obj(value).items()}


def _median(values: Iterable[float]) -> float | None:
    vals = [float(v) for v in values if v]
    return statistics.median(vals) if vals else None


# ------------------------------------------------------------------------------------------- the record
@dataclass(frozen=True)
class Anchor:
    """The anchor workload timed beside a benchmark: its kind, repetitions, samples (seconds per repetition, one
    per round) and device samples."""

    kind: str = ""
    repeat: int | None = None
    samples: tuple[float, ...] = ()
    device_samples: tuple[float, ...] = ()
    per_call_s: float | None = None

    @classmethod
    def from_json(cls, raw: object) -> Anchor:
        part = _obj(raw)
        repeat = _number(part.get("repeat"))
        return cls(
            kind=_text(part.get("kind")),
            repeat=int(repeat) if repeat else None,
            samples=_numbers(part.get("samples")),
            device_samples=_numbers(part.get("device_samples")),
            per_call_s=_number(part.get("per_call_s")),
        )


@dataclass(frozen=True)
class BenchRecord:
    """What one benchmark measured in one process: pytest-benchmark's fields of a benchmark, its samples (seconds
    per call, one per round), the marker's threshold and why it failed (``kernel``: not the path's claim, not
    timed). The properties read the fields this plugin keeps in ``extra_info``."""

    fullname: str
    name: str = ""
    group: str | None = None
    param: str | None = None
    params: JSONObject | None = None
    extra_info: JSONObject = field(default_factory=dict)
    options: JSONObject = field(default_factory=dict)
    data: tuple[float, ...] = ()
    iterations: int = 1
    threshold: float | None = None  # the lstmperf_threshold marker's ratio, where one is set
    failed: str = ""

    @classmethod
    def from_json(cls, raw: JSONObject) -> BenchRecord:
        """A record as :meth:`to_json` wrote it (a worker's, a recording process's)."""
        fullname = str(raw["fullname"])
        params = raw.get("params")
        iterations = _number(raw.get("iterations"))
        return cls(
            fullname=fullname,
            name=_text(raw.get("name")) or fullname.rsplit("::", 1)[-1],
            group=_optional_text(raw.get("group")),
            param=_optional_text(raw.get("param")),
            params=dict(_obj(params)) if params is not None else None,
            extra_info=dict(_obj(raw.get("extra_info"))),
            options=dict(_obj(raw.get("options"))),
            data=_numbers(raw.get("data")),
            iterations=int(iterations) if iterations else 1,
            threshold=_number(_obj(raw.get("thresholds")).get("ratio")),
            failed=_text(raw.get("failed")),
        )

    def to_json(self) -> dict[str, object]:
        """The plain dict a benchmark attaches to its report (JSON- and execnet-safe)."""
        return {
            "fullname": self.fullname,
            "name": self.name,
            "group": self.group,
            "param": self.param,
            "params": None if self.params is None else dict(self.params),
            "extra_info": dict(self.extra_info),
            "options": dict(self.options),
            "data": list(self.data),
            "iterations": self.iterations,
            "thresholds": {} if self.threshold is None else {"ratio": self.threshold},
            "failed": self.failed,
        }

    # --- what this plugin keeps in extra_info
    def _info(self, key: str) -> object:
        return self.extra_info.get(key)

    @property
    def path(self) -> str:
        """The execution path (``user`` for a user's own benchmark), ``?`` where none is recorded."""
        return _text(self._info("path"), "?")

    @property
    def framework(self) -> str:
        """The path's framework (``torch``, ``keras-torch``, ...), empty where none is recorded."""
        return _text(self._info("framework"))

    @property
    def expected_kernel(self) -> str:
        """The kernel family the path claims for this benchmark, empty where none is recorded."""
        return _text(self._info("expected_kernel"))

    @property
    def device(self) -> str:
        return _text(self._info("device"), "?")

    @property
    def mode(self) -> str:
        return _text(self._info("mode"), "?")

    @property
    def shape(self) -> str:
        """The suite's shape id (``-`` for a user's own benchmark), ``""`` where none is recorded."""
        return _text(self._info("shape"))

    @property
    def kernel(self) -> str:
        return _text(self._info("kernel"))

    @property
    def precision(self) -> str:
        return _text(self._info("precision"))

    @property
    def kernel_text(self) -> str:
        """``cudnn/fp32``: the kernel and precision that ran; ``""`` where nothing was traced."""
        return kernel_text(self.extra_info)

    @property
    def time_per_call_s(self) -> float | None:
        return _number(self._info("time_per_call_s"))

    @property
    def device_time_s(self) -> float | None:
        return _number(self._info("device_time_s"))

    @property
    def device_time_method(self) -> str:
        return _text(self._info("device_time_method"))

    @property
    def device_time_note(self) -> str:
        return _text(self._info("device_time_note"))

    @property
    def device_samples(self) -> tuple[float, ...]:
        return _numbers(self._info("device_samples"))

    @property
    def host_overhead(self) -> float | None:
        return _number(self._info("host_overhead"))

    @property
    def host_counters(self) -> dict[str, float]:
        return _counts(self._info("host_counters"))

    @property
    def anchor(self) -> Anchor:
        return Anchor.from_json(self._info("anchor"))

    @property
    def flops_per_s(self) -> float | None:
        return _number(self._info("flops_per_s"))

    @property
    def peak_fraction(self) -> float | None:
        return _number(self._info("peak_fraction"))

    @property
    def timed_by(self) -> str:
        """Who timed it where pytest-benchmark did not (under pytest-xdist); ``""`` otherwise."""
        return _text(self._info("timed_by"))

    @property
    def phase_s(self) -> dict[str, float]:
        """Wall seconds of the benchmark's phases (prepare, trace, rounds, ...)."""
        return {str(k): float(v) for k, v in _obj(self._info("phase_s")).items() if isinstance(v, (int, float))}

    @property
    def sweeps(self) -> tuple[str, ...]:
        """The suite's sweeps the benchmark's shape belongs to."""
        sweeps = self._info("sweeps")
        return tuple(str(s) for s in sweeps) if isinstance(sweeps, list) else ()

    def spec_size(self, name: str) -> int | None:
        """A size of the layer's spec (``batch``, ``seq_len``, ``hidden_size``), None where it has none."""
        value = _number(_obj(self._info("spec")).get(name))
        return int(value) if value is not None else None

    def with_swept(self, data: Sequence[float], anchors: Sequence[float], swept: JSONObject) -> BenchRecord:
        """This record with the sweep's paired samples as its figure (:mod:`.sweep`): ``data`` (seconds per call)
        and the anchor's samples beside them, ``swept`` (what the sweep did) kept in ``extra_info.swept``; an empty
        ``data`` keeps the samples and records only ``swept`` (why it could not sweep)."""
        extra: dict[str, object] = {**self.extra_info, "swept": dict(swept)}
        if not data:
            return replace(self, extra_info=extra)
        anchor = dict(_obj(self.extra_info.get("anchor")))
        anchor.update(samples=[float(a) for a in anchors], per_call_s=statistics.median(anchors))
        extra.update(
            anchor=anchor,
            rounds=len(data),
            time_per_call_s=statistics.median(data),
            run_medians=batch_medians(list(data)),
        )
        return replace(
            self, data=tuple(float(d) for d in data), extra_info=extra, options={**self.options, "rounds": len(data)}
        )

    def with_time_per_call(self, seconds: float | None) -> BenchRecord:
        """This record with ``time_per_call_s`` set where it has none (a benchmark read back from a file)."""
        if self.time_per_call_s is not None or seconds is None:
            return self
        return replace(self, extra_info={**self.extra_info, "time_per_call_s": seconds})

    # --- what the rule (:mod:`.policy`) reads of it
    def look(self) -> Look:
        """The paired ratios of this record: call / anchor, round by round, and device time / the anchor's device
        time, sample by sample; and the raw samples beside them."""
        data, anchor = self.data, self.anchor
        device = self.device_samples if self.device_time_method in DEVICE_METHODS else ()
        return Look(
            per_call=pairs(data, anchor.samples),
            device=pairs(device, anchor.device_samples),
            per_call_raw=tuple(float(v) for v in data if v and v > 0),
            device_raw=tuple(float(v) for v in device if v and v > 0),
        )

    def measurement(self) -> Measurement:
        """This record as the rule judges it."""
        anchor = self.anchor
        return Measurement(
            name=self.fullname,
            kernel=self.kernel_text,
            mode=_text(self._info("mode")),
            failed_kernel=self.failed == "kernel",
            first=self.look(),
            counters=self.host_counters,
            threshold=self.threshold,
            per_call_s=_median(self.data),
            device_s=self.device_time_s,
            anchor_s=anchor.per_call_s or _median(anchor.samples),
            anchor_kind=anchor.kind,
        )


def dump_records(records: Iterable[BenchRecord]) -> str:
    """Records as a recording process hands them to its recording command (``records.json``)."""
    return json.dumps([r.to_json() for r in records])


def load_records(text: str) -> list[BenchRecord]:
    """What :func:`dump_records` wrote."""
    raw = json.loads(text)
    return [BenchRecord.from_json(r) for r in raw if isinstance(r, Mapping)] if isinstance(raw, list) else []


def kernel_text(extra_info: JSONObject) -> str:
    """``kernel/precision`` of a record's or an entry's ``extra_info``; ``""`` where no kernel was traced."""
    kernel = extra_info.get("kernel")
    return f"{kernel}/{extra_info.get('precision', '')}" if kernel else ""


# ------------------------------------------------------------------------------------------- baseline entries
def run_to_json(run: RunFigures) -> dict[str, object]:
    """One recording process of an entry, as the baseline file keeps it."""

    def one(f: Figure | None) -> dict[str, float] | None:
        return None if f is None else {"value": f.value, "se": f.se, "n": f.n}

    out: dict[str, object] = {
        "per_call": one(run.per_call),
        "device": one(run.device),
        "host_counters": dict(run.counters),
    }
    if run.per_call_raw is not None or run.device_raw is not None:
        out.update(per_call_raw=one(run.per_call_raw), device_raw=one(run.device_raw))
    if run.anchor_s is not None:
        out["anchor_s"] = run.anchor_s
    if run.sitting:
        out["sitting"] = run.sitting
    return out


def run_from_json(raw: object) -> RunFigures:
    def one(f: object) -> Figure | None:
        if not isinstance(f, Mapping):
            return None
        value, se, n = _number(f.get("value")), _number(f.get("se")), _number(f.get("n"))
        return Figure(value, se, int(n)) if value is not None and se is not None and n is not None else None

    part = _obj(raw)
    anchor = _number(part.get("anchor_s"))
    return RunFigures(
        one(part.get("per_call")),
        one(part.get("device")),
        _counts(part.get("host_counters")),
        one(part.get("per_call_raw")),
        one(part.get("device_raw")),
        anchor if anchor else None,
        _text(part.get("sitting")),
    )


@dataclass(frozen=True)
class HistoryPoint:
    """What an entry's figures were under earlier versions (kept when newer versions replaced them)."""

    versions: Mapping[str, str]
    date: str | None
    kernel: str
    per_call_s: float | None  # raw median time per call
    device_s: float | None
    per_call: float | None  # the anchored figures
    device: float | None

    @classmethod
    def from_json(cls, raw: object) -> HistoryPoint:
        part = _obj(raw)
        return cls(
            _strings(part.get("versions")),
            _optional_text(part.get("date")),
            _text(part.get("kernel")),
            _number(part.get("per_call_s")),
            _number(part.get("device_s")),
            _number(part.get("per_call")),
            _number(part.get("device")),
        )

    def to_json(self) -> dict[str, object]:
        return {
            "versions": dict(self.versions),
            "date": self.date,
            "kernel": self.kernel,
            "per_call_s": self.per_call_s,
            "device_s": self.device_s,
            "per_call": self.per_call,
            "device": self.device,
        }


@dataclass(frozen=True)
class EntryPart:
    """A baseline entry's ``lstmperf`` part: the software versions it was recorded with, its kernel, its
    recording processes' figures, the history of earlier versions' figures, and the processes left out."""

    versions: Mapping[str, str] = field(default_factory=dict)
    kernel: str = ""
    runs: tuple[RunFigures, ...] = ()
    history: tuple[HistoryPoint, ...] = ()
    left_out: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, raw: object) -> EntryPart:
        part = _obj(raw)
        runs, history, left_out = part.get("runs"), part.get("history"), part.get("left_out")
        return cls(
            versions=_strings(part.get("versions")),
            kernel=_text(part.get("kernel")),
            runs=tuple(run_from_json(r) for r in runs) if isinstance(runs, list) else (),
            history=tuple(HistoryPoint.from_json(h) for h in history) if isinstance(history, list) else (),
            left_out=tuple(str(x) for x in left_out) if isinstance(left_out, list) else (),
        )

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "versions": dict(self.versions),
            "kernel": self.kernel,
            "runs": [run_to_json(r) for r in self.runs],
            "history": [h.to_json() for h in self.history],
        }
        if self.left_out:
            out["left_out"] = list(self.left_out)
        return out


_ENTRY_KEYS = ("group", "name", "fullname", "params", "param", "extra_info", "options", "stats", "recorded", "lstmperf")


@dataclass(frozen=True)
class BaselineEntry:
    """One benchmark of a baseline file (or of pytest-benchmark's JSON): pytest-benchmark's fields, its statistics
    with every sample (``stats``), the provenance of the run that recorded it and its ``lstmperf`` part (None in
    pytest-benchmark's JSON written under pytest-xdist). Keys this version does not know are kept as they were."""

    fullname: str
    name: str = ""
    group: str | None = None
    params: JSONObject | None = None
    param: str | None = None
    extra_info: JSONObject = field(default_factory=dict)
    options: JSONObject = field(default_factory=dict)
    stats: JSONObject = field(default_factory=dict)
    recorded: JSONObject | None = None
    part: EntryPart | None = None
    other: JSONObject = field(default_factory=dict)

    @classmethod
    def from_json(cls, raw: JSONObject) -> BaselineEntry:
        params, recorded, part = raw.get("params"), raw.get("recorded"), raw.get("lstmperf")
        fullname = str(raw["fullname"])
        return cls(
            fullname=fullname,
            name=_text(raw.get("name")) or fullname.rsplit("::", 1)[-1],
            group=_optional_text(raw.get("group")),
            params=dict(_obj(params)) if params is not None else None,
            param=_optional_text(raw.get("param")),
            extra_info=dict(_obj(raw.get("extra_info"))),
            options=dict(_obj(raw.get("options"))),
            stats=dict(_obj(raw.get("stats"))),
            recorded=dict(_obj(recorded)) if recorded is not None else None,
            part=EntryPart.from_json(part) if part is not None else None,
            other={k: v for k, v in raw.items() if k not in _ENTRY_KEYS},
        )

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "group": self.group,
            "name": self.name,
            "fullname": self.fullname,
            "params": None if self.params is None else dict(self.params),
            "param": self.param,
            "extra_info": dict(self.extra_info),
            "options": dict(self.options),
            "stats": dict(self.stats),
        }
        if self.recorded is not None:
            out["recorded"] = dict(self.recorded)
        if self.part is not None:
            out["lstmperf"] = self.part.to_json()
        out.update(self.other)
        return out

    @property
    def samples(self) -> tuple[float, ...]:
        """Every sample (seconds per call, one per round): ``stats.data``."""
        return _numbers(self.stats.get("data"))

    @property
    def lstmperf(self) -> EntryPart:
        """The ``lstmperf`` part, empty where the entry has none."""
        return self.part if self.part is not None else EntryPart()

    @property
    def recorded_date(self) -> str | None:
        return _optional_text(_obj(self.recorded).get("date"))

    @property
    def path(self) -> str | None:
        """The execution path the entry was recorded on (``extra_info.path``)."""
        return _optional_text(self.extra_info.get("path"))

    @property
    def device_time_s(self) -> float | None:
        return _number(self.extra_info.get("device_time_s"))

    @property
    def anchor_repeat(self) -> int | None:
        """The anchor repetitions the entry was timed with."""
        return Anchor.from_json(self.extra_info.get("anchor")).repeat

    def as_record(self) -> BenchRecord:
        """The entry as a record of the run that measured it (a report drawn from saved results), its time per
        call the median of its samples where ``extra_info`` lacks it."""
        record = BenchRecord(
            fullname=self.fullname,
            name=self.name,
            group=self.group,
            param=self.param,
            params=self.params,
            extra_info=self.extra_info,
            options=self.options,
            data=self.samples,
        )
        return record.with_time_per_call(_median(self.samples) or _number(self.stats.get("median")))


def records_from_benchmark_json(data: object) -> list[BenchRecord]:
    """The records of a pytest-benchmark JSON document written with this plugin active (a ``--benchmark-json``
    file, a baseline file): its benchmarks that name their path."""
    benchmarks = _obj(data).get("benchmarks")
    if not isinstance(benchmarks, list):
        return []
    entries = [BaselineEntry.from_json(b) for b in benchmarks if isinstance(b, Mapping) and "fullname" in b]
    return [e.as_record() for e in entries if "path" in e.extra_info]


def entries_from_benchmark_json(data: object) -> list[BaselineEntry]:
    """Every benchmark of a pytest-benchmark JSON document."""
    benchmarks = _obj(data).get("benchmarks")
    if not isinstance(benchmarks, list):
        return []
    return [BaselineEntry.from_json(b) for b in benchmarks if isinstance(b, Mapping) and "fullname" in b]


def device_key_of(data: object) -> str:
    """The device key of a pytest-benchmark JSON document written with this plugin active, ``""`` without one."""
    return _text(_obj(_obj(data).get("lstmperf")).get("device_key"))


def entry_stats(statistics: JSONObject, data: Sequence[float], iterations: int) -> dict[str, object]:
    """An entry's ``stats``: pytest-benchmark's statistics of ``data`` with every sample and the iterations."""
    return {**statistics, "data": list(data), "iterations": iterations}


def recorded_of(provenance: JSONObject) -> dict[str, object]:
    """What an entry keeps of the provenance of the run that recorded it."""
    return {k: provenance.get(k) for k in ("commit", "dirty", "date", "machine")}


def date_of(provenance: JSONObject) -> str | None:
    """When the run of ``provenance`` ran (ISO 8601)."""
    return _optional_text(provenance.get("date"))


# ------------------------------------------------------------------------------------------- baseline files
@dataclass(frozen=True)
class Header:
    """pytest-benchmark's part of its JSON: the machine and commit info and its version."""

    machine_info: JSONObject = field(default_factory=dict)
    commit_info: JSONObject = field(default_factory=dict)
    version: str | None = None

    @classmethod
    def from_json(cls, raw: JSONObject) -> Header:
        return cls(
            dict(_obj(raw.get("machine_info"))), dict(_obj(raw.get("commit_info"))), _optional_text(raw.get("version"))
        )


@dataclass(frozen=True)
class BaselineSection:
    """A baseline file's ``lstmperf`` section: the format, the hardware fields that key it, the device's
    fingerprint, and the provenance of the run that created it and of the one that last updated it."""

    hardware: Mapping[str, str]
    fingerprint: JSONObject = field(default_factory=dict)
    created: JSONObject = field(default_factory=dict)
    updated: JSONObject = field(default_factory=dict)
    format: int = FORMAT
    migrated_from: int | None = None  # the older format it was read from (in memory only)

    @property
    def device_key(self) -> str:
        return hardware_key(self.hardware)

    @property
    def updated_date(self) -> str:
        return _text(self.updated.get("date"))

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "format": self.format,
            "device_key": self.device_key,
            "hardware": dict(self.hardware),
            "fingerprint": dict(self.fingerprint),
            "created": dict(self.created),
            "updated": dict(self.updated),
        }
        if self.migrated_from is not None:
            out["migrated_from"] = self.migrated_from
        return out


@dataclass(frozen=True)
class BaselineDocument:
    """A baseline file: pytest-benchmark's JSON (header, entries, date) with the ``lstmperf`` section."""

    section: BaselineSection
    entries: Mapping[str, BaselineEntry]
    header: Header = Header()
    datetime: str | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "machine_info": dict(self.header.machine_info),
            "commit_info": dict(self.header.commit_info),
            "benchmarks": [self.entries[name].to_json() for name in sorted(self.entries)],
            "datetime": self.datetime,
            "version": self.header.version,
            "lstmperf": self.section.to_json(),
        }

    def dumps(self) -> str:
        """The file's text."""
        return json.dumps(self.to_json(), indent=1, sort_keys=False, default=str) + "\n"


def run_section(
    hardware: Mapping[str, str],
    versions: Mapping[str, str],
    fingerprint: JSONObject,
    provenance: JSONObject,
) -> dict[str, object]:
    """The ``lstmperf`` section of pytest-benchmark's JSON of a run (``--benchmark-json``): the format, the
    hardware that keys it, the software versions, the fingerprint and the run's provenance."""
    return {
        "format": FORMAT,
        "device_key": hardware_key(hardware),
        "hardware": dict(hardware),
        "versions": dict(versions),
        "fingerprint": dict(fingerprint),
        "provenance": dict(provenance),
    }


def machine_info_section(hardware: Mapping[str, str], fingerprint: JSONObject) -> dict[str, object]:
    """The ``lstmperf`` part of pytest-benchmark's machine info: the device key and fingerprint."""
    return {"device_key": hardware_key(hardware), "fingerprint": dict(fingerprint)}


def run_json(header: Header, entries: Iterable[BaselineEntry], date: str, section: JSONObject | None) -> str:
    """pytest-benchmark's JSON of a run's benchmarks (written by this plugin under pytest-xdist, where
    pytest-benchmark writes none)."""
    data: dict[str, object] = {
        "machine_info": dict(header.machine_info),
        "commit_info": dict(header.commit_info),
        "benchmarks": [entry.to_json() for entry in entries],
        "datetime": date,
        "version": header.version,
    }
    if section is not None:
        data["lstmperf"] = dict(section)
    return json.dumps(data, indent=1, default=str) + "\n"


class FormatProblem(ValueError):
    """A file that cannot be read as a baseline. ``text`` names the problem (``{path}`` stands for the file);
    ``then`` says what the reader appends: ``restore`` (how to restore or re-record it), ``record`` (how to
    record one) or ``""`` (nothing: the text says what to do)."""

    def __init__(self, text: str, then: str = "restore") -> None:
        super().__init__(text)
        self.text = text
        self.then = then


def format_of(raw: object) -> int | None:
    """The format number of a parsed baseline file, None where it has none."""
    version = _obj(_obj(raw).get("lstmperf")).get("format")
    return version if isinstance(version, int) and not isinstance(version, bool) else None


def parse_baseline(raw: object) -> BaselineDocument:
    """A parsed JSON document as a baseline of the current format (one of format 1 migrated); raises
    :class:`FormatProblem` naming what is wrong."""
    if not isinstance(raw, Mapping) or not isinstance(raw.get("benchmarks"), list):
        raise FormatProblem("baseline {path} is not a pytest-benchmark JSON file (no 'benchmarks' list).")
    section = raw.get("lstmperf")
    if not isinstance(section, Mapping):
        raise FormatProblem(
            "{path} is a pytest-benchmark file without pytest-lstmperf's device key (written by --benchmark-save or "
            "--benchmark-json?), so it cannot be checked against this device.",
            then="record",
        )
    version = format_of(raw)
    if version is None:
        raise FormatProblem("baseline {path} has no format version in its 'lstmperf' section.")
    if version > FORMAT:
        raise FormatProblem(
            f"baseline {{path}} was written by a newer pytest-lstmperf (format {version}; this version reads "
            f"format {FORMAT}). Upgrade pytest-lstmperf.",
            then="",
        )
    if version == 1 and isinstance(section.get("comparable"), Mapping):
        return migrate_format_1(raw)
    if version < FORMAT:
        raise FormatProblem(
            f"baseline {{path}} has the format {version}, which this version cannot read (it reads formats 1 and "
            f"{FORMAT}). Record it again, replacing the old file, with --lstmperf-update-baseline.",
            then="",
        )
    hardware = section.get("hardware")
    if not isinstance(hardware, Mapping):
        raise FormatProblem("baseline {path} has no hardware fields ('lstmperf.hardware').")
    migrated = _number(section.get("migrated_from"))
    return BaselineDocument(
        BaselineSection(
            hardware=_strings(hardware),
            fingerprint=dict(_obj(section.get("fingerprint"))),
            created=dict(_obj(section.get("created"))),
            updated=dict(_obj(section.get("updated"))),
            format=version,
            migrated_from=int(migrated) if migrated is not None else None,
        ),
        _entries(raw["benchmarks"]),
        Header.from_json(raw),
        _optional_text(raw.get("datetime")),
    )


def _entries(benchmarks: Sequence[object]) -> dict[str, BaselineEntry]:
    """A baseline's entries by name; every one must hold its raw samples."""
    out: dict[str, BaselineEntry] = {}
    for bench in benchmarks:
        if not isinstance(bench, Mapping) or not isinstance(bench.get("stats"), Mapping) or "fullname" not in bench:
            raise FormatProblem("baseline {path} has a malformed benchmark entry.")
        samples = _obj(bench["stats"]).get("data")
        if (
            not isinstance(samples, list)
            or not samples
            or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in samples)
        ):
            raise FormatProblem(f"baseline {{path}}: benchmark {bench['fullname']} has no raw samples (stats.data).")
        entry = BaselineEntry.from_json(bench)
        out[entry.fullname] = entry
    return out


def migrate_format_1(raw: Mapping[str, object]) -> BaselineDocument:
    """A format-1 baseline (keyed by device and software versions, timings without an anchor) as the current
    format: the hardware fields key it, each entry keeps its kernel, host counters and versions, and its timings
    become its history's first point. The entries have no recording runs: their timings are not compared (the
    gate says so) until a run records them (``--lstmperf-save-baseline`` fills entries that lack runs)."""
    old = _obj(raw.get("lstmperf"))
    comparable = _strings(old.get("comparable"))
    kind = comparable.get("kind", "cuda")
    hardware = {
        "kind": kind,
        **{k: comparable.get(k, "?") for k in HARDWARE_FIELDS.get(kind, ()) if k in comparable or k != "cpu_id"},
    }  # a format-1 file knew no CPU family, model and stepping: it matches on the rest (differences)
    versions = {k: v for k, v in comparable.items() if k not in hardware}
    versions.update(_strings(old.get("frameworks")))
    benchmarks = raw.get("benchmarks")
    entries = _entries(benchmarks if isinstance(benchmarks, list) else [])
    for name, entry in entries.items():
        counters = _counts(entry.extra_info.get("host_counters"))
        kernel = kernel_text(entry.extra_info)
        point = HistoryPoint(  # timed without the anchor: no anchored figures
            dict(versions), entry.recorded_date, kernel, _median(entry.samples), entry.device_time_s, None, None
        )
        runs = (RunFigures(None, None, counters),) if counters else ()  # exact then as now: still compared
        entries[name] = replace(entry, part=EntryPart(dict(versions), kernel, runs, (point,)))
    section = BaselineSection(
        hardware=hardware,
        fingerprint=dict(_obj(old.get("fingerprint"))),
        created=dict(_obj(old.get("created"))),
        updated=dict(_obj(old.get("updated"))),
        migrated_from=1,
    )
    return BaselineDocument(section, entries, Header.from_json(raw), _optional_text(raw.get("datetime")))
