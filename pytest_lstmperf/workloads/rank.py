"""What one rank process runs: the entry point that torchrun and the plugin's launcher
(:mod:`pytest_lstmperf.workloads.launcher`) start once per rank, with ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT`` set by the torch elastic agent::

    torchrun --nproc-per-node 2 -m pytest_lstmperf.workloads.rank --strategy ddp --out result.pt

A rank calls the
``PYTEST_LSTMPERF_RANK_SETUP`` hook before it joins the process group, trains with its strategy from
:mod:`.distributed`, merges every rank's weights into rank 0's result file, and leaves with ``os._exit``. A rank
that fails prints its traceback and writes it to the agent's per-rank error file (``TORCHELASTIC_ERROR_FILE``),
which torchrun's failure summary shows.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

from .distributed import RANK_SETUP_ENV, STRATEGIES, WORKERS, RunResult, TrainConfig

#: a rank that fails raises this in the worker processes only (tests of the launcher's failure report)
WORKER_RAISE_ENV = "PYTEST_LSTMPERF_WORKER_RAISE"
PROG = "python -m pytest_lstmperf.workloads.rank"


def _setup_from_env() -> Callable[[], None] | None:
    """Call the rank setup that :data:`RANK_SETUP_ENV` names (``package.module:function``); its undo, or None."""
    target = os.environ.get(RANK_SETUP_ENV)
    if not target:
        return None
    module_name, _, function = target.partition(":")
    if not module_name or not function:
        raise ValueError(f"{RANK_SETUP_ENV}={target!r}: expected package.module:function")
    undo = getattr(importlib.import_module(module_name), function)()
    return undo if callable(undo) else None


def run_rank(
    rank: int, world: int, jobs: Sequence[tuple[str, TrainConfig]], backend: str, init: str, out: str
) -> list[RunResult]:
    """One rank's whole life in the process group: train each job (a strategy and its configuration) in turn,
    merge every rank's weights into rank 0's results, wait for every rank, destroy the group. Rank 0 returns the
    results (one per job) and the others an empty list. Raises on any failure (the caller ends the process)."""
    import torch.distributed as dist

    undo = _setup_from_env()
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world)
    if os.environ.get(WORKER_RAISE_ENV) == str(rank):
        raise RuntimeError(f"planted failure in rank {rank} ({WORKER_RAISE_ENV}={rank})")
    results = []
    for strategy, cfg in jobs:
        result = WORKERS[strategy](rank, world, cfg, backend)
        # every rank's weights reach rank 0 (pipeline stages hold different layers; DDP replicas agree)
        gathered: list[Any] = [None] * world
        if cfg.keep_weights:
            dist.all_gather_object(gathered, result.weights)
        if rank == 0:
            merged: dict[str, np.ndarray] = {}
            for part in gathered if cfg.keep_weights else []:
                for name, value in part.items():
                    merged.setdefault(name, value)
            result.weights = merged
            results.append(result)
        gc.collect()
    dist.barrier()  # every rank done with the group before any destroys it
    dist.destroy_process_group()
    if undo is not None:
        undo()
    return results


def _end_process(status: int) -> None:
    """End a rank's process without the interpreter's teardown. By now the result is written, every rank has
    passed the last barrier and the group is destroyed; what is left is interpreter finalization and C++ static
    destructors, which run while threads of the native libraries (c10d, gloo, OpenMP) may still be alive. A
    ``std::thread`` destroyed while joinable there calls std::terminate ("terminate called without an active
    exception", SIGABRT: the abort CI saw once). Nothing remains to clean up, so skip it: flush what the rank
    printed and leave."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


def _record_error(exc: BaseException) -> None:
    """Write ``exc`` to the per-rank error file the elastic agent names (``TORCHELASTIC_ERROR_FILE``; nothing
    where it is unset), in the format of ``torch.distributed.elastic.multiprocessing.errors.record``, whole or not
    at all: into a file beside it, then renamed onto it. torch's own writer opens the file (emptying it) and then
    writes, and a rank stopped by the agent in between, or an agent reading at that moment, left an empty file that
    the agent failed to parse (``JSONDecodeError``, raised out of the launch instead of the ranks' failure; once in
    the test suite on a 2-core VM). Not through ``record`` either: it also enables faulthandler, whose dump of every
    thread on SIGABRT would push a native library's last words out of the tail of the rank's log that the launcher
    reports."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    data = {
        "message": {
            "message": f"{type(exc).__name__}: {exc}",
            "extraInfo": {"py_callstack": traceback.format_exc(), "timestamp": str(int(time.time()))},
        }
    }
    part = f"{path}.{os.getpid()}.part"
    with contextlib.suppress(OSError):
        with open(part, "w", encoding="utf-8") as fp:
            json.dump(data, fp)
        os.replace(part, path)


def write_jobs(path: str, jobs: Sequence[tuple[str, TrainConfig]]) -> None:
    """Write the jobs of one launch for :func:`main`'s ``--jobs`` (a JSON list of strategy and configuration)."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump([{"strategy": strategy, "config": asdict(cfg)} for strategy, cfg in jobs], f)


def read_jobs(path: str) -> list[tuple[str, TrainConfig]]:
    """The jobs :func:`write_jobs` wrote; raises ValueError naming a strategy or setting that is not known."""
    with open(path, encoding="utf-8") as f:
        raw = json.load(f)
    known = set(asdict(TrainConfig()))
    jobs = []
    for job in raw:
        if job.get("strategy") not in STRATEGIES:
            raise ValueError(f"unknown strategy {job.get('strategy')!r} (valid: {', '.join(STRATEGIES)})")
        unknown = sorted(set(job.get("config", {})) - known)
        if unknown:
            raise ValueError(f"unknown setting(s) {', '.join(unknown)} (valid: {', '.join(sorted(known))})")
        jobs.append((job["strategy"], TrainConfig(**job["config"])))
    return jobs


def main(argv: list[str] | None = None) -> int:
    """Entry point of a rank (reads RANK, WORLD_SIZE, MASTER_ADDR/PORT from the environment)."""
    parser = argparse.ArgumentParser(prog=PROG)
    parser.add_argument("--strategy", choices=STRATEGIES, default="ddp")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default=None, help="default: nccl with GPUs, else gloo")
    parser.add_argument("--out", required=True, help="rank 0 writes its result here (torch.save of a dict)")
    parser.add_argument(
        "--jobs",
        help="a JSON file of several runs, each a strategy and its settings, trained in turn in one process group "
        "(instead of --strategy and the settings); rank 0 writes a list of results",
    )
    for name, value in asdict(TrainConfig()).items():
        kind = (lambda s: s.lower() in ("1", "true", "yes")) if isinstance(value, bool) else type(value)
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=value)
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        parser.error("run under torchrun (RANK and WORLD_SIZE unset)")
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    try:
        jobs = read_jobs(args.jobs) if args.jobs else [
            (args.strategy, TrainConfig(**{k: getattr(args, k) for k in asdict(TrainConfig())}))
        ]  # fmt: skip
        for strategy, cfg in jobs:
            cfg.check_world(strategy, world)
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    import torch

    backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    try:
        results = run_rank(rank, world, jobs, backend, "env://", args.out)
        if rank == 0:
            torch.save([asdict(r) for r in results] if args.jobs else asdict(results[0]), args.out)
    except BaseException as exc:
        traceback.print_exc()
        _record_error(exc)
        _end_process(1)
    for result in results:
        comm = "" if result.comm_share is None else f", communication {100 * result.comm_share:.0f}% of the step time"
        print(f"{result.strategy} on {world} ranks ({backend}): {result.tokens} time steps in {result.seconds:.3f} s "
              f"= {result.throughput:.4g} steps/s{comm}; result written to {args.out}", flush=True)  # fmt: skip
    _end_process(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
