"""Eligibility report for maintainers: config -> predicted kernel, observed kernel, reasons, estimated slowdown.

Input: a list of layer configs (``{"framework": ..., "cell": ..., <LayerSpec fields>, <KerasOptions fields>}``,
from a JSON file or a Python ``module:attribute``), or a model (``torch.nn.Module`` / Keras model) whose
LSTM/GRU layers are listed. With ``run=True`` each config is also run (Keras in its backend's worker, PyTorch
in-process) and its observed kernel shown; the slowdown is then *measured here*: the config's training call
against the variant with every reason's change applied, on the same device. Without a run, the slowdown comes
from :data:`REFERENCE_SLOWDOWNS`, each figure with where it was measured.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..model.keras_options import KerasOptions
from ..model.spec import LayerSpec
from .explain import Verdict, context_for, explain, fix_all, normalize_framework
from .tf_import import quiet_tensorflow_import

# (framework, device, rule) -> (factor, source); rule "*" is any reason
_KT = "H100, Keras 3.15 torch backend, LSTM(128) B=32 T=100 training call"
REFERENCE_SLOWDOWNS: dict[tuple[str, str, str], tuple[float, str]] = {
    ("keras-torch", "cuda", "activation"): (23.0, f"{_KT}: 20 ms vs 0.87 ms (REFERENCE.md)"),
    ("keras-torch", "cuda", "unroll"): (21.0, f"{_KT}: 18 ms vs 0.87 ms (REFERENCE.md)"),
    ("keras-torch", "cuda", "use_bias"): (21.0, f"{_KT}: 18 ms vs 0.87 ms (REFERENCE.md)"),
    ("keras-torch", "cuda", "recurrent_dropout"): (126.0, f"{_KT}: 110 ms vs 0.87 ms (REFERENCE.md)"),
    ("keras-torch", "cuda", "*"): (21.0, f"{_KT}: generic loop vs cuDNN, typical of the measured cases"),
    ("torch", "cuda", "*"): (
        5.6,
        "H100, torch 2.11 + cuDNN 9.19, 2-layer LSTM I=64 H=256 T=100 B=64 training step: 96 ms vs 17 ms",
    ),
    ("keras-tensorflow", "cuda", "*"): (
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


Config = tuple[str, LayerSpec, KerasOptions | None]
#: ``(framework, spec, options, device) -> PreparedRun``: what runs a config (``paths.config_runs.run_config``)
Prepare = Callable[[str, LayerSpec, KerasOptions | None, Any], Any]


class ModelConfigs(list):
    """The configs of a model's layers, with ``names``: each layer's name in the model (``encoder.gru``,
    ``bidirectional/forward_lstm``), in the same order; the report's rows carry them."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []
        #: index -> a note on how the model calls that layer (a loop over time steps)
        self.notes: dict[int, str] = {}

    def add(self, name: str, config: Config) -> None:
        self.append(config)
        self.names.append(name)


_SPEC_FIELDS = {f.name for f in dataclasses.fields(LayerSpec)}
_OPTION_FIELDS = {f.name for f in dataclasses.fields(KerasOptions)}
ALIASES = {"units": "hidden_size", "use_bias": "bias", "input_dim": "input_size"}


def config_from_dict(data: dict[str, Any]) -> Config:
    """``{"framework": "keras-tf", "cell": "lstm", "units": 128, "activation": "relu"}`` -> a config."""
    values = {ALIASES.get(k, k): v for k, v in data.items()}
    framework = normalize_framework(values.pop("framework", "keras-tensorflow"))
    unknown = sorted(set(values) - _SPEC_FIELDS - _OPTION_FIELDS)
    if unknown:
        valid = sorted(_SPEC_FIELDS | (_OPTION_FIELDS - {"backend"}) | set(ALIASES))
        raise ValueError(f"unknown layer keys {unknown} (valid: {', '.join(valid)})")
    spec_values = {k: v for k, v in values.items() if k in _SPEC_FIELDS}
    if isinstance(spec_values.get("lengths"), list):
        spec_values["lengths"] = tuple(spec_values["lengths"])
    spec = LayerSpec(**spec_values)
    option_values = {k: v for k, v in values.items() if k in _OPTION_FIELDS}
    if framework == "torch":
        if option_values:
            raise ValueError(f"Keras options {sorted(option_values)} given for framework 'torch'")
        return framework, spec, None
    option_values["backend"] = {"keras-tensorflow": "tensorflow", "keras-jax": "jax"}.get(framework, "torch")
    return framework, spec, KerasOptions(**option_values)


def configs_from_model(model: Any, batch: int = 4, seq_len: int = 10, example_inputs: Any = None) -> list[Config]:
    """The LSTM/GRU layers of a ``torch.nn.Module`` or a Keras model, as configs.

    The batch and sequence length are the model's own where it has them: a Keras layer's built input shape, or
    (torch) the shapes each layer is called with on ``example_inputs``; ``batch``/``seq_len`` fill in the rest.
    A Keras model is a Keras model on every backend (on the torch backend it is also a ``torch.nn.Module``)."""
    configs = ModelConfigs()
    if hasattr(model, "_flatten_layers"):
        return _keras_configs(model, batch, seq_len, example_inputs)
    torch_nn = getattr(importlib.import_module("torch"), "nn", None) if _has("torch") else None
    if torch_nn is not None and isinstance(model, torch_nn.Module):
        seen = _torch_call_shapes(model, example_inputs)
        for name, module in model.named_modules():
            if isinstance(module, (torch_nn.LSTMCell, torch_nn.GRUCell)):
                configs.add(name, (CELL_FRAMEWORK, _cell_spec(module, seen.get(id(module), (batch, seq_len))), None))
            if isinstance(module, (torch_nn.LSTM, torch_nn.GRU)):
                calls = seen.get(id(module), (batch, seq_len, 1))[2]
                if calls > 1:
                    configs.notes[len(configs)] = _loop_note(calls, seen[id(module)][1])
                configs.add(name or type(module).__name__, (
                    "torch",
                    LayerSpec(
                        cell="lstm" if isinstance(module, torch_nn.LSTM) else "gru",
                        input_size=module.input_size, hidden_size=module.hidden_size, num_layers=module.num_layers,
                        bidirectional=module.bidirectional, proj_size=getattr(module, "proj_size", 0),
                        bias=module.bias, batch=seen.get(id(module), (batch, seq_len, 1))[0],
                        seq_len=seen.get(id(module), (batch, seq_len, 1))[1],
                    ),
                    None,
                ))  # fmt: skip
        return configs
    raise ValueError(f"{type(model).__name__} is neither a torch.nn.Module nor a Keras model")


def _torch_call_shapes(model: Any, example_inputs: Any) -> dict[int, tuple[int, int, int]]:
    """``id(module) -> (batch, seq_len, calls)`` of each nn.LSTM/GRU (a cell: seq_len = calls) called on
    ``example_inputs`` in one forward (none given: {})."""
    if example_inputs is None:
        return {}
    import torch

    seen: dict[int, tuple[int, int, int]] = {}

    def hook(module: Any, args: tuple) -> None:
        data = getattr(args[0], "data", args[0])
        calls = seen.get(id(module), (0, 0, 0))[2] + 1
        if data.dim() == 3:
            t, b = (data.shape[1], data.shape[0]) if module.batch_first else (data.shape[0], data.shape[1])
            seen[id(module)] = (int(b), int(t), calls)

    def cell_hook(module: Any, args: tuple) -> None:
        steps = seen.get(id(module), (0, 0, 0))[1] + 1
        seen[id(module)] = (int(args[0].shape[0]) if args[0].dim() == 2 else 1, steps, steps)

    handles = [m.register_forward_pre_hook(hook) for m in model.modules() if isinstance(m, torch.nn.RNNBase)]
    handles += [m.register_forward_pre_hook(cell_hook) for m in model.modules() if isinstance(m, torch.nn.RNNCellBase)]
    try:
        with torch.no_grad():
            model(*(example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)))
    finally:
        for handle in handles:
            handle.remove()
    return seen


def _loop_note(calls: int, seq_len: int) -> str:
    return (
        f"called {calls} times in one forward of the model, {seq_len} time step(s) per call: the kernel runs per "
        "call, so every call's launches and Python overhead remain; where the model allows (encoders, teacher "
        "forcing), pass the whole sequence in one call"
    )


#: the framework name of a torch LSTMCell/GRUCell row: a cell has no cuDNN or oneDNN kernel in PyTorch
CELL_FRAMEWORK = "torch-cell"


def _cell_spec(module: Any, batch_steps: tuple[int, ...]) -> LayerSpec:
    """A cell as a one-layer spec whose length is its number of calls per forward (the steps of its loop)."""
    import torch

    return LayerSpec(
        cell="gru" if isinstance(module, torch.nn.GRUCell) else "lstm", input_size=module.input_size,
        hidden_size=module.hidden_size, bias=bool(module.bias), batch=batch_steps[0], seq_len=batch_steps[1],
    )  # fmt: skip


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


def _keras_input_shape(layer: Any) -> tuple[Any, ...] | None:
    for get in (lambda: layer.input.shape, lambda: next(iter(layer._build_shapes_dict.values()))):
        try:
            shape = tuple(get())
        except Exception:
            continue
        if len(shape) == 3:
            return shape
    return None


def _keras_called_shapes(model: Any, example_inputs: Any) -> dict[int, tuple[int, int, bool]]:
    """``id(layer) -> (batch, seq_len, initial state given)`` of each Keras LSTM/GRU called on
    ``example_inputs`` (one inference call of the model, observed); none given: {}."""
    if example_inputs is None:
        return {}
    import keras

    from .calls import observe

    shapes: dict[int, tuple[int, int, bool]] = {}
    original = {cls: cls.inner_loop for cls in (keras.layers.LSTM, keras.layers.GRU)}
    with observe() as seen:
        count = len(seen.layers)

        def noting(cls: Any) -> Any:  # a Keras layer class
            spied = cls.inner_loop  # observe()'s spy, which describes the call into seen.layers

            def inner_loop(self, *args: Any, **kwargs: Any) -> Any:
                nonlocal count
                result = spied(self, *args, **kwargs)
                for _, spec, _ in seen.layers[count:]:
                    shapes[id(self)] = (spec.batch, spec.seq_len, spec.initial_state)
                count = len(seen.layers)
                return result

            return inner_loop

        for cls in original:
            cls.inner_loop = noting(cls)
        try:
            model(example_inputs, training=False)
        finally:
            for cls, spied in original.items():
                cls.inner_loop = spied  # observe() puts the layers' own back when its block ends
    return shapes


def _keras_configs(model: Any, batch: int, seq_len: int, example_inputs: Any = None) -> list[Config]:
    import keras

    from .calls import _activation_name

    configs = ModelConfigs()
    called = _keras_called_shapes(model, example_inputs)
    for layer in model._flatten_layers(include_self=True, recursive=True):
        if isinstance(layer, (keras.layers.LSTM, keras.layers.GRU)) and layer.built:
            cell = layer.cell
            shape = _keras_input_shape(layer) or (None, None, None)
            state = False
            if id(layer) in called:
                shape, state = (*called[id(layer)][:2], None), called[id(layer)][2]
            guessed = [
                f"{what} {value}"
                for what, value, have in (("batch", batch, shape[0]), ("length", seq_len, shape[1]))
                if not have
            ]
            framework = f"keras-{keras.backend.backend()}"
            spec = LayerSpec(
                cell="lstm" if isinstance(layer, keras.layers.LSTM) else "gru",
                input_size=int(cell.kernel.shape[0]), hidden_size=int(cell.units), bias=bool(cell.use_bias),
                reset_after=bool(getattr(cell, "reset_after", True)) or isinstance(layer, keras.layers.LSTM),
                batch=int(shape[0] or batch), seq_len=int(shape[1] or seq_len), initial_state=bool(state),
            )  # fmt: skip
            options = KerasOptions(
                backend=keras.backend.backend(), use_cudnn=layer.use_cudnn,
                implementation=int(getattr(cell, "implementation", 2)),
                activation=_activation_name(cell.activation),
                recurrent_activation=_activation_name(cell.recurrent_activation),
                recurrent_dropout=float(cell.recurrent_dropout), dropout=float(cell.dropout),
                unroll=bool(layer.unroll), go_backwards=bool(layer.go_backwards),
            )  # fmt: skip
            if guessed:
                configs.notes[len(configs)] = (
                    f"the model leaves its {' and '.join(w.split()[0] for w in guessed)} open (None): reported at "
                    f"{', '.join(guessed)} (--batch/--seq-len, or report(model, example_inputs) for the shapes of "
                    "a real call); small batches decide CPU vs GPU"
                )
            configs.add(layer.name, (framework, spec, options))
    return configs


def falls_back(row: ReportRow) -> bool:
    """Whether the layer leaves the device's fast kernel: on a GPU anything but cuDNN; on the CPU a PyTorch
    LSTM off oneDNN (the CPU has no faster kernel for the other layers)."""
    verdict = row.verdict
    if verdict.raises:
        return True
    if verdict.device.startswith("cuda"):
        return verdict.kernel != "cudnn"
    return verdict.framework in ("torch", CELL_FRAMEWORK) and verdict.spec.cell == "lstm" and verdict.kernel != "onednn"


def _has(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def load_configs(source: str, batch: int = 4, seq_len: int = 10) -> list[Config]:
    """Configs from a JSON file (a list of dicts) or ``package.module:attribute`` (a list, model or callable)."""
    path = Path(source)
    if path.suffix == ".json" or path.exists():
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"{source}: cannot read a JSON list of layer configs: {exc}") from None
        if not isinstance(data, list):
            raise ValueError(f"{source}: expected a JSON list of layer configs")
        return [config_from_dict(item) for item in data]
    module_name, _, attribute = source.partition(":")
    import os
    import sys

    if "" not in sys.path and os.getcwd() not in sys.path:  # as `python -m` and pytest do: the current folder
        sys.path.insert(0, os.getcwd())
    with quiet_tensorflow_import():  # the module may import Keras on TensorFlow, now or in its factory
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ValueError(f"{source}: cannot import {module_name!r}: {exc}") from None
        obj = getattr(module, attribute or "CONFIGS", None)
        if obj is None:
            candidates = _model_candidates(module)
            if not attribute:
                named = ", ".join(f"{module_name}:{c}" for c in candidates)
                raise ValueError(
                    f"{source}: name what to report as {module_name}:ATTRIBUTE (a model, a model class or a "
                    f"factory, or a list of layer dicts); {module_name} has no CONFIGS list"
                    + (f"; candidates: {named}" if candidates else "")
                )
            raise ValueError(
                f"{source}: {module_name} has no attribute {attribute!r}"
                + (f" (candidates: {', '.join(candidates)})" if candidates else "")
            )
        is_model = hasattr(obj, "modules") or hasattr(obj, "_flatten_layers")
        if isinstance(obj, type) or (callable(obj) and not is_model):
            obj = obj()  # a model class or a factory: the model it builds
        if isinstance(obj, list):
            return [item if isinstance(item, tuple) else config_from_dict(item) for item in obj]
        return configs_from_model(obj, batch=batch, seq_len=seq_len)


def _model_candidates(module: Any) -> list[str]:
    """Names in ``module`` that look like what ``report`` takes: torch modules and their classes, Keras models,
    and module-level functions defined there (factories)."""
    out = []
    for name, value in vars(module).items():
        if name.startswith("_"):
            continue
        defined_here = getattr(value, "__module__", None) == module.__name__
        is_model = hasattr(value, "modules") or hasattr(value, "_flatten_layers")
        if (is_model and not isinstance(value, type)) or (defined_here and callable(value)):
            out.append(name)
    return out


def _reference_slowdown(verdict: Verdict) -> tuple[str, str]:
    if verdict.device != "cuda":
        return "-", "no cuDNN on the CPU: nothing to compare"
    if verdict.kernel == "cudnn":
        return "1.0", "eligible"
    for reason in verdict.reasons:
        hit = REFERENCE_SLOWDOWNS.get((verdict.framework, "cuda", reason.rule))
        if hit:
            return f"~{hit[0]:g}x", hit[1]
    hit = REFERENCE_SLOWDOWNS.get((verdict.framework, "cuda", "*"))
    return (f"~{hit[0]:g}x", hit[1]) if hit else ("?", "no figure recorded")


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
    configs: list[Config], device: Any = "cpu", run: bool = False, prepare: Prepare | None = None
) -> list[ReportRow]:
    """One row per config: the explainer's verdict and a reference slowdown; with ``run``, also what ran and the
    slowdown measured on ``device`` (a DeviceInfo). ``run`` needs ``prepare(framework, spec, options, device)``,
    which readies a config's run: :func:`pytest_lstmperf.paths.config_runs.run_config`, in the layer of the paths
    (:func:`pytest_lstmperf.paths.config_runs.build_report` passes it)."""
    if run and prepare is None:
        raise ValueError("build_report(run=True) needs prepare=: what runs a config (paths.config_runs.run_config)")
    rows = []
    names = getattr(configs, "names", None) or [""] * len(configs)
    for index, (name, (framework, spec, options)) in enumerate(zip(names, configs, strict=True)):
        if framework == CELL_FRAMEWORK:
            verdict = cell_verdict(spec, device)
            row = ReportRow(verdict.config(), verdict, None, "?", "not measured: run with --run to measure the "
                            "cell loop against nn.LSTM/GRU on the same weights")  # fmt: skip
            if run:
                try:
                    row.observed, factor, times = measure_cell_loop(spec, device)
                    row.slowdown = f"{factor:.1f}x"
                    row.slowdown_source = (
                        f"measured here ({device.describe()}): a training call of the {spec.seq_len}-step cell loop "
                        f"{times[0] * 1e3:.3g} ms vs nn.{spec.cell.upper()} on the same weights {times[1] * 1e3:.3g} ms"
                    )
                except Exception as exc:
                    row.error = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
                    row.observed = "error"
            rows.append(_named(row, name))
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
                    row.slowdown = f"{factor:.1f}x"
                    row.slowdown_source = f"measured here ({device.describe()}), training call vs the eligible variant"
            except Exception as exc:
                row.error = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
                row.observed = "error"
        rows.append(row)
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
    return "\n".join([*lines, "", *notes])
