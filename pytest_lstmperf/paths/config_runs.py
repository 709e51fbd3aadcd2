"""A layer config run on its framework's runner, without a registered path: the runs of the eligibility report
(``lstmperf report --run``, ``lstmperf explain --run``) and of :func:`pytest_lstmperf.report` with ``run=True``.

The report itself (:mod:`pytest_lstmperf.observation.eligibility`) lies below the paths: it is handed
:func:`run_config` to run a config.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..device import resolve_device
from ..model.case import make_case
from ..observation.eligibility import ReportRow
from ..observation.eligibility import build_report as _rows
from ..observation.model_configs import Config, configs_from_model
from . import ExecutionPath, PathOptions

if TYPE_CHECKING:
    from ..model.keras_options import KerasOptions
    from ..model.spec import LayerSpec
    from . import PreparedRun

#: the module whose ``prepare`` runs a framework's layer (Keras frameworks: ``keras.paths``)
RUNNERS = {"torch": "torch_paths", "torch-compile": "compiled", "onnxruntime": "onnx_runtime"}


def run_config(framework: str, spec: LayerSpec, options: KerasOptions | None, device: Any) -> PreparedRun:
    """A PreparedRun for one config on ``device`` (a DeviceInfo)."""
    path = ExecutionPath(
        name="report", framework=framework, device=device.kind, kernel="none", precision="fp32",
        description="eligibility report run",
        prepare_ref=f"pytest_lstmperf.paths.{RUNNERS.get(framework, 'keras.paths')}:prepare",
        available_ref="", supports_ref="", options=_run_options(framework, spec, options),
    )  # fmt: skip
    return path.prepare(make_case(spec), device)


def _run_options(framework: str, spec: LayerSpec, options: KerasOptions | None) -> PathOptions:
    """The runner's options for a config: Keras's options; a packed torch spec runs packed (a
    ``PackedSequence`` of its lengths), as it was given, not on the padded tensor."""
    if options is not None:
        return PathOptions(keras=options)
    return PathOptions(packed=True) if framework == "torch" and spec.length_mode == "packed" else PathOptions()


def build_report(configs: list[Config], device: Any = "cpu", run: bool = False) -> list[ReportRow]:
    """The eligibility report's rows (:func:`pytest_lstmperf.observation.eligibility.build_report`), each config
    run by :func:`run_config` with ``run``."""
    return _rows(configs, device, run=run, prepare=run_config)


def report(model: Any, example_inputs: Any = None, *, device: str = "cpu", run: bool = False) -> list[ReportRow]:
    """The eligibility rows of a model's LSTM/GRU layers, in-process (torch or Keras on any backend)."""
    configs = configs_from_model(model, example_inputs=example_inputs)
    if not configs:
        raise ValueError(
            f"{type(model).__name__}: no built LSTM/GRU layer found (looked for torch nn.LSTM/nn.GRU/nn.LSTMCell/"
            "nn.GRUCell modules and Keras LSTM/GRU layers, Bidirectional-wrapped ones included)"
        )
    if run:
        return build_report(configs, resolve_device(device, "device"), run=True)
    return build_report(configs, device, run=False)
