"""TensorFlow imported without its C++ start-up log lines.

Importing TensorFlow prints ``I0000 ... cudart_stub.cc:31] Could not find cuda drivers ...``, the CPU-feature
notice and, on a machine without a GPU, ``failed call to cuInit`` (the last one when the GPUs are first listed).
C++ code writes them to the process's stderr file descriptor before absl logging is set up, so
``TF_CPP_MIN_LOG_LEVEL`` alone does not stop them. :func:`tensorflow_muted` is the one place that silences them:
file descriptor 2 goes to ``/dev/null`` while TensorFlow is imported and lists its GPUs, and comes back in a
``finally``, so an exception from the import still reaches the user.

``lstmperf report module:model`` imports the user's module, which imports Keras (and through it TensorFlow) or
not; :func:`quiet_tensorflow_import` makes TensorFlow's import quiet if it happens inside the block, and costs
nothing where it does not (a torch model never imports TensorFlow).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import os
import sys
from collections.abc import Iterator
from typing import Any

_LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL"


@contextlib.contextmanager
def tensorflow_muted() -> Iterator[None]:
    """Inside the block: ``TF_CPP_MIN_LOG_LEVEL=3`` unless the user set it, and file descriptor 2 on ``/dev/null``.
    Both come back afterwards, also when the block raises (the exception propagates unchanged)."""
    set_here = _LOG_LEVEL not in os.environ
    if set_here:
        os.environ[_LOG_LEVEL] = "3"
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, 2)
        finally:
            os.close(devnull)
        yield
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        if set_here:
            os.environ.pop(_LOG_LEVEL, None)


def _start(tensorflow: Any) -> None:
    """What TensorFlow logs at start beyond its import: the GPU list (cuInit) is read once, quietly."""
    with contextlib.suppress(Exception):
        tensorflow.config.list_physical_devices("GPU")


class _QuietTensorFlowFinder(importlib.abc.MetaPathFinder):
    """Finds ``tensorflow`` with the other finders and runs its module code inside :func:`tensorflow_muted`."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "tensorflow":
            return None
        _remove(self)  # one import: the finders below find the real spec, and later imports are TensorFlow's own
        spec = importlib.util.find_spec(name)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def quiet_exec_module(module: Any) -> None:
            try:
                with tensorflow_muted():
                    exec_module(module)
                    _start(module)
            finally:
                with contextlib.suppress(AttributeError):
                    del loader.exec_module  # the loader's own method again

        loader.exec_module = quiet_exec_module
        return spec


def _remove(finder: importlib.abc.MetaPathFinder) -> None:
    with contextlib.suppress(ValueError):
        sys.meta_path.remove(finder)


@contextlib.contextmanager
def quiet_tensorflow_import() -> Iterator[None]:
    """TensorFlow, if first imported inside the block (directly or by Keras), is imported by
    :func:`tensorflow_muted`; the rest of the block's output is untouched."""
    if "tensorflow" in sys.modules:
        yield
        return
    finder = _QuietTensorFlowFinder()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        _remove(finder)
