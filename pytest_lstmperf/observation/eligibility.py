"""Eligibility report for maintainers: config -> predicted kernel, observed kernel, reasons, estimated slowdown.

Input: a list of layer configs (``{"framework": ..., "cell": ..., <LayerSpec fields>, <KerasOptions fields>}``,
from a JSON file or a Python ``module:attribute``), or a model (``torch.nn.Module`` / Keras model) whose
LSTM/GRU layers are listed; :mod:`.model_configs` reads them. With ``run=True`` each config is also run (Keras
in its backend's worker, PyTorch in-process) and its observed kernel shown; the slowdown is then *measured
here*: the config's training call against the variant with every reason's change applied, on the same device.
Without a run, the slowdown comes from :data:`REFERENCE_SLOWDOWNS`, each figure with where it was measured.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..model.keras_options import KerasOptions
from ..model.spec import LayerSpec
from ..progress import Remaining
from ..ratios import format_ratio
from .explain import Verdict, context_for, explain, fix_all
from .model_configs import CELL_FRAMEWORK, Config

#: (framework, device, cell, rule) -> (factor, where it was measured); rule "*" is any reason. Reference figures,
#: not taken by this run: the report shows each estimate beside where it was measured. Every figure recorded is
#: an LSTM's: a GRU row quotes none (a GRU's generic loop and cuDNN kernel differ from an LSTM's) and says so
_KERAS_TORCH = "H100, Keras 3.15 torch backend, LSTM(128) B=32 T=100 training call"
REFERENCE_SLOWDOWNS: dict[tuple[str, str, str, str], tuple[float, str]] = {
    ("keras-torch", "cuda", "lstm", "activation"): (23.0, f"{_KERAS_TORCH}: 20 ms vs 0.87 ms"),
    ("keras-torch", "cuda", "lstm", "unroll"): (21.0, f"{_KERAS_TORCH}: 18 ms vs 0.87 ms"),
    ("keras-torch", "cuda", "lstm", "use_bias"): (21.0, f"{_KERAS_TORCH}: 18 ms vs 0.87 ms"),
    ("keras-torch", "cuda", "lstm", "recurrent_dropout"): (126.0, f"{_KERAS_TORCH}: 110 ms vs 0.87 ms"),
    ("keras-torch", "cuda", "lstm", "*"): (
        21.0,
        f"{_KERAS_TORCH}: generic loop vs cuDNN, typical of the measured cases",
    ),
    ("torch", "cuda", "lstm", "*"): (
        5.6,
        "H100, torch 2.11 + cuDNN 9.19, 2-layer LSTM I=64 H=256 T=100 B=64 training step: 96 ms vs 17 ms",
    ),
    ("keras-tensorflow", "cuda", "lstm", "*"): (
        15.0,
        "published anchor: Keras generic LSTM vs CuDNNLSTM on an RTX 2070 (not measured here)",
    ),
}


@dataclass
class ReportRow:
    config: str
    verdict: Verdict
    observed: str | None = None
    slowdown: str = "-"
    slowdown_source: str = ""
    error: str | None = None
    #: the layer's name in the model (``encoder.gru``), where the rows come from a model
    layer: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "layer": self.layer,
            "predicted": f"{self.verdict.kernel}/{self.verdict.precision}",
            "observed": self.observed,
            "match": None if self.observed is None else self.observed.split("/")[0] == self.verdict.kernel,
            "reasons": [r.to_dict() for r in self.verdict.reasons],
            "raises": self.verdict.raises,
            "slowdown": self.slowdown,
            "slowdown_source": self.slowdown_source,
            "error": self.error,
        }


#: ``(framework, spec, options, device) -> PreparedRun``: what runs a config (``paths.config_runs.run_config``)
Prepare = Callable[[str, LayerSpec, KerasOptions | None, Any], Any]


def cell_verdict(spec: LayerSpec, device: Any) -> Verdict:
    """A cell's row: it runs one step per call, and PyTorch has no cuDNN or oneDNN cell kernel, so a loop over
    it runs the generic per-step kernels on every device (fused cell kernels on a GPU, matmuls and pointwise
    ops on the CPU); only a whole-sequence ``nn.LSTM``/``nn.GRU`` reaches cuDNN or oneDNN."""
    from .explain import Reason

    kind = str(getattr(device, "kind", device)).split(":")[0]
    layer = "LSTM" if spec.cell == "lstm" else "GRU"
    reason = Reason(
        rule="cell",
        finding=f"nn.{layer}Cell({spec.input_size}, {spec.hidden_size}) steps one time step per call: PyTorch "
        "has no cuDNN or oneDNN cell kernel",
        change=f"run the sequence through nn.{layer}({spec.input_size}, {spec.hidden_size}) in one call "
        "instead of a loop over the cell",
        cost="per-step kernel launches and Python overhead for the whole loop (`lstmperf report --run` measures "
        "the loop against nn.LSTM/GRU on the same weights)",
        source="PyTorch: aten::lstm_cell/gru_cell (_thnn_fused_*_cell on CUDA) have no cuDNN or oneDNN "
        "implementation (the kernel marker observes them as cuda-generic / cpu-native)",
    )
    return Verdict(
        framework=CELL_FRAMEWORK, device=kind, spec=spec, options=None,
        kernel="cuda-generic" if kind == "cuda" else "cpu-native", precision="fp32", reasons=(reason,),
        rules_from="pytest_lstmperf.observation.eligibility.cell_verdict",
    )  # fmt: skip


def falls_back(row: ReportRow) -> bool:
    """Whether the layer leaves the device's fast kernel: on a GPU anything but cuDNN; on the CPU a PyTorch
    LSTM off oneDNN (the CPU has no faster kernel for the other layers)."""
    verdict = row.verdict
    if verdict.raises:
        return True
    if verdict.device.startswith("cuda"):
        return verdict.kernel != "cudnn"
    return verdict.framework in ("torch", CELL_FRAMEWORK) and verdict.spec.cell == "lstm" and verdict.kernel != "onednn"


def _reference_slowdown(verdict: Verdict) -> tuple[str, str]:
    if verdict.device != "cuda":
        return "-", "no cuDNN on the CPU: nothing to compare"
    if verdict.kernel == "cudnn":
        return "1.0", "eligible"
    cell = verdict.spec.cell
    for reason in verdict.reasons:
        hit = REFERENCE_SLOWDOWNS.get((verdict.framework, "cuda", cell, reason.rule))
        if hit:
            return f"~{hit[0]:g}x", hit[1]
    hit = REFERENCE_SLOWDOWNS.get((verdict.framework, "cuda", cell, "*"))
    if hit:
        return f"~{hit[0]:g}x", hit[1]
    if any(key[:3] == (verdict.framework, "cuda", "lstm") for key in REFERENCE_SLOWDOWNS):
        return "?", f"no {cell.upper()} figure recorded (the recorded ones are LSTM measurements); --run measures it"
    return "?", "no figure recorded"


def _median_train_time(run: Any, repeats: int = 5) -> float:
    if hasattr(run, "time"):
        return statistics.median(run.time("train_step", repeats))
    import time

    run.train_step()
    run.synchronize()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        run.train_step()
        run.synchronize()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


#: the smallest plausible cell-loop slowdown :func:`measure_cell_loop` can measure: the loop of ``nn.LSTMCell``/
#: ``nn.GRUCell`` and ``nn.LSTM``/``nn.GRU`` compute the same steps, the layer in one call (cuDNN or oneDNN, or
#: the native kernel's own loop with its input projection done at once), so the loop is slower or about as fast
#: (1.3x to 2.3x measured on a 2-core CPU). A loop measured at half the layer's time or less is a
#: disturbed measurement (a 2-core machine under other load printed "0.0x": 9.12 ms vs 484 ms), not a result.
CELL_LOOP_FLOOR = 0.5


def measure_cell_loop(spec: LayerSpec, device: Any, repeats: int = 7) -> tuple[str, float, tuple[float, float]]:
    """A cell's row, run: the kernel its loop runs (observed), and the median time of a training call (forward
    and backward) of a loop of ``spec.seq_len`` calls of ``nn.LSTMCell``/``nn.GRUCell`` over ``spec.batch``
    sequences, divided by that of the ``nn.LSTM``/``nn.GRU`` holding the same weights, on ``device``."""
    import time

    import torch

    from .torch_trace import torch_trace

    where = getattr(device, "torch_device", None) or str(device)
    lstm = spec.cell == "lstm"
    torch.manual_seed(0)
    cell = (torch.nn.LSTMCell if lstm else torch.nn.GRUCell)(spec.input_size, spec.hidden_size, bias=spec.bias)
    layer = (torch.nn.LSTM if lstm else torch.nn.GRU)(spec.input_size, spec.hidden_size, bias=spec.bias)
    with torch.no_grad():
        layer.get_parameter("weight_ih_l0").copy_(cell.weight_ih)
        layer.get_parameter("weight_hh_l0").copy_(cell.weight_hh)
        if spec.bias:
            layer.get_parameter("bias_ih_l0").copy_(cell.bias_ih)
            layer.get_parameter("bias_hh_l0").copy_(cell.bias_hh)
    x = torch.randn(spec.seq_len, spec.batch, spec.input_size, dtype=torch.float64)

    def loop_of(cell: Any, x: Any) -> Any:
        h = torch.zeros(spec.batch, spec.hidden_size, device=x.device, dtype=x.dtype)
        state: Any = (h, h) if lstm else h
        outs = []
        for step in x:
            state = cell(step, state)
            outs.append(state[0] if lstm else state)
        return torch.stack(outs)

    # the same function, checked in float64 on the CPU (a device's TF32 kernels would blur a float32 check):
    # the comparison is of two ways to compute one thing
    with torch.no_grad():
        same = torch.allclose(loop_of(cell.double(), x), layer.double()(x)[0], rtol=1e-10, atol=1e-12)
    if not same:
        raise RuntimeError("the cell loop and nn.LSTM/GRU on the same weights disagree: nothing to compare")
    cell, layer, x = cell.float().to(where), layer.float().to(where), x.float().to(where)

    def loop() -> Any:
        return loop_of(cell, x)

    def timed(call: Any) -> float:
        start = time.perf_counter()
        call().sum().backward()
        if where.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - start

    def whole() -> Any:
        return layer(x)[0]

    for _ in range(2):  # warm-up: first calls pay one-time costs (allocations, kernel selection)
        timed(loop), timed(whole)
    samples = [(timed(loop), timed(whole)) for _ in range(repeats)]  # interleaved: a load change hits both
    cell_time = statistics.median(a for a, _ in samples)
    layer_time = statistics.median(b for _, b in samples)
    with torch_trace(where, "forward") as traces:
        loop()
    return f"{traces[0].family}/{traces[0].precision}", cell_time / layer_time, (cell_time, layer_time)


def build_report(
    configs: list[Config],
    device: Any = "cpu",
    run: bool = False,
    prepare: Prepare | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[ReportRow]:
    """One row per config: the explainer's verdict and a reference slowdown; with ``run``, also what ran and the
    slowdown measured on ``device`` (a DeviceInfo). ``run`` needs ``prepare(framework, spec, options, device)``,
    which readies a config's run: :func:`pytest_lstmperf.paths.config_runs.run_config`, in the layer of the paths
    (:func:`pytest_lstmperf.paths.config_runs.build_report` passes it)."""
    if run and prepare is None:
        raise ValueError("build_report(run=True) needs prepare=: what runs a config (paths.config_runs.run_config)")
    rows = []
    names = getattr(configs, "names", None) or [""] * len(configs)
    remaining = Remaining([1] * len(configs))  # layers run one by one: the mean so far estimates the rest
    for index, (name, (framework, spec, options)) in enumerate(zip(names, configs, strict=True)):
        if run and progress is not None:
            layer = f"{name or framework} {spec.short()}"
            progress(f"layer {index + 1}/{len(configs)} {layer}: running ({remaining.line()})")
        remaining.start()
        if framework == CELL_FRAMEWORK:
            verdict = cell_verdict(spec, device)
            row = ReportRow(verdict.config(), verdict, None, "?", "not measured: run with --run to measure the "
                            "cell loop against nn.LSTM/GRU on the same weights")  # fmt: skip
            if run:
                try:
                    row.observed, factor, times = measure_cell_loop(spec, device)
                    if factor < CELL_LOOP_FLOOR:  # once more: a burst of other load can hit one side's samples
                        row.observed, factor, times = measure_cell_loop(spec, device)
                    measured = (
                        f"a training call of the {spec.seq_len}-step cell loop {times[0] * 1e3:.3g} ms vs "
                        f"nn.{spec.cell.upper()} on the same weights {times[1] * 1e3:.3g} ms"
                    )
                    if factor < CELL_LOOP_FLOOR:
                        row.slowdown = "?"
                        row.slowdown_source = (
                            f"not a result, measured twice here ({device.describe()}): {measured}, "
                            f"{format_ratio(factor)}. nn.{spec.cell.upper()} computes the same steps in one call "
                            f"and is not {1 / CELL_LOOP_FLOOR:g}x slower than the loop of its cell: the timings were "
                            "disturbed (other load on the machine, CPU threads contending); run it again on an idle "
                            "machine, or with fewer threads (OMP_NUM_THREADS=1)"
                        )
                    else:
                        row.slowdown = format_ratio(factor)
                        row.slowdown_source = f"measured here ({device.describe()}): {measured}"
                except Exception as exc:
                    row.error = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
                    row.observed = "error"
            rows.append(_named(row, name))
            remaining.finished()
            continue
        verdict = explain(spec, framework, device, options, context=context_for(device))
        if index in getattr(configs, "notes", {}):
            verdict = dataclasses.replace(verdict, notes=(*verdict.notes, configs.notes[index]))  # type: ignore[attr-defined]
        row = _named(ReportRow(config=verdict.config(), verdict=verdict), name)
        row.slowdown, row.slowdown_source = _reference_slowdown(verdict)
        if run and prepare is not None:
            try:
                prepared = prepare(framework, spec, options, device)
                result = prepared.run()
                trace = result.forward_trace
                row.observed = f"{trace.family}/{trace.precision}"
                if verdict.reasons and getattr(device, "kind", "cpu") == "cuda":
                    fixed = prepare(framework, *fix_all(spec, options, verdict), device)
                    factor = _median_train_time(prepared) / _median_train_time(fixed)
                    row.slowdown = format_ratio(factor)
                    row.slowdown_source = f"measured here ({device.describe()}), training call vs the eligible variant"
            except Exception as exc:
                row.error = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
                row.observed = "error"
        rows.append(row)
        remaining.finished()
    return rows


def _named(row: ReportRow, name: str) -> ReportRow:
    if name:
        row.layer, row.config = name, f"{name}: {row.config}"
    return row


def render_table(rows: list[ReportRow]) -> str:
    """A markdown table, then the reasons and slowdown sources as footnotes."""
    lines = ["| # | config | predicted | observed | reasons | est. slowdown |", "|---|---|---|---|---|---|"]
    notes = []
    for i, row in enumerate(rows, 1):
        reasons = "; ".join(r.change for r in row.verdict.reasons) or "-"
        if row.verdict.raises:
            reasons += f" (raises: {row.verdict.raises.split(':')[0]})"
        observed = row.observed or "(not run)"
        lines.append(
            f"| {i} | {row.config} | {row.verdict.kernel}/{row.verdict.precision} | {observed} | {reasons} | "
            f"{row.slowdown} [{i}] |"
        )
        notes.append(f"[{i}] {row.slowdown_source}" + (f"; error: {row.error}" if row.error else ""))
        # what the report assumed (an open length, a mask's padding) and the explainer's notes, under the row
        notes += [f"    note: {n}" for note in dict.fromkeys(row.verdict.notes) for n in note.splitlines()]
    return "\n".join([*lines, "", *notes])
