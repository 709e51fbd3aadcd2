"""Multi-process training of a stacked LSTM: data parallel (DistributedDataParallel) and model parallel (the
layers split into pipeline stages, one per rank, micro-batches flowing through them), on NCCL across GPUs or
on gloo across CPU processes. This module holds the strategies; a rank process runs them from
:mod:`.rank` (its entry point), and :mod:`.launcher` starts the ranks under torch's elastic agent::

    result = launch("pipeline", 2, TrainConfig(layers=8), "gloo")      # from pytest_lstmperf.workloads.launcher
    torchrun --nproc-per-node 2 -m pytest_lstmperf.workloads.rank --strategy ddp --out result.pt

Every run trains the same model from the same initial weights on the same data and returns rank 0's view
of the trained weights, the real (non-padding) time steps processed, and timings. :func:`single_process`
is the reference both strategies must agree with (same data order; DDP averages the gradients of equal
shards, which is the full batch's mean gradient; the pipeline computes exactly the full model).

A hook for the checks' tests: ``PYTEST_LSTMPERF_RANK_SETUP=module:function`` (:data:`RANK_SETUP_ENV`) is called
in every rank process before it joins the process group, and what it returns (a callable, or None) after the rank
is done. The tests plant a fault there, in the rank processes only, so the distributed result disagrees with the
single-process one (``pytest_lstmperf.testing.rank_faults``); the package imports none of the test helpers itself.

This module imports neither the launcher nor the rank's entry point: they import it.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .varlen import auto_buckets, bucketed_batches, draw_lengths, padded_batches

STRATEGIES = ("ddp", "pipeline")
BALANCES = ("equal", "measured")
#: ``module:function`` each rank calls before joining the group; it returns an undo callable or None
RANK_SETUP_ENV = "PYTEST_LSTMPERF_RANK_SETUP"


@dataclass(frozen=True)
class TrainConfig:
    """The model, the data and the schedule of one training run."""

    layers: int = 4
    input_size: int = 32
    hidden: int = 64
    seq_len: int = 20
    batch: int = 16  # global batch: DDP splits it over ranks; the pipeline splits it into micro-batches
    steps: int = 3
    lr: float = 0.1
    seed: int = 0
    micro_batches: int = 4
    bucketing: bool = False  # variable-length data batched by automatic length buckets instead of padded
    sequences: int = 0  # variable-length dataset size (0: fixed-length batches of seq_len)
    timed_passes: int = 1  # passes over the batches timed after the warm-up pass; the median pass counts
    balance: str = "equal"  # pipeline stages: equal layer counts, or balanced by measured per-layer time
    profile: bool = False  # CUDA: profile one extra step per rank (time in NCCL kernels against all kernels)
    keep_weights: bool = True  # False: the result holds no weights (a benchmark; skips gathering them)

    def __post_init__(self) -> None:
        for name in ("layers", "input_size", "hidden", "seq_len", "batch", "steps", "micro_batches", "timed_passes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.balance not in BALANCES:
            raise ValueError(f"unknown balance {self.balance!r} (valid: {', '.join(BALANCES)})")

    def check_world(self, strategy: str, world: int) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r} (valid: {', '.join(STRATEGIES)})")
        if strategy == "ddp" and self.batch % world:
            raise ValueError(f"DDP needs the batch ({self.batch}) divisible by the world size ({world})")
        if strategy == "pipeline" and self.layers < world:
            raise ValueError(f"a pipeline of {world} stages needs at least {world} layers, got {self.layers}")
        if strategy == "pipeline" and self.batch % self.micro_batches:
            raise ValueError(f"the batch ({self.batch}) must split into {self.micro_batches} micro-batches")


@dataclass
class RunResult:
    strategy: str
    world: int
    backend: str
    weights: dict[str, np.ndarray]
    tokens: int  # real (non-padding) time steps trained on
    seconds: float  # wall time of the timed steps (after one warm-up pass), slowest rank
    comm_seconds: float | None = None  # DDP: time with gradient sync minus time without
    notes: list[str] = field(default_factory=list)
    stages: list[tuple[int, int]] | None = None  # pipeline: the layer range [lo, hi) of each rank
    pass_seconds: list[float] = field(default_factory=list)  # every timed pass (slowest rank), in order
    sequences: int = 0  # sequences trained on per pass
    layer_seconds: list[float] | None = None  # measured balance: each layer's forward+backward, one micro-batch
    issue_seconds: list[float] | None = None  # the host's time to issue those calls (the launch cost)
    transfer_seconds: float | None = None  # pipeline: one send/recv of a micro-batch's activations, rank 0 -> 1
    busy_seconds: list[float] | None = None  # pipeline: per rank, compute time per pass (no waits, no transfers)
    micro_batches: int = 0  # pipeline: micro-batches per step
    profile: list[dict[str, float]] | None = None  # per rank, one profiled step: kernel and NCCL kernel seconds

    @property
    def throughput(self) -> float:
        return self.tokens / self.seconds if self.seconds else float("nan")

    @property
    def sequence_throughput(self) -> float:
        return self.sequences / self.seconds if self.seconds and self.sequences else float("nan")

    @property
    def idle_shares(self) -> list[float] | None:
        """Pipeline: per rank, the share of the step it did not compute (the bubble, stage imbalance and waits
        for transfers): 1 - busy / step."""
        if not self.busy_seconds or not self.seconds:
            return None
        return [max(0.0, 1.0 - busy / self.seconds) for busy in self.busy_seconds]

    @property
    def ideal_bubble(self) -> float | None:
        """GPipe's bubble with equal stages: (S - 1) / (M + S - 1) of the step."""
        if self.strategy != "pipeline" or not self.micro_batches:
            return None
        return (self.world - 1) / (self.micro_batches + self.world - 1)

    @property
    def comm_share(self) -> float | None:
        if self.comm_seconds is None or not self.seconds:
            return None
        return max(self.comm_seconds, 0.0) / self.seconds


# --------------------------------------------------------------------------------------------- model
def build_layers(cfg: TrainConfig) -> list[Any]:
    """The stacked LSTM as single-layer ``nn.LSTM`` modules (so stages can take any of them), seeded."""
    import torch

    torch.manual_seed(cfg.seed)
    return [
        torch.nn.LSTM(cfg.input_size if i == 0 else cfg.hidden, cfg.hidden, batch_first=True) for i in range(cfg.layers)
    ]


def make_batches(cfg: TrainConfig) -> list[tuple[Any, Any, Any]]:
    """``(x, target, lengths)`` per step, on the CPU. Fixed-length unless ``cfg.sequences``."""
    import torch

    gen = torch.Generator().manual_seed(cfg.seed + 1)
    if not cfg.sequences:
        out = []
        for _ in range(cfg.steps):
            x = torch.randn(cfg.batch, cfg.seq_len, cfg.input_size, generator=gen)
            y = torch.randn(cfg.batch, cfg.seq_len, cfg.hidden, generator=gen)
            out.append((x, y, torch.full((cfg.batch,), cfg.seq_len)))
        return out
    lengths = draw_lengths(cfg.sequences, cfg.seq_len, "long-tailed", cfg.seed)
    groups = (
        _full_buckets(bucketed_batches(lengths, auto_buckets(lengths, 8), cfg.batch, cfg.seed), lengths, cfg.batch)
        if cfg.bucketing
        else padded_batches(lengths, cfg.batch)
    )
    out = []
    for index in groups:
        if len(index) < cfg.batch:
            continue  # equal batches keep DDP shards and micro-batches even
        n = torch.as_tensor(lengths[index])
        t = int(n.max())
        x = torch.randn(cfg.batch, t, cfg.input_size, generator=gen)
        y = torch.randn(cfg.batch, t, cfg.hidden, generator=gen)
        out.append((x, y, n))
    return out


def _full_buckets(groups: list[np.ndarray], lengths: np.ndarray, batch: int) -> list[np.ndarray]:
    """The buckets' full batches, then their remainders pooled, sorted by length and cut into full batches: the
    bucketed data holds as many sequences as the padded one (only the last partial batch of each is dropped),
    instead of losing every bucket's remainder."""
    full = [g for g in groups if len(g) == batch]
    rest = [g for g in groups if len(g) < batch]
    pooled = np.concatenate(rest) if rest else np.empty(0, dtype=int)
    pooled = pooled[np.argsort(np.asarray(lengths)[pooled], kind="stable")]
    return full + [pooled[i : i + batch] for i in range(0, len(pooled), batch)]


def _loss(out: Any, y: Any, lengths: Any, total: int) -> Any:
    """Sum of squared errors over the valid steps, divided by ``total`` valid elements of the full batch."""
    import torch

    steps = torch.arange(out.shape[1], device=out.device)[None, :, None]
    valid = steps < lengths.to(out.device)[:, None, None]
    return (((out - y) ** 2) * valid).sum() / total


def _weights(layers: list[Any], offset: int = 0) -> dict[str, np.ndarray]:
    return {
        f"layer{offset + i}.{name}": p.detach().double().cpu().numpy()
        for i, layer in enumerate(layers)
        for name, p in layer.named_parameters()
    }


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --------------------------------------------------------------------------------------------- reference
def single_process(cfg: TrainConfig, device: str = "cpu") -> RunResult:
    """One process, the whole model, the whole batch: the reference of both strategies."""
    import torch

    dev = torch.device(device)
    layers = [layer.to(dev) for layer in build_layers(cfg)]
    params = [p for layer in layers for p in layer.parameters()]
    opt = torch.optim.SGD(params, lr=cfg.lr)
    batches = make_batches(cfg)

    def step(x: Any, y: Any, n: Any) -> None:
        out = x.to(dev)
        for layer in layers:
            out, _ = layer(out)
        opt.zero_grad()
        _loss(out, y.to(dev), n, int(n.sum()) * cfg.hidden).backward()
        opt.step()

    for x, y, n in batches:
        step(x, y, n)
    weights = _weights(layers) if cfg.keep_weights else {}
    times: list[float] = []
    seconds, tokens = _timed_pass(lambda b: step(*b), batches, dev, cfg.timed_passes, times)
    return RunResult("single", 1, "none", weights, tokens, seconds, pass_seconds=times,
                     sequences=_sequences(batches))  # fmt: skip


def _sequences(batches: list) -> int:
    return int(sum(len(b[2]) for b in batches))


def _timed_pass(step: Callable[[Any], None], batches: list, dev: Any, passes: int = 1,
                times: list[float] | None = None) -> tuple[float, int]:  # fmt: skip
    """Median seconds of ``passes`` synchronised passes over ``batches``, and the real time steps of one; every
    pass's seconds are appended to ``times``."""
    times = [] if times is None else times
    for _ in range(passes):
        _sync(dev)
        start = time.perf_counter()
        for batch in batches:
            step(batch)
        _sync(dev)
        times.append(time.perf_counter() - start)
    return float(np.median(times)), int(sum(int(b[2].sum()) for b in batches))


# --------------------------------------------------------------------------------------------- workers
def _device_for(rank: int, backend: str) -> Any:
    import torch

    if backend == "nccl":
        torch.cuda.set_device(rank)
        return torch.device("cuda", rank)
    return torch.device("cpu")


def ddp_worker(rank: int, world: int, cfg: TrainConfig, backend: str) -> RunResult:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dev = _device_for(rank, backend)
    model = torch.nn.Sequential(*[_Unwrap(layer) for layer in build_layers(cfg)]).to(dev)
    ddp = DistributedDataParallel(model, device_ids=[rank] if dev.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=cfg.lr)
    batches = make_batches(cfg)
    share = cfg.batch // world

    def step(batch: Any, sync: bool = True) -> None:
        x, y, n = batch
        lo, hi = rank * share, (rank + 1) * share
        total = int(n[lo:hi].sum()) * cfg.hidden
        context = contextlib.nullcontext() if sync else ddp.no_sync()
        with context:
            out = ddp(x[lo:hi].to(dev))
            opt.zero_grad()
            # mean over this shard; DDP averages the shards' gradients: the full batch's mean when shards are
            # equal (fixed-length data); with variable lengths each shard is weighted equally
            _loss(out, y[lo:hi].to(dev), n[lo:hi], total).backward()
        opt.step()  # also unsynced (the replicas then drift apart, after the weights are taken): same work

    for batch in batches:
        step(batch)
    weights = _weights([m.layer for m in model]) if cfg.keep_weights else {}
    passes: list[float] = []
    seconds, _ = _timed_pass(step, batches, dev, cfg.timed_passes, passes)
    unsynced, _ = _timed_pass(lambda b: step(b, sync=False), batches, dev, cfg.timed_passes)
    times = _gather_max(torch.tensor([seconds, unsynced, *passes], dtype=torch.float64, device=dev), dist)
    tokens_all = _gather_sum(torch.tensor([_shard_tokens(batches, rank, share)], device=dev), dist)
    profiled = _gather_profiles(_profile_step(step, batches[0], dev) if cfg.profile else None, world, dist)
    # the DDP reducer holds the process group and gloo work objects: release them before the group is
    # destroyed, not at interpreter exit (a gloo worker thread torn down then aborts the process)
    ddp = opt = None  # type: ignore[assignment]
    gc.collect()
    return RunResult("ddp", world, backend, weights, int(tokens_all[0]), float(times[0]),
                     comm_seconds=float(times[0] - times[1]), pass_seconds=[float(t) for t in times[2:]],
                     sequences=_sequences(batches), profile=profiled)  # fmt: skip


def _profile_step(step: Callable[[Any], None], batch: Any, dev: Any) -> dict[str, float] | None:
    """One step under the PyTorch profiler (CUDA only): its wall time, the summed time of every GPU kernel and
    copy, and of the NCCL kernels among them (names starting with ``nccl``)."""
    if dev.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    _sync(dev)
    start = time.perf_counter()
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step(batch)
            _sync(dev)
        events = prof.key_averages()
    except RuntimeError:  # a profiler that cannot start (no CUPTI) costs the figure, not the run
        return {"step_s": time.perf_counter() - start, "device_s": float("nan"), "nccl_s": float("nan")}
    wall = time.perf_counter() - start
    device_us = nccl_us = 0.0
    for event in events:
        us = float(getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0.0) or 0.0)
        device_us += us
        if event.key.lower().startswith("nccl"):
            nccl_us += us
    return {"step_s": wall, "device_s": device_us / 1e6, "nccl_s": nccl_us / 1e6}


def _gather_profiles(mine: dict[str, float] | None, world: int, dist: Any) -> list[dict[str, float]] | None:
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, mine)
    return None if any(p is None for p in gathered) else gathered


def _shard_tokens(batches: list, rank: int, share: int) -> int:
    return int(sum(int(n[rank * share : (rank + 1) * share].sum()) for _, _, n in batches))


def _gather_max(t: Any, dist: Any) -> Any:
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.cpu()


def _gather_sum(t: Any, dist: Any) -> Any:
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.cpu()


class _Unwrap:
    """``nn.LSTM`` returns ``(output, state)``; a Sequential stage needs the output only."""

    def __new__(cls, layer: Any) -> Any:
        import torch

        class Stage(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.layer = layer

            def forward(self, x: Any) -> Any:
                return self.layer(x)[0]

        return Stage()


def stage_bounds(layers: int, world: int) -> list[tuple[int, int]]:
    """Contiguous layer ranges per stage, as even as possible (earlier stages take the remainder)."""
    base, extra = divmod(layers, world)
    bounds, start = [], 0
    for rank in range(world):
        size = base + (1 if rank < extra else 0)
        bounds.append((start, start + size))
        start += size
    return bounds


def balanced_bounds(layer_seconds: Sequence[float], stages: int) -> list[tuple[int, int]]:
    """Contiguous layer ranges, one per stage, that minimise the slowest stage's total time (the pipeline's
    throughput is set by its slowest stage). Exact: dynamic programming over split points; among equally
    slow splits, the one whose stages are most even in layer count."""
    times = [float(t) for t in layer_seconds]
    if stages < 1 or len(times) < stages:
        raise ValueError(f"{len(times)} layers cannot fill {stages} pipeline stages (each needs at least one)")
    if not all(t > 0 and t < float("inf") for t in times):
        raise ValueError(f"layer times must be positive and finite, got {times}")
    prefix = np.concatenate([[0.0], np.cumsum(times)])
    n = len(times)
    # best[k][j]: (slowest stage, layer-count spread) of the first j layers in k stages; cut[k][j]: last split
    best: list[list[tuple[float, float]]] = [[(float("inf"), 0.0)] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = (0.0, 0.0)
    for k in range(1, stages + 1):
        for j in range(k, n - (stages - k) + 1):
            for i in range(k - 1, j):
                slowest = max(best[k - 1][i][0], prefix[j] - prefix[i])
                candidate = (slowest, max(best[k - 1][i][1], abs((j - i) - n / stages)))
                if candidate < best[k][j]:
                    best[k][j], cut[k][j] = candidate, i
    bounds, j = [], n
    for k in range(stages, 0, -1):
        bounds.append((cut[k][j], j))
        j = cut[k][j]
    return bounds[::-1]


def measure_layer_seconds(cfg: TrainConfig, device: Any, repeats: int = 3) -> list[float]:
    """Median seconds of one training pass (forward and backward) of each layer on one micro-batch, measured
    on ``device``: what a stage of those layers costs per micro-batch."""
    return measure_layers(cfg, device, repeats)[0]


def measure_layers(cfg: TrainConfig, device: Any, repeats: int = 3) -> tuple[list[float], list[float]]:
    """Per layer, on one micro-batch: the median seconds of a forward and backward pass (synchronised), and the
    median seconds the host took to issue it (until the calls returned, before the synchronisation). Where the
    second is close to the first, the device waits on kernel launches; far below it, compute dominates."""
    import torch

    mb = cfg.batch // cfg.micro_batches
    seconds, issue = [], []
    for i, layer in enumerate(build_layers(cfg)):
        layer = layer.to(device)
        x = torch.randn(mb, cfg.seq_len, cfg.input_size if i == 0 else cfg.hidden, device=device, requires_grad=True)
        samples, issued = [], []
        for _ in range(repeats + 1):  # the first pass warms up (allocations, algorithm choice)
            _sync(device)
            start = time.perf_counter()
            layer(x)[0].sum().backward()
            issued.append(time.perf_counter() - start)
            _sync(device)
            samples.append(time.perf_counter() - start)
        seconds.append(float(np.median(samples[1:])))
        issue.append(float(np.median(issued[1:])))
    return seconds, issue


def _pipeline_bounds(
    cfg: TrainConfig, world: int, rank: int, dev: Any, dist: Any
) -> tuple[list[tuple[int, int]], tuple[list[float], list[float]] | None]:
    """Every rank's layer range: equal layer counts, or (``balance="measured"``) balanced by the per-layer
    times rank 0 measures on its device and sends to every rank (so all ranks split the model the same way);
    and those measurements (per-layer seconds and issue seconds; None with equal stages)."""
    if cfg.balance == "equal":
        return stage_bounds(cfg.layers, world), None
    shared: list[Any] = [measure_layers(cfg, dev) if rank == 0 else None]
    if world > 1:
        dist.broadcast_object_list(shared, src=0)
    return balanced_bounds(shared[0][0], world), shared[0]


def _transfer_seconds(rank: int, world: int, shape: tuple[int, ...], dev: Any, dist: Any,
                      repeats: int = 5) -> float | None:  # fmt: skip
    """Ranks 0 and 1: half the median round trip of a tensor of ``shape`` (one micro-batch's activations) sent
    to rank 1 and back with the point-to-point calls the pipeline uses (after one warm-up round trip); the
    other ranks return at once."""
    import torch

    if world < 2 or rank > 1:
        return None
    buf = torch.randn(*shape, device=dev)
    times = []
    for _ in range(repeats + 1):
        _sync(dev)
        start = time.perf_counter()
        if rank == 0:
            dist.send(buf, dst=1)
            dist.recv(buf, src=1)
        else:
            dist.recv(buf, src=0)
            dist.send(buf, dst=0)
        _sync(dev)
        times.append((time.perf_counter() - start) / 2)
    return float(np.median(times[1:]))


class _BusyClock:
    """Compute time of the timed passes, waits and transfers left out: CUDA events around each compute block
    (they fire when the stream reaches them, so a block's time starts after the receive it waited for), or the
    host clock on the CPU (where compute is synchronous)."""

    def __init__(self, dev: Any) -> None:
        self.cuda = dev.type == "cuda"
        self.dev = dev
        self.on = False
        self.host = 0.0
        self.events: list[tuple[Any, Any]] = []

    @contextlib.contextmanager
    def __call__(self) -> Any:
        if not self.on:
            yield
            return
        if self.cuda:
            import torch

            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            yield
            end.record()
            self.events.append((begin, end))
        else:
            start = time.perf_counter()
            yield
            self.host += time.perf_counter() - start

    def seconds(self) -> float:
        _sync(self.dev)
        return self.host + sum(begin.elapsed_time(end) for begin, end in self.events) / 1e3


def pipeline_worker(rank: int, world: int, cfg: TrainConfig, backend: str) -> RunResult:
    """GPipe schedule: every micro-batch forward through the stages, then every backward in reverse."""
    import torch
    import torch.distributed as dist

    dev = _device_for(rank, backend)
    bounds, measured = _pipeline_bounds(cfg, world, rank, dev, dist)
    lo, hi = bounds[rank]
    transfer = _transfer_seconds(rank, world, (cfg.batch // cfg.micro_batches, cfg.seq_len, cfg.hidden), dev, dist)
    busy = _BusyClock(dev)
    layers = [layer.to(dev) for layer in build_layers(cfg)[lo:hi]]
    params = [p for layer in layers for p in layer.parameters()]
    opt = torch.optim.SGD(params, lr=cfg.lr)
    batches = make_batches(cfg)
    first, last = rank == 0, rank == world - 1

    def step(batch: Any) -> None:
        x, y, n = batch
        t = x.shape[1]
        mb = cfg.batch // cfg.micro_batches
        total = int(n.sum()) * cfg.hidden
        inputs, outputs = [], []
        opt.zero_grad()
        for m in range(cfg.micro_batches):
            if first:
                inp = x[m * mb : (m + 1) * mb].to(dev)
            else:
                inp = torch.empty(mb, t, cfg.hidden if lo > 0 else cfg.input_size, device=dev)
                dist.recv(inp, src=rank - 1)
                inp.requires_grad_(True)
            out = inp
            with busy():
                for layer in layers:
                    out, _ = layer(out)
            if not last:
                dist.send(out.detach().contiguous(), dst=rank + 1)
            inputs.append(inp)
            outputs.append(out)
        for m in reversed(range(cfg.micro_batches)):
            if last:
                sl = slice(m * mb, (m + 1) * mb)
                with busy():
                    _loss(outputs[m], y[sl].to(dev), n[sl], total).backward()
            else:
                grad = torch.empty(outputs[m].shape, dtype=outputs[m].dtype, device=dev)
                dist.recv(grad, src=rank + 1)
                with busy():
                    outputs[m].backward(grad)
            if not first:
                dist.send(inputs[m].grad.contiguous(), dst=rank - 1)
        with busy():
            opt.step()

    for batch in batches:
        step(batch)
    weights = _weights(layers, offset=lo) if cfg.keep_weights else {}
    passes: list[float] = []
    busy.on = True
    seconds, tokens = _timed_pass(step, batches, dev, cfg.timed_passes, passes)
    busy.on = False
    times = _gather_max(torch.tensor([seconds, *passes], dtype=torch.float64, device=dev), dist)
    busy_all: list[Any] = [None] * world
    dist.all_gather_object(busy_all, busy.seconds() / cfg.timed_passes)
    profiled = _gather_profiles(_profile_step(step, batches[0], dev) if cfg.profile else None, world, dist)
    return RunResult("pipeline", world, backend, weights, tokens, float(times[0]), stages=bounds,
                     pass_seconds=[float(t) for t in times[1:]], sequences=_sequences(batches),
                     layer_seconds=measured[0] if measured else None, issue_seconds=measured[1] if measured else None,
                     transfer_seconds=transfer, busy_seconds=[float(b) for b in busy_all],
                     micro_batches=cfg.micro_batches, profile=profiled)  # fmt: skip


WORKERS = {"ddp": ddp_worker, "pipeline": pipeline_worker}


def initial_weights(cfg: TrainConfig) -> dict[str, np.ndarray]:
    return _weights(build_layers(cfg))


def updates(weights: dict[str, np.ndarray], cfg: TrainConfig) -> dict[str, np.ndarray]:
    """What training changed: trained minus initial weights (the sharp thing to compare; the weights
    themselves are dominated by their initial values)."""
    start = initial_weights(cfg)
    return {name: value - start[name] for name, value in weights.items()}


def update_difference(a: RunResult, b: RunResult, cfg: TrainConfig) -> tuple[float, str]:
    """:func:`max_relative_difference` of two runs' weight updates."""
    return max_relative_difference(updates(a.weights, cfg), updates(b.weights, cfg))


def max_relative_difference(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> tuple[float, str]:
    """The largest ``|a - b| / |b|`` (norms) over the tensors both hold, and its tensor's name."""
    if set(a) != set(b):
        missing = sorted(set(a) ^ set(b))
        raise ValueError(f"the runs hold different tensors: {', '.join(missing[:6])}")
    worst, name = 0.0, ""
    for key in a:
        err = float(np.linalg.norm(a[key] - b[key]) / max(np.linalg.norm(b[key]), 1e-300))
        if err > worst:
            worst, name = err, key
    return worst, name
