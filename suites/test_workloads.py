"""The seed workloads, reproduced on this machine and kept true in CI.

    pytest suites/test_workloads.py --device=cuda --lstmperf-report=report/
    pytest suites/test_workloads.py --device=cuda --lstmperf-bench-set=thorough    # the full sweeps

* padding vs packing vs bucketing: a variable-length dataset (uniform and long-tailed lengths) run padded to
  each batch's longest sequence, packed, and bucketed by automatically generated length buckets; the valid
  outputs and last states agree with every sequence run alone in float64, and the run reports the padded
  work against the ideal work and the speedups of packing and bucketing (timed by pytest-benchmark);
* the CPU/GPU crossover: batch size sweep of one layer on the CPU path and the GPU paths (on a CPU-only run:
  oneDNN against the native kernel), every point checked to run the kernel its path claims;
* framework overhead: ``nn.LSTM``/``nn.GRU`` against the ATen op it calls and, on CUDA, a CUDA-graph replay
  of the same call (the device-only cost), after checking that the op computes the same numbers; Keras 3 on
  the torch backend and on TensorFlow (where installed; on CUDA where TensorFlow sees a GPU) on the same
  shapes against that raw cost, each checked to run the kernel its path claims;
* precision: every precision path on the same shape, its speed and its error against the float64 reference
  side by side, with the kernel and tolerance checks of the equivalence suite.

The quick set (default, for merge gating) runs cheap representatives; ``--lstmperf-bench-set=thorough``
runs the full grids. Results are printed at the end of the run and written to ``--lstmperf-report=DIR``.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from pytest_lstmperf import paths as registry
from pytest_lstmperf.hooks.workloads import add_row
from pytest_lstmperf.speed.shapes import bench_set
from pytest_lstmperf.workloads.rows import BucketingRow, CrossoverRow, OverheadRow, PrecisionRow

torch = pytest.importorskip("torch")

from pytest_lstmperf.device import resolve_device  # noqa: E402
from pytest_lstmperf.model.case import make_case  # noqa: E402
from pytest_lstmperf.model.reference import run_reference  # noqa: E402
from pytest_lstmperf.model.spec import LayerSpec  # noqa: E402
from pytest_lstmperf.numerics.checks import check_against, check_trace  # noqa: E402
from pytest_lstmperf.numerics.equivalence import verify_path  # noqa: E402
from pytest_lstmperf.numerics.path_specs import checkable_spec  # noqa: E402
from pytest_lstmperf.numerics.tolerance import tolerance  # noqa: E402
from pytest_lstmperf.workloads import crossover, overhead, timing, varlen  # noqa: E402

# ------------------------------------------------------------------------------------------- settings
# (count, max_len, batch, input, hidden) per device kind and set
VARLEN = {
    ("cpu", "gate"): (96, 50, 16, 32, 64),
    ("cpu", "thorough"): (512, 200, 32, 64, 128),
    ("cuda", "gate"): (512, 100, 32, 64, 256),
    ("cuda", "thorough"): (4096, 400, 64, 256, 512),
}
CROSSOVER = {
    "cpu": (LayerSpec(input_size=32, hidden_size=64, batch=1, seq_len=20), ("torch-cpu-native", "torch-cpu-onednn")),
    "cuda": (
        LayerSpec(input_size=64, hidden_size=256, num_layers=2, batch=1, seq_len=100),
        ("torch-cpu-onednn", "torch-cudnn-default", "torch-cuda-generic"),
    ),
}
CROSSOVER_BATCHES = {"gate": (1, 8, 64), "thorough": (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)}
# (hidden, batch, seq) grids; input = hidden
OVERHEAD = {
    ("cpu", "gate"): [(64, 1, 20), (64, 16, 20)],
    ("cpu", "thorough"): list(itertools.product((64, 256), (1, 16), (20, 100))),
    ("cuda", "gate"): [(256, 1, 100), (256, 64, 100), (1024, 64, 25)],
    ("cuda", "thorough"): list(itertools.product((256, 512, 1024), (1, 16, 64), (25, 100))),
}
KERAS_OVERHEAD_PATHS = {
    "cpu": ("keras-torch-cpu", "keras-tf-cpu", "keras-jax-cpu"),
    "cuda": ("keras-torch-cudnn", "keras-tf-cudnn", "keras-jax-cudnn"),
}
#: torch.compile and ONNX Runtime, timed in this process against the same raw cost
EXPORTED_OVERHEAD_PATHS = {
    "cpu": ("torch-compile-cpu", "onnxruntime-cpu"),
    "cuda": ("torch-compile-cudnn", "torch-compile-reduce-overhead", "onnxruntime-cuda"),
}
PRECISION_PATHS = {
    "cpu": (
        "torch-cpu-onednn", "torch-cpu-autocast-bf16", "torch-cpu-native-autocast-bf16", "torch-compile-cpu",
        "onnxruntime-cpu",
    ),
    "cuda": (
        "torch-cudnn-fp32", "torch-cudnn-default", "torch-cuda-autocast-fp16", "torch-cuda-autocast-bf16",
        "torch-compile-cudnn", "onnxruntime-cuda",
    ),
}  # fmt: skip
#: the path each precision path is timed against ("vs fp32")
FP32_REFERENCE = {"cpu": "torch-cpu-onednn", "cuda": "torch-cudnn-fp32"}
PRECISION_REPEATS = 15
PRECISION_SHAPES = {
    ("cpu", "gate"): [LayerSpec(input_size=32, hidden_size=64, batch=16, seq_len=20)],
    ("cpu", "thorough"): [LayerSpec(input_size=64, hidden_size=256, batch=32, seq_len=50)],
    ("cuda", "gate"): [LayerSpec(input_size=512, hidden_size=512, batch=64, seq_len=25)],
    ("cuda", "thorough"): [
        LayerSpec(input_size=512, hidden_size=512, batch=64, seq_len=25),
        LayerSpec(input_size=1024, hidden_size=1024, batch=64, seq_len=25),
        LayerSpec(input_size=64, hidden_size=256, num_layers=2, batch=64, seq_len=100),
    ],
}


def _kind(config: pytest.Config) -> str:
    from pytest_lstmperf.session import ensure_session

    return ensure_session(config).device.kind


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    config = metafunc.config
    kind, set_name = _kind(config), bench_set(config)
    if "distribution" in metafunc.fixturenames:
        metafunc.parametrize("distribution", varlen.LENGTH_DISTRIBUTIONS)
    if "varlen_mode" in metafunc.fixturenames:
        metafunc.parametrize("varlen_mode", varlen.MODES)
    if "overhead_shape" in metafunc.fixturenames:
        cells = ("lstm", "gru") if set_name == "thorough" else ("lstm",)
        shapes = [(c, *s) for c in cells for s in OVERHEAD[(kind, set_name)]]
        metafunc.parametrize("overhead_shape", shapes, ids=[f"{c}-H{h}-B{b}-T{t}" for c, h, b, t in shapes])
    if "keras_overhead_path" in metafunc.fixturenames:
        metafunc.parametrize("keras_overhead_path", KERAS_OVERHEAD_PATHS[kind])
    if "exported_overhead_path" in metafunc.fixturenames:
        metafunc.parametrize("exported_overhead_path", EXPORTED_OVERHEAD_PATHS[kind])
    if "precision_case" in metafunc.fixturenames:
        cases = [(p, s) for s in PRECISION_SHAPES[(kind, set_name)] for p in PRECISION_PATHS[kind]]
        metafunc.parametrize("precision_case", cases, ids=[f"{p}-{s.short()}" for p, s in cases])


@pytest.fixture(scope="module")
def varlen_workloads(lstmperf: Any, pytestconfig: pytest.Config) -> dict[str, varlen.VarLenWorkload]:
    count, max_len, batch, input_size, hidden = VARLEN[(lstmperf.device.kind, bench_set(pytestconfig))]
    out = {}
    for dist in varlen.LENGTH_DISTRIBUTIONS:
        lengths = varlen.draw_lengths(count, max_len, dist, lstmperf.seed)
        out[dist] = varlen.VarLenWorkload(
            "lstm", input_size, hidden, lengths, batch, device=lstmperf.device.torch_device, seed=lstmperf.seed
        )
    return out


def _workload_name(wl: varlen.VarLenWorkload, dist: str) -> str:
    return f"{dist} n={len(wl.lengths)} max={int(wl.lengths.max())} B={wl.batch} H={wl.hidden_size}"


def _device_precision(device_kind: str) -> str:
    if device_kind == "cuda" and torch.backends.cudnn.allow_tf32:
        return "tf32"
    return "fp32"


# ------------------------------------------------------------------------------------------- bucketing
def test_padding_packing_bucketing_agree(varlen_workloads: dict, distribution: str) -> None:
    """Valid outputs and last states of the three ways agree with every sequence run alone in float64."""
    wl = varlen_workloads[distribution]
    reference = wl.reference()
    spec = LayerSpec(input_size=wl.input_size, hidden_size=wl.hidden_size, batch=wl.batch,
                     seq_len=int(wl.lengths.max()))  # fmt: skip
    bound = tolerance(_device_precision(wl.dev.type), "forward", spec)
    failures = []
    for mode in varlen.MODES:
        err = varlen.max_relative_error(wl.results(mode), reference)
        if not err <= bound.rel:
            failures.append(f"{mode}: max relative error {err:.3e} > bound {bound.rel:.3e} ({bound.explain()})")
    assert not failures, f"{_workload_name(wl, distribution)}:\n" + "\n".join(failures)


def test_padding_packing_bucketing_speed(
    varlen_workloads: dict, distribution: str, varlen_mode: str, benchmark: Any, request: pytest.FixtureRequest
) -> None:
    """One training epoch (forward + backward per batch) each way; work ratio and time to the summary."""
    wl = varlen_workloads[distribution]
    work = wl.work(varlen_mode)
    if varlen_mode == "packed":
        assert work.ratio == 1.0
    else:
        assert work.padded >= work.ideal  # padding never computes fewer steps than the data holds

    def epoch() -> None:
        wl.epoch(varlen_mode, train=True)
        wl.synchronize()

    benchmark.group = f"epoch {_workload_name(wl, distribution)}"
    benchmark.extra_info.update(mode=varlen_mode, work_ratio=work.ratio, wasted=work.wasted, buckets=wl.bounds)
    if benchmark.enabled:
        benchmark.pedantic(epoch, rounds=5, warmup_rounds=1, iterations=1)
        seconds = benchmark.stats.stats.median
    else:  # pytest-benchmark disables itself under pytest-xdist or --benchmark-disable
        benchmark.pedantic(epoch)
        seconds = timing.median_time(epoch, wl.synchronize, repeats=5, warmup=0)
    add_row(request, BucketingRow(workload=_workload_name(wl, distribution), mode=varlen_mode,
                                  work_ratio=work.ratio, wasted=work.wasted, seconds=seconds,
                                  buckets=len(wl.bounds) if varlen_mode == "bucketed" else "-"))  # fmt: skip


# ------------------------------------------------------------------------------------------- crossover
def test_crossover(lstmperf: Any, pytestconfig: pytest.Config, request: pytest.FixtureRequest) -> None:
    """Batch sweep on each path; every point must run the kernel its path claims."""
    kind = lstmperf.device.kind
    spec, names = CROSSOVER[kind]
    devices = {"cpu": resolve_device("cpu"), kind: lstmperf.device}
    batches = CROSSOVER_BATCHES[bench_set(pytestconfig)]
    points = crossover.crossover_sweep(spec, batches, names, devices, repeats=5, seed=lstmperf.seed)
    problems = []
    for point in points:
        path = registry.get(point.path)
        if point.seconds is None:
            problems.append(f"{point.path} batch {point.batch}: not measured: {point.note}")
            continue
        family, precision = path.expected(spec.replace(batch=point.batch))
        if not _same_kernel(point.kernel, f"{family}/{precision}"):
            problems.append(f"{point.path} batch {point.batch}: expected {family}/{precision}, observed {point.kernel}")
    fast, slow = (names[1:], names[0])
    marks = crossover.crossovers(points, slow, fast)
    plot = None
    report_dir = pytestconfig.getoption("lstmperf_report", None)
    if report_dir:
        from pathlib import Path

        Path(report_dir).mkdir(parents=True, exist_ok=True)
        title = f"{crossover.sweep_label(spec)}, forward, against {slow}\n{lstmperf.device.describe()}"
        plot = str(crossover.plot_sweep(points, Path(report_dir) / f"crossover-{kind}.png", title, marks))
    add_row(request, CrossoverRow(shape=crossover.sweep_label(spec), against=slow, crossover=marks, plot=plot,
                                  points=tuple(p.__dict__ for p in points)))  # fmt: skip
    assert not problems, "\n".join(problems)


def _same_kernel(observed: str, expected: str) -> bool:
    from pytest_lstmperf.observation.claims import same_kernel

    return same_kernel(observed, expected)


# ------------------------------------------------------------------------------------------- overhead
def test_framework_overhead(lstmperf: Any, overhead_shape: tuple, request: pytest.FixtureRequest) -> None:
    """Module call vs the ATen op (same numbers first) vs a CUDA-graph replay of the module call."""
    cell, hidden, batch, seq = overhead_shape
    device = lstmperf.device.torch_device
    torch.manual_seed(lstmperf.seed)
    module = (torch.nn.LSTM if cell == "lstm" else torch.nn.GRU)(hidden, hidden, batch_first=True).to(device)
    x = torch.randn(batch, seq, hidden, device=device)
    h0 = torch.zeros(1, batch, hidden, device=device)
    with torch.no_grad():
        out_module, _ = module(x)
        args = (x, (h0, h0)) if cell == "lstm" else (x, h0)
        op = torch._VF.lstm if cell == "lstm" else torch._VF.gru
        out_op = op(*args, module._flat_weights, True, 1, 0.0, False, False, True)[0]
    assert torch.equal(out_module, out_op), "the raw op does not compute what the module computes"
    result = _raw_cost(overhead_shape, device)
    if lstmperf.device.kind == "cuda":
        assert result.graph_s is not None, "CUDA-graph capture of the module call failed: no device-only cost"
    add_row(request, OverheadRow(shape=f"{cell}-H{hidden}-B{batch}-T{seq}", device=lstmperf.device.name,
                                 framework="torch", ran=result.ran, module_s=result.module_s, op_s=result.op_s,
                                 graph_s=result.graph_s, raw_s=result.raw_s, ratio=result.ratio,
                                 host_s=result.host_s, kernels=result.kernels))  # fmt: skip


_RAW_COSTS: dict[tuple, overhead.Overhead] = {}


def _raw_cost(shape: tuple, device: str) -> overhead.Overhead:
    """The torch module / ATen op / graph replay costs of one shape, measured once per run."""
    if (shape, device) not in _RAW_COSTS:
        cell, hidden, batch, seq = shape
        _RAW_COSTS[(shape, device)] = overhead.measure_overhead(cell, hidden, hidden, 1, batch, seq, device)
    return _RAW_COSTS[(shape, device)]


def _overhead_run(lstmperf: Any, shape: tuple, name: str, **spec_fields: Any) -> tuple:
    """(path, spec, raw cost, prepared run, forward trace) for one overhead row; a skip with the reason where
    the path cannot run here."""
    cell, hidden, batch, seq = shape
    path = registry.get(name)
    spec = LayerSpec(cell=cell, input_size=hidden, hidden_size=hidden, batch=batch, seq_len=seq, **spec_fields)
    reason = path.available(lstmperf.device) or path.supports(spec)
    if reason:
        pytest.skip(f"{path.name}: {reason}")
    raw = _raw_cost(shape, lstmperf.device.torch_device)
    run = path.prepare(make_case(spec, lstmperf.seed), lstmperf.device)
    return path, spec, raw, run, run.trace_forward()


def _overhead_row(
    request: pytest.FixtureRequest, lstmperf: Any, shape: tuple, framework: str, path: Any, spec: LayerSpec,
    raw: Any, trace: Any, seconds: float, **extra: Any,
) -> None:  # fmt: skip
    """The overhead row, then the path's kernel claim (checked after the row, so a failure still reports it)."""
    cell, hidden, batch, seq = shape
    kernels = len(trace.kernels) if lstmperf.device.kind == "cuda" else len(trace.ops)
    add_row(request, OverheadRow(shape=f"{cell}-H{hidden}-B{batch}-T{seq}", device=lstmperf.device.name,
                                 framework=framework, ran=f"{trace.family}/{trace.precision}", module_s=seconds,
                                 op_s=None, graph_s=raw.graph_s, raw_s=raw.raw_s, ratio=seconds / raw.raw_s,
                                 host_s=max(seconds - raw.raw_s, 0.0), kernels=kernels, **extra))  # fmt: skip
    problems = check_trace(path.expected(spec), trace, "forward")
    assert not problems, f"{path.name} on {spec.short()}: " + "; ".join(m.message for m in problems)


def test_keras_overhead(
    lstmperf: Any, overhead_shape: tuple, keras_overhead_path: str, request: pytest.FixtureRequest
) -> None:
    """A Keras layer's forward call on the same shape, timed inside its backend's worker, against the raw
    cost of the torch layer (the graph replay on CUDA, the ATen op on the CPU); it must run its claimed kernel."""
    from pytest_lstmperf.device import xdist_worker
    from pytest_lstmperf.paths.keras.paths import start_workers_for

    # the rows of this run need one worker per backend: the first row starts them side by side and waits for
    # all, so that no row is timed beside another worker's imports (later rows find them running). Not under
    # pytest-xdist, where this process may run one of the rows only
    if xdist_worker() is None:
        rows = {
            item.callspec.params.get("keras_overhead_path")
            for item in request.session.items
            if getattr(item, "originalname", None) == "test_keras_overhead" and hasattr(item, "callspec")
        }
        start_workers_for([p for p in lstmperf.available_paths if p.name in rows])
    path, spec, raw, run, trace = _overhead_run(lstmperf, overhead_shape, keras_overhead_path)
    seconds = float(np.median(run.time("forward", repeats=15, warmup=3)))
    _overhead_row(request, lstmperf, overhead_shape, path.framework, path, spec, raw, trace, seconds)


def test_compiled_and_onnx_overhead(
    lstmperf: Any, overhead_shape: tuple, exported_overhead_path: str, request: pytest.FixtureRequest
) -> None:
    """torch.compile and ONNX Runtime on the same shape against the raw cost of the eager torch layer (the graph
    replay on CUDA, the ATen op on the CPU): 15 synchronised forward calls after the path's warm-up (compiling
    and exporting are not timed); the path must run its claimed kernel."""
    path, spec, raw, run, trace = _overhead_run(lstmperf, overhead_shape, exported_overhead_path, training=False)
    seconds, _ = timing.paired_median_times([run.forward, run.forward], run.synchronize, repeats=15)
    _overhead_row(request, lstmperf, overhead_shape, path.name, path, spec, raw, trace, seconds,
                  precision=path.precision, note=trace.detail)  # fmt: skip


# ------------------------------------------------------------------------------------------- precision
def test_precision_speed_and_error(lstmperf: Any, precision_case: tuple, request: pytest.FixtureRequest) -> None:
    """Time and error side by side; then the equivalence suite's kernel and tolerance checks. The path is timed
    in alternation with the device's fp32 path on the same inputs, so "vs fp32" compares two figures taken
    at the same moment in the same process (also under pytest-xdist, where workers load each other)."""
    name, spec = precision_case
    path = registry.get(name)
    if path.options.get("inference_only"):
        spec = spec.replace(training=False)  # ONNX Runtime: forward only, which is all this table times
    reason = path.available(lstmperf.device) or path.supports(spec)
    if reason:
        pytest.skip(f"{name}: {reason}")
    training = not path.options.get("inference_only")
    case = make_case(checkable_spec(path, spec.replace(training=training)) or spec, lstmperf.seed)
    run = path.prepare(case, lstmperf.device)  # its forward() runs without autograd, as the speed suite's
    fp32_path = registry.get(FP32_REFERENCE[lstmperf.device.kind])
    calls = [run.forward]
    if name != fp32_path.name and not (fp32_path.available(lstmperf.device) or fp32_path.supports(spec)):
        calls.append(fp32_path.prepare(case, lstmperf.device).forward)
    if path.framework == "onnxruntime":
        # ONNX Runtime's thread pool and torch's OpenMP threads slow each other when called in alternation in
        # one process (torch's CPU LSTM 50-500x slower on a 2-core machine): each is timed on its own, in turn
        seconds, *fp32_s = (timing.median_time(c, run.synchronize, PRECISION_REPEATS) for c in calls)
    else:
        seconds, *fp32_s = timing.paired_median_times(calls, run.synchronize, repeats=PRECISION_REPEATS)
    if name == fp32_path.name:
        fp32_s = [seconds]
    device_s = None
    if lstmperf.device.kind == "cuda":  # per-call time is mostly host time at these sizes: the device cost too
        from pytest_lstmperf.meters import device_time

        measured = device_time(run.forward, lstmperf.device.torch_device)
        device_s = measured.median if measured.method == "cuda-graph" else None
    result = path.prepare(case, lstmperf.device).run()
    claimed = path.expected(case.spec)
    _, errors = check_against(result, run_reference(case), case.spec, claimed[1])
    observed = f"{result.forward_trace.family}/{result.forward_trace.precision}"
    forward_err = max((e for q, e in errors.items() if not q.startswith("grad")), default=float("nan"))
    bound = tolerance(claimed[1], "forward", case.spec).rel
    add_row(request, PrecisionRow(shape=spec.short(), path=name, claimed="/".join(claimed), observed=observed,
                                  seconds=seconds, fp32_path=fp32_path.name, fp32_s=fp32_s[0] if fp32_s else None,
                                  device_s=device_s, error=forward_err, bound=bound,
                                  kernel_ok=not check_trace(claimed, result.forward_trace, "forward")))  # fmt: skip
    verify_path(path, case.spec, lstmperf, request.node)
