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
    "verify_model": "own_model",
    "ModelCheckFailed": "own_model",
    "KnownFindingWarning": "own_model",
    "PathOutcome": "own_model",
    "model_paths": "own_model",
    "report": "eligibility_report",
    "falls_back": "eligibility_report",
    "observe": "kernel_marker",
    "verdict_problem": "kernel_marker",
    "KernelExpectation": "kernel_marker",
    "LayerSpec": "spec",
    "KernelTrace": "trace",
    "tolerance_bound": "tolerance:tolerance",
    "layer_specs": "strategies",
    "lstm_configs": "strategies",
    "devices": "strategies",
    "path_names": "strategies",
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
