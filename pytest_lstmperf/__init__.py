"""pytest-lstmperf: which LSTM/GRU kernel ran, numerical equivalence with a float64 reference, speed.

The public API for a user's own model (see docs/own-model.md). Importing this package imports neither torch
nor TensorFlow: each name is loaded from its module on first access.
"""

from __future__ import annotations

import importlib
from typing import Any

try:
    from importlib.metadata import PackageNotFoundError, version

    __version__ = version("pytest-lstmperf")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0+unknown"

#: public name -> module that defines it (``module:attribute`` where the names differ; no public name may be
#: a submodule's name, which the submodule would replace on the package once imported)
_EXPORTS = {
    "verify_model": "numerics.verify_model",
    "ModelCheckFailed": "numerics.verify_model",
    "KnownFindingWarning": "numerics.verify_model",
    "NotComparedWarning": "numerics.verify_model",
    "PathOutcome": "numerics.verify_model",
    "model_paths": "numerics.verify_model",
    "report": "paths.config_runs",
    "falls_back": "observation.eligibility",
    "observe": "observation.calls",
    "verdict_problem": "hooks.kernel_marker",
    "KernelExpectation": "hooks.kernel_marker",
    "LayerSpec": "model.spec",
    "KernelTrace": "observation.torch_trace",
    "tolerance_bound": "numerics.tolerance:tolerance",
    "layer_specs": "model.strategies",
    "lstm_configs": "model.strategies",
    "devices": "model.strategies",
    "path_names": "paths",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_lstmperf' has no attribute {name!r}")
    module, _, attribute = module.partition(":")
    value = getattr(importlib.import_module(f".{module}", __name__), attribute or name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
