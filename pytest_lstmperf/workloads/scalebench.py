"""Measured scale-out of the stacked LSTM, as docs/scaling.md reports it, in one command::

    python -m pytest_lstmperf.workloads.scalebench --out results/      # NCCL on every GPU, or 2 gloo processes

Three parts, each run written to ``scalebench.jsonl`` in ``--out`` as it ends (a run that is cut short keeps
what was measured):

1. **sizing**: for each candidate size, a short pipeline run on 2 ranks with stages balanced by measured layer
   time records each layer's forward and backward time on one micro-batch, the host's time to issue those calls
   (the launch cost), and one send/recv of a micro-batch's activations between ranks 0 and 1. The configuration
   used next is the first whose layer time is at least :data:`DOMINATES` times both (or ``--size``);
2. **scaling**: plain training in this process (whole model, whole batch: the baseline), data parallel, the
   pipeline and the pipeline on length-bucketed data, on 1..N ranks, each with ``--passes`` timed passes (their
   spread is reported), throughput in sequences per second and the speed-up over plain padded training; on
   CUDA each multi-rank run profiles one step (time in NCCL kernels);
3. **micro-batches**: the pipeline on N ranks with 2..16 micro-batches, measured per-rank compute against the
   step (the share lost to the bubble, stage imbalance and transfers) beside GPipe's (S-1)/(M+S-1).

``--tiny`` runs CPU-sized models (what CI and a quick check can afford). :func:`summary` and :func:`plot` turn
the rows into the tables and the figure of docs/scaling.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

from .distributed import RunResult, TrainConfig, single_process
from .rows import tagged_from_json

#: the chosen size's layer time must be this many times its issue time and its transfer time
DOMINATES = 10.0
#: (name, layers, input, hidden, max length, batch, micro-batches)
CANDIDATES = {
    "cuda": [
        ("gate", 8, 256, 512, 100, 64, 4),
        ("mid", 8, 512, 1024, 100, 256, 8),
        ("thorough", 8, 1024, 2048, 100, 512, 8),
    ],
    "tiny": [("tiny-a", 4, 8, 16, 10, 8, 2), ("tiny-b", 4, 16, 32, 10, 16, 4)],
}
MICRO_BATCHES = (2, 4, 8, 16)
MODES = ("plain", "ddp", "pipeline", "pipeline+bucketing")
PROG = "python -m pytest_lstmperf.workloads.scalebench"


@dataclass(frozen=True)
class Size:
    name: str
    layers: int
    input_size: int
    hidden: int
    seq_len: int
    batch: int
    micro_batches: int

    def config(self, **changes: Any) -> TrainConfig:
        base = TrainConfig(layers=self.layers, input_size=self.input_size, hidden=self.hidden,
                           seq_len=self.seq_len, batch=self.batch, micro_batches=self.micro_batches)  # fmt: skip
        return replace(base, **changes)

    def label(self) -> str:
        return f"{self.layers}x LSTM {self.input_size}->{self.hidden}, batch {self.batch}, T<={self.seq_len}"


# ------------------------------------------------------------------------------------- the rows and their JSON
@dataclass(frozen=True)
class SizingRow:
    """One candidate size's probe: a layer's forward and backward time on one micro-batch, the host's time to
    issue those calls and one activation transfer between ranks 0 and 1 (seconds; the ``*_seconds`` lists hold
    every repetition, the ``*_s`` fields their medians)."""

    part: ClassVar[str] = "sizing"
    size: str
    model: str
    micro_batch: int
    world: int
    backend: str
    layer_seconds: list[float] | None
    issue_seconds: list[float] | None
    layer_s: float | None
    issue_s: float | None
    transfer_s: float | None
    layer_over_issue: float | None
    layer_over_transfer: float | None
    transfer_bytes: int
    stages: Sequence[Sequence[int]] | None
    at: str = ""  # UTC time the row was written
    call: int | None = None  # which call of a multi-call record it came from (added to a published file)


@dataclass(frozen=True)
class RunRow:
    """One training run of the scaling part or the micro-batch sweep (``part``: ``scaling`` or
    ``micro-batches``): its throughput per timed pass, and where measured the DDP communication share, each
    rank's idle share, GPipe's ideal bubble and one profiled step's NCCL time per rank."""

    part: str
    mode: str
    data: str
    size: str
    model: str
    world: int
    backend: str
    seconds: float | None
    pass_seconds: list[float]
    sequences: int | None
    tokens: int | None
    seq_per_s: float | None
    seq_per_s_passes: list[float]
    comm_share: float | None
    stages: Sequence[Sequence[int]] | None
    micro_batches: int | None
    idle_shares: list[float] | None
    ideal_bubble: float | None
    profile: list[dict[str, float]] | None
    at: str = ""
    call: int | None = None
    excluded: str | None = None  # why a published row is left out of the tables (:func:`load`)


@dataclass(frozen=True)
class ErrorRow:
    """A run that failed or was cut short: what it was and why (its figures are missing, not zero)."""

    part: ClassVar[str] = "error"
    what: str
    error: str
    at: str = ""
    call: int | None = None


BenchRow = SizingRow | RunRow | ErrorRow
_KINDS: dict[str, type[SizingRow] | type[RunRow] | type[ErrorRow]] = {
    "sizing": SizingRow, "scaling": RunRow, "micro-batches": RunRow, "error": ErrorRow,
}  # fmt: skip
_OPTIONAL = ("at", "call", "excluded")  # written only where set


def row_to_json(row: BenchRow) -> dict[str, Any]:
    """A row as one line of ``scalebench.jsonl`` holds it (``part`` first; ``at``, ``call`` and ``excluded`` only
    where set)."""
    out: dict[str, Any] = {"part": row.part, **asdict(row)}
    for name in _OPTIONAL:
        if out.get(name) in (None, ""):
            out.pop(name, None)
    return out


def row_from_json(raw: dict[str, Any]) -> BenchRow:
    """A row read back from ``scalebench.jsonl``; a ValueError names an unknown part, an unknown field or a
    missing one."""
    row: BenchRow = tagged_from_json(_KINDS, raw, tag="part", what="scalebench row")
    return row


def pick_size(rows: list[BenchRow], factor: float = DOMINATES) -> str | None:
    """The first sizing row whose median layer time is ``factor`` times its issue and transfer times; else the
    one with the largest smaller ratio (None without rows)."""
    sized = [r for r in rows if isinstance(r, SizingRow) and r.layer_s and r.issue_s]
    for r in sized:
        layer, issue = r.layer_s or 0.0, r.issue_s or 0.0
        transfer_ok = r.transfer_s is None or layer >= factor * r.transfer_s
        if layer >= factor * issue and transfer_ok:
            return r.size
    if not sized:
        return None
    return max(sized, key=lambda r: min(r.layer_over_issue or 0.0, r.layer_over_transfer or float("inf"))).size


def _median(values: list[float] | None) -> float | None:
    return float(statistics.median(values)) if values else None


def run_row(part: str, mode: str, data: str, size: Size, result: RunResult) -> RunRow:
    """One run as a row."""
    per_pass = [result.sequences / s for s in result.pass_seconds if s] if result.sequences else []
    return RunRow(
        part=part, mode=mode, data=data, size=size.name, model=size.label(), world=result.world,
        backend=result.backend, seconds=result.seconds, pass_seconds=list(result.pass_seconds),
        sequences=result.sequences, tokens=result.tokens, seq_per_s=result.sequence_throughput,
        seq_per_s_passes=per_pass, comm_share=result.comm_share, stages=result.stages,
        micro_batches=result.micro_batches or None, idle_shares=result.idle_shares,
        ideal_bubble=result.ideal_bubble, profile=result.profile,
    )  # fmt: skip


def sizing_row(size: Size, result: RunResult) -> SizingRow:
    layer = _median(result.layer_seconds)
    issue = _median(result.issue_seconds)
    transfer = result.transfer_seconds
    return SizingRow(
        size=size.name, model=size.label(), micro_batch=size.batch // size.micro_batches,
        world=result.world, backend=result.backend, layer_seconds=result.layer_seconds,
        issue_seconds=result.issue_seconds, layer_s=layer, issue_s=issue, transfer_s=transfer,
        layer_over_issue=layer / issue if layer and issue else None,
        layer_over_transfer=layer / transfer if layer and transfer else None,
        transfer_bytes=4 * (size.batch // size.micro_batches) * size.seq_len * size.hidden,
        stages=result.stages,
    )  # fmt: skip


class Recorder:
    """Appends each row to ``scalebench.jsonl`` at once and prints a line."""

    def __init__(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.path = out / "scalebench.jsonl"
        self.rows: list[BenchRow] = []

    def add(self, row: BenchRow) -> None:
        row = replace(row, at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        self.rows.append(row)
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(row_to_json(row)) + "\n")
        print(describe(row), flush=True)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f} ms"


def describe(row: BenchRow) -> str:
    if isinstance(row, SizingRow):
        return (f"sizing {row.size}: layer fwd+bwd {_ms(row.layer_s)} per micro-batch of {row.micro_batch}, "
                f"issue {_ms(row.issue_s)}, transfer {_ms(row.transfer_s)}")  # fmt: skip
    if isinstance(row, ErrorRow):
        return f"{row.what} failed: {row.error}"
    per_s = "-" if row.seq_per_s is None else f"{row.seq_per_s:.4g}"
    per_pass = "-" if row.seconds is None else f"{row.seconds:.3f}"
    return f"{row.part} {row.mode} {row.data} x{row.world}: {per_s} seq/s ({per_pass} s per pass)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for scalebench.jsonl")
    parser.add_argument("--tiny", action="store_true", help="CPU-sized models (a quick check of the whole run)")
    parser.add_argument("--backend", choices=("nccl", "gloo"), default=None, help="default: nccl with 2+ GPUs")
    parser.add_argument("--worlds", default=None, help="comma-separated rank counts (default: 1..GPUs, or 1,2)")
    parser.add_argument("--size", default=None, help="use this candidate instead of the measured pick")
    parser.add_argument("--parts", default="sizing,scaling,micro-batches", help="which parts to run")
    parser.add_argument("--modes", default=",".join(MODES), help=f"scaling modes to run (of {', '.join(MODES)})")
    parser.add_argument("--micro-batches", default=",".join(map(str, MICRO_BATCHES)), help="the sweep's counts")
    parser.add_argument("--passes", type=int, default=3, help="timed passes per run (their spread is reported)")
    parser.add_argument("--steps", type=int, default=4, help="batches per pass")
    parser.add_argument("--timeout", type=float, default=300, help="seconds for one launch")
    args = parser.parse_args(argv)
    import torch

    from .launcher import launch

    gpus = torch.cuda.device_count()
    backend = args.backend or ("nccl" if gpus >= 2 else "gloo")
    sizes = {c[0]: Size(*c) for c in CANDIDATES["tiny" if args.tiny else "cuda"]}
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - {"sizing", "scaling", "micro-batches"})
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)} (valid: sizing, scaling, micro-batches)")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - set(MODES):
        parser.error(f"--modes {args.modes!r}: valid modes are {', '.join(MODES)}")
    try:
        sweep = [int(m) for m in args.micro_batches.split(",")]
    except ValueError:
        parser.error(f"--micro-batches {args.micro_batches!r}: expected comma-separated integers such as 4,8,16")
    if args.size is not None and args.size not in sizes:
        parser.error(f"unknown size {args.size!r} (valid: {', '.join(sizes)})")
    if args.passes < 1 or args.steps < 1:
        parser.error(f"--passes and --steps must be >= 1, got {args.passes} and {args.steps}")
    top = gpus if backend == "nccl" else 2
    try:
        worlds = [int(w) for w in args.worlds.split(",")] if args.worlds else list(range(1, top + 1))
    except ValueError:
        parser.error(f"--worlds {args.worlds!r}: expected comma-separated integers such as 1,2,4")
    if not worlds or min(worlds) < 1 or (backend == "nccl" and max(worlds) > gpus):
        parser.error(f"--worlds {args.worlds!r}: each must be 1..{top} with {backend}")
    rec = Recorder(args.out)
    device = "cuda:0" if backend == "nccl" else "cpu"

    def attempt(what: str, fn: Any) -> Any:
        try:
            return fn()
        except Exception as exc:  # one failed run must not lose the others' figures
            rec.add(ErrorRow(what=what, error=f"{type(exc).__name__}: {str(exc)[-1500:]}"))
            return None

    probe_world = min(2, max(worlds))
    if "sizing" in parts:
        for size in sizes.values():
            cfg = size.config(steps=1, timed_passes=1, balance="measured", keep_weights=False)
            result = attempt(f"sizing {size.name}", lambda cfg=cfg: launch("pipeline", probe_world, cfg, backend,
                                                                             timeout_s=args.timeout))  # fmt: skip
            if result is not None:
                rec.add(sizing_row(size, result))
    chosen = sizes[args.size] if args.size else sizes.get(pick_size(rec.rows) or "", list(sizes.values())[-1])
    print(f"size used: {chosen.name} ({chosen.label()}, {chosen.micro_batches} micro-batches)", flush=True)
    common = {"steps": args.steps, "timed_passes": args.passes, "balance": "measured", "keep_weights": False}
    varlen = {"sequences": args.steps * chosen.batch}
    if "scaling" in parts:
        for data, bucketing in (("padded", False), ("bucketed", True)) if "plain" in modes else ():
            cfg = chosen.config(**common, **varlen, bucketing=bucketing)
            plain = attempt(f"plain {data}", lambda cfg=cfg: single_process(cfg, device))
            if plain is not None:
                rec.add(run_row("scaling", "plain", data, chosen, plain))
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        for mode, strategy, bucketing in (("ddp", "ddp", False), ("pipeline", "pipeline", False),
                                          ("pipeline+bucketing", "pipeline", True)):  # fmt: skip
            if mode not in modes:
                continue
            for world in worlds:
                # one step under the profiler (NCCL kernel time): DDP only; the pipeline's NCCL time is its
                # measured transfers, and its waits show in the per-rank idle share
                profile = strategy == "ddp" and world > 1 and backend == "nccl"
                cfg = chosen.config(**common, **varlen, bucketing=bucketing, profile=profile)
                result = attempt(f"{mode} x{world}", lambda s=strategy, w=world, cfg=cfg: launch(
                    s, w, cfg, backend, timeout_s=args.timeout))  # fmt: skip
                if result is not None:
                    rec.add(run_row("scaling", mode, "bucketed" if bucketing else "padded", chosen, result))
    if "micro-batches" in parts:
        world = max(worlds)
        for m in sweep:
            if chosen.batch % m or world < 2:
                continue
            cfg = chosen.config(steps=2, timed_passes=2, balance="measured", micro_batches=m, keep_weights=False)
            result = attempt(f"micro-batches {m}", lambda cfg=cfg: launch("pipeline", world, cfg, backend,
                                                                          timeout_s=args.timeout))  # fmt: skip
            if result is not None:
                rec.add(run_row("micro-batches", "pipeline", "fixed-length", chosen, result))
    (args.out / "summary.md").write_text("\n".join(summary(rec.rows)) + "\n", encoding="utf-8")
    print("\n".join(summary(rec.rows)), flush=True)
    return 0


# --------------------------------------------------------------------------------------------- reading the rows
def spread(values: list[float]) -> str:
    """``median (min-max)`` of a few repetitions."""
    if not values:
        return "-"
    return f"{statistics.median(values):.4g} ({min(values):.4g}-{max(values):.4g})"


def _runs(rows: list[BenchRow], part: str) -> list[RunRow]:
    return [r for r in rows if isinstance(r, RunRow) and r.part == part]


def baseline(rows: list[BenchRow]) -> RunRow | None:
    """Plain single-device training of the padded data: what every mode's speed-up is over."""
    return next((r for r in _runs(rows, "scaling") if r.mode == "plain" and r.data == "padded"), None)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summary(rows: list[BenchRow]) -> list[str]:
    """Markdown tables of the three parts (with the implausible speed-ups flagged)."""
    from .report import SUPERLINEAR_LIMIT, speedup_flag

    lines: list[str] = []
    sized = [r for r in rows if isinstance(r, SizingRow)]
    if sized:
        lines += ["| size | micro-batch | layer fwd+bwd ms | issue ms | transfer ms | layer/issue | layer/transfer |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
        for z in sized:
            cells = [_ms(x).removesuffix(" ms") for x in (z.layer_s, z.issue_s, z.transfer_s)]
            overs = ["-" if x is None else f"{x:.1f}" for x in (z.layer_over_issue, z.layer_over_transfer)]
            lines.append(f"| {z.model} | {z.micro_batch} | {' | '.join(cells)} | {' | '.join(overs)} |")
        lines.append("")
    base = baseline(rows)
    scaled = _runs(rows, "scaling")
    if scaled:
        lines += ["| mode | data | GPUs | sequences/s, median (min-max of passes) | speed-up over plain padded | "
                  "speed-up over own 1-rank | DDP comm | idle per rank | NCCL / all kernels, one step |",
                  "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in scaled:
            over_base = _ratio(r.seq_per_s, base.seq_per_s) if base else None
            over = "-" if over_base is None else f"{over_base:.2f}x"
            if base and r.sequences != base.sequences:  # another dataset: no speed-up to read
                over = f"not comparable: {r.sequences} of the baseline's {base.sequences} sequences"
            own = next((o for o in scaled if o.mode == r.mode and o.data == r.data and o.world == 1), None)
            own_speedup = _ratio(r.seq_per_s, own.seq_per_s) if own and r.mode != "plain" else None
            flag = speedup_flag(own_speedup, r.world) if own_speedup else ""
            own_cell = "-" if own_speedup is None else f"{own_speedup:.2f}x" + (" (implausible)" if flag else "")
            comm = "-" if r.comm_share is None or r.world < 2 else f"{100 * r.comm_share:.0f}%"
            idle = "-" if not r.idle_shares or r.world < 2 else ", ".join(f"{100 * s:.0f}%" for s in r.idle_shares)
            lines.append(f"| {r.mode} | {r.data} | {r.world} | {spread(r.seq_per_s_passes)} | {over} | "
                         f"{own_cell} | {comm} | {idle} | {nccl_cell(r.profile)} |")  # fmt: skip
        lines.append("")
    swept = _runs(rows, "micro-batches")
    if swept:
        lines += ["| micro-batches | GPUs | stages | sequences/s | idle per rank (measured) | "
                  "GPipe bubble (S-1)/(M+S-1) |", "|---|---|---|---|---|---|"]  # fmt: skip
        for m in swept:
            idle = ", ".join(f"{100 * s:.0f}%" for s in m.idle_shares or [])
            bubble = "-" if m.ideal_bubble is None else f"{100 * m.ideal_bubble:.0f}%"
            stages = None if m.stages is None else [list(st) for st in m.stages]
            lines.append(f"| {m.micro_batches} | {m.world} | {stages} | {spread(m.seq_per_s_passes)} | "
                         f"{idle} | {bubble} |")  # fmt: skip
        lines.append("")
    if any("(implausible)" in line for line in lines):
        lines.append(
            f"* (implausible): a speed-up over the own 1-rank run above {SUPERLINEAR_LIMIT:g} x the rank "
            "count: the 1-rank reference ran slowed (e.g. oversubscribed CPU cores), not a scaling result."
        )
    lines += [f"* {r.what} failed: {r.error[-300:]}" for r in rows if isinstance(r, ErrorRow)]
    return lines


def nccl_cell(profile: list[dict[str, float]] | None) -> str:
    """Per rank, the profiled step's NCCL kernel time against the time of all its GPU kernels (the profiler
    slows the host, so the step's wall time under it is no step time)."""
    if not profile:
        return "-"
    return ", ".join(f"{p['nccl_s'] * 1e3:.1f} of {p['device_s'] * 1e3:.0f} ms" for p in profile)


def load(path: Path) -> list[BenchRow]:
    """The rows of a ``scalebench.jsonl``, without those marked ``excluded`` (with the reason) after the fact; a
    line that is no row of a known part and fields is a ValueError naming its line."""
    rows: list[BenchRow] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(row_from_json(json.loads(line)))
            except (ValueError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: {exc}") from None
    return [r for r in rows if not (isinstance(r, RunRow) and r.excluded)]


def plot(rows: list[BenchRow], path: Path, title: str) -> Path | None:
    """Sequences per second per mode against GPUs (median, min-max bars over the passes), plain padded and
    plain bucketed training as horizontal lines; and the micro-batch sweep's idle share against GPipe's."""
    from .report import _pyplot, _save

    scaled = [r for r in _runs(rows, "scaling") if r.seq_per_s is not None]
    if not scaled:
        return None
    plt = _pyplot()
    swept = _runs(rows, "micro-batches")
    fig, axes = plt.subplots(1, 2 if swept else 1, figsize=(12 if swept else 7, 5), squeeze=False)
    ax = axes[0][0]
    worlds = sorted({r.world for r in scaled if r.mode != "plain"})
    labelled: set[str] = set()
    for r in (r for r in scaled if r.mode == "plain"):
        label = f"plain 1 GPU, {r.data}"
        ax.axhline(r.seq_per_s, color="grey", linestyle="--" if r.data == "padded" else ":",
                   label=None if label in labelled else label)  # fmt: skip
        labelled.add(label)
    for mode in sorted({r.mode for r in scaled if r.mode != "plain"}):
        mine = sorted((r for r in scaled if r.mode == mode), key=lambda r: r.world)
        meds = [r.seq_per_s or 0.0 for r in mine]
        lows = [m - min(r.seq_per_s_passes or [m]) for m, r in zip(meds, mine, strict=True)]
        highs = [max(r.seq_per_s_passes or [m]) - m for m, r in zip(meds, mine, strict=True)]
        ax.errorbar([r.world for r in mine], meds, yerr=[lows, highs], marker="o", capsize=4,
                    label=f"{mode} ({mine[0].data})")  # fmt: skip
    ax.set_xticks(worlds)
    ax.set_xlabel("GPUs")
    ax.set_ylabel("sequences / s (median of passes, bars: min-max)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("throughput per mode", fontsize=9)
    if swept:
        ax2 = axes[0][1]
        ms = [r.micro_batches or 0 for r in swept]
        for rank in range(len(swept[0].idle_shares or [])):
            ax2.plot(ms, [100 * (r.idle_shares or [0.0] * (rank + 1))[rank] for r in swept], marker="o",
                     label=f"rank {rank}: measured idle")  # fmt: skip
        ax2.plot(ms, [100 * (r.ideal_bubble or 0.0) for r in swept], linestyle="--", color="grey",
                 label="GPipe (S-1)/(M+S-1)")  # fmt: skip
        ax2.set_xscale("log", base=2)
        ax2.set_xticks(ms)
        ax2.set_xticklabels([str(m) for m in ms])
        ax2.set_xlabel(f"micro-batches (pipeline on {swept[0].world} GPUs, {swept[0].data} data)")
        ax2.set_ylabel("% of the step not computing")
        ax2.set_ylim(bottom=0)
        ax2.grid(True, alpha=0.3)
        ax2.legend(fontsize=8)
        ax2.set_title("bubble: measured against GPipe's", fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return _save(plt, fig, path)


if __name__ == "__main__":
    sys.exit(main())
