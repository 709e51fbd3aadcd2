"""The workload suites' result rows: one typed record per kind of result, and the one place that reads and writes
their JSON (a test's ``user_properties``, which carry them from pytest-xdist workers, and ``workloads.json``).

A suite makes a row (``OverheadRow(shape=..., ...)``) and hands it to :func:`pytest_lstmperf.hooks.workloads.add_row`;
:mod:`.report` turns the run's rows into tables, notes and plots. Fields a row may lack are ``None`` (a Keras row has
no ATen op time, a CPU row no device time). Every row also says where it was measured (``hardware``) and how many
pytest-xdist workers shared the machine's cores while it was (``workers``, ``cores``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import MISSING, dataclass, field
from typing import Any, ClassVar, TypeAlias, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class Row:
    """What every row holds besides its kind's figures."""

    kind: ClassVar[str] = ""
    hardware: str = ""  # the device in a few words, for plot titles
    workers: int = 1  # pytest-xdist workers that ran tests at the same time
    cores: int = 1


@dataclass(frozen=True, kw_only=True)
class BucketingRow(Row):
    """One training epoch of a variable-length dataset, padded, packed or in length buckets."""

    kind: ClassVar[str] = "bucketing"
    workload: str
    mode: str  # padded, packed, bucketed
    work_ratio: float  # computed time steps over the real ones
    wasted: float  # share of the computed steps that were padding
    seconds: float | None = None
    buckets: int | str = "-"
    device: str = ""  # the device's name (older reports; ``hardware`` now)


@dataclass(frozen=True, kw_only=True)
class CrossoverRow(Row):
    """A batch sweep of several paths, and the batch from which each beats ``against``."""

    kind: ClassVar[str] = "crossover"
    shape: str
    against: str
    crossover: Mapping[str, int | None] = field(default_factory=dict)  # path -> first winning batch, or never
    plot: str = ""  # the sweep's PNG, where the run wrote a report
    points: tuple[Mapping[str, Any], ...] = ()  # the sweep's points, as written to the report


@dataclass(frozen=True, kw_only=True)
class OverheadRow(Row):
    """A framework's forward call against the raw cost of the recurrent work it does."""

    kind: ClassVar[str] = "overhead"
    shape: str
    framework: str = "torch"
    device: str = ""
    ran: str = "-"  # the kernel family and precision the call ran
    module_s: float | None = None  # the call
    op_s: float | None = None  # the ATen op alone (torch only)
    graph_s: float | None = None  # a CUDA-graph replay of the cuDNN call (GPU)
    raw_s: float | None = None  # the raw cost the ratio is taken against
    ratio: float | None = None  # call over raw cost
    host_s: float | None = None  # call minus raw cost
    kernels: int | None = None  # distinct GPU kernels, or ATen ops on the CPU
    precision: str = ""  # a compiled or exported path's precision
    note: str = ""  # what the trace says of the call (compiled, exported paths)

    @property
    def raw_or_op_s(self) -> float | None:
        """The raw cost, where the row has one, else the CUDA-graph replay, else the ATen op."""
        return self.raw_s if self.raw_s is not None else (self.graph_s or self.op_s)

    @property
    def below_raw(self) -> bool:
        """Faster than its raw cost: a negative overhead, which a call doing the raw work cannot have (timing
        noise, or another kernel than the raw cost's)."""
        return self.ratio is not None and self.ratio != 0 and self.ratio < 1.0


@dataclass(frozen=True, kw_only=True)
class PrecisionRow(Row):
    """A precision path's forward time (timed in alternation with the fp32 path) and its error."""

    kind: ClassVar[str] = "precision"
    shape: str
    path: str
    claimed: str  # kernel family/precision the path claims
    observed: str  # what ran
    seconds: float | None = None
    fp32_path: str = ""
    fp32_s: float | None = None  # the fp32 path, timed in alternation with this one
    device_s: float | None = None  # CUDA-graph replay (GPU)
    error: float | None = None  # max relative error against float64
    bound: float | None = None  # its tolerance
    kernel_ok: bool = True  # the claimed kernel and precision ran

    @property
    def speedup(self) -> float | None:
        """Over the fp32 path timed in alternation with it."""
        return ratio(self.fp32_s, self.seconds)


@dataclass(frozen=True, kw_only=True)
class ScalingRow(Row):
    """Training throughput of one strategy on ``world`` ranks, against one rank and plain training."""

    kind: ClassVar[str] = "scaling"
    strategy: str
    data: str
    world: int
    speedup: float  # over one rank of the same strategy
    backend: str = ""
    throughput: float | None = None  # time steps per second
    efficiency: float | None = None  # speedup over the ranks
    vs_plain: float | None = None  # over plain single-device training of the same batch
    comm_share: float | None = None  # DDP's share of a step spent communicating
    model: str = ""
    note: str = ""


WorkloadRow: TypeAlias = BucketingRow | CrossoverRow | OverheadRow | PrecisionRow | ScalingRow
KINDS: dict[str, type[WorkloadRow]] = {
    cls.kind: cls for cls in (BucketingRow, CrossoverRow, OverheadRow, PrecisionRow, ScalingRow)
}
#: fields older reports wrote that are now derived from the others when read (precision: the speed-ups)
DERIVED = {"precision": ("speedup", "device_speedup")}


def ratio(reference: float | None, value: float | None) -> float | None:
    """reference over value, where both are there and non-zero."""
    return reference / value if reference and value else None


def row_to_json(row: WorkloadRow) -> dict[str, Any]:
    """The row as JSON: its kind, then its fields."""
    out: dict[str, Any] = {"kind": row.kind}
    for f in dataclasses.fields(row):
        value = getattr(row, f.name)
        out[f.name] = dict(value) if isinstance(value, Mapping) else list(value) if isinstance(value, tuple) else value
    return out


def tagged_from_json(
    classes: Mapping[str, type[T]], data: Mapping[str, Any], *, tag: str, what: str, skip: Collection[str] = ()
) -> T:
    """A dataclass read back from JSON whose ``tag`` field names its class among ``classes`` (the tag is passed on
    where the class has it as a field); ``skip``: fields dropped unread. Raises ``ValueError`` naming an unknown
    tag, an unknown field or a missing one. The workload rows and scalebench's rows are both read so."""
    name = data.get(tag)
    cls = classes.get(str(name))
    if cls is None:
        raise ValueError(f"unknown {what} {tag} {name!r} (valid: {', '.join(classes)})")
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]  # every class of ``classes`` is a dataclass
    names = {f.name for f in fields}
    values = {k: v for k, v in data.items() if (k != tag or k in names) and k not in skip}
    unknown = sorted(set(values) - names)
    missing = [f.name for f in fields if f.name not in values and f.default is MISSING and f.default_factory is MISSING]
    if unknown or missing:
        problems = ([f"no field(s) {', '.join(unknown)}"] if unknown else []) + (
            [f"missing field(s) {', '.join(missing)}"] if missing else []
        )
        raise ValueError(f"{name} row: {'; '.join(problems)} (its fields: {', '.join(sorted(names))})")
    return cls(**values)


def row_from_json(data: Mapping[str, Any]) -> WorkloadRow:
    """A row read back from :func:`row_to_json`'s JSON (or an older report's). Raises ``ValueError`` naming an
    unknown kind, an unknown field or a missing one."""
    kind = str(data.get("kind"))
    values = {k: v for k, v in data.items() if k != "points"}
    if "points" in data:
        values["points"] = tuple(data["points"])
    row: WorkloadRow = tagged_from_json(KINDS, values, tag="kind", what="workload row", skip=DERIVED.get(kind, ()))
    return row
