"""Scale-out: a stacked LSTM trained data parallel (DistributedDataParallel) and model parallel (a pipeline
of layer stages with micro-batches) on several processes, against the single-process run.

    pytest suites/test_scaling.py --device=cuda --lstmperf-report=report/     # NCCL, 1..N GPUs
    pytest suites/test_scaling.py --device=cpu                                # gloo, 2 CPU processes

* the trained weights of both strategies agree with one process training the whole model on the whole
  batch (same data order), within the tolerance model's pairwise backward bound per step;
* throughput (real time steps per second), speedup over one rank, scaling efficiency, the ratio to plain
  single-device training (whole model, whole batch, no micro-batches) and, for DDP, the communication share,
  for each world size, with fixed-length, padded and bucketed variable-length data (strong scaling: one
  global batch), and DDP with a fixed batch per rank (weak scaling); every run must have trained on exactly
  the dataset's time steps.

On CUDA the world sizes are 2..(usable GPUs) (NCCL); with fewer than 2 GPUs the GPU tests skip with that
reason. On the CPU they run on 2 gloo processes (the launcher and the merge of rank results, as in CI): the
ranks share the cores the one-rank run had to itself, so the CPU figures carry a note that they are not
scaling figures. Each launch prints a progress line (``scaling: ...``) as it ends.

The thorough CUDA set is sized by measurement so that a pipeline stage's compute dominates kernel launches and
the transfer of activations between GPUs (docs/scaling.md: on 2 H200s a layer's forward and backward pass on a
micro-batch of 64 took 12.1 ms, 2.7x the host's time to issue it and 64x the micro-batch's transfer; the gate
size is launch-bound); its pipeline runs 8 micro-batches with stages balanced by measured per-layer time.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import pytest

from pytest_lstmperf.hooks.workloads import add_row
from pytest_lstmperf.speed.shapes import bench_set
from pytest_lstmperf.workloads.rows import ScalingRow

torch = pytest.importorskip("torch")

from pytest_lstmperf.model.spec import LayerSpec  # noqa: E402
from pytest_lstmperf.numerics.tolerance import pairwise_tolerance  # noqa: E402
from pytest_lstmperf.workloads import distributed as dist  # noqa: E402
from pytest_lstmperf.workloads import launcher  # noqa: E402

# (layers, input, hidden, seq_len, batch, steps) for the equivalence runs
EQUIV = {"cpu": (4, 16, 32, 12, 8, 3), "cuda": (8, 256, 512, 50, 64, 3)}
# throughput runs: (layers, input, hidden, seq_len / max length, batch, sequences for the variable-length data)
THROUGHPUT = {
    # CPU: what the runs check (every time step trained on, the launcher, the merge, the rows) needs no size;
    # the figures there are not scaling figures anyway (ranks share the cores)
    ("cpu", "gate"): (4, 16, 32, 24, 16, 128),
    ("cpu", "thorough"): (8, 64, 128, 100, 32, 1024),
    ("cuda", "gate"): (8, 256, 512, 100, 64, 2048),
    # measured on 2 H200s (docs/scaling.md, python -m pytest_lstmperf.workloads.scalebench): a layer's pass on a
    # micro-batch of 64 is 2.7x its issue time and 64x its transfer; the gate size above is launch-bound
    ("cuda", "thorough"): (8, 1024, 2048, 100, 512, 4096),
}
# the pipeline's schedule per set: (micro-batches, stage balance)
SCHEDULE = {"gate": (4, "equal"), "thorough": (8, "measured")}
STEPS = {"cpu": 4, "cuda": 8}  # fixed-length batches per pass


def _worlds(lstmperf: Any) -> tuple[str, list[int], str | None]:
    """(backend, world sizes, reason to skip)"""
    if lstmperf.device.kind == "cuda":
        count = torch.cuda.device_count()
        if count < 2:
            return "nccl", [], f"{count} usable GPU: data and model parallel training need 2 or more"
        return "nccl", list(range(2, count + 1)), None
    return "gloo", [2], None


def _precision(kind: str) -> str:
    return "tf32" if kind == "cuda" and torch.backends.cudnn.allow_tf32 else "fp32"


@pytest.mark.parametrize("strategy", dist.STRATEGIES)
def test_trained_weights_match_single_process(lstmperf: Any, pytestconfig: pytest.Config, strategy: str) -> None:
    backend, worlds, reason = _worlds(lstmperf)
    if reason:
        pytest.skip(reason)
    layers, input_size, hidden, seq, batch, steps = EQUIV[lstmperf.device.kind]
    cfg = dist.TrainConfig(layers=layers, input_size=input_size, hidden=hidden, seq_len=seq, batch=batch,
                           steps=steps, micro_batches=4, seed=lstmperf.seed)  # fmt: skip
    reference = dist.single_process(cfg, "cuda:0" if backend == "nccl" else "cpu")
    spec = LayerSpec(input_size=input_size, hidden_size=hidden, num_layers=layers, batch=batch, seq_len=seq)
    bound = pairwise_tolerance(_precision(lstmperf.device.kind), "backward", spec)
    failures = []
    for world in worlds:
        result = _launch(pytestconfig, strategy, world, cfg, backend, "equivalence check")
        err, name = dist.max_relative_difference(
            dist.updates(result.weights, cfg), dist.updates(reference.weights, cfg)
        )
        if not err <= bound.rel * steps:
            failures.append(
                f"{strategy} on {world} ranks ({backend}): weight updates differ from the single-process run by "
                f"{err:.3e} ({name}) > {steps} steps x {bound.rel:.3e} ({bound.explain()})"
            )
    assert not failures, "\n".join(failures)


def check_tokens(result: dist.RunResult, expected: int) -> None:
    """Every real time step of the dataset trained on, exactly once per pass."""
    assert result.tokens == expected, (
        f"{result.strategy} on {result.world} ranks trained on {result.tokens} time steps per pass, "
        f"the data holds {expected}"
    )


DATA = ("fixed-length", "padded", "bucketed")


@pytest.mark.parametrize("strategy", dist.STRATEGIES)
def test_scaling_throughput(
    lstmperf: Any, pytestconfig: pytest.Config, request: pytest.FixtureRequest, strategy: str
) -> None:
    """Fixed-length batches; variable-length (long-tailed) batches padded in arrival order; the same data in
    automatically generated length buckets. On the CPU the three are trained one after the other in each launch
    (the ranks start and join once); each gets its rows."""
    backend, worlds, reason = _worlds(lstmperf)
    if reason:
        pytest.skip(reason)
    kind, bset = lstmperf.device.kind, bench_set(pytestconfig)
    layers, input_size, hidden, seq, batch, sequences = THROUGHPUT[(kind, bset)]
    micro_batches, balance = SCHEDULE[bset]
    cfgs = {
        data: dist.TrainConfig(layers=layers, input_size=input_size, hidden=hidden, seq_len=seq, batch=batch,
                               steps=STEPS[kind], micro_batches=micro_batches, balance=balance, seed=lstmperf.seed,
                               bucketing=data == "bucketed", timed_passes=_timed_passes(lstmperf),
                               sequences=0 if data == "fixed-length" else sequences)
        for data in DATA
    }  # fmt: skip
    expected = {data: int(sum(int(n.sum()) for _, _, n in dist.make_batches(cfg))) for data, cfg in cfgs.items()}
    # plain training in this process (the whole model, the whole batch, no micro-batches): what either
    # strategy has to beat to be worth its GPUs
    plain = {data: dist.single_process(cfg, "cuda:0" if backend == "nccl" else "cpu") for data, cfg in cfgs.items()}
    for data in DATA:
        check_tokens(plain[data], expected[data])
    runs: dict[str, list[dist.RunResult]] = {data: [] for data in DATA}
    # gloo: the three kinds of data in one launch (a rank's start, importing torch and Dynamo, is most of a CPU
    # launch); nccl: a launch each, so that no kind is timed on GPUs whose memory another kind's run left behind
    groups = [DATA] if backend == "gloo" else [(data,) for data in DATA]
    for world in [1, *worlds]:
        for group in groups:
            results = _launch_jobs(
                pytestconfig,
                [(strategy, cfgs[data]) for data in group],
                world,
                backend,
                tuple(f"{data} data" for data in group),
            )
            for data, result in zip(group, results, strict=True):
                check_tokens(result, expected[data])
                runs[data].append(result)
    model = f"{layers}x LSTM {input_size}->{hidden}, batch {batch}, T<={seq}"
    if strategy == "pipeline":
        model += f", {micro_batches} micro-batches, {balance} stages"
    for data in DATA:
        _rows(request, runs[data], plain[data], data, model)


def _launch(config: pytest.Config, strategy: str, world: int, cfg: dist.TrainConfig, backend: str,
            what: str) -> dist.RunResult:  # fmt: skip
    return _launch_jobs(config, [(strategy, cfg)], world, backend, (what,))[0]


def _launch_jobs(config: pytest.Config, jobs: list[tuple[str, dist.TrainConfig]], world: int, backend: str,
                 whats: tuple[str, ...]) -> list[dist.RunResult]:  # fmt: skip
    """One launch of ``world`` ranks for ``jobs``; a progress line per job (``whats``: what each one is)."""
    start = time.monotonic()
    results = launcher.launch_jobs(jobs, world, backend)
    took = f"[{time.monotonic() - start:.0f} s{f' for {len(jobs)} runs' if len(jobs) > 1 else ''}]"
    for (strategy, _), what, result in zip(jobs, whats, results, strict=True):
        stages = f", stages {result.stages}" if result.stages and world > 1 else ""
        progress(config, f"{strategy}, {what}, {world} rank{'s' if world > 1 else ''} "
                         f"({backend}): {result.throughput:.3g} steps/s{stages} {took}")  # fmt: skip
    return results


def progress(config: pytest.Config, message: str) -> None:
    """A line on the terminal while a long test runs (pytest itself shows one dot per finished test)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or hasattr(config, "workerinput") or config.get_verbosity() < -1:
        return
    capman = config.pluginmanager.get_plugin("capturemanager")
    with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
        reporter.ensure_newline()
        reporter.write_line(f"scaling: {message}")


def core_note(result: dist.RunResult, cores: int | None = None) -> str:
    """Why a CPU figure is not a scaling figure: gloo ranks share the host's cores, which the one-rank run
    (and plain training) had to itself."""
    if result.backend != "gloo" or result.world < 2:
        return ""
    cores = launcher.available_cores() if cores is None else cores
    return (f"not a scaling figure: {result.world} ranks share {cores} available CPU core{'s' if cores != 1 else ''} "
            f"(os.sched_getaffinity), about {cores / result.world:.3g} per rank, where 1 rank had {cores}")  # fmt: skip


def _rows(request: pytest.FixtureRequest, runs: list, plain: dist.RunResult, data: str, model: str) -> None:
    one = runs[0].throughput
    for result in runs:
        add_row(request, ScalingRow(strategy=result.strategy, data=data,
                                    world=result.world, backend=result.backend, throughput=result.throughput,
                                    speedup=result.throughput / one, efficiency=result.throughput / one / result.world,
                                    vs_plain=result.throughput / plain.throughput,
                                    comm_share=result.comm_share if result.world > 1 else None, model=model,
                                    note=core_note(result)))  # fmt: skip


def test_ddp_weak_scaling(lstmperf: Any, pytestconfig: pytest.Config, request: pytest.FixtureRequest) -> None:
    """Data parallel as it is usually run: the batch per rank fixed, the global batch growing with the ranks
    (fixed-length data). Speedup and the plain baseline are taken at one rank's batch."""
    backend, worlds, reason = _worlds(lstmperf)
    if reason:
        pytest.skip(reason)
    kind = lstmperf.device.kind
    layers, input_size, hidden, seq, batch, _ = THROUGHPUT[(kind, bench_set(pytestconfig))]
    runs = []
    plain = None
    for world in [1, *worlds]:
        cfg = dist.TrainConfig(layers=layers, input_size=input_size, hidden=hidden, seq_len=seq, batch=batch * world,
                               steps=STEPS[kind], seed=lstmperf.seed, timed_passes=_timed_passes(lstmperf))  # fmt: skip
        if plain is None:
            plain = dist.single_process(cfg, "cuda:0" if backend == "nccl" else "cpu")
        result = _launch(pytestconfig, "ddp", world, cfg, backend, "fixed-length data, weak scaling")
        check_tokens(result, cfg.steps * cfg.batch * seq)
        runs.append(result)
    assert plain is not None
    _rows(request, runs, plain, "fixed, weak", f"{layers}x LSTM {input_size}->{hidden}, batch {batch}/rank, T={seq}")


def _timed_passes(lstmperf: Any) -> int:
    return 3 if lstmperf.device.kind == "cuda" else 1
