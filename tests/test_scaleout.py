"""Scale-out: the distributed launcher and strategies on gloo (CPU), torchrun, the suite's checks failing
when a fault is planted in the workers, and pytest-xdist's one-worker-per-GPU pinning."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from pytest_lstmperf import device as device_mod  # noqa: E402
from pytest_lstmperf import distributed as dist  # noqa: E402

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[1]


def test_stage_bounds_cover_every_layer_once() -> None:
    assert dist.stage_bounds(8, 2) == [(0, 4), (4, 8)]
    assert dist.stage_bounds(5, 3) == [(0, 2), (2, 4), (4, 5)]
    assert dist.stage_bounds(3, 3) == [(0, 1), (1, 2), (2, 3)]


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


def test_relative_difference_needs_the_same_tensors() -> None:
    import numpy as np

    a = {"x": np.ones(3)}
    assert dist.max_relative_difference(a, {"x": np.ones(3)}) == (0.0, "")
    with pytest.raises(ValueError, match="different tensors: x, y"):
        dist.max_relative_difference(a, {"y": np.ones(3)})


@pytest.mark.parametrize("strategy", dist.STRATEGIES)
def test_gloo_two_ranks_match_single_process(strategy: str) -> None:
    cfg = dist.TrainConfig(layers=2, input_size=4, hidden=8, seq_len=5, batch=4, steps=2, micro_batches=2)
    result = dist.launch(strategy, 2, cfg, "gloo", timeout_s=300)
    reference = dist.single_process(cfg)
    err, _ = dist.update_difference(result, reference, cfg)
    assert err < 1e-4 and result.tokens == reference.tokens == 2 * 4 * 5
    # the comparison is not blind: one step less training is far off
    fewer = dist.single_process(dist.TrainConfig(**{**cfg.__dict__, "steps": 1}))
    err_fewer, _ = dist.update_difference(fewer, reference, cfg)
    assert err_fewer > 0.1


def test_torchrun_entry_point(tmp_path: Path) -> None:
    out = tmp_path / "result.pt"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
           str(dist.free_port()), "-m", "pytest_lstmperf.distributed", "--strategy", "pipeline", "--backend", "gloo",
           "--layers", "2", "--input-size", "4", "--hidden", "8", "--seq-len", "5", "--batch", "4", "--steps", "2",
           "--micro-batches", "2", "--out", str(out)]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != dist.WORKER_PLANT_ENV}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = dist.RunResult(**torch.load(out, weights_only=False))
    cfg = dist.TrainConfig(layers=2, input_size=4, hidden=8, seq_len=5, batch=4, steps=2, micro_batches=2)
    err, _ = dist.max_relative_difference(
        dist.updates(result.weights, cfg), dist.updates(dist.single_process(cfg).weights, cfg)
    )
    assert result.world == 2 and err < 1e-4


def test_entry_point_outside_torchrun_is_refused(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    proc = subprocess.run([sys.executable, "-m", "pytest_lstmperf.distributed", "--out", str(tmp_path / "x")],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)  # fmt: skip
    assert proc.returncode == 2 and "run under torchrun" in proc.stderr


# ------------------------------------------------------------------------------------------- the suite
def _suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_scaling=(ROOT / "suites" / "test_scaling.py").read_text())
    for name in ("PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", dist.WORKER_PLANT_ENV):
        monkeypatch.delenv(name, raising=False)


def test_suite_equivalence_fails_when_workers_compute_wrong(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    _suite(pytester, monkeypatch)
    monkeypatch.setenv(dist.WORKER_PLANT_ENV, "perturb:1e-3")
    result = pytester.runpytest_subprocess("--device=cpu", "-p", "no:cacheprovider", "-k", "match_single", timeout=600)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines(["*ddp on 2 ranks (gloo): weight updates differ from the single-process run by*"])
    result.stdout.fnmatch_lines(["*pipeline on 2 ranks (gloo): weight updates differ*"])


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
    from types import SimpleNamespace

    from pytest_lstmperf import plugin

    monkeypatch.setattr(plugin.options, "resolve", lambda config, name: SimpleNamespace(value="cuda"))
    assert plugin.pytest_xdist_auto_num_workers(None) == 2  # type: ignore[arg-type]
    monkeypatch.setattr(plugin.options, "resolve", lambda config, name: SimpleNamespace(value="cpu"))
    assert plugin.pytest_xdist_auto_num_workers(None) is None  # type: ignore[arg-type]


def test_n_auto_end_to_end_starts_one_worker_per_gpu(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through pytest-xdist itself: the plugin's answer wins over xdist's default (one worker per CPU core)."""
    for name in ("PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT"):
        monkeypatch.delenv(name, raising=False)
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
    result = pytester.runpytest_subprocess("-n", "auto", "--device=cuda", "-p", "no:cacheprovider", "-rP")
    result.stdout.fnmatch_lines(["*created: 3/3 workers*"])
    for index in range(3):  # each worker on its own GPU
        pinned = f"worker gw{index} pinned to cuda:{index} of 3]"
        result.stdout.fnmatch_lines([f"WORKER gw{index} cuda:{index} (Fake GPU*{pinned}"])
