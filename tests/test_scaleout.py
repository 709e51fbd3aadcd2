"""Scale-out: the distributed strategies on gloo (CPU), the launcher (torch's elastic agent: failure reports, the
deadline, what it leaves behind), torchrun, the suite's checks failing when a fault is planted in the workers, and
pytest-xdist's one-worker-per-GPU pinning."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from forked_pytest import runpytest_forked
from pytester_runs import clear_inner_env

torch = pytest.importorskip("torch")

from pytest_lstmperf import device as device_mod  # noqa: E402
from pytest_lstmperf.testing.rank_faults import WORKER_PLANT_ENV, rank_fault_env  # noqa: E402
from pytest_lstmperf.workloads import distributed as dist  # noqa: E402
from pytest_lstmperf.workloads import launcher  # noqa: E402
from pytest_lstmperf.workloads import rank as rank_entry  # noqa: E402
from pytest_lstmperf.workloads import scalebench as sb  # noqa: E402

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[1]


def test_stage_bounds_cover_every_layer_once() -> None:
    assert dist.stage_bounds(8, 2) == [(0, 4), (4, 8)]
    assert dist.stage_bounds(5, 3) == [(0, 2), (2, 4), (4, 5)]
    assert dist.stage_bounds(3, 3) == [(0, 1), (1, 2), (2, 3)]


def _slowest(times: list[float], bounds: list[tuple[int, int]]) -> float:
    return max(sum(times[lo:hi]) for lo, hi in bounds)


@pytest.mark.parametrize(("times", "stages", "expected"), [
    ([1.0] * 8, 2, [(0, 4), (4, 8)]),  # equal layers: equal counts
    ([1.0] * 8, 4, [(0, 2), (2, 4), (4, 6), (6, 8)]),
    ([0.25, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0], 2, [(0, 4), (4, 8)]),  # a cheap first layer: equal is best here
    ([4.0, 1.0, 1.0, 1.0, 1.0], 2, [(0, 1), (1, 5)]),  # one expensive layer gets a stage of its own
    ([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 4.0], 4, [(0, 2), (2, 4), (4, 7), (7, 8)]),  # an expensive last layer
    ([2.0, 1.0, 1.0], 3, [(0, 1), (1, 2), (2, 3)]),  # as many stages as layers
])  # fmt: skip
def test_balanced_bounds_minimise_the_slowest_stage(times: list[float], stages: int, expected: list) -> None:
    bounds = dist.balanced_bounds(times, stages)
    assert bounds == expected
    assert bounds[0][0] == 0 and bounds[-1][1] == len(times)
    assert all(a[1] == b[0] and a[0] < a[1] for a, b in itertools.pairwise(bounds))
    # no contiguous split is faster (brute force over every split)
    best = min(
        _slowest(times, list(zip((0, *cuts), (*cuts, len(times)), strict=True)))
        for cuts in itertools.combinations(range(1, len(times)), stages - 1)
    )
    assert _slowest(times, bounds) == best


def test_balanced_bounds_beat_equal_counts_on_unequal_layers() -> None:
    times = [4.0, 1.0, 1.0, 1.0, 1.0]
    assert _slowest(times, dist.balanced_bounds(times, 2)) == 4.0 < _slowest(times, dist.stage_bounds(5, 2)) == 6.0
    times = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 4.0]
    assert _slowest(times, dist.balanced_bounds(times, 4)) == 4.0 < _slowest(times, dist.stage_bounds(8, 4)) == 5.0


@pytest.mark.parametrize(("times", "stages", "message"), [
    ([1.0, 1.0], 3, "2 layers cannot fill 3 pipeline stages"),
    ([1.0, 0.0, 1.0], 2, "layer times must be positive and finite"),
    ([1.0, float("nan")], 2, "layer times must be positive and finite"),
    ([1.0, 2.0], 0, "cannot fill 0 pipeline stages"),
])  # fmt: skip
def test_balanced_bounds_refuse_bad_input(times: list[float], stages: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dist.balanced_bounds(times, stages)


def test_layer_times_are_measured_for_every_layer() -> None:
    """One positive time per layer (their values are the machine's: no bound on them in a unit test)."""
    cfg = dist.TrainConfig(layers=3, input_size=4, hidden=64, seq_len=8, batch=4, micro_batches=2)
    times = dist.measure_layer_seconds(cfg, torch.device("cpu"), repeats=1)
    assert len(times) == 3 and all(t > 0 for t in times)


@pytest.mark.parametrize(("strategy", "world", "kwargs", "message"), [
    ("ddp", 3, {"batch": 8}, "divisible by the world size"),
    ("pipeline", 4, {"layers": 2}, "needs at least 4 layers"),
    ("pipeline", 2, {"batch": 6, "micro_batches": 4}, "must split into 4 micro-batches"),
    ("zero", 2, {}, "unknown strategy 'zero' (valid: ddp, pipeline)"),
])  # fmt: skip
def test_bad_configurations(strategy: str, world: int, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        dist.TrainConfig(**kwargs).check_world(strategy, world)
    with pytest.raises(ValueError, match="layers must be >= 1"):
        dist.TrainConfig(layers=0)
    with pytest.raises(ValueError, match=r"unknown balance 'fast' \(valid: equal, measured\)"):
        dist.TrainConfig(balance="fast")


def test_relative_difference_needs_the_same_tensors() -> None:
    import numpy as np

    a = {"x": np.ones(3)}
    assert dist.max_relative_difference(a, {"x": np.ones(3)}) == (0.0, "")
    with pytest.raises(ValueError, match="different tensors: x, y"):
        dist.max_relative_difference(a, {"y": np.ones(3)})


@pytest.mark.parametrize("strategy", dist.STRATEGIES)
def test_gloo_two_ranks_match_single_process(strategy: str) -> None:
    # the pipeline splits its 3 layers by time rank 0 measures and sends to rank 1
    cfg = dist.TrainConfig(layers=3, input_size=4, hidden=8, seq_len=5, batch=4, steps=2, micro_batches=2,
                           balance="measured")  # fmt: skip
    result = launcher.launch(strategy, 2, cfg, "gloo", timeout_s=300)
    reference = dist.single_process(cfg)
    err, _ = dist.update_difference(result, reference, cfg)
    assert err < 1e-4 and result.tokens == reference.tokens == 2 * 4 * 5
    assert len(result.pass_seconds) == cfg.timed_passes and result.sequences == 2 * 4
    if strategy == "pipeline":
        assert result.stages in ([(0, 1), (1, 3)], [(0, 2), (2, 3)])
        # what the benchmark reports: each layer's time and issue time, a micro-batch's transfer, per-rank compute
        assert result.layer_seconds is not None and len(result.layer_seconds) == 3
        assert result.issue_seconds is not None and len(result.issue_seconds) == 3
        assert result.transfer_seconds is not None and result.transfer_seconds > 0
        assert result.busy_seconds is not None and len(result.busy_seconds) == 2
        # compute blocks lie inside the pass they were timed in (host clock on the CPU): never longer than it
        assert all(0 < busy <= result.seconds for busy in result.busy_seconds)
        assert result.ideal_bubble == pytest.approx(1 / 3)  # 2 stages, 2 micro-batches: (S-1)/(M+S-1)
    # the comparison is not blind: one step less training is far off
    fewer = dist.single_process(dist.TrainConfig(**{**cfg.__dict__, "steps": 1}))
    err_fewer, _ = dist.update_difference(fewer, reference, cfg)
    assert err_fewer > 0.1


def test_a_failing_rank_is_reported_in_a_few_lines_with_its_own_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 raises right after joining the group; rank 0 then waits for it in the first collective: the
    launcher stops rank 0 and says which rank failed, how, and the rank's own last lines, not the launcher's
    internals. The launch leaves this process's signal handlers and environment as they were (the elastic agent
    installs handlers of its own and writes to the environment)."""
    monkeypatch.setenv(rank_entry.WORKER_RAISE_ENV, "1")
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)}
    environment = dict(os.environ)
    cfg = dist.TrainConfig(layers=2, input_size=4, hidden=8, seq_len=5, batch=4, steps=1, micro_batches=2)
    with pytest.raises(launcher.RankFailure) as info:
        launcher.launch("pipeline", 2, cfg, "gloo", timeout_s=300)
    lines = str(info.value).splitlines()
    # rank 0 is either stopped by the launcher, or fails on its own as its peer's connection closes (its first
    # send to rank 1, a micro-batch's transfer measured as the pipeline starts): rank 1 is named first either way
    assert lines[0].startswith("pipeline on 2 ranks (gloo) failed: rank 1 exited with status 1"), lines
    assert lines[0].endswith(" (stopped rank 0)") or any("rank 0 exited with status 1" in line for line in lines), lines
    assert f"    RuntimeError: planted failure in rank 1 ({rank_entry.WORKER_RAISE_ENV}=1)" in lines, lines
    failed = sum(1 for line in lines if "failed: rank" in line)  # rank 1, and rank 0 where it failed on its own
    assert len(lines) <= failed * (2 + launcher.TAIL_LINES) and "multiprocessing" not in str(info.value)
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers
    assert dict(os.environ) == environment


def test_a_failing_ranks_error_file_appears_whole_or_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failing rank writes its error file beside the path the elastic agent names and renames it there, so the
    agent never reads it half written: torch's own writer empties the file and then writes it, and an agent that
    read it in between (the rank stopped as its peer failed) raised JSONDecodeError out of the launch instead of
    the ranks' failure, as it does on an empty file below."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    target = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(target))
    seen: list[tuple[bool, str]] = []
    real_replace = os.replace

    def replace_seen(src: str, dst: str) -> None:
        seen.append((os.path.exists(dst), json.loads(Path(src).read_text())["message"]["message"]))
        real_replace(src, dst)

    monkeypatch.setattr(rank_entry.os, "replace", replace_seen)
    try:
        raise RuntimeError("planted")
    except RuntimeError as exc:
        rank_entry._record_error(exc)
    assert seen == [(False, "RuntimeError: planted")]  # complete before it appears under the agent's name
    assert sorted(tmp_path.iterdir()) == [target]
    failure = ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file=str(target))
    assert failure.error_file_data["message"]["message"] == "RuntimeError: planted" and failure.timestamp > 0
    target.write_text("")  # what a reader saw between torch's open and its write
    with pytest.raises(json.JSONDecodeError):
        ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file=str(target))


# a rank of the launcher's tests that starts in milliseconds: it writes its pid to DIR/pid<RANK>, then does ACTION
FAKE_RANK = """
import os, signal, sys, time
directory, action = sys.argv[1], sys.argv[2]
rank = os.environ["RANK"]
with open(os.path.join(directory, "pid.tmp" + rank), "w") as fh:
    fh.write(str(os.getpid()))
os.replace(os.path.join(directory, "pid.tmp" + rank), os.path.join(directory, "pid" + rank))
if action == "abort" and rank == "0":
    while not os.path.exists(os.path.join(directory, "pid1")):  # rank 1 is running
        time.sleep(0.01)
    sys.stderr.write("".join(f"line {i}\\n" for i in range(30)) + "terminate called without an active exception\\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGABRT)
print("waiting in recv", flush=True)
time.sleep(120)
"""


def _gone(directory: Path, rank: int) -> bool:
    """Whether the fake rank ``rank`` has ended (and been reaped by the agent)."""
    try:
        os.kill(int((directory / f"pid{rank}").read_text()), 0)
    except ProcessLookupError:
        return True
    return False


def test_failure_report_names_a_signal(tmp_path: Path) -> None:
    """A rank killed by a signal (as an abort in native code kills it) is named by the signal."""
    command = [sys.executable, "-c", FAKE_RANK, str(tmp_path), "abort"]
    with pytest.raises(launcher.RankFailure) as info:
        launcher.run_ranks(command, 2, "ddp on 2 ranks (gloo)", str(tmp_path), timeout_s=120)
    lines = str(info.value).splitlines()
    assert lines[0] == "ddp on 2 ranks (gloo) failed: rank 0 was killed by SIGABRT (stopped rank 1)"
    assert lines[-1] == "    terminate called without an active exception" and len(lines) == 2 + launcher.TAIL_LINES
    assert _gone(tmp_path, 1)  # the survivor was stopped, not left running


def test_a_hung_rank_times_out_and_is_stopped(tmp_path: Path) -> None:
    command = [sys.executable, "-c", FAKE_RANK, str(tmp_path), "hang"]
    with pytest.raises(TimeoutError, match=r"did not finish in 5 s \(stopped ranks \[0\]\).*waiting in recv"):
        launcher.run_ranks(command, 1, "pipeline on 1 rank (gloo)", str(tmp_path), timeout_s=5)
    assert _gone(tmp_path, 0)


@pytest.mark.parametrize(("exits", "first"), [
    ({1: 1, 0: -signal.SIGTERM}, "rank 1 exited with status 1 (stopped rank 0)"),
    ({0: -signal.SIGABRT, 2: -signal.SIGTERM, 3: -signal.SIGKILL}, "rank 0 was killed by SIGABRT (stopped ranks 2, 3)"),
    ({2: -signal.SIGKILL}, "rank 2 was killed by SIGKILL"),  # the first rank the agent saw failed, whatever its signal
])  # fmt: skip
def test_failure_report_tells_failed_ranks_from_stopped_ones(exits: dict, first: str, tmp_path: Path) -> None:
    """The agent lists the ranks whose failure it saw first, then those it stopped (SIGTERM, or SIGKILL after the
    grace period); a later rank that ended otherwise (here rank 1, status 3) failed too and gets its own lines."""
    report = launcher.failure_report("ddp on 4 ranks (gloo)", exits, launcher.RankLogs(str(tmp_path), "run"))
    assert report.splitlines()[0] == f"ddp on 4 ranks (gloo) failed: {first}"
    both = launcher.failure_report("x", {0: 1, 1: 3, 2: -signal.SIGTERM}, launcher.RankLogs(str(tmp_path), "run"))
    assert [line for line in both.splitlines() if not line.startswith("    ")] == [
        "x failed: rank 0 exited with status 1 (stopped rank 2)",
        "x failed: rank 1 exited with status 3",
        "  rank 0, last lines of its output:",
        "  rank 1, last lines of its output:",
    ]
    assert "(its output could not be read:" in both  # no log: said so, not an error of the report


def test_the_rank_that_failed_first_is_named_first(tmp_path: Path) -> None:
    """The agent lists ranks whose failure it saw in one check by rank: rank 0, failing as its peer's connection
    closed, came before rank 1, which had raised first. The rank whose last words came first is named first; a
    first rank killed by a signal keeps the agent's order."""
    logs = launcher.RankLogs(str(tmp_path), "run")
    for rank, written_ns in ((0, 2_000_000_000), (1, 1_000_000_000)):  # rank 1 wrote its last line first
        (folder := tmp_path / "run_x" / "attempt_0" / str(rank)).mkdir(parents=True)
        (folder / "stderr.log").write_text(f"rank {rank} last words\n")
        os.utime(folder / "stderr.log", ns=(written_ns, written_ns))
    assert list(launcher.first_failed_first({0: 1, 1: 1}, logs)) == [1, 0]
    assert list(launcher.first_failed_first({0: 1, 1: 1, 2: -signal.SIGTERM}, logs)) == [1, 0, 2]
    assert list(launcher.first_failed_first({0: -signal.SIGABRT, 1: 1}, logs)) == [0, 1]
    report = launcher.failure_report("x", launcher.first_failed_first({0: 1, 1: 1}, logs), logs)
    assert report.splitlines()[0] == "x failed: rank 1 exited with status 1"


def test_cpu_figures_carry_the_core_note() -> None:
    sys.path.insert(0, str(ROOT / "suites"))
    try:
        import test_scaling as suite
    finally:
        sys.path.pop(0)
    two = dist.RunResult("ddp", 2, "gloo", {}, tokens=80, seconds=1.0)
    assert suite.core_note(two, cores=2) == (
        "not a scaling figure: 2 ranks share 2 available CPU cores (os.sched_getaffinity), about 1 per rank, "
        "where 1 rank had 2"
    )
    assert suite.core_note(dist.RunResult("ddp", 1, "gloo", {}, tokens=80, seconds=1.0), cores=2) == ""
    assert suite.core_note(dist.RunResult("ddp", 2, "nccl", {}, tokens=80, seconds=1.0), cores=2) == ""
    assert suite.core_note(two) != ""  # the real affinity mask is read when no count is given


def test_torchrun_entry_point(tmp_path: Path) -> None:
    out = tmp_path / "result.pt"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "pytest_lstmperf.workloads.rank", "--strategy", "pipeline",
           "--backend", "gloo", "--layers", "2", "--input-size", "4", "--hidden", "8", "--seq-len", "5",
           "--batch", "4", "--steps", "2", "--micro-batches", "2", "--out", str(out)]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in (dist.RANK_SETUP_ENV, WORKER_PLANT_ENV)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = dist.RunResult(**torch.load(out, weights_only=False))
    cfg = dist.TrainConfig(layers=2, input_size=4, hidden=8, seq_len=5, batch=4, steps=2, micro_batches=2)
    err, _ = dist.max_relative_difference(
        dist.updates(result.weights, cfg), dist.updates(dist.single_process(cfg).weights, cfg)
    )
    assert result.world == 2 and err < 1e-4


def test_jobs_of_one_launch_are_written_read_back_and_a_bad_one_named(tmp_path: Path) -> None:
    """Several runs in one launch (the suite's three kinds of data): the jobs file round-trips, in order; an
    unknown strategy or setting is named (the rank's argument parser reports it, as for a bad flag)."""
    jobs = [("ddp", dist.TrainConfig(layers=2, sequences=0)), ("pipeline", dist.TrainConfig(layers=4, sequences=64))]
    path = str(tmp_path / "jobs.json")
    rank_entry.write_jobs(path, jobs)
    assert rank_entry.read_jobs(path) == jobs
    Path(path).write_text('[{"strategy": "zero", "config": {}}]')
    with pytest.raises(ValueError, match="unknown strategy 'zero' \\(valid: ddp, pipeline\\)"):
        rank_entry.read_jobs(path)
    Path(path).write_text('[{"strategy": "ddp", "config": {"layerz": 2}}]')
    with pytest.raises(ValueError, match=r"unknown setting\(s\) layerz \(valid: .*layers"):
        rank_entry.read_jobs(path)
    with pytest.raises(ValueError, match="no jobs"):
        launcher.launch_jobs([], 2)


def test_rank_setup_hook_is_called_and_its_undo_returned(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ranks' setup hook is named by the environment: the launcher imports no test helper itself."""
    monkeypatch.delenv(dist.RANK_SETUP_ENV, raising=False)
    assert rank_entry._setup_from_env() is None
    for name, value in rank_fault_env("perturb:1e-3").items():
        monkeypatch.setenv(name, value)
    forward = torch.nn.LSTM.forward
    undo = rank_entry._setup_from_env()
    assert callable(undo) and torch.nn.LSTM.forward is not forward  # planted
    undo()
    assert torch.nn.LSTM.forward is forward
    monkeypatch.setenv(dist.RANK_SETUP_ENV, "no_function_named")
    with pytest.raises(ValueError, match=r"expected package\.module:function"):
        rank_entry._setup_from_env()


def test_entry_point_outside_torchrun_is_refused(
    tmp_path: Path, module: str = "pytest_lstmperf.workloads.rank"
) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    proc = subprocess.run([sys.executable, "-m", module, "--out", str(tmp_path / "x")],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)  # fmt: skip
    assert proc.returncode == 2 and "run under torchrun" in proc.stderr


# ------------------------------------------------------------------------------------------- the suite
def _suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_scaling=(ROOT / "suites" / "test_scaling.py").read_text())
    clear_inner_env(monkeypatch)
    for name in (dist.RANK_SETUP_ENV, WORKER_PLANT_ENV):
        monkeypatch.delenv(name, raising=False)


def test_suite_equivalence_fails_when_workers_compute_wrong(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    _suite(pytester, monkeypatch)
    for name, value in rank_fault_env("perturb:1e-3").items():
        monkeypatch.setenv(name, value)
    result = runpytest_forked(pytester, "--device=cpu", "-p", "no:cacheprovider", "-k", "match_single", timeout=600)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines(["*ddp on 2 ranks (gloo): weight updates differ from the single-process run by*"])
    result.stdout.fnmatch_lines(["*pipeline on 2 ranks (gloo): weight updates differ*"])
    # a progress line per launch, on the terminal while the test runs (not in the captured output)
    result.stdout.fnmatch_lines(["scaling: ddp, equivalence check, 2 ranks (gloo): * steps/s [[]* s[]]"])


def test_token_check_sees_a_lost_batch() -> None:
    sys.path.insert(0, str(ROOT / "suites"))
    try:
        import test_scaling as suite
    finally:
        sys.path.pop(0)
    result = dist.RunResult("ddp", 2, "gloo", {}, tokens=80, seconds=1.0)
    suite.check_tokens(result, 80)
    with pytest.raises(AssertionError, match="trained on 60 time steps per pass, the data holds 80"):
        suite.check_tokens(dist.RunResult("ddp", 2, "gloo", {}, tokens=60, seconds=1.0), 80)


# ------------------------------------------------------------------------------------------- xdist pinning
@pytest.fixture
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(device_mod, "fingerprint", lambda kind, index: {"gpu": "Fake GPU", "torch": "x"})


def test_workers_are_pinned_one_gpu_each(two_gpus: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    for worker, index in (("gw0", 0), ("gw1", 1)):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        info = device_mod.resolve_device("cuda")
        assert info.index == index and f"worker {worker} pinned to cuda:{index} of 2" in info.describe()
        assert device_mod.shared_gpu(info) is None
        assert device_mod.resolve_device("auto").index == index


def test_shared_gpus_are_named(two_gpus: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    info = device_mod.resolve_device("cuda")
    assert info.index == 1
    assert device_mod.shared_gpu(info) == "4 pytest-xdist workers share 2 GPUs"
    explicit = device_mod.resolve_device("cuda:0")
    assert "pinned" not in explicit.fingerprint
    assert device_mod.shared_gpu(explicit) == "all 4 pytest-xdist workers run on cuda:0 (--device names one GPU)"
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert device_mod.resolve_device("cuda").index == 0 and device_mod.shared_gpu(info) is None


def test_n_auto_is_one_worker_per_gpu(two_gpus: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_lstmperf import plugin

    monkeypatch.setattr(plugin, "requested_device", lambda config: "cuda")
    assert plugin.pytest_xdist_auto_num_workers(None) == 2  # type: ignore[arg-type]
    monkeypatch.setattr(plugin, "requested_device", lambda config: "cpu")
    assert plugin.pytest_xdist_auto_num_workers(None) is None  # type: ignore[arg-type]


def test_n_auto_end_to_end_starts_one_worker_per_gpu(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through pytest-xdist itself: the plugin's answer wins over xdist's default (one worker per CPU core)."""
    clear_inner_env(monkeypatch)
    pytester.makeconftest(
        "import types\n"
        "import torch\n"
        "from pytest_lstmperf import device\n"
        "torch.cuda.is_available = lambda: True\n"
        "torch.cuda.device_count = lambda: 3\n"
        "torch.cuda.get_device_properties = lambda i: types.SimpleNamespace(major=9, minor=0, name='Fake GPU')\n"
        "device.fingerprint = lambda kind, index: {'gpu': 'Fake GPU', 'torch': torch.__version__}\n"
    )
    pytester.makepyfile(
        "import os\n"
        "import pytest\n"
        "@pytest.mark.parametrize('n', range(6))\n"
        "def test_where(lstmperf, n):\n"
        "    print('WORKER', os.environ.get('PYTEST_XDIST_WORKER'), lstmperf.device.describe())\n"
    )
    # one torch path: a Keras path would start a Keras worker in each of the 3 workers (about 4 s each on 2 cores)
    result = pytester.runpytest_subprocess(
        "-n", "auto", "--device=cuda", "--lstmperf-paths=torch-cudnn-fp32", "-p", "no:cacheprovider", "-rP"
    )
    result.stdout.fnmatch_lines(["*created: 3/3 workers*"])
    for index in range(3):  # each worker on its own GPU
        pinned = f"worker gw{index} pinned to cuda:{index} of 3]"
        result.stdout.fnmatch_lines([f"WORKER gw{index} cuda:{index} (Fake GPU*{pinned}"])


def test_idle_share_and_gpipe_bubble() -> None:
    result = dist.RunResult("pipeline", 4, "nccl", {}, tokens=1, seconds=2.0, busy_seconds=[1.5, 2.0, 0.5, 2.4],
                            micro_batches=8)  # fmt: skip
    assert result.idle_shares == [0.25, 0.0, 0.75, 0.0]  # a clock beyond the step reads as no idle time
    assert result.ideal_bubble == pytest.approx(3 / 11)
    assert dist.RunResult("ddp", 2, "nccl", {}, tokens=1, seconds=1.0).idle_shares is None
    assert dist.RunResult("ddp", 2, "nccl", {}, tokens=1, seconds=1.0).ideal_bubble is None


def test_bucketed_data_holds_every_sequence_the_padded_data_holds() -> None:
    """Buckets' partial batches are pooled into full ones: bucketing changes the padding, not the data. With
    every bucket's remainder dropped (as before), 2048 sequences in batches of 512 left 512 to train on, and a
    bucketed run looked 12x faster than padded training."""
    for sequences, batch in ((2048, 512), (96, 16), (100, 16)):
        kw = {"layers": 1, "input_size": 2, "hidden": 2, "seq_len": 100, "batch": batch, "sequences": sequences}
        padded = dist.make_batches(dist.TrainConfig(**kw))
        bucketed = dist.make_batches(dist.TrainConfig(**kw, bucketing=True))
        assert sum(len(n) for _, _, n in bucketed) == sum(len(n) for _, _, n in padded) == sequences // batch * batch
        assert all(len(n) == batch for _, _, n in bucketed)
        if sequences % batch == 0:  # the same sequences, less padding
            assert sum(int(n.sum()) for _, _, n in bucketed) == sum(int(n.sum()) for _, _, n in padded)
            assert sum(x.shape[1] for x, _, _ in bucketed) < sum(x.shape[1] for x, _, _ in padded)


def _sizing(size: str, layer: float, issue: float, transfer: float | None) -> sb.SizingRow:
    return sb.SizingRow(
        size=size, model=size, micro_batch=4, world=2, backend="gloo", layer_seconds=[layer],
        issue_seconds=[issue], layer_s=layer, issue_s=issue, transfer_s=transfer, layer_over_issue=layer / issue,
        layer_over_transfer=layer / transfer if transfer else None, transfer_bytes=0, stages=None,
    )  # fmt: skip


def test_the_size_picked_is_the_first_where_compute_dominates() -> None:
    rows = [_sizing("a", 6.8e-3, 6.7e-3, 7e-5), _sizing("b", 12e-3, 1e-3, 2e-4), _sizing("c", 50e-3, 1e-3, 1e-3)]
    assert sb.pick_size(rows) == "b"
    # none reaches the factor: the one closest to it (layer/issue 2.7 beats 1.0), not simply the last
    rows = [_sizing("a", 6.8e-3, 6.7e-3, 7e-5), _sizing("b", 12e-3, 4.5e-3, 2e-4), _sizing("c", 6e-3, 5e-3, 1e-4)]
    assert sb.pick_size(rows) == "b"
    assert sb.pick_size([]) is None


def _scaling(
    mode: str, world: int, seq_per_s: float, sequences: int = 2048, data: str = "padded", **changes: Any
) -> sb.RunRow:
    row = sb.RunRow(
        part="scaling", mode=mode, data=data, size="s", model="m", world=world, backend="gloo", seconds=1.0,
        pass_seconds=[1.0, 1.0, 1.0], sequences=sequences, tokens=0, seq_per_s=seq_per_s,
        seq_per_s_passes=[seq_per_s * 0.98, seq_per_s, seq_per_s * 1.01], comm_share=None, stages=None,
        micro_batches=None, idle_shares=None, ideal_bubble=None, profile=None,
    )  # fmt: skip
    return replace(row, **changes)


def test_summary_flags_what_cannot_be_a_result() -> None:
    """A speed-up over the own 1-rank run far above the rank count (the loaded-CPU 39.4x on 2 ranks) is marked
    implausible, and a row that trained on other data than the baseline gets no speed-up over it."""
    rows = [_scaling("plain", 1, 1000.0), _scaling("ddp", 1, 100.0), _scaling("ddp", 2, 3938.0),
            _scaling("pipeline", 1, 500.0), _scaling("pipeline", 2, 900.0),
            _scaling("plain", 1, 15000.0, sequences=512, data="bucketed")]  # fmt: skip
    text = "\n".join(sb.summary(rows))
    ddp2 = next(line for line in text.splitlines() if line.startswith("| ddp | padded | 2 "))
    assert "39.38x (implausible)" in ddp2 and "3.94x" in ddp2
    pipe2 = next(line for line in text.splitlines() if line.startswith("| pipeline | padded | 2 "))
    assert "1.80x" in pipe2 and "implausible" not in pipe2
    assert "not comparable: 512 of the baseline's 2048 sequences" in text
    assert "the 1-rank reference ran slowed" in text
    assert sb.spread([980.0, 1000.0, 1010.0]) == "1000 (980-1010)"


def test_scalebench_bad_input_is_named(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    for args, message in (
        (["--modes", "zero"], "--modes 'zero': valid modes are plain, ddp, pipeline"),
        (["--parts", "sizing,warp"], "unknown part(s) warp (valid: sizing, scaling, micro-batches)"),
        (["--size", "huge"], "unknown size 'huge' (valid: tiny-a, tiny-b)"),
        (["--worlds", "1,x"], "--worlds '1,x': expected comma-separated integers"),
        (["--micro-batches", "4,many"], "--micro-batches '4,many': expected comma-separated"),
    ):
        with pytest.raises(SystemExit) as exc:
            sb.main(["--tiny", "--backend", "gloo", "--out", str(tmp_path), *args])
        assert exc.value.code == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "scalebench.jsonl").exists()


def test_scalebench_plot_draws_the_modes_and_the_bubble(tmp_path: Path) -> None:
    rows: list[sb.BenchRow] = [
        _scaling("plain", 1, 1000.0), _scaling("ddp", 1, 1000.0), _scaling("ddp", 2, 1700.0),
        _scaling("pipeline", 2, 900.0, part="micro-batches", micro_batches=4, idle_shares=[0.4, 0.23],
                 ideal_bubble=0.2),
        _scaling("pipeline", 2, 700.0, part="micro-batches", micro_batches=16, idle_shares=[0.19, 0.11],
                 ideal_bubble=1 / 17),
    ]  # fmt: skip
    path = sb.plot(rows, tmp_path / "s.png", "title")
    assert path is not None and path.stat().st_size > 0
    assert sb.plot([r for r in rows if isinstance(r, sb.SizingRow)], tmp_path / "none.png", "t") is None


def test_scalebench_rows_round_trip_and_a_bad_row_is_named(tmp_path: Path) -> None:
    """The published multi-GPU results (docs/data) read back into typed rows and write back unchanged; a row
    of an unknown part, with an unknown field or without a field is refused with its file and line."""
    for name in ("h200x2-scalebench-2026-11-28.jsonl", "h200x4-scalebench-2026-11-28.jsonl"):
        raw = [json.loads(line) for line in (ROOT / "docs" / "data" / name).read_text().splitlines() if line.strip()]
        assert [sb.row_to_json(sb.row_from_json(r)) for r in raw] == raw
        assert len(sb.load(ROOT / "docs" / "data" / name)) == sum(1 for r in raw if not r.get("excluded"))
    good = sb.row_to_json(_scaling("ddp", 2, 1700.0))
    for bad, message in (
        ({**good, "part": "warp"}, "unknown scalebench row part 'warp' (valid: sizing, scaling, micro-batches, error)"),
        ({**good, "speed": 1}, "no field(s) speed"),
        ({k: v for k, v in good.items() if k != "world"}, "missing field(s) world"),
    ):
        (tmp_path / "s.jsonl").write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
        with pytest.raises(ValueError, match=re.escape("s.jsonl:2: ") + ".*" + re.escape(message)):
            sb.load(tmp_path / "s.jsonl")


def test_a_shared_gpu_times_under_the_machine_lock_and_is_skipped_without_it(
    two_gpus: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """More workers than GPUs: a run that compares or records holds the machine lock, so its benchmark times
    with the GPU to itself; a run without the lock (it only prints its figures) skips it, saying why."""
    from pytest_lstmperf.speed.machine_lock import MachineLock
    from pytest_lstmperf.speed.runner import _skip_shared_gpu

    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    info = device_mod.resolve_device("cuda")
    _skip_shared_gpu(info, MachineLock("run", tmp_path))  # timed: no skip
    with pytest.raises(pytest.skip.Exception, match="4 pytest-xdist workers share 2 GPUs, and this run neither"):
        _skip_shared_gpu(info, None)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    _skip_shared_gpu(device_mod.resolve_device("cuda"), None)  # one GPU each: timed without a lock too
