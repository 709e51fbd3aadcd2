"""Time per call timed across the whole run, not in one stretch (:mod:`.policy`, sentence 1).

A figure taken in one stretch of half a second samples the machine in one state. On a shared or virtual CPU the
state moves over seconds: measured on a 2-core VM (AMD EPYC, torch 2.13.0, one thread), a native LSTM's time
divided by the anchor's wandered between 2.1 and 2.9 in stretches lasting a second or more, within one process.
Half a second of paired rounds taken in one stretch put its median anywhere in 4.8% (one standard deviation); the
same half second taken in slices spread over 10 s, 2.1%; over 45 s, 1.4%. How far a stretch lies from the next is
noise that no number of rounds inside the stretch removes, and the anchor beside it does not cancel it either.

So a benchmark whose figure is its time per call (every CPU benchmark; a GPU benchmark without a device figure
that leaves the host out) is timed twice. In its test, a stretch of rounds (the figure wherever the gate neither
compares nor records). Then, as the run ends, every such benchmark of
the process is timed again in slices, round-robin over the benchmarks, so that each benchmark's samples spread
over the whole sweep: at least :data:`SPAN_S` seconds where the benchmarks' work allows, each benchmark at least
:data:`WORK_S` seconds of paired rounds (more, up to :data:`WORK_MAX_S`, where few benchmarks would make the span
short). The swept samples are the gate's figure, in the recording's processes and in a compare alike, and
pytest-benchmark's results hold them too (``hooks.gate_finish.show_swept``). Under
pytest-xdist each worker sweeps its own benchmarks, each pass holding the machine to itself.

Timing only; the records are changed by :func:`apply`, the session's end calls both.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..anchor import TimedPairs

if TYPE_CHECKING:
    from .records import BenchRecord

#: a sweep lasts at least this long where its benchmarks' work allows (the slices of one benchmark lie this far apart
#: in all): on the 2-core VM half a second's figure moved 4.8% taken in one stretch, 2.8% spread over 5 s, 2.1% over
#: 10 s; what remains beyond that is how far processes lie apart, which the recording's processes measure
SPAN_S = 5.0
#: paired-round work per benchmark (call and anchor), at least
WORK_S = 0.5
#: ... and at most, where few benchmarks would leave the span short
WORK_MAX_S = 2.5
#: work per benchmark in one pass of the sweep: a slice
SLICE_S = 0.025
#: rounds per benchmark at least, however long its call (a figure needs a median)
MIN_ROUNDS = 15
#: rounds per benchmark at most
MAX_ROUNDS = 4000
#: a slice starts with one untimed call where a call is shorter than this: what ran since (the other benchmarks'
#: slices) leaves it as cold in a compare as in the recording only if it is warmed the same way
WARM_CALL_S = 0.002


@dataclass
class Slot:
    """One benchmark in the sweep: what its test left to time again."""

    nodeid: str
    pairs: TimedPairs  # one synchronised call and the anchor, where the test's rounds were timed
    repeat: int  # the anchor's repetitions, as in the test's own rounds
    per_round_s: float  # one call and one anchor, as estimated in the test
    data: list[float] = field(default_factory=list)
    anchors: list[float] = field(default_factory=list)
    slices: int = 0
    first_s: float = math.nan
    last_s: float = math.nan
    error: str = ""


@dataclass(frozen=True)
class Swept:
    """What the sweep measured for one benchmark: paired samples (seconds of one call; seconds per anchor
    repetition), how many slices they came in and how far the first lay from the last; or why it could not."""

    data: tuple[float, ...] = ()
    anchors: tuple[float, ...] = ()
    slices: int = 0
    span_s: float = 0.0
    error: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "data": list(self.data),
            "anchors": list(self.anchors),
            "slices": self.slices,
            "span_s": self.span_s,
            "error": self.error,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, object]) -> Swept:
        def numbers(value: object) -> tuple[float, ...]:
            return tuple(float(v) for v in value if isinstance(v, (int, float))) if isinstance(value, list) else ()

        slices, span = raw.get("slices"), raw.get("span_s")
        return cls(
            data=numbers(raw.get("data")),
            anchors=numbers(raw.get("anchors")),
            slices=int(slices) if isinstance(slices, (int, float)) else 0,
            span_s=float(span) if isinstance(span, (int, float)) else 0.0,
            error=str(raw.get("error") or ""),
        )


@dataclass(frozen=True)
class Plan:
    """How a sweep of ``benchmarks`` spends its time: ``work_s`` of paired rounds per benchmark, in ``passes``
    slices."""

    benchmarks: int
    work_s: float
    passes: int

    @classmethod
    def of(cls, benchmarks: int, span_s: float = SPAN_S) -> Plan:
        if benchmarks <= 0:
            return cls(0, 0.0, 0)
        work = min(WORK_MAX_S, max(min(WORK_S, span_s), span_s / benchmarks))
        return cls(benchmarks, work, max(1, math.ceil(work / SLICE_S)))

    def rounds(self, per_round_s: float) -> int:
        """The rounds a benchmark whose round (call and anchor) lasts ``per_round_s`` gets in all."""
        if not per_round_s or per_round_s <= 0 or not math.isfinite(per_round_s):
            return MIN_ROUNDS
        return max(MIN_ROUNDS, min(MAX_ROUNDS, math.ceil(self.work_s / per_round_s)))

    def describe(self) -> str:
        return (
            f"{self.benchmarks} benchmark(s) timed per call across the run: {self.passes} passes, about "
            f"{self.work_s:.1f} s of rounds each, about {self.benchmarks * self.work_s:.0f} s in all"
        )


class Sweep:
    """The benchmarks of this process to time again as the run ends (:func:`run`), the sweep spanning at least
    ``span_s`` where their work allows."""

    def __init__(self, span_s: float = SPAN_S, only: frozenset[str] | None = None) -> None:
        self.span_s = span_s
        self.slots: dict[str, Slot] = {}
        self.only = only  # the benchmarks to time again, None for every one added

    def add(
        self,
        nodeid: str,
        pairs: TimedPairs,
        repeat: int,
        per_round_s: float,
    ) -> None:
        if self.only is None or nodeid in self.only:
            self.slots[nodeid] = Slot(nodeid, pairs, repeat, per_round_s)

    def plan(self) -> Plan:
        return Plan.of(len(self.slots), self.span_s)

    def __len__(self) -> int:
        return len(self.slots)

    def run(
        self, hold: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext
    ) -> dict[str, Swept]:
        """Every slot timed in slices, round-robin, each pass inside ``hold()`` (the machine to itself); the
        slots are released after. A slot whose call raises keeps its error and takes no further part."""
        plan = self.plan()
        slots = list(self.slots.values())
        wanted = {s.nodeid: plan.rounds(s.per_round_s) for s in slots}
        per_slice = {s.nodeid: max(1, math.ceil(wanted[s.nodeid] / plan.passes)) for s in slots}
        for _ in range(plan.passes):
            active = [s for s in slots if not s.error and len(s.data) < wanted[s.nodeid]]
            if not active:
                break
            with hold():
                for slot in active:
                    _slice(slot, min(per_slice[slot.nodeid], wanted[slot.nodeid] - len(slot.data)))
        out = {s.nodeid: _swept(s) for s in slots}
        self.slots.clear()  # the models they hold are no longer needed
        return out


def _slice(slot: Slot, rounds: int) -> None:
    clock = slot.pairs.clock
    try:
        if slot.per_round_s < WARM_CALL_S:
            slot.pairs.warm()
        start = clock()
        data, anchors = slot.pairs.rounds(slot.repeat, rounds)
    except Exception as exc:  # a benchmark's call that no longer runs (its resources released with its test)
        slot.error = f"{type(exc).__name__}: {exc}"[:300]
        return
    slot.first_s = start if math.isnan(slot.first_s) else slot.first_s
    slot.last_s = clock()
    slot.data += data
    slot.anchors += anchors
    slot.slices += 1


def _swept(slot: Slot) -> Swept:
    span = slot.last_s - slot.first_s if slot.slices else 0.0
    return Swept(tuple(slot.data), tuple(slot.anchors), slot.slices, round(span, 3), slot.error)


def apply(records: Sequence[BenchRecord], swept: Mapping[str, Swept]) -> tuple[list[BenchRecord], list[str]]:
    """The records with the swept samples as their figures (:meth:`~.records.BenchRecord.with_swept`; the stretch
    its test timed stays counted in ``swept.test_rounds``), and a line for each benchmark that could not be swept
    (its test's stretch stays its figure)."""
    out: list[BenchRecord] = []
    lines: list[str] = []
    for record in records:
        result = swept.get(record.fullname)
        if result is None or not record.data:
            out.append(record)
        elif result.error or len(result.data) < MIN_ROUNDS:
            why = result.error or f"{len(result.data)} rounds"
            out.append(record.with_swept((), (), {"error": why}))
            lines.append(f"{record.fullname}: not timed across the run ({why}); its figure is its test's own rounds")
        else:
            info = {
                "rounds": len(result.data),
                "slices": result.slices,
                "span_s": result.span_s,
                "test_rounds": len(record.data),
            }
            out.append(record.with_swept(result.data, result.anchors, info))
    return out, lines
