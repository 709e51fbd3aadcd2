"""How a benchmark is measured: host counters, run medians, device time, the anchor paired with every round,
a slowdown found on the pairs of one look, and a user's own callable through ``lstmperf_benchmark(fn)``.

The end-to-end runs use the spin path of ``test_bench_plugin`` (a real oneDNN ``nn.LSTM`` plus a fixed amount of
host work, timed on the thread clock) and user models that do the same, gated at ``--lstmperf-threshold=1.5``
with slowdowns planted at 3x, so verdicts do not depend on how busy the machine is.
"""

from __future__ import annotations

import importlib.util
import json
import re
import types
from collections.abc import Sequence
from pathlib import Path

import pytest
from forked_pytest import runpytest_forked
from pytester_runs import clear_inner_env
from test_bench_plugin import BASE_ARGS, SPIN_MODULE, SUITE

from pytest_lstmperf import host_counters, meters
from pytest_lstmperf.anchor import estimate_call
from pytest_lstmperf.speed import timing

torch = pytest.importorskip("torch")

#: an inner run that records starts further pytest processes; the limit catches a hang, not a slow machine
INNER_TIMEOUT_S = 900
USER_ARGS = [
    "-p",
    "no:cacheprovider",
    "--device=cpu",
    "-p",
    "no:randomly",
    "-p",
    "no:hypothesispytest",  # nothing here draws examples; its plugin's import costs about 1 s per run
    "--benchmark-timer=time.thread_time",
    "--lstmperf-threshold=1.5",  # as the spin project's BASE_ARGS: planted slowdowns are 3x
]

USER_TEST = """
import pytest
import torch


_H, _W = torch.randn(16, 32) / 8, torch.randn(32, 32) / 8


class SpinLSTM(torch.nn.LSTM):
    def check_forward_args(self, *args, **kwargs):  # inside LSTM.forward: a fixed amount of host work
        with torch.no_grad():
            h = _H
            for _ in range(300):  # small ATen ops (about 5 ms), as a host-bound layer runs: they slow with the machine
                h = torch.tanh(h @ _W)
        return super().check_forward_args(*args, **kwargs)


class Tagger(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = SpinLSTM(8, 16, batch_first=True)
        self.head = torch.nn.Linear(16, 3)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out)


@pytest.fixture
def model():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    return Tagger().eval(), torch.randn(4, 10, 8)


def test_tagger_forward(lstmperf_benchmark, model):
    net, x = model

    def forward():
        with torch.no_grad():
            return net(x)

    out = lstmperf_benchmark(forward, label="forward")
    assert out.shape == (4, 10, 3)
"""


def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_inner_env(monkeypatch, short_sweep=True)
    monkeypatch.setenv("PYTEST_LSTMPERF_PLANT_CLOCK", "thread")


@pytest.fixture
def spin(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    """The real benchmark suite with the spin path only."""
    pytester.makepyfile(spinpath=SPIN_MODULE)
    pytester.makeconftest("import spinpath  # noqa: F401 - registers the spin path\n")
    pytester.makepyfile(test_benchmarks=SUITE.read_text())
    _env(monkeypatch)

    def run(*args: str) -> pytest.RunResult:
        return runpytest_forked(pytester, *BASE_ARGS, *args, timeout=INNER_TIMEOUT_S)

    run.path = pytester.path  # type: ignore[attr-defined]
    return run


@pytest.fixture
def user(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    """A user's project: one test benchmarking its own small nn.LSTM model."""
    pytester.makepyfile(test_user=USER_TEST)
    _env(monkeypatch)

    def run(*args: str) -> pytest.RunResult:
        return runpytest_forked(pytester, *USER_ARGS, *args, timeout=INNER_TIMEOUT_S)

    run.path = pytester.path  # type: ignore[attr-defined]
    return run


def _records(path: Path) -> dict[str, dict]:
    return {b["name"]: b for b in json.loads(path.read_text())["benchmarks"]}


def _tiny_lstm():
    torch.manual_seed(0)
    module = torch.nn.LSTM(8, 16, batch_first=True)
    x = torch.randn(2, 5, 8)

    def forward() -> None:
        with torch.no_grad():
            module(x)

    def train() -> None:
        out, _ = module(x)
        out.sum().backward()

    return forward, train


# -------------------------------------------------------------------------------------------- units
def test_host_counters_are_exact_and_see_the_host_work_fault() -> None:
    """Counts repeat exactly; ``host-work:N`` adds N + 1 ATen ops (its allocation and N adds) and the scratch
    tensor's bytes per LSTM call: the smallest host fault the counters catch is one extra op."""
    from pytest_lstmperf.testing.faults import planted

    for call in _tiny_lstm():
        call()  # warm-up: .grad exists from here on
        clean = [host_counters.host_counters(call, "cpu") for _ in range(3)]
        assert clean[0] == clean[1] == clean[2]
        assert clean[0]["aten_ops"] > 0 and clean[0]["alloc_bytes"] > 0
        assert clean[0]["kernels"] == 0 and clean[0]["syncs"] == 0  # the CPU launches no GPU work
        with planted("host-work:1"):
            one = host_counters.host_counters(call, "cpu")
        with planted("host-work:7"):
            seven = host_counters.host_counters(call, "cpu")
        assert one["aten_ops"] > clean[0]["aten_ops"]
        assert seven["aten_ops"] - one["aten_ops"] == 6
        assert one["alloc_bytes"] - clean[0]["alloc_bytes"] >= 256 * 4
        assert host_counters.host_counters(call, "cpu") == clean[0]  # the fault undone, the counts are back


def test_the_op_count_alone_counts_what_the_full_count_counts() -> None:
    """On CUDA the caching allocator counts the bytes, so only ATen ops are counted there (no walk over each
    op's inputs and outputs): the same op count as the CPU's full count, fault included."""
    from pytest_lstmperf.testing.faults import planted

    def ops(call, fresh_bytes: bool) -> int:
        counter = host_counters._OpCounter()
        with host_counters._counting_mode(counter, fresh_bytes=fresh_bytes):
            call()
        return counter.ops

    for call in _tiny_lstm():
        call()
        clean = ops(call, False)
        assert clean == ops(call, True) == host_counters.host_counters(call, "cpu")["aten_ops"] > 0
        with planted("host-work:3"):
            faulted = ops(call, False)
            assert faulted == ops(call, True)
        assert faulted - clean == 3 + 1  # the fault's scratch allocation and its 3 adds


def test_batch_medians() -> None:
    assert timing.batch_medians([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]) == [2, 5, 8.5]
    assert timing.batch_medians([1.0, 2.0]) == []


def _fake_events_torch(per_call_ms: float, calls_seen: list[int]):
    class Event:
        def __init__(self, enable_timing=False):
            pass

        def record(self):
            calls_seen.append(-1)  # a marker between batches

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return per_call_ms * batch[0]

    batch = [0]
    cuda = types.SimpleNamespace(Event=Event, synchronize=lambda dev=None: None)
    return types.SimpleNamespace(cuda=cuda), batch


def test_event_device_time_averages_back_to_back_calls() -> None:
    """Where capture fails, each device sample is one pair of events around several queued calls (per-call
    event noise averages out), divided back to seconds per call, after an untimed warm-up call."""
    seen: list[int] = []
    fake, batch = _fake_events_torch(2.0, seen)
    count = [0]

    def call() -> None:
        count[0] += 1
        batch[0] = 5

    out = meters._event_times(fake, "cuda:0", call, samples=4, calls=5)
    assert out == pytest.approx([2e-3] * 4)
    assert count[0] == 1 + 4 * 5


def test_warm_up_of_a_long_call_is_one_call_and_short_calls_keep_theirs() -> None:
    """A call of at least ``WARM_AFTER_ONE_S`` is warm after one call and estimated by the next (the Keras
    generic loop spent six untimed calls of up to 0.36 s each here); a short call keeps its warm-up calls and
    the median of three; the event timer's warm-up call is skipped only when the caller has just made one."""
    clock = [0.0]

    def calls_of(seconds: float, warmup: int) -> tuple[int, float]:
        count = [0]
        clock[0] = 0.0

        def call() -> None:
            count[0] += 1
            clock[0] += seconds

        estimate = estimate_call(call, warmup, lambda: clock[0])
        return count[0], estimate

    assert calls_of(0.2, 3) == (2, pytest.approx(0.2))
    assert calls_of(meters.WARM_AFTER_ONE_S, 3)[0] == 2
    assert calls_of(0.001, 3) == (6, pytest.approx(0.001))
    assert calls_of(0.001, 5)[0] == 8
    fake, batch = _fake_events_torch(2.0, [])
    count = [0]

    def call() -> None:
        count[0] += 1
        batch[0] = 1

    meters._event_times(fake, "cuda:0", call, samples=3, calls=1, warm=True)
    assert count[0] == 3
    meters._event_times(fake, "cuda:0", call, samples=3, calls=1)
    assert count[0] == 3 + 1 + 3


# ----------------------------------------------------------------------------------------- end to end
def test_every_record_says_how_it_was_measured(spin, tmp_path: Path) -> None:
    """Two clean runs of the same benchmarks (inference and a training step): identical host counters; run
    medians from three batches; on the CPU the device time is stated as the host's (method ``host``, no
    device samples). A third run with ``host-work:20`` planted: every benchmark's counters grow by the 20
    extra ops at least, and by the scratch allocation."""
    runs = []
    for k, plant in enumerate(((), ("-p", "pytest_lstmperf.testing.faults", "--lstmperf-plant=host-work:20"))):
        for _ in range(2 - k):
            target = tmp_path / f"run{len(runs)}.json"
            result = spin(f"--benchmark-json={target}", *plant)
            assert result.ret == 0, result.stdout.str()
            runs.append(_records(target))
    clean, again, faulty = runs
    assert clean.keys() == again.keys() == faulty.keys() and len(clean) == 3
    for name, bench in clean.items():
        extra = bench["extra_info"]
        counts = extra["host_counters"]
        assert counts == again[name]["extra_info"]["host_counters"], name
        assert set(counts) == {"aten_ops", "kernels", "syncs", "alloc_bytes"}
        assert len(extra["run_medians"]) == 3
        assert extra["device_time_method"] == "host" and extra["device_samples"] == []
        assert "CPU" in extra["device_time_note"] and extra["device_run_medians"] == []
        anchor = extra["anchor"]  # one anchor sample per round, of the same repetitions in every run
        assert len(anchor["samples"]) == len(bench["stats"]["data"]) and all(x > 0 for x in anchor["samples"])
        assert anchor["kind"] == "torch-cpu-backward-warm" and anchor["repeat"] >= 1 and anchor["per_call_s"] > 0
        planted = faulty[name]["extra_info"]["host_counters"]
        assert planted["aten_ops"] >= counts["aten_ops"] + 20, name
        assert planted["alloc_bytes"] > counts["alloc_bytes"], name


def test_a_figure_past_its_limit_fails_on_the_pairs_of_one_look(spin, gate_recording, tmp_path: Path) -> None:
    """Compared against a baseline, a clean benchmark passes and one slowed 3x fails, decided on the pairs of its
    one look (no second measurement: it changed 1 of 280 replayed verdicts); its slower pairs are in the record."""
    # the whole recording: how far processes lie apart is pooled over the baseline's benchmarks, compared or not
    gate_recording.install(spin.path)
    clean = tmp_path / "clean.json"
    assert spin("--benchmark-compare", "-k", "B1-", f"--benchmark-json={clean}").ret == 0
    slow = tmp_path / "slow.json"
    result = spin(
        "--benchmark-compare", "-k", "B1-", f"--benchmark-json={slow}", "-p", "pytest_lstmperf.testing.faults",
        "--lstmperf-plant=slowdown:3",
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    from pytest_lstmperf.speed.policy import Figure
    from pytest_lstmperf.speed.records import BaselineEntry

    (before,), (after,) = _records(clean).values(), _records(slow).values()
    ratio = (
        Figure.of(BaselineEntry.from_json(after).as_record().look().per_call).value
        / Figure.of(BaselineEntry.from_json(before).as_record().look().per_call).value
    )
    assert ratio > 1.5
    assert "second_look" not in after["extra_info"]
    result.stdout.fnmatch_lines(["*B1-T20*regressed*"])


def test_user_benchmark_is_recorded_and_gated(user) -> None:
    """A user's own model through ``lstmperf_benchmark(fn)``: recorded into the hardware's baseline with its
    observed kernel and host counters (no FLOP figure made up), compared clean, failed when its LSTM is
    slowed 3x, and passed under ``@pytest.mark.lstmperf_threshold(5.0)``."""
    result = user("--lstmperf-save-baseline")
    assert result.ret == 0, result.stdout.str()
    (path,) = sorted((user.path / "baselines").glob("*.json"))
    (entry,) = json.loads(path.read_text())["benchmarks"]
    extra = entry["extra_info"]
    assert entry["name"] == "test_tagger_forward" and extra["path"] == "user" and extra["mode"] == "forward"
    assert extra["kernel"] == "onednn" and extra["host_counters"]["aten_ops"] > 0
    assert "flops" not in extra and len(entry["stats"]["data"]) >= 15
    # a lone benchmark: timed in more processes than three, until they show how far they lie apart
    assert entry["lstmperf"]["kernel"] == "onednn/fp32" and len(entry["lstmperf"]["runs"]) >= 3
    result = user("--benchmark-compare")
    assert result.ret == 0, result.stdout.str()
    slowed = ("--benchmark-compare", "-p", "pytest_lstmperf.testing.faults", "--lstmperf-plant=slowdown:3")
    result = user(*slowed)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines(["*speed gate against*1 regressed*", "*test_tagger_forward*regressed"])
    source = (user.path / "test_user.py").read_text()
    (user.path / "test_user.py").write_text(
        source.replace("def test_tagger_forward", "@pytest.mark.lstmperf_threshold(5.0)\ndef test_tagger_forward")
    )
    result = user(*slowed)
    assert result.ret == 0, result.stdout.str()


JAX_USER_TEST = """
import os

import jax
import jax.numpy as jnp
import pytest

WORK = int(20_000 * float(os.environ.get("SLOWER", "1")))  # host work per call: a fixed count of steps


@jax.jit
def step(w, x):  # a small recurrent loop: one tanh cell per step
    def cell(h, xt):
        h = jnp.tanh(xt @ w + h)
        return h, h

    return jax.lax.scan(cell, jnp.zeros((x.shape[1], w.shape[1])), x)[1]


def test_jax_forward(lstmperf_benchmark):
    w, x = jnp.ones((8, 8)) * 0.01, jnp.ones((10, 4, 8))

    def forward():
        total = 0
        for i in range(WORK):  # real work, which slows with the machine as the anchor does
            total += i * i
        return step(w, x)

    out = lstmperf_benchmark(forward, label="forward")
    assert out.shape == (10, 4, 8)
"""


def test_a_jax_function_is_benchmarked_waiting_for_its_results_and_gated(user, monkeypatch) -> None:
    """``lstmperf_benchmark(fn)`` where ``fn`` returns JAX arrays (a JAX function, a Keras model on JAX): each
    call waits for its results, the record says JAX and why it has no host counters and, on the CPU, no kernel;
    a clean compare passes and 3x the host work per call fails."""
    # not imported here: pytester restores sys.modules after the test, and jaxlib cannot be imported twice
    if importlib.util.find_spec("jax") is None:
        pytest.skip("JAX is not installed (pip install 'pytest-lstmperf[jax]')")
    user.path.joinpath("test_user.py").write_text(JAX_USER_TEST)
    # the gate's anchor is small torch ops: with torch's intra-op threads beside XLA's thread pool on a 2-core
    # machine its samples swung from 0.3 to 240 ms per repetition (a 4.3x slower call then read 0.012x), so the
    # run keeps torch on one thread, as the user projects above do in their fixture
    user.path.joinpath("conftest.py").write_text("import torch\n\ntorch.set_num_threads(1)\n")
    result = user("--lstmperf-save-baseline")
    assert result.ret == 0, result.stdout.str()
    (path,) = sorted((user.path / "baselines").glob("*.json"))
    (entry,) = json.loads(path.read_text())["benchmarks"]
    extra = entry["extra_info"]
    assert extra["framework"] == "jax" and extra["path"] == "user" and extra["precision"] == "fp32"
    assert extra["kernel"] == "unknown" and "kernel marker" in extra["kernel_note"]
    assert "host_counters" not in extra and "JAX work" in extra["host_counters_note"]
    assert extra["device_time_method"] == "host" and len(entry["stats"]["data"]) >= 15
    clean = user("--benchmark-compare")
    text = clean.stdout.str()
    # clean: passed, or, on a runner whose load moved it (another pytest-xdist worker beside it), inconclusive
    # with the reason; never a slowdown
    assert clean.ret == 0 or ("inconclusive" in text and "SPEED GATE FAILED" not in text), text
    monkeypatch.setenv("SLOWER", "3")
    result = user("--benchmark-compare")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    # slower, or, where the recording's processes lay too far apart on a loaded runner to see 1.5x, inconclusive
    # with the reason: the run fails either way, never passes
    text = result.stdout.str()
    assert re.search(r"test_jax_forward\S*\s.*\s(regressed|inconclusive)\s*$", text, re.M), text
    assert "speed gate passed" not in text


def test_a_jax_benchmark_waits_for_each_calls_results(monkeypatch) -> None:
    """JAX dispatches asynchronously: a call returns before its work is done. The timed call hands
    ``jax.block_until_ready`` the very results it returned, so the per-call time holds the work."""
    jax = pytest.importorskip("jax", reason="JAX is not installed (pip install 'pytest-lstmperf[jax]')")
    import numpy as np

    from pytest_lstmperf.speed import runner, user_call

    waited = []
    monkeypatch.setattr(jax, "block_until_ready", lambda value: waited.append(value) or value)
    array = np.ones(3, dtype=np.float32)  # stands in for the JAX array a call returns
    assert not user_call.holds_jax_arrays([1.0, "x", array])
    assert user_call.jax_kernels(lambda: array, jax.block_until_ready, "cpu", array) == ("unknown", "fp32", [])
    timed = []

    observed = []
    fake = types.SimpleNamespace(
        session=types.SimpleNamespace(device=types.SimpleNamespace(torch_device="cpu", name="cpu")),
        _user_benchmark=lambda label, flops, thresholds, seen, timed_call, *meters: (
            observed.append(seen) or timed.append(timed_call)
        ),
    )
    assert runner.BenchRunner._call_jax(fake, lambda: array, array, "forward", None, {}) is array
    assert observed[0]["framework"] == "jax" and observed[0]["kernel"] == "unknown" and observed[0]["ops"] == []
    waited.clear()
    timed[0]()
    assert waited == [array]  # the timed call waited for the array its call returned


def test_a_user_call_that_runs_no_pytorch_op_gets_no_device_time_on_a_gpu(monkeypatch) -> None:
    """On a GPU, a user's ``fn`` whose traced call dispatched no ATen op (TensorFlow work, or JAX work whose
    arrays it did not return) gets no device time, with the reason, instead of the replay time of an empty CUDA
    graph; one that dispatched ops is timed as before."""
    from pytest_lstmperf.speed import user_call

    timed = []
    monkeypatch.setattr(meters, "device_time", lambda fn, device, samples: timed.append(device) or "timed")
    none = user_call.user_device_time(lambda: None, "cuda:0", [])(12)
    assert none.method == "none" and none.samples == () and "dispatched no PyTorch op" in none.note and not timed
    assert user_call.user_device_time(lambda: None, "cuda:0", ["aten::mm"])(12) == "timed" and timed == ["cuda:0"]
    assert user_call.user_device_time(lambda: None, "cpu", [])(12) == "timed"  # the CPU: the time per call anyway


MARKED_TESTS = """
def forward(net, x):
    with torch.no_grad():
        return net(x)


@pytest.mark.lstmperf
def test_marked(benchmark, model):
    out = benchmark(forward, *model)
    assert out.shape == (4, 10, 3)


@pytest.mark.lstmperf("forward")
@pytest.mark.lstmperf_threshold(5.0)
def test_marked_lenient(benchmark, model):
    benchmark.extra_info["note"] = "the user's own extra_info is kept"
    benchmark(forward, *model)


def test_unmarked(benchmark):
    benchmark(sum, range(100))
"""
MARKED_TEST = USER_TEST[: USER_TEST.index("def test_tagger_forward")] + MARKED_TESTS


def test_marked_plain_benchmark_is_recorded_and_gated(user) -> None:
    """pytest-benchmark's own ``benchmark`` under ``@pytest.mark.lstmperf``: recorded into the hardware's
    baseline with its observed kernel and host counters, failed through the ATen op count when extra work is
    planted in every LSTM call (``host-work:3``: 4 more ATen ops per call), and under a 3x slowdown failed
    at the run's threshold while ``@pytest.mark.lstmperf_threshold(5.0)`` passes its twin. The unmarked
    ``benchmark`` test beside them is left to pytest-benchmark: no record, no baseline entry."""
    user.path.joinpath("test_user.py").write_text(MARKED_TEST)
    result = user("--lstmperf-save-baseline")
    assert result.ret == 0, result.stdout.str()
    (path,) = sorted((user.path / "baselines").glob("*.json"))
    entries = {e["name"]: e for e in json.loads(path.read_text())["benchmarks"]}
    assert sorted(entries) == ["test_marked", "test_marked_lenient"]
    marked, lenient = entries["test_marked"]["extra_info"], entries["test_marked_lenient"]["extra_info"]
    assert (marked["path"], marked["mode"], marked["kernel"], lenient["mode"]) == ("user", "call", "onednn", "forward")
    assert marked["host_counters"]["aten_ops"] > 0 and lenient["note"] == "the user's own extra_info is kept"
    faults = ("--benchmark-compare", "-p", "pytest_lstmperf.testing.faults")
    result = user(*faults, "--lstmperf-plant=host-work:3")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines(["*speed gate against*2 host-work-changed*"])
    result.stdout.fnmatch_lines(["*test_marked: host: host-work-changed (aten_ops * -> * per call)"])
    result = user(*faults, "--lstmperf-plant=slowdown:3")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines(["*speed gate against*1 regressed, 1 unchanged*"])
    result.stdout.fnmatch_lines(["*test_user.py::test_marked *regressed"])


def test_marker_misuse_is_a_clear_failure(user) -> None:
    user.path.joinpath("test_user.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.lstmperf\ndef test_no_benchmark():\n    pass\n\n"
        "@pytest.mark.lstmperf(flops=-1)\ndef test_bad_flops(benchmark):\n    benchmark(int)\n\n"
        "@pytest.mark.lstmperf\ndef test_pedantic(benchmark):\n    benchmark.pedantic(int, rounds=3)\n"
    )
    result = user("-rf")
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines(
        [
            "*test_no_benchmark uses no `benchmark` fixture*",
            "*@pytest.mark.lstmperf: flops=-1: a positive number*",
            "*benchmark.pedantic(...) is not measured by pytest-lstmperf*",
        ]
    )


def test_trust_table_counts_detections_and_false_alarms(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """scripts/gate_trust.py: a verdict per benchmark from the gate rows (a failed test without a row is an
    alarm); alarms on targeted benchmarks are detections, anywhere else false alarms."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gate_trust", Path(__file__).parents[1] / "scripts/gate_trust.py")
    trust = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(trust)
    a, b = "suites/t.py::test_inference[torch-x]", "suites/t.py::test_inference[keras-y]"
    baseline = tmp_path / "base.json"
    baseline.write_text(json.dumps({"benchmarks": [
        {"fullname": a, "extra_info": {"framework": "torch", "expected_kernel": "cudnn"}},
        {"fullname": b, "extra_info": {"framework": "keras-torch", "expected_kernel": "cudnn"}},
    ]}))  # fmt: skip
    clean = tmp_path / "clean.log"
    clean.write_text(f"{a}  device  1.0  1.0  1.000  0.5  unchanged\n{b}  per-call  1.0  1.3  1.300  1e-5  regressed\n")
    slow = tmp_path / "slow.log"
    slow.write_text(f"{a}  device  1.0  1.1  1.100  1e-4  regressed\n{b}  device  1.0  1.0  1.000  0.5  unchanged\n")
    fallback = tmp_path / "fallback.log"
    fallback.write_text(f"FAILED {a} - expected kernel cudnn/fp32, observed cuda-generic/fp32\n")
    out = tmp_path / "trust.json"
    runs = [f"clean#1={clean}", f"device-slowdown:1.10#1={slow}", f"fallback={fallback}"]
    assert trust.main([str(baseline), str(out), *runs]) == 0
    table = capsys.readouterr().out
    assert f"false alarm: clean#1: {b} -> regressed" in table
    rows = {line.split()[0]: line.split()[1:] for line in table.splitlines()[-3:]}
    assert rows["clean"] == ["1", "-", "1/2"]
    assert rows["device-slowdown:1.10"] == ["1", "1/1", "0/1"]
    assert rows["fallback"] == ["1", "1/1", "0/0"]  # the Keras benchmark (its own process) is not a target
    assert len(json.loads(out.read_text())["verdicts"]) == 5


def test_event_timed_samples_batch_short_calls_and_time_long_ones_alone() -> None:
    assert meters.events_batch(0.34, 5) == 1  # a Keras training step: 12 samples, not 60 calls
    assert meters.events_batch(0.015, 5) == 2
    assert meters.events_batch(0.003, 5) == 5 and meters.events_batch(0.0, 5) == 5


def test_the_keras_on_torch_worker_runs_cuda_work_on_a_stream_of_its_own(monkeypatch) -> None:
    """Before a CUDA run is prepared, the Keras-on-torch worker sets a CUDA stream of its own, made once: on the
    legacy default stream, the CUDA-graph capture of a Keras training step failed in its backward in some H100
    runs and not in others (``server.own_stream``). CPU runs and the other backends leave the streams alone."""
    import torch

    from pytest_lstmperf.model.case import make_case
    from pytest_lstmperf.model.keras_options import KerasOptions
    from pytest_lstmperf.paths.keras import server
    from pytest_lstmperf.speed.shapes import REFERENCE

    made: list[object] = []
    current: list[object] = []
    monkeypatch.setattr(torch.cuda, "Stream", lambda *args, **kwargs: made.append(object()) or made[-1])
    monkeypatch.setattr(torch.cuda, "set_stream", current.append)
    monkeypatch.setattr(server, "_STREAM", [])
    prepared: list[object] = []
    monkeypatch.setattr(server, "LocalKerasRun", lambda *args: prepared.append(list(current)) or object())

    case, options = make_case(REFERENCE), KerasOptions(backend="torch").to_dict()
    worker = server.Server("torch")
    worker.prepare(options, case, "cpu")
    assert made == [] and current == [] and prepared == [[]]
    worker.prepare(options, case, "cuda")
    worker.prepare(options, case, "cuda")
    assert len(made) == 1 and current == [made[0], made[0]]
    assert prepared[1] == [made[0]]  # set before the run was built
    server.Server("tensorflow").prepare({**options, "backend": "tensorflow"}, case, "cuda")
    assert len(current) == 2


class _QueuedDevice:
    """A device that works through queued calls one after another (``device_s`` each) while the host queues
    the next (``host_s`` each), on a virtual clock: a JAX executable on a GPU, without the GPU."""

    def __init__(self, host_s: float, device_s: float) -> None:
        self.host_s, self.device_s = host_s, device_s
        self.now = 0.0
        self.free_at = 0.0
        self.busy = 0.0  # device seconds of work run so far: what CUPTI would record

    def clock(self) -> float:
        return self.now

    def call(self) -> float:
        self.now += self.host_s
        self.free_at = max(self.free_at, self.now) + self.device_s
        self.busy += self.device_s
        return self.free_at  # the "result": when it is ready

    def recorded(self, block) -> float:
        """What a CUPTI recorder gives for ``block``: the device work it ran."""
        before = self.busy
        block()
        return self.busy - before

    def wait(self, results: object) -> None:
        done = max(results) if isinstance(results, list) else results
        self.now = max(self.now, float(done))  # type: ignore[arg-type]


def test_pipelined_device_time_is_the_devices_where_the_host_queues_faster_and_says_host_bound_where_not() -> None:
    """Keras on JAX: XLA runs on JAX's own streams, which torch's graphs and events do not see, and a call returns
    before its kernels finish. Calls queued back to back and timed until the last result is ready give the
    device's time per call where the host queues faster than the device works (2 ms device, 0.1 ms host: the
    figure is within one launch spread over the batch of 2 ms, a 1.25x slower device shows as 1.25x), and the
    host's launch rate where it does not, said so by the share kept beside it."""
    device = _QueuedDevice(host_s=1e-4, device_s=2e-3)
    timed = meters.pipelined_device_time(device.call, device.wait, samples=12, clock=device.clock)
    assert timed.method == "pipelined" and len(timed.samples) == 12
    assert timed.median == pytest.approx(2e-3 + 1e-4 / 5)  # 5 calls per sample: one launch not overlapped
    assert timed.dispatch_share < meters.PIPELINED_DEVICE_BOUND and "the device's" in timed.note
    slower = _QueuedDevice(host_s=1e-4, device_s=2.5e-3)
    ratio = meters.pipelined_device_time(slower.call, slower.wait, samples=12, clock=slower.clock).median / timed.median
    assert ratio == pytest.approx(1.25, abs=0.01)
    # the host is the bottleneck: the figure is its launch rate, and the share says so
    host = _QueuedDevice(host_s=1e-3, device_s=2e-4)
    bound = meters.pipelined_device_time(host.call, host.wait, samples=12, clock=host.clock)
    assert bound.median == pytest.approx(1e-3 + 2e-4 / 5)
    assert bound.dispatch_share >= meters.PIPELINED_DEVICE_BOUND and "host-bound" in bound.note
    # a long call is timed alone, with fewer samples (as event timing)
    long = _QueuedDevice(host_s=1e-4, device_s=0.3)
    alone = meters.pipelined_device_time(long.call, long.wait, samples=12, clock=long.clock)
    assert "1 call(s) queued" in alone.note and len(alone.samples) == meters.long_call_samples(0.3001, 12)


def test_cupti_device_time_sums_the_gpu_work_per_call_and_gives_way_where_nothing_records_it() -> None:
    """Keras on JAX on the H100: an executable waits on a copy to the host inside it, so queued calls are timed
    at the host's pace (queueing took 92-100% of the time). CUPTI records the GPU's own activities whichever
    runtime launched them: each sample is their summed duration over the calls it ran, so a host-bound call
    still shows the device's 0.4 ms, a 1.25x slower device shows as 1.25x whatever the host does, a long call
    (one per sample) is not divided by the batch it did not run, and where nothing was recorded the caller
    falls back."""
    device = _QueuedDevice(host_s=1e-3, device_s=4e-4)  # host-bound: queued timing would give 1 ms
    timed = meters.cupti_device_time(device.call, device.wait, samples=12, clock=device.clock, busy=device.recorded)
    assert timed is not None and timed.method == "cupti" and timed.median == pytest.approx(4e-4)
    assert "CUPTI" in timed.note and "5 call(s) per sample" in timed.note and len(timed.samples) == 12
    slower = _QueuedDevice(host_s=1e-3, device_s=5e-4)
    again = meters.cupti_device_time(slower.call, slower.wait, 12, clock=slower.clock, busy=slower.recorded)
    assert again.median / timed.median == pytest.approx(1.25)
    long = _QueuedDevice(host_s=1e-3, device_s=0.03)  # 30 ms: one call per sample
    alone = meters.cupti_device_time(long.call, long.wait, 12, clock=long.clock, busy=long.recorded)
    assert "1 call(s) per sample" in alone.note and alone.median == pytest.approx(0.03)
    # nothing recorded (no torch, no CUDA profiling, or another process's kernels): None, the caller falls back
    assert meters.cupti_device_time(device.call, device.wait, 12, clock=device.clock, busy=lambda b: None) is None
    assert meters.cupti_device_time(device.call, device.wait, 12, clock=device.clock, busy=lambda b: 0.0) is None
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():  # the default recorder on a machine without a GPU records nothing
        ran: list[int] = []
        busy_s = meters._cupti_busy(lambda: ran.append(1))
        assert busy_s is None or (busy_s == 0.0 and ran == [1])


def test_a_keras_on_jax_device_time_that_fails_costs_the_benchmark_nothing_and_says_why(monkeypatch) -> None:
    """CUPTI through torch's profiler can fail (an API that moved, another profiler holding CUPTI): the worker
    then times queued calls, naming the failure, and where that fails too it has no device time, never an error
    that costs the benchmark its timings."""
    from pytest_lstmperf.paths.keras.jax_runner import JaxRunner

    device = _QueuedDevice(host_s=1e-4, device_s=2e-3)
    stub = types.SimpleNamespace(
        _executable=lambda phase: lambda *args: device.call(),
        args=(),
        jax=types.SimpleNamespace(block_until_ready=device.wait),
    )

    def broken(*args, **kwargs):
        raise AttributeError("'KinetoEvent' object has no attribute 'duration_ns'")

    monkeypatch.setattr(meters, "cupti_device_time", broken)
    queued = JaxRunner.device_time(stub, "forward", 6)
    assert queued.method == "pipelined" and len(queued.samples) == 6
    assert queued.note.startswith("CUPTI device time failed (AttributeError:") and queued.dispatch_share is not None
    monkeypatch.setattr(meters, "pipelined_device_time", broken)
    none = JaxRunner.device_time(stub, "train_step", 6)
    assert none.method == "none" and none.samples == () and "queued timing failed too" in none.note


def test_device_samples_alternate_with_the_anchors_so_shared_interference_cancels() -> None:
    """Planted: the GPU is 2x slower for a while during a device measurement (another process's work), for
    whatever runs on it then. Taken alternately (:func:`meters.paired_with`), the benchmark's and the anchor's
    samples of that while are slow together and every ratio stays 2.0; taken one block after the other (as the
    anchor's device samples were before), the benchmark's block alone carries it and its figure moves 1.41x (an
    H100 clean run failed at 1.105x so)."""
    from pytest_lstmperf.speed import policy

    clock = {"tick": 0}

    def on_gpu(seconds: float) -> float:  # the 7th to 12th device samples taken are slow, whoever takes them
        clock["tick"] += 1
        return seconds * (2.0 if 7 <= clock["tick"] <= 12 else 1.0)

    def busy(block) -> float:  # type: ignore[no-untyped-def]
        block()
        return on_gpu(1e-3)

    def figure(bench: Sequence[float], anchors: Sequence[float]) -> float:
        return policy.Figure.of([b / a for b, a in zip(bench, anchors, strict=True)]).value

    def measure() -> meters.DeviceTime:
        dev = meters.cupti_device_time(
            lambda: 0.0,
            lambda r: None,
            samples=12,
            calls=1,
            busy=busy,
            clock=iter([k * 1e-4 for k in range(10**4)]).__next__,
        )
        assert dev is not None and len(dev.samples) == 12
        return dev

    with meters.paired_with(lambda: on_gpu(5e-4)) as beside:
        dev = measure()
    assert len(beside) >= 12 and figure(dev.samples, beside[-12:]) == pytest.approx(2.0)
    clock["tick"] = 0
    dev = measure()
    after = [on_gpu(5e-4) for _ in range(12)]
    assert figure(dev.samples, after) == pytest.approx(2.0 * 2**0.5)  # half its samples slow: the median between


def test_a_device_figure_takes_its_second_half_of_samples_only_where_the_first_is_noisy() -> None:
    """Device samples are taken in two halves: a GPU's own time (CUDA graph, CUPTI) whose first half already
    resolves runner.DEVICE_SETTLED stops there; a noisy one, or a method that is not the GPU's own, takes the
    rest; the anchor samples taken beside each half pair with that half's samples (a transient's dropped)."""
    from pytest_lstmperf.speed import runner

    def meter(method: str, noisy: bool, beside: list[float]):
        calls: list[int] = []

        def dev_time(samples: int) -> meters.DeviceTime:
            calls.append(samples)
            beside.append(-1.0)  # the anchor sample beside a start-up transient the meter drops
            values = tuple(1e-3 * (1 + (0.2 if noisy and i % 2 else 0.0)) for i in range(samples))
            beside.extend(float(len(calls)) for _ in values)
            return meters.DeviceTime(method, values)

        return dev_time, calls

    beside: list[float] = []
    dev_time, calls = meter("cuda-graph", noisy=False, beside=beside)
    dev, paired = runner._settled_device_time(dev_time, 12, beside)
    assert calls == [6] and len(dev.samples) == 6 and paired == [1.0] * 6
    beside = []
    dev_time, calls = meter("cuda-graph", noisy=True, beside=beside)
    dev, paired = runner._settled_device_time(dev_time, 12, beside)
    assert calls == [6, 6] and len(dev.samples) == 12 and paired == [1.0] * 6 + [2.0] * 6
    assert runner._resolves(dev.samples) > runner.DEVICE_SETTLED
    beside = []
    dev_time, calls = meter("pipelined", noisy=False, beside=beside)  # not the GPU's own time: every sample
    dev, _ = runner._settled_device_time(dev_time, 12, beside)
    assert calls == [6, 6] and len(dev.samples) == 12
    beside = []
    dev_time, calls = meter("cuda-graph", noisy=True, beside=beside)  # a benchmark the run does not judge
    dev, paired = runner._settled_device_time(dev_time, 12, beside, settle=False)
    assert calls == [6] and len(dev.samples) == 6 and paired == [1.0] * 6  # the first half alone, noisy or not
    dev, paired = runner._settled_device_time(lambda n: meters.DeviceTime("host"), 12, [])  # the CPU: one call
    assert dev.samples == () and paired == []


def test_a_users_bf16_call_on_a_cpu_is_timed_beside_the_anchor_in_bf16(pytester, monkeypatch, tmp_path) -> None:
    """The runner pairs a call whose traced kernel ran in bf16 with the anchor under bf16 autocast (its kind ends
    ``-bf16-warm``), and an fp32 call with the fp32 anchor, in one run. The bf16 call runs the native kernel:
    torch sends a bf16 LSTM to oneDNN wherever oneDNN is on, and a CPU without avx512_bf16 or AMX raises
    'could not create a primitive descriptor' there."""
    pytester.makepyfile(
        test_precisions="""
        import torch

        def test_bf16(lstmperf_benchmark):
            torch.set_num_threads(1)
            lstm, x = torch.nn.LSTM(8, 16, batch_first=True), torch.randn(4, 10, 8)

            def forward():
                with torch.no_grad(), torch.backends.mkldnn.flags(enabled=False):
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        return lstm(x)[0]

            lstmperf_benchmark(forward)  # the native kernel's output is float32; its traced gates ran in bf16

        def test_fp32(lstmperf_benchmark):
            torch.set_num_threads(1)
            lstm, x = torch.nn.LSTM(8, 16, batch_first=True), torch.randn(4, 10, 8)

            def forward():
                with torch.no_grad():
                    return lstm(x)[0]

            assert lstmperf_benchmark(forward).dtype == torch.float32
        """
    )
    _env(monkeypatch)
    target = tmp_path / "out.json"
    result = runpytest_forked(pytester, *USER_ARGS, f"--benchmark-json={target}", timeout=INNER_TIMEOUT_S)
    assert result.ret == 0, result.stdout.str()
    records = _records(target).values()
    kinds = {b["name"]: (b["extra_info"]["precision"], b["extra_info"]["anchor"]["kind"]) for b in records}
    assert kinds == {
        "test_bf16": ("bf16", "torch-cpu-backward-bf16-warm"),
        "test_fp32": ("fp32", "torch-cpu-backward-warm"),
    }, kinds
