"""Starting the ranks of a distributed run: torch's elastic launcher (``elastic_launch``, the engine of torchrun),
plus what the plugin needs around it: a clear report of a rank that fails and a deadline.

:func:`launch` runs one process per rank (``python -m pytest_lstmperf.workloads.rank``, the entry point torchrun
runs too) under a local elastic agent: c10d rendezvous on a port the system picks while the agent's store listens on
it (the ranks are clients of the agent's store, so no rank's exit takes it away from the others), no restarts, each
rank's stdout and stderr in its own log file and its Python error in the agent's per-rank error file. The agent
stops the other ranks when one fails; the :class:`torch.distributed.elastic.multiprocessing.errors.ChildFailedError`
it raises becomes a :class:`RankFailure` that names the rank, its exit status or signal and the last lines of its
log. The agent has no deadline of its own: :class:`_Deadline` kills the ranks when ``timeout_s`` has passed, and the
agent reports them like any failed rank.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import math
import os
import signal
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from .distributed import RunResult, TrainConfig
from .rank import write_jobs

RANK_MODULE = "pytest_lstmperf.workloads.rank"
TAIL_LINES = 8
MONITOR_S = 0.1  # how often the agent looks at its ranks, and the deadline for ranks it has not seen yet
SHUTDOWN_S = 5  # a rank the agent stops gets SIGTERM, and SIGKILL this much later
#: the signals the agent handles while it runs (it stops the ranks, then this process gets the signal back)
AGENT_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")


class RankFailure(RuntimeError):
    """A rank process failed: the message names the rank, its exit code or signal and its last output lines."""


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask, which containers and taskset narrow)."""
    with contextlib.suppress(AttributeError, OSError):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def launch(strategy: str, world: int, cfg: TrainConfig, backend: str = "gloo", timeout_s: float = 600) -> RunResult:
    """Run ``strategy`` on ``world`` processes (gloo: CPU; nccl: one GPU each) and return rank 0's result.
    A rank that fails raises :class:`RankFailure` with that rank's own error; a run past ``timeout_s`` raises
    :class:`TimeoutError` after its ranks are stopped."""
    return launch_jobs([(strategy, cfg)], world, backend, timeout_s)[0]


def launch_jobs(
    jobs: Sequence[tuple[str, TrainConfig]], world: int, backend: str = "gloo", timeout_s: float = 600
) -> list[RunResult]:
    """Run several jobs (a strategy and its configuration each) one after the other in one launch of ``world``
    ranks, and return rank 0's results in their order: the ranks start, import torch and join the process group
    once for all of them. Failures and the deadline as for :func:`launch` (the deadline covers every job)."""
    import torch

    if not jobs:
        raise ValueError("no jobs to launch")
    for strategy, cfg in jobs:
        cfg.check_world(strategy, world)
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"unknown backend {backend!r} (valid: gloo, nccl)")
    if backend == "nccl" and torch.cuda.device_count() < world:
        raise ValueError(f"nccl with {world} ranks needs {world} GPUs, {torch.cuda.device_count()} usable")
    names = "+".join(dict.fromkeys(strategy for strategy, _ in jobs))
    what = f"{names} on {world} rank{'s' if world > 1 else ''} ({backend})"
    with tempfile.TemporaryDirectory(prefix="lstmperf-dist-") as tmp:
        out, jobs_file = os.path.join(tmp, "result.pt"), os.path.join(tmp, "jobs.json")
        write_jobs(jobs_file, jobs)
        command = [sys.executable, "-m", RANK_MODULE, "--jobs", jobs_file, "--backend", backend, "--out", out]
        run_ranks(command, world, what, tmp, timeout_s, env=_rank_env(world, backend))
        data = torch.load(out, weights_only=False)
    return [RunResult(**d) for d in data]


def _rank_env(world: int, backend: str) -> dict[str, str]:
    """What the ranks need in their environment besides what the agent sets (RANK, WORLD_SIZE, MASTER_ADDR, ...)."""
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {"PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)}
    if backend == "gloo":  # ranks share the host's cores instead of each starting one thread per core
        env["OMP_NUM_THREADS"] = str(max(1, available_cores() // world))
    return env


def run_ranks(
    command: Sequence[str],
    world: int,
    what: str,
    log_dir: str,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
) -> None:
    """Run ``command`` once per rank under a local elastic agent and wait for every rank to exit 0. The first rank to
    fail stops the others (the agent does that) and raises :class:`RankFailure`: which rank, how, and its last
    lines. Past ``timeout_s`` the ranks are killed and :class:`TimeoutError` says which were stopped. ``env`` is
    added to the ranks' environment; the logs go under ``log_dir``."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException, Std
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    run_id = f"lstmperf-{uuid.uuid4().hex[:16]}"
    settings: dict[str, Any] = dict(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=world,
        run_id=run_id,
        rdzv_backend="c10d",
        rdzv_endpoint="127.0.0.1:0",  # the agent's store listens on a port the system picks: no port to race for
        rdzv_configs={"join_timeout": max(1, math.ceil(timeout_s))},
        local_addr="127.0.0.1",
        max_restarts=0,
        monitor_interval=MONITOR_S,
        start_method="spawn",  # for function entry points; the ranks here are commands (see below)
        logs_specs=DefaultLogsSpecs(log_dir=log_dir, redirects=Std.ALL),
        signals_to_handle=",".join(AGENT_SIGNALS),
        shutdown_timeout=SHUTDOWN_S,
    )
    # the settings this torch release knows (torch 2.11's LaunchConfig has no shutdown_timeout: the agent's own
    # default grace period applies there)
    known = {f.name for f in dataclasses.fields(LaunchConfig)}
    config = LaunchConfig(**{k: v for k, v in settings.items() if k in known})
    # the agent writes the signals it handles into the environment and installs handlers it does not undo
    launcher_env = {**(env or {}), "TORCHELASTIC_SIGNALS_TO_HANDLE": ",".join(AGENT_SIGNALS)}
    failure: Any = None  # the agent's ChildFailedError
    error: Exception | None = None  # anything else the agent raised once the deadline had passed
    received: signal.Signals | None = None
    with _environment(launcher_env), _signal_handlers_kept(AGENT_SIGNALS), _Deadline(run_id, timeout_s) as deadline:
        try:
            # a command, not a function: a rank is the process torchrun starts, it leaves with os._exit (no
            # interpreter teardown under live gloo threads), and it does not re-import this process's __main__
            elastic_launch(config, command[0])(*command[1:])
        except ChildFailedError as exc:
            failure = exc
        except SignalException as exc:
            received = exc.sigval  # the agent has stopped the ranks
        except Exception as exc:
            if not deadline.expired:
                raise
            error = exc
    if received is not None:
        signal.raise_signal(received)  # what this process does with it (SIGINT: KeyboardInterrupt)
        raise RuntimeError(f"{what} stopped: this process received {received.name}")
    logs = RankLogs(log_dir, run_id)
    if deadline.expired and (failure is not None or error is not None or deadline.stopped):
        raise TimeoutError(f"{what} did not finish in {timeout_s:.0f} s (stopped ranks {sorted(deadline.stopped)}); "
                           f"last lines of rank 0: {' | '.join(_tail(logs.paths(0), 3))}") from error  # fmt: skip
    if failure is not None:
        exits = {rank: f.exitcode for rank, f in failure.failures.items()}
        raise RankFailure(failure_report(what, first_failed_first(exits, logs), logs))


# --------------------------------------------------------------------------------------------- the report
def first_failed_first(exits: Mapping[int, int], logs: RankLogs) -> dict[int, int]:
    """``exits`` (rank -> exit status, in the agent's order) with the ranks that ended by themselves ordered by when
    their output was last written: the agent lists the ranks whose failure it saw in one check by rank, and a
    rank whose peer failed fails too moments later (its connection closed), so the rank that failed first is the
    one whose last words came first. A first rank killed by a signal keeps the agent's order."""
    ranks = list(exits)
    stop_codes = (-signal.SIGTERM, -signal.SIGKILL)
    if not ranks or exits[ranks[0]] < 0:
        return dict(exits)

    def last_written(rank: int) -> float:
        times = [os.stat(p).st_mtime_ns for p in logs.paths(rank) if os.path.exists(p)]
        return max(times) if times else math.inf

    ended = sorted((r for r in ranks if exits[r] not in stop_codes), key=last_written)
    return {r: exits[r] for r in [*ended, *(r for r in ranks if exits[r] in stop_codes)]}


def failure_report(what: str, exits: Mapping[int, int], logs: RankLogs) -> str:
    """The report of a failed run from the exit status of each rank the agent reported (negative: killed by that
    signal), in the agent's order: first the ranks whose failure it saw, then those it stopped (with SIGTERM, or
    SIGKILL when they outlived the grace period). The first rank failed; a later one killed by either signal was
    stopped; a later one that ended otherwise failed as well."""
    ranks = list(exits)
    stop_codes = (-signal.SIGTERM, -signal.SIGKILL)
    failed = ranks[:1] + [rank for rank in ranks[1:] if exits[rank] not in stop_codes]
    stopped = [rank for rank in ranks if rank not in failed]
    lines = [f"{what} failed: rank {rank} {_how_it_ended(exits[rank])}" for rank in failed]
    if stopped:
        lines[0] += f" (stopped rank{'s' if len(stopped) > 1 else ''} {', '.join(map(str, stopped))})"
    for rank in failed:
        lines += [f"  rank {rank}, last lines of its output:", *(f"    {x}" for x in _tail(logs.paths(rank)))]
    return "\n".join(lines)


def _how_it_ended(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with status {code}"


class RankLogs:
    """A rank's log files, where the agent's ``DefaultLogsSpecs`` puts them:
    ``<log_dir>/<run_id>_<random>/attempt_0/<rank>/{stderr,stdout}.log``."""

    def __init__(self, log_dir: str, run_id: str) -> None:
        self.pattern = os.path.join(glob.escape(log_dir), f"{glob.escape(run_id)}_*", "attempt_0")

    def paths(self, rank: int) -> list[str]:
        """The rank's stderr log, then its stdout log (a traceback and a native library's last words go to
        stderr; stdout is read where stderr is empty)."""
        found = glob.glob(os.path.join(self.pattern, str(rank)))
        base = found[0] if found else os.path.join(self.pattern, str(rank))
        return [os.path.join(base, "stderr.log"), os.path.join(base, "stdout.log")]


def _tail(paths: Sequence[str], lines: int = TAIL_LINES) -> list[str]:
    """The last non-blank lines of the first of ``paths`` that holds any."""
    errors = []
    for path in paths:
        try:
            with open(path, errors="replace") as fh:
                kept = [line for line in fh.read().splitlines() if line.strip()]
        except OSError as exc:
            errors.append(exc)
            continue
        if kept:
            return kept[-lines:]
    if errors and len(errors) == len(paths):
        return [f"(its output could not be read: {errors[0]})"]
    return ["(it printed nothing)"]


# --------------------------------------------------------------------------------------------- around the agent
class _Deadline:
    """Kills this launch's ranks once ``timeout_s`` has passed (the elastic agent waits for its ranks without a
    limit), then every rank of the launch the agent starts after that, until the launch ends. A rank is found
    as a child of this process whose environment carries the launch's run id (``/proc``, Linux: as the agent's own
    check of ranks stuck in uninterruptible sleep); its whole process group is killed (the agent starts each rank
    in a session of its own). The agent then sees the ranks die and reports them."""

    def __init__(self, run_id: str, timeout_s: float) -> None:
        self.run_id, self.timeout_s = run_id, timeout_s
        self.expired = False
        self.stopped: set[int] = set()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"deadline {run_id}", daemon=True)

    def __enter__(self) -> _Deadline:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        if self._done.wait(self.timeout_s):
            return
        self.expired = True
        while not self._done.is_set():
            for rank, pid in rank_processes(self.run_id).items():
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
                self.stopped.add(rank)
            self._done.wait(MONITOR_S)


def rank_processes(run_id: str) -> dict[int, int]:
    """rank -> pid of the live rank processes of the launch ``run_id``: children of this process whose environment
    has ``TORCHELASTIC_RUN_ID=run_id`` (empty where ``/proc`` is missing)."""
    me, found = str(os.getpid()), {}
    marker = f"TORCHELASTIC_RUN_ID={run_id}".encode()
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat") as fh:
                    state, parent = fh.read().rpartition(")")[2].split()[:2]
                if parent != me or state in ("Z", "X"):
                    continue
                with open(f"/proc/{entry.name}/environ", "rb") as fh:
                    env = fh.read().split(b"\0")
            except (OSError, ValueError):
                continue
            if marker in env:
                rank = next((v[5:] for v in env if v.startswith(b"RANK=")), b"")
                if rank.isdigit():
                    found[int(rank)] = int(entry.name)
    return found


@contextlib.contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    """``values`` in this process's environment while the agent runs (it passes its environment to the ranks),
    the previous values after."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def _signal_handlers_kept(names: Sequence[str]) -> Iterator[None]:
    """The handlers of ``names`` as they were before the agent replaced them (in the main thread only, where it
    installs its own and leaves them: after a launch, Ctrl-C would no longer raise KeyboardInterrupt)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {}
    for name in names:
        with contextlib.suppress(AttributeError, ValueError):
            number = getattr(signal, name)
            saved[number] = signal.getsignal(number)
    try:
        yield
    finally:
        for number, handler in saved.items():
            if handler is not None:
                signal.signal(number, handler)
