"""Device time and kernels of a user's own callable: the ``@pytest.mark.lstmperf`` benchmarks.

A user's ``fn`` is not a prepared path: nothing says which framework runs it or how to wait for it. These helpers
read that from the call itself: whether its results hold JAX arrays (then it is waited for with
``jax.block_until_ready`` and its kernels are read from the GPU kernels CUPTI records), how to synchronise it
otherwise (torch's device), and its device time, or why it has none (a call that dispatched no PyTorch op).
:class:`~.runner.BenchRunner` measures the call with them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .. import meters
from ..model.precision import DTYPE_PRECISION
from ..observation.torch_trace import gpu_kernel_names, kernel_family, precision_from


def user_device_time(
    fn: Callable[[], object], torch_device: str, ops: Sequence[str]
) -> Callable[[int], meters.DeviceTime]:
    """``dev_time(samples)`` for a user's ``fn`` that returned no JAX array. A CUDA graph or CUDA events see the
    work of torch's streams only: where one traced call dispatched no ATen op (TensorFlow work, or JAX work whose
    results ``fn`` did not return), a replay would time an empty graph, so there is no device time, and the
    note says why (the run lists the benchmark as without a device comparison)."""

    if torch_device.startswith("cuda") and not ops:
        note = (
            "not measured: one traced call dispatched no PyTorch op, so a CUDA graph or CUDA events would time "
            "none of its work (a JAX function must return its JAX arrays to be timed as JAX work; TensorFlow work "
            "has no device time here); the time per call decides"
        )
        return lambda samples: meters.DeviceTime("none", (), note)
    return lambda samples: meters.device_time(fn, torch_device, samples)


def holds_jax_arrays(result: Any) -> bool:
    """Whether ``result`` (a value, or tuples, lists and dicts of them) holds a JAX array; JAX is not imported
    for it."""
    import sys

    jax = sys.modules.get("jax")
    if jax is None:
        return False
    return any(isinstance(leaf, jax.Array) for leaf in jax.tree_util.tree_leaves(result))


def jax_kernels(
    fn: Callable[[], object], wait: Callable[[object], object], torch_device: str, result: Any
) -> tuple[str, str, list[str]]:
    """``(family, precision, kernel names)`` of one call of the JAX function ``fn``: on a GPU from the kernels
    CUPTI records (torch's profiler), ``cudnn`` where cuDNN's RNN kernels ran, else ``jax-generic``; the
    precision from the kernel names and the results' dtypes (those of the outputs: a model that computes in
    a lower precision than it returns is not seen so). On the CPU nothing is launched to read: ``unknown``."""
    import jax

    leaves = jax.tree_util.tree_leaves(result)
    dtypes = sorted({DTYPE_PRECISION.get(str(x.dtype), str(x.dtype)) for x in leaves if hasattr(x, "dtype")})
    if not torch_device.startswith("cuda"):
        return "unknown", precision_from(dtypes, []), []
    kernels = gpu_kernel_names(lambda: wait(fn()))
    if kernels is None:
        return "unknown", precision_from(dtypes, []), []
    return kernel_family(kernels) or "jax-generic", precision_from(dtypes, kernels), kernels


def synchronizer(torch_device: str) -> Callable[[], None]:
    if not torch_device.startswith("cuda"):
        return lambda: None
    import torch

    return lambda: torch.cuda.synchronize(torch_device)
